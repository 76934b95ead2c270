// `tilejit run attention --dtype e4m3|bf16|f16` and `tilejit bench attention` (tools/attention.h):
// the errors a user sees for bad options (each message checked), the shape grid, the float64
// reference and metrics, the peers' CSV and the merged table; the run itself on a small shape
// (the CPU reference executor without a GPU, the GPU with one); and the program's wiring (the
// built `tilejit` run as a subprocess, when it is there).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>

#include "gpu.h"
#include "core/error.h"
#include "tools/attention.h"
#include "tools/attention_grads.h"

using namespace tj;
using namespace tj::tools;

namespace {

ProblemOptions attention_opts(const std::string& dtype) {
  ProblemOptions o;
  o.kernel = "attention";
  o.dtype = dtype;
  return o;
}

// The tilejit program's stdout + stderr and exit status, or nothing when the binary is absent
// (a test bundle carried to another machine).
struct CliResult {
  int status = -1;
  std::string output;
};
std::optional<CliResult> run_cli(const std::string& args) {
#ifdef TJ_CLI_EXE
  if (!std::filesystem::exists(TJ_CLI_EXE)) return std::nullopt;
  CliResult r;
  FILE* p = popen(fmt::format("'{}' {} 2>&1", TJ_CLI_EXE, args).c_str(), "r");
  if (!p) return std::nullopt;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
#else
  (void)args;
  return std::nullopt;
#endif
}

}  // namespace

TEST_CASE("cli attention: --dtype picks the path, f32 and other kernels keep the library kernel") {
  CHECK(runs_attention_pipeline(attention_opts("e4m3")));
  CHECK(runs_attention_pipeline(attention_opts("bf16")));
  CHECK(runs_attention_pipeline(attention_opts("f16")));
  CHECK(runs_attention_pipeline(attention_opts("nonsense")));   // gets the attention path's error
  CHECK_FALSE(runs_attention_pipeline(attention_opts("f32")));
  ProblemOptions other = attention_opts("e4m3");
  other.kernel = "attention_fp8";
  CHECK_FALSE(runs_attention_pipeline(other));

  AttentionProblem p = resolve_attention(attention_opts("e4m3"));
  CHECK(p.path == AttentionPath::fp8_pipeline);
  CHECK(p.in == DType::e4m3);
  CHECK(p.source == DType::bf16);
  CHECK(p.out == DType::bf16);
  CHECK(p.shape() == std::vector<int64_t>{1, 2, 256, 64});
  p = resolve_attention(attention_opts("f16"));
  CHECK(p.path == AttentionPath::tensor_core_16bit);
  CHECK(p.in == DType::f16);
  CHECK(p.out == DType::f16);
  ProblemOptions o = attention_opts("bf16");
  o.out_dtype = "f16";
  o.causal = true;
  p = resolve_attention(o);
  CHECK(p.out == DType::f16);
  CHECK(p.causal);
  CHECK(p.flops() == doctest::Approx(0.5 * 4.0 * 2 * 256.0 * 256 * 64));
  CHECK(attention_tolerance(AttentionPath::fp8_pipeline).max_rel_rmse == 6e-2);
  CHECK(attention_tolerance(AttentionPath::fp8_pipeline).min_cosine == 0.998);
  CHECK(attention_tolerance(AttentionPath::tensor_core_16bit).max_rel_rmse == 1e-2);
}

TEST_CASE("cli attention: the shape from --shape or --batch/--heads/--seq/--head-dim (the issue's grid)") {
  ProblemOptions o = attention_opts("e4m3");
  o.seq = 4096;
  CHECK(attention_shape(o) == std::vector<int64_t>{4, 16, 4096, 128});
  o.head_dim = 256;
  o.seq = 16384;
  CHECK(attention_shape(o) == std::vector<int64_t>{1, 8, 16384, 256});
  o = attention_opts("e4m3");
  o.head_dim = 64;
  CHECK(attention_shape(o) == std::vector<int64_t>{4, 32, 4096, 64});
  o.batch = 2;
  o.heads = 3;
  o.seq = 100;
  CHECK(attention_shape(o) == std::vector<int64_t>{2, 3, 100, 64});
  o = attention_opts("e4m3");
  o.seq = 32768;   // past the grid: one sequence
  CHECK(attention_shape(o)[0] == 1);
  o = attention_opts("e4m3");
  o.shape = "2,4,300,128";
  CHECK(attention_shape(o) == std::vector<int64_t>{2, 4, 300, 128});
}

