// `tilejit bench variants --backward`: the backward of issue #7's attention variants
// (kernels/attention_backward.h: attention_variant_backward, the variants' hooks traced into the DSL
// backward kernels on the generic tensor-core lowering) after the variant's forward with its LSE,
// gradients checked against float64 of the variant's meaning; then flex_attention's compiled
// backward (bench/attention/peers.py --variants --backward); one markdown table.
//
// Method as `tilejit bench attention --backward` (/work/.library/device/METHOD.md): warm-up calls,
// then the median of --reps calls each between two CUDA events, the L2 flushed before each; random
// N(0, 1) bf16 q, k, v and dO; the gradients poisoned (NaN) before the first call and checked after.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <future>

#include "core/error.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_fp8.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "runtime/nvrtc.h"
#include "tools/attention.h"
#include "tools/attention_grads.h"
#include "tools/variants.h"

namespace tj::tools {

namespace {

constexpr int kCheckRows = 16;
constexpr double kMaxRelRmse = 3e-2;   // bf16 gradients of bf16 inputs, as `tilejit bench attention --backward`
const char* const kOurs = "tilejit_bf16_bwd";
const char* const kOursFp8 = "tilejit_fp8_bwd";
const char* const kFlex = "flex_bf16_bwd";
// FP8 gradients (e4m3 Q K V dO, e5m2 dS) against float64: the recipe's own error, as the FP8
// backward's GPU test bounds it.
constexpr double kMaxRelRmseFp8 = 0.15;

// The variant's masks that never show a key after its query: the backward launches with causal =
// true (its loops stop at the diagonal; the mask stays the variant's).
bool causal_mask(const VariantCase& c) {
  for (const char* n : {"causal", "sliding_window", "alibi", "softcap", "gqa", "documents", "block_mask"})
    if (c.name == n) return true;
  return false;
}

// float64 gradients of the case's meaning (c.rule) for head bh (flattened b·H + h): dq at query rows
// `rows`, dk and dv at key rows `rows` (this head's share; the kv head's with Hkv = H). Every query
// row's softmax is formed once (its LSE and delta), 2 S^2 D multiply-adds, on every core. The
// score's derivative comes from a central difference of c.rule.score (1 without one).
SampledGrads variant_grads_f64(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& dout,
                               const VariantCase& c, int64_t bh, const std::vector<int64_t>& rows) {
  const int64_t S = c.S, D = c.D, b = bh / c.H, h = bh % c.H, hk = b * c.Hkv + h / (c.H / c.Hkv);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int64_t qb = bh * S * D, kb = hk * S * D;
  auto raw = [&](int64_t i, int64_t j) {
    double d = 0;
    for (int64_t x = 0; x < D; ++x) d += q.at(qb + i * D + x) * k.at(kb + j * D + x);
    return d * scale;
  };
  auto visible = [&](int64_t i, int64_t j) { return !c.rule.keep || c.rule.keep(b, h, i, j); };
  auto modded = [&](double s, int64_t i, int64_t j) { return c.rule.score ? c.rule.score(s, b, h, i, j) : s; };
  auto slope = [&](double s, int64_t i, int64_t j) {
    if (!c.rule.score) return 1.0;
    const double e = 1e-4 * std::max(1.0, std::abs(s));
    return (c.rule.score(s + e, b, h, i, j) - c.rule.score(s - e, b, h, i, j)) / (2 * e);
  };
  auto dp = [&](int64_t i, int64_t j) {
    double d = 0;
    for (int64_t x = 0; x < D; ++x) d += dout.at(qb + i * D + x) * v.at(kb + j * D + x);
    return d;
  };
  // Pass 1, every query row: its LSE (natural log) and delta = dO . O.
  std::vector<double> lse(S, -INFINITY), delta(S, 0.0);
  parallel_for(S, [&](int64_t i) {
    std::vector<double> s(S, -INFINITY);
    double mx = -INFINITY;
    for (int64_t j = 0; j < S; ++j)
      if (visible(i, j)) mx = std::max(mx, s[j] = modded(raw(i, j), i, j));
    if (mx == -INFINITY) return;
    double sum = 0;
    for (int64_t j = 0; j < S; ++j) sum += std::isinf(s[j]) ? 0.0 : std::exp(s[j] - mx);
    lse[i] = mx + std::log(sum);
    std::vector<double> o(D, 0.0);
    for (int64_t j = 0; j < S; ++j)
      if (!std::isinf(s[j])) {
        const double p = std::exp(s[j] - lse[i]);
        for (int64_t x = 0; x < D; ++x) o[x] += p * v.at(kb + j * D + x);
      }
    for (int64_t x = 0; x < D; ++x) delta[i] += dout.at(qb + i * D + x) * o[x];
  });
  const int64_t R = static_cast<int64_t>(rows.size());
  SampledGrads g{std::vector<double>(R * D, 0.0), std::vector<double>(R * D, 0.0), std::vector<double>(R * D, 0.0)};
  parallel_for(2 * R, [&](int64_t t) {
    const int64_t r = t % R, row = rows[r];
    for (int64_t other = 0; other < S; ++other) {
      const int64_t i = t < R ? row : other, j = t < R ? other : row;   // dq: query row; dk, dv: key row
      if (!visible(i, j) || std::isinf(lse[i])) continue;
      const double s = raw(i, j), p = std::exp(modded(s, i, j) - lse[i]);
      const double ds = p * (dp(i, j) - delta[i]) * slope(s, i, j);
      for (int64_t x = 0; x < D; ++x) {
        if (t < R) {
          g.dq[r * D + x] += ds * k.at(kb + j * D + x) * scale;
        } else {
          g.dk[r * D + x] += ds * q.at(qb + i * D + x) * scale;
          g.dv[r * D + x] += p * dout.at(qb + i * D + x);
        }
      }
    }
  });
  return g;
}

struct Inputs {
  HostTensor q, k, v, dout;
  DeviceTensor dq, dk, dv, ddo, o, lse, gq, gk, gv;
};

bool bench_case(VariantCase& c, Inputs& in, CUstream stream, L2Flusher& l2, const BenchVariantsOptions& o, VariantTable& table) {
  if (!c.dilated.empty())
    throw Error("dilated: its backward (kernels/dilated_attention.h: dilated_attention_backward) is not timed here yet");
  const std::vector<int64_t> qs{c.B, c.H, c.S, c.D}, ks{c.B, c.Hkv, c.S, c.D};
  const TensorView q = reshaped(in.dq.view(), qs), k = reshaped(in.dk.view(), ks), v = reshaped(in.dv.view(), ks),
                   dout = reshaped(in.ddo.view(), qs), out = reshaped(in.o.view(), qs), gq = reshaped(in.gq.view(), qs),
                   gk = reshaped(in.gk.view(), ks), gv = reshaped(in.gv.view(), ks), lse = reshaped(in.lse.view(), {c.B, c.H, c.S});
  c.visible = visible_entries(c);
  const double flops = 2.5 * variant_flops(c);   // five matrix products to the forward's two

  // The variant's inputs (prefix_lm, documents, block_mask), as `tilejit bench variants` makes them.
  std::optional<DeviceTensor> prefix, cu, cells;
  std::vector<TensorView> extra;
  if (c.prefix > 0) {
    HostTensor p(DType::i64, {c.B});
    for (int64_t b = 0; b < c.B; ++b) p.set(b, static_cast<double>(c.prefix));
    extra.push_back(prefix.emplace(DeviceTensor::from_host(p)).view());
  }
  if (!c.cu_seqlens.empty()) {
    HostTensor t(DType::i32, {static_cast<int64_t>(c.cu_seqlens.size())});
    for (size_t i = 0; i < c.cu_seqlens.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(c.cu_seqlens[i]));
    extra.push_back(cu.emplace(DeviceTensor::from_host(t)).view());
  }
  if (c.block_mask) {
    const int64_t n = (c.S + kVariantBlockCell - 1) / kVariantBlockCell;
    HostTensor t(DType::i32, {1, 1, n, n});
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) t.set(i * n + j, variant_block_kept(i, j) ? 1.0 : 0.0);
    extra.push_back(cells.emplace(DeviceTensor::from_host(t)).view());
  }

