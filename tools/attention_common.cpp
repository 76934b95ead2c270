// Shared pieces of `tilejit run attention` and `tilejit bench attention` (tools/attention.h).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <istream>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include "autotune/cache.h"
#include "dsl/kernel.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_variant.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "runtime/reference.h"
#include "core/error.h"
#include "core/numerics.h"
#include "tools/attention.h"
#include "tools/problem.h"

namespace tj::tools {

namespace {

bool is_tensor_core_head_dim(int64_t d) { return d == 64 || d == 128 || d == 256; }

std::string dims(const std::vector<int64_t>& v) { return fmt::format("{}", fmt::join(v, ", ")); }

}  // namespace

const std::vector<int64_t>& grid_seqs() {
  static const std::vector<int64_t> v = {1024, 2048, 4096, 8192, 16384};
  return v;
}
const std::vector<int64_t>& grid_head_dims() {
  static const std::vector<int64_t> v = {64, 128, 256};
  return v;
}

double attention_flops(int64_t B, int64_t H, int64_t S, int64_t D, bool causal) {
  return 4.0 * static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(S) * static_cast<double>(S) *
         static_cast<double>(D) * (causal ? 0.5 : 1.0);
}

double scale_log2(int64_t D) { return 1.4426950408889634 / std::sqrt(static_cast<double>(D)); }

TensorView reshaped(const TensorView& t, std::vector<int64_t> shape) {
  TensorView v = t;
  v.shape = std::move(shape);
  v.strides.clear();
  return v;
}

// ---- options -> problem -------------------------------------------------------------------

std::string describe(AttentionPath p) {
  switch (p) {
    case AttentionPath::library_simt: return "the SIMT library kernel `attention`";
    case AttentionPath::fp8_pipeline:
      return "the FP8 pipeline (quantize_fp8 + quantize_transpose_fp8 to e4m3 with per-(b, h) descales, then attention_fp8 "
             "on tensor cores)";
    case AttentionPath::tensor_core_16bit: return "attention_fp8 on the 16-bit inputs (tensor cores, no quantization)";
  }
  return "?";
}

bool runs_attention_pipeline(const ProblemOptions& o) { return o.kernel == "attention" && o.dtype != "f32"; }

ProblemOptions as_run_takes_it(const ProblemOptions& o, const char* doing) {
  ProblemOptions po = o;
  if (runs_attention_pipeline(po)) {
    po.kernel = "attention_fp8";
    fmt::print(stderr, "attention with {} inputs runs attention_fp8 on the tensor cores (tilejit run attention): {}\n",
               po.dtype, doing);
  }
  return po;
}

std::vector<int64_t> attention_shape(const ProblemOptions& o) {
  const bool parts = o.batch != 0 || o.heads != 0 || o.seq != 0 || o.head_dim != 0;
  if (!o.shape.empty() && parts)
    throw Error("--shape and --batch/--heads/--seq/--head-dim both give the shape: use one or the other");
  using Named = std::pair<int64_t, const char*>;
  for (auto [value, option] : std::initializer_list<Named>{{o.batch, "--batch"}, {o.heads, "--heads"}, {o.seq, "--seq"}, {o.head_dim, "--head-dim"}})
    if (value < 0) throw Error(fmt::format("{} must be positive, got {}", option, value));
  if (!o.shape.empty()) {
    std::vector<int64_t> s = parse_shape(o.shape);
    if (s.size() != 4)
      throw Error(fmt::format("attention takes --shape B,H,S,D (batch, heads, sequence length, head dim): 4 numbers, got {} ('{}')",
                              s.size(), o.shape));
    return s;
  }
  if (!parts) return {1, 2, 256, 64};
  // The grid: B·S = 16384 tokens, H·D = 2048 wide, unless given.
  const int64_t S = o.seq ? o.seq : 4096, D = o.head_dim ? o.head_dim : 128;
  const int64_t B = o.batch ? o.batch : std::max<int64_t>(1, kGridTokens / S);
  const int64_t H = o.heads ? o.heads : std::max<int64_t>(1, kGridWidth / D);
  return {B, H, S, D};
}

void run_on_cpu(const Kernel& k, const std::vector<Arg>& args, const std::optional<Config>& cfg) {
  ir::Function f = k.trace(specs_for(k, args, false));
  std::vector<ArgValue> values;
  for (size_t i = 0; i < args.size(); ++i) {
    if (k.slots()[i].is_host()) continue;
    if (const auto* t = std::get_if<TensorView>(&args[i])) values.emplace_back(*t);
    else values.emplace_back(static_cast<float>(std::get<double>(args[i])));
  }
  run_reference(f, cfg.value_or(default_config(f)), values);
}

AttentionProblem resolve_attention(const ProblemOptions& o) {
  AttentionProblem p;
  const std::string choices =
      "e4m3 (the FP8 pipeline: quantize + attention_fp8), bf16 or f16 (attention_fp8 on the 16-bit inputs; tensor cores on "
      "sm_90a), or f32 (the SIMT library kernel `attention`)";
  auto dt = dtype_from_name(o.dtype);
  if (!dt) throw Error(fmt::format("unknown --dtype '{}' for attention: use {}", o.dtype, choices));
  switch (*dt) {
    case DType::e4m3:
      p.path = AttentionPath::fp8_pipeline;
      p.in = DType::e4m3;
      p.source = DType::bf16;
      break;
    case DType::bf16:
    case DType::f16:
      p.path = AttentionPath::tensor_core_16bit;
      p.in = p.source = *dt;
      break;
    case DType::e5m2:
      throw Error("attention --dtype e5m2: the FP8 pipeline quantizes Q, K and V to e4m3 (FlashAttention-3's recipe; e5m2's "
                  "2-bit mantissa is for gradients); use --dtype e4m3");
    case DType::f32:
      throw Error("attention --dtype f32 runs the SIMT library kernel `attention` (`tilejit run attention --dtype f32`), "
                  "not the tensor-core path");
    default: throw Error(fmt::format("--dtype {} is not an attention input type: use {}", o.dtype, choices));
  }
  p.out = p.path == AttentionPath::fp8_pipeline ? DType::bf16 : p.in;
  if (!o.out_dtype.empty()) {
    auto od = dtype_from_name(o.out_dtype);
    if (!od || (*od != DType::bf16 && *od != DType::f16))
      throw Error(fmt::format("--out-dtype {}: `tilejit run attention` writes bf16 or f16 (an e4m3 output needs an o_scale: "
                              "`tilejit run attention_fp8 --out-dtype e4m3` runs the kernel alone)",
                              o.out_dtype));
    p.out = *od;
  }
  if (!o.arch.empty())
    throw Error(fmt::format("--arch does not apply to `tilejit run attention --dtype {}`: it runs on this machine's GPU "
                            "(`tilejit show attention_fp8 --dtype {} --arch {}` prints the code for an architecture)",
                            o.dtype, o.dtype, o.arch));
  std::vector<int64_t> s = attention_shape(o);
  p.B = s[0];
  p.H = s[1];
  p.S = s[2];
  p.D = s[3];
  if (!is_tensor_core_head_dim(p.D))
    throw Error(fmt::format("head dim {}: --dtype {} runs {}, whose sm_90a lowering takes head dims 64, 128 or 256; "
                            "--dtype f32 runs the SIMT library kernel `attention` for any head dim",
                            p.D, o.dtype, describe(p.path)));
  p.causal = o.causal;
  if ((o.hadamard || o.q_residual) && p.path != AttentionPath::fp8_pipeline)
    throw Error(fmt::format("--hadamard and --q-residual are recipes of the FP8 pipeline's quantization: use them with "
                            "--dtype e4m3, not {}",
                            o.dtype));
  if (o.q_residual && p.D > 128)
    throw Error(fmt::format("--q-residual doubles the QK head dim: head dim {} would be {}, above the 256 the tensor-core "
                            "attention takes",
                            p.D, 2 * p.D));
  if (o.delayed_scaling && (p.path != AttentionPath::fp8_pipeline || o.hadamard || o.q_residual))
    throw Error(fmt::format("--delayed-scaling scales the FP8 pipeline's plain recipe: use it with --dtype e4m3 and without "
                            "--hadamard / --q-residual (got --dtype {}{})",
                            o.dtype, o.hadamard || o.q_residual ? " and a recipe" : ""));
  p.hadamard = o.hadamard;
  p.q_residual = o.q_residual;
  p.delayed_scaling = o.delayed_scaling;
  if (o.backward && (o.hadamard || o.q_residual || o.delayed_scaling))
    throw Error("--backward takes the plain recipe: the FP8 backward has no --hadamard, --q-residual or --delayed-scaling");
  p.backward = o.backward;
  if (!o.config.empty()) {
    std::string source;   // --config's entries over the tuned or default config
    p.config = Config::from_json(o.config, attention_config(p.in, p.out, p.shape(), p.causal, source));
    // Blocks the kernel does not have are a typo: say so before anything runs.
    kernels::Problem lp{p.in, p.out, p.shape(), p.causal};
    check_config(kernels::attention_fp8().trace(kernels::find("attention_fp8").arguments(lp)), *p.config);
  }
  return p;
}

Config attention_config(DType in, DType out, const std::vector<int64_t>& shape, bool causal, std::string& source) {
  kernels::Problem lp{in, out, shape, causal};
  std::optional<Config> tuned;
  if (runtime::driver().available())
    tuned = autotune::tuned_config(kernels::attention_fp8(), kernels::find("attention_fp8").arguments(lp), false);
  source = tuned ? "tuned" : "default";
  return tuned ? *tuned : kernels::attention_variant_default_config("", in, shape.at(3), causal, 0, shape.at(2));
}

AttentionTolerance attention_tolerance(AttentionPath p) {
  // e4m3: rounding Q, K, V and P to 3 mantissa bits costs ~5.5e-2 relative RMSE on N(0, 1) in
  // a float64 emulation of the scheme (bench/attention/README.md); 16-bit: bf16 output rounding.
  if (p == AttentionPath::fp8_pipeline) return {6e-2, 0.998};
  return {1e-2, 0.9999};
}

// ---- inputs, reference, metrics ------------------------------------------------------------

HostTensor random_normal(DType dtype, std::vector<int64_t> shape, uint64_t seed) {
  HostTensor t(dtype, std::move(shape));
  // Fixed chunks with their own generator: the values do not depend on the number of cores.
  constexpr int64_t kChunk = 1 << 18;
  const int64_t n = t.numel(), chunks = (n + kChunk - 1) / kChunk;
  parallel_for(chunks, [&](int64_t c) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(c));
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) t.set(i, normal(rng));
  });
  return t;
}

