// torch.ops.tilejit.attention: tilejit's attention as a PyTorch operator, over the C API
// (api/tilejit_c.h). Zero-copy: torch's tensors reach the kernels with their own strides, on
// torch's current stream. The fake (meta) kernel that torch.compile traces with is registered in
// Python (tilejit/__init__.py: torch.library.register_fake).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <chrono>
#include <string>

#include "api/tilejit_c.h"

namespace {

int32_t tj_dtype(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return TJ_BF16;
    case at::kHalf: return TJ_F16;
    default: TORCH_CHECK(false, "tilejit.attention: ", what, " is ", t.scalar_type(), "; tilejit takes bfloat16 or float16 (fp8=True quantizes them)");
  }
  return -1;
}

// A view of `t` for the C API; valid while `t` lives.
tj_tensor view(const at::Tensor& t, const char* what) {
  return tj_tensor{t.data_ptr(), tj_dtype(t, what), static_cast<int32_t>(t.dim()), t.sizes().data(), t.strides().data()};
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (const auto* t : {&q, &k, &v}) {
    TORCH_CHECK(t->is_cuda(), "tilejit.attention: q, k and v must be CUDA tensors, got ", t->device());
    TORCH_CHECK(t->dim() == 4, "tilejit.attention: q, k and v must be [B, H, S, D] (4 dims), got ", t->sizes());
  }
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(), "tilejit.attention: q, k and v must be on one device");
  static const int ordinal = tj_device_ordinal();   // $TILEJIT_DEVICE, read once as tilejit does
  TORCH_CHECK(q.device().index() == ordinal, "tilejit.attention: tilejit runs on cuda:", ordinal,
              " ($TILEJIT_DEVICE, default 0); the tensors are on ", q.device());
}

void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o, const tj_attention_options& opt) {
  // tilejit launches in its own (primary) context of q's device on the stream given: torch's current
  // device needs no guard.
  const tj_tensor tq = view(q, "q"), tk = view(k, "k"), tv = view(v, "v"), to = view(o, "o");
  const CUstream stream = reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
  const tj_status s = tj_attention_forward(stream, &tq, &tk, &tv, &to, nullptr, &opt);
  TORCH_CHECK(s == TJ_SUCCESS, tj_last_error());
}

// The options for the C API; they point at `variant`'s characters, which must outlive them.
tj_attention_options options(bool causal, bool fp8, std::optional<double> scale, const std::string& variant, double variant_arg) {
  return tj_attention_options{causal ? 1 : 0, fp8 ? 1 : 0, scale.value_or(0.0), variant.c_str(), variant_arg};
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, bool fp8,
                     std::optional<double> scale, c10::string_view variant, double variant_arg) {
  check_inputs(q, k, v);
  TORCH_CHECK(!scale || *scale != 0.0, "tilejit.attention: scale must not be 0 (None: 1 / sqrt(head_dim))");
  // The output takes q's layout where q is dense ([B, S, H, D] storage stays so), else [B, H, S, D].
  at::Tensor o = at::empty_like(q);
  const std::string name(variant);
  run(q, k, v, o, options(causal, fp8, scale, name, variant_arg));
  return o;
}

// Microseconds per tj_attention_forward call from C++ into a given output (`iters` calls, then a
// synchronize): the launch cost without PyTorch's dispatch and allocation, to compare the
// operator's with (bench/torch/check_op.py).
double launch_microseconds(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o, bool causal,
                           int64_t iters) {
  check_inputs(q, k, v);
  const std::string no_variant;   // outlives opt, which points at its characters
  const tj_attention_options opt = options(causal, false, std::nullopt, no_variant, 0.0);
  run(q, k, v, o, opt);   // compiled and warm
  c10::cuda::getCurrentCUDAStream(q.device().index()).synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) run(q, k, v, o, opt);
  c10::cuda::getCurrentCUDAStream(q.device().index()).synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(iters);
}

}  // namespace

TORCH_LIBRARY(tilejit, m) {
  // Positional after q, k, v too: a Python call that passes them by position skips the keyword
  // matching (about 2.5 us a call on an H100 host).
  m.def("attention(Tensor q, Tensor k, Tensor v, bool causal=False, bool fp8=False, float? scale=None, "
        "str variant=\"\", float variant_arg=0.0) -> Tensor");
  m.def("_launch_microseconds(Tensor q, Tensor k, Tensor v, Tensor(a!) o, bool causal, int iters) -> float");
}

TORCH_LIBRARY_IMPL(tilejit, CUDA, m) {
  m.impl("attention", &attention);
  m.impl("_launch_microseconds", &launch_microseconds);
}

// Tensors elsewhere reach the same checks, which say what is wrong (not the dispatcher's "could not
// run with arguments from the 'CPU' backend").
TORCH_LIBRARY_IMPL(tilejit, CPU, m) { m.impl("attention", &attention); }
