// bench_dsl: times kernels written as user code (examples/kernels) on the GPU through the generic
// tensor-core lowering, next to the library's hand-tuned paths for the same problems where there
// is one, and writes one JSON line per measurement; bench/dsl/peers.py times torch on the same
// problems and merges both into one table (bench/dsl/run.sh).
//
//   bench_dsl [--out FILE.jsonl] [--cases NAME,...] [--only SUBSTRING] [--reps 20] [--warmup 3] [--quick]
//
// Case groups: gemm, batched, swiglu, attention, fp8, variants, backward (bench/dsl/backward.h).
//
// Method: inputs ~ N(0, 1) (attention: q, k, v; GEMMs: scaled by 1/sqrt(K) where the output
// feeds a nonlinearity), rounded to the input type; each sample is one launch between two CUDA
// events, after a 256 MB write that flushes the L2 cache, queued behind a spin kernel; the median
// of --reps samples. Accuracy: relative RMS error against float64 on the rounded inputs, at
// sampled output entries (GEMMs: 256 entries; attention: 4 whole query rows).
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "autotune/launch.h"
#include "codegen/lowering.h"
#include "bench/common/timing.h"
#include "core/error.h"
#include "examples/kernels/user_kernels.h"
#include "kernels/attention_variant.h"
#include "kernels/attention_variants.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"
#include "bench/dsl/backward.h"
#include "bench/dsl/bench_util.h"

using namespace tj;
using namespace tj::bench_dsl;