RowSample sample_rows(int64_t BH, int64_t S, int64_t D, double flop_budget, bool all, int64_t max_heads) {
  RowSample s;
  auto spread = [](int64_t n, int64_t count) {
    std::vector<int64_t> v;
    if (count >= n) {
      for (int64_t i = 0; i < n; ++i) v.push_back(i);
      return v;
    }
    for (int64_t i = 0; i < count; ++i) {
      int64_t x = count == 1 ? 0 : i * (n - 1) / (count - 1);
      if (v.empty() || v.back() != x) v.push_back(x);
    }
    return v;
  };
  if (all) {
    s.heads = spread(BH, BH);
    s.rows = spread(S, S);
    return s;
  }
  s.heads = spread(BH, std::max<int64_t>(1, std::min(BH, max_heads)));
  const double per_row = 4.0 * static_cast<double>(S) * static_cast<double>(D);   // q·k and p·v, non-causal
  const double fit = flop_budget / (per_row * static_cast<double>(s.heads.size()));
  const int64_t rows = std::clamp<int64_t>(static_cast<int64_t>(fit), std::min<int64_t>(S, 16), S);
  s.rows = spread(S, rows);
  return s;
}

ScoreRule causal_rule() {
  return ScoreRule{[](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; }, {}};
}

std::vector<double> attention_f64_rows(const TensorView& q, const TensorView& k, const TensorView& v, const ScoreRule& rule,
                                       const RowSample& s) {
  if (q.rank() != 4 || k.rank() != 4 || v.shape != k.shape || k.shape[0] != q.shape[0] || k.shape[2] != q.shape[2] ||
      k.shape[3] != q.shape[3] || k.shape[1] < 1 || q.shape[1] % k.shape[1] != 0)
    throw Error(fmt::format("attention_f64_rows: q {} k {} v {} must be q [B, H, S, D] and k, v [B, Hkv, S, D] with Hkv "
                            "dividing H",
                            q.describe(), k.describe(), v.describe()));
  const int64_t H = q.shape[1], Hkv = k.shape[1], S = q.shape[2], D = q.shape[3];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int64_t R = static_cast<int64_t>(s.rows.size());
  std::vector<double> out(static_cast<size_t>(s.count() * D));
  for (size_t hi = 0; hi < s.heads.size(); ++hi) {
    const int64_t bh = s.heads[hi], b = bh / H, h = bh % H;
    const int64_t q_base = bh * S * D, kv_base = (b * Hkv + h / (H / Hkv)) * S * D;
    // This head's keys and values decoded once: every sampled row reads all of them.
    std::vector<double> kv(static_cast<size_t>(S * D)), vv(static_cast<size_t>(S * D));
    parallel_for(S, [&](int64_t j) {
      for (int64_t d = 0; d < D; ++d) {
        kv[j * D + d] = numerics::load_element(k.data, k.dtype, kv_base + j * D + d);
        vv[j * D + d] = numerics::load_element(v.data, v.dtype, kv_base + j * D + d);
      }
    });
    parallel_for(R, [&](int64_t ri) {
      const int64_t i = s.rows[ri];
      std::vector<double> qi(D), sc(S, -INFINITY);
      for (int64_t d = 0; d < D; ++d) qi[d] = numerics::load_element(q.data, q.dtype, q_base + i * D + d);
      double mx = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        if (rule.keep && !rule.keep(b, h, i, j)) continue;   // masked keys cost no dot product
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qi[d] * kv[j * D + d];
        sc[j] = rule.score ? rule.score(dot * scale, b, h, i, j) : dot * scale;
        mx = std::max(mx, sc[j]);
      }
      double* o = out.data() + (static_cast<int64_t>(hi) * R + ri) * D;
      if (mx == -INFINITY) {   // no key: the kernels write 0
        std::fill(o, o + D, 0.0);
        return;
      }
      double l = 0;
      std::vector<double> acc(D, 0.0);
      for (int64_t j = 0; j < S; ++j) {
        if (sc[j] == -INFINITY) continue;
        const double p = std::exp(sc[j] - mx);
        l += p;
        for (int64_t d = 0; d < D; ++d) acc[d] += p * vv[j * D + d];
      }
      for (int64_t d = 0; d < D; ++d) o[d] = acc[d] / l;
    });
  }
  return out;
}

