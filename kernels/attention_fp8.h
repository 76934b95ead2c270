#pragma once
// Host-side helpers for the FP8 attention pipeline (kernels/attention_fp8.cpp, kernels/quantize.cpp):
// from bf16/f16 Q, K, V on the GPU to the attention output, quantizing on the way.
#include <cuda.h>

#include <optional>

#include "autotune/config.h"
#include "runtime/owned_tensor.h"
#include "runtime/tensor.h"

namespace tj::kernels {

struct AttentionFp8Options {
  bool causal = false;                       // top-left aligned
  std::optional<double> softmax_scale;       // default 1/sqrt(D)
  bool quantize = true;                      // false: attention_fp8 on the 16-bit inputs as given (descales 1)
  std::optional<Config> attention_config;    // default: attention_fp8_default_config(...)
  std::optional<TensorView> lse;             // f32 [B, H, Sq] to fill with the row logsumexp
  float o_scale = 1.0f;                      // e4m3 outputs: o = e4m3(O * o_scale)
  CUstream stream = nullptr;
};

// Device scratch of attention_fp8_forward (fp8 copies of q and k, Vᵀ, the descales), reused
// across calls (reallocated when shapes change).
struct AttentionFp8Workspace {
  std::optional<DeviceTensor> q8, k8, vt8, qd, kd, vd, ones, no_lse;
};

// o = attention(q, k, v) for device tensors q [B, H, Sq, D], k / v [B, Hkv, Skv, D] (bf16 or
// f16) and o [B, H, Sq, D] (bf16, f16 or e4m3): quantize_fp8 (q, k), quantize_transpose_fp8 (v)
// -- e4m3 with per-(b, h) descales -- then attention_fp8, all through tj::launch on
// opt.stream (the attention itself through the sm_90a tensor-core lowering on Hopper).
void attention_fp8_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                           const AttentionFp8Options& opt, AttentionFp8Workspace& ws);

// The config attention_fp8_forward uses by default: block m 128 (two consumer warpgroups), block
// n the largest key block whose registers fit the head dim (bench/attention/RESULTS: the
// harness's fastest per head dim), 2 stages.
Config attention_fp8_default_config(DType in, int64_t head_dim, bool causal);

}  // namespace tj::kernels