TEST_CASE("cli attention: bad options give errors that name the option and the path") {
  auto error_of = [](const ProblemOptions& o) -> std::string {
    try {
      resolve_attention(o);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  ProblemOptions o = attention_opts("int7");
  CHECK(error_of(o) ==
        "unknown --dtype 'int7' for attention: use e4m3 (the FP8 pipeline: quantize + attention_fp8), bf16 or f16 "
        "(attention_fp8 on the 16-bit inputs; tensor cores on sm_90a), or f32 (the SIMT library kernel `attention`)");
  o = attention_opts("i32");
  CHECK(error_of(o).find("--dtype i32 is not an attention input type: use e4m3") == 0);
  o = attention_opts("e5m2");
  CHECK(error_of(o) ==
        "attention --dtype e5m2: the FP8 pipeline quantizes Q, K and V to e4m3 (FlashAttention-3's recipe; e5m2's 2-bit "
        "mantissa is for gradients); use --dtype e4m3");
  o = attention_opts("f32");
  CHECK(error_of(o).find("attention --dtype f32 runs the SIMT library kernel `attention`") == 0);
  o = attention_opts("bf16");
  o.hadamard = true;
  CHECK(error_of(o) == "--hadamard and --q-residual are recipes of the FP8 pipeline's quantization: use them with --dtype "
                       "e4m3, not bf16");
  o = attention_opts("bf16");
  o.delayed_scaling = true;
  CHECK(error_of(o) == "--delayed-scaling scales the FP8 pipeline's plain recipe: use it with --dtype e4m3 and without "
                       "--hadamard / --q-residual (got --dtype bf16)");
  o = attention_opts("e4m3");
  o.delayed_scaling = true;
  o.hadamard = true;
  CHECK(error_of(o).find("(got --dtype e4m3 and a recipe)") != std::string::npos);
  o = attention_opts("e4m3");
  o.q_residual = true;
  o.shape = "1,2,256,256";
  CHECK(error_of(o) == "--q-residual doubles the QK head dim: head dim 256 would be 512, above the 256 the tensor-core "
                       "attention takes");
  o.shape = "1,2,256,128";
  CHECK(resolve_attention(o).q_residual);

  o = attention_opts("e4m3");
  o.shape = "2,4,1024,96";
  CHECK(error_of(o) ==
        "head dim 96: --dtype e4m3 runs the FP8 pipeline (quantize_fp8 + quantize_transpose_fp8 to e4m3 with per-(b, h) "
        "descales, then attention_fp8 on tensor cores), whose sm_90a lowering takes head dims 64, 128 or 256; --dtype f32 "
        "runs the SIMT library kernel `attention` for any head dim");
  o = attention_opts("bf16");
  o.head_dim = 32;
  CHECK(error_of(o).find("head dim 32: --dtype bf16 runs attention_fp8 on the 16-bit inputs (tensor cores, no "
                         "quantization), whose sm_90a lowering takes head dims 64, 128 or 256") == 0);

  o = attention_opts("e4m3");
  o.shape = "2,4,1024";
  CHECK(error_of(o) == "attention takes --shape B,H,S,D (batch, heads, sequence length, head dim): 4 numbers, got 3 ('2,4,1024')");
  o.shape = "2,4,x,64";
  CHECK(error_of(o).find("bad --shape '2,4,x,64'") == 0);
  o = attention_opts("e4m3");
  o.shape = "1,2,256,64";
  o.seq = 512;
  CHECK(error_of(o) == "--shape and --batch/--heads/--seq/--head-dim both give the shape: use one or the other");
  o = attention_opts("e4m3");
  o.heads = -2;
  CHECK(error_of(o) == "--heads must be positive, got -2");
  o = attention_opts("e4m3");
  o.out_dtype = "f32";
  CHECK(error_of(o).find("--out-dtype f32: `tilejit run attention` writes bf16 or f16") == 0);
  o = attention_opts("e4m3");
  o.arch = "sm_80";
  CHECK(error_of(o).find("--arch does not apply to `tilejit run attention --dtype e4m3`: it runs on this machine's GPU") == 0);
  o = attention_opts("e4m3");
  o.config = R"({"blocks":{"q":64}})";
  CHECK(error_of(o).find("'q'") != std::string::npos);   // check_config names the block the kernel lacks
  o.config = "{not json";
  CHECK(error_of(o) != "(no error)");
}

TEST_CASE("cli attention: `tilejit run` with --seq on another kernel, and f32 attention from the grid options") {
  ProblemOptions o;
  o.kernel = "softmax";
  o.seq = 128;
  CHECK_THROWS_WITH_AS(run(o, CheckMode::never, 1),
                       "--batch/--heads/--seq/--head-dim apply to `tilejit run attention` only; give softmax a --shape", Error);
  CHECK_THROWS_WITH_AS(run_attention(attention_opts("e4m3"), CheckMode::never, 0), "--repeats must be at least 1, got 0", Error);
}

TEST_CASE("cli attention: the float64 reference on sampled rows, and the metrics") {
  // Sampling: every row when asked; else the first and last head and row, evenly between.
  RowSample all = sample_rows(3, 10, 64, 0, true);
  CHECK(all.heads == std::vector<int64_t>{0, 1, 2});
  CHECK(all.rows.size() == 10);
  RowSample s = sample_rows(64, 4096, 128, 0, false);
  CHECK(s.heads == std::vector<int64_t>{0, 21, 42, 63});
  CHECK(s.rows.size() == 16);   // the floor
  CHECK(s.rows.front() == 0);
  CHECK(s.rows.back() == 4095);
  RowSample two = sample_rows(64, 4096, 128, 1e12, false, 2);
  CHECK(two.heads == std::vector<int64_t>{0, 63});
  CHECK(two.rows.size() == 4096);

  // attention_f64_rows against a direct evaluation; causal row i sees keys 0..i.
  HostTensor q = random_normal(DType::bf16, {1, 2, 5, 64}, 1), k = random_normal(DType::bf16, {1, 2, 5, 64}, 2),
             v = random_normal(DType::bf16, {1, 2, 5, 64}, 3);
  RowSample rs;
  rs.heads = {1};
  rs.rows = {0, 3};
  std::vector<double> ref = attention_f64_rows(q.view(), k.view(), v.view(), true, rs);
  REQUIRE(ref.size() == 2 * 64);
  for (int64_t d = 0; d < 64; ++d) CHECK(ref[d] == doctest::Approx(v.at((5 + 0) * 64 + d)));   // row 0: only key 0
  {
    const int64_t i = 3, base = 5 * 64;   // head 1
    std::vector<double> w(i + 1);
    double mx = -INFINITY, l = 0;
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < 64; ++d) dot += q.at(base + i * 64 + d) * k.at(base + j * 64 + d);
      w[j] = dot / 8.0;
      mx = std::max(mx, w[j]);
    }
    for (auto& x : w) l += (x = std::exp(x - mx));
    for (int64_t d = 0; d < 64; ++d) {
      double o = 0;
      for (int64_t j = 0; j <= i; ++j) o += w[j] / l * v.at(base + j * 64 + d);
      CHECK(ref[64 + d] == doctest::Approx(o).epsilon(1e-12));
    }
  }
  // gather_rows picks the same elements.
  std::vector<double> g = gather_rows(v.view(), rs);
  CHECK(g[0] == v.at(5 * 64));
  CHECK(g[64] == v.at((5 + 3) * 64));

  AttentionAccuracy same = compare_rows(ref, ref);
  CHECK(same.rel_rmse == 0);
  CHECK(same.cosine == doctest::Approx(1.0));
  CHECK(same.passes(attention_tolerance(AttentionPath::tensor_core_16bit)));
  std::vector<double> off = ref;
  off[5] += 1.0;
  off[7] = NAN;
  AttentionAccuracy a = compare_rows(off, ref);
  CHECK(a.nan == 1);
  CHECK(a.max_abs_error == doctest::Approx(1.0));
  CHECK_FALSE(a.passes(attention_tolerance(AttentionPath::fp8_pipeline)));

  HostTensor poisoned(DType::bf16, {4, 4});
  poisoned.fill_bytes(0xFF);
  CHECK(count_nonfinite(poisoned.view()) == 16);
  poisoned.set(3, 1.0);
  CHECK(count_nonfinite(poisoned.view()) == 15);

  // random_normal: the same for the same seed, N(0, 1)-like.
  HostTensor r1 = random_normal(DType::bf16, {1 << 19}, 7), r2 = random_normal(DType::bf16, {1 << 19}, 7);
  CHECK(std::memcmp(r1.data(), r2.data(), r1.size_bytes()) == 0);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < r1.numel(); ++i) {
    sum += r1.at(i);
    sq += r1.at(i) * r1.at(i);
  }
  CHECK(std::fabs(sum / r1.numel()) < 0.01);
  CHECK(sq / r1.numel() == doctest::Approx(1.0).epsilon(0.02));
}

