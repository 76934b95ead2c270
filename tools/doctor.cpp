// `tilejit doctor`: reports, in plain words, what this machine can and cannot do.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/disk_cache.h"
#include "runtime/driver.h"
#include "runtime/memory.h"
#include "runtime/nvrtc.h"
#include "tools/commands.h"

namespace tj::tools {
namespace {

void line(const std::string& label, const std::string& text) {
  fmt::print("  {:<22} {}\n", label + ":", text);
}

std::string version_text(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

std::string gib(size_t bytes) { return fmt::format("{:.1f} GiB", bytes / double(1ull << 30)); }

// A tiny kernel: compiled for `arch`, and run when a GPU is present.
constexpr const char* kProbeKernel = R"(
extern "C" __global__ void tj_doctor_probe(unsigned* out, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * 3u + 7u;
}
)";

}  // namespace

int doctor() {
  using namespace tj::runtime;
  int status = 0;
  fmt::print("tilejit doctor\n\n");

  // ---- driver and GPU
  Driver& d = driver();
  const DeviceInfo* dev = nullptr;
  std::string device_error;
  if (!d.library_loaded()) {
    line("CUDA driver", "not found: " + d.unavailable_reason());
  } else {
    line("CUDA driver", fmt::format("found, version {} ({})", version_text(d.version()),
                                    d.version()));
    if (!d.available()) {
      line("GPU", "none usable: " + d.unavailable_reason());
    }
  }
  if (d.available()) {
    try {
      dev = &current_device();
    } catch (const std::exception& e) {
      device_error = e.what();
      line("GPU", "cannot be used: " + device_error);
    }
  }
  if (dev) {
    line("GPU", fmt::format("{} (device {} of {})", dev->name, dev->ordinal, d.device_count()));
    line("compute capability", fmt::format("{}.{} (target {})", dev->cc_major, dev->cc_minor,
                                           dev->arch()));
    line("SMs", std::to_string(dev->sm_count));
    std::string mem = gib(dev->total_mem);
    try {
      MemoryInfo m = memory_info();
      mem += fmt::format(" ({} free)", gib(m.free_bytes));
    } catch (const std::exception&) {
    }
    line("memory", mem);
    line("shared memory", fmt::format("{} KiB per block (opt-in), {} KiB per SM",
                                      dev->max_smem_per_block_optin / 1024,
                                      dev->max_smem_per_sm / 1024));
    line("L2 cache", fmt::format("{} MiB", dev->l2_bytes / double(1 << 20)));
  }

  // ---- NVRTC
  std::vector<int> archs;
  try {
    int v = nvrtc_version();
    archs = nvrtc_supported_archs();
    std::string list;
    for (int a : archs) list += fmt::format("{}sm_{}", list.empty() ? "" : " ", a);
    line("NVRTC", fmt::format("{} (targets: {})", version_text(v), list));
  } catch (const std::exception& e) {
    line("NVRTC", std::string("unusable: ") + e.what());
    status = 1;
  }

  // ---- features
  if (dev) {
    line("FP8 (e4m3/e5m2)",
         dev->supports_fp8() ? "yes (compute capability >= 8.9)"
                             : "no (needs compute capability 8.9 or newer)");
    line("wgmma + TMA", dev->supports_wgmma()
                            ? "yes (sm_90a)"
                            : "no (Hopper sm_90a only; dot() uses mma.sync or SIMT here)");
    int cc = dev->cc_major * 10 + dev->cc_minor;
    if (!archs.empty() && std::find(archs.begin(), archs.end(), cc) == archs.end()) {
      line("NVRTC for this GPU", fmt::format("no: this NVRTC cannot target sm_{}", cc));
      status = 1;
    }
  } else {
    line("FP8 (e4m3/e5m2)", "unknown without a GPU (needs compute capability >= 8.9)");
    line("wgmma + TMA", "unknown without a GPU (needs sm_90a, Hopper)");
    line("what works", "tracing, code generation, NVRTC compilation, caches; running "
                       "kernels, tuning and GPU tests do not");
  }

  // ---- compile (and run) a probe kernel
  std::string arch = dev ? dev->arch() : "sm_90a";
  CompileResult compiled;
  bool compiled_ok = false;
  try {
    CompileOptions opts;
    opts.arch = arch;
    opts.want_ptx = false;
    compiled = compile_cuda(kProbeKernel, "tj_doctor_probe.cu", opts);
    compiled_ok = true;
    line("NVRTC compile check", fmt::format("ok ({}, {} byte CUBIN, {:.0f} ms)", arch,
                                            compiled.cubin.size(), compiled.milliseconds));
  } catch (const std::exception& e) {
    line("NVRTC compile check", std::string("FAILED: ") + e.what());
    status = 1;
  }
  if (dev && compiled_ok) {
    try {
      constexpr unsigned n = 1000;
      Module module(compiled.cubin);
      CUfunction f = module.function("tj_doctor_probe");
      DeviceBuffer out(n * sizeof(unsigned));
      out.memset(0xff);
      CUdeviceptr ptr = out.ptr();
      unsigned count = n;
      void* args[] = {&ptr, &count};
      launch(f, Dim3((n + 127) / 128), Dim3(128), 0, nullptr, args);
      synchronize();
      std::vector<unsigned> host = out.to_host<unsigned>();
      unsigned bad = 0;
      for (unsigned i = 0; i < n; ++i) bad += host[i] != i * 3u + 7u;
      if (bad == 0) {
        line("kernel launch check", "ok");
      } else {
        line("kernel launch check", fmt::format("FAILED: {} of {} outputs wrong", bad, n));
        status = 1;
      }
    } catch (const std::exception& e) {
      line("kernel launch check", std::string("FAILED: ") + e.what());
      status = 1;
    }
  }

  // ---- cache
  std::filesystem::path cache = DiskCache::default_dir();
  std::error_code ec;
  std::string cache_state;
  if (std::filesystem::is_directory(cache, ec)) {
    cache_state = ::access(cache.c_str(), W_OK) == 0 ? "exists, writable" : "exists, NOT writable";
  } else {
    cache_state = "will be created on first use";
  }
  line("cache dir", fmt::format("{} ({})", cache.string(), cache_state));
  if (const char* env = std::getenv("TILEJIT_CACHE_DIR"); env && *env)
    line("", "(from $TILEJIT_CACHE_DIR)");

  if (status != 0) {
    fmt::print("\nSome checks FAILED (see above).\n");
  } else {
    fmt::print("\n{}\n", dev ? "This machine can compile and run tilejit kernels."
                             : "No usable GPU: tilejit can generate and compile kernels here, "
                               "but not run them.");
  }
  return status;
}

}  // namespace tj::tools
