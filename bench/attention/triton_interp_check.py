#!/usr/bin/env python3
"""CPU check of peers.py's Triton FP8 attention kernel, in Triton's interpreter (no GPU, no torch).

Runs `_fp8_attn_fwd` (its jit function, one config at a time: the autotuner needs a GPU) with
TRITON_INTERPRET=1 on numpy buffers dressed as tensors, and compares with float64 attention of
the unquantized inputs and of the dequantized e4m3 inputs (the kernel's own error: P's rounding
and the accumulation, ~2e-2) on ragged, causal and multi-head shapes, D 64/128/256.

The interpreter is not the GPU: its fp32 -> e4m3 / bf16 conversions truncate and drop the
mantissa carry, so they are replaced here by exact round-to-nearest-even (what the GPU's cvt
does); with numpy >= 2.4 its tensor __index__ needs a 0-d array, patched too. What this checks
is the kernel's logic (masks, loop bounds, the softmax recurrence, descales, strides), not
Triton's compilation for Hopper, which only the GPU run (peers.py) shows.

usage: pip install triton numpy; python3 bench/attention/triton_interp_check.py   (exit 1 on failure)
"""
import math
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import peers  # noqa: E402

if peers.triton is None:
    print("triton not importable (%s)" % peers.TRITON_ERROR)
    sys.exit(2)

import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as _interp  # noqa: E402


# ---- numpy buffers dressed as torch tensors (what the interpreter reads of them) ---------------
_DTYPES = {}


def fake_dtype(name):
    """One class and one instance per dtype: Triton's specializer may cache by either."""
    if name not in _DTYPES:
        text = "torch." + name
        cls = type("dtype_" + name, (), {"__str__": lambda self: text, "__repr__": lambda self: text, "name": name})
        _DTYPES[name] = cls()
    return _DTYPES[name]


class FakeTensor:
    """A contiguous numpy array; the interpreter reads and writes it in place through data_ptr()."""

    def __init__(self, arr, dtype):
        self.arr = np.ascontiguousarray(arr)
        self.dtype = fake_dtype(dtype)

    def data_ptr(self):
        return self.arr.ctypes.data

    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def new_empty(self, *args, **kwargs):
        return self

    def set_(self, *args, **kwargs):
        return self

    def storage_offset(self):
        return 0

    def size(self):
        return self.arr.shape

    def stride(self, i=None):
        s = tuple(x // self.arr.itemsize for x in self.arr.strides)
        return s if i is None else s[i]

    def copy_(self, other):
        return self

    def element_size(self):
        return self.arr.itemsize


# ---- exact e4m3 (E4M3FN) and bf16 ---------------------------------------------------------------
def _e4m3_values():
    vals = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code >> 3) & 0xF, code & 7
        if e == 0xF and m == 7:
            vals.append(np.nan)
        elif e == 0:
            vals.append(sign * (m / 8.0) * 2.0 ** -6)
        else:
            vals.append(sign * (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.array(vals)


E4M3 = _e4m3_values()                      # code -> value
_POS_CODES = np.arange(127)                 # 0x00 .. 0x7e: the non-negative finite codes, ascending
_POS_VALUES = E4M3[_POS_CODES]


def to_e4m3(x):
    """Round to nearest, ties to even, saturating to +-448 (cvt.rn.satfinite.e4m3x2.f32)."""
    x = np.asarray(x, np.float64)
    a = np.clip(np.abs(x), 0, 448.0)
    hi = np.clip(np.searchsorted(_POS_VALUES, a), 1, len(_POS_VALUES) - 1)
    lo = hi - 1
    d_lo, d_hi = a - _POS_VALUES[lo], _POS_VALUES[hi] - a
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(_POS_CODES[lo] % 2 == 0, lo, hi)))
    code = _POS_CODES[pick].astype(np.uint8)
    return np.where(x < 0, code | 0x80, code).astype(np.uint8)