  // The reference on the last head, beside the GPU's work.
  const int64_t head = c.B * c.H - 1;
  std::vector<int64_t> rows;
  for (int i = 0; i < kCheckRows; ++i) rows.push_back(i * (c.S - 1) / (kCheckRows - 1));
  auto reference = std::async(std::launch::async, [&] { return variant_grads_f64(in.q, in.k, in.v, in.dout, c, head, rows); });

  std::optional<Kernel> forward;
  std::optional<kernels::VariantBackward> vb;
  kernels::AttentionFp8Options fwd;
  fwd.quantize = false;
  fwd.causal = c.causal_flag;
  fwd.lse = lse;
  fwd.stream = stream;
  fwd.inputs = extra;
  if (c.variant) {
    fwd.kernel = &forward.emplace(kernels::attention_variant(*c.variant));
    vb.emplace(kernels::attention_variant_backward(*c.variant));
  }
  kernels::AttentionFp8Workspace fws;
  kernels::attention_fp8_forward(q, k, v, out, fwd, fws);
  kernels::AttentionBackwardOptions opt;
  opt.causal = c.causal_flag || causal_mask(c);
  opt.stream = stream;
  if (vb) {
    opt.variant = &*vb;
    opt.variant_inputs = extra;
  }
  kernels::AttentionBackwardWorkspace ws;
  const MeasuredBackward m = measure_backward([&] { kernels::attention_backward(q, k, v, out, dout, lse, gq, gk, gv, opt, ws); },
                                              in.gq, in.gk, in.gv, stream, o.reps, o.warmup, l2);
  const Timing& t = m.timing;
  const bool kv_rows = c.Hkv == c.H;   // grouped heads: the device's dk / dv sum the group
  const GradErrors e = grad_errors(m.dq, m.dk, m.dv, reference.get(), c.S, c.D, {head}, rows, kv_rows);
  const double eq = e.dq, ek = e.dk, ev = e.dv;
  BenchResult r;
  r.ms = t.median_ms;
  r.tflops = tflops(flops, t.median_ms);
  r.rel_rmse = e.worst();
  r.ok = r.rel_rmse <= kMaxRelRmse;
  r.note = kv_rows ? fmt::format("dq {:.2e}, dk {:.2e}, dv {:.2e}", eq, ek, ev)
                   : fmt::format("dq {:.2e} (dk, dv: summed over the group, not checked)", eq);
  table[key_of(c)][kOurs] = r;
  fmt::print("  backward {:.4f} ms {:.1f} TFLOP/s (min {:.4f} max {:.4f}); vs float64 ({} rows of the last head): {} {}\n", r.ms,
             r.tflops, t.min_ms, t.max_ms, rows.size(), r.note, r.ok ? "PASS" : "FAIL");

