// The FP8 scaled GEMM (kernels/gemm.cpp) and its sm_90a lowering (codegen/lower_gemm_sm90.cpp):
// the trace, which kernels the lowering takes and which it leaves to the SIMT path, the
// generated code (NVRTC PTX with wgmma and TMA, no spills), the config errors, the CPU
// reference executor against float64, and on a GPU the whole path against float64.
//
// TJ_GEMM_DUMP_DIR=dir writes the generated sources and CUBINs of the compile tests there
// (for cuobjdump -sass).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
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
#include "codegen/lower_gemm_sm90.h"
#include "codegen/target.h"
#include "dsl/kernel.h"
#include "gpu.h"
#include "gemm_testing.h"
#include "nvrtc_testing.h"
#include "kernels/library.h"
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

void dump(const std::string& name, const codegen::GeneratedKernel& g, const runtime::CompileResult* r) {
  const char* dir = std::getenv("TJ_GEMM_DUMP_DIR");
  if (!dir) return;
  std::ofstream(fmt::format("{}/{}.cu", dir, name)) << g.source;
  if (r && !r->cubin.empty())
    std::ofstream(fmt::format("{}/{}.cubin", dir, name), std::ios::binary).write(r->cubin.data(), (std::streamsize)r->cubin.size());
  if (r && !r->ptx.empty()) std::ofstream(fmt::format("{}/{}.ptx", dir, name)) << r->ptx;
}

using tj_test::nvrtc;
using tj_test::ptxas_info;
using tj_test::PtxasInfo;

// float64 C from the (dequantized) inputs: C = (A·Bᵀ)·sa·sb + bias.
std::vector<double> gemm_f64(const HostTensor& a, const HostTensor& b, const HostTensor& sa, const HostTensor& sb,
                             const HostTensor& bias, int64_t M, int64_t N, int64_t K) {
  const auto av = a.values(), bv = b.values(), sav = sa.values(), sbv = sb.values(), biv = bias.values();
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      const double* ar = av.data() + i * K;
      const double* br = bv.data() + j * K;
      for (int64_t k = 0; k < K; ++k) acc += ar[k] * br[k];
      const double s = (sav.size() == 1 ? sav[0] : sav[i]) * (sbv.size() == 1 ? sbv[0] : sbv[j]);
      c[i * N + j] = acc * s + (biv.empty() ? 0.0 : biv[j]);
    }
  return c;
}

// Inputs for a case: A, B ~ N(0,1) rounded to fp8; positive scales around 1; bias ~ N(0,1).
struct Inputs {
  HostTensor a, b, sa, sb, bias, c;
};
Inputs make_inputs(const GemmCase& g, std::mt19937& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  Inputs in{HostTensor(DType::e4m3, {g.M, g.K}), HostTensor(g.tb, {g.N, g.K}),  HostTensor(DType::f32, {g.sa}),
            HostTensor(DType::f32, {g.sb}),       HostTensor(DType::f32, {g.nbias}), HostTensor(g.out, {g.M, g.N})};
  for (int64_t i = 0; i < in.a.numel(); ++i) in.a.set(i, n(rng));
  for (int64_t i = 0; i < in.b.numel(); ++i) in.b.set(i, n(rng));
  for (int64_t i = 0; i < in.sa.numel(); ++i) in.sa.set(i, u(rng));
  for (int64_t i = 0; i < in.sb.numel(); ++i) in.sb.set(i, u(rng));
  for (int64_t i = 0; i < in.bias.numel(); ++i) in.bias.set(i, n(rng));
  in.c.fill_bytes(0xFF);
  return in;
}

// A GEMM with B loaded as [K, N] (not K-major): the lowering leaves it to SIMT.
const Kernel& gemm_kn() {
  static const Kernel k = kernel("gemm_kn", {"a", "b", "c"}, [](In a, In b, Out c) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(1);
    for (auto m : tile(M, block("m")))
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        for (auto k : tile(K, block("k"))) acc = dot(a.load(m, k), b.load(k, n), acc);
        c.store(m, n, acc.to(c.dtype()));
      }
  });
  return k;
}

// A GEMM whose epilogue reduces along n: not an elementwise epilogue.
const Kernel& gemm_rowsum() {
  static const Kernel k = kernel("gemm_rowsum", {"a", "b", "c", "r"}, [](In a, In b, Out c, Out r) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(0);
    for (auto m : tile(M, block("m")))
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        for (auto k : tile(K, block("k"))) acc = dot(a.load(m, k), b.load(n, k).T(), acc);
        c.store(m, n, acc.to(c.dtype()));
        r.store(m, sum(acc, 1));
      }
  });
  return k;
}

// A GEMM whose epilogue uses the tile start as a number.
const Kernel& gemm_offset() {
  static const Kernel k = kernel("gemm_offset", {"a", "b", "c"}, [](In a, In b, Out c) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(0);
    for (auto m : tile(M, block("m")))
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        for (auto k : tile(K, block("k"))) acc = dot(a.load(m, k), b.load(n, k).T(), acc);
        c.store(m, n, (acc + m.begin().to(DType::f32)).to(c.dtype()));
      }
  });
  return k;
}