std::vector<double> attention_f64_rows(const TensorView& q, const TensorView& k, const TensorView& v, bool causal,
                                       const RowSample& s) {
  if (q.rank() != 4 || k.shape != q.shape || v.shape != q.shape)
    throw Error(fmt::format("attention_f64_rows: q {} k {} v {} must be one [B, H, S, D]", q.describe(), k.describe(), v.describe()));
  return attention_f64_rows(q, k, v, causal ? causal_rule() : ScoreRule{}, s);
}

std::vector<double> gather_rows(const TensorView& o, const RowSample& s) {
  const int64_t S = o.shape[2], D = o.shape[3], R = static_cast<int64_t>(s.rows.size());
  std::vector<double> out(static_cast<size_t>(s.count() * D));
  for (size_t hi = 0; hi < s.heads.size(); ++hi)
    for (int64_t ri = 0; ri < R; ++ri)
      for (int64_t d = 0; d < D; ++d)
        out[(static_cast<int64_t>(hi) * R + ri) * D + d] =
            numerics::load_element(o.data, o.dtype, (s.heads[hi] * S + s.rows[ri]) * D + d);
  return out;
}

AttentionAccuracy check_output(const TensorView& got, const RowSample& s, const std::vector<double>& ref) {
  AttentionAccuracy a = compare_rows(gather_rows(got, s), ref);
  a.unwritten = count_nonfinite(got);
  return a;
}