def f32_to_bf16_bits(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f64(u):
    return (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# ---- the interpreter's deviations from the GPU, patched --------------------------------------
# Its fp32 -> e4m3 / bf16 conversions truncate and drop the mantissa carry (the GPU's cvt rounds
# to nearest even): use the exact ones above.
_orig_convert = _interp._convert_float


def _convert_exact(inp, src, dst, rounding):
    if src == tl.float32 and dst == tl.float8e4nv:
        return to_e4m3(np.asarray(inp, np.float32))
    if src == tl.float32 and dst == tl.bfloat16:
        return f32_to_bf16_bits(inp)
    return _orig_convert(inp, src, dst, rounding)


_interp._convert_float = _convert_exact
_orig_cast = _interp.InterpreterBuilder.cast_impl


def _cast_impl(self, src, dst_type):
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        return _interp.TensorHandle(f32_to_bf16_bits(src.data), dst_type.scalar)
    return _orig_cast(self, src, dst_type)


_interp.InterpreterBuilder.cast_impl = _cast_impl
# numpy >= 2.4 refuses int() of a 1-element array, which the interpreter's scalars are.
_orig_patch_tensor = _interp._patch_lang_tensor


def _patch_tensor(tensor, scope):
    _orig_patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))


_interp._patch_lang_tensor = _patch_tensor


# ---- the check ---------------------------------------------------------------------------------
def attention_f64(q, k, v, causal):
    S, D = q.shape[2], q.shape[3]
    s = np.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(D)
    if causal:
        s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhij,bhjd->bhid", p / p.sum(-1, keepdims=True), v)


def rel_rmse(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def quantize(x):
    """Per-(b, h) amax scaling to e4m3, as peers.quantize_e4m3."""
    ds = np.abs(x).max(axis=(2, 3)) / peers.FP8_MAX
    return to_e4m3(x / ds[:, :, None, None]), ds


def run_case(B, H, S, D, causal, block_n, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, H, S, D)) for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = quantize(q), quantize(k), quantize(v)
    descale = np.stack([qd.reshape(-1), kd.reshape(-1), vd.reshape(-1)]).astype(np.float32)
    o = np.full((B, H, S, D), 0xFFFF, np.uint16)    # NaN: unwritten outputs show
    Q, K = FakeTensor(q8, "float8_e4m3fn"), FakeTensor(k8, "float8_e4m3fn")
    VT = FakeTensor(v8.transpose(0, 1, 3, 2), "float8_e4m3fn")
    O, DS = FakeTensor(o, "bfloat16"), FakeTensor(descale, "float32")
    block_m = 128
    peers._fp8_attn_fwd.fn[(math.ceil(S / block_m), B * H)](
        Q, K, VT, O, DS, peers.LOG2E / math.sqrt(D),
        Q.stride(1), Q.stride(2), K.stride(1), K.stride(2), VT.stride(1), VT.stride(2), O.stride(1), O.stride(2),
        B * H, S, HEAD_DIM=D, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n)
    got = bf16_bits_to_f64(O.arr)
    nan = int(np.isnan(got).sum())

    def deq(x8, ds):
        return E4M3[x8] * ds[:, :, None, None]
    own = rel_rmse(got, attention_f64(deq(q8, qd), deq(k8, kd), deq(v8, vd), causal)) if nan == 0 else float("inf")
    full = rel_rmse(got, attention_f64(q, k, v, causal)) if nan == 0 else float("inf")
    print("B%d H%d S%d D%d causal=%d BLOCK_N=%d: rel RMSE vs float64 %.3e, vs the dequantized inputs %.3e, NaN %d"
          % (B, H, S, D, causal, block_n, full, own, nan))
    return own


def main():
    cases = [(1, 2, 200, 64, False, 64), (1, 2, 200, 64, True, 64), (1, 1, 256, 128, True, 128),
             (1, 1, 300, 128, False, 128), (2, 1, 130, 64, True, 128), (1, 1, 128, 256, False, 64)]
    worst = max(run_case(*c) for c in cases)
    ok = worst < peers.TRITON_OWN_ERROR_TOL
    print("worst error vs the dequantized inputs %.3e (tolerance %.0e): %s" % (worst, peers.TRITON_OWN_ERROR_TOL,
                                                                             "OK" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