// A GEMM with a richer epilogue: c = where(col < row, acc * alpha, relu(acc) + d[m, n]) in f32,
// d a residual [M, N] f32 input, alpha a runtime scalar, output f16.
const Kernel& gemm_fancy() {
  static const Kernel k = kernel("gemm_fancy", {"a", "b", "d", "c", "alpha"}, [](In a, In b, In d, Out c, Scalar alpha) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(0);
    for (auto m : tile(M, block("m")))
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        for (auto k : tile(K, block("k"))) acc = dot(a.load(m, k), b.load(n, k).T(), acc);
        Tile lower = n.index().row() < m.index().col();
        Tile v = where(lower, acc * alpha, maximum(acc, 0.0) + d.load(m, n));
        c.store(m, n, v.to(c.dtype()));
      }
  });
  return k;
}

}  // namespace

// ---- tracing and matching -------------------------------------------------------------------

TEST_CASE("gemm: fp8_gemm traces to a plain GEMM loop nest that the sm_90a lowering recognizes") {
  const ir::Function f = kernels::fp8_gemm().trace(fp8_specs({256, 512, 384}));
  const std::string text = ir::print(f);
  INFO(text);
  CHECK(contains(text, "tile %"));
  CHECK(contains(text, "// launch {"));
  CHECK(contains(text, "dot "));
  CHECK(contains(text, "transpose "));
  CHECK(contains(text, "load scale_a[")); // per tensor: a scalar load
  CHECK_FALSE(contains(text, "load bias"));   // an empty bias is left out while tracing
  CHECK(codegen::is_sm90_gemm_pattern(f));
  // Per-row / per-column scales and a bias: loads along m and n.
  const ir::Function g = kernels::fp8_gemm().trace(fp8_specs({256, 512, 384, 256, 512, 512, DType::f32}));
  CHECK(contains(ir::print(g), "load bias["));
  CHECK(codegen::is_sm90_gemm_pattern(g));
  // Dynamic shapes: the scale kind is chosen at run time (where).
  const ir::Function d = kernels::fp8_gemm().trace(fp8_specs({256, 512, 384, 1, 1, 0, DType::f32}, true));
  CHECK(contains(ir::print(d), "where "));
  CHECK(codegen::is_sm90_gemm_pattern(d));
  CHECK(codegen::is_sm90_gemm_pattern(kernels::gemm().trace({T(DType::bf16, {64, 32}), T(DType::bf16, {48, 32}), T(DType::bf16, {64, 48})})));
  CHECK(codegen::is_sm90_gemm_pattern(gemm_fancy().trace({T(DType::bf16, {64, 32}), T(DType::bf16, {48, 32}),
                                                          T(DType::f32, {64, 48}), T(DType::f16, {64, 48}), RuntimeScalar{0.5f}})));
}

TEST_CASE("gemm: kernels that are not this GEMM pattern are left to the generic lowering, quickly") {
  const Target t90a = codegen::Target::parse("sm_90a");
  const Config c = cfg(R"({"blocks":{"m":64,"n":64,"k":64}})");
  auto lowering_of = [&](const ir::Function& f) { return codegen::generate_cuda(f, c, t90a).lowering; };
  // not a GEMM
  const ir::Function att = kernels::attention().trace({T(DType::bf16, {1, 2, 128, 64}), T(DType::bf16, {1, 2, 128, 64}),
                                                       T(DType::bf16, {1, 2, 128, 64}), T(DType::bf16, {1, 2, 128, 64}),
                                                       RuntimeScalar{0.1f}, false});
  CHECK(lowering_of(att) == "tensor cores (wgmma)");   // the generic lowering, not this pattern
  CHECK(lowering_of(kernels::softmax().trace({T(DType::f32, {8, 100}), T(DType::f32, {8, 100})})) == "simt");
  CHECK(lowering_of(kernels::vector_add().trace({T(DType::f32, {100}), T(DType::f32, {100}), T(DType::f32, {100})})) == "simt");
  // GEMMs it does not take (yet)
  CHECK(lowering_of(gemm_kn().trace({T(DType::bf16, {64, 64}), T(DType::bf16, {64, 64}), T(DType::f32, {64, 64})})) ==
        "tensor cores (wgmma)");
  CHECK(lowering_of(kernels::gemm().trace({T(DType::f32, {64, 64}), T(DType::f32, {64, 64}), T(DType::f32, {64, 64})})) == "simt");
  CHECK(lowering_of(gemm_rowsum().trace({T(DType::bf16, {64, 64}), T(DType::bf16, {64, 64}), T(DType::f32, {64, 64}),
                                         T(DType::f32, {64})})) == "tensor cores (wgmma)");
  CHECK(lowering_of(gemm_offset().trace({T(DType::bf16, {64, 64}), T(DType::bf16, {64, 64}), T(DType::f32, {64, 64})})) ==
        "tensor cores (wgmma)");
  // fp8 rows of K = 100 bytes cannot be read by TMA in a contiguous tensor: not this pattern; the
  // generic lowering stages its operands from registers
  CHECK(lowering_of(kernels::fp8_gemm().trace(fp8_specs({64, 64, 100}))) == "tensor cores (wgmma)");
  // the "lowering" knob skips the pattern lowerings; "mma" = 0 keeps the dots off the tensor cores
  CHECK(codegen::generate_cuda(kernels::fp8_gemm().trace(fp8_specs({64, 64, 64})),
                               cfg(R"({"blocks":{"m":64,"n":64,"k":64},"knobs":{"lowering":0}})"), t90a)
            .lowering == "tensor cores (wgmma)");
  CHECK(codegen::generate_cuda(kernels::fp8_gemm().trace(fp8_specs({64, 64, 64})),
                               cfg(R"({"blocks":{"m":64,"n":64,"k":64},"knobs":{"lowering":0,"mma":0}})"), t90a)
            .lowering == "simt");
  // A non-matching kernel costs the lowering next to nothing.
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) CHECK_FALSE(codegen::lower_gemm_sm90(att, c, t90a).has_value());
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 100;
  INFO("microseconds per declined attention kernel: ", us);
  CHECK(us < 2000);
}