bool AttentionAccuracy::passes(const AttentionTolerance& t) const {
  return compared > 0 && nan == 0 && unwritten == 0 && rel_rmse <= t.max_rel_rmse && cosine >= t.min_cosine;
}

std::string AttentionAccuracy::str() const {
  return fmt::format("rel RMSE {:.2e}, cosine {:.6f}, max abs error {:.2e} (largest value {:.3g}), NaN/inf {}, unwritten {}",
                     rel_rmse, cosine, max_abs_error, max_abs_reference, nan, unwritten);
}

AttentionAccuracy compare_rows(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) throw Error("compare_rows: sizes differ");
  AttentionAccuracy a;
  double se = 0, sr = 0, so = 0, sor = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ++a.compared;
    if (!std::isfinite(got[i])) {
      ++a.nan;
      continue;
    }
    const double e = got[i] - ref[i];
    se += e * e;
    sr += ref[i] * ref[i];
    so += got[i] * got[i];
    sor += got[i] * ref[i];
    a.max_abs_error = std::max(a.max_abs_error, std::fabs(e));
    a.max_abs_reference = std::max(a.max_abs_reference, std::fabs(ref[i]));
  }
  a.rel_rmse = sr > 0 ? std::sqrt(se / sr) : std::sqrt(se);
  a.cosine = so > 0 && sr > 0 ? sor / std::sqrt(so * sr) : (so == sr ? 1.0 : 0.0);
  return a;
}

