// The C API (api/tilejit_c.h) over kernels::attention_fp8_forward: checks the C arguments,
// turns them into TensorViews and C++ exceptions into statuses and a per-thread message.
#include "api/tilejit_c.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "codegen/launch_status.h"
#include "core/error.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_variant.h"
#include "kernels/attention_variants.h"
#include "kernels/attention_varlen.h"
#include "kernels/fp8_linear.h"
#include "runtime/device.h"
#include "runtime/driver.h"

namespace {

using tj::DType;
using tj::Error;
using tj::TensorView;

thread_local std::string g_last_error;

// A failure with its status, for the catch in tj_attention_forward.
struct ApiError : Error {
  tj_status status;
  ApiError(tj_status s, const std::string& message) : Error(message), status(s) {}
};

DType dtype_of(int32_t code, const char* what) {
  switch (code) {
    case TJ_F32: return DType::f32;
    case TJ_F16: return DType::f16;
    case TJ_BF16: return DType::bf16;
    case TJ_E4M3: return DType::e4m3;
    case TJ_E5M2: return DType::e5m2;
    case TJ_I32: return DType::i32;
    case TJ_I64: return DType::i64;
    case TJ_BOOL: return DType::i1;
  }
  throw ApiError(TJ_ERROR_DTYPE, fmt::format("{}: unknown tj_dtype {}", what, code));
}

TensorView view_of(const tj_tensor* t, const char* what) {
  if (!t) throw ApiError(TJ_ERROR_INVALID_ARGUMENT, fmt::format("{} is NULL", what));
  if (t->rank < 0 || t->rank > 8 || (t->rank > 0 && !t->shape))
    throw ApiError(TJ_ERROR_INVALID_ARGUMENT, fmt::format("{}: rank {} (0..8, with a shape)", what, t->rank));
  TensorView v;
  v.data = t->data;
  v.dtype = dtype_of(t->dtype, what);
  v.device = tj::Device::cuda;
  v.shape.assign(t->shape, t->shape + t->rank);
  for (int64_t d : v.shape)
    if (d < 0) throw ApiError(TJ_ERROR_INVALID_ARGUMENT, fmt::format("{}: negative dim in {}", what, v.describe()));
  if (t->strides) v.strides.assign(t->strides, t->strides + t->rank);
  return v;
}

// The variants a caller named, traced once each and kept for the process (launches hold
// references to their kernels): the forward's kernel and, once asked for, the backward's.
struct NamedVariant {
  tj::kernels::AttentionVariant variant;
  tj::Kernel forward;
  std::optional<tj::kernels::VariantBackward> backward;
  bool causal_mask = false;   // the mask never shows a key after its query
};
std::mutex variants_mutex;

NamedVariant& named_variant(const std::string& name, double arg, bool causal, int64_t heads) {
  static std::map<std::tuple<std::string, double, bool, int64_t>, NamedVariant> variants;
  std::lock_guard lock(variants_mutex);
  const auto key = std::make_tuple(name, arg, causal, name == "alibi" ? heads : 0);
  auto it = variants.find(key);
  if (it != variants.end()) return it->second;
  tj::kernels::AttentionVariant v;
  bool causal_mask = causal;
  if (name == "sliding_window") {
    if (!(arg >= 1) || arg != std::floor(arg))
      throw ApiError(TJ_ERROR_INVALID_ARGUMENT, fmt::format("variant sliding_window: variant_arg {} is not a window of >= 1 keys", arg));
    v = tj::kernels::sliding_window_variant(static_cast<int64_t>(arg));
    causal_mask = true;
  } else if (name == "softcap") {
    if (!(arg > 0)) throw ApiError(TJ_ERROR_INVALID_ARGUMENT, fmt::format("variant softcap: variant_arg {} is not a cap > 0", arg));
    v = tj::kernels::softcap_variant(arg, causal);
  } else if (name == "alibi") {
    v = tj::kernels::alibi_variant(heads, causal);
  } else {
    throw ApiError(TJ_ERROR_INVALID_ARGUMENT,
                   fmt::format("no attention variant named '{}' (variants: sliding_window, softcap, alibi)", name));
  }
  tj::Kernel forward = tj::kernels::attention_variant(v);
  return variants.emplace(key, NamedVariant{std::move(v), std::move(forward), std::nullopt, causal_mask}).first->second;
}

const tj::Kernel* variant_kernel(const std::string& name, double arg, bool causal, int64_t heads) {
  return &named_variant(name, arg, causal, heads).forward;
}

// A workspace per stream: calls on one stream run in order, so its scratch is reused safely.
tj::kernels::AttentionFp8Workspace& workspace(CUstream stream) {
  static std::mutex m;
  static std::map<CUstream, tj::kernels::AttentionFp8Workspace> spaces;
  std::lock_guard lock(m);
  return spaces[stream];
}

// The inputs' views and the options both attention calls share: q, k, v and o of one 16-bit type.
struct Common {
  TensorView q, k, v, o;
  tj::kernels::AttentionFp8Options fo;
};
Common common(CUstream stream, const tj_tensor* q, const tj_tensor* k, const tj_tensor* v, const tj_tensor* o,
              const tj_attention_options& opt) {
  Common c{view_of(q, "q"), view_of(k, "k"), view_of(v, "v"), view_of(o, "o"), {}};
  for (const TensorView* t : {&c.q, &c.k, &c.v})
    if (t->dtype != DType::bf16 && t->dtype != DType::f16)
      throw ApiError(TJ_ERROR_DTYPE, fmt::format("q, k and v must be bf16 or f16 (fp8 = 1 quantizes them), got {}", t->describe()));
  if (c.k.dtype != c.q.dtype || c.v.dtype != c.q.dtype || c.o.dtype != c.q.dtype)
    throw ApiError(TJ_ERROR_DTYPE, fmt::format("q, k, v and o must share one type: {}, {}, {}, {}", c.q.describe(),
                                               c.k.describe(), c.v.describe(), c.o.describe()));
  c.fo.causal = opt.causal != 0;
  c.fo.quantize = opt.fp8 != 0;
  if (opt.softmax_scale != 0.0) {
    if (!std::isfinite(opt.softmax_scale))
      throw ApiError(TJ_ERROR_INVALID_ARGUMENT, fmt::format("softmax_scale {} is not finite", opt.softmax_scale));
    c.fo.softmax_scale = opt.softmax_scale;
  }
  c.fo.stream = stream;
  return c;
}

void attention_forward(CUstream stream, const tj_tensor* q, const tj_tensor* k, const tj_tensor* v, const tj_tensor* o,
                       const tj_tensor* lse, const tj_attention_options* options) {
  const tj_attention_options defaults{0, 0, 0.0, nullptr, 0.0};
  const tj_attention_options& opt = options ? *options : defaults;
  Common c = common(stream, q, k, v, o, opt);
  const TensorView &qv = c.q, &kv = c.k, &vv = c.v, &ov = c.o;
  tj::kernels::AttentionFp8Options& fo = c.fo;
  if (lse) fo.lse = view_of(lse, "lse");
  const std::string variant = opt.variant ? opt.variant : "";
  if (!variant.empty()) {
    if (qv.rank() != 4) throw ApiError(TJ_ERROR_SHAPE, fmt::format("q must be [B, H, S, D], got {}", qv.describe()));
    fo.kernel = variant_kernel(variant, opt.variant_arg, fo.causal, qv.shape[1]);
    fo.causal = false;   // the variant's own mask holds the causality (sliding_window is causal)
  }
  tj::kernels::attention_fp8_forward(qv, kv, vv, ov, fo, workspace(stream));
}

void attention_varlen_forward(CUstream stream, const tj_tensor* q, const tj_tensor* k, const tj_tensor* v,
                              const tj_tensor* cu_seqlens, const tj_tensor* o, const tj_tensor* lse,
                              const tj_attention_options* options) {
  const tj_attention_options defaults{0, 0, 0.0, nullptr, 0.0};
  const tj_attention_options& opt = options ? *options : defaults;
  if (opt.variant && *opt.variant)
    throw ApiError(TJ_ERROR_INVALID_ARGUMENT,
                   fmt::format("variant '{}': varlen attention takes none (its mask is the sequences')", opt.variant));
  Common c = common(stream, q, k, v, o, opt);
  const TensorView cu = view_of(cu_seqlens, "cu_seqlens");
  tj::kernels::AttentionVarlenOptions vo;
  vo.attention = c.fo;
  if (lse) vo.lse = view_of(lse, "lse");
  tj::kernels::attention_varlen_forward(c.q, c.k, c.v, cu, c.o, vo, workspace(stream));
}

tj::kernels::AttentionBackwardWorkspace& backward_workspace(CUstream stream) {
  static std::mutex m;
  static std::map<CUstream, tj::kernels::AttentionBackwardWorkspace> spaces;
  std::lock_guard lock(m);
  return spaces[stream];
}

void attention_backward(CUstream stream, const tj_tensor* q, const tj_tensor* k, const tj_tensor* v, const tj_tensor* o,
                        const tj_tensor* dout, const tj_tensor* lse, const tj_tensor* dq, const tj_tensor* dk,
                        const tj_tensor* dv, const tj_attention_options* options) {
  const tj_attention_options defaults{0, 0, 0.0, nullptr, 0.0};
  const tj_attention_options& opt = options ? *options : defaults;
  const Common c = common(stream, q, k, v, o, opt);
  tj::kernels::AttentionBackwardOptions bo;
  bo.causal = c.fo.causal;
  const std::string variant = opt.variant ? opt.variant : "";
  if (!variant.empty()) {
    if (opt.fp8 != 0)
      throw ApiError(TJ_ERROR_INVALID_ARGUMENT, fmt::format("variant '{}': the FP8 backward takes no variant yet (fp8 = 0: the 16-bit "
                                                            "backward of the variant)",
                                                            variant));
    if (c.q.rank() != 4) throw ApiError(TJ_ERROR_SHAPE, fmt::format("q must be [B, H, S, D], got {}", c.q.describe()));
    NamedVariant& nv = named_variant(variant, opt.variant_arg, c.fo.causal, c.q.shape[1]);
    {
      std::lock_guard lock(variants_mutex);
      if (!nv.backward) nv.backward.emplace(tj::kernels::attention_variant_backward(nv.variant));
    }
    bo.variant = &*nv.backward;
    bo.causal = nv.causal_mask;   // the mask is the variant's; causal only stops the loops at the diagonal
  }
  bo.softmax_scale = c.fo.softmax_scale;
  bo.fp8 = opt.fp8 != 0;
  bo.stream = stream;
  tj::kernels::attention_backward(c.q, c.k, c.v, c.o, view_of(dout, "dout"), view_of(lse, "lse"), view_of(dq, "dq"),
                                  view_of(dk, "dk"), view_of(dv, "dv"), bo, backward_workspace(stream));
}

// The FP8 linear layer's scratch per stream (dynamic scaling keeps no history: the layers of one
// stream share it, each call in stream order).
tj::kernels::Fp8LinearState& linear_state(CUstream stream) {
  static std::mutex m;
  static std::map<CUstream, tj::kernels::Fp8LinearState> states;
  std::lock_guard lock(m);
  return states[stream];
}

void fp8_linear_forward(CUstream stream, const tj_tensor* x, const tj_tensor* w, const tj_tensor* bias, const tj_tensor* y) {
  tj::kernels::Fp8LinearOptions lo;
  lo.stream = stream;
  std::optional<TensorView> b;
  if (bias) b = view_of(bias, "bias");
  tj::kernels::fp8_linear_forward(view_of(x, "x"), view_of(w, "w"), b, view_of(y, "y"), lo, linear_state(stream));
}

void fp8_linear_backward(CUstream stream, const tj_tensor* dy, const tj_tensor* x, const tj_tensor* w, const tj_tensor* dx,
                         const tj_tensor* dw) {
  tj::kernels::Fp8LinearOptions lo;
  lo.stream = stream;
  tj::kernels::fp8_linear_backward(view_of(dy, "dy"), view_of(x, "x"), view_of(w, "w"), view_of(dx, "dx"), view_of(dw, "dw"), lo,
                                   linear_state(stream));
}

// A call's status and tj_last_error from what it threw.
template <class Fn>
tj_status guarded(const char* name, Fn fn) {
  g_last_error.clear();
  try {
    fn();
    return TJ_SUCCESS;
  } catch (const ApiError& e) {
    g_last_error = fmt::format("{}: {}", name, e.what());
    return e.status;
  } catch (const tj::CudaError& e) {
    g_last_error = fmt::format("{}: {}", name, e.what());
    return TJ_ERROR_CUDA;
  } catch (const std::exception& e) {
    g_last_error = fmt::format("{}: {}", name, e.what());
    return TJ_ERROR_INVALID_ARGUMENT;
  }
}

}  // namespace