TEST_CASE("gemm: fp8_gemm on sm_90a: the NVRTC PTX has wgmma with e4m3 and cp.async.bulk.tensor (the CI check)") {
  // What `tilejit show fp8_gemm --arch sm_90a --ptx` shows: the library problem, the default config.
  const auto& entry = kernels::find("fp8_gemm");
  kernels::Problem p;
  p.dtype = DType::f32;   // the CLI's default --dtype: fp8_gemm reads it as e4m3
  p.shape = entry.default_shape;
  const auto specs = entry.arguments(p);
  const ir::Function f = entry.get().trace(specs);
  CompileRequest req;
  req.arch = "sm_90a";
  req.want_ptx = true;
  req.load = false;
  const CompiledKernel& ck = compile(entry.get(), specs, default_config(f), req);
  INFO(ck.generated.source);
  CHECK(ck.generated.lowering == "sm90_gemm");
  CHECK(ck.generated.threads == 384);
  CHECK(ck.generated.persistent);
  REQUIRE(ck.generated.tma.size() == 2);
  CHECK(ck.generated.tma[0].param == 0);
  CHECK(ck.generated.tma[1].param == 1);
  CHECK(std::regex_search(ck.ptx, std::regex(R"(wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3)")));
  CHECK(contains(ck.ptx, "cp.async.bulk.tensor.2d.shared::cluster.global"));
  CHECK(contains(ck.ptx, "setmaxnreg"));
  CHECK(contains(ck.ptx, "mbarrier.try_wait.parity"));
  CHECK_FALSE(ck.cubin.empty());
  // Every op statement of the epilogue points at kernels/gemm.cpp.
  CHECK(contains(ck.generated.source, "gemm.cpp:"));
}

TEST_CASE("gemm: bf16, f16 and e4m3 x e5m2 operands use the matching wgmma") {
  const Target t = codegen::Target::parse("sm_90a");
  struct V {
    DType ta, tb;
    const char* wgmma;
  };
  for (V v : {V{DType::bf16, DType::bf16, R"(m64n128k16\.f32\.bf16\.bf16)"}, V{DType::f16, DType::f16, R"(m64n128k16\.f32\.f16\.f16)"}}) {
    const ir::Function f = kernels::gemm().trace({T(v.ta, {256, 256}), T(v.tb, {512, 256}), T(DType::bf16, {256, 512})});
    const auto g = codegen::generate_cuda(f, cfg(R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":4})"), t);
    CHECK(g.lowering == "sm90_gemm");
    const auto r = nvrtc(g, "sm_90a", false);
    CHECK(std::regex_search(r.ptx, std::regex(v.wgmma)));
  }
  GemmCase c{256, 256, 256};
  c.tb = DType::e5m2;
  const auto g = codegen::generate_cuda(kernels::fp8_gemm().trace(fp8_specs(c)),
                                        cfg(R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":4,"knobs":{"promote":0}})"), t);
  const auto r = nvrtc(g, "sm_90a", false);
  CHECK(std::regex_search(r.ptx, std::regex(R"(m64n256k32\.f32\.e4m3\.e5m2)")));
  // Widths hopper_wgmma.cuh does not predefine (160, 224) are defined by the generated kernel.
  for (int n : {160, 224}) {
    CAPTURE(n);
    const auto w = codegen::generate_cuda(
        kernels::fp8_gemm().trace(fp8_specs(GemmCase{256, 448, 256})),
        cfg(fmt::format(R"({{"blocks":{{"m":128,"n":{},"k":128}},"num_stages":4,"knobs":{{"promote":0}}}})", n).c_str()), t);
    CHECK(contains(w.source, fmt::format("TJ_WGMMA_DEFINE({})", n)));
    const auto rw = nvrtc(w, "sm_90a", false);
    CHECK(contains(rw.ptx, fmt::format("m64n{}k32.f32.e4m3.e4m3", n)));
  }
}