  // FP8: the variant's FP8 forward from the same bf16 inputs (its LSE), then its FP8 backward (the
  // call quantizes q, k, v, dO itself), timed whole.
  kernels::AttentionFp8Options fwd8 = fwd;
  fwd8.quantize = true;
  kernels::AttentionFp8Workspace fws8;
  kernels::attention_fp8_forward(q, k, v, out, fwd8, fws8);
  kernels::AttentionBackwardOptions opt8 = opt;
  opt8.fp8 = true;
  kernels::AttentionBackwardWorkspace ws8;
  const MeasuredBackward m8 = measure_backward([&] { kernels::attention_backward(q, k, v, out, dout, lse, gq, gk, gv, opt8, ws8); },
                                               in.gq, in.gk, in.gv, stream, o.reps, o.warmup, l2);
  const GradErrors e8 = grad_errors(m8.dq, m8.dk, m8.dv, reference.get(), c.S, c.D, {head}, rows, kv_rows);
  BenchResult r8;
  r8.ms = m8.timing.median_ms;
  r8.tflops = tflops(flops, r8.ms);
  r8.rel_rmse = e8.worst();
  r8.ok = r8.rel_rmse <= kMaxRelRmseFp8;
  r8.note = kv_rows ? fmt::format("dq {:.2e}, dk {:.2e}, dv {:.2e}", e8.dq, e8.dk, e8.dv) : fmt::format("dq {:.2e}", e8.dq);
  table[key_of(c)][kOursFp8] = r8;
  fmt::print("  fp8 backward {:.4f} ms {:.1f} TFLOP/s; vs float64: {} {}\n", r8.ms, r8.tflops, r8.note, r8.ok ? "PASS" : "FAIL");
  return r.ok && r8.ok;
}

std::string backward_markdown(const std::vector<VariantCase>& cases, const VariantTable& table,
                              const std::vector<std::string>& header, const std::vector<std::string>& notes) {
  auto find = [&](const VariantCase& c, const char* impl) -> const BenchResult* {
    auto it = table.find(key_of(c));
    if (it == table.end()) return nullptr;
    auto jt = it->second.find(impl);
    return jt == it->second.end() || jt->second.ms <= 0 ? nullptr : &jt->second;
  };
  std::string md;
  md += "| variant | S | B×H (Hkv) | visible | tilejit bf16 backward TFLOP/s (ms) | flex_attention bf16 backward TFLOP/s (ms) | "
        "tilejit / flex | rRMSE tilejit (vs float64) | rRMSE flex (vs float32) | tilejit fp8 backward TFLOP/s (ms) | fp8 / flex | "
        "rRMSE fp8 (vs float64) |\n";
  md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |\n";
  int met = 0, measured = 0;
  std::vector<std::string> below;
  for (const auto& c : cases) {
    const BenchResult *ours = find(c, kOurs), *fl = find(c, kFlex), *f8 = find(c, kOursFp8);
    auto cell = [](const BenchResult* r) {
      return r ? fmt::format("{:.1f} ({:.3f}){}", r->tflops, r->ms, r->ok ? "" : " FAIL") : std::string("n/a");
    };
    const std::string visible =
        c.visible > 0 ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(c.visible) / static_cast<double>(c.B * c.H * c.S * c.S))
                      : "n/a";
    const std::string heads = c.Hkv == c.H ? fmt::format("{}×{}", c.B, c.H) : fmt::format("{}×{} ({})", c.B, c.H, c.Hkv);
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", c.label, c.S, heads, visible, cell(ours),
                      cell(fl), ratio_cell(ours, fl), ours ? ours->note : "n/a", rmse_cell(fl), cell(f8), ratio_cell(f8, fl),
                      f8 ? f8->note : "n/a");
    if (ours && fl) {
      ++measured;
      if (ours->tflops >= 2.0 * fl->tflops) ++met;
      else below.push_back(fmt::format("{} S={} {:.2f}×", c.name, c.S, ours->tflops / fl->tflops));
    }
  }
  md += fmt::format("\nTarget (issue 42): tilejit bf16 backward ≥ 2× flex_attention's backward: met in {} of {}{}\n", met, measured,
                    below.empty() ? "" : fmt::format(" (below: {})", fmt::join(below, ", ")));
  return markdown_document(header, md, notes);
}

}  // namespace

