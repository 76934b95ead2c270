#pragma once
// float64 gradients of attention at sampled rows: the reference that `tilejit run attention
// --backward` and `tilejit bench attention --backward` check the GPU's against; and the relative
// RMS error those and `tilejit bench ring` report.
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/owned_tensor.h"
#include "tools/attention.h"

namespace tj::tools {

// dq, dk and dv at rows `rows` of heads `heads` (head-major, then row), each row D values; dk / dv
// empty where they were not computed (attention_grads_f64 with dq_only).
struct SampledGrads {
  std::vector<double> dq, dk, dv;
};

// float64 gradients of attention (softmax scale 1/sqrt(D), causal top-left or not) for dL/do =
// dout, at the sampled rows of the sampled heads (a query row for dq, a key row for dk / dv) of
// q, k, v, dout [B, H, S, D] (contiguous; read as flat arrays of heads of S x D, whatever their
// shape says). dk / dv need every query row's softmax: each head costs
// about 2 S^2 D multiply-adds; dq alone (dq_only) needs only its own rows: about 3 S D a row.
SampledGrads attention_grads_f64(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& dout, int64_t S,
                                 int64_t D, bool causal, const std::vector<int64_t>& heads, const std::vector<int64_t>& rows,
                                 bool dq_only = false);

// The same rows of a gradient [B, H, S, D] (a contiguous host tensor, read flat), in SampledGrads'
// order.
std::vector<double> gather_rows(const HostTensor& t, int64_t S, int64_t D, const std::vector<int64_t>& heads,
                                const std::vector<int64_t>& rows);

// sqrt(sum (got - want)^2 / sum want^2); infinite when `got` holds a NaN or an infinity.
double relative_rmse(const std::vector<double>& got, const std::vector<double>& want);

// The gradients dq, dk, dv [B, H, S, D] (contiguous host tensors) at `want`'s rows against it:
// each one's relative RMS error; dk and dv -1 where want has none (dq_only) or `with_kv` is false.
struct GradErrors {
  double dq = -1, dk = -1, dv = -1;
  double worst() const;
};
GradErrors grad_errors(const HostTensor& dq, const HostTensor& dk, const HostTensor& dv, const SampledGrads& want, int64_t S,
                       int64_t D, const std::vector<int64_t>& heads, const std::vector<int64_t>& rows, bool with_kv = true);

// One backward measured: gq, gk and gv poisoned (NaN: what the call does not write shows), the call
// run once and its gradients copied back, then timed (time_launches: warm-ups, then the median of
// `reps` calls with the L2 flushed before each). On the legacy stream the poisoning memsets are
// ordered before the call.
struct MeasuredBackward {
  HostTensor dq, dk, dv;
  Timing timing;
};
MeasuredBackward measure_backward(const std::function<void()>& backward, DeviceTensor& gq, DeviceTensor& gk, DeviceTensor& gv,
                                  CUstream stream, int reps, int warmup, L2Flusher& l2);

}  // namespace tj::tools
