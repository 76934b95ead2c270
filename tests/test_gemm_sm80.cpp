// The sm_80 / sm_89 GEMM lowering (codegen/lower_gemm_sm80.cpp, codegen/device/ampere_gemm.cuh):
// which kernels and targets it takes, the NVRTC PTX (mma.sync, ldmatrix, cp.async), ptxas
// resources, the config errors, the launch-time layout check; on a GPU, the sm_80 and sm_89
// kernels (loaded as PTX on a newer GPU, LaunchOptions::arch) against float64 and the CPU
// reference executor, with ragged M, N, K, scales per row / column, bias and poisoned outputs.
//
// TJ_GEMM_DUMP_DIR=dir writes the generated sources, PTX and CUBINs of the ptxas test there.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "dsl/config.h"
#include "autotune/space.h"
#include "codegen/cuda_emitter.h"
#include "codegen/device_library.h"
#include "codegen/lower_gemm_sm80.h"
#include "codegen/target.h"
#include "dsl/kernel.h"
#include "gpu.h"
#include "gemm_testing.h"
#include "nvrtc_testing.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/memory.h"
#include "runtime/nvrtc.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;
using codegen::Target;

using namespace tj_test;

namespace {

std::vector<ArgSpec> gemm_specs(DType t, int64_t M, int64_t N, int64_t K, DType out = DType::f32) {
  return {T(t, {M, K}), T(t, {N, K}), T(out, {M, N})};
}

using tj_test::nvrtc;
using tj_test::ptxas_info;
using tj_test::PtxasInfo;

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

std::string lowering_of(const ir::Function& f, const char* config, const char* arch) {
  return codegen::generate_cuda(f, cfg(config), Target::parse(arch)).lowering;
}

// The message of the tj::Error that generating `f` for `arch` with `config` throws ("" if none).
std::string config_error(const ir::Function& f, const char* config, const char* arch) {
  try {
    codegen::generate_cuda(f, cfg(config), Target::parse(arch));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- which kernels and targets ---------------------------------------------------------------------

TEST_CASE("sm80 gemm: takes the GEMM pattern on sm_80, sm_89 and sm_90, sm_90a stays with wgmma") {
  const char* c = R"({"blocks":{"m":64,"n":64,"k":64}})";
  const ir::Function bf16 = kernels::gemm().trace(gemm_specs(DType::bf16, 256, 192, 128));
  const ir::Function fp8 = kernels::fp8_gemm().trace(fp8_specs({256, 192, 128, 256, 192, 192, DType::f32}));
  for (const char* arch : {"sm_80", "sm_89", "sm_90"}) {
    CAPTURE(arch);
    CHECK(lowering_of(bf16, c, arch) == "sm80_gemm");
    CHECK(lowering_of(fp8, c, arch) == (std::string(arch) == "sm_80" ? "simt" : "sm80_gemm"));
  }
  CHECK(lowering_of(bf16, c, "sm_90a") == "sm90_gemm");
  CHECK(lowering_of(fp8, c, "sm_90a") == "sm90_gemm");
  // the lowering entry point itself declines sm_90a and fp8 on sm_80
  CHECK_FALSE(codegen::lower_gemm_sm80(bf16, cfg(c), Target::parse("sm_90a")).has_value());
  CHECK_FALSE(codegen::lower_gemm_sm80(fp8, cfg(c), Target::parse("sm_80")).has_value());
  CHECK(codegen::lower_gemm_sm80(fp8, cfg(c), Target::parse("sm_89")).has_value());
  // "lowering": 0 leaves the nest to the generic lowering (mma.sync), "mma": 0 to SIMT
  CHECK(lowering_of(bf16, R"({"blocks":{"m":64,"n":64,"k":64},"knobs":{"lowering":0}})", "sm_80") == "tensor cores (mma.sync)");
  CHECK(lowering_of(bf16, R"({"blocks":{"m":64,"n":64,"k":64},"knobs":{"lowering":0,"mma":0}})", "sm_80") == "simt");
  // Static rows that cannot start at 16-byte multiples (K = 100 bf16: 200 bytes; fp8: 100 bytes):
  // not this pattern; the generic lowering copies such rows element by element.
  CHECK(lowering_of(kernels::gemm().trace(gemm_specs(DType::bf16, 64, 64, 100)), c, "sm_80") == "tensor cores (mma.sync)");
  CHECK(lowering_of(kernels::fp8_gemm().trace(fp8_specs({64, 64, 100})), c, "sm_89") == "tensor cores (mma.sync)");
  // f32 operands and non-GEMMs are not this pattern
  CHECK(lowering_of(kernels::gemm().trace(gemm_specs(DType::f32, 64, 64, 64)), c, "sm_80") == "simt");
  CHECK(lowering_of(kernels::softmax().trace({T(DType::f32, {8, 100}), T(DType::f32, {8, 100})}), c, "sm_80") == "simt");
}

TEST_CASE("sm80 gemm: NVRTC PTX has mma.sync (e4m3 on sm_89, bf16/f16 on sm_80 and sm_90), ldmatrix and cp.async") {
  struct V {
    const char* what;
    const Kernel* kernel;
    std::vector<ArgSpec> specs;
    const char* arch;
    const char* mma;   // regex
  };
  GemmCase e5m2{200, 136, 256, 200, 136, 136, DType::f32};
  e5m2.tb = DType::e5m2;
  const std::vector<V> variants = {
      {"fp8_gemm e4m3, sm_89", &kernels::fp8_gemm(), fp8_specs({1000, 520, 784, 1000, 520, 520, DType::bf16}), "sm_89",
       R"(mma\.sync\.aligned\.m16n8k32\.row\.col\.f32\.e4m3\.e4m3\.f32)"},
      {"fp8_gemm e4m3 x e5m2, sm_89", &kernels::fp8_gemm(), fp8_specs(e5m2), "sm_89",
       R"(mma\.sync\.aligned\.m16n8k32\.row\.col\.f32\.e4m3\.e5m2\.f32)"},
      {"gemm bf16, sm_80", &kernels::gemm(), gemm_specs(DType::bf16, 333, 200, 88), "sm_80",
       R"(mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32)"},
      {"gemm f16, sm_80", &kernels::gemm(), gemm_specs(DType::f16, 333, 200, 88, DType::f16), "sm_80",
       R"(mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32)"},
      {"gemm bf16, sm_90", &kernels::gemm(), gemm_specs(DType::bf16, 333, 200, 88, DType::bf16), "sm_90",
       R"(mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32)"},
  };
  for (const V& v : variants) {
    CAPTURE(v.what);
    const ir::Function f = v.kernel->trace(v.specs);
    CompileRequest req;
    req.arch = v.arch;
    req.want_ptx = true;
    req.load = false;
    const CompiledKernel& ck = compile(*v.kernel, v.specs, default_config(f), req);
    INFO(ck.generated.source);
    CHECK(ck.generated.lowering == "sm80_gemm");
    CHECK(ck.generated.threads == 128);   // the default config: 4 warps
    CHECK(ck.generated.tma.empty());
    CHECK_FALSE(ck.generated.persistent);
    CHECK(ck.generated.aligned16_params == std::vector<int>{0, 1});
    CHECK(std::regex_search(ck.ptx, std::regex(v.mma)));
    CHECK(contains(ck.ptx, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"));
    CHECK(contains(ck.ptx, "cp.async.cg.shared.global"));
    CHECK(contains(ck.ptx, "cp.async.wait_group"));
    CHECK_FALSE(contains(ck.ptx, "wgmma"));
    CHECK_FALSE(ck.cubin.empty());
    // Only the tile library and the main loop are included; each is a device-library file.
    CHECK(contains(ck.generated.source, "#include \"tile.cuh\"\n#include \"ampere_gemm.cuh\"\n"));
    for (const auto& h : ck.generated.device_headers) {
      CAPTURE(h);
      CHECK(std::any_of(codegen::device_library().begin(), codegen::device_library().end(),
                        [&](const auto& e) { return e.name == h; }));
    }
    // Every epilogue statement points at kernels/gemm.cpp.
    CHECK(contains(ck.generated.source, "gemm.cpp:"));
  }
}

TEST_CASE("sm80 gemm: fp8_gemm for sm_80 takes the SIMT path (no fp8 mma.sync there) and compiles") {
  const ir::Function f = kernels::fp8_gemm().trace(fp8_specs({100, 72, 48, 100, 72, 72, DType::f32}));
  const auto g = codegen::generate_cuda(f, cfg(R"({"blocks":{"m":32,"n":32,"k":32}})"), Target::parse("sm_80"));
  CHECK(g.lowering == "simt");
  CHECK(g.aligned16_params.empty());
  runtime::CompileResult r;
  REQUIRE_NOTHROW(r = nvrtc(g, "sm_80"));
  CHECK_FALSE(contains(r.ptx, "mma.sync"));
  CHECK_FALSE(contains(r.ptx, "ldmatrix"));
}

TEST_CASE("sm80 gemm: the default and larger configs assemble without spills (ptxas -v)") {
  struct V {
    const char* name;
    bool fp8;
    const char* arch;
    const char* config;
  };
  const std::vector<V> variants = {
      {"sm80_bf16_default", false, "sm_80", R"({"blocks":{"m":64,"n":64,"k":64}})"},
      {"sm89_fp8_default", true, "sm_89", R"({"blocks":{"m":64,"n":64,"k":64}})"},
      {"sm90_bf16_default", false, "sm_90", R"({"blocks":{"m":64,"n":64,"k":64}})"},
      // Hopper emulates fp8 mma.sync with f16 tensor cores (more registers): what the H200 runs.
      {"sm90_fp8_default", true, "sm_90", R"({"blocks":{"m":64,"n":64,"k":64}})"},
      {"sm80_bf16_128x128x32_s4", false, "sm_80", R"({"blocks":{"m":128,"n":128,"k":32},"num_stages":4})"},
      {"sm80_bf16_128x256x32_w8", false, "sm_80", R"({"blocks":{"m":128,"n":256,"k":32},"num_stages":3,"num_warps":8})"},
      {"sm89_fp8_128x128x64_s3", true, "sm_89", R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":3})"},
      {"sm89_fp8_128x256x128_w8", true, "sm_89", R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":2,"num_warps":8})"},
      {"sm80_bf16_16x16x16_w1_s1", false, "sm_80", R"({"blocks":{"m":16,"n":16,"k":16},"num_stages":1,"num_warps":1})"},
  };
  for (const V& v : variants) {
    CAPTURE(v.name);
    const ir::Function f = v.fp8 ? kernels::fp8_gemm().trace(fp8_specs({4096, 4096, 4096, 4096, 4096, 4096, DType::bf16}))
                                  : kernels::gemm().trace(gemm_specs(DType::bf16, 4096, 4096, 4096, DType::bf16));
    const auto g = codegen::generate_cuda(f, cfg(v.config), Target::parse(v.arch));
    REQUIRE(g.lowering == "sm80_gemm");
    runtime::CompileResult r;
    REQUIRE_NOTHROW(r = nvrtc(g, v.arch, true, true));
    if (const char* dir = std::getenv("TJ_GEMM_DUMP_DIR")) {
      std::ofstream(fmt::format("{}/{}.cu", dir, v.name)) << g.source;
      std::ofstream(fmt::format("{}/{}.ptx", dir, v.name)) << r.ptx;
      std::ofstream(fmt::format("{}/{}.cubin", dir, v.name), std::ios::binary)
          .write(r.cubin.data(), static_cast<std::streamsize>(r.cubin.size()));
    }
    const PtxasInfo info = ptxas_info(r.log);
    MESSAGE(fmt::format("{}: {} registers, spills {}/{} bytes, {} bytes of shared memory, {} threads", v.name, info.registers,
                        info.spill_stores, info.spill_loads, g.dynamic_smem_bytes, g.threads));
    INFO(r.log);
    CHECK(info.registers > 0);
    CHECK(info.spill_stores == 0);
    CHECK(info.spill_loads == 0);
    // The K loop stays a loop however K is known: one stage's mma.sync per warp tile and k step.
    CHECK(count(r.ptx, "mma.sync.aligned") <= 256);
  }
}

TEST_CASE("sm80 gemm: configs the lowering cannot use are rejected naming the limit") {
  const ir::Function bf16 = kernels::gemm().trace(gemm_specs(DType::bf16, 1024, 1024, 1024));
  const ir::Function fp8 = kernels::fp8_gemm().trace(fp8_specs({1024, 1024, 1024}));
  auto err = [&](const char* json, const char* arch = "sm_80", bool use_fp8 = false) {
    return config_error(use_fp8 ? fp8 : bf16, json, arch);
  };
  CHECK(contains(err(R"({"blocks":{"m":64,"n":64,"k":64},"num_warps":3})"), "num_warps must be 1, 2, 4, 8 or 16, got 3"));
  CHECK(contains(err(R"({"blocks":{"m":64,"n":64,"k":64},"num_warps":32})"), "num_warps must be 1, 2, 4, 8 or 16, got 32"));
  CHECK(contains(err(R"({"blocks":{"m":64,"n":64,"k":8}})"), "block 'k' x 2 bytes must be 32, 64, 128 or 256 bytes"));
  CHECK(contains(err(R"({"blocks":{"m":64,"n":64,"k":512}})"), "block 'k' x 2 bytes must be 32, 64, 128 or 256 bytes"));
  CHECK(contains(err(R"({"blocks":{"m":64,"n":64,"k":16}})", "sm_89", true), "block 'k' x 1 bytes must be 32"));
  CHECK(contains(err(R"({"blocks":{"m":16,"n":16,"k":64},"num_warps":8})"),
                 "block 'm' = 16 x block 'n' = 16 cannot be split over 8 warps"));
  CHECK(contains(err(R"({"blocks":{"m":256,"n":256,"k":32}})"), "512 accumulator registers per thread (128 x 128 per warp)"));
  CHECK(contains(err(R"({"blocks":{"m":256,"n":256,"k":32},"num_warps":16})"), "exceed the 64 a thread can hold with 16 warps"));
  CHECK(contains(err(R"({"blocks":{"m":64,"n":64,"k":64},"knobs":{"raster_group":0}})"), "raster_group must be >= 1"));
  {
    Config zero_stages = cfg(R"({"blocks":{"m":64,"n":64,"k":64}})");   // JSON configs cannot say 0
    zero_stages.num_stages = 0;
    CHECK_THROWS_WITH_AS(codegen::generate_cuda(bf16, zero_stages, Target::parse("sm_80")),
                         doctest::Contains("num_stages must be >= 1"), Error);
  }
  // shared memory: Ada's 99 KB per block is less than A100's 163 KB
  CHECK(contains(err(R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":2})", "sm_89"),
                 "need 131072 bytes of shared memory, more than the 101376 bytes a block can use on sm_89"));
  CHECK(err(R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":2})", "sm_80").empty());
  CHECK(contains(err(R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":3})", "sm_80"), "bytes a block can use on sm_80"));
  // every message names the lowering, the kernel and the way out
  const std::string e = err(R"({"blocks":{"m":64,"n":64,"k":64},"num_warps":3})", "sm_90");
  CHECK(contains(e, "kernel 'gemm'"));
  CHECK(contains(e, "the sm_90 GEMM lowering (mma.sync + cp.async)"));
  CHECK(contains(e, "\"lowering\": 0"));
  // and good ones pass
  CHECK(err(R"({"blocks":{"m":16,"n":16,"k":16},"num_stages":1,"num_warps":1})").empty());
  CHECK(err(R"({"blocks":{"m":128,"n":256,"k":32},"num_stages":4,"num_warps":8})").empty());
  CHECK(err(R"({"blocks":{"m":64,"n":256,"k":128},"num_stages":2,"num_warps":8})", "sm_89", true).empty());
}

TEST_CASE("sm80 gemm: the shared epilogue runs at each value's rate, the sm_90a epilogue code is the same") {
  const ir::Function f = kernels::fp8_gemm().trace(fp8_specs({512, 512, 512, 512, 512, 512, DType::f32}));
  const Config c = cfg(R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":3,"knobs":{"staged_store":0}})");
  const auto g = codegen::generate_cuda(f, c, Target::parse("sm_89"));
  INFO(g.source);
  REQUIRE(g.lowering == "sm80_gemm");
  CHECK(std::regex_search(g.source, std::regex(R"(v\d+\[tj_mb\]\[tj_h\] = tj::dev::load_scalar<tj::dev::f32>\(scale_a\.data)")));
  CHECK(std::regex_search(g.source, std::regex(R"(v\d+\[tj_e\] = tj::dev::load_scalar<tj::dev::f32>\(scale_b\.data)")));
  CHECK(std::regex_search(g.source, std::regex(R"(v\d+\[tj_e\] = tj::dev::load_scalar<tj::dev::f32>\(bias\.data)")));
  CHECK(contains(g.source, "const long long tj_row = tj_row0 + 16 * tj_mb + 8 * tj_h;"));
  CHECK(contains(g.source, "gemm_store_pair<tj::dev::f32>"));
  CHECK_FALSE(contains(g.source, "__syncthreads"));   // no shared-memory round trip in the epilogue
  // The same kernel on sm_90a with direct stores: from the output row pointers to the store, the
  // epilogue is the same text but for numbers (row-block stride and counts, value ids, DSL lines)
  // and indentation.
  const auto h = codegen::generate_cuda(
      f, cfg(R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":4,"knobs":{"staged_store":0}})"), Target::parse("sm_90a"));
  REQUIRE(h.lowering == "sm90_gemm");
  auto epilogue = [](const std::string& src) {
    const size_t begin = src.find("* tj_cp[");
    const size_t end = src.find("gemm_store_pair", begin);
    std::string e = src.substr(begin, end - begin);
    e = std::regex_replace(e, std::regex(R"(\d+)"), "N");
    return std::regex_replace(e, std::regex("\n +"), "\n");
  };
  CHECK(epilogue(g.source) == epilogue(h.source));
  // By default both stage each warp's rows in shared memory (sm_80: in the stages' memory, after a
  // barrier; the warp's rows are its own m16 tiles) and store whole 16-byte row pieces.
  const auto gs = codegen::generate_cuda(f, cfg(R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":3})"), Target::parse("sm_89"));
  CHECK(contains(gs.source, "if (tj_stage) __syncthreads();"));
  CHECK(std::regex_search(gs.source, std::regex(R"(gemm_flush_chunk<tj::dev::f32, \d+, 16>)")));
  CHECK(gs.dynamic_smem_bytes == g.dynamic_smem_bytes);   // the stages hold the buffers
  CHECK(contains(nvrtc(gs, "sm_89").ptx, "st.global.v4"));
  CHECK(contains(h.source, "const long long tj_row = tj_row0 + 64 * tj_mb + 8 * tj_h;"));

  // A richer epilogue (where, arange comparisons, a residual [M, N] load, a runtime scalar) with
  // dynamic shapes compiles for sm_80.
  static const Kernel fancy = kernel("gemm_fancy_sm80", {"a", "b", "d", "c", "alpha"}, [](In a, In b, In d, Out c, Scalar alpha) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(0);
    for (auto m : tile(M, block("m")))
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        for (auto k : tile(K, block("k"))) acc = dot(a.load(m, k), b.load(n, k).T(), acc);
        Tile lower = n.index().row() < m.index().col();
        c.store(m, n, where(lower, acc * alpha, maximum(acc, 0.0) + d.load(m, n)).to(c.dtype()));
      }
  });
  const auto fg = codegen::generate_cuda(fancy.trace({T(DType::f16, {-1, -1}), T(DType::f16, {-1, -1}), T(DType::f32, {-1, -1}),
                                                      T(DType::f16, {-1, -1}), RuntimeScalar{0.5f}}),
                                         cfg(R"({"blocks":{"m":64,"n":128,"k":32},"num_stages":3,"num_warps":8})"),
                                         Target::parse("sm_80"));
  CHECK(fg.lowering == "sm80_gemm");
  INFO(fg.source);
  REQUIRE_NOTHROW(nvrtc(fg, "sm_80"));
}

TEST_CASE("sm80 gemm: the knob provider declares raster_group where the lowering applies") {
  const ir::Function bf16 = kernels::gemm().trace(gemm_specs(DType::bf16, 1024, 1024, 1024));
  const ir::Function fp8 = kernels::fp8_gemm().trace(fp8_specs({1024, 1024, 1024}));
  auto has = [](const ir::Function& f, const char* arch, const char* knob) {
    for (const auto& k : autotune::registered_knobs(f, arch))
      if (k.name == knob) return true;
    return false;
  };
  CHECK(has(bf16, "sm_80", "raster_group"));
  CHECK(has(fp8, "sm_89", "raster_group"));
  CHECK(has(bf16, "sm_90", "raster_group"));
  CHECK_FALSE(has(fp8, "sm_80", "raster_group"));   // SIMT there
  CHECK_FALSE(has(bf16, "sm_80", "promote"));        // the wgmma lowering's knobs stay on sm_90a
  CHECK_FALSE(has(kernels::softmax().trace({T(DType::f32, {8, 100}), T(DType::f32, {8, 100})}), "sm_80", "raster_group"));
  CHECK(autotune::registered_knobs(bf16, "sm_75").empty());   // an unknown arch: nothing, no throw
}

TEST_CASE("sm80 gemm: check_aligned16 names the tensor and what cp.async needs") {
  alignas(16) static unsigned char storage[4096];
  TensorView t;
  t.data = storage;
  t.dtype = DType::bf16;
  t.shape = {64, 40};
  t.device = Device::cuda;
  CHECK_NOTHROW(check_aligned16("gemm", "a", t));   // 80-byte rows
  t.shape = {64, 36};                               // 72-byte rows
  CHECK_THROWS_WITH_AS(check_aligned16("gemm", "a", t),
                       doctest::Contains("kernel 'gemm': tensor 'a'"), Error);
  CHECK_THROWS_WITH_AS(check_aligned16("gemm", "a", t),
                       doctest::Contains("dim 0 has a stride of 72 bytes, not a multiple of 16 (pad the last dim to a multiple "
                                         "of 8 elements)"),
                       Error);
  t.strides = {40, 1};                              // the same rows padded to 80 bytes: fine
  CHECK_NOTHROW(check_aligned16("gemm", "a", t));
  t.shape = {1, 36};                                // a single row: its stride does not matter
  t.strides = {36, 1};
  CHECK_NOTHROW(check_aligned16("gemm", "a", t));
  t.shape = {64, 40};
  t.strides = {80, 2};
  CHECK_THROWS_WITH_AS(check_aligned16("gemm", "a", t), doctest::Contains("the last dim must be contiguous"), Error);
  t.strides = {};
  t.data = storage + 2;
  CHECK_THROWS_WITH_AS(check_aligned16("gemm", "a", t), doctest::Contains("the base address must be 16-byte aligned"), Error);
}

// ---- on the GPU ---------------------------------------------------------------------------------------

namespace {

// A device matrix viewed as [rows, cols] with a row pitch of `pitch` elements inside a buffer
// whose padding (and 64 elements after the end) is NaN: inputs whose padding must not be read,
// outputs whose padding must not be written.
struct PaddedMatrix {
  DType dtype;
  int64_t rows, cols, pitch;
  runtime::DeviceBuffer buffer;

  PaddedMatrix(DType t, int64_t r, int64_t c, int64_t p)
      : dtype(t), rows(r), cols(c), pitch(p), buffer(static_cast<size_t>((r * p + 64) * size_bytes(t))) {
    buffer.memset(0xFF);   // NaN in every float type
  }
  // An input with the values of `h` ([rows, cols], row-major).
  static PaddedMatrix from_host(const HostTensor& h, int64_t pitch) {
    PaddedMatrix m(h.dtype(), h.shape()[0], h.shape()[1], pitch);
    HostTensor padded(h.dtype(), {static_cast<int64_t>(m.buffer.size() / size_bytes(h.dtype()))});
    padded.fill_bytes(0xFF);
    for (int64_t i = 0; i < m.rows; ++i)
      for (int64_t j = 0; j < m.cols; ++j) padded.set(i * pitch + j, h.at(i * m.cols + j));
    m.buffer.copy_from_host(padded.data(), m.buffer.size());
    return m;
  }
  TensorView view() const {
    TensorView v;
    v.data = reinterpret_cast<void*>(buffer.ptr());
    v.dtype = dtype;
    v.shape = {rows, cols};
    v.strides = {pitch, 1};
    v.device = Device::cuda;
    return v;
  }
  // The [rows, cols] values, and whether everything else is still NaN.
  std::vector<double> values(bool& padding_intact) const {
    HostTensor raw(dtype, {static_cast<int64_t>(buffer.size() / size_bytes(dtype))});
    buffer.copy_to_host(raw.data(), buffer.size());
    std::vector<double> out(static_cast<size_t>(rows * cols));
    padding_intact = true;
    for (int64_t i = 0; i < raw.numel(); ++i) {
      const int64_t r = i / pitch, c = i % pitch;
      if (r < rows && c < cols) out[static_cast<size_t>(r * cols + c)] = raw.at(i);
      else padding_intact &= std::isnan(raw.at(i));
    }
    return out;
  }
};

// N(0, 1) values, or uniform in [lo, hi) when lo < hi, rounded to `t`.
HostTensor random_tensor(DType t, std::vector<int64_t> shape, std::mt19937& rng, double lo = 0, double hi = 0) {
  HostTensor h(t, std::move(shape));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(lo, hi);
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double v = lo < hi ? uniform(rng) : normal(rng);
    h.set(i, v);
    if (h.at(i) == 0.0) h.set(i, v < 0 ? -0.25 : 0.25);   // never zeros (tiny values round to 0 in fp8)
  }
  return h;
}

// float64 C = (A . B^T) * sa * sb + bias from the (already rounded) inputs; sa: [1] or [M],
// sb: [1] or [N], bias: [0] or [N]; empty tensors stand for 1 / 0.
std::vector<double> gemm_f64(const HostTensor& a, const HostTensor& b, const HostTensor* sa = nullptr,
                             const HostTensor* sb = nullptr, const HostTensor* bias = nullptr) {
  const int64_t M = a.shape()[0], K = a.shape()[1], N = b.shape()[0];
  const auto av = a.values(), bv = b.values();
  const std::vector<double> sav = sa ? sa->values() : std::vector<double>{1.0};
  const std::vector<double> sbv = sb ? sb->values() : std::vector<double>{1.0};
  const std::vector<double> biv = bias ? bias->values() : std::vector<double>{};
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += av[i * K + k] * bv[j * K + k];
      const double s = (sav.size() == 1 ? sav[0] : sav[i]) * (sbv.size() == 1 ? sbv[0] : sbv[j]);
      c[i * N + j] = acc * s + (biv.empty() ? 0.0 : biv[j]);
    }
  return c;
}

LaunchOptions on_arch(const char* arch, const Config& config, bool dynamic = false) {
  LaunchOptions o;
  o.config = config;
  o.arch = arch;
  o.dynamic_shapes = dynamic;
  return o;
}

// Checks that `k` with `args` for `arch` takes the mma.sync lowering and, on a GPU of a newer
// major version than the arch, was loaded from PTX.
void check_compiled_for(const Kernel& k, const std::vector<Arg>& args, const LaunchOptions& o) {
  CompileRequest req;
  req.arch = o.arch;
  const CompiledKernel& ck = compile(k, specs_for(k, args, o.dynamic_shapes), *o.config, req);
  CHECK(ck.generated.lowering == "sm80_gemm");
  CHECK(ck.function != nullptr);
  const auto& dev = runtime::current_device();
  const bool older_major = Target::parse(o.arch).sm() / 10 < dev.cc_major;
  if (older_major) CHECK_FALSE(ck.ptx.empty());
}

}  // namespace

TEST_CASE("gpu: sm80 bf16 and f16 gemm for sm_80 (and sm_90) on this GPU match float64 (ragged M, N, K, configs)") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(81);
  const std::vector<const char*> configs = {
      R"({"blocks":{"m":64,"n":64,"k":64}})",   // the default config
      R"({"blocks":{"m":128,"n":128,"k":32},"num_stages":4})",
      R"({"blocks":{"m":128,"n":256,"k":32},"num_stages":3,"num_warps":8})",
      R"({"blocks":{"m":64,"n":128,"k":64},"num_stages":3,"num_warps":8,"knobs":{"raster_group":2}})",
      R"({"blocks":{"m":32,"n":32,"k":16},"num_stages":2,"num_warps":2})",
      R"({"blocks":{"m":16,"n":16,"k":16},"num_stages":1,"num_warps":1})",
      R"({"blocks":{"m":128,"n":64,"k":128},"num_stages":2,"num_warps":4})",
  };
  struct Shape {
    int64_t M, N, K;
  };
  const std::vector<Shape> shapes = {{333, 200, 88}, {256, 128, 1000}, {1, 1, 8}, {130, 70, 24}};
  for (DType t : {DType::bf16, DType::f16}) {
    for (const char* c : configs) {
      for (const Shape& s : shapes) {
        CAPTURE(name(t));
        CAPTURE(c);
        CAPTURE(fmt::format("{}x{}x{}", s.M, s.N, s.K));
        HostTensor a = random_tensor(t, {s.M, s.K}, rng), b = random_tensor(t, {s.N, s.K}, rng);
        DeviceTensor da = DeviceTensor::from_host(a), db = DeviceTensor::from_host(b);
        PaddedMatrix out(DType::f32, s.M, s.N, s.N + 6);
        // Static shapes for the default config; one dynamic-shape kernel per other config.
        const LaunchOptions o = on_arch("sm_80", cfg(c), /*dynamic=*/c != configs[0]);
        const std::vector<Arg> args = {da.view(), db.view(), out.view()};
        check_compiled_for(kernels::gemm(), args, o);
        launch(kernels::gemm(), args, o);
        runtime::synchronize();
        bool padding_intact = false;
        const Errors e = errors(out.values(padding_intact), gemm_f64(a, b));
        CHECK(e.nan == 0);
        CHECK(padding_intact);
        CHECK(e.rel_rms <= 1e-5);   // exact products, fp32 sums: accumulation order only
        CHECK(e.max_rel <= 1e-4);
      }
    }
  }
  // sm_90 (no 'a'): its CUBIN loads on the GPU as it is; bf16 output.
  HostTensor a = random_tensor(DType::bf16, {520, 264}, rng), b = random_tensor(DType::bf16, {300, 264}, rng);
  DeviceTensor da = DeviceTensor::from_host(a), db = DeviceTensor::from_host(b);
  PaddedMatrix out(DType::bf16, 520, 300, 310);
  const LaunchOptions o = on_arch("sm_90", cfg(R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":3})"));
  const std::vector<Arg> args = {da.view(), db.view(), out.view()};
  check_compiled_for(kernels::gemm(), args, o);
  launch(kernels::gemm(), args, o);
  runtime::synchronize();
  bool padding_intact = false;
  const Errors e = errors(out.values(padding_intact), gemm_f64(a, b));
  CHECK(e.nan == 0);
  CHECK(padding_intact);
  CHECK(e.rel_rms <= 4e-3);   // one bf16 rounding of the output
}

