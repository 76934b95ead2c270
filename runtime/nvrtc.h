#pragma once
// Run-time compilation of generated CUDA C++ with NVRTC, to CUBIN for the exact GPU
// architecture (and PTX for inspection).
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tj {

// NVRTC rejected the program. what() is format_compile_error()'s report, preceded by a
// one-line summary; log() and source() keep the raw material.
class CompileError : public Error {
 public:
  CompileError(const std::string& message, std::string log, std::string source)
      : Error(message), log_(std::move(log)), source_(std::move(source)) {}
  const std::string& log() const { return log_; }
  const std::string& source() const { return source_; }

 private:
  std::string log_;
  std::string source_;
};

}  // namespace tj

namespace tj::runtime {

struct CompileOptions {
  // "sm_90a", "sm_80", ... ("compute_XX" gives PTX only). A CUBIN needs a real sm_XX
  // target; PTX comes from the same compilation (NVRTC 13 emits both), or from a second
  // compilation for compute_XX when the NVRTC in use does not.
  std::string arch = "sm_90a";
  bool want_ptx = true;
  bool want_cubin = true;
  // Appended after the defaults (-std=c++20 -default-device -lineinfo
  // --gpu-architecture=...). A -std= / --std= here replaces the default standard.
  std::vector<std::string> extra_options;
  // name -> contents, given to nvrtcCreateProgram for #include "name".
  std::vector<std::pair<std::string, std::string>> headers;
};

struct CompileResult {
  std::string ptx;          // empty unless want_ptx
  std::vector<char> cubin;  // empty unless want_cubin; an ELF image for cuModuleLoadData
  std::string log;          // NVRTC's log (warnings) of a successful compilation
  double milliseconds = 0;  // wall time spent in NVRTC
};

// Compiles `source` (named `program_name` in diagnostics, e.g. "attention_fwd.cu").
// Throws tj::CompileError on compilation errors and tj::Error for bad options (e.g. an
// unknown arch).
CompileResult compile_cuda(std::string_view source, std::string_view program_name,
                           const CompileOptions& options = {});

// For each error in an NVRTC log: the log line; the source lines around it (±3, numbered,
// the error line marked with '>' and the column with '^' when NVRTC gave one); and, when a
// `// @ <file>:<line>` marker sits at or above the error line, "generated from your kernel
// at <file>:<line>". Errors in a file named in `headers` show that header's lines;
// `program_name` (if given) identifies the main source, otherwise any other file name
// does. Returns the log unchanged when it contains no recognizable error line.
std::string format_compile_error(
    std::string_view log, std::string_view source, std::string_view program_name = {},
    const std::vector<std::pair<std::string, std::string>>& headers = {});

// NVRTC's version as major*1000 + minor*10 (13.0 -> 13000, 12.8 -> 12080).
int nvrtc_version();
// The compute capabilities NVRTC can target, e.g. {75, 80, ..., 90, 100, 120}.
std::vector<int> nvrtc_supported_archs();

}  // namespace tj::runtime