TEST_CASE("cli attention: run on a small shape passes its tolerance (the CPU reference executor without a GPU)") {
  // Without a GPU this runs quantize + attention_fp8 on the CPU reference executor; with one,
  // on the GPU (the sm_90a tensor-core path on Hopper). Either way every row is checked.
  for (const char* dtype : {"e4m3", "bf16"})
    for (bool causal : {false, true}) {
      ProblemOptions o = attention_opts(dtype);
      o.shape = "1,2,200,64";
      o.causal = causal;
      INFO(dtype << " causal=" << causal);
      CHECK(run_attention(o, CheckMode::always, 2) == 0);
    }
  ProblemOptions big = attention_opts("e4m3");
  big.seq = 16384;   // too much for the CPU executor: says so, runs nothing, exits kNothingRan
  if (!tj_test::gpu_available()) CHECK(run_attention(big, CheckMode::never, 1) == tj::tools::kNothingRan);
}

TEST_CASE("cli attention: run --backward on a small shape passes against float64 gradients, and its errors") {
  // Without a GPU: the forward and the backward's launches on the CPU reference executor; with one,
  // on the GPU (the backward's dots on the generic tensor-core lowering). Every row is checked.
  for (const char* dtype : {"bf16", "f16"})
    for (bool causal : {false, true}) {
      ProblemOptions o = attention_opts(dtype);
      o.shape = "1,2,136,64";
      o.causal = causal;
      o.backward = true;
      INFO(dtype << " causal=" << causal);
      CHECK(run_attention(o, CheckMode::always, 2) == 0);
    }
  ProblemOptions big = attention_opts("bf16");
  big.backward = true;
  big.seq = 4096;
  if (!tj_test::gpu_available()) CHECK(run_attention(big, CheckMode::never, 1) == tj::tools::kNothingRan);
  // e4m3: the FP8 forward and backward (the GPU quantizes: without one nothing runs).
  ProblemOptions fp8 = attention_opts("e4m3");
  fp8.backward = true;
  if (!tj_test::gpu_available()) CHECK(run_attention(fp8, CheckMode::always, 1) == tj::tools::kNothingRan);
  else
    for (bool causal : {false, true}) {
      fp8.causal = causal;
      CHECK(run_attention(fp8, CheckMode::always, 2) == 0);
    }
  fp8.hadamard = true;
  CHECK_THROWS_WITH_AS(run_attention(fp8, CheckMode::never, 1),
                       "--backward takes the plain recipe: the FP8 backward has no --hadamard, --q-residual or --delayed-scaling",
                       Error);
  ProblemOptions other;
  other.kernel = "softmax";
  other.backward = true;
  CHECK_THROWS_WITH_AS(run(other, CheckMode::never, 1),
                       "--backward applies to `tilejit run attention --dtype bf16|f16|e4m3` only (kernels/attention_backward.h), "
                       "not to softmax --dtype f32",
                       Error);
}