namespace {

// The window of the sliding-window case (examples::window_attention and the template's variant).
constexpr int64_t kWindow = 1024;

double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

// One problem: its kernel, arguments and configs, the flops, and a float64 check.
struct Case {
  std::string name;      // e.g. "gemm_bias_gelu_nk bf16 4096x4096x4096"
  std::string problem;   // the key peers.py matches: "gemm 4096 4096 4096", "attention 4 16 4096 128 causal", ...
  const Kernel* kernel = nullptr;
  std::vector<HostTensor> host;
  std::vector<DeviceTensor> dev;
  std::vector<Arg> tail;       // scalars and host values after the tensors
  size_t out = 0;
  double flops = 0;
  // (path, config JSON or "" for the library's default): "generic" is the user kernel through
  // the generic lowering; "template" a library fast path for the same problem, run by `fast`; a
  // path ending in "(sm_80)" is generated for sm_80 (mma.sync) and runs as PTX on this GPU.
  std::vector<std::pair<std::string, std::string>> paths;
};

Case gemm_case(bool kn, int64_t M, int64_t N, int64_t K, uint64_t seed) {
  Case c;
  c.name = fmt::format("gemm_bias_gelu_{} bf16 {}x{}x{}", kn ? "kn" : "nk", M, N, K);
  c.problem = fmt::format("gemm {} {} {} {}", kn ? "kn" : "nk", M, N, K);
  c.kernel = &examples::gemm_bias_gelu(kn);
  const double s = 1.0 / std::sqrt(static_cast<double>(K));
  c.host.push_back(random_tensor(DType::bf16, {M, K}, seed));
  c.host.push_back(random_tensor(DType::bf16, kn ? std::vector<int64_t>{K, N} : std::vector<int64_t>{N, K}, seed + 1, s));
  c.host.push_back(random_tensor(DType::f32, {N}, seed + 2));
  c.host.emplace_back(DType::bf16, std::vector<int64_t>{M, N});
  c.out = 3;
  c.flops = 2.0 * M * N * K;
  // "generic": the generic lowering's untuned config (4 stages, the result's stores transposed
  // across quads); then 3 stages with the stores staged in shared memory, and one block per program.
  c.paths = {{"generic", R"({"blocks":{"m":128,"n":256,"k":64},"num_warps":8,"num_stages":4,"knobs":{"lowering":0,"persistent":1,"raster_group":8}})"},
             {"generic 3 stages staged", R"({"blocks":{"m":128,"n":256,"k":64},"num_warps":8,"num_stages":3,"knobs":{"lowering":0,"persistent":1,"raster_group":8}})"},
             {"generic not persistent", R"({"blocks":{"m":128,"n":256,"k":64},"num_warps":8,"num_stages":4,"knobs":{"lowering":0}})"}};
  c.paths.push_back({"generic mma.sync (sm_80)", ""});
  if (!kn) c.paths.push_back({"template", ""});   // the GEMM pattern lowering takes this nest whole
  return c;
}

// v [B, H, S, D] transposed to [B, H, D, S] on the device.
DeviceTensor transposed_v(const HostTensor& v) {
  const auto& q = v.shape();
  const int64_t S = q[2], D = q[3];
  HostTensor vt(v.dtype(), {q[0], q[1], D, S});
  for (int64_t bh = 0; bh < q[0] * q[1]; ++bh)
    for (int64_t j = 0; j < S; ++j)
      for (int64_t d = 0; d < D; ++d) vt.set((bh * D + d) * S + j, v.at((bh * S + j) * D + d));
  return DeviceTensor::from_host(vt);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "bench_dsl.jsonl";
  std::set<std::string> only;
  int reps = 20, warmup = 3;
  bool quick = false;
  std::string name_has;   // --only: the cases whose name contains it (e.g. "1024x128 causal")
  // --also LABEL=JSON: one more generic path for every case, JSON over the untuned config.
  std::vector<std::pair<std::string, std::string>> also;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--out") out_path = next();
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--quick") quick = true;
    else if (a == "--only") name_has = next();
    else if (a == "--also") {
      const std::string v = next();
      const size_t eq = v.find('=');
      if (eq == std::string::npos || v.compare(eq + 1, 1, "{") != 0) {
        std::fprintf(stderr, "--also takes LABEL=JSON, the JSON an object merged over the untuned config (e.g. "
                             "'m64={\"blocks\":{\"m\":64}}'), got '%s'\n", v.c_str());
        return 2;
      }
      also.push_back({"generic " + v.substr(0, eq), "+" + v.substr(eq + 1)});
    }
    else if (a == "--cases") {
      std::string list = next();
      for (size_t p = 0; p <= list.size();) {
        size_t q = list.find(',', p);
        if (q == std::string::npos) q = list.size();
        only.insert(list.substr(p, q - p));
        p = q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: bench_dsl [--out FILE.jsonl] [--cases gemm,batched,swiglu,attention,fp8,variants,backward] [--reps N] "
                           "[--warmup N] [--quick] [--only SUBSTRING] [--also LABEL=JSON ...]\n");
      return 2;
    }
  }
  auto want = [&](const std::string& what) { return only.empty() || only.count(what); };
  try {
    const runtime::DeviceInfo& dev = runtime::current_device();
    std::printf("device: %s (%s), %d SMs\n", dev.name.c_str(), dev.arch().c_str(), dev.sm_count);
    std::ofstream jsonl(out_path);
    bench::Spinner spinner;
    spinner.init(dev.arch());
    runtime::Stream stream;
    runtime::DeviceBuffer flush(256u << 20);

    std::vector<Case> cases;
    const std::vector<int64_t> sizes = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 8192};
    uint64_t seed = 1;
    if (want("gemm"))
      for (int64_t n : sizes)
        for (bool kn : {false, true}) cases.push_back(gemm_case(kn, n, n, n, seed += 10));
    if (want("batched")) {
      Case c;
      const int64_t Z = 16, n = 2048;
      c.name = fmt::format("batched_gemm bf16 {}x{}x{}x{}", Z, n, n, n);
      c.problem = fmt::format("bmm {} {} {} {}", Z, n, n, n);
      c.kernel = &examples::batched_gemm();
      c.host = {random_tensor(DType::bf16, {Z, n, n}, seed += 10), random_tensor(DType::bf16, {Z, n, n}, seed + 1),
                HostTensor(DType::bf16, {Z, n, n})};
      c.out = 2;
      c.flops = 2.0 * Z * n * n * n;
      c.paths = {{"generic", ""}, {"generic persistent", R"({"blocks":{"m":128,"n":256,"k":64},"num_warps":8,"num_stages":4,"knobs":{"persistent":1,"raster_group":8}})"}};
      cases.push_back(std::move(c));
    }
    if (want("swiglu")) {
      Case c;
      const int64_t M = 8192, N = 8192, K = 4096;
      c.name = fmt::format("swiglu bf16 {}x{}x{}", M, N, K);
      c.problem = fmt::format("swiglu {} {} {}", M, N, K);
      c.kernel = &examples::swiglu();
      const double s = 1.0 / std::sqrt(static_cast<double>(K));
      c.host = {random_tensor(DType::bf16, {M, K}, seed += 10), random_tensor(DType::bf16, {N, K}, seed + 1, s),
                random_tensor(DType::bf16, {N, K}, seed + 2, s), HostTensor(DType::bf16, {M, N})};
      c.out = 3;
      c.flops = 4.0 * M * N * K;
      c.paths = {{"generic", ""},
                 {"generic", R"({"blocks":{"m":128,"n":128,"k":64},"num_warps":8,"num_stages":4})"},
                 {"generic persistent", R"({"blocks":{"m":128,"n":128,"k":64},"num_warps":8,"num_stages":4,"knobs":{"persistent":1,"raster_group":8}})"}};
      cases.push_back(std::move(c));
    }
    // The README attention on [B, H, S, D] inputs of type `in` (bf16 out), D 128, H 16, B S = 16k.
    auto readme_case = [&](DType in, int64_t S, bool causal, int64_t D = 128) {
      const int64_t H = 16, B = 16384 / S;
      const bool fp8 = in == DType::e4m3;
      Case c;
      c.name = fmt::format("readme_attention {} {}x{}x{}x{}{}", name(in), B, H, S, D, causal ? " causal" : "");
      c.problem = fmt::format("attention{} {} {} {} {}{}", fp8 ? "_e4m3" : "", B, H, S, D, causal ? " causal" : "");
      c.kernel = &examples::readme_attention();
      for (int i = 0; i < 3; ++i) c.host.push_back(random_tensor(in, {B, H, S, D}, seed += 10));
      c.host.emplace_back(DType::bf16, std::vector<int64_t>{B, H, S, D});
      c.out = 3;
      c.tail = {1.4426950408889634 / std::sqrt(static_cast<double>(D)), causal};
      c.flops = 4.0 * B * H * S * S * D * (causal ? 0.5 : 1.0);
      return c;
    };
    if (want("attention")) {
      const std::vector<int64_t> seqs = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{1024, 4096, 16384};
      for (int64_t S : seqs)
        for (bool causal : {false, true}) {
          Case c = readme_case(DType::bf16, S, causal);
          c.paths = {{"generic", ""},
                     {"generic", R"({"blocks":{"m":128,"n":64},"num_warps":8,"num_stages":3})"},
                     {"generic persistent", R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2,"knobs":{"persistent":1}})"},
                     {"generic mma.sync (sm_80)", ""},
                     {"template", ""}};
          cases.push_back(std::move(c));
        }
      // Head dims 64 and 256 (the issue's bar covers D 64 / 128 / 256).
      if (!quick)
        for (int64_t D : {int64_t{64}, int64_t{256}})
          for (bool causal : {false, true}) {
            Case c = readme_case(DType::bf16, 4096, causal, D);
            c.paths = {{"generic", ""}, {"template", ""}};
            cases.push_back(std::move(c));
          }
    }

    if (want("fp8")) {
      // The README attention on e4m3 q, k, v (bf16 out): the generic lowering's fp8 path (V through
      // TMA, copied K-major by the producer warpgroup; P as e4m3 register fragments) beside
      // attention_fp8's fp8 path on the same inputs (descales of 1).
      const std::vector<int64_t> seqs = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 16384};
      for (int64_t S : seqs)
        for (bool causal : {false, true}) {
          Case c = readme_case(DType::e4m3, S, causal);
          c.paths = {{"generic", ""}, {"generic vt", ""}, {"template", ""}};
          // One tile warpgroup of 64 rows a block, two blocks an SM (knob simt_min_blocks): faster
          // than the untuned schedule without a mask (H200, bench/RESULTS.md), slower with one.
          if (!causal)
            c.paths.push_back({"generic vt two blocks",
                               R"(+{"blocks":{"m":64,"n":128},"num_warps":4,"num_stages":2,"knobs":{"simt_min_blocks":2,"persistent":0}})"});
          cases.push_back(std::move(c));
        }
    }

    if (want("variants")) {
      // Attention variants as user code; the template runs attention_fp8 on inputs padded to its
      // head dims (same useful FLOPs counted for both).
      const int64_t B = 4, H = 16, S = 4096;
      {
        Case c;
        const int64_t D = 96;
        c.name = fmt::format("readme_attention bf16 {}x{}x{}x{}", B, H, S, D);
        c.problem = fmt::format("attention {} {} {} {}", B, H, S, D);
        c.kernel = &examples::readme_attention();
        for (int i = 0; i < 3; ++i) c.host.push_back(random_tensor(DType::bf16, {B, H, S, D}, seed += 10));
        c.host.emplace_back(DType::bf16, std::vector<int64_t>{B, H, S, D});
        c.out = 3;
        c.tail = {1.4426950408889634 / std::sqrt(static_cast<double>(D)), false};
        c.flops = 4.0 * B * H * S * S * D;
        c.paths = {{"generic", ""}, {"template", ""}};
        cases.push_back(std::move(c));
      }
      {
        Case c;
        const int64_t D = 128;
        c.name = fmt::format("sink_attention bf16 {}x{}x{}x{}", B, H, S, D);
        c.problem = fmt::format("sink {} {} {} {}", B, H, S, D);
        c.kernel = &examples::sink_attention();
        for (int i = 0; i < 3; ++i) c.host.push_back(random_tensor(DType::bf16, {B, H, S, D}, seed += 10));
        c.host.push_back(random_tensor(DType::f32, {H}, seed += 10, 2.0));
        c.host.emplace_back(DType::bf16, std::vector<int64_t>{B, H, S, D});
        c.out = 4;
        c.tail = {1.4426950408889634 / std::sqrt(static_cast<double>(D))};
        c.flops = 4.0 * B * H * S * S * D;
        c.paths = {{"generic", ""}, {"template", ""}};
        cases.push_back(std::move(c));
      }
      {
        // A sliding window written as user code (examples::window_attention: its key loop from 0,
        // bounded by the compiler to the window's tiles, knob mask_bounds) against the same loop
        // unbounded and the library's sliding_window_variant through the attention template.
        Case c;
        const int64_t D = 128, W = kWindow;
        c.name = fmt::format("window_attention bf16 {}x{}x{}x{} w{}", B, H, S, D, W);
        c.problem = fmt::format("window {} {} {} {} {}", B, H, S, D, W);
        c.kernel = &examples::window_attention();
        for (int i = 0; i < 3; ++i) c.host.push_back(random_tensor(DType::bf16, {B, H, S, D}, seed += 10));
        c.host.emplace_back(DType::bf16, std::vector<int64_t>{B, H, S, D});
        c.out = 3;
        c.tail = {1.4426950408889634 / std::sqrt(static_cast<double>(D)), W};
        // Useful FLOPs: row i sees min(i + 1, W) keys.
        c.flops = 4.0 * B * H * D * static_cast<double>(W * S - W * (W - 1) / 2);
        c.paths = {{"generic", ""}, {"generic unbounded", R"(+{"knobs":{"mask_bounds":0}})"}, {"template", ""}};
        cases.push_back(std::move(c));
      }
      {
        Case c;
        const int64_t Dqk = 192, Dv = 128;
        c.name = fmt::format("mla_attention bf16 {}x{}x{}x{}/{}", B, H, S, Dqk, Dv);
        c.problem = fmt::format("mla {} {} {} {} {}", B, H, S, Dqk, Dv);
        c.kernel = &examples::mla_attention();
        c.host.push_back(random_tensor(DType::bf16, {B, H, S, Dqk}, seed += 10));
        c.host.push_back(random_tensor(DType::bf16, {B, H, S, Dqk}, seed += 10));
        c.host.push_back(random_tensor(DType::bf16, {B, H, S, Dv}, seed += 10));
        c.host.emplace_back(DType::bf16, std::vector<int64_t>{B, H, S, Dv});
        c.out = 3;
        c.tail = {1.4426950408889634 / std::sqrt(static_cast<double>(Dqk))};
        c.flops = 2.0 * B * H * S * S * (Dqk + Dv);
        c.paths = {{"generic", ""}, {"template", ""}};
        cases.push_back(std::move(c));
      }
    }

    std::printf("%-44s %-26s %9s %9s %10s  %s\n", "case", "path", "ms", "TFLOP/s", "rel err", "config");
    for (Case& c : cases) {
      if (!name_has.empty() && c.name.find(name_has) == std::string::npos) continue;
      c.paths.insert(c.paths.end(), also.begin(), also.end());
      for (auto& h : c.host) c.dev.push_back(DeviceTensor::from_host(h));
      const std::vector<Arg> args = args_of(c.dev, c.tail);
      for (const auto& [path, json] : c.paths) try {
        std::vector<Arg> run_args = args;
        const Kernel* k = c.kernel;
        std::optional<Config> config;
        if (!json.empty() && json[0] != '+') config = Config::from_json(json);
        std::vector<DeviceTensor> fast_dev;
        const bool template_path = path == "template";
        bool checked = true;   // the output is the problem's (not a padded or different one)
        if (path.rfind("generic vt", 0) == 0) {
          k = &examples::readme_attention_vt();
          fast_dev.push_back(transposed_v(c.host[2]));
          run_args[2] = fast_dev.back().view();
        }
        if (template_path) {
          // The library's fast path for the same problem and inputs.
          const bool window = c.problem.rfind("window", 0) == 0;
          const bool attention_like = c.problem.rfind("attention", 0) == 0 || c.problem.rfind("sink", 0) == 0 ||
                                      c.problem.rfind("mla", 0) == 0 || window;
          const int64_t dqk = c.host[0].shape()[3], dv = c.host[2].shape()[3];
          const int64_t dpad = std::max(dqk, dv) <= 64 ? 64 : std::max(dqk, dv) <= 128 ? 128 : 256;
          if (attention_like && (dqk != dpad || dv != dpad)) {
            // attention_fp8 takes one head dim of 64, 128 or 256: the inputs padded with zeros.
            k = &kernels::attention_fp8();
            const auto& q = c.host[0].shape();
            std::vector<int64_t> ps = {q[0], q[1], q[2], dpad};
            for (int t = 0; t < 3; ++t) {
              HostTensor h(DType::bf16, ps);
              const int64_t d = c.host[t].shape()[3];
              for (int64_t r = 0; r < q[0] * q[1] * q[2]; ++r)
                for (int64_t x = 0; x < dpad; ++x) h.set(r * dpad + x, x < d ? c.host[t].at(r * d + x) : 0.0);
              fast_dev.push_back(DeviceTensor::from_host(h));
            }
            fast_dev.emplace_back(DType::bf16, ps);
            HostTensor hd = HostTensor::from_values(std::vector<double>(q[0] * q[1], 1.0), DType::f32, {q[0], q[1]});
            fast_dev.push_back(DeviceTensor::from_host(hd));
            fast_dev.emplace_back(DType::f32, std::vector<int64_t>{q[0], q[1], q[2]});
            run_args = {fast_dev[0].view(), fast_dev[1].view(), fast_dev[2].view(), fast_dev[4].view(), fast_dev[4].view(),
                        fast_dev[4].view(), fast_dev[3].view(), fast_dev[5].view(), std::get<double>(c.tail[0]), 1.0,
                        false, false};
            checked = false;
          } else if (attention_like) {
            k = &kernels::attention_fp8();
            const auto& q = c.host[0].shape();
            fast_dev.emplace_back(DType::f32, std::vector<int64_t>{q[0], q[1]});   // descales of 1
            fast_dev.emplace_back(DType::f32, std::vector<int64_t>{q[0], q[1], q[2]});   // lse (unused)
            std::vector<float> ones(q[0] * q[1], 1.0f);
            HostTensor hd = HostTensor::from_values(std::vector<double>(ones.begin(), ones.end()), DType::f32, {q[0], q[1]});
            fast_dev[0] = DeviceTensor::from_host(hd);
            // The sink variant's nearest fast path writes the LSE (a fix-up pass would add the sink).
            const bool sink = c.problem.rfind("sink", 0) == 0;
            // fp8: attention_fp8 takes V transposed, vt [B, H, D, S] (its quantizer writes it so).
            DeviceTensor* v_arg = &c.dev[2];
            if (is_fp8(c.host[2].dtype())) {
              fast_dev.push_back(transposed_v(c.host[2]));
              v_arg = &fast_dev.back();
            }
            // The window: the library's sliding-window variant (its mask causal, the kernel too).
            static const Kernel window_kernel = kernels::attention_variant(kernels::sliding_window_variant(kWindow));
            if (window) k = &window_kernel;
            run_args = {c.dev[0].view(), c.dev[1].view(), v_arg->view(), fast_dev[0].view(), fast_dev[0].view(),
                        fast_dev[0].view(), c.dev[c.out].view(), fast_dev[1].view(), std::get<double>(c.tail[0]), 1.0,
                        window || (!sink && std::get<bool>(c.tail[1])), sink};
            checked = !sink;
          }
        }
        // Compile once (a tuned or default config without `config`), then launch the compiled kernel.
        const auto specs = specs_for(*k, run_args, false);
        // Without a config: the library's default (template) or the generic lowering's untuned one.
        const bool sm80 = path.size() >= 7 && path.compare(path.size() - 7, 7, "(sm_80)") == 0;
        const std::string arch = sm80 ? "sm_80" : dev.arch();
        Config cfg = config ? *config : codegen::untuned_config(k->trace(specs), arch);
        if (!json.empty() && json[0] == '+') cfg = Config::from_json(json.substr(1), cfg);
        CompileRequest req;
        if (sm80) req.arch = arch;
        const CompiledKernel& ck = compile(*k, specs, cfg, req);
        const LaunchGeometry g = launch_geometry(ck, count_programs(*k, ck, run_args), dev.sm_count);
        LaunchOptions lo;
        auto launch_once = [&](int, CUstream s) {
          lo.stream = s;
          launch_compiled(*k, ck, run_args, g, lo);
        };
        c.dev[c.out].fill_bytes(0xFF);
        launch_once(0, stream);
        stream.synchronize();
        const HostTensor got = c.dev[c.out].to_host();
        // float64 reference at sampled entries.
        std::vector<std::pair<double, double>> pairs;
        std::mt19937_64 rng(99);
        const auto& hs = c.host;
        if (c.problem.rfind("gemm", 0) == 0) {
          const bool kn = c.problem.find(" kn ") != std::string::npos;
          const int64_t M = hs[0].shape()[0], K = hs[0].shape()[1], N = hs[3].shape()[1];
          for (int s = 0; s < 256; ++s) {
            const int64_t i = rng() % M, j = rng() % N;
            double acc = 0;
            for (int64_t kk = 0; kk < K; ++kk) acc += hs[0].at(i * K + kk) * (kn ? hs[1].at(kk * N + j) : hs[1].at(j * K + kk));
            pairs.push_back({gelu(acc + hs[2].at(j)), got.at(i * N + j)});
          }
        } else if (c.problem.rfind("bmm", 0) == 0) {
          const int64_t Z = hs[0].shape()[0], M = hs[0].shape()[1], K = hs[0].shape()[2], N = hs[1].shape()[1];
          for (int s = 0; s < 256; ++s) {
            const int64_t z = rng() % Z, i = rng() % M, j = rng() % N;
            double acc = 0;
            for (int64_t kk = 0; kk < K; ++kk) acc += hs[0].at((z * M + i) * K + kk) * hs[1].at((z * N + j) * K + kk);
            pairs.push_back({acc, got.at((z * M + i) * N + j)});
          }
        } else if (c.problem.rfind("swiglu", 0) == 0) {
          const int64_t M = hs[0].shape()[0], K = hs[0].shape()[1], N = hs[1].shape()[0];
          for (int s = 0; s < 256; ++s) {
            const int64_t i = rng() % M, j = rng() % N;
            double g = 0, u = 0;
            for (int64_t kk = 0; kk < K; ++kk) {
              g += hs[0].at(i * K + kk) * hs[1].at(j * K + kk);
              u += hs[0].at(i * K + kk) * hs[2].at(j * K + kk);
            }
            pairs.push_back({g / (1 + std::exp(-g)) * u, got.at(i * N + j)});
          }
        } else {
          const auto& sh = hs[0].shape();
          const int64_t B = sh[0], H = sh[1], S = sh[2], D = sh[3], Dv = hs[2].shape()[3];
          const bool window = c.problem.rfind("window", 0) == 0;
          const bool causal = window || (c.tail.size() > 1 && std::get<bool>(c.tail[1]));
          const int64_t span = window ? std::get<int64_t>(c.tail[1]) : S;   // keys a row sees at most
          const bool sink = c.problem.rfind("sink", 0) == 0;
          const double scale = 1.0 / std::sqrt(static_cast<double>(D));
          for (int s = 0; s < 4; ++s) {
            const int64_t b = rng() % B, h = rng() % H, i = rng() % S;
            const int64_t base = (b * H + h) * S * D, vbase = (b * H + h) * S * Dv;
            const int64_t keys = causal ? i + 1 : S, first = std::max<int64_t>(0, keys - span);
            std::vector<double> p(keys, -INFINITY);
            // The sink: a key of logit sinks[h] (log2 units) and zero value.
            const double sink_logit = sink ? hs[3].at(h) * std::log(2.0) : -INFINITY;
            double mx = sink_logit;
            for (int64_t j = first; j < keys; ++j) {
              double dotv = 0;
              for (int64_t d = 0; d < D; ++d) dotv += hs[0].at(base + i * D + d) * hs[1].at(base + j * D + d);
              p[j] = dotv * scale;
              mx = std::max(mx, p[j]);
            }
            double sum = sink ? std::exp(sink_logit - mx) : 0.0;
            for (double& x : p) sum += (x = std::exp(x - mx));
            for (int64_t d = 0; d < Dv; ++d) {
              double o = 0;
              for (int64_t j = 0; j < keys; ++j) o += p[j] * hs[2].at(vbase + j * Dv + d);
              pairs.push_back({o / sum, got.at(vbase + i * Dv + d)});
            }
          }
        }
        const double err = checked ? rel_rms(pairs) : NAN;
        const auto samples = bench::time_samples(launch_once, spinner, stream, warmup, reps, 5.0,
                                                 [&](CUstream s) { flush.memset_async(0, s); });
        const double ms = bench::median(samples);
        const double tflops = c.flops / (ms * 1e-3) / 1e12;
        std::printf("%-44s %-26s %9.4f %9.1f %10.2e  %s\n", c.name.c_str(), path.c_str(), ms, tflops, err,
                    ck.config.to_json().c_str());
        std::fflush(stdout);
        jsonl << fmt::format(R"({{"problem":"{}","case":"{}","impl":"tilejit {}","lowering":"{}","ms":{},"tflops":{},"rel_err":{},"config":{}}})",
                             c.problem, c.name, path, ck.generated.lowering, ms, tflops,
                             std::isnan(err) ? std::string("null") : fmt::format("{}", err), ck.config.to_json())
              << "\n";
        jsonl.flush();
      } catch (const std::exception& e) {
        std::printf("%-44s %-10s failed: %s\n", c.name.c_str(), path.c_str(), e.what());
      }
      c.dev.clear();
    }
    if (want("backward")) {
      bench_dsl::BenchContext ctx{dev, spinner, stream, flush, jsonl, reps, warmup};
      bench_dsl::bench_backward(ctx, quick, name_has, also);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dsl: %s\n", e.what());
    return 1;
  }
}
