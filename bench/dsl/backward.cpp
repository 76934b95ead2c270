#include "kernels/attention_backward.h"
#include "bench/dsl/backward.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <thread>

#include "bench/dsl/bench_util.h"
#include "codegen/lowering.h"
#include "examples/kernels/user_kernels.h"
#include "kernels/attention_fp8.h"
#include "kernels/library.h"
#include "runtime/jit.h"

namespace tj::bench_dsl {
namespace {

constexpr double kLog2e = 1.4426950408889634;

// One kernel compiled for its arguments, ready to launch on a stream.
struct Ready {
  const Kernel* kernel = nullptr;
  const CompiledKernel* ck = nullptr;
  std::vector<Arg> args;
  LaunchGeometry geometry;
  void launch(CUstream s) const {
    LaunchOptions lo;
    lo.stream = s;
    launch_compiled(*kernel, *ck, args, geometry, lo);
  }
};

// `json`: "" for the untuned config, "+{...}" for knobs and blocks over it.
Ready prepare(const Kernel& k, std::vector<Arg> args, const std::string& json, const runtime::DeviceInfo& dev) {
  Ready r;
  r.kernel = &k;
  r.args = std::move(args);
  const auto specs = specs_for(k, r.args, false);
  Config cfg = codegen::untuned_config(k.trace(specs), dev.arch());
  if (!json.empty()) cfg = Config::from_json(json.substr(1), cfg);
  r.ck = &compile(k, specs, cfg, CompileRequest{});
  r.geometry = launch_geometry(*r.ck, count_programs(k, *r.ck, r.args), dev.sm_count);
  return r;
}

// float64 gradients of one head (rows of q, k, v, dO as doubles [S, D]) at sampled rows: dq at
// `qrows`, dk and dv at `krows`; scale_nat is the natural-units softmax scale.
struct HeadReference {
  int64_t S = 0, D = 0;
  bool causal = false;
  double scale_nat = 0;
  std::vector<double> q, k, v, dout;
  std::vector<double> lse, delta;   // per query row, natural units; delta = rowsum(dO * O)

  double dotrow(const std::vector<double>& a, int64_t i, const std::vector<double>& b, int64_t j) const {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += a[i * D + d] * b[j * D + d];
    return s;
  }
  int64_t keys(int64_t i) const { return causal ? i + 1 : S; }