TEST_CASE("cli bench attention: the shape grid and its option errors") {
  BenchAttentionOptions o;
  std::vector<BenchShape> all = bench_shapes(o);
  CHECK(all.size() == 30);
  for (const auto& s : all) {
    CHECK(s.B * s.S == 16384);
    CHECK(s.H * s.D == 2048);
  }
  CHECK(all.front().D == 64);
  CHECK(all.front().S == 1024);
  CHECK_FALSE(all[0].causal);
  CHECK(all[1].causal);
  o.quick = true;
  std::vector<BenchShape> quick = bench_shapes(o);
  REQUIRE(quick.size() == 2);
  CHECK(quick[0].S == 2048);
  CHECK(quick[0].D == 128);
  CHECK(peers_shape_list(quick) == "2048x128x0,2048x128x1");
  o = BenchAttentionOptions{};
  o.head_dim = 256;
  o.causal = true;
  std::vector<BenchShape> c = bench_shapes(o);
  CHECK(c.size() == 5);
  for (const auto& s : c) CHECK((s.causal && s.D == 256 && s.H == 8));
  o = BenchAttentionOptions{};
  o.seq = 8192;
  o.non_causal = true;
  CHECK(bench_shapes(o).size() == 3);

  o = BenchAttentionOptions{};
  o.seq = 3000;
  CHECK_THROWS_WITH_AS(bench_shapes(o),
                       "--seq 3000 is not in the benchmark's grid (1024, 2048, 4096, 8192, 16384); `tilejit run attention "
                       "--seq 3000` runs any length",
                       Error);
  o = BenchAttentionOptions{};
  o.head_dim = 96;
  CHECK_THROWS_WITH_AS(bench_shapes(o),
                       "--head-dim 96 is not in the benchmark's grid (64, 128, 256): the tensor-core lowering takes those", Error);
  o = BenchAttentionOptions{};
  o.causal = o.non_causal = true;
  CHECK_THROWS_WITH_AS(bench_shapes(o),
                       "--causal, --non-causal and --both each choose the mask mode: give at most one (default: both)", Error);
  o = BenchAttentionOptions{};
  o.reps = 0;
  CHECK_THROWS_WITH_AS(bench_shapes(o), "--reps must be at least 1, got 0", Error);
  o = BenchAttentionOptions{};
  o.warmup = -1;
  CHECK_THROWS_WITH_AS(bench_shapes(o), "--warmup must be 0 or more, got -1", Error);
}

