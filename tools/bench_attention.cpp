// `tilejit bench attention`: tilejit's FP8 attention (the kernel alone and the whole pipeline) and
// its bf16 twin over the shape grid, timed in this process; then the peers (PyTorch SDPA
// bf16 flash / cuDNN, a Triton FP8 flash attention) through bench/attention/peers.py in a
// subprocess; one markdown table with ratios and accuracy, as bench/RESULTS.md takes it.
//
// Method (/work/.library/device/METHOD.md, bench/attention/README.md): every kernel compiled
// before timing (in parallel), warm-up launches, then the median of --reps launches each between
// two CUDA events, the L2 cache flushed before each; random N(0, 1) inputs; each output poisoned
// and checked against float64 (sampled rows) before it is timed.
#include <fmt/format.h>

#include <chrono>
#include <future>
#include <set>

#include "kernels/attention_fp8.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/nvrtc.h"
#include "tools/attention.h"

namespace tj::tools {

namespace {

// float64 work per shape for the accuracy column (2 heads, evenly spaced rows; at least 16 rows).
constexpr double kAccuracyFlopBudget = 1e9;

// ---- compile everything first, on every core ----------------------------------------------

// The attention_fp8 specialization that the pipeline and the kernel-alone launch use (no LSE: a
// 1-element dummy, with_lse false).
// (Contiguous tensors: their unit strides compiled in, as the launches' specs_for has them.)
std::vector<ArgSpec> attention_specs(DType in, const BenchShape& s) {
  TensorSpec q = contiguous_spec(in, {s.B, s.H, s.S, s.D});
  TensorSpec v = is_fp8(in) ? contiguous_spec(in, {s.B, s.H, s.D, (s.S + 15) / 16 * 16}) : q;
  TensorSpec ds = contiguous_spec(DType::f32, {s.B, s.H});
  return {q, q, v, ds, ds, ds, contiguous_spec(DType::bf16, q.shape), contiguous_spec(DType::f32, {1}),
          RuntimeScalar{static_cast<float>(scale_log2(s.D))}, RuntimeScalar{1.0f}, s.causal, false};
}

void run_peers(const BenchAttentionOptions& o, const std::vector<BenchShape>& shapes, BenchTable& table,
               std::vector<std::string>& notes) {
  run_peers_script(o.python, o.peers_script,
                   {"--shapes", peers_shape_list(shapes), "--reps", std::to_string(o.reps), "--warmup", std::to_string(o.warmup),
                    "--seed", std::to_string(o.seed)},
                   "PyTorch SDPA bf16 flash / cuDNN, Triton fp8", [&](std::istream& in) { read_peer_csv(in, table, notes); },
                   notes);
}

// ---- tilejit's rows -------------------------------------------------------------------------

struct Inputs {
  HostTensor q, k, v;                   // bf16, N(0, 1), flat: every grid shape views them
  DeviceTensor dq, dk, dv, o, no_lse;   // no_lse: the kernel-alone launch's LSE dummy
};

// Times one shape's three tilejit implementations and checks their outputs; fills `row`.
bool bench_shape(const BenchShape& s, Inputs& in, CUstream stream, L2Flusher& l2, const BenchAttentionOptions& o,
                 BenchRow& row, std::set<std::string>& config_notes) {
  const std::vector<int64_t> shape{s.B, s.H, s.S, s.D};
  const double flops = attention_flops(s.B, s.H, s.S, s.D, s.causal);
  const TensorView q = reshaped(in.dq.view(), shape), k = reshaped(in.dk.view(), shape), v = reshaped(in.dv.view(), shape),
                   out = reshaped(in.o.view(), shape);
  RowSample sample = sample_rows(s.B * s.H, s.S, s.D, kAccuracyFlopBudget, false, 2);
  auto reference = std::async(std::launch::async, [&] {
    return attention_f64_rows(reshaped(in.q.view(), shape), reshaped(in.k.view(), shape), reshaped(in.v.view(), shape), s.causal,
                              sample);
  });

  // One implementation: poison the output, run once, keep the output for the check, then time.
  auto timed = [&](const std::function<void()>& fn, BenchResult& r, std::optional<HostTensor>* output) {
    r = measure(fn, in.o, output, flops, stream, o.reps, o.warmup, l2);
  };

  // FP8: the pipeline from bf16, then the attention kernel alone on what it quantized.
  std::string src8, src16;
  const Config c8 = attention_config(DType::e4m3, DType::bf16, shape, s.causal, src8);
  const Config c16 = attention_config(DType::bf16, DType::bf16, shape, s.causal, src16);
  config_notes.insert(fmt::format("D={} {} fp8: {} ({}), bf16: {} ({})", s.D, s.causal ? "causal" : "non-causal", config_brief(c8), src8,
                                  config_brief(c16), src16));
  kernels::AttentionFp8Workspace ws;
  kernels::AttentionFp8Options opt8;
  opt8.causal = s.causal;
  opt8.quantize = true;
  opt8.attention_config = c8;
  opt8.stream = stream;
  std::optional<HostTensor> got8, got16;
  BenchResult pipe, fp8, bf16;
  timed([&] { kernels::attention_fp8_forward(q, k, v, out, opt8, ws); }, pipe, &got8);
  LaunchOptions lo;
  lo.config = c8;
  lo.stream = stream;
  const std::vector<Arg> args = {ws.q8->view(), ws.k8->view(), ws.vt8->view(), ws.qd->view(), ws.kd->view(), ws.vd->view(),
                                 out,           in.no_lse.view(), scale_log2(s.D), 1.0,          s.causal,       false};
  timed([&] { launch(kernels::attention_fp8(), args, lo); }, fp8, nullptr);

  kernels::AttentionFp8Options opt16 = opt8;
  opt16.quantize = false;
  opt16.attention_config = c16;
  timed([&] { kernels::attention_fp8_forward(q, k, v, out, opt16, ws); }, bf16, &got16);

  const std::vector<double> ref = reference.get();
  auto check = [&](const HostTensor& got, AttentionPath path, BenchResult& r) {
    AttentionAccuracy a = check_output(reshaped(got.view(), shape), sample, ref);
    r.rel_rmse = a.rel_rmse;
    r.ok = a.passes(attention_tolerance(path));
    return a;
  };
  AttentionAccuracy a8 = check(*got8, AttentionPath::fp8_pipeline, pipe);
  AttentionAccuracy a16 = check(*got16, AttentionPath::tensor_core_16bit, bf16);
  fp8.rel_rmse = pipe.rel_rmse;   // the same kernel on the same e4m3 inputs
  fp8.ok = pipe.ok;
  row["tilejit_fp8"] = fp8;
  row["tilejit_fp8_pipeline"] = pipe;
  row["tilejit_bf16"] = bf16;
  fmt::print("  fp8 {:.4f} ms {:.1f} TFLOP/s | fp8 + quantize {:.4f} ms {:.1f} | bf16 {:.4f} ms {:.1f} | fp8 {} {}; bf16 rel RMSE "
             "{:.2e} {} ({} rows of {} heads)\n",
             fp8.ms, fp8.tflops, pipe.ms, pipe.tflops, bf16.ms, bf16.tflops, a8.str(), pipe.ok ? "PASS" : "FAIL", a16.rel_rmse,
             bf16.ok ? "PASS" : "FAIL", sample.rows.size(), sample.heads.size());
  return pipe.ok && bf16.ok;
}

}  // namespace

int bench_attention(const BenchAttentionOptions& o) {
  if (o.backward) return bench_attention_backward(o);
  const std::vector<BenchShape> shapes = bench_shapes(o);
  check_out_path(o.out);
  if (!o.peers_script.empty()) find_peers_script(o.peers_script);   // a wrong path fails now, not after the timing
  if (!runtime::driver().available())
    throw Error(fmt::format("tilejit bench attention times kernels on a CUDA GPU; none here ({})",
                            runtime::driver().unavailable_reason()));
  const auto& dev = runtime::current_device();
  if (!dev.supports_fp8())
    throw Error(fmt::format("tilejit bench attention needs FP8 (compute capability 8.9 or newer); {} is {}.{}", dev.name,
                            dev.cc_major, dev.cc_minor));

  std::vector<std::string> header = {
      fmt::format("Attention forward, TFLOP/s = 4·B·H·S²·D / time (half for causal); B·S = {}, H·D = {}; {} ({}, {} SMs, "
                  "driver {}, NVRTC {})",
                  kGridTokens, kGridWidth, dev.name, dev.arch(), dev.sm_count, dev.driver_version, runtime::nvrtc_version()),
  };
  std::vector<std::string> notes;
  BenchTable table;
  bool all_ok = true;
  fmt::print("{}\n{} shapes; {} timed launches each (median), {} warm-ups\n", header[0], shapes.size(), o.reps, o.warmup);
  if (!dev.supports_wgmma())
    notes.push_back(fmt::format("{} has no wgmma: attention_fp8 ran on the generic tensor-core lowering's mma.sync path (the hand-tuned Hopper kernel needs sm_90a)", dev.name));
  {
    int64_t n = 0;
    for (const auto& s : shapes) n = std::max(n, s.B * s.H * s.S * s.D);
    auto t0 = std::chrono::steady_clock::now();
    Inputs in{random_normal(DType::bf16, {n}, o.seed), random_normal(DType::bf16, {n}, o.seed + 1),
              random_normal(DType::bf16, {n}, o.seed + 2), DeviceTensor(DType::bf16, {1}), DeviceTensor(DType::bf16, {1}),
              DeviceTensor(DType::bf16, {1}), DeviceTensor(DType::bf16, {n}), DeviceTensor(DType::f32, {1})};
    in.dq = DeviceTensor::from_host(in.q);
    in.dk = DeviceTensor::from_host(in.k);
    in.dv = DeviceTensor::from_host(in.v);

    // Compile ahead: attention_fp8 (e4m3 and bf16) and the quantize pre-passes (with
    // attention_fp8_forward's config for them), per shape.
    std::vector<CompileJob> jobs;
    const Config amax_cfg = kernels::chunk_amax_config(), qcfg = kernels::chunked_quantize_config(false),
                 qtcfg = kernels::chunked_quantize_config(true);
    std::set<std::pair<int64_t, int64_t>> quantize_shapes;
    for (const auto& s : shapes) {
      std::string src;
      const std::vector<int64_t> shape{s.B, s.H, s.S, s.D};
      jobs.push_back({&kernels::attention_fp8(), attention_specs(DType::e4m3, s),
                      attention_config(DType::e4m3, DType::bf16, shape, s.causal, src)});
      jobs.push_back({&kernels::attention_fp8(), attention_specs(DType::bf16, s),
                      attention_config(DType::bf16, DType::bf16, shape, s.causal, src)});
      if (!quantize_shapes.insert({s.S, s.D}).second) continue;
      // What attention_fp8_forward's plain recipe launches: chunk amaxes, then the chunked quantizers.
      const TensorSpec x = contiguous_spec(DType::bf16, shape), descale = contiguous_spec(DType::f32, {s.B, s.H});
      const TensorSpec partial =
          contiguous_spec(DType::f32, {s.B, s.H, kernels::attention_fp8_quantize_chunks(s.B * s.H, s.S)});
      jobs.push_back({&kernels::chunk_amax(), {x, partial}, amax_cfg});
      jobs.push_back({&kernels::quantize_fp8_chunked(), {x, partial, contiguous_spec(DType::e4m3, shape), descale}, qcfg});
      jobs.push_back({&kernels::quantize_transpose_fp8_chunked(),
                      {x, partial, contiguous_spec(DType::e4m3, {s.B, s.H, s.D, (s.S + 15) / 16 * 16}), descale}, qtcfg});
    }
    const uint64_t compiles_before = nvrtc_compile_count();
    precompile(jobs, dev.arch());
    fmt::print("inputs and {} kernels ready in {:.1f} s ({} NVRTC compiles, the rest from the disk cache)\n", jobs.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               nvrtc_compile_count() - compiles_before);

    // The legacy default stream: DeviceTensor's poisoning and the pipeline's workspace zeroing are
    // synchronous memsets there, which a non-blocking stream's kernels would not wait for.
    const CUstream stream = nullptr;
    L2Flusher l2;
    header.push_back(fmt::format(
        "tilejit: median of {} CUDA-event-timed launches after {} warm-ups, L2 flushed ({} MiB memset) before each, random "
        "N(0,1) bf16 inputs. fp8 = attention_fp8 alone on the pre-quantized e4m3 inputs; fp8 + quantize = "
        "kernels::attention_fp8_forward from bf16 (per-(b, h) amax quantize pre-passes, then attention_fp8); bf16 = "
        "attention_fp8 on the bf16 inputs.",
        o.reps, o.warmup, l2.bytes() >> 20));
    header.push_back(fmt::format(
        "rRMSE: output vs float64 attention of the bf16 inputs on sampled rows of 2 heads (tilejit; fails above 6e-2 or "
        "below cosine 0.998 for fp8, above 1e-2 for bf16: marked FAIL) or vs float32 SDPA of the bf16 inputs on 2 heads (Triton)."));
    std::set<std::string> config_notes;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const BenchShape& s = shapes[i];
      fmt::print("[{}/{}] D={} S={} B×H={}×{} {}\n", i + 1, shapes.size(), s.D, s.S, s.B, s.H, s.causal ? "causal" : "non-causal");
      std::fflush(stdout);
      try {
        all_ok = bench_shape(s, in, stream, l2, o, table[s], config_notes) && all_ok;
      } catch (const std::exception& e) {
        all_ok = false;
        table.erase(s);
        notes.push_back(fmt::format("tilejit D={} S={} {}: {}", s.D, s.S, s.causal ? "causal" : "non-causal", e.what()));
        fmt::print("  error: {}\n", e.what());
      }
    }
    for (const auto& c : config_notes) notes.push_back("tilejit config " + c);
  }   // device memory freed before the peers start

  if (o.peers) run_peers(o, shapes, table, notes);
  else notes.push_back("peers: not run (--no-peers)");

  emit_markdown(bench_markdown(shapes, table, header, notes), o.out);
  return all_ok ? 0 : 1;
}

}  // namespace tj::tools
