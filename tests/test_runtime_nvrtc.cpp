// NVRTC compilation and compile-error reports (no GPU needed).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/nvrtc.h"

using namespace tj::runtime;

namespace {

constexpr const char* kSaxpy = R"(extern "C" __global__ void tj_test_saxpy(float a, const float* x, const float* y, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;  // @ saxpy_test.cpp:10
  if (i < n) out[i] = a * x[i] + y[i];            // @ saxpy_test.cpp:11
}
)";

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

bool is_elf(const std::vector<char>& bytes) {
  return bytes.size() > 4 && std::memcmp(bytes.data(), "\x7f" "ELF", 4) == 0;
}

}  // namespace

TEST_CASE("nvrtc: compiles a kernel for sm_90a to PTX and CUBIN") {
  CompileOptions opts;  // defaults: sm_90a, PTX and CUBIN
  CompileResult r = compile_cuda(kSaxpy, "saxpy.cu", opts);
  CHECK(contains(r.ptx, ".target sm_90a"));
  CHECK(contains(r.ptx, ".entry tj_test_saxpy"));
  CHECK(is_elf(r.cubin));
  CHECK(r.milliseconds > 0);
}

TEST_CASE("nvrtc: compiles a kernel for sm_80 to PTX and CUBIN") {
  CompileOptions opts;
  opts.arch = "sm_80";
  CompileResult r = compile_cuda(kSaxpy, "saxpy.cu", opts);
  CHECK(contains(r.ptx, ".target sm_80"));
  CHECK(contains(r.ptx, ".entry tj_test_saxpy"));
  CHECK(is_elf(r.cubin));
}

TEST_CASE("nvrtc: PTX only and CUBIN only") {
  CompileOptions opts;
  opts.arch = "compute_90a";
  opts.want_cubin = false;
  CompileResult ptx_only = compile_cuda(kSaxpy, "saxpy.cu", opts);
  CHECK(contains(ptx_only.ptx, ".target sm_90a"));
  CHECK(ptx_only.cubin.empty());

  opts.arch = "sm_90a";
  opts.want_cubin = true;
  opts.want_ptx = false;
  CompileResult cubin_only = compile_cuda(kSaxpy, "saxpy.cu", opts);
  CHECK(cubin_only.ptx.empty());
  CHECK(is_elf(cubin_only.cubin));

  // A CUBIN needs a real architecture: compute_90a is compiled as sm_90a for it.
  opts.arch = "compute_90a";
  opts.want_ptx = true;
  CompileResult both = compile_cuda(kSaxpy, "saxpy.cu", opts);
  CHECK(is_elf(both.cubin));
  CHECK(contains(both.ptx, ".target sm_90a"));
}

TEST_CASE("nvrtc: sm_90a-only instructions need the sm_90a target") {
  const char* src = R"(extern "C" __global__ void tj_test_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
)";
  CompileOptions opts;
  opts.arch = "sm_90a";
  CHECK(is_elf(compile_cuda(src, "fence.cu", opts).cubin));
  opts.arch = "sm_90";
  CHECK_THROWS_AS(compile_cuda(src, "fence.cu", opts), tj::CompileError);
}

TEST_CASE("nvrtc: headers passed by name are includable") {
  CompileOptions opts;
  opts.headers = {{"tj_test_math.cuh", "inline __device__ float tj_twice(float v) { return 2.f * v; }\n"}};
  const char* src = R"(#include "tj_test_math.cuh"
extern "C" __global__ void tj_test_twice(float* x) { x[threadIdx.x] = tj_twice(x[threadIdx.x]); }
)";
  CompileResult r = compile_cuda(src, "twice.cu", opts);
  CHECK(contains(r.ptx, ".entry tj_test_twice"));
}

TEST_CASE("nvrtc: C++20 is the default language standard") {
  const char* src = R"(#if __cplusplus < 202002L
#error "expected C++20"
#endif
template <class T> concept Small = sizeof(T) <= 4;
template <Small T> __device__ T tj_id(T v) { return v; }
extern "C" __global__ void tj_test_concept(int* x) { x[0] = tj_id(x[0]); }
)";
  CHECK_NOTHROW(compile_cuda(src, "concept.cu", {}));
}

TEST_CASE("nvrtc: version and supported architectures") {
  CHECK(nvrtc_version() >= 12000);
  std::vector<int> archs = nvrtc_supported_archs();
  CHECK(std::find(archs.begin(), archs.end(), 90) != archs.end());
  CHECK(std::find(archs.begin(), archs.end(), 80) != archs.end());
}

