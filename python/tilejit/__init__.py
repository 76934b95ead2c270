"""tilejit's attention and FP8 linear layer for PyTorch.

    import tilejit
    o = torch.ops.tilejit.attention(q, k, v, causal=True)              # bf16 / f16 tensor cores
    o = torch.ops.tilejit.attention(q, k, v, fp8=True)                 # quantized to e4m3 on the way
    o = tilejit.scaled_dot_product_attention(q, k, v, is_causal=True)  # F.scaled_dot_product_attention's call

q [B, H, Sq, D], k and v [B, Hkv, Skv, D] (Hkv divides H), any strides whose last one is 1 and
the others multiples of 16 bytes: [B, S, H, D] storage passed as q.transpose(1, 2), a packed
QKV's slices. No copies; on torch's current stream. The output has q's layout where q is dense.
Registered with torch.library, with fake kernels, so torch.compile traces through it, backward
included. Autograd: tilejit's attention backward (dq, dk, dv in q's, k's and v's layouts;
grouped-query heads summed; fp8=True: the FP8 backward, e4m3 Q K V dO and e5m2 dS; the variants
sliding_window, softcap and alibi: their 16-bit backward, with fp8=False only).

    y = tilejit.fp8_linear(x, w, bias)   # x [..., K] . w [N, K]^T (+ bias): e4m3 operands, e5m2 dy

The FP8 linear layer (seed 001's FP8Linear, dynamic scaling: one descale per tensor from its
amax), with autograd: dx = dy w and dw = dy^T x with dy in e5m2; bias's gradient in torch.
"""
import glob
import os

import torch

_here = os.path.dirname(os.path.abspath(__file__))
_libs = glob.glob(os.path.join(_here, "_C*.so"))
if not _libs:
    raise ImportError(f"tilejit: the compiled op (_C*.so) is not in {_here}; build it: pip install --no-build-isolation ./python")
torch.ops.load_library(_libs[0])   # registers torch.ops.tilejit.* (TORCH_LIBRARY)


@torch.library.register_fake("tilejit::attention")
def _attention_fake(q, k, v, causal=False, fp8=False, scale=None, variant="", variant_arg=0.0):
    torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4, lambda: "tilejit.attention: q, k and v must be [B, H, S, D]")
    return torch.empty_like(q)


@torch.library.register_fake("tilejit::_attention_forward")
def _attention_forward_fake(q, k, v, causal, scale, fp8=False, variant="", variant_arg=0.0):
    return torch.empty_like(q), q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)


@torch.library.register_fake("tilejit::_attention_backward")
def _attention_backward_fake(dout, q, k, v, o, lse, causal, scale, fp8=False, variant="", variant_arg=0.0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.register_fake("tilejit::fp8_linear")
def _fp8_linear_fake(x, w, bias=None):
    torch._check(w.dim() == 2 and x.shape[-1] == w.shape[1], lambda: "tilejit.fp8_linear: x [..., K] and w [N, K] do not fit")
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@torch.library.register_fake("tilejit::_fp8_linear_backward")
def _fp8_linear_backward_fake(dy, x, w):
    return torch.empty_like(x), torch.empty_like(w)


def fp8_linear(x, w, bias=None):
    """torch.ops.tilejit.fp8_linear: x [..., K] . w [N, K]^T (+ bias [N]) with x and w quantized to
    e4m3 (one descale per tensor); bf16 / f16, CUDA; M, N, K multiples of 16 for the FP8 path (else
    bf16, the reason printed once)."""
    if w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise RuntimeError(f"tilejit.fp8_linear: x [..., K] and w [N, K] do not fit: {tuple(x.shape)} and {tuple(w.shape)}")
    return torch.ops.tilejit.fp8_linear.default(x, w, bias)


def attention(q, k, v, *, causal=False, fp8=False, scale=None, variant="", variant_arg=0.0):
    """torch.ops.tilejit.attention: softmax(q kᵀ · scale) v. variant: "" or "sliding_window"
    (variant_arg: the window), "softcap" (variant_arg: the cap), "alibi"."""
    # By position: matching keywords to the schema costs about 2.5 us a call.
    return torch.ops.tilejit.attention.default(q, k, v, causal, fp8, scale, variant, variant_arg)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, fp8=False):
    """A drop-in for torch.nn.functional.scaled_dot_product_attention on CUDA bf16 / f16 inputs of
    4 dims. Masks other than is_causal and dropout are not supported (an error, not a fallback);
    fewer kv heads work with or without enable_gqa."""
    if attn_mask is not None:
        raise NotImplementedError("tilejit.scaled_dot_product_attention: attn_mask is not supported (is_causal, or a "
                                  "variant through tilejit.attention)")
    if dropout_p != 0.0:
        raise NotImplementedError("tilejit.scaled_dot_product_attention: dropout_p must be 0")
    return attention(query, key, value, causal=is_causal, fp8=fp8, scale=scale)