extern "C" {

const char* tj_status_message(tj_status status) {
  return tj::codegen::status_message(static_cast<tj::codegen::LaunchStatus>(status));
}

tj_status tj_attention_forward(CUstream stream, const tj_tensor* q, const tj_tensor* k, const tj_tensor* v, const tj_tensor* o,
                               const tj_tensor* lse, const tj_attention_options* options) {
  return guarded("tj_attention_forward", [&] { attention_forward(stream, q, k, v, o, lse, options); });
}

tj_status tj_attention_varlen_forward(CUstream stream, const tj_tensor* q, const tj_tensor* k, const tj_tensor* v,
                                      const tj_tensor* cu_seqlens, const tj_tensor* o, const tj_tensor* lse,
                                      const tj_attention_options* options) {
  return guarded("tj_attention_varlen_forward",
                 [&] { attention_varlen_forward(stream, q, k, v, cu_seqlens, o, lse, options); });
}

tj_status tj_attention_backward(CUstream stream, const tj_tensor* q, const tj_tensor* k, const tj_tensor* v,
                                const tj_tensor* o, const tj_tensor* dout, const tj_tensor* lse, const tj_tensor* dq,
                                const tj_tensor* dk, const tj_tensor* dv, const tj_attention_options* options) {
  return guarded("tj_attention_backward", [&] { attention_backward(stream, q, k, v, o, dout, lse, dq, dk, dv, options); });
}

tj_status tj_fp8_linear_forward(CUstream stream, const tj_tensor* x, const tj_tensor* w, const tj_tensor* bias,
                                const tj_tensor* y) {
  return guarded("tj_fp8_linear_forward", [&] { fp8_linear_forward(stream, x, w, bias, y); });
}

tj_status tj_fp8_linear_backward(CUstream stream, const tj_tensor* dy, const tj_tensor* x, const tj_tensor* w,
                                 const tj_tensor* dx, const tj_tensor* dw) {
  return guarded("tj_fp8_linear_backward", [&] { fp8_linear_backward(stream, dy, x, w, dx, dw); });
}

const char* tj_last_error(void) { return g_last_error.c_str(); }

int32_t tj_device_ordinal(void) {
  try {
    return tj::runtime::selected_device_ordinal();
  } catch (const std::exception&) {
    return -1;
  }
}

}  // extern "C"
