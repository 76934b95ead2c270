#include "runtime/nvrtc.h"

#include <nvrtc.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

namespace tj::runtime {
namespace {

struct Program {
  nvrtcProgram prog = nullptr;
  ~Program() {
    if (prog) nvrtcDestroyProgram(&prog);
  }
};

void check_nvrtc(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) throw Error(fmt::format("{}: {}", what, nvrtcGetErrorString(r)));
}

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) {
      if (start < text.size()) lines.push_back(text.substr(start));
      break;
    }
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

struct Diagnostic {
  std::string_view file;
  int line = 0;
  size_t log_index = 0;  // index of the diagnostic's line in the log
};

// "file(123): error: ..." / "file(123): catastrophic error: ..." / "error #20-D: ...".
std::optional<Diagnostic> parse_error_line(std::string_view text) {
  size_t close = text.find("): ");
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view rest = text.substr(close + 3);
  if (!(rest.starts_with("error") || rest.starts_with("catastrophic error") ||
        rest.starts_with("fatal error")))
    return std::nullopt;
  size_t open = text.rfind('(', close);
  if (open == std::string_view::npos || open == 0 || open + 1 >= close) return std::nullopt;
  int line = 0;
  for (size_t i = open + 1; i < close; ++i) {
    char c = text[i];
    if (c < '0' || c > '9' || line > 100000000) return std::nullopt;
    line = line * 10 + (c - '0');
  }
  return Diagnostic{text.substr(0, open), line, 0};
}

// The caret column NVRTC prints under the quoted source line, if any: the quoted line and
// the caret line follow the diagnostic, both indented by two spaces.
std::optional<size_t> caret_column(const std::vector<std::string_view>& log, size_t index) {
  for (size_t i = index + 1; i < log.size() && i <= index + 2; ++i) {
    std::string_view l = log[i];
    size_t caret = l.find('^');
    if (caret == std::string_view::npos) continue;
    if (l.find_first_not_of(' ') != caret || l.find_first_not_of(" ^") != std::string_view::npos)
      continue;
    return caret >= 2 ? caret - 2 : 0;
  }
  return std::nullopt;
}

// "file:line" from the nearest `// @ file:line` marker at or above `line` (1-based).
std::optional<std::string> dsl_location(const std::vector<std::string_view>& lines, int line) {
  for (int i = std::min<int>(line, static_cast<int>(lines.size())) - 1; i >= 0; --i) {
    std::string_view l = lines[i];
    size_t c = l.find("// @");
    if (c == std::string_view::npos) continue;
    std::string_view loc = l.substr(c + 4);
    while (!loc.empty() && (loc.front() == ' ' || loc.front() == '\t')) loc.remove_prefix(1);
    while (!loc.empty() && (loc.back() == ' ' || loc.back() == '\t')) loc.remove_suffix(1);
    size_t colon = loc.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == loc.size()) continue;
    if (loc.find_first_not_of("0123456789", colon + 1) != std::string_view::npos) continue;
    return std::string(loc);
  }
  return std::nullopt;
}

std::string summarize(std::string_view log) {
  // The first error line is the most useful one-line summary.
  for (std::string_view l : split_lines(log)) {
    if (parse_error_line(l)) return std::string(l);
  }
  return "";
}

std::string arch_number(const std::string& arch) {
  if (arch.starts_with("sm_")) return arch.substr(3);
  if (arch.starts_with("compute_")) return arch.substr(8);
  throw Error(fmt::format("unknown CUDA architecture '{}' (expected sm_XX[a] or compute_XX[a])",
                          arch));
}

struct Compilation {
  Program program;
  std::string log;
};

