// torch.ops.tilejit.attention: tilejit's attention as a PyTorch operator, over the C API
// (api/tilejit_c.h). Zero-copy: torch's tensors reach the kernels with their own strides, on
// torch's current stream. The fake (meta) kernel that torch.compile traces with is registered in
// Python (tilejit/__init__.py: torch.library.register_fake). Autograd: the Autograd kernel of
// `attention` runs _attention_forward (which also returns the LSE) and saves what
// _attention_backward (tj_attention_backward) takes; torch.compile traces both through their fake
// kernels.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>
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

CUstream current_stream(const at::Tensor& t) {
  return reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
}

// lse: nullptr, or f32 [B, H, Sq] to receive the rows' logsumexp.
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o, const tj_attention_options& opt,
         const at::Tensor* lse = nullptr) {
  // tilejit launches in its own (primary) context of q's device on the stream given: torch's current
  // device needs no guard.
  const tj_tensor tq = view(q, "q"), tk = view(k, "k"), tv = view(v, "v"), to = view(o, "o");
  tj_tensor tl{};
  if (lse) tl = tj_tensor{lse->data_ptr(), TJ_F32, static_cast<int32_t>(lse->dim()), lse->sizes().data(), lse->strides().data()};
  const tj_status s = tj_attention_forward(current_stream(q), &tq, &tk, &tv, &to, lse ? &tl : nullptr, &opt);
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

// The forward that autograd saves for: o and the rows' LSE (f32 [B, H, Sq], natural log).
std::tuple<at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                                     std::optional<double> scale) {
  check_inputs(q, k, v);
  TORCH_CHECK(!scale || *scale != 0.0, "tilejit.attention: scale must not be 0 (None: 1 / sqrt(head_dim))");
  at::Tensor o = at::empty_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  const std::string no_variant;
  run(q, k, v, o, options(causal, false, scale, no_variant, 0.0), &lse);
  return {o, lse};
}

// dq, dk, dv (q's, k's and v's layouts where dense) from the forward's o and lse.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                                  const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                                                                  bool causal, std::optional<double> scale) {
  check_inputs(q, k, v);
  TORCH_CHECK(dout.sizes() == o.sizes(), "tilejit.attention backward: the output's gradient is ", dout.sizes(), ", the output ",
              o.sizes());
  // Autograd's gradients come in any strides (a sum's is expanded: stride 0); the kernels read
  // rows of unit stride, 16-byte aligned.
  bool readable = dout.stride(-1) == 1 && dout.scalar_type() == q.scalar_type();
  for (int64_t d = 0; d + 1 < dout.dim(); ++d) readable &= dout.stride(d) > 0 && dout.stride(d) % 8 == 0;
  const at::Tensor g = readable ? dout : dout.to(q.scalar_type()).contiguous();
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  const tj_tensor tq = view(q, "q"), tk = view(k, "k"), tv = view(v, "v"), to = view(o, "o"), tg = view(g, "dout"),
                  tdq = view(dq, "dq"), tdk = view(dk, "dk"), tdv = view(dv, "dv");
  const tj_tensor tl{lse.data_ptr(), TJ_F32, static_cast<int32_t>(lse.dim()), lse.sizes().data(), lse.strides().data()};
  const std::string no_variant;
  const tj_attention_options opt = options(causal, false, scale, no_variant, 0.0);
  const tj_status s = tj_attention_backward(current_stream(q), &tq, &tk, &tv, &to, &tg, &tl, &tdq, &tdk, &tdv, &opt);
  TORCH_CHECK(s == TJ_SUCCESS, tj_last_error());
  return {dq, dk, dv};
}

// The `attention` operator below autograd (its CUDA, CPU or fake kernel: torch.compile traces with
// fake tensors, which have no data).
at::Tensor attention_below_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, bool fp8,
                                    std::optional<double> scale, c10::string_view variant, double variant_arg) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("tilejit::attention", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, bool,
                                               std::optional<double>, c10::string_view, double)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(q, k, v, causal, fp8, scale, variant, variant_arg);
}

// attention's autograd: the 16-bit attention without a variant saves q, k, v, o and the LSE for
// the backward; fp8 and the variants have none yet (an error when a gradient is asked of them).
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool causal, bool fp8, std::optional<double> scale, const std::string& variant, double variant_arg) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale ? c10::IValue(*scale) : c10::IValue();
    if (fp8 || !variant.empty()) {
      ctx->saved_data["without"] = fp8 ? std::string("fp8=True") : "variant '" + variant + "'";
      return attention_below_autograd(q, k, v, causal, fp8, scale, variant, variant_arg);
    }
    static const auto fwd = c10::Dispatcher::singleton()
                                .findSchemaOrThrow("tilejit::_attention_forward", "")
                                .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                                          bool, std::optional<double>)>();
    auto [o, lse] = fwd.call(q, k, v, causal, scale);
    ctx->save_for_backward({q, k, v, o, lse});
    return o;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    if (ctx->saved_data.count("without"))
      TORCH_CHECK(false, "tilejit.attention: no backward for ", ctx->saved_data["without"].toStringRef(),
                  " yet (the 16-bit attention without a variant has one)");
    const auto saved = ctx->get_saved_variables();
    const c10::IValue& sc = ctx->saved_data["scale"];
    const std::optional<double> scale = sc.isNone() ? std::nullopt : std::optional<double>(sc.toDouble());
    static const auto bwd =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("tilejit::_attention_backward", "")
            .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                                  const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                                                                  std::optional<double>)>();
    auto [dq, dk, dv] = bwd.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], ctx->saved_data["causal"].toBool(), scale);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, bool fp8,
                              std::optional<double> scale, c10::string_view variant, double variant_arg) {
  // Without a gradient to record, straight to the kernel below autograd.
  if (!at::GradMode::is_enabled() || !(q.requires_grad() || k.requires_grad() || v.requires_grad()))
    return attention_below_autograd(q, k, v, causal, fp8, scale, variant, variant_arg);
  return AttentionFunction::apply(q, k, v, causal, fp8, scale, std::string(variant), variant_arg);
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
  m.def("_attention_forward(Tensor q, Tensor k, Tensor v, bool causal, float? scale) -> (Tensor, Tensor)");
  m.def("_attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal, float? scale) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("_launch_microseconds(Tensor q, Tensor k, Tensor v, Tensor(a!) o, bool causal, int iters) -> float");
}

TORCH_LIBRARY_IMPL(tilejit, CUDA, m) {
  m.impl("attention", &attention);
  m.impl("_attention_forward", &attention_forward);
  m.impl("_attention_backward", &attention_backward);
  m.impl("_launch_microseconds", &launch_microseconds);
}

TORCH_LIBRARY_IMPL(tilejit, Autograd, m) { m.impl("attention", &attention_autograd); }

// Tensors elsewhere reach the same checks, which say what is wrong (not the dispatcher's "could not
// run with arguments from the 'CPU' backend").
TORCH_LIBRARY_IMPL(tilejit, CPU, m) { m.impl("attention", &attention); }