TEST_CASE("nvrtc: an unknown architecture is an error") {
  CompileOptions opts;
  opts.arch = "hopper";
  CHECK_THROWS_AS(compile_cuda(kSaxpy, "saxpy.cu", opts), tj::Error);
  opts.arch = "sm_1";
  CHECK_THROWS_AS(compile_cuda(kSaxpy, "saxpy.cu", opts), tj::Error);
}

TEST_CASE("nvrtc: a compile error names the generated line and the kernel's source line") {
  const std::string src =
      "extern \"C\" __global__ void tj_test_broken(float* out) {\n"  // 1
      "  int i = threadIdx.x;  // @ attention.cpp:40\n"              // 2
      "  float s = out[i];  // @ attention.cpp:41\n"                 // 3
      "  out[i] = s * undefined_scale;  // @ attention.cpp:42\n"     // 4
      "}\n";
  try {
    compile_cuda(src, "attention_fwd.cu", {});
    FAIL("expected a tj::CompileError");
  } catch (const tj::CompileError& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(contains(msg, "attention_fwd.cu(4): error"));
    CHECK(contains(msg, "undefined_scale"));
    CHECK(contains(msg, "> 4 |   out[i] = s * undefined_scale;"));  // marked source line
    CHECK(contains(msg, "  1 | extern \"C\""));                     // context above
    CHECK(contains(msg, "|                ^\n"));  // caret under "undefined_scale"
    CHECK(contains(msg, "generated from your kernel at attention.cpp:42"));
    CHECK(contains(e.log(), "undefined_scale"));
    CHECK(e.source() == src);
  }
}

TEST_CASE("format_compile_error: context lines, markers, headers") {
  std::string source;
  for (int i = 1; i <= 20; ++i) {
    if (i == 5) source += "  // @ my_kernel.cpp:7\n";
    else if (i == 9) source += "  float bad = oops;\n";
    else source += "  line" + std::to_string(i) + ";\n";
  }
  const std::string header = "inline __device__ float f() {\n  return nope;\n}\n";
  const std::string log =
      "tile.cuh(2): error: identifier \"nope\" is undefined\n"
      "    return nope;\n"
      "           ^\n"
      "\n"
      "kern.cu(9): error: identifier \"oops\" is undefined\n"
      "    float bad = oops;\n"
      "                ^\n"
      "\n"
      "kern.cu(3): warning #177-D: variable \"line3\" was declared but never referenced\n"
      "\n"
      "2 errors detected in the compilation of \"kern.cu\".\n";
  std::string out = format_compile_error(log, source, "kern.cu", {{"tile.cuh", header}});
  INFO(out);
  // The error in the main source: its log line, lines 6..12, line 9 marked, the DSL marker
  // from line 5 (the nearest at or above line 9).
  CHECK(contains(out, "kern.cu(9): error: identifier \"oops\" is undefined\n"));
  CHECK(contains(out, "     6 |   line6;\n"));
  CHECK(contains(out, "  >  9 |   float bad = oops;\n"));
  CHECK(contains(out, "       |               ^\n"));
  CHECK(contains(out, "    12 |   line12;\n"));
  CHECK_FALSE(contains(out, "line5;"));
  CHECK_FALSE(contains(out, "   13 |"));
  CHECK(contains(out, "generated from your kernel at my_kernel.cpp:7"));
  // The error in the header shows the header's lines and no DSL location.
  CHECK(contains(out, "tile.cuh(2): error: identifier \"nope\" is undefined\n"));
  CHECK(contains(out, "  > 2 |   return nope;\n"));
  auto header_block = out.substr(0, out.find("kern.cu(9)"));
  CHECK_FALSE(contains(header_block, "generated from your kernel"));
  // Warnings are not errors.
  CHECK_FALSE(contains(out, "warning #177"));
}

TEST_CASE("format_compile_error: no marker and unparseable logs") {
  std::string out = format_compile_error("k.cu(1): error: expected a \";\"\n", "int x\n", "k.cu");
  CHECK(contains(out, "  > 1 | int x\n"));
  CHECK_FALSE(contains(out, "generated from"));
  // An error line beyond the source shows only the log line.
  out = format_compile_error("k.cu(99): error: something\n", "int x;\n", "k.cu");
  CHECK(out == "k.cu(99): error: something\n");
  // A log without recognizable errors is returned as is.
  CHECK(format_compile_error("nvrtc: internal trouble\n", "int x;\n") ==
        "nvrtc: internal trouble\n");
  // Catastrophic errors count; marker file names may contain colons.
  out = format_compile_error("k.cu(2): catastrophic error: cannot open source file \"x.h\"\n",
                             "// @ C:/src/k.cpp:3\n#include \"x.h\"\n", "k.cu");
  CHECK(contains(out, "generated from your kernel at C:/src/k.cpp:3"));
}
