// `tilejit tune`: find the fastest correct config of a library kernel for one problem on
// this GPU and store it in the tuning cache (autotune/tuner.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "autotune/cache.h"
#include "autotune/tuner.h"
#include "tools/attention.h"
#include "tools/problem.h"

namespace tj::tools {

namespace {

std::string status_counts(const autotune::TuneResult& r) {
  std::map<std::string, int> n;
  for (const auto& c : r.candidates) ++n[std::string(autotune::name(c.status))];
  std::vector<std::string> parts;
  for (const char* s : {"ok", "hopeless", "duplicate", "invalid", "pruned", "wrong", "fault", "timeout", "compile_error", "error",
                        "skipped"})
    if (n.count(s)) parts.push_back(fmt::format("{} {}", n[s], s));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

int tune(const ProblemOptions& o, const TuneCliOptions& t) {
  if (!o.arch.empty()) throw Error("tune runs on this machine's GPU; --arch does not apply (use `tilejit show --arch` to inspect code)");
  auto effort = autotune::effort_from_name(t.effort);
  if (!effort) throw Error(fmt::format("unknown --effort '{}' (none, quick, full, exhaustive)", t.effort));
  // `tilejit run attention` with e4m3 / bf16 / f16 runs attention_fp8 (and takes its tuned
  // config): tune that kernel, not the SIMT one.
  ProblemOptions po = as_run_takes_it(o, "tuning it");
  po.config.clear();
  ResolvedProblem r = resolve(po);
  const double flops = r.entry->flops(r.problem);

  autotune::TuneOptions opts;
  opts.effort = *effort;
  opts.time_budget_s = t.budget_s;
  opts.candidate_timeout_s = t.timeout_s;
  opts.compile_threads = t.threads;
  opts.repeats = t.repeats;
  opts.isolate = !t.in_process;
  opts.use_cache = !t.force;
  opts.store = !t.no_store;
  opts.progress = true;
  opts.flops = flops;
  opts.seed = t.seed;
  if (!o.config.empty()) opts.extra_candidates.push_back(Config::from_json(o.config, r.config));   // over the default
  for (const auto& only : t.only) autotune::parse_only(only, opts.space);

  fmt::print("kernel {}  shape [{}]  {} -> {}{}  effort {}\n", r.entry->name, fmt::join(r.problem.shape, ", "),
             name(r.problem.dtype), name(r.problem.out_dtype.value_or(is_fp8(r.problem.dtype) ? DType::bf16 : r.problem.dtype)),
             r.problem.causal ? "  causal" : "", t.effort);
  std::fflush(stdout);
  autotune::TuneResult res = autotune::tune(r.entry->get(), r.specs, opts);

  auto tflops = [&](double ms) { return flops > 0 && ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
  if (*effort == autotune::Effort::none) {
    fmt::print("effort none: the default config (nothing measured)\n");
    fmt::print("{}\n", res.best.to_json());
    return 0;
  }
  fmt::print("GPU {} ({})  {}\n", res.device.device_str(), res.device.arch, res.device.toolkit_str());
  if (res.from_cache) {
    fmt::print("cached: {:.4f} ms ({:.1f} TFLOP/s, default {:.4f} ms) in {} (--force tunes again)\n", res.best_ms,
               tflops(res.best_ms), res.reference_ms, autotune::TuningCache::default_path().string());
    fmt::print("{}\n", res.best.to_json());
    return 0;
  }
  fmt::print("space: {}\n", res.space);
  fmt::print("search: {}, {} candidates ({}) in {:.1f} s; {} NVRTC compiles ({:.1f} s of compile time); {}{}\n",
             autotune::name(res.strategy), res.candidates.size(), status_counts(res), res.seconds, res.nvrtc_compiles,
             res.compile_seconds, res.isolated ? "isolated worker" : "in process (no fault isolation)",
             res.worker_starts > 1 ? fmt::format(", {} worker restarts", res.worker_starts - 1) : "");

  auto ranking = res.ranking();
  const size_t top = std::min<size_t>(ranking.size(), static_cast<size_t>(std::max(t.top, 1)));
  fmt::print("\n{:>4}  {:>10}  {:>8}  {:>10}  {:>5}  {}\n", "rank", "ms", "TFLOP/s", "vs default", "regs", "config");
  for (size_t i = 0; i < top; ++i) {
    const auto* c = ranking[i];
    fmt::print("{:>4}  {:>10.4f}  {:>8.2f}  {:>9.2f}x  {:>5}  {}{}\n", i + 1, c->ms, tflops(c->ms),
               std::isfinite(res.reference_ms) ? res.reference_ms / c->ms : 0.0, c->registers, c->config.to_json(),
               c->reference ? "  (default)" : "");
  }
  fmt::print("{:>4}  {:>10.4f}  {:>8.2f}  {:>9.2f}x  {:>5}  {}\n", "dflt", res.reference_ms, tflops(res.reference_ms), 1.0, "",
             res.reference_config.to_json());

  std::vector<const autotune::Candidate*> discarded;
  for (const auto& c : res.candidates)
    if (c.status == autotune::Candidate::Status::wrong || c.status == autotune::Candidate::Status::fault ||
        c.status == autotune::Candidate::Status::timeout || c.status == autotune::Candidate::Status::compile_error ||
        c.status == autotune::Candidate::Status::error)
      discarded.push_back(&c);
  if (!discarded.empty()) {
    fmt::print("\ndiscarded:\n");
    for (const auto* c : discarded) {
      std::string detail = c->detail.size() > 300 ? c->detail.substr(0, 300) + "..." : c->detail;
      std::replace(detail.begin(), detail.end(), '\n', ' ');
      fmt::print("  #{} {}: {}: {}\n", c->id, c->config.to_json(), autotune::name(c->status), detail);
    }
  }
  for (const auto& n : res.notes) fmt::print("note: {}\n", n);
  if (res.stored) fmt::print("\nstored in {}\n", autotune::TuningCache::default_path().string());
  else if (!t.no_store && !res.from_cache) fmt::print("\nnot stored (see the warning above)\n");
  fmt::print("best: {:.4f} ms ({:.2f} TFLOP/s), {:.2f}x the default\n", res.best_ms, tflops(res.best_ms),
             std::isfinite(res.reference_ms) ? res.reference_ms / res.best_ms : 0.0);
  fmt::print("{}\n", res.best.to_json());
  return 0;
}

}  // namespace tj::tools
