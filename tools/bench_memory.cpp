// `tilejit bench memory`: memory-bound kernels at sizes past the L2 cache (softmax, RMSNorm,
// LayerNorm, the e4m3 quantizer with its per-head amax, the same writing the transpose, the
// quantizers of delayed scaling (one pass), an add),
// each next to a device-to-device copy of the same bytes and, through bench/memory/peers.py,
// PyTorch's eager and torch.compile versions of the same op on the same shapes, in one run.
//
// Method (/work/.library/device/METHOD.md): every kernel compiled before timing; the config a user
// gets (the tuning cache's for this GPU and shape, else the untuned one; the table says which);
// each output poisoned, run once and checked against float64 on sampled rows; then warm-up
// launches and the median of --reps launches between CUDA events, the L2 flushed before each.
// GB/s = the bytes a kernel must move (every input read once, every output written once) / time.
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "autotune/cache.h"
#include "autotune/launch.h"
#include "autotune/space.h"
#include "core/error.h"
#include "kernels/attention_fp8.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "runtime/jit.h"
#include "tools/attention.h"   // the bench plumbing: timing, peers' script, CSV, markdown

namespace tj::tools {

namespace {

// One row of the table: tilejit's run, the copy of the same bytes, the peers.
struct MemoryCase {
  std::string op;            // the peers' name too: softmax, rmsnorm, layernorm, quantize, quantize_t, add
  std::string shape;         // "16384x4096"
  double bytes = 0;          // moved by an ideal kernel
  BenchResult tilejit, copy;
  std::string config, config_source;
  std::string check;         // "max rel err 3.1e-03" or what failed
  std::map<std::string, BenchResult> peers;   // torch_eager, torch_compile
};

double gbps(double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0; }

// The config launch() would use for `k` on `args`: the tuning cache's, else the untuned one.
Config user_config(const Kernel& k, const std::vector<Arg>& args, std::string& source) {
  const std::vector<ArgSpec> specs = specs_for(k, args, false);
  if (std::optional<Config> c = autotune::tuned_config(k, specs, false)) {
    source = "tuned";
    return *c;
  }
  source = "untuned";
  return autotune::untuned_config(k.trace(specs), runtime::current_device().arch());
}

// Largest |got - want| / max(|want|, floor) over sampled rows of [rows, cols] outputs.
struct RowCheck {
  double worst = 0;
  int64_t nan = 0;
  void add(double got, double want, double floor) {
    if (!std::isfinite(got)) {
      ++nan;
      return;
    }
    worst = std::max(worst, std::abs(got - want) / std::max(std::abs(want), floor));
  }
  std::string str(double tol) const {
    return fmt::format("max rel err {:.1e}{}{}", worst, nan ? fmt::format(", {} NaN", nan) : "", ok(tol) ? "" : " (FAIL)");
  }
  bool ok(double tol) const { return nan == 0 && worst <= tol; }
};

// n indices spread evenly over [0, rows), the first and the last included.
std::vector<int64_t> evenly_spaced(int64_t rows, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < std::min(rows, n); ++i) out.push_back(i * (rows - 1) / std::max<int64_t>(1, std::min(rows, n) - 1));
  return out;
}

// float64 softmax / rmsnorm / layernorm of one row.
std::vector<double> row_f64(const std::string& op, const HostTensor& x, int64_t r, int64_t cols, const HostTensor& w,
                            const HostTensor& b) {
  std::vector<double> v(cols), out(cols);
  for (int64_t c = 0; c < cols; ++c) v[c] = x.at(r * cols + c);
  if (op == "softmax") {
    double mx = -INFINITY, l = 0;
    for (double a : v) mx = std::max(mx, a);
    for (double a : v) l += std::exp(a - mx);
    for (int64_t c = 0; c < cols; ++c) out[c] = std::exp(v[c] - mx) / l;
    return out;
  }
  double mean = 0, sq = 0;
  if (op == "layernorm") {
    for (double a : v) mean += a;
    mean /= cols;
  }
  for (double a : v) sq += (a - mean) * (a - mean);
  const double inv = 1.0 / std::sqrt(sq / cols + 1e-5);
  for (int64_t c = 0; c < cols; ++c) out[c] = (v[c] - mean) * inv * w.at(c) + (op == "layernorm" ? b.at(c) : 0.0);
  return out;
}

void run_peers(const BenchMemoryOptions& o, std::vector<MemoryCase>& cases, std::vector<std::string>& notes) {
  run_peers_script(
      o.python, o.peers_script,
      {"--rows", std::to_string(o.rows), "--cols", std::to_string(o.cols), "--reps", std::to_string(o.reps), "--warmup",
       std::to_string(o.warmup)},
      "PyTorch eager and torch.compile",
      [&](std::istream& in) {
        read_csv(in, {"op", "peer", "ms", "ok", "note"}, notes, [&](const CsvRecord& f) {
          for (MemoryCase& c : cases)
            if (c.op == f.at("op")) {
              BenchResult r;
              r.ms = std::stod(f.at("ms"));
              r.ok = f.at("ok") == "1";
              r.note = f.at("note");
              c.peers[f.at("peer")] = r;
            }
        });
      },
      notes, "bench/memory/peers.py");
}

std::string markdown(const std::vector<MemoryCase>& cases, const std::vector<std::string>& notes, const BenchMemoryOptions& o) {
  const auto& dev = runtime::current_device();
  std::string md = fmt::format(
      "Memory-bound kernels, GB/s = bytes an ideal kernel moves (inputs read once, outputs written once) / time; "
      "{} ({}, {} SMs); median of {} launches, L2 flushed before each; copy = cuMemcpyDtoD of the same bytes.\n\n",
      dev.name, dev.arch(), dev.sm_count, o.reps);
  md += "| op | shape | MB | copy GB/s | tilejit GB/s | % of copy | torch eager GB/s | torch.compile GB/s | tilejit / compile | "
        "check | tilejit config |\n";
  md += "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n";
  auto peer = [&](const MemoryCase& c, const char* name) -> std::string {
    auto it = c.peers.find(name);
    if (it == c.peers.end() || it->second.ms <= 0) return "n/a";
    return fmt::format("{:.0f}{}", gbps(c.bytes, it->second.ms), it->second.ok ? "" : " (FAIL)");
  };
  for (const MemoryCase& c : cases) {
    auto compiled = c.peers.find("torch_compile");
    const std::string ratio = compiled != c.peers.end() && compiled->second.ms > 0 && c.tilejit.ms > 0
                                  ? fmt::format("{:.2f}", compiled->second.ms / c.tilejit.ms)
                                  : "n/a";
    md += fmt::format("| {} | {} | {:.0f} | {:.0f} | {:.0f} | {:.0f}% | {} | {} | {} | {} | {} ({}) |\n", c.op, c.shape, c.bytes / 1e6,
                      gbps(c.bytes, c.copy.ms), gbps(c.bytes, c.tilejit.ms), 100.0 * c.copy.ms / c.tilejit.ms, peer(c, "torch_eager"),
                      peer(c, "torch_compile"), ratio, c.check, c.config, c.config_source);
  }
  for (const auto& n : notes) md += "\n- " + n;
  return md + "\n";
}

}  // namespace

