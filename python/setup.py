"""Builds the PyTorch op (tilejit._C) against the installed torch and a built libtilejit.

    cmake -S . -B build -G Ninja && cmake --build build     # libtilejit (build/libtilejit.so)
    pip install --no-build-isolation ./python                # this package, against that torch

$TILEJIT_LIB_DIR names the folder of libtilejit.so (default: ../build); the extension finds it
there at run time (rpath). Only torch's and CUDA's headers and api/tilejit_c.h are compiled in.
"""
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
os.chdir(here)   # setuptools takes package and source paths relative to setup.py
lib_dir = os.path.abspath(os.environ.get("TILEJIT_LIB_DIR", os.path.join(root, "build")))
if not os.path.isdir(lib_dir) or not any(f.startswith("libtilejit.so") for f in os.listdir(lib_dir)):
    raise SystemExit(f"no libtilejit.so in {lib_dir}: build tilejit first (cmake --build build) or set TILEJIT_LIB_DIR")

setup(
    name="tilejit",
    version="0.1.0",
    description="tilejit's attention as a PyTorch operator (torch.ops.tilejit.attention)",
    packages=["tilejit"],
    ext_modules=[
        CUDAExtension(
            "tilejit._C",
            ["tilejit/csrc/torch_ops.cpp"],
            include_dirs=[root],
            library_dirs=[lib_dir],
            libraries=["tilejit"],
            extra_compile_args={"cxx": ["-O2", "-std=c++17"]},
            extra_link_args=[f"-Wl,-rpath,{lib_dir}"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
