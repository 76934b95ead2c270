#pragma once
// Timing for the benchmark drivers (bench/gemm, bench/dsl): each sample is one launch between two
// CUDA events, queued behind a spin kernel so that host launch overhead never shows; warm-up
// launches first, then the median of the samples.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/driver.h"
#include "runtime/memory.h"
#include "runtime/nvrtc.h"

namespace tj::bench {

// A kernel that spins for a while: queued first, it keeps the GPU busy while the host queues the
// timed launches behind it.
struct Spinner {
  std::unique_ptr<runtime::Module> module;
  CUfunction fn = nullptr;
  void init(const std::string& arch) {
    const char* src =
        "extern \"C\" __global__ void tj_spin(unsigned long long ns) {\n"
        "  unsigned long long t0, t;\n"
        "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t0));\n"
        "  do { __nanosleep(2000); asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t)); } while (t - t0 < ns);\n"
        "}\n";
    runtime::CompileOptions o;
    o.arch = arch;
    o.want_ptx = false;
    auto r = runtime::compile_cuda(src, "spin.cu", o);
    module = std::make_unique<runtime::Module>(r.cubin);
    fn = module->function("tj_spin");
  }
  void spin(CUstream s, double ms) {
    unsigned long long ns = static_cast<unsigned long long>(ms * 1e6);
    void* args[] = {&ns};
    runtime::launch(fn, runtime::Dim3(1), runtime::Dim3(32), 0, s, args);
  }
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Milliseconds per launch of `launch(sample, stream)`: `warmup` untimed launches, then `reps`
// samples behind a spin of `spin_ms`; `between(stream)`, when given, runs before each sample
// outside its events (e.g. flushing the L2 cache).
inline std::vector<double> time_samples(const std::function<void(int, CUstream)>& launch, Spinner& spinner,
                                        const runtime::Stream& s, int warmup, int reps, double spin_ms,
                                        const std::function<void(CUstream)>& between = {}) {
  for (int i = 0; i < warmup; ++i) launch(i, s);
  s.synchronize();
  std::vector<runtime::Event> ev;
  ev.reserve(2 * reps);
  for (int i = 0; i < 2 * reps; ++i) ev.emplace_back();
  spinner.spin(s, spin_ms);
  for (int i = 0; i < reps; ++i) {
    if (between) between(s);
    ev[2 * i].record(s);
    launch(i, s);
    ev[2 * i + 1].record(s);
  }
  s.synchronize();
  std::vector<double> out;
  for (int i = 0; i < reps; ++i) out.push_back(runtime::Event::elapsed_ms(ev[2 * i], ev[2 * i + 1]));
  return out;
}

}  // namespace tj::bench