TEST_CASE("gpu: sm80 fp8_gemm for sm_89 (e4m3, e5m2 B) with per-row/per-column scales and bias matches float64") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(89);
  const std::vector<const char*> configs = {
      R"({"blocks":{"m":64,"n":64,"k":64}})",   // the default config
      R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":3})",
      R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":2,"num_warps":8})",
      R"({"blocks":{"m":64,"n":128,"k":32},"num_stages":4,"num_warps":2})",
      R"({"blocks":{"m":32,"n":32,"k":256},"num_stages":1,"num_warps":1})",
  };
  std::vector<GemmCase> cases = {
      {1000, 520, 784, 1000, 520, 520, DType::bf16},
      {129, 17, 48, 129, 1, 0, DType::f32},
      {256, 384, 512, 1, 384, 384, DType::f16},
      {200, 136, 272, 200, 136, 136, DType::f32, DType::e5m2},
  };
  for (const char* c : configs) {
    for (const GemmCase& g : cases) {
      CAPTURE(c);
      CAPTURE(fmt::format("{}x{}x{} sa[{}] sb[{}] bias[{}] -> {}, b {}", g.M, g.N, g.K, g.sa, g.sb, g.nbias, name(g.out), name(g.tb)));
      HostTensor a = random_tensor(DType::e4m3, {g.M, g.K}, rng), b = random_tensor(g.tb, {g.N, g.K}, rng);
      HostTensor sa = random_tensor(DType::f32, {g.sa}, rng, 0.5, 2.0), sb = random_tensor(DType::f32, {g.sb}, rng, 0.5, 2.0);
      HostTensor bias = random_tensor(DType::f32, {g.nbias}, rng);
      std::vector<DeviceTensor> dev;
      for (const HostTensor* h : {&a, &b, &sa, &sb, &bias}) dev.push_back(DeviceTensor::from_host(*h));
      PaddedMatrix out(g.out, g.M, g.N, g.N + 6);
      const LaunchOptions o = on_arch("sm_89", cfg(c), /*dynamic=*/c != configs[0]);
      const std::vector<Arg> args = {dev[0].view(), dev[1].view(), dev[2].view(), dev[3].view(), dev[4].view(), out.view()};
      check_compiled_for(kernels::fp8_gemm(), args, o);
      launch(kernels::fp8_gemm(), args, o);
      runtime::synchronize();
      bool padding_intact = false;
      const Errors e = errors(out.values(padding_intact), gemm_f64(a, b, &sa, &sb, g.nbias ? &bias : nullptr));
      CHECK(e.nan == 0);
      CHECK(padding_intact);
      // f32: accumulation order (and the tensor cores' fp8 accumulation width); 16-bit: one rounding.
      CHECK(e.rel_rms <= (g.out == DType::f32 ? 1e-3 : 4e-3));
      CHECK(e.max_rel <= 0.03);   // a layout or pipeline bug is of the order of 1
    }
  }
}

