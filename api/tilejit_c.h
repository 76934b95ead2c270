/* tilejit's C API: the library's attention on tensors the caller owns, for foreign callers (the
 * PyTorch op in python/, other languages' bindings). Plain C, no tilejit or fmt header needed:
 * a caller builds against this file and links libtilejit.
 *
 * The common types (tj_status, tj_dtype, tj_tensor, tj_arg, tj_dltensor) are the ones `tilejit
 * export` writes into its headers, under the same guard, so that a program may include both in
 * either order (tests/test_export.cpp checks that the declarations stay the same text). */
#ifndef TILEJIT_C_H
#define TILEJIT_C_H

#include <stddef.h>
#include <stdint.h>
#include <cuda.h>

#ifndef TJ_EXPORT_NO_DLPACK
#if defined(__has_include)
#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
#ifndef TJ_EXPORT_HAVE_DLPACK
#define TJ_EXPORT_HAVE_DLPACK 1
#endif
#endif
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#ifndef TJ_EXPORT_COMMON_TYPES
#define TJ_EXPORT_COMMON_TYPES 1
#define TJ_EXPORT_ABI_VERSION 1

typedef enum tj_status {
  TJ_SUCCESS = 0,
  TJ_ERROR_INVALID_ARGUMENT = 1,   /* NULL tensor, negative dim, wrong argument kind/count, not GPU memory */
  TJ_ERROR_DTYPE = 2,              /* no specialization takes these element types / ranks */
  TJ_ERROR_SHAPE = 3,              /* no specialization for these shapes / flags (the message lists them) */
  TJ_ERROR_ALIGNMENT = 4,          /* data or strides not aligned as the kernel needs (TMA: 16 bytes) */
  TJ_ERROR_UNSUPPORTED_DEVICE = 5, /* no CUBIN for this GPU's architecture */
  TJ_ERROR_NO_CONTEXT = 6,         /* no current CUDA context on this thread */
  TJ_ERROR_CUDA = 7,               /* a CUDA driver call failed */
  TJ_ERROR_TOO_LARGE = 8,          /* more thread blocks than one launch allows */
  TJ_ERROR_TOO_MANY_CONTEXTS = 9   /* more than 64 CUDA contexts */
} tj_status;

typedef enum tj_dtype {
  TJ_F32 = 0, TJ_F16 = 1, TJ_BF16 = 2, TJ_E4M3 = 3, TJ_E5M2 = 4, TJ_I32 = 5, TJ_I64 = 6, TJ_BOOL = 7
} tj_dtype;

/* A tensor in GPU memory. Strides are in elements; NULL strides mean contiguous row-major.
 * `data` is a CUdeviceptr cast to a pointer. */
typedef struct tj_tensor {
  void* data;
  int32_t dtype;            /* tj_dtype */
  int32_t rank;
  const int64_t* shape;     /* rank entries */
  const int64_t* strides;   /* rank entries, or NULL */
} tj_tensor;

typedef enum tj_arg_kind { TJ_ARG_TENSOR = 0, TJ_ARG_FLOAT = 1, TJ_ARG_INT = 2 } tj_arg_kind;
typedef struct tj_arg {
  int32_t kind;             /* tj_arg_kind */
  int32_t reserved;
  union {
    const tj_tensor* tensor;
    double f;
    int64_t i;
  } value;
} tj_arg;

#ifdef TJ_EXPORT_HAVE_DLPACK
typedef DLTensor tj_dltensor;
#else
typedef struct tj_dltensor_unavailable tj_dltensor;   /* include <dlpack/dlpack.h> first */
#endif

/* A short description of a status code (static storage). */
const char* tj_status_message(tj_status status);
#endif /* TJ_EXPORT_COMMON_TYPES */

/* What tj_attention_forward computes besides plain softmax attention. */
typedef struct tj_attention_options {
  int32_t causal;           /* 1: key j is seen by query i when j <= i (top-left aligned) */
  int32_t fp8;              /* 1: quantize the 16-bit q, k, v to e4m3 (descales per (batch, head)) and run the
                               FP8 attention; 0: the 16-bit attention on the inputs as given */
  double softmax_scale;     /* 0: 1 / sqrt(head_dim) */
  const char* variant;      /* NULL or "": none; "sliding_window" (causal, query i sees keys i - window < j <= i),
                               "softcap" (score = cap * tanh(score / cap)), "alibi" (score + slope_h * (j - i)) */
  double variant_arg;       /* sliding_window: the window in keys; softcap: the cap; alibi: unused */
} tj_attention_options;