TEST_CASE("cli bench attention: peers' CSV and the merged markdown table") {
  std::istringstream csv(
      "S,D,B,H,causal,peer,ms,tflops,rrmse,ok,note\n"
      "# peers: torch 2.11.0, NVIDIA H200, cuDNN 91000, triton 3.6.0\n"
      "2048,128,8,16,0,sdpa_cudnn_bf16,0.500000,550.000,2.1000e-03,1,\n"
      "2048,128,8,16,0,triton_fp8,0.400000,687.500,5.2000e-02,1,BLOCK_N 128 warps 8 stages 3; own 2.1e-02, fine\n"
      "2048,128,8,16,1,sdpa_flash_bf16,0.300000,458.000,,1,\n"
      "this,is,not,a,row\n"
      "2048,128,8,16,1,triton_fp8,abc,1,1,1,\n");
  BenchTable table;
  std::vector<std::string> notes;
  read_peer_csv(csv, table, notes);
  const BenchShape nc{8, 16, 2048, 128, false}, ca{8, 16, 2048, 128, true};
  REQUIRE(table.count(nc));
  CHECK(table[nc]["sdpa_cudnn_bf16"].tflops == 550.0);
  CHECK(table[nc]["triton_fp8"].rel_rmse == doctest::Approx(5.2e-2));
  CHECK(table[nc]["triton_fp8"].note == "BLOCK_N 128 warps 8 stages 3; own 2.1e-02, fine");   // commas kept
  CHECK(table[ca]["sdpa_flash_bf16"].rel_rmse < 0);   // empty: not measured
  CHECK_FALSE(table[ca].count("triton_fp8"));
  REQUIRE(notes.size() == 3);
  CHECK(notes[0] == "peers: torch 2.11.0, NVIDIA H200, cuDNN 91000, triton 3.6.0");
  CHECK(notes[1].find("unreadable line 'this,is,not,a,row'") != std::string::npos);
  CHECK(notes[2].find("unreadable line") != std::string::npos);

  table[nc]["tilejit_fp8"] = BenchResult{0.25, 1100.0, 5.0e-2, true, ""};
  table[nc]["tilejit_fp8_pipeline"] = BenchResult{0.30, 916.7, 5.0e-2, true, ""};
  table[nc]["tilejit_bf16"] = BenchResult{0.45, 611.1, 3.0e-3, false, ""};
  std::string md = bench_markdown({nc, ca}, table, {"header line"}, {"a note"});
  CHECK(md.find("header line\n\n| D | S | B×H | causal | tilejit fp8 | tilejit fp8 + quantize | tilejit bf16 |") == 0);
  CHECK(md.find("| 128 | 2048 | 8×16 | no | 1100.0 | 916.7 | 611.1 (FAIL) | n/a | 550.0 | 687.5 | 2.00 | 1.60 | 1.11 | 5.0e-02 | "
                "5.2e-02 |") != std::string::npos);
  CHECK(md.find("| 128 | 2048 | 8×16 | yes | n/a | n/a | n/a | 458.0 | n/a | n/a | n/a | n/a | n/a | n/a | n/a |") !=
        std::string::npos);
  CHECK(md.find("\n- a note\n") != std::string::npos);

  // A CSV without the expected header is one note, not an error.
  std::istringstream bad("a,b,c\n1,2,3\n");
  BenchTable t2;
  std::vector<std::string> n2;
  read_peer_csv(bad, t2, n2);
  CHECK(t2.empty());
  REQUIRE(n2.size() == 1);
  CHECK(n2[0].find("no 'S' column") != std::string::npos);
}