TEST_CASE("gpu: sm80 fp8_gemm for sm_89 agrees with the CPU reference executor") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(90);
  const GemmCase g{200, 136, 256, 200, 136, 136, DType::f32};
  const Config c = cfg(R"({"blocks":{"m":128,"n":64,"k":64},"num_stages":3})");
  HostTensor a = random_tensor(DType::e4m3, {g.M, g.K}, rng), b = random_tensor(DType::e4m3, {g.N, g.K}, rng);
  HostTensor sa = random_tensor(DType::f32, {g.sa}, rng, 0.5, 2.0), sb = random_tensor(DType::f32, {g.sb}, rng, 0.5, 2.0);
  HostTensor bias = random_tensor(DType::f32, {g.nbias}, rng);
  HostTensor ref(DType::f32, {g.M, g.N});
  ref.fill_bytes(0xFF);
  run_reference(kernels::fp8_gemm().trace(fp8_specs(g)), c, {a.view(), b.view(), sa.view(), sb.view(), bias.view(), ref.view()});
  std::vector<DeviceTensor> dev;
  for (const HostTensor* h : {&a, &b, &sa, &sb, &bias}) dev.push_back(DeviceTensor::from_host(*h));
  DeviceTensor out(DType::f32, {g.M, g.N});
  out.fill_bytes(0xFF);
  launch(kernels::fp8_gemm(), {dev[0].view(), dev[1].view(), dev[2].view(), dev[3].view(), dev[4].view(), out.view()},
         on_arch("sm_89", c));
  runtime::synchronize();
  const Errors e = errors(out.to_host().values(), ref.values());
  INFO("rel rms vs the reference executor: " << e.rel_rms);
  CHECK(e.nan == 0);
  CHECK(e.rel_rms <= 3e-4);
}