int64_t count_nonfinite(const TensorView& t) {
  const int64_t n = t.numel();
  constexpr int64_t kChunk = 1 << 20;
  std::atomic<int64_t> bad{0};
  parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c) {
    int64_t local = 0;
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i)
      if (!std::isfinite(numerics::load_element(t.data, t.dtype, i))) ++local;
    bad += local;
  });
  return bad.load();
}

// ---- timing ---------------------------------------------------------------------------------

L2Flusher::L2Flusher() {
  const size_t l2 = static_cast<size_t>(std::max(0, runtime::current_device().l2_bytes));
  buffer_ = runtime::DeviceBuffer(std::max<size_t>(4 * l2, size_t{256} << 20));
}

void L2Flusher::flush(CUstream stream) { buffer_.memset_async(0, stream); }

Timing time_launches(const std::function<void()>& fn, CUstream stream, int reps, int warmup, L2Flusher& l2) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<runtime::Event> start, stop;
  start.reserve(reps);
  stop.reserve(reps);
  // Queue every rep, then wait once: the GPU never idles on the host between launches.
  for (int i = 0; i < reps; ++i) {
    l2.flush(stream);
    start.emplace_back().record(stream);
    fn();
    stop.emplace_back().record(stream);
  }
  std::vector<double> ms;
  if (!stop.empty()) stop.back().synchronize();
  for (int i = 0; i < reps; ++i) ms.push_back(runtime::Event::elapsed_ms(start[i], stop[i]));
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.reps = reps;
  if (!ms.empty()) {
    t.median_ms = ms[ms.size() / 2];
    t.min_ms = ms.front();
    t.max_ms = ms.back();
  }
  return t;
}