/* o = attention(q, k, v) on `stream` (asynchronous), on the GPU tilejit runs on (ordinal
 * tj_device_ordinal(), $TILEJIT_DEVICE or 0). q and o [B, H, Sq, D], k and v [B, Hkv, Skv, D]
 * (bf16 or f16, all one type; H a multiple of Hkv: grouped-query heads), with any strides whose
 * last one is 1 and the others multiples of 16 bytes ([B, S, H, D] storage viewed as [B, H, S, D],
 * a packed QKV's slices): no copies. lse: NULL, or f32 [B, H, Sq] to receive each row's
 * logsumexp (natural log). The first call for a shape compiles its kernels (NVRTC; then cached in
 * memory and on disk). Workspaces (the FP8 copies) are kept per stream. On failure the message is
 * in tj_last_error(). */
tj_status tj_attention_forward(CUstream stream, const tj_tensor* q, const tj_tensor* k, const tj_tensor* v,
                               const tj_tensor* o, const tj_tensor* lse, const tj_attention_options* options);

/* Variable-length attention over packed sequences (FlashAttention's varlen layout): q and o
 * [T, H, D], k and v [T, Hkv, D] hold the batch's sequences one after another (bf16 or f16, any
 * strides whose last one is 1); cu_seqlens (i32 or i64 [N + 1], on the GPU) says where each
 * starts: cu_seqlens[0] = 0, ascending, cu_seqlens[N] = T (read back and checked: one small copy
 * and a wait on `stream`). A query sees the keys of its own sequence (options->causal: up to its
 * own position). options->variant must be NULL or "". lse: NULL, or f32 [H, T] (natural log).
 * Otherwise as tj_attention_forward. */
tj_status tj_attention_varlen_forward(CUstream stream, const tj_tensor* q, const tj_tensor* k, const tj_tensor* v,
                                      const tj_tensor* cu_seqlens, const tj_tensor* o, const tj_tensor* lse,
                                      const tj_attention_options* options);

/* The gradients of tj_attention_forward's attention: dq, dk and dv of a loss L given
 * dout = dL/do, from q, k, v and the forward's o and lse (f32 [B, H, Sq], natural log: what
 * tj_attention_forward wrote, with the same options->fp8). options->fp8 1: the FP8 backward (q, k,
 * v and dout quantized to e4m3 per (batch, head), dS in e5m2; docs/numerics.md). q, o, dout, dq [B, H, Sq, D]; k, v, dk, dv [B, Hkv,
 * Skv, D] (grouped-query heads: dk and dv summed over each group of H / Hkv query heads in a fixed
 * order); q, k, v, o and dout of one type, bf16 or f16, with the strides tj_attention_forward takes;
 * the gradients bf16, f16 or f32. options->causal and softmax_scale as in the forward. The same
 * bits on every call (dQ in a kernel of its own, no atomics). options->variant as in the forward
 * (its score_mod's derivative and its mask in the backward's kernels; 16-bit only: fp8 = 0), with the
 * lse that forward wrote. Scratch is kept per stream;
 * asynchronous on `stream`. On failure the message is in tj_last_error(). */
tj_status tj_attention_backward(CUstream stream, const tj_tensor* q, const tj_tensor* k, const tj_tensor* v,
                                const tj_tensor* o, const tj_tensor* dout, const tj_tensor* lse, const tj_tensor* dq,
                                const tj_tensor* dk, const tj_tensor* dv, const tj_attention_options* options);

/* The FP8 linear layer (seed 001's FP8Linear), dynamic scaling: y [M, N] = x [M, K] . w [N, K]^T
 * (+ bias [N]; NULL: none) with x and w quantized to e4m3, one descale per tensor from its amax;
 * x, w, bias bf16 or f16, y bf16, f16 or f32, rows contiguous. Where M, N or K is not a multiple
 * of 16 the product runs in bf16 instead (the reason printed once per shape on stderr).
 * Asynchronous on `stream`; scratch kept per stream. */
tj_status tj_fp8_linear_forward(CUstream stream, const tj_tensor* x, const tj_tensor* w, const tj_tensor* bias,
                                const tj_tensor* y);
/* Its backward: dx [M, K] = dy [M, N] . w and dw [N, K] = dy^T . x with dy quantized to e5m2 (x and
 * w to e4m3 again); dy of x's dtype, dx and dw bf16, f16 or f32. */
tj_status tj_fp8_linear_backward(CUstream stream, const tj_tensor* dy, const tj_tensor* x, const tj_tensor* w,
                                 const tj_tensor* dx, const tj_tensor* dw);

/* What the last failed call on this thread said (empty when none failed). */
const char* tj_last_error(void);

/* The CUDA device ordinal tilejit runs on ($TILEJIT_DEVICE, default 0), or -1 when the value
 * of $TILEJIT_DEVICE is not an ordinal. */
int32_t tj_device_ordinal(void);

#ifdef __cplusplus
}
#endif

#endif /* TILEJIT_C_H */