TEST_CASE("gpu: sm80 dynamic shapes: padded operand rows (partial 16-byte chunks) work, misaligned ones give a clear error") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(91);
  const Config c = cfg(R"({"blocks":{"m":64,"n":64,"k":32},"num_stages":3})");
  // K = 36 bf16 (72-byte rows) inside rows padded to 40 / 48 elements of NaN: the last chunk of
  // each row is half K, half padding, which must be zero-filled, not read.
  {
    HostTensor a = random_tensor(DType::bf16, {150, 36}, rng), b = random_tensor(DType::bf16, {90, 36}, rng);
    PaddedMatrix da = PaddedMatrix::from_host(a, 40), db = PaddedMatrix::from_host(b, 48);
    PaddedMatrix out(DType::f32, 150, 90, 96);
    launch(kernels::gemm(), {da.view(), db.view(), out.view()}, on_arch("sm_80", c, /*dynamic=*/true));
    runtime::synchronize();
    bool padding_intact = false;
    const Errors e = errors(out.values(padding_intact), gemm_f64(a, b));
    CHECK(e.nan == 0);
    CHECK(padding_intact);
    CHECK(e.rel_rms <= 1e-5);
  }
  // Dynamic contiguous shapes of several sizes through one compiled kernel.
  for (int64_t K : {16, 208, 1024}) {   // fp8 rows of whole 16-byte pieces (others: the error below)
    CAPTURE(K);
    HostTensor a = random_tensor(DType::e4m3, {77, K}, rng), b = random_tensor(DType::e4m3, {45, K}, rng);
    HostTensor one(DType::f32, {1}), none(DType::f32, {0});
    one.set(0, 1.0);
    std::vector<DeviceTensor> dev;
    for (const HostTensor* h : {&a, &b, &one, &one, &none}) dev.push_back(DeviceTensor::from_host(*h));
    DeviceTensor out(DType::f32, {77, 45});
    out.fill_bytes(0xFF);
    launch(kernels::fp8_gemm(), {dev[0].view(), dev[1].view(), dev[2].view(), dev[3].view(), dev[4].view(), out.view()},
           on_arch("sm_89", c, /*dynamic=*/true));
    runtime::synchronize();
    const Errors e = errors(out.to_host().values(), gemm_f64(a, b));
    CHECK(e.nan == 0);
    CHECK(e.rel_rms <= 1e-3);
  }
  // K = 100 fp8: 100-byte rows cannot be read in 16-byte pieces.
  DeviceTensor a(DType::e4m3, {64, 100}), b(DType::e4m3, {64, 100}), sa(DType::f32, {1}), sb(DType::f32, {1}),
      bias(DType::f32, {0}), out(DType::bf16, {64, 64});
  CHECK_THROWS_WITH_AS(launch(kernels::fp8_gemm(), {a.view(), b.view(), sa.view(), sb.view(), bias.view(), out.view()},
                              on_arch("sm_89", c, /*dynamic=*/true)),
                       doctest::Contains("tensor 'a' (e4m3[64, 100] (cuda)) cannot be read in 16-byte pieces (cp.async): dim 0 "
                                         "has a stride of 100 bytes, not a multiple of 16"),
                       Error);
}