TEST_CASE("cli bench attention: without a GPU it says so") {
  if (tj_test::gpu_available()) {
    MESSAGE("a GPU is here: the no-GPU message is not reachable");
    return;
  }
  BenchAttentionOptions o;
  o.quick = true;
  try {
    bench_attention(o);
    FAIL("bench_attention ran without a GPU");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("tilejit bench attention times kernels on a CUDA GPU; none here (") == 0);
  }
  o.out = "/nonexistent-dir/x.md";
  CHECK_THROWS_WITH_AS(bench_attention(o), "--out /nonexistent-dir/x.md: no directory '/nonexistent-dir'", Error);
  o.out.clear();
  o.peers_script = "/nonexistent/peers.py";
  CHECK_THROWS_WITH_AS(bench_attention(o), "--peers-script /nonexistent/peers.py: no such file", Error);
  o.peers_script.clear();
  o.backward = true;   // the backward's benchmark: the same checks first
  try {
    bench_attention(o);
    FAIL("bench_attention --backward ran without a GPU");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("tilejit bench attention --backward times kernels on a CUDA GPU; none here (") == 0);
  }
  o.seq = 3000;
  CHECK_THROWS_WITH_AS(bench_attention(o), doctest::Contains("--seq 3000 is not in the benchmark's grid"), Error);
}

TEST_CASE("cli attention: the float64 gradients' dq alone (long sequences) equals dq of the whole computation") {
  const int64_t B = 1, H = 2, S = 96, D = 32;
  const HostTensor q = random_normal(DType::bf16, {B, H, S, D}, 11), k = random_normal(DType::bf16, {B, H, S, D}, 12),
                   v = random_normal(DType::bf16, {B, H, S, D}, 13), dout = random_normal(DType::bf16, {B, H, S, D}, 14);
  const std::vector<int64_t> heads = {1}, rows = {0, 17, 95};
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const tj::tools::SampledGrads all = tj::tools::attention_grads_f64(q, k, v, dout, S, D, causal, heads, rows);
    const tj::tools::SampledGrads dq = tj::tools::attention_grads_f64(q, k, v, dout, S, D, causal, heads, rows, true);
    REQUIRE(all.dq.size() == rows.size() * D);
    CHECK(all.dk.size() == rows.size() * D);
    CHECK(dq.dk.empty());
    CHECK(dq.dv.empty());
    CHECK(dq.dq == all.dq);
    // dq of row 0 under the causal mask: only key 0 is seen, so the softmax is 1 and dS = 0.
    if (causal)
      for (int64_t x = 0; x < D; ++x) CHECK(all.dq[x] == 0.0);
    CHECK(tj::tools::relative_rmse(tj::tools::gather_rows(q, S, D, heads, rows), all.dq) > 0.5);   // not trivially equal
  }
}

