#pragma once
// Test helpers for compiling generated kernels with NVRTC directly (no JIT caches) and reading
// what ptxas reported.
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "codegen/cuda_emitter.h"
#include "codegen/device_library.h"
#include "runtime/nvrtc.h"

namespace tj_test {

// The embedded device library as NVRTC headers.
inline std::vector<std::pair<std::string, std::string>> device_headers() {
  std::vector<std::pair<std::string, std::string>> h;
  for (const auto& f : tj::codegen::device_library()) h.emplace_back(f.name, f.contents);
  return h;
}

// PTX (and a CUBIN when asked) of a generated kernel for `arch`; ptxas -v in the log on request.
inline tj::runtime::CompileResult nvrtc(const tj::codegen::GeneratedKernel& g, const std::string& arch, bool cubin = true,
                                        bool ptxas_verbose = false) {
  tj::runtime::CompileOptions o;
  o.arch = arch;
  o.want_ptx = true;
  o.want_cubin = cubin;
  o.headers = device_headers();
  if (ptxas_verbose) o.extra_options = {"--ptxas-options=-v"};
  return tj::runtime::compile_cuda(g.source, g.name + ".cu", o);
}

// Registers and spill bytes ptxas -v reported for the kernel (-1: not in the log).
struct PtxasInfo {
  int registers = -1;
  int spill_stores = -1, spill_loads = -1;
};
inline PtxasInfo ptxas_info(const std::string& log) {
  PtxasInfo p;
  std::smatch m;
  if (std::regex_search(log, m, std::regex(R"((\d+) bytes spill stores, (\d+) bytes spill loads)"))) {
    p.spill_stores = std::stoi(m[1]);
    p.spill_loads = std::stoi(m[2]);
  }
  if (std::regex_search(log, m, std::regex(R"(Used (\d+) registers)"))) p.registers = std::stoi(m[1]);
  return p;
}

}  // namespace tj_test