double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; }

// ---- bench: shapes, peers' CSV, table --------------------------------------------------------

bool BenchShape::operator<(const BenchShape& o) const {
  return std::tie(D, S, causal, B, H) < std::tie(o.D, o.S, o.causal, o.B, o.H);
}

std::vector<BenchShape> bench_shapes(const BenchAttentionOptions& o) {
  auto in = [](const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  if (o.seq != 0 && !in(grid_seqs(), o.seq))
    throw Error(fmt::format("--seq {} is not in the benchmark's grid ({}); `tilejit run attention --seq {}` runs any length",
                            o.seq, dims(grid_seqs()), o.seq));
  if (o.head_dim != 0 && !in(grid_head_dims(), o.head_dim))
    throw Error(fmt::format("--head-dim {} is not in the benchmark's grid ({}): the tensor-core lowering takes those",
                            o.head_dim, dims(grid_head_dims())));
  if (int(o.causal) + int(o.non_causal) + int(o.both) > 1)
    throw Error("--causal, --non-causal and --both each choose the mask mode: give at most one (default: both)");
  if (o.reps < 1) throw Error(fmt::format("--reps must be at least 1, got {}", o.reps));
  if (o.warmup < 0) throw Error(fmt::format("--warmup must be 0 or more, got {}", o.warmup));
  std::vector<int64_t> seqs = grid_seqs(), ds = grid_head_dims();
  if (o.quick) {
    seqs = {2048};
    ds = {128};
  }
  if (o.seq) seqs = {o.seq};
  if (o.head_dim) ds = {o.head_dim};
  std::vector<bool> masks;
  if (!o.causal) masks.push_back(false);
  if (!o.non_causal) masks.push_back(true);
  std::vector<BenchShape> out;
  for (int64_t D : ds)
    for (int64_t S : seqs)
      for (bool c : masks) out.push_back(BenchShape{kGridTokens / S, kGridWidth / D, S, D, c});
  return out;
}

std::string peers_shape_list(const std::vector<BenchShape>& shapes) {
  std::vector<std::string> parts;
  for (const auto& s : shapes) parts.push_back(fmt::format("{}x{}x{}", s.S, s.D, s.causal ? 1 : 0));
  return fmt::format("{}", fmt::join(parts, ","));
}

namespace {
std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string f;
  while (std::getline(ss, f, sep)) out.push_back(f);
  if (!line.empty() && line.back() == sep) out.emplace_back();
  return out;
}
std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ')) s.pop_back();
  size_t b = s.find_first_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b);
}
}  // namespace

void read_csv(std::istream& in, const std::vector<std::string>& required, std::vector<std::string>& notes,
              const std::function<void(const CsvRecord&)>& row) {
  std::string line;
  std::vector<std::string> columns;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty()) continue;
    if (line[0] == '#') {
      notes.push_back(trim(line.substr(1)));
      continue;
    }
    std::vector<std::string> f = split(line, ',');
    if (columns.empty()) {
      for (const auto& c : f) columns.push_back(trim(c));
      for (const auto& n : required)
        if (std::find(columns.begin(), columns.end(), n) == columns.end()) {
          notes.push_back(fmt::format("peers.py CSV: no '{}' column in its header '{}'; peer rows ignored", n, line));
          return;
        }
      continue;
    }
    // The last column (the note) may hold commas: it is everything after the other columns.
    if (f.size() < columns.size()) {
      notes.push_back(fmt::format("peers.py CSV: unreadable line '{}'", line));
      continue;
    }
    CsvRecord r;
    for (size_t i = 0; i + 1 < columns.size(); ++i) r[columns[i]] = trim(f[i]);
    std::vector<std::string> rest(f.begin() + static_cast<long>(columns.size() - 1), f.end());
    r[columns.back()] = trim(fmt::format("{}", fmt::join(rest, ",")));
    try {
      row(r);
    } catch (const std::exception&) {
      notes.push_back(fmt::format("peers.py CSV: unreadable line '{}'", line));
    }
  }
}