int bench_memory(const BenchMemoryOptions& o) {
  if (o.rows <= 0 || o.cols <= 0) throw Error(fmt::format("--rows and --cols must be positive, got {} and {}", o.rows, o.cols));
  const int64_t R = o.rows, C = o.cols, n = R * C;
  // The quantizers' [B, H, S, D]: heads of S = 4096 rows of D = 128 over the same elements.
  constexpr int64_t S = 4096, D = 128;
  if (n % (S * D) != 0)
    throw Error(fmt::format("--rows x --cols = {} elements: the quantizer rows view them as heads of {} x {}; give a multiple of {}",
                            n, S, D, S * D));
  check_out_path(o.out);
  if (!runtime::driver().available())
    throw Error(fmt::format("tilejit bench memory needs a GPU ({})", runtime::driver().unavailable_reason()));
  const int64_t heads = n / (S * D);
  const DType bf16 = DType::bf16;

  fmt::print("preparing {:.0f} MB of random bf16 inputs ...\n", 2.0 * n * 2 / 1e6);
  std::fflush(stdout);
  const HostTensor hx = random_normal(bf16, {R, C}, o.seed), hy = random_normal(bf16, {n}, o.seed + 7777);
  const HostTensor hw = random_normal(bf16, {C}, o.seed + 1), hb = random_normal(bf16, {C}, o.seed + 2);
  DeviceTensor x = DeviceTensor::from_host(hx), y = DeviceTensor::from_host(hy), w = DeviceTensor::from_host(hw),
               b = DeviceTensor::from_host(hb);
  DeviceTensor out(bf16, {R, C}), q8(DType::e4m3, {heads, 1, S, D}), qt8(DType::e4m3, {heads, 1, D, S}),
      descale(DType::f32, {heads, 1});
  std::optional<DeviceTensor> partial;
  TensorView x4 = x.view(), xflat = x.view(), outflat = out.view();
  x4.shape = {heads, 1, S, D};
  x4.strides = {};
  xflat.shape = outflat.shape = {n};
  xflat.strides = outflat.strides = {};

  runtime::Stream stream;
  L2Flusher l2;
  std::vector<MemoryCase> cases;
  std::vector<std::string> notes;
  const std::string rc = fmt::format("{}x{}", R, C);
  const double eb = 2;   // bytes of a bf16

  // softmax / rmsnorm / layernorm / add: a library kernel with the config a user gets.
  auto library_case = [&](const std::string& op, const Kernel& k, std::vector<Arg> args, double bytes) {
    MemoryCase c;
    c.op = op;
    c.shape = op == "add" ? std::to_string(n) : rc;
    c.bytes = bytes;
    const Config cfg = user_config(k, args, c.config_source);
    c.config = config_brief(cfg);
    LaunchOptions lo;
    lo.config = cfg;
    lo.stream = stream;
    std::optional<HostTensor> got;
    c.tilejit = measure([&] { launch(k, args, lo); }, out, &got, 0, stream, o.reps, o.warmup, l2);
    RowCheck check;
    for (int64_t r : evenly_spaced(op == "add" ? 1 : R, 64)) {
      if (op == "add") {
        for (int64_t i = 0; i < n; i += 997) check.add(got->at(i), hx.at(i) + hy.at(i), 1.0);
        continue;
      }
      const std::vector<double> want = row_f64(op, hx, r, C, hw, hb);
      for (int64_t j = 0; j < C; ++j) check.add(got->at(r * C + j), want[j], op == "softmax" ? 1.0 / C : 1.0);
    }
    c.check = check.str(1.6e-2);
    cases.push_back(std::move(c));
  };
  library_case("softmax", kernels::softmax(), {x.view(), out.view()}, 2 * n * eb);
  library_case("rmsnorm", kernels::rmsnorm(), {x.view(), w.view(), out.view(), 1e-5}, 2 * n * eb + C * eb);
  library_case("layernorm", kernels::layernorm(), {x.view(), w.view(), b.view(), out.view(), 1e-5}, 2 * n * eb + 2 * C * eb);
  library_case("add", kernels::vector_add(), {xflat, y.view(), outflat}, 3 * n * eb);

  // Dequantized values against x on sampled heads: within e4m3's rounding (at most 2^-4 relative,
  // 0.07 with the scaling's f32 rounding) of values of 16 descales or more; the descale is amax /
  // 448 (every quantizer here scales by this x's amaxes).
  auto check_quantized = [&](const HostTensor& got, bool transpose) {
    const HostTensor ds = descale.to_host();
    RowCheck check;
    for (int64_t h : evenly_spaced(heads, 8)) {
      double amax = 0;
      for (int64_t i = h * S * D; i < (h + 1) * S * D; ++i) amax = std::max(amax, std::abs(hx.at(i)));
      check.add(ds.at(h), amax / 448.0, 1e-30);
      for (int64_t i = h * S * D; i < (h + 1) * S * D; i += 61) {
        const int64_t s = (i / D) % S, d = i % D;
        const double q = transpose ? got.at(h * D * S + d * S + s) : got.at(i);
        check.add(q * ds.at(h), hx.at(i), 16 * ds.at(h));
      }
    }
    return check;
  };

  // The e4m3 quantizer with its per-head amax (the attention pipeline's: kernels/attention_fp8.h),
  // writing y or its transpose.
  for (bool transpose : {false, true}) {
    MemoryCase c;
    c.op = transpose ? "quantize_t" : "quantize";
    c.shape = fmt::format("{}x1x{}x{}", heads, S, D);
    c.bytes = n * eb + n * 1.0 + heads * 4.0;
    c.config = fmt::format("chunk_amax {}; {}", config_brief(kernels::chunk_amax_config()),
                           config_brief(kernels::chunked_quantize_config(transpose)));
    c.config_source = "the pipeline's";
    DeviceTensor& y8 = transpose ? qt8 : q8;
    LaunchOptions lo;
    lo.stream = stream;
    std::optional<HostTensor> got;
    c.tilejit = measure([&] { kernels::quantize_fp8_per_head(x4, partial, y8.view(), descale.view(), transpose, lo); }, y8, &got, 0,
                        stream, o.reps, o.warmup, l2);
    c.check = check_quantized(*got, transpose).str(0.07);
    cases.push_back(std::move(c));
  }

  // Delayed scaling's quantizer (one pass: the descale from an earlier call's chunk amaxes, this
  // x's measured on the way), the earlier amaxes here those of this x: no value saturates.
  {
    LaunchOptions lo;
    lo.stream = stream;
    const TensorView prev = kernels::chunk_amaxes(x4, partial, lo);
    std::optional<DeviceTensor> next;
    for (bool transpose : {false, true}) {
      MemoryCase c;
      c.op = transpose ? "quantize_t_delayed" : "quantize_delayed";
      c.shape = fmt::format("{}x1x{}x{}", heads, S, D);
      c.bytes = n * eb + n * 1.0 + heads * 4.0;
      c.config = config_brief(kernels::chunked_quantize_config(transpose));
      c.config_source = "the pipeline's";
      DeviceTensor& y8 = transpose ? qt8 : q8;
      std::optional<HostTensor> got;
      c.tilejit = measure([&] { kernels::quantize_fp8_delayed(x4, prev, y8.view(), descale.view(), next, transpose, lo); }, y8, &got,
                          0, stream, o.reps, o.warmup, l2);
      c.check = check_quantized(*got, transpose).str(0.07);
      cases.push_back(std::move(c));
    }
  }

  // The copy of each case's bytes: half of them read, half written.
  {
    runtime::DeviceBuffer src(static_cast<size_t>(3 * n * eb / 2) + 256), dst(static_cast<size_t>(3 * n * eb / 2) + 256);
    for (MemoryCase& c : cases) {
      const size_t half = static_cast<size_t>(c.bytes / 2);
      const Timing t = time_launches([&] { dst.copy_from_async(src, half, stream); }, stream, o.reps, o.warmup, l2);
      c.copy.ms = t.median_ms;
    }
  }
  for (const MemoryCase& c : cases)
    fmt::print("{:<11} {:>14}  {:8.4f} ms  {:6.0f} GB/s  copy {:6.0f} GB/s  {}  [{} ({})]\n", c.op, c.shape, c.tilejit.ms,
               gbps(c.bytes, c.tilejit.ms), gbps(c.bytes, c.copy.ms), c.check, c.config, c.config_source);
  if (o.peers) run_peers(o, cases, notes);
  emit_markdown(markdown(cases, notes, o), o.out);
  for (const MemoryCase& c : cases)
    if (c.check.find("FAIL") != std::string::npos) return 1;
  return 0;
}

}  // namespace tj::tools
