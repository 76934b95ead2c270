# Sourced on the GPU machine after scripts/device_bundle.sh's .device/ was carried there: puts the
# bundle's libraries and the NCCL that PyTorch's wheels bring (nvidia-nccl-cu13) on the library
# path, and keeps NVLink multicast off (NCCL_NVLS_ENABLE=0: the lent machines require it).
TILEJIT_NCCL_LIB="$(python3 -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$PWD/.device/lib${TILEJIT_NCCL_LIB:+:$TILEJIT_NCCL_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