BenchResult peer_result(const CsvRecord& f) {
    BenchResult r;
    r.ms = std::stod(f.at("ms"));
    r.tflops = std::stod(f.at("tflops"));
    const std::string& rr = f.at("rrmse");
    r.rel_rmse = rr.empty() ? -1 : std::stod(rr);
    r.ok = f.at("ok") != "0";
    r.note = f.at("note");
  return r;
}

void read_peer_csv(std::istream& in, BenchTable& table, std::vector<std::string>& notes) {
  read_csv(in, {"S", "D", "B", "H", "causal", "peer", "ms", "tflops", "rrmse", "ok", "note"}, notes, [&](const CsvRecord& f) {
    BenchShape s{std::stoll(f.at("B")), std::stoll(f.at("H")), std::stoll(f.at("S")), std::stoll(f.at("D")), f.at("causal") == "1"};
    table[s][f.at("peer")] = peer_result(f);
  });
}

std::string tflops_cell(const BenchResult* r) {
  if (!r) return "n/a";
  return fmt::format("{:.1f}{}", r->tflops, r->ok ? "" : " (FAIL)");
}

std::string ratio_cell(const BenchResult* a, const BenchResult* b) {
  return a && b ? fmt::format("{:.2f}", a->tflops / b->tflops) : std::string("n/a");
}

std::string rmse_cell(const BenchResult* r) { return r && r->rel_rmse >= 0 ? fmt::format("{:.1e}", r->rel_rmse) : "n/a"; }

std::string markdown_document(const std::vector<std::string>& header, const std::string& table,
                              const std::vector<std::string>& notes) {
  std::string md;
  for (const auto& h : header) md += h + "\n";
  if (!header.empty()) md += "\n";
  md += table;
  if (!notes.empty()) {
    md += "\n";
    for (const auto& n : notes) md += "- " + n + "\n";
  }
  return md;
}

const BenchResult* bench_result(const BenchTable& table, const BenchShape& s, const std::string& impl) {
  auto it = table.find(s);
  if (it == table.end()) return nullptr;
  auto jt = it->second.find(impl);
  return jt == it->second.end() || jt->second.tflops <= 0 ? nullptr : &jt->second;
}

std::string bench_markdown(const std::vector<BenchShape>& shapes, const BenchTable& table, const std::vector<std::string>& header,
                           const std::vector<std::string>& notes) {
  auto find = [&](const BenchShape& s, const char* impl) { return bench_result(table, s, impl); };
  auto num = tflops_cell;
  auto ratio = ratio_cell;
  auto err = rmse_cell;
  std::string md;
  md += "| D | S | B×H | causal | tilejit fp8 | tilejit fp8 + quantize | tilejit bf16 | SDPA flash bf16 | SDPA cuDNN bf16 | "
        "Triton fp8 | fp8 / cuDNN bf16 | fp8 / Triton fp8 | bf16 / cuDNN bf16 | rRMSE tilejit fp8 | rRMSE Triton fp8 |\n";
  md += "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& s : shapes) {
    const BenchResult *fp8 = find(s, "tilejit_fp8"), *pipe = find(s, "tilejit_fp8_pipeline"), *bf = find(s, "tilejit_bf16"),
                      *fl = find(s, "sdpa_flash_bf16"), *cu = find(s, "sdpa_cudnn_bf16"), *tr = find(s, "triton_fp8");
    md += fmt::format("| {} | {} | {}×{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", s.D, s.S, s.B, s.H,
                      s.causal ? "yes" : "no", num(fp8), num(pipe), num(bf), num(fl), num(cu), num(tr), ratio(fp8, cu),
                      ratio(fp8, tr), ratio(bf, cu), err(pipe ? pipe : fp8), err(tr));
  }
  return markdown_document(header, md, notes);
}

}  // namespace tj::tools