TEST_CASE("gemm: the benchmark configs assemble without spills (ptxas -v)") {
  const Target t = codegen::Target::parse("sm_90a");
  struct V {
    const char* name;
    GemmCase c;
    const char* config;
    bool bf16;
  };
  const GemmCase per_tensor{8192, 8192, 8192};
  const GemmCase rowcol{8192, 8192, 8192, 8192, 8192, 8192, DType::bf16};
  const std::vector<V> variants = {
      {"coop_128x256_c2", per_tensor, R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0}})", false},
      {"coop_128x256_c2_rowcol_bias", rowcol, R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0}})", false},
      {"coop_256x128_c2", per_tensor, R"({"blocks":{"m":256,"n":128,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0}})", false},
      {"ping_128x128_c2", per_tensor, R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":6,"knobs":{"cluster":2,"warp_specialize":2,"promote":0}})", false},
      {"ping_64x256_c2", per_tensor, R"({"blocks":{"m":64,"n":256,"k":128},"num_stages":5,"knobs":{"cluster":2,"promote":0}})", false},
      {"coop_128x192_promote2", rowcol, R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":5,"knobs":{"cluster":2,"promote":2}})", false},
      {"coop_128x128_promote", per_tensor, R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":6,"knobs":{"cluster":2,"promote":1}})", false},
      {"coop_128x128_promote2", per_tensor, R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":6,"knobs":{"cluster":2,"promote":2}})", false},
      {"coop_128x128_promote4", per_tensor, R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":6,"knobs":{"cluster":2,"promote":4}})", false},
      {"bf16_coop_128x256_c2", per_tensor, R"({"blocks":{"m":128,"n":256,"k":64},"num_stages":4,"knobs":{"cluster":2}})", true},
  };
  for (const V& v : variants) {
    CAPTURE(v.name);
    const ir::Function f = v.bf16 ? kernels::gemm().trace({T(DType::bf16, {v.c.M, v.c.K}), T(DType::bf16, {v.c.N, v.c.K}),
                                                           T(DType::bf16, {v.c.M, v.c.N})})
                                  : kernels::fp8_gemm().trace(fp8_specs(v.c));
    const auto g = codegen::generate_cuda(f, cfg(v.config), t);
    REQUIRE(g.lowering == "sm90_gemm");
    runtime::CompileResult r;
    auto t0 = std::chrono::steady_clock::now();
    REQUIRE_NOTHROW(r = nvrtc(g, "sm_90a", true, true));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    dump(v.name, g, &r);
    const PtxasInfo info = ptxas_info(r.log);
    MESSAGE(fmt::format("{}: {} registers, spills {}/{} bytes, NVRTC {:.1f} s, {} bytes of shared memory", v.name,
                        info.registers, info.spill_stores, info.spill_loads, s, g.dynamic_smem_bytes));
    INFO(r.log);
    CHECK(info.spill_stores == 0);
    CHECK(info.spill_loads == 0);
    // e.g. C7514: wgmmas serialized because accumulator registers are read while wgmmas run
    CHECK_FALSE(contains(r.log, "Potential Performance Loss"));
    // the K loop stays a loop however K is known: one stage's wgmmas (4 for these 128-byte K
    // stages, per m64 block) at no more than four issue sites (the promoted loop's: the first
    // tile's first stage, an interval's first, the rest, the next tile's first before the epilogue)
    size_t wgmmas = 0;
    for (size_t p = r.ptx.find("wgmma.mma_async"); p != std::string::npos; p = r.ptx.find("wgmma.mma_async", p + 1)) ++wgmmas;
    CHECK(wgmmas <= 16);
    CHECK(info.registers > 0);
  }
}

TEST_CASE("gemm: other architectures take the mma.sync lowering (fp8 from sm_89) or the SIMT path, and compile") {
  const ir::Function f = kernels::fp8_gemm().trace(fp8_specs({100, 72, 48, 100, 72, 72, DType::f32}));
  for (const char* arch : {"sm_80", "sm_89", "sm_90"}) {
    CAPTURE(arch);
    const auto g = codegen::generate_cuda(f, cfg(R"({"blocks":{"m":32,"n":32,"k":32}})"), codegen::Target::parse(arch));
    // sm_80 has no fp8 tensor cores; tests/test_gemm_sm80.cpp covers the mma.sync lowering.
    CHECK(g.lowering == (std::string(arch) == "sm_80" ? "simt" : "sm80_gemm"));
    CHECK(g.tma.empty());
    runtime::CompileResult r;
    REQUIRE_NOTHROW(r = nvrtc(g, arch, false));
    CHECK_FALSE(contains(r.ptx, "wgmma"));
  }
}

TEST_CASE("gemm: configs the lowering cannot use are rejected with the reason") {
  const Target t = codegen::Target::parse("sm_90a");
  const ir::Function f = kernels::fp8_gemm().trace(fp8_specs({1024, 1024, 1024}));
  auto err = [&](const char* json) -> std::string {
    try {
      codegen::generate_cuda(f, cfg(json), t);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(contains(err(R"({"blocks":{"m":64,"n":128,"k":128},"knobs":{"warp_specialize":1}})"), "cooperative needs block 'm' = 128 or 256"));
  CHECK(contains(err(R"({"blocks":{"m":32,"n":128,"k":128}})"), "pingpong needs block 'm' = 64 or 128"));
  CHECK(contains(err(R"({"blocks":{"m":256,"n":256,"k":128}})"), "accumulator registers"));
  // fp8 promotes by default: a tile whose accumulators do not fit twice says how to opt out
  CHECK(contains(err(R"({"blocks":{"m":128,"n":256,"k":128}})"), "doubled by fp32 promotion"));
  CHECK(contains(err(R"({"blocks":{"m":128,"n":256,"k":128}})"), R"(set knob "promote": 0)"));
  CHECK(contains(err(R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":8,"knobs":{"promote":0}})"), "bytes of shared memory"));
  CHECK(contains(err(R"({"blocks":{"m":128,"n":128,"k":16}})"), "block 'k'"));
  CHECK(contains(err(R"({"blocks":{"m":128,"n":128,"k":128},"knobs":{"cluster":4}})"), "cluster must be 1 or 2"));
  CHECK(contains(err(R"({"blocks":{"m":128,"n":128,"k":128},"knobs":{"warp_specialize":3}})"), "warp_specialize"));
  CHECK(contains(err(R"({"blocks":{"m":128,"n":128,"k":128},"knobs":{"warp_specialize":3}})"), "\"lowering\": 0"));
  // and good ones pass
  CHECK(err(R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0}})").empty());
  CHECK(err(R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":5,"knobs":{"cluster":2}})").empty());
  CHECK(err(R"({"blocks":{"m":64,"n":64,"k":32},"num_stages":2})").empty());
  // 16-bit wgmma accumulates in fp32: nothing to promote
  const ir::Function bf = kernels::gemm().trace({T(DType::bf16, {256, 256}), T(DType::bf16, {256, 256}), T(DType::bf16, {256, 256})});
  try {
    codegen::generate_cuda(bf, cfg(R"({"blocks":{"m":128,"n":128,"k":64},"knobs":{"promote":2}})"), t);
    FAIL("promote on a bf16 GEMM was accepted");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "promote is for fp8 inputs"));
  }
}

