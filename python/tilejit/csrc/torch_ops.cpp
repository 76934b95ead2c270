// torch.ops.tilejit.attention and torch.ops.tilejit.fp8_linear: tilejit's attention and FP8 linear
// layer as PyTorch operators, over the C API
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

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "api/tilejit_c.h"

namespace {

// "[128, 64]": a tensor's dims for messages, formatted here (a failed check that streamed
// t.sizes() itself ended the process with a segmentation fault on the GPU machine, torch 2.11).
std::string dims(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

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
    TORCH_CHECK(t->dim() == 4, "tilejit.attention: q, k and v must be [B, H, S, D] (4 dims), got ", dims(*t));
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
                                                     std::optional<double> scale, bool fp8, c10::string_view variant,
                                                     double variant_arg) {
  check_inputs(q, k, v);
  TORCH_CHECK(!scale || *scale != 0.0, "tilejit.attention: scale must not be 0 (None: 1 / sqrt(head_dim))");
  at::Tensor o = at::empty_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  const std::string name(variant);
  run(q, k, v, o, options(causal, fp8, scale, name, variant_arg), &lse);
  return {o, lse};
}

// dq, dk, dv (q's, k's and v's layouts where dense) from the forward's o and lse.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                                  const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                                                                  bool causal, std::optional<double> scale, bool fp8,
                                                                  c10::string_view variant, double variant_arg) {
  check_inputs(q, k, v);
  TORCH_CHECK(dout.sizes() == o.sizes(), "tilejit.attention backward: the output's gradient is ", dims(dout), ", the output ",
              dims(o));
  // Autograd's gradients come in any strides (a sum's is expanded: stride 0); the kernels read
  // rows of unit stride, 16-byte aligned.
  bool readable = dout.stride(-1) == 1 && dout.scalar_type() == q.scalar_type();
  for (int64_t d = 0; d + 1 < dout.dim(); ++d) readable &= dout.stride(d) > 0 && dout.stride(d) % 8 == 0;
  const at::Tensor g = readable ? dout : dout.to(q.scalar_type()).contiguous();
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  const tj_tensor tq = view(q, "q"), tk = view(k, "k"), tv = view(v, "v"), to = view(o, "o"), tg = view(g, "dout"),
                  tdq = view(dq, "dq"), tdk = view(dk, "dk"), tdv = view(dv, "dv");
  const tj_tensor tl{lse.data_ptr(), TJ_F32, static_cast<int32_t>(lse.dim()), lse.sizes().data(), lse.strides().data()};
  const std::string name(variant);
  const tj_attention_options opt = options(causal, fp8, scale, name, variant_arg);
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

// attention's autograd: the forward saves q, k, v, o and the LSE for the backward (16-bit or fp8; a
// variant's backward is 16-bit: with fp8 a gradient asked of a variant is an error).
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool causal, bool fp8, std::optional<double> scale, const std::string& variant, double variant_arg) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale ? c10::IValue(*scale) : c10::IValue();
    ctx->saved_data["fp8"] = fp8;
    ctx->saved_data["variant"] = variant;
    ctx->saved_data["variant_arg"] = variant_arg;
    if (!variant.empty() && fp8) {
      ctx->saved_data["without"] = "variant '" + variant + "' with fp8=True (a variant's backward is 16-bit: fp8=False)";
      return attention_below_autograd(q, k, v, causal, fp8, scale, variant, variant_arg);
    }
    static const auto fwd =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("tilejit::_attention_forward", "")
            .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                                                      std::optional<double>, bool, c10::string_view, double)>();
    auto [o, lse] = fwd.call(q, k, v, causal, scale, fp8, variant, variant_arg);
    ctx->save_for_backward({q, k, v, o, lse});
    return o;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    if (ctx->saved_data.count("without"))
      TORCH_CHECK(false, "tilejit.attention: no backward for ", ctx->saved_data["without"].toStringRef(),
                  " yet");
    const auto saved = ctx->get_saved_variables();
    const c10::IValue& sc = ctx->saved_data["scale"];
    const std::optional<double> scale = sc.isNone() ? std::nullopt : std::optional<double>(sc.toDouble());
    static const auto bwd =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("tilejit::_attention_backward", "")
            .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                                  const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                                                                  std::optional<double>, bool, c10::string_view, double)>();
    const std::string variant = ctx->saved_data["variant"].toStringRef();
    auto [dq, dk, dv] = bwd.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], ctx->saved_data["causal"].toBool(), scale,
                                 ctx->saved_data["fp8"].toBool(), variant, ctx->saved_data["variant_arg"].toDouble());
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

// ---------------------------------------------------------------- the FP8 linear layer
// A matrix view [rows, cols] of `t` (its leading dims flattened) for the C API; valid while `t` lives.
tj_tensor matrix_view(const at::Tensor& t, const char* what, std::vector<int64_t>& shape, std::vector<int64_t>& strides) {
  TORCH_CHECK(t.is_cuda(), "tilejit.fp8_linear: ", what, " must be a CUDA tensor, got ", t.device());
  int32_t dtype = -1;
  switch (t.scalar_type()) {
    case at::kBFloat16: dtype = TJ_BF16; break;
    case at::kHalf: dtype = TJ_F16; break;
    case at::kFloat: dtype = TJ_F32; break;
    default: TORCH_CHECK(false, "tilejit.fp8_linear: ", what, " is ", t.scalar_type(), "; it takes bfloat16 or float16");
  }
  shape = {t.numel() / std::max<int64_t>(t.size(-1), 1), t.size(-1)};
  strides = {t.size(-1), 1};
  if (t.dim() == 1) shape = {t.size(0)}, strides = {1};
  return tj_tensor{t.data_ptr(), dtype, static_cast<int32_t>(shape.size()), shape.data(), strides.data()};
}