void compile_once(Compilation& c, std::string_view source, const std::string& name,
                  const std::string& target, const CompileOptions& options) {
  std::vector<const char*> header_sources, header_names;
  for (const auto& [n, contents] : options.headers) {
    header_names.push_back(n.c_str());
    header_sources.push_back(contents.c_str());
  }
  std::string src(source);  // NVRTC wants a NUL-terminated string
  check_nvrtc(nvrtcCreateProgram(&c.program.prog, src.c_str(), name.c_str(),
                                 static_cast<int>(header_sources.size()), header_sources.data(),
                                 header_names.data()),
              "nvrtcCreateProgram");
  std::vector<std::string> opts;
  bool has_std = std::any_of(options.extra_options.begin(), options.extra_options.end(),
                             [](const std::string& o) {
                               return o.starts_with("-std=") || o.starts_with("--std=") ||
                                      o == "-std" || o == "--std";
                             });
  if (!has_std) opts.push_back("-std=c++20");
  opts.push_back("--gpu-architecture=" + target);
  opts.push_back("-default-device");
  opts.push_back("-lineinfo");
  for (const auto& o : options.extra_options) opts.push_back(o);
  std::vector<const char*> argv;
  for (const auto& o : opts) argv.push_back(o.c_str());

  nvrtcResult r = nvrtcCompileProgram(c.program.prog, static_cast<int>(argv.size()), argv.data());
  size_t log_size = 0;
  if (nvrtcGetProgramLogSize(c.program.prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    c.log.resize(log_size);
    nvrtcGetProgramLog(c.program.prog, c.log.data());
    c.log.resize(log_size - 1);  // drop the terminating NUL
  }
  if (r == NVRTC_SUCCESS) return;
  if (r == NVRTC_ERROR_COMPILATION) {
    std::string first = summarize(c.log);
    std::string message =
        fmt::format("CUDA compilation of {} for {} failed{}{}\n\n{}", name, target,
                    first.empty() ? "" : ": ", first,
                    format_compile_error(c.log, source, name, options.headers));
    throw CompileError(message, c.log, std::string(source));
  }
  std::string options_text;
  for (const auto& o : opts) options_text += " " + o;
  throw CompileError(fmt::format("NVRTC could not compile {} ({}) with options{}{}{}", name,
                                 nvrtcGetErrorString(r), options_text,
                                 c.log.empty() ? "" : "\n", c.log),
                     c.log, std::string(source));
}

std::string get_ptx(Program& p) {
  size_t size = 0;
  check_nvrtc(nvrtcGetPTXSize(p.prog, &size), "nvrtcGetPTXSize");
  if (size <= 1) return "";
  std::string ptx(size, '\0');
  check_nvrtc(nvrtcGetPTX(p.prog, ptx.data()), "nvrtcGetPTX");
  ptx.resize(size - 1);
  return ptx;
}

std::vector<char> get_cubin(Program& p) {
  size_t size = 0;
  check_nvrtc(nvrtcGetCUBINSize(p.prog, &size), "nvrtcGetCUBINSize");
  std::vector<char> cubin(size);
  if (size > 0) check_nvrtc(nvrtcGetCUBIN(p.prog, cubin.data()), "nvrtcGetCUBIN");
  return cubin;
}

}  // namespace

std::string format_compile_error(std::string_view log, std::string_view source,
                                 std::string_view program_name,
                                 const std::vector<std::pair<std::string, std::string>>& headers) {
  std::vector<std::string_view> log_lines = split_lines(log);
  std::vector<Diagnostic> errors;
  for (size_t i = 0; i < log_lines.size(); ++i) {
    if (auto d = parse_error_line(log_lines[i])) {
      d->log_index = i;
      errors.push_back(*d);
    }
  }
  if (errors.empty()) return std::string(log);

  std::vector<std::string_view> source_lines = split_lines(source);
  std::string out;
  for (const Diagnostic& e : errors) {
    if (!out.empty()) out += "\n";
    out += log_lines[e.log_index];
    out += "\n";
    // Which text the error refers to.
    const std::vector<std::string_view>* lines = nullptr;
    std::vector<std::string_view> header_lines;
    auto header = std::find_if(headers.begin(), headers.end(),
                               [&](const auto& h) { return h.first == e.file; });
    if (header != headers.end()) {
      header_lines = split_lines(header->second);
      lines = &header_lines;
    } else if (program_name.empty() || e.file == program_name) {
      lines = &source_lines;
    }
    if (!lines || e.line < 1 || e.line > static_cast<int>(lines->size())) continue;
    int first = std::max(1, e.line - 3);
    int last = std::min(static_cast<int>(lines->size()), e.line + 3);
    int width = static_cast<int>(std::to_string(last).size());
    std::optional<size_t> caret = caret_column(log_lines, e.log_index);
    for (int n = first; n <= last; ++n) {
      out += fmt::format("  {} {:>{}} | {}\n", n == e.line ? '>' : ' ', n, width, (*lines)[n - 1]);
      if (n == e.line && caret) {
        out += fmt::format("    {:>{}} | {}^\n", "", width, std::string(*caret, ' '));
      }
    }
    if (auto loc = dsl_location(*lines, e.line)) {
      out += fmt::format("  generated from your kernel at {}\n", *loc);
    }
  }
  return out;
}

CompileResult compile_cuda(std::string_view source, std::string_view program_name,
                           const CompileOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  std::string number = arch_number(options.arch);
  std::string name(program_name.empty() ? std::string_view("tilejit_kernel.cu") : program_name);
  CompileResult result;
  if (!options.want_ptx && !options.want_cubin) {
    throw Error("compile_cuda: neither PTX nor CUBIN requested");
  }
  // A CUBIN needs a real architecture; PTX comes with it from NVRTC 12+.
  std::string target = options.want_cubin ? "sm_" + number : options.arch;
  Compilation c;
  compile_once(c, source, name, target, options);
  result.log = c.log;
  if (options.want_cubin) {
    result.cubin = get_cubin(c.program);
    if (result.cubin.empty()) throw Error("NVRTC produced no CUBIN for " + target);
  }
  if (options.want_ptx) {
    result.ptx = get_ptx(c.program);
    if (result.ptx.empty()) {
      Compilation again;
      compile_once(again, source, name, "compute_" + number, options);
      result.ptx = get_ptx(again.program);
    }
  }
  result.milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

int nvrtc_version() {
  int major = 0, minor = 0;
  check_nvrtc(nvrtcVersion(&major, &minor), "nvrtcVersion");
  return major * 1000 + minor * 10;
}

std::vector<int> nvrtc_supported_archs() {
  int n = 0;
  check_nvrtc(nvrtcGetNumSupportedArchs(&n), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<size_t>(n));
  if (n > 0) check_nvrtc(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  return archs;
}

}  // namespace tj::runtime