TEST_CASE("gemm: the epilogue runs at each value's rate (scalar, per row, per column, per element)") {
  const Target t = codegen::Target::parse("sm_90a");
  const auto g = codegen::generate_cuda(kernels::fp8_gemm().trace(fp8_specs({512, 512, 512, 512, 512, 512, DType::f32})),
                                        cfg(R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":4})"), t);
  INFO(g.source);
  // per-row scale: loaded in the rows loop; per-column scale and bias: in the column-pair loop
  CHECK(std::regex_search(g.source, std::regex(R"(v\d+\[tj_mb\]\[tj_h\] = tj::dev::load_scalar<tj::dev::f32>\(scale_a\.data)")));
  CHECK(std::regex_search(g.source, std::regex(R"(v\d+\[tj_e\] = tj::dev::load_scalar<tj::dev::f32>\(scale_b\.data)")));
  CHECK(std::regex_search(g.source, std::regex(R"(v\d+\[tj_e\] = tj::dev::load_scalar<tj::dev::f32>\(bias\.data)")));
  CHECK(contains(g.source, "gemm_store_pair<tj::dev::f32>"));
  // no block-wide synchronization in the epilogue: each warp stages its own rows in shared
  // memory (64-byte chunks: 16 f32 columns) and writes them back as 16-byte pieces
  CHECK_FALSE(contains(g.source, "__syncthreads"));
  CHECK(contains(g.source, "tj::dev::gemm_flush_chunk<tj::dev::f32, 1, 64>("));
  CHECK(contains(g.source, "for (int tj_ch = 0; tj_ch < 8; ++tj_ch)"));
  CHECK(g.dynamic_smem_bytes == 1024 + 4 * 256 * 128 + 10 * 8 + 8 * 16 * 64);
  const auto r = nvrtc(g, "sm_90a", false);
  CHECK(contains(r.ptx, "wgmma.mma_async"));
  CHECK(contains(r.ptx, "st.global.v4"));
  // Where the staging buffers do not fit beside the stages (or with knob staged_store = 0), the
  // accumulator layout's own stores.
  for (const char* c : {R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":7})",
                        R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":4,"knobs":{"staged_store":0}})"}) {
    CAPTURE(c);
    const auto d = codegen::generate_cuda(kernels::fp8_gemm().trace(fp8_specs({512, 512, 512, 512, 512, 512, DType::f32})),
                                          cfg(c), t);
    CHECK_FALSE(contains(d.source, "gemm_flush_chunk"));
    CHECK(contains(d.source, "gemm_store_pair<tj::dev::f32>"));
  }

  // Dynamic shapes: the scale kinds are decided at run time (a where per row / per column).
  const auto dyn = codegen::generate_cuda(kernels::fp8_gemm().trace(fp8_specs({512, 512, 512, 1, 1, 512, DType::bf16}, true)),
                                          cfg(R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0}})"), t);
  CHECK(dyn.lowering == "sm90_gemm");
  CHECK(contains(dyn.source, "scale_a.shape[0] == 1LL"));
  REQUIRE_NOTHROW(nvrtc(dyn, "sm_90a", false));

  // A richer epilogue (where, arange comparisons, a residual [M, N] load, a runtime scalar) compiles.
  const auto fancy = codegen::generate_cuda(gemm_fancy().trace({T(DType::bf16, {-1, -1}), T(DType::bf16, {-1, -1}), T(DType::f32, {-1, -1}),
                                                                T(DType::f16, {-1, -1}), RuntimeScalar{0.5f}}),
                                            cfg(R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":3})"), t);
  CHECK(fancy.lowering == "sm90_gemm");
  INFO(fancy.source);
  REQUIRE_NOTHROW(nvrtc(fancy, "sm_90a", false));
}