TEST_CASE("cli: the tilejit program wires `run attention`, `tune attention`, `bench attention` and `bench variants` (subprocess)") {
  auto r = run_cli("bench attention --seq 3000");
  if (!r) {
    MESSAGE("the tilejit program is not where this build put it: skipped");
    return;
  }
  CHECK(r->status == 1);
  CHECK(r->output.find("tilejit: --seq 3000 is not in the benchmark's grid") != std::string::npos);
  r = run_cli("bench gemm");
  CHECK(r->output.find("tilejit: no benchmark named 'gemm' (benchmarks: attention, variants, inputs, memory)") != std::string::npos);
  // `bench memory` (tools/bench_memory.cpp) takes its own shape options, and no attention ones.
  r = run_cli("bench memory --causal");
  CHECK(r->status == 1);
  CHECK(r->output.find("tilejit: `tilejit bench memory` takes --rows, --cols, --reps") != std::string::npos);
  r = run_cli("bench memory --backward");
  CHECK(r->status == 1);
  CHECK(r->output.find("tilejit: --backward applies to `tilejit bench attention` and `tilejit bench variants` (their backward), not "
                       "to `tilejit bench memory`") != std::string::npos);
  r = run_cli("bench variants --backward --config-bf16 {}");
  CHECK(r->status == 1);
  CHECK(r->output.find("tilejit: --config-bf16 and --config-fp8 apply to the variants' forward, not to `tilejit bench variants "
                       "--backward`") != std::string::npos);
  r = run_cli("bench attention --rows 1024");
  CHECK(r->output.find("tilejit: --rows and --cols apply to `tilejit bench memory`") != std::string::npos);
  // `bench inputs` (tools/bench_inputs.cpp) checks its options before it looks for a GPU.
  r = run_cli("bench inputs --quick");
  CHECK(r->status == 1);
  CHECK(r->output.find("tilejit: `tilejit bench inputs` takes --seq, --head-dim, --causal / --non-causal") != std::string::npos);
  r = run_cli("bench inputs --head-dim 96");
  CHECK(r->output.find("tilejit bench inputs: --head-dim 96 (the tensor-core attention takes 64, 128 or 256)") !=
        std::string::npos);
  r = run_cli("bench inputs --seq 3000");
  CHECK(r->output.find("tilejit bench inputs: --seq 3000 must divide 16384") != std::string::npos);
  r = run_cli("bench memory --rows 1000 --cols 100 --no-peers");
  CHECK(r->status == 1);
  CHECK(r->output.find("--rows x --cols = 100000 elements: the quantizer rows view them as heads of 4096 x 128") !=
        std::string::npos);
  // `bench variants` (tests/test_cli_variants.cpp) shares the `bench` options; the mask flags and
  // --variant each belong to one of the two.
  r = run_cli("bench variants --variant causal,flash --no-peers");
  CHECK(r->status == 1);
  CHECK(r->output.find("tilejit: --variant flash: no such variant (variants: causal, sliding_window,") != std::string::npos);
  r = run_cli("bench variants --causal");
  CHECK(r->output.find("tilejit: --causal, --non-causal and --both choose the mask of `tilejit bench attention`") !=
        std::string::npos);
  r = run_cli("bench attention --variant alibi");
  CHECK(r->output.find("tilejit: --variant applies to `tilejit bench variants`") != std::string::npos);
  r = run_cli("bench variants --quick --seq 3000");
  CHECK(r->output.find("tilejit: --seq 3000 is not in the benchmark's grid") != std::string::npos);
  r = run_cli("bench attention --causal --non-causal");
  CHECK(r->output.find("give at most one") != std::string::npos);
  r = run_cli("bench attention --no-peers --peers-script /nonexistent/p.py --quick");
  CHECK(r->status == 1);
  CHECK(r->output.find("--peers-script /nonexistent/p.py: no such file") != std::string::npos);
  r = run_cli("run attention --dtype e5m2");
  CHECK(r->status == 1);
  CHECK(r->output.find("tilejit: attention --dtype e5m2: the FP8 pipeline quantizes") != std::string::npos);
  r = run_cli("run attention --dtype e4m3 --head-dim 80 --seq 1024");
  CHECK(r->output.find("tilejit: head dim 80: --dtype e4m3 runs the FP8 pipeline") != std::string::npos);
  r = run_cli("run softmax --seq 5");
  CHECK(r->output.find("apply to `tilejit run attention` only") != std::string::npos);
  // `tune attention` tunes the kernel `run attention` runs: attention_fp8 for e4m3 / bf16 / f16
  r = run_cli("tune attention --dtype e4m3 --shape 1,2,256,64 --effort none");
  CHECK(r->status == 0);
  CHECK(r->output.find("runs attention_fp8 on the tensor cores (tilejit run attention): tuning it") != std::string::npos);
  CHECK(r->output.find("kernel attention_fp8  shape [1, 2, 256, 64]") != std::string::npos);
  r = run_cli("tune attention --dtype f32 --shape 1,2,256,64 --effort none");
  CHECK(r->output.find("kernel attention  shape [1, 2, 256, 64]") != std::string::npos);
  if (!tj_test::gpu_available()) {
    r = run_cli("run attention --dtype e4m3 --shape 1,2,128,64 --causal");
    CHECK(r->status == 0);
    CHECK(r->output.find("path: the FP8 pipeline") != std::string::npos);
    CHECK(r->output.find(": PASS") != std::string::npos);
  }
}

TEST_CASE("cli: --version, an unknown command, and sizes that are not whole numbers above 0") {
  auto r = run_cli("--version");
  if (!r) {
    MESSAGE("the tilejit program is not where this build put it: skipped");
    return;
  }
  CHECK(r->status == 0);
  CHECK(r->output.rfind("tilejit 0.", 0) == 0);
  r = run_cli("frobnicate");
  CHECK(r->status == 2);
  CHECK(r->output.find("tilejit: unknown command 'frobnicate' (commands: export, doctor, demo, show, run, bench, tune; "
                       "tilejit --help)") != std::string::npos);
  for (const char* bad : {"--seq 0", "--heads -3", "--batch 2x", "--head-dim 0"}) {
    CAPTURE(std::string(bad));
    r = run_cli(fmt::format("run attention {}", bad));
    CHECK(r->status != 0);
    CHECK(r->output.find("must be a whole number above 0, got") != std::string::npos);
  }
}