// y [..., N] = x [..., K] . w [N, K]^T (+ bias [N]), x and w quantized to e4m3 (dynamic scaling).
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(w.dim() == 2, "tilejit.fp8_linear: w must be [N, K], got ", dims(w));
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "tilejit.fp8_linear: x [..., K] and w [N, K] do not fit: ", dims(x), " and ",
              dims(w));
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  std::vector<int64_t> y_shape(x.sizes().begin(), x.sizes().end());
  y_shape.back() = w.size(0);
  at::Tensor y = at::empty(y_shape, x.options());
  std::vector<int64_t> s[8];
  const tj_tensor tx = matrix_view(xc, "x", s[0], s[1]), tw = matrix_view(wc, "w", s[2], s[3]), ty = matrix_view(y, "y", s[4], s[5]);
  at::Tensor bc;
  tj_tensor tb{};
  if (bias) {
    bc = bias->contiguous();
    tb = matrix_view(bc, "bias", s[6], s[7]);
  }
  const tj_status st = tj_fp8_linear_forward(current_stream(x), &tx, &tw, bias ? &tb : nullptr, &ty);
  TORCH_CHECK(st == TJ_SUCCESS, tj_last_error());
  return y;
}

// dx (x's shape), dw [N, K] from dy [..., N]: dy quantized to e5m2, x and w to e4m3.
std::tuple<at::Tensor, at::Tensor> fp8_linear_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor g = dy.to(x.scalar_type()).contiguous(), xc = x.contiguous(), wc = w.contiguous();
  at::Tensor dx = at::empty(x.sizes(), x.options()), dw = at::empty(w.sizes(), w.options());
  std::vector<int64_t> s[10];
  const tj_tensor tg = matrix_view(g, "dy", s[0], s[1]), tx = matrix_view(xc, "x", s[2], s[3]), tw = matrix_view(wc, "w", s[4], s[5]),
                  tdx = matrix_view(dx, "dx", s[6], s[7]), tdw = matrix_view(dw, "dw", s[8], s[9]);
  const tj_status st = tj_fp8_linear_backward(current_stream(x), &tg, &tx, &tw, &tdx, &tdw);
  TORCH_CHECK(st == TJ_SUCCESS, tj_last_error());
  return {dx, dw};
}

at::Tensor fp8_linear_below_autograd(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("tilejit::fp8_linear", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(x, w, bias);
}

class Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["bias"] = bias.has_value();
    return fp8_linear_below_autograd(x, w, bias);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    static const auto bwd = c10::Dispatcher::singleton()
                                .findSchemaOrThrow("tilejit::_fp8_linear_backward", "")
                                .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
    auto [dx, dw] = bwd.call(grads[0], saved[0], saved[1]);
    at::Tensor db;
    if (ctx->saved_data["bias"].toBool()) db = grads[0].reshape({-1, grads[0].size(-1)}).sum(0).to(saved[1].scalar_type());
    return {dx, dw, db};
  }
};

at::Tensor fp8_linear_autograd(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  const bool wants = x.requires_grad() || w.requires_grad() || (bias && bias->requires_grad());
  if (!at::GradMode::is_enabled() || !wants) return fp8_linear_below_autograd(x, w, bias);
  return Fp8LinearFunction::apply(x, w, bias);
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
  m.def("_attention_forward(Tensor q, Tensor k, Tensor v, bool causal, float? scale, bool fp8=False, str variant=\"\", "
        "float variant_arg=0.0) -> (Tensor, Tensor)");
  m.def("_attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal, float? scale, "
        "bool fp8=False, str variant=\"\", float variant_arg=0.0) -> (Tensor, Tensor, Tensor)");
  m.def("fp8_linear(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.def("_fp8_linear_backward(Tensor dy, Tensor x, Tensor w) -> (Tensor, Tensor)");
  m.def("_launch_microseconds(Tensor q, Tensor k, Tensor v, Tensor(a!) o, bool causal, int iters) -> float");
}

TORCH_LIBRARY_IMPL(tilejit, CUDA, m) {
  m.impl("attention", &attention);
  m.impl("_attention_forward", &attention_forward);
  m.impl("_attention_backward", &attention_backward);
  m.impl("_launch_microseconds", &launch_microseconds);
  m.impl("fp8_linear", &fp8_linear);
  m.impl("_fp8_linear_backward", &fp8_linear_backward);
}

TORCH_LIBRARY_IMPL(tilejit, Autograd, m) {
  m.impl("attention", &attention_autograd);
  m.impl("fp8_linear", &fp8_linear_autograd);
}

// Tensors elsewhere reach the same checks, which say what is wrong (not the dispatcher's "could not
// run with arguments from the 'CPU' backend").
TORCH_LIBRARY_IMPL(tilejit, CPU, m) { m.impl("attention", &attention); }