TEST_CASE("gemm: the untuned config is the lowering's default tile, fp8 promoting into fp32") {
  const ir::Function f8 = kernels::fp8_gemm().trace(fp8_specs({1024, 1024, 1024, 1, 1, 0, DType::f32}));
  const Config c = autotune::untuned_config(f8, "sm_90a");
  CHECK(c.blocks.at("m") == 128);
  CHECK(c.blocks.at("n") == 192);
  CHECK(c.blocks.at("k") == 128);
  CHECK(c.num_stages == 4);
  const auto g = codegen::generate_cuda(f8, c, codegen::Target::parse("sm_90a"));
  CHECK(g.lowering == "sm90_gemm");
  CHECK(contains(g.source, "fp32 promotion every 4 stage(s)"));
  // opting out: the tensor core's own accumulation
  Config fast = c;
  fast.knobs["promote"] = 0;
  CHECK_FALSE(contains(codegen::generate_cuda(f8, fast, codegen::Target::parse("sm_90a")).source, "fp32 promotion"));
  // the bf16 GEMM: wider tiles, nothing to promote
  const ir::Function fb = kernels::gemm().trace({T(DType::bf16, {512, 256}), T(DType::bf16, {512, 256}), T(DType::bf16, {512, 512})});
  const Config cb = autotune::untuned_config(fb, "sm_90a");
  CHECK(cb.blocks.at("n") == 256);
  CHECK_FALSE(contains(codegen::generate_cuda(fb, cb, codegen::Target::parse("sm_90a")).source, "fp32 promotion"));
  // the mma.sync path's own default on sm_80 / sm_89; streaming kernels get the SIMT path's
  // (codegen/simt_config.h)
  const Config c80 = autotune::untuned_config(fb, "sm_80");
  CHECK(c80.blocks.at("m") == 128);
  CHECK(c80.blocks.at("k") == 32);
  CHECK(codegen::generate_cuda(fb, c80, codegen::Target::parse("sm_80")).lowering == "sm80_gemm");
  CHECK(autotune::untuned_config(f8, "sm_89").blocks.at("k") == 64);
  const ir::Function va = kernels::vector_add().trace({T(DType::f32, {4096}), T(DType::f32, {4096}), T(DType::f32, {4096})});
  const Config streaming = autotune::untuned_config(va, "sm_90a");
  CHECK(streaming.blocks.at("n") == 1024);
  CHECK(streaming.num_warps == 4);   // no reduction
  CHECK(streaming.knob("simt_vec", 1) == 4);
}

TEST_CASE("gemm: the knob provider declares the lowering's knobs for GEMMs on sm_90a only") {
  const ir::Function f = kernels::fp8_gemm().trace(fp8_specs({1024, 1024, 1024}));
  std::vector<std::string> names;
  for (const auto& k : autotune::registered_knobs(f, "sm_90a")) names.push_back(k.name);
  CHECK(std::count(names.begin(), names.end(), "warp_specialize") == 1);
  CHECK(std::count(names.begin(), names.end(), "cluster") == 1);
  CHECK(std::count(names.begin(), names.end(), "raster_group") == 1);
  CHECK(std::count(names.begin(), names.end(), "promote") == 1);
  bool any = false;
  for (const auto& k : autotune::registered_knobs(f, "sm_80")) any |= k.name == "promote";
  CHECK_FALSE(any);
}

// ---- the CPU reference executor against float64 -----------------------------------------------

TEST_CASE("gemm: the reference executor runs fp8_gemm like float64 on the dequantized inputs (ragged M, N, K)") {
  std::mt19937 rng(11);
  struct C {
    GemmCase g;
    const char* config;
  };
  const std::vector<C> cases = {
      {{37, 29, 83, 1, 1, 0, DType::f32}, R"({"blocks":{"m":16,"n":16,"k":16}})"},
      {{37, 29, 83, 37, 29, 29, DType::f32}, R"({"blocks":{"m":32,"n":8,"k":64}})"},
      {{64, 48, 32, 64, 1, 48, DType::bf16}, R"({"blocks":{"m":64,"n":64,"k":32}})"},
      {{100, 72, 48, 1, 72, 0, DType::f16}, R"({"blocks":{"m":64,"n":32,"k":16}})"},
      {{1, 1, 1, 1, 1, 1, DType::f32}, R"({"blocks":{"m":16,"n":16,"k":16}})"},
  };
  for (const C& c : cases) {
    for (bool dynamic : {false, true}) {
      const GemmCase& g = c.g;
      CAPTURE(g.M);
      CAPTURE(g.N);
      CAPTURE(g.K);
      CAPTURE(g.sa);
      CAPTURE(g.sb);
      CAPTURE(g.nbias);
      CAPTURE(dynamic);
      Inputs in = make_inputs(g, rng);
      const ir::Function f = kernels::fp8_gemm().trace(fp8_specs(g, dynamic));
      run_reference(f, cfg(c.config), {in.a.view(), in.b.view(), in.sa.view(), in.sb.view(), in.bias.view(), in.c.view()});
      const auto ref = gemm_f64(in.a, in.b, in.sa, in.sb, in.bias, g.M, g.N, g.K);
      const Errors e = errors(in.c.values(), ref);
      CHECK(e.nan == 0);
      // f32: accumulation order only; f16/bf16: one rounding of the output
      const double tol = g.out == DType::f32 ? 1e-6 : g.out == DType::f16 ? 1e-3 : 4e-3;
      CHECK(e.rel_rms <= tol);
    }
  }
}

// ---- on the GPU ------------------------------------------------------------------------------------