TEST_CASE("cli: `run` refuses a misspelt knob before anything runs, GPU or not, naming the closest one") {
  auto r = run_cli(R"(run attention --config '{"knobs":{"attn_persistant":1}}')");
  if (!r) {
    MESSAGE("the tilejit program is not where this build put it: skipped");
    return;
  }
  CHECK(r->status != 0);
  CHECK(r->output.find("the config sets knob 'attn_persistant', which no lowering reads (did you mean 'attn_persistent'?)") !=
        std::string::npos);
  CHECK(r->output.find("CPU reference executor") == std::string::npos);   // nothing ran
}

TEST_CASE("cli: `run` says when nothing ran (exit 3), and refuses a shape host memory cannot hold") {
  auto r = run_cli("run attention --dtype bf16 --seq 1000000000");
  if (!r) {
    MESSAGE("the tilejit program is not where this build put it: skipped");
    return;
  }
  CHECK(r->status == 1);
  CHECK(r->output.find("tilejit: attention [1, 16, 1000000000, 128] needs 15258.8 GiB of host memory for its tensors; this "
                       "machine has") != std::string::npos);
  CHECK(r->output.find("bad_alloc") == std::string::npos);
  r = run_cli("run vector_add --shape 10000000000");
  CHECK(r->status == 1);
  CHECK(r->output.find("tilejit: vector_add [10000000000] needs 223.5 GiB of host memory for its tensors") != std::string::npos);
  if (tj_test::gpu_available()) {
    MESSAGE("a GPU is here: the no-GPU exit status is not reachable");
    return;
  }
  r = run_cli("run attention --dtype bf16 --seq 4096");
  CHECK(r->status == 3);
  CHECK(r->output.find("nothing ran") != std::string::npos);
  r = run_cli("run softmax --shape 64,1000 --no-check");
  CHECK(r->status == 3);
  CHECK(r->output.find("nothing ran") != std::string::npos);
  CHECK(r->output.find("largest magnitude") == std::string::npos);
  r = run_cli("run softmax --shape 64,1000");
  CHECK(r->status == 0);
  CHECK(r->output.find("ran the CPU reference executor only") != std::string::npos);
}

TEST_CASE("cli: `tune --help` does not offer --arch, which tune refuses with a reason") {
  auto r = run_cli("tune --help");
  if (!r) {
    MESSAGE("the tilejit program is not where this build put it: skipped");
    return;
  }
  CHECK(r->status == 0);
  CHECK(r->output.find("--arch") == std::string::npos);
  r = run_cli("tune attention --arch sm_80");
  CHECK(r->status == 1);
  CHECK(r->output.find("tilejit: tune runs on this machine's GPU; --arch does not apply") != std::string::npos);
}

TEST_CASE("cli: --config's entries go over the kernel's default config, not instead of it") {
  auto r = run_cli(R"(show gemm --dtype bf16 --shape 512,512,512 --arch sm_90a --config '{"num_stages":3}')");
  if (!r) {
    MESSAGE("the tilejit program is not where this build put it: skipped");
    return;
  }
  CHECK(r->status == 0);
  // The untuned blocks, warps and knob stay; the stages given change.
  CHECK(r->output.find(R"(config {"blocks":{"k":64,"m":128,"n":256},"knobs":{"cluster":2},"num_stages":3,"num_warps":4})") !=
        std::string::npos);
}

TEST_CASE("cli: `show attention` with 16-bit or fp8 inputs shows attention_fp8, the kernel run and tune take") {
  auto r = run_cli("show attention --dtype bf16 --shape 1,2,256,64 --arch sm_90a");
  if (!r) {
    MESSAGE("the tilejit program is not where this build put it: skipped");
    return;
  }
  CHECK(r->status == 0);
  CHECK(r->output.find("attention with bf16 inputs runs attention_fp8 on the tensor cores (tilejit run attention): showing it") !=
        std::string::npos);
  CHECK(r->output.find("// tilejit: kernel attention_fp8 for sm_90a") != std::string::npos);
  r = run_cli("show attention --dtype f32 --shape 1,2,256,64 --arch sm_90a");
  CHECK(r->output.find("// tilejit: kernel attention for sm_90a") != std::string::npos);
}
