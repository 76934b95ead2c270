// `tilejit bench attention --backward`: the library's attention backward (kernels/attention_backward.h,
// DSL kernels on the generic tensor-core lowering; bf16 and FP8) after the forward that saves the LSE, over the
// benchmark's shape grid, its gradients checked against float64; then the peers (PyTorch SDPA's
// backward, flash and cuDNN, through bench/attention/peers.py --backward) in a subprocess; one
// markdown table.
//
// Method as `tilejit bench attention` (/work/.library/device/METHOD.md): warm-up calls, then the
// median of --reps calls each between two CUDA events, the L2 flushed before each; random N(0, 1)
// bf16 q, k, v and dO; the gradients poisoned (NaN) before the first call and checked after it.
#include <fmt/format.h>

#include <chrono>
#include <future>
#include <set>

#include "core/error.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_fp8.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "runtime/nvrtc.h"
#include "tools/attention.h"
#include "tools/attention_grads.h"

namespace tj::tools {

namespace {

// One head's dk / dv reference forms its whole S x S softmax (2 S^2 D multiply-adds): done where
// that fits this budget (S <= 4096 at D 128); dq's rows need only their own (3 S D each).
constexpr double kFullCheckFlops = 8e9;
constexpr int kCheckRows = 16;
// bf16 gradients of bf16 inputs (P and dS rounded to 16 bits), as `tilejit run attention --backward`;
// FP8: the recipe's own error is 5-8e-2 (docs/numerics.md).
constexpr double kMaxRelRmse = 3e-2, kMaxRelRmseFp8 = 1.2e-1;

const char* const kOurs = "tilejit_bf16_bwd";
const char* const kOursFp8 = "tilejit_fp8_bwd";

struct Inputs {
  HostTensor q, k, v, dout;                  // bf16 N(0, 1), flat: every grid shape views them (same numel)
  DeviceTensor dq_in, dk_in, dv_in, ddo;     // the same on the GPU
  DeviceTensor o, lse, gq, gk, gv;
};

// Times one shape's backward (fp8: the FP8 forward's LSE, then the FP8 backward with its quantizers)
// and checks its gradients; fills `row`.
bool bench_shape(const BenchShape& s, Inputs& in, CUstream stream, L2Flusher& l2, const BenchAttentionOptions& o, bool fp8,
                 BenchRow& row) {
  const std::vector<int64_t> shape{s.B, s.H, s.S, s.D};
  const double flops = 2.5 * attention_flops(s.B, s.H, s.S, s.D, s.causal);   // five matrix products to the forward's two
  auto view = [&](DeviceTensor& t) { return reshaped(t.view(), shape); };
  const TensorView q = view(in.dq_in), k = view(in.dk_in), v = view(in.dv_in), dout = view(in.ddo), out = view(in.o),
                   gq = view(in.gq), gk = view(in.gk), gv = view(in.gv), lse = reshaped(in.lse.view(), {s.B, s.H, s.S});

  // The reference on the last head, beside the GPU's work.
  const std::vector<int64_t> heads = {s.B * s.H - 1};
  std::vector<int64_t> rows;
  for (int i = 0; i < kCheckRows; ++i) rows.push_back(i * (s.S - 1) / (kCheckRows - 1));
  const bool full = 2.0 * s.S * s.S * s.D <= kFullCheckFlops;
  auto reference = std::async(std::launch::async, [&] {
    return attention_grads_f64(in.q, in.k, in.v, in.dout, s.S, s.D, s.causal, heads, rows, !full);
  });

  kernels::AttentionFp8Options fwd;
  fwd.quantize = fp8;
  fwd.causal = s.causal;
  fwd.lse = lse;
  fwd.stream = stream;
  kernels::AttentionFp8Workspace fws;
  kernels::attention_fp8_forward(q, k, v, out, fwd, fws);
  kernels::AttentionBackwardOptions opt;
  opt.causal = s.causal;
  opt.fp8 = fp8;
  opt.stream = stream;
  kernels::AttentionBackwardWorkspace ws;
  const MeasuredBackward m = measure_backward([&] { kernels::attention_backward(q, k, v, out, dout, lse, gq, gk, gv, opt, ws); },
                                              in.gq, in.gk, in.gv, stream, o.reps, o.warmup, l2);
  const Timing& t = m.timing;
  const GradErrors e = grad_errors(m.dq, m.dk, m.dv, reference.get(), s.S, s.D, heads, rows);
  const double eq = e.dq, ek = e.dk, ev = e.dv;
  BenchResult r;
  r.ms = t.median_ms;
  r.tflops = tflops(flops, t.median_ms);
  r.rel_rmse = e.worst();
  r.ok = r.rel_rmse <= (fp8 ? kMaxRelRmseFp8 : kMaxRelRmse);
  r.note = full ? fmt::format("dq {:.2e}, dk {:.2e}, dv {:.2e}", eq, ek, ev) : fmt::format("dq {:.2e} (dk, dv: S above the check's budget)", eq);
  row[fp8 ? kOursFp8 : kOurs] = r;
  fmt::print("  {} backward {:.4f} ms {:.1f} TFLOP/s (min {:.4f} max {:.4f}); vs float64 ({} rows of the last head): {} {}\n",
             fp8 ? "FP8" : "bf16", r.ms, r.tflops, t.min_ms, t.max_ms, rows.size(), r.note, r.ok ? "PASS" : "FAIL");
  return r.ok;
}

std::string backward_markdown(const std::vector<BenchShape>& shapes, const BenchTable& table, const std::vector<std::string>& header,
                              const std::vector<std::string>& notes) {
  auto find = [&](const BenchShape& s, const char* impl) { return bench_result(table, s, impl); };
  std::string md;
  md += "| D | S | B×H | causal | tilejit bf16 backward | tilejit FP8 backward | SDPA flash bf16 backward | SDPA cuDNN bf16 backward | "
        "tilejit / cuDNN | tilejit / flash | FP8 / tilejit bf16 | rRMSE tilejit (vs float64) | rRMSE tilejit FP8 (vs float64) | "
        "rRMSE cuDNN (vs float32) |\n";
  md += "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |\n";
  for (const auto& s : shapes) {
    const BenchResult *ours = find(s, kOurs), *f8 = find(s, kOursFp8), *fl = find(s, "sdpa_flash_bf16_bwd"),
                      *cu = find(s, "sdpa_cudnn_bf16_bwd");
    md += fmt::format("| {} | {} | {}×{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", s.D, s.S, s.B, s.H,
                      s.causal ? "yes" : "no", tflops_cell(ours), tflops_cell(f8), tflops_cell(fl), tflops_cell(cu),
                      ratio_cell(ours, cu), ratio_cell(ours, fl), ratio_cell(f8, ours), ours ? ours->note : "n/a",
                      f8 ? f8->note : "n/a", rmse_cell(cu));
  }
  return markdown_document(header, md, notes);
}

}  // namespace

int bench_attention_backward(const BenchAttentionOptions& o) {
  const std::vector<BenchShape> shapes = bench_shapes(o);
  check_out_path(o.out);
  if (!o.peers_script.empty()) find_peers_script(o.peers_script);
  if (!runtime::driver().available())
    throw Error(fmt::format("tilejit bench attention --backward times kernels on a CUDA GPU; none here ({})",
                            runtime::driver().unavailable_reason()));
  const auto& dev = runtime::current_device();
  std::vector<std::string> header = {fmt::format(
      "Attention backward (dq, dk, dv from dO, after the forward that saves the LSE), TFLOP/s = 2.5 · 4·B·H·S²·D / time "
      "(half for causal); B·S = {}, H·D = {}; {} ({}, {} SMs, driver {}, NVRTC {})",
      kGridTokens, kGridWidth, dev.name, dev.arch(), dev.sm_count, dev.driver_version, runtime::nvrtc_version())};
  std::vector<std::string> notes;
  BenchTable table;
  bool all_ok = true;
  fmt::print("{}\n{} shapes; {} timed calls each (median), {} warm-ups\n", header[0], shapes.size(), o.reps, o.warmup);
  {
    const int64_t n = kGridTokens * kGridWidth;   // every grid shape's numel
    const auto t0 = std::chrono::steady_clock::now();
    Inputs in{random_normal(DType::bf16, {n}, o.seed), random_normal(DType::bf16, {n}, o.seed + 1),
              random_normal(DType::bf16, {n}, o.seed + 2), random_normal(DType::bf16, {n}, o.seed + 3),
              DeviceTensor(DType::bf16, {1}), DeviceTensor(DType::bf16, {1}), DeviceTensor(DType::bf16, {1}),
              DeviceTensor(DType::bf16, {1}), DeviceTensor(DType::bf16, {n}), DeviceTensor(DType::f32, {n / 64}),
              DeviceTensor(DType::bf16, {n}), DeviceTensor(DType::bf16, {n}), DeviceTensor(DType::bf16, {n})};
    in.dq_in = DeviceTensor::from_host(in.q);
    in.dk_in = DeviceTensor::from_host(in.k);
    in.dv_in = DeviceTensor::from_host(in.v);
    in.ddo = DeviceTensor::from_host(in.dout);
    fmt::print("inputs ready in {:.1f} s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    const CUstream stream = nullptr;   // the legacy stream: the poisoning memsets are synchronous there
    L2Flusher l2;
    header.push_back(fmt::format(
        "tilejit: kernels::attention_backward (three DSL kernels: delta, dK / dV per key tile, dQ per query tile; generic "
        "tensor-core lowering, default configs) after kernels::attention_fp8_forward on the bf16 inputs with its LSE; FP8: the "
        "same call with fp8 (its quantizers of q, k, v, dO included: e4m3 per (b, h), dS e5m2) after the FP8 forward's LSE, "
        "checked against {:.0e}; median of "
        "{} CUDA-event-timed calls after {} warm-ups, L2 flushed ({} MiB memset) before each, random N(0,1) bf16 q, k, v, dO. "
        "rRMSE: the largest of dq's, dk's and dv's relative RMS error against float64 at {} rows of the last head (dk, dv "
        "where one head's S² D fits the check's budget: S <= 4096 at D 128), fails above {:.0e}.",
        kMaxRelRmseFp8, o.reps, o.warmup, l2.bytes() >> 20, kCheckRows, kMaxRelRmse));
    for (size_t i = 0; i < shapes.size(); ++i) {
      const BenchShape& s = shapes[i];
      fmt::print("[{}/{}] D={} S={} B×H={}×{} {}\n", i + 1, shapes.size(), s.D, s.S, s.B, s.H, s.causal ? "causal" : "non-causal");
      std::fflush(stdout);
      for (bool fp8 : {false, true}) try {
        all_ok = bench_shape(s, in, stream, l2, o, fp8, table[s]) && all_ok;
      } catch (const std::exception& e) {
        all_ok = false;
        table[s].erase(fp8 ? kOursFp8 : kOurs);
        notes.push_back(fmt::format("tilejit {} D={} S={} {}: {}", fp8 ? "FP8" : "bf16", s.D, s.S, s.causal ? "causal" : "non-causal",
                                    e.what()));
        fmt::print("  error: {}\n", e.what());
      }
    }
  }   // device memory freed before the peers start

  if (o.peers)
    run_peers_script(o.python, o.peers_script,
                     {"--backward", "--shapes", peers_shape_list(shapes), "--reps", std::to_string(o.reps), "--warmup",
                      std::to_string(o.warmup), "--seed", std::to_string(o.seed)},
                     "PyTorch SDPA bf16 backward (flash, cuDNN)", [&](std::istream& is) { read_peer_csv(is, table, notes); }, notes);
  else
    notes.push_back("peers: not run (--no-peers)");
  emit_markdown(backward_markdown(shapes, table, header, notes), o.out);
  return all_ok ? 0 : 1;
}

}  // namespace tj::tools