namespace {

struct GpuRun {
  Errors vs_f64;
  std::vector<double> out;
  bool padding_intact = true;
};

// Runs fp8_gemm through tj::launch with `config`, the output a strided view (row pitch N + 6)
// inside a poisoned buffer whose padding must stay untouched.
GpuRun run_gpu(const GemmCase& g, const Config& config, std::mt19937& rng, bool dynamic = false) {
  Inputs in = make_inputs(g, rng);
  std::vector<DeviceTensor> dev;
  for (const HostTensor* h : {&in.a, &in.b, &in.sa, &in.sb, &in.bias}) dev.push_back(DeviceTensor::from_host(*h));
  const int64_t pitch = g.N + 6;
  const int esize = size_bytes(g.out);
  runtime::DeviceBuffer cbuf(static_cast<size_t>((g.M * pitch + 64) * esize));
  cbuf.memset(0xFF);
  TensorView cview;
  cview.data = reinterpret_cast<void*>(cbuf.ptr());
  cview.dtype = g.out;
  cview.shape = {g.M, g.N};
  cview.strides = {pitch, 1};
  cview.device = Device::cuda;
  std::vector<Arg> args;
  for (auto& d : dev) args.emplace_back(d.view());
  args.emplace_back(cview);
  LaunchOptions opts;
  opts.config = config;
  opts.dynamic_shapes = dynamic;
  launch(kernels::fp8_gemm(), args, opts);
  runtime::synchronize();
  HostTensor raw(g.out, {static_cast<int64_t>(cbuf.size() / esize)});
  cbuf.copy_to_host(raw.data(), cbuf.size());
  GpuRun r;
  r.out.resize(static_cast<size_t>(g.M * g.N));
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < pitch; ++j) {
      const double v = raw.at(i * pitch + j);
      if (j < g.N) r.out[i * g.N + j] = v;
      else r.padding_intact &= std::isnan(v);
    }
  for (int64_t j = g.M * pitch; j < raw.numel(); ++j) r.padding_intact &= std::isnan(raw.at(j));
  r.vs_f64 = errors(r.out, gemm_f64(in.a, in.b, in.sa, in.sb, in.bias, g.M, g.N, g.K));
  return r;
}

}  // namespace

TEST_CASE("gpu: fp8_gemm through tj::launch matches float64 (f32/bf16/f16 out, scales per tensor/row/column, bias, tails)") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(21);
  const std::vector<const char*> configs = {
      R"({"blocks":{"m":64,"n":64,"k":64}})",   // the default blocks: pingpong, 64-byte swizzle
      R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0}})",
      R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0}})",
      R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":6,"knobs":{"cluster":2,"warp_specialize":2,"promote":0}})",
      R"({"blocks":{"m":64,"n":256,"k":128},"num_stages":5,"knobs":{"cluster":2,"raster_group":1,"promote":0}})",
      R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":4,"knobs":{"promote":1}})",
      R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":5,"knobs":{"cluster":2}})",   // promote 4 (the default)
      R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":5,"knobs":{"cluster":2,"promote":4}})",
      R"({"blocks":{"m":256,"n":128,"k":256},"num_stages":2,"knobs":{"cluster":1,"promote":0}})",
      R"({"blocks":{"m":128,"n":16,"k":32},"num_stages":8,"knobs":{"cluster":2}})",
      R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":4,"knobs":{"cluster":2,"staged_store":0}})",   // direct stores
  };
  const std::vector<GemmCase> cases = {
      {1000, 520, 784, 1, 1, 0, DType::bf16},
      {1000, 520, 784, 1000, 520, 520, DType::f32},
      {256, 384, 512, 1, 384, 384, DType::f16},
      {129, 17, 48, 129, 1, 0, DType::f32},
      // more cluster tiles than clusters fit: consumers start their next tile's first K block
      // before the epilogue (Sm90Gemm::consume)
      {2560, 1280, 384, 2560, 1, 0, DType::bf16},
  };
  for (const char* c : configs) {
    for (const GemmCase& g : cases) {
      CAPTURE(c);
      CAPTURE(fmt::format("{}x{}x{} sa[{}] sb[{}] bias[{}] -> {}", g.M, g.N, g.K, g.sa, g.sb, g.nbias, name(g.out)));
      const GpuRun r = run_gpu(g, cfg(c), rng);
      CHECK(r.vs_f64.nan == 0);
      CHECK(r.padding_intact);
      const double tol = g.out == DType::f32 ? 1e-3 : 4e-3;
      CHECK(r.vs_f64.rel_rms <= tol);
      CHECK(r.vs_f64.max_rel <= 0.03);   // a layout or pipeline bug is of the order of 1
    }
  }
}

TEST_CASE("gpu: fp8_gemm promotes into fp32 by default: K = 16384 with f32 output stays within 5e-4 of float64") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(23);
  const GemmCase g{192, 160, 16384, 1, 1, 0, DType::f32};
  // The untuned config (as tj::launch picks it), a wider promoted tile, and fast accumulation.
  const ir::Function f = kernels::fp8_gemm().trace(fp8_specs(g));
  const Config untuned = autotune::untuned_config(f, "sm_90a");
  const GpuRun promoted = run_gpu(g, untuned, rng);
  const GpuRun wide = run_gpu(g, cfg(R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":5,"knobs":{"cluster":2}})"), rng);
  Config fast_cfg = untuned;
  fast_cfg.knobs["promote"] = 0;
  const GpuRun fast = run_gpu(g, fast_cfg, rng);
  INFO("rel rms vs float64: promoted " << promoted.vs_f64.rel_rms << ", 128x192 promoted " << wide.vs_f64.rel_rms
                                       << ", fast accumulation " << fast.vs_f64.rel_rms);
  CHECK(promoted.vs_f64.nan == 0);
  // (measured on an H100: 2.1e-4; fast accumulation 3.1e-3; issue 3's target is 1e-3)
  CHECK(promoted.vs_f64.rel_rms <= 5e-4);
  CHECK(wide.vs_f64.rel_rms <= 5e-4);
  // The tensor core's own accumulation loses bits with K: the reason promotion is the default.
  CHECK(fast.vs_f64.rel_rms > 4 * promoted.vs_f64.rel_rms);
  MESSAGE("fp8_gemm 192x160x16384 f32 out, rel rms vs float64: promoted " << promoted.vs_f64.rel_rms << ", fast accumulation "
                                                                          << fast.vs_f64.rel_rms);
}