int bench_variants_backward(const BenchVariantsOptions& o) {
  std::vector<VariantCase> cases = variant_plan(o);
  check_out_path(o.out);
  if (!o.peers_script.empty()) find_peers_script(o.peers_script);
  if (!runtime::driver().available())
    throw Error(fmt::format("tilejit bench variants --backward times kernels on a CUDA GPU; none here ({})",
                            runtime::driver().unavailable_reason()));
  const auto& dev = runtime::current_device();
  std::vector<std::string> header = {fmt::format(
      "Attention variants' backward (dq, dk, dv from dO after the variant's forward with its LSE), TFLOP/s = 2.5 · 4·D·(visible "
      "score entries) / time; B·S = {}, H·D = {}; {} ({}, {} SMs, driver {}, NVRTC {})",
      kGridTokens, kGridWidth, dev.name, dev.arch(), dev.sm_count, dev.driver_version, runtime::nvrtc_version())};
  header.push_back(fmt::format(
      "tilejit: kernels::attention_backward with the variant's backward kernels (attention_variant_backward: dK / dV per key "
      "tile, dQ per query tile, the hooks traced into both; generic tensor-core lowering, default configs; causal masks launch "
      "with causal = true: the loops stop at the diagonal; each loop runs from the first to the last tile the mask keeps, "
      "knob mask_bounds: windows, prefix-LM, documents, segments; a block mask's tiles are all computed) after "
      "attention_fp8_forward of "
      "attention_variant(v) with its LSE; median of {} CUDA-event-timed calls after {} warm-ups, L2 flushed before each, random "
      "N(0,1) bf16 q, k, v, dO. rRMSE: dq's, dk's and dv's relative RMS error against float64 of the variant's meaning at {} rows "
      "of the last head; fails above {:.0e}. fp8: the variant's FP8 forward from the same inputs (its LSE), then attention_backward "
      "with fp8 (the variant's FP8 kernels; the call quantizes q, k, v, dO itself and is timed whole); fails above {:.2f}.",
      o.reps, o.warmup, kCheckRows, kMaxRelRmse, kMaxRelRmseFp8));
  std::vector<std::string> notes;
  VariantTable table;
  bool all_ok = true;
  {
    const int64_t n = kGridTokens * kGridWidth;   // every case's q numel
    Inputs in{random_normal(DType::bf16, {n}, o.seed), random_normal(DType::bf16, {n}, o.seed + 1),
              random_normal(DType::bf16, {n}, o.seed + 2), random_normal(DType::bf16, {n}, o.seed + 3),
              DeviceTensor(DType::bf16, {1}), DeviceTensor(DType::bf16, {1}), DeviceTensor(DType::bf16, {1}),
              DeviceTensor(DType::bf16, {1}), DeviceTensor(DType::bf16, {n}), DeviceTensor(DType::f32, {n / 64}),
              DeviceTensor(DType::bf16, {n}), DeviceTensor(DType::bf16, {n}), DeviceTensor(DType::bf16, {n})};
    in.dq = DeviceTensor::from_host(in.q);
    in.dk = DeviceTensor::from_host(in.k);
    in.dv = DeviceTensor::from_host(in.v);
    in.ddo = DeviceTensor::from_host(in.dout);
    const CUstream stream = nullptr;   // the legacy stream: the poisoning memsets are synchronous there
    L2Flusher l2;
    for (size_t i = 0; i < cases.size(); ++i) {
      VariantCase& c = cases[i];
      fmt::print("[{}/{}] {} S={} B×H={}×{}\n", i + 1, cases.size(), c.label, c.S, c.B, c.H);
      std::fflush(stdout);
      try {
        all_ok = bench_case(c, in, stream, l2, o, table) && all_ok;
      } catch (const std::exception& e) {
        all_ok = false;
        notes.push_back(fmt::format("tilejit {} S={}: {}", c.name, c.S, e.what()));
        fmt::print("  error: {}\n", e.what());
      }
    }
  }   // device memory freed before the peers start
  if (o.peers) {
    std::vector<std::string> args = peers_variant_args(cases);
    for (const std::string& a : {std::string("--backward"), std::string("--reps"), std::to_string(o.reps), std::string("--warmup"),
                                 std::to_string(o.warmup), std::string("--seed"), std::to_string(o.seed)})
      args.push_back(a);
    run_peers_script(o.python, o.peers_script, args, "PyTorch flex_attention's compiled backward",
                     [&](std::istream& is) { read_variant_peer_csv(is, cases, table, notes); }, notes);
  } else {
    notes.push_back("peers: not run (--no-peers)");
  }
  emit_markdown(backward_markdown(cases, table, header, notes), o.out);
  return all_ok ? 0 : 1;
}

}  // namespace tj::tools
