// Attention variants in a few lines each (kernels/attention_variants.cpp holds the library's;
// this file writes one of its own), run on the GPU against the CPU reference executor.
//
//   build/examples/attention_variants [variant] [e4m3|bf16] [S]
//
// variant: causal, sliding, alibi, softcap, prefix_lm, segment, or local_plus_sinks (written
// below: a sliding window that always keeps the first 4 "sink" keys). Without a GPU it prints
// the generated hooks for sm_90a and runs the CPU reference only.
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include "kernels/attention_variants.h"
#include "runtime/driver.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;
using kernels::AttentionVariant;
using kernels::ScoreIndex;

// A variant of our own: StreamingLLM-style local attention with attention sinks.
AttentionVariant local_plus_sinks(int64_t window, int64_t sinks) {
  AttentionVariant v{fmt::format("attention_local_{}_sinks_{}", window, sinks)};
  v.mask_mod = [=](const ScoreIndex& at) { return at.kv <= at.q && (at.q - at.kv < window || at.kv < sinks); };
  return v;
}

AttentionVariant pick(const std::string& name, int64_t heads) {
  if (name == "causal") return kernels::causal_variant();
  if (name == "sliding") return kernels::sliding_window_variant(256);
  if (name == "alibi") return kernels::alibi_variant(heads, true);
  if (name == "softcap") return kernels::softcap_variant(30.0, true);
  if (name == "prefix_lm") return kernels::prefix_lm_variant();
  if (name == "segment") return kernels::segment_variant(256);
  if (name == "local_plus_sinks") return local_plus_sinks(256, 4);
  throw Error(fmt::format("unknown variant '{}' (causal, sliding, alibi, softcap, prefix_lm, segment, "
                          "local_plus_sinks)",
                          name));
}

HostTensor random_tensor(DType dt, std::vector<int64_t> shape, std::mt19937& rng, double scale) {
  HostTensor t(dt, std::move(shape));
  std::normal_distribution<double> n(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, n(rng));
  return t;
}

int main(int argc, char** argv) try {
  const std::string name = argc > 1 ? argv[1] : "local_plus_sinks";
  const DType dt = argc > 2 && std::string(argv[2]) == "bf16" ? DType::bf16 : DType::e4m3;
  const int64_t S = argc > 3 ? std::atoll(argv[3]) : 700, B = 1, H = 2, D = 128;
  Kernel k = kernels::attention_variant(pick(name, H));
  const bool prefix = name == "prefix_lm";

  // Inputs in the kernel's types; e4m3 values of N(0, 1) * 64 with descales 1/64 (per-tensor
  // scaling as the broadcast case of per-(b, h) descales).
  std::mt19937 rng(5);
  const double x_scale = is_fp8(dt) ? 64.0 : 1.0;
  HostTensor q = random_tensor(dt, {B, H, S, D}, rng, x_scale), kk = random_tensor(dt, {B, H, S, D}, rng, x_scale);
  const int64_t S_pad = (S + 15) / 16 * 16;
  HostTensor v = is_fp8(dt) ? random_tensor(dt, {B, H, D, S_pad}, rng, x_scale) : random_tensor(dt, {B, H, S, D}, rng, 1);
  HostTensor descale(DType::f32, {B, H}), prefix_len(DType::i64, {B});
  for (int64_t i = 0; i < descale.numel(); ++i) descale.set(i, 1.0 / x_scale);
  prefix_len.set(0, S / 3);
  auto args = [&](const std::vector<TensorView>& t, const TensorView& o, const TensorView& lse) {
    std::vector<Arg> a = {t[0], t[1], t[2], t[3], t[3], t[3], o, lse, 1.4426950408889634 / std::sqrt(double(D)), 1.0,
                          false, true};
    if (prefix) a.push_back(t[4]);
    return a;
  };
  Config cfg;
  cfg.blocks = {{"m", 128}, {"n", 128}};

  // The CPU reference executor runs the traced kernel as written.
  HostTensor o_ref(DType::bf16, {B, H, S, D}), lse_ref(DType::f32, {B, H, S});
  std::vector<TensorView> host = {q.view(), kk.view(), v.view(), descale.view(), prefix_len.view()};
  std::vector<Arg> ref_args = args(host, o_ref.view(), lse_ref.view());
  ir::Function f = k.trace(specs_for(k, ref_args, false));
  std::vector<ArgValue> ref;
  for (size_t i = 0; i < ref_args.size(); ++i) {
    if (k.slots()[i].is_host()) continue;
    if (const auto* t = std::get_if<TensorView>(&ref_args[i])) ref.emplace_back(*t);
    else ref.emplace_back(static_cast<float>(std::get<double>(ref_args[i])));
  }
  run_reference(f, cfg, ref);

  if (!runtime::driver().available()) {
    const CompiledKernel& ck = compile(k, specs_for(k, ref_args, false), cfg, CompileRequest{"sm_90a", false, false});
    const std::string& src = ck.generated.source;
    const size_t at = src.find("struct tj_hooks");
    fmt::print("{}: no GPU; the hooks tilejit generated for sm_90a ({}):\n{}\n", name, ck.generated.lowering,
               at == std::string::npos ? "(none: SIMT path)" : src.substr(at, src.find("};", at) + 2 - at));
    return 0;
  }
  std::vector<DeviceTensor> dev;
  for (const HostTensor* t : {&q, &kk, &v, &descale, &prefix_len}) dev.push_back(DeviceTensor::from_host(*t));
  std::vector<TensorView> views;
  for (auto& d : dev) views.push_back(d.view());
  DeviceTensor o(DType::bf16, o_ref.shape()), lse(DType::f32, lse_ref.shape());
  o.fill_bytes(0xFF);   // NaN: anything the kernel fails to write shows
  LaunchOptions lo;
  lo.config = cfg;
  launch(k, args(views, o.view(), lse.view()), lo);
  runtime::synchronize();
  std::vector<double> got = o.to_host().values(), want = o_ref.values();
  double se = 0, sr = 0;
  int64_t nan = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) ++nan;
    else se += (got[i] - want[i]) * (got[i] - want[i]);
    sr += want[i] * want[i];
  }
  const double rel = std::sqrt(se / sr);
  fmt::print("{} {} S={}: GPU vs CPU reference rel RMSE {:.3e}, NaN {} -> {}\n", name, tj::name(dt), S, rel, nan,
             rel <= 1e-2 && nan == 0 ? "OK" : "MISMATCH");
  return rel <= 1e-2 && nan == 0 ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 2;
}