TEST_CASE("gpu: fp8_gemm on the GPU agrees with the CPU reference executor, e5m2 B, dynamic shapes") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(22);
  GemmCase g{200, 136, 256, 200, 136, 136, DType::f32};
  const Config c = cfg(R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":4,"knobs":{"cluster":2}})");
  Inputs in = make_inputs(g, rng);
  const ir::Function f = kernels::fp8_gemm().trace(fp8_specs(g));
  HostTensor ref = in.c;
  run_reference(f, c, {in.a.view(), in.b.view(), in.sa.view(), in.sb.view(), in.bias.view(), ref.view()});
  std::vector<DeviceTensor> dev;
  for (const HostTensor* h : {&in.a, &in.b, &in.sa, &in.sb, &in.bias, &in.c}) dev.push_back(DeviceTensor::from_host(*h));
  std::vector<Arg> args;
  for (auto& d : dev) args.emplace_back(d.view());
  LaunchOptions o;
  o.config = c;
  launch(kernels::fp8_gemm(), args, o);
  runtime::synchronize();
  const Errors e = errors(dev[5].to_host().values(), ref.values());
  INFO("rel rms vs the reference executor: " << e.rel_rms);
  CHECK(e.nan == 0);
  // Hopper's FP8 tensor cores accumulate with fewer bits than fp32 (about 22), the reference
  // with exact fp32 steps: over K = 256 that moves the result by a few 1e-5 relative.
  CHECK(e.rel_rms <= 3e-4);

  GemmCase h{300, 260, 512, 1, 1, 260, DType::bf16};
  h.tb = DType::e5m2;
  GpuRun r = run_gpu(h, c, rng);
  CHECK(r.vs_f64.rel_rms <= 4e-3);
  CHECK(r.padding_intact);
  for (GemmCase d : {GemmCase{333, 200, 160, 1, 1, 0, DType::bf16}, GemmCase{64, 1000, 64, 64, 1000, 1000, DType::f32}}) {
    GpuRun rd = run_gpu(d, c, rng, /*dynamic=*/true);
    CHECK(rd.vs_f64.nan == 0);
    CHECK(rd.vs_f64.rel_rms <= (d.out == DType::f32 ? 1e-3 : 4e-3));
  }
}

TEST_CASE("gpu: bf16 gemm through the wgmma lowering matches float64") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(23);
  std::normal_distribution<double> n(0.0, 1.0);
  for (const char* c : {R"({"blocks":{"m":128,"n":256,"k":64},"num_stages":4,"knobs":{"cluster":2}})",
                        R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":3,"knobs":{"warp_specialize":2}})",
                        R"({"blocks":{"m":64,"n":64,"k":64}})"}) {
    CAPTURE(c);
    const int64_t M = 520, N = 264, K = 200;
    HostTensor a(DType::bf16, {M, K}), b(DType::bf16, {N, K}), out(DType::f32, {M, N});
    for (int64_t i = 0; i < a.numel(); ++i) a.set(i, n(rng));
    for (int64_t i = 0; i < b.numel(); ++i) b.set(i, n(rng));
    DeviceTensor da = DeviceTensor::from_host(a), db = DeviceTensor::from_host(b), dc(DType::f32, {M, N});
    dc.fill_bytes(0xFF);
    LaunchOptions o;
    o.config = cfg(c);
    launch(kernels::gemm(), {da.view(), db.view(), dc.view()}, o);
    runtime::synchronize();
    HostTensor one(DType::f32, {1}), none(DType::f32, {0});
    one.set(0, 1.0);
    const Errors e = errors(dc.to_host().values(), gemm_f64(a, b, one, one, none, M, N, K));
    CHECK(e.nan == 0);
    CHECK(e.rel_rms <= 1e-5);
  }
}

TEST_CASE("gpu: fp8 operands TMA cannot read give encode_tma's clear error") {
  TJ_REQUIRE_GPU();
  // Dynamic shapes: the lowering cannot see K, so K = 100 (100-byte rows) reaches the launch.
  DeviceTensor a(DType::e4m3, {64, 100}), b(DType::e4m3, {64, 100}), sa(DType::f32, {1}), sb(DType::f32, {1}),
      bias(DType::f32, {0}), c(DType::bf16, {64, 64});
  LaunchOptions o;
  o.dynamic_shapes = true;
  o.config = cfg(R"({"blocks":{"m":128,"n":128,"k":128}})");
  CHECK_THROWS_WITH_AS(launch(kernels::fp8_gemm(), {a.view(), b.view(), sa.view(), sb.view(), bias.view(), c.view()}, o),
                       doctest::Contains("not a multiple of 16"), Error);
}