  // lse and delta of every query row, in parallel over rows.
  void forward() {
    lse.assign(S, 0);
    delta.assign(S, 0);
    const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int w = 0; w < threads; ++w)
      pool.emplace_back([&, w] {
        std::vector<double> s(S), o(D);
        for (int64_t i = w; i < S; i += threads) {
          double mx = -INFINITY;
          for (int64_t j = 0; j < keys(i); ++j) mx = std::max(mx, s[j] = dotrow(q, i, k, j) * scale_nat);
          double sum = 0;
          std::fill(o.begin(), o.end(), 0.0);
          for (int64_t j = 0; j < keys(i); ++j) {
            const double p = std::exp(s[j] - mx);
            sum += p;
            for (int64_t d = 0; d < D; ++d) o[d] += p * v[j * D + d];
          }
          lse[i] = mx + std::log(sum);
          double dl = 0;
          for (int64_t d = 0; d < D; ++d) dl += dout[i * D + d] * o[d] / sum;
          delta[i] = dl;
        }
      });
    for (auto& t : pool) t.join();
  }
  // P and dS of (query i, key j).
  std::pair<double, double> p_ds(int64_t i, int64_t j) const {
    if (j >= keys(i)) return {0.0, 0.0};
    const double p = std::exp(dotrow(q, i, k, j) * scale_nat - lse[i]);
    return {p, p * (dotrow(dout, i, v, j) - delta[i])};
  }
  std::vector<double> dq_row(int64_t i) const {
    std::vector<double> g(D, 0.0);
    for (int64_t j = 0; j < keys(i); ++j) {
      const double ds = p_ds(i, j).second;
      for (int64_t d = 0; d < D; ++d) g[d] += ds * k[j * D + d] * scale_nat;
    }
    return g;
  }
  std::pair<std::vector<double>, std::vector<double>> dk_dv_row(int64_t j) const {
    std::vector<double> dk(D, 0.0), dv(D, 0.0);
    for (int64_t i = causal ? j : 0; i < S; ++i) {
      const auto [p, ds] = p_ds(i, j);
      for (int64_t d = 0; d < D; ++d) {
        dk[d] += ds * q[i * D + d] * scale_nat;
        dv[d] += p * dout[i * D + d];
      }
    }
    return {dk, dv};
  }
};

std::vector<double> head_rows(const HostTensor& t, int64_t head, int64_t S, int64_t D) {
  std::vector<double> out(S * D);
  for (int64_t x = 0; x < S * D; ++x) out[x] = t.at(head * S * D + x);
  return out;
}

void one_case(BenchContext& ctx, int64_t B, int64_t H, int64_t S, int64_t D, bool causal, uint64_t seed,
              const std::vector<std::pair<std::string, std::string>>& paths) {
  const std::string name = fmt::format("attention_bwd bf16 {}x{}x{}x{}{}", B, H, S, D, causal ? " causal" : "");
  const std::string problem = fmt::format("attention_bwd {} {} {} {}{}", B, H, S, D, causal ? " causal" : "");
  const std::vector<int64_t> shape = {B, H, S, D}, rows = {B, H, S};
  const double scale = kLog2e / std::sqrt(static_cast<double>(D));   // log2 units, as the forward's
  std::vector<HostTensor> host;
  for (int i = 0; i < 4; ++i) host.push_back(random_tensor(DType::bf16, shape, seed + i));   // q, k, v, dO
  std::vector<DeviceTensor> in;
  for (const auto& h : host) in.push_back(DeviceTensor::from_host(h));
  DeviceTensor o(DType::bf16, shape), lse(DType::f32, rows), delta(DType::f32, rows);
  DeviceTensor dq(DType::bf16, shape), dk(DType::bf16, shape), dv(DType::bf16, shape), dq_acc(DType::f32, shape);

  // The forward that saves the LSE: the library's attention_fp8 on bf16 inputs (natural-log LSE,
  // turned into the log2 units the backward kernels take).
  {
    DeviceTensor ones = DeviceTensor::from_host(HostTensor::from_values(std::vector<double>(B * H, 1.0), DType::f32, {B, H}));
    const Ready fwd = prepare(kernels::attention_fp8(),
                              {in[0].view(), in[1].view(), in[2].view(), ones.view(), ones.view(), ones.view(), o.view(),
                               lse.view(), scale, 1.0, causal, true},
                              "", ctx.dev);
    fwd.launch(ctx.stream);
    ctx.stream.synchronize();
    HostTensor l = lse.to_host();
    for (int64_t x = 0; x < l.numel(); ++x) l.set(x, l.at(x) * kLog2e);
    lse = DeviceTensor::from_host(l);
  }

  // The float64 reference of one sampled head.
  std::mt19937_64 rng(seed * 7 + 1);
  const int64_t head = static_cast<int64_t>(rng() % (B * H));
  HeadReference ref;
  ref.S = S;
  ref.D = D;
  ref.causal = causal;
  ref.scale_nat = 1.0 / std::sqrt(static_cast<double>(D));
  ref.q = head_rows(host[0], head, S, D);
  ref.k = head_rows(host[1], head, S, D);
  ref.v = head_rows(host[2], head, S, D);
  ref.dout = head_rows(host[3], head, S, D);
  ref.forward();
  std::vector<int64_t> sample_rows = {0, S - 1};
  for (int i = 0; i < 2; ++i) sample_rows.push_back(static_cast<int64_t>(rng() % S));
  std::vector<std::vector<double>> want_dq, want_dk, want_dv;
  for (int64_t r : sample_rows) {
    want_dq.push_back(ref.dq_row(r));
    auto [gk, gv] = ref.dk_dv_row(r);
    want_dk.push_back(std::move(gk));
    want_dv.push_back(std::move(gv));
  }

  // The FP8 backward's forward: attention_fp8_forward on the quantized inputs, its LSE (natural log).
  DeviceTensor lse8(DType::f32, rows), o8(DType::bf16, shape);
  bool have_fp8_forward = false;
  auto fp8_forward = [&] {
    if (have_fp8_forward) return;
    kernels::AttentionFp8Options fo;
    fo.causal = causal;
    fo.lse = lse8.view();
    kernels::AttentionFp8Workspace fws;
    kernels::attention_fp8_forward(in[0].view(), in[1].view(), in[2].view(), o8.view(), fo, fws);
    have_fp8_forward = true;
  };

  // dQ, dK and dV's relative RMS errors at the sampled rows against float64.
  auto errors = [&](double& eq, double& ek, double& ev) {
    const HostTensor gq = dq.to_host(), gk = dk.to_host(), gv = dv.to_host();
    std::vector<std::pair<double, double>> pq, pk, pv;
    for (size_t r = 0; r < sample_rows.size(); ++r)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t at = (head * S + sample_rows[r]) * D + d;
        pq.push_back({want_dq[r][d], gq.at(at)});
        pk.push_back({want_dk[r][d], gk.at(at)});
        pv.push_back({want_dv[r][d], gv.at(at)});
      }
    eq = rel_rms(pq), ek = rel_rms(pk), ev = rel_rms(pv);
  };
  for (const auto& [path, spec] : paths) try {
    if (spec.rfind("@fp8", 0) == 0) {
      // attention_backward with fp8: its quantizers (q, k, v, dO and the transposed copies), the
      // prepare pass, then the dK / dV and dQ kernels (json: knobs over their untuned configs).
      fp8_forward();
      // "@fp8kv+json" / "@fp8q+json": the json over one kernel's untuned config only.
      const bool kv_json = spec.rfind("@fp8kv", 0) == 0, q_json = spec.rfind("@fp8q", 0) == 0;
      const std::string json = spec.substr(kv_json ? 6 : q_json ? 5 : 4);
      kernels::AttentionBackwardOptions bo;
      bo.causal = causal;
      bo.fp8 = true;
      kernels::AttentionBackwardWorkspace ws;
      auto api = [&](int, CUstream s) {
        bo.stream = s;
        kernels::attention_backward(in[0].view(), in[1].view(), in[2].view(), o8.view(), in[3].view(), lse8.view(), dq.view(),
                                    dk.view(), dv.view(), bo, ws);
      };
      for (DeviceTensor* t : {&dq, &dk, &dv}) t->fill_bytes(0xFF);
      api(0, ctx.stream);
      ctx.stream.synchronize();
      double aq = 0, ak = 0, av = 0;
      errors(aq, ak, av);
      // The transposed copies against the copies (a sampled head).
      {
        const HostTensor q8 = ws.q8->to_host(), qt8 = ws.qt8->to_host(), d8 = ws.do8->to_host(), dt8 = ws.dot8->to_host();
        const int64_t Sp = ws.qt8->shape()[3];
        int64_t bad = 0;
        for (int64_t s = 0; s < S; ++s)
          for (int64_t d = 0; d < D; ++d) {
            if (q8.at((head * S + s) * D + d) != qt8.at((head * D + d) * Sp + s)) ++bad;
            if (d8.at((head * S + s) * D + d) != dt8.at((head * D + d) * Sp + s)) ++bad;
          }
        std::printf("fp8 check: api err dq/dk/dv %.1e %.1e %.1e; transposed copies differ at %lld of %lld\n", aq, ak, av,
                    static_cast<long long>(bad), static_cast<long long>(2 * S * D));
      }
      const Ready rkv = prepare(kernels::attention_bwd_dkdv_fp8(),
                                {ws.q8->view(), ws.qt8->view(), ws.k8->view(), ws.v8->view(), ws.do8->view(), ws.dot8->view(),
                                 ws.lse2->view(), ws.delta->view(), ws.sq->view(), ws.sk->view(), ws.sv->view(), ws.sdo->view(),
                                 dk.view(), dv.view(), scale, causal},
                                q_json ? std::string() : json, ctx.dev);
      const Ready rq = prepare(kernels::attention_bwd_dq_fp8(),
                               {ws.q8->view(), ws.k8->view(), ws.kt8->view(), ws.v8->view(), ws.do8->view(), ws.lse2->view(),
                                ws.delta->view(), ws.sq->view(), ws.sk->view(), ws.sv->view(), ws.sdo->view(), dq.view(), scale,
                                causal},
                               kv_json ? std::string() : json, ctx.dev);
      for (DeviceTensor* t : {&dq, &dk, &dv}) t->fill_bytes(0xFF);
      rkv.launch(ctx.stream);
      rq.launch(ctx.stream);
      ctx.stream.synchronize();
      double eq = 0, ek = 0, ev = 0;
      errors(eq, ek, ev);
      const double err = std::max({eq, ek, ev});
      auto flush = [&](CUstream s) { ctx.flush.memset_async(0, s); };
      auto timed = [&](const std::function<void(int, CUstream)>& f) {
        return bench::median(bench::time_samples(f, ctx.spinner, ctx.stream, ctx.warmup, ctx.reps, 5.0, flush));
      };
      const double ms_api = timed(api);
      const double ms_dkdv = timed([&](int, CUstream s) { rkv.launch(s); });
      const double ms_dq = timed([&](int, CUstream s) { rq.launch(s); });
      const double flops = 10.0 * B * H * S * S * D * (causal ? 0.5 : 1.0);
      const double ms = ms_dkdv + ms_dq;   // the kernels; ms_api adds the quantizers and the prepare pass
      std::printf("%-44s %-26s %9.4f %9.1f %10.2e  api %.3f ms (%.1f TFLOP/s) dkdv %.3f dq %.3f ms; dq/dk/dv err %.1e %.1e %.1e; %s / %s\n",
                  name.c_str(), path.c_str(), ms, flops / (ms * 1e-3) / 1e12, err, ms_api, flops / (ms_api * 1e-3) / 1e12, ms_dkdv,
                  ms_dq, eq, ek, ev, rkv.ck->config.to_json().c_str(), rq.ck->config.to_json().c_str());
      std::fflush(stdout);
      ctx.jsonl << fmt::format(
                       R"({{"problem":"{}","case":"{}","impl":"tilejit {}","lowering":"{}","ms":{},"tflops":{},"rel_err":{},)"
                       R"("ms_api":{},"tflops_api":{},"ms_parts":{{"dkdv":{},"dq":{}}},"rel_err_parts":{{"dq":{},"dk":{},"dv":{}}},)"
                       R"("config":{},"config_dq":{}}})",
                       problem, name, path, rkv.ck->generated.lowering, ms, flops / (ms * 1e-3) / 1e12,
                       std::isnan(err) ? std::string("null") : fmt::format("{}", err), ms_api, flops / (ms_api * 1e-3) / 1e12,
                       ms_dkdv, ms_dq, eq, ek, ev, rkv.ck->config.to_json(), rq.ck->config.to_json())
                << "\n";
      ctx.jsonl.flush();
      continue;
    }
    // "@fused[+json]": dK / dV and dQ in one kernel (dQ by atomic adds into dq_acc, zeroed first,
    // then converted); else the dK / dV and dQ kernels. json: knobs over the untuned configs.
    // "@kv+json": the json over the dK / dV kernel's untuned config only (the dQ kernel's blocks
    // have other meanings: m its rows).
    const bool fused = spec.rfind("@fused", 0) == 0, kv_only = spec.rfind("@kv", 0) == 0;
    const std::string json = fused ? spec.substr(6) : kv_only ? spec.substr(3) : spec;
    const Ready rd = prepare(kernels::attention_bwd_delta(), {o.view(), in[3].view(), delta.view()}, "", ctx.dev);
    const Ready rkv =
        fused ? prepare(kernels::attention_bwd_fused(),
                        {in[0].view(), in[1].view(), in[2].view(), in[3].view(), lse.view(), delta.view(), dk.view(), dv.view(),
                         dq_acc.view(), scale, causal},
                        json, ctx.dev)
              : prepare(kernels::attention_bwd_dkdv(),
                        {in[0].view(), in[1].view(), in[2].view(), in[3].view(), lse.view(), delta.view(), dk.view(),
                         dv.view(), scale, causal},
                        json, ctx.dev);
    const Ready rq = fused ? prepare(kernels::attention_bwd_dq_convert(), {dq_acc.view(), dq.view()}, "", ctx.dev)
                           : prepare(kernels::attention_bwd_dq(),
                                     {in[0].view(), in[1].view(), in[2].view(), in[3].view(), lse.view(), delta.view(),
                                      dq.view(), scale, causal},
                                     kv_only ? std::string() : json, ctx.dev);
    for (DeviceTensor* t : {&delta, &dq, &dk, &dv}) t->fill_bytes(0xFF);
    auto all = [&](int, CUstream s) {
      rd.launch(s);
      if (fused) dq_acc.fill_bytes_async(0, s);
      rkv.launch(s);
      rq.launch(s);
    };
    all(0, ctx.stream);
    ctx.stream.synchronize();
    double eq = 0, ek = 0, ev = 0;
    errors(eq, ek, ev);
    const double err = std::max({eq, ek, ev});
    auto flush = [&](CUstream s) { ctx.flush.memset_async(0, s); };
    const double ms = bench::median(bench::time_samples(all, ctx.spinner, ctx.stream, ctx.warmup, ctx.reps, 5.0, flush));
    auto one = [&](const Ready& r) {
      return bench::median(bench::time_samples([&](int, CUstream s) { r.launch(s); }, ctx.spinner, ctx.stream, ctx.warmup,
                                               ctx.reps, 5.0, flush));
    };
    const double ms_delta = one(rd), ms_dkdv = one(rkv), ms_dq = one(rq);   // fused: dK / dV / dQ, then the conversion
    // Useful FLOPs: 2.5x the forward's (five S x S x D products), half of them when causal.
    const double flops = 10.0 * B * H * S * S * D * (causal ? 0.5 : 1.0);
    const double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf("%-44s %-26s %9.4f %9.1f %10.2e  delta %.3f %s %.3f %s %.3f ms; dq/dk/dv err %.1e %.1e %.1e; %s / %s\n",
                name.c_str(), path.c_str(), ms, tflops, err, ms_delta, fused ? "dkdvdq" : "dkdv", ms_dkdv,
                fused ? "convert" : "dq", ms_dq, eq, ek, ev,
                rkv.ck->config.to_json().c_str(), rq.ck->config.to_json().c_str());
    std::fflush(stdout);
    ctx.jsonl << fmt::format(
                     R"({{"problem":"{}","case":"{}","impl":"tilejit {}","lowering":"{}","ms":{},"tflops":{},"rel_err":{},)"
                     R"("ms_parts":{{"delta":{},"{}":{},"{}":{}}},"rel_err_parts":{{"dq":{},"dk":{},"dv":{}}},"config":{},"config_dq":{}}})",
                     problem, name, path, rkv.ck->generated.lowering, ms, tflops,
                     std::isnan(err) ? std::string("null") : fmt::format("{}", err), ms_delta, fused ? "dkdvdq" : "dkdv",
                     ms_dkdv, fused ? "convert" : "dq", ms_dq,
                     std::isnan(eq) ? std::string("null") : fmt::format("{}", eq),
                     std::isnan(ek) ? std::string("null") : fmt::format("{}", ek),
                     std::isnan(ev) ? std::string("null") : fmt::format("{}", ev), rkv.ck->config.to_json(),
                     rq.ck->config.to_json())
              << "\n";
    ctx.jsonl.flush();
  } catch (const std::exception& e) {
    std::printf("%-44s %-10s failed: %s\n", name.c_str(), path.c_str(), e.what());
  }
}

}  // namespace

void bench_backward(BenchContext& ctx, bool quick, const std::string& name_has,
                    const std::vector<std::pair<std::string, std::string>>& also) {
  std::vector<std::pair<std::string, std::string>> paths = {{"generic", ""}, {"generic fused", "@fused"}, {"generic fp8", "@fp8"}};
  paths.insert(paths.end(), also.begin(), also.end());
  for (const auto& [label, json] : also)
    if (label.rfind("generic fp8", 0) != 0) paths.push_back({label + " fused", "@fused" + json});
  // A label starting "fp8": its knobs over the FP8 kernels' untuned configs ("fp8 kv" / "fp8 q":
  // the dK / dV or the dQ kernel's only).
  for (auto& [label, json] : paths)
    if (label.rfind("generic fp8", 0) == 0 && json.rfind("@", 0) != 0)
      json = (label.rfind("generic fp8 kv", 0) == 0 ? "@fp8kv" : label.rfind("generic fp8 q", 0) == 0 ? "@fp8q" : "@fp8") + json;
  // A label starting "kv": its knobs over the dK / dV kernel alone (three-kernel form).
  for (auto& [label, json] : paths)
    if (label.rfind("generic kv", 0) == 0 && json.rfind("@", 0) != 0) json = "@kv" + json;
  const std::vector<int64_t> seqs = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{1024, 4096, 16384};
  uint64_t seed = 500;
  for (int64_t S : seqs)
    for (bool causal : {false, true}) {
      const int64_t D = 128, H = 16, B = 16384 / S;
      const std::string name = fmt::format("attention_bwd bf16 {}x{}x{}x{}{}", B, H, S, D, causal ? " causal" : "");
      seed += 10;
      if (!name_has.empty() && name.find(name_has) == std::string::npos) continue;
      one_case(ctx, B, H, S, D, causal, seed, paths);
    }
}

}  // namespace tj::bench_dsl
