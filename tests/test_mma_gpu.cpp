// The generic tensor-core lowering on the GPU: the user kernels of examples/kernels, lowered to
// wgmma and TMA, and to mma.sync for sm_80 / sm_89 (PTX on this GPU), against the CPU reference
// executor on random inputs (outputs poisoned first), at ragged shapes and for several configs.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/attention_backward.h"
#include "autotune/launch.h"
#include "codegen/lowering.h"
#include "examples/kernels/user_kernels.h"
#include "gpu.h"
#include "gpu_run.h"
#include "runtime/driver.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;

namespace tj_codegen_test {   // tests/test_codegen.cpp
const tj::Kernel& k_atomic_add();
}

namespace {

using tj_test::random_tensor;

struct Outcome {
  double rel_rmse = 0;   // ||gpu - ref|| / ||ref||
  int64_t nan_count = 0;
  std::string lowering;
};

// Runs `k` on the CPU reference and on the GPU (config `config`) with the same inputs; compares
// tensor `out`.
Outcome run_both(const Kernel& k, std::vector<HostTensor>& tensors, std::vector<Arg> tail, size_t out, const Config& config,
                 const std::string& arch = "", bool keep_out = false) {
  const tj_test::BothRuns r = tj_test::run_reference_and_gpu(k, tensors, tail, out, config, arch, keep_out);
  Outcome o;
  o.lowering = r.lowering;
  double err = 0, ref = 0;
  for (int64_t i = 0; i < r.gpu.numel(); ++i) {
    const double want = r.reference.at(i), got = r.gpu.at(i);
    if (std::isnan(got) || std::isnan(want)) {
      ++o.nan_count;
      continue;
    }
    err += (got - want) * (got - want);
    ref += want * want;
  }
  o.rel_rmse = std::sqrt(err / std::max(ref, 1e-30));
  return o;
}

// The untuned config of `k` traced for these host tensors and tail arguments, for `arch`.
Config untuned_for(const Kernel& k, const std::vector<HostTensor>& t, const std::vector<Arg>& tail, const std::string& arch) {
  std::vector<Arg> args;
  for (const auto& x : t) args.push_back(x.view());
  args.insert(args.end(), tail.begin(), tail.end());
  return codegen::untuned_config(k.trace(specs_for(k, args, false)), arch);
}

// gemm_bias_gelu with b [N, K] and [K, N] at m x n x k under config `c`, on the wgmma path, against
// the reference.
void check_gemm_bias_gelu(int64_t m, int64_t n, int64_t k, const Config& c, std::mt19937& rng) {
  for (bool kn : {false, true}) {
    CAPTURE(fmt::format("gemm_bias_gelu {} x {} x {}, b {}", m, n, k, kn ? "[K, N]" : "[N, K]"));
    std::vector<HostTensor> t = {random_tensor(DType::bf16, {m, k}, rng, 0.5),
                                 random_tensor(DType::bf16, kn ? std::vector<int64_t>{k, n} : std::vector<int64_t>{n, k}, rng, 0.5),
                                 random_tensor(DType::f32, {n}, rng), HostTensor(DType::bf16, {m, n})};
    const Outcome o = run_both(examples::gemm_bias_gelu(kn), t, {}, 3, c);
    CHECK(o.lowering == "tensor cores (wgmma)");
    CHECK(o.nan_count == 0);
    CHECK(o.rel_rmse < 1e-2);
  }
}

}  // namespace

TEST_CASE("gpu: user GEMMs on the tensor cores (b [N, K] and [K, N], batched, SwiGLU) match the reference") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(7);
  // "lowering": 0 skips the GEMM pattern lowering, which would take the [N, K] GEMM whole.
  const std::vector<const char*> configs = {
      R"({"blocks":{"m":128,"n":128,"k":64},"num_warps":8,"num_stages":4,"knobs":{"lowering":0}})",
      R"({"blocks":{"m":64,"n":64,"k":32},"num_warps":4,"num_stages":2,"knobs":{"lowering":0}})",
      R"({"blocks":{"m":128,"n":64,"k":64},"num_warps":4,"num_stages":3,"knobs":{"lowering":0}})",
      R"({"blocks":{"m":64,"n":64,"k":64},"num_warps":4,"num_stages":3,"knobs":{"lowering":0,"persistent":1,"persistent_blocks":3,"raster_group":3}})",
      R"({"blocks":{"m":128,"n":128,"k":64},"num_warps":8,"num_stages":4,"knobs":{"lowering":0,"warp_specialize":0,"persistent":1,"persistent_blocks":2}})",
      // Two programs a block (knob wg_programs), one a warpgroup: a block's pair of programs, and
      // persistent over 3 blocks (slots that run two programs, one, or none past the last).
      R"({"blocks":{"m":64,"n":128,"k":64},"num_warps":4,"num_stages":3,"knobs":{"lowering":0,"wg_programs":2}})",
      R"({"blocks":{"m":64,"n":64,"k":64},"num_warps":4,"num_stages":2,"knobs":{"lowering":0,"persistent":1,"persistent_blocks":3,"raster_group":3,"wg_programs":2}})"};
  for (const char* json : configs) {
    const Config c = Config::from_json(json);
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{256, 256, 512}, {200, 136, 328}}) {
      CAPTURE(json);
      check_gemm_bias_gelu(m, n, k, c, rng);
      CAPTURE(fmt::format("batched / swiglu {} x {} x {}", m, n, k));
      std::vector<HostTensor> b = {random_tensor(DType::f16, {3, m, k}, rng), random_tensor(DType::f16, {3, n, k}, rng),
                                   HostTensor(DType::f16, {3, m, n})};
      Outcome o = run_both(examples::batched_gemm(), b, {}, 2, c);
      CHECK(o.lowering == "tensor cores (wgmma)");
      CHECK(o.nan_count == 0);
      CHECK(o.rel_rmse < 2e-3);
      std::vector<HostTensor> s = {random_tensor(DType::bf16, {m, k}, rng, 0.3), random_tensor(DType::bf16, {n, k}, rng, 0.3),
                                   random_tensor(DType::bf16, {n, k}, rng, 0.3), HostTensor(DType::bf16, {m, n})};
      o = run_both(examples::swiglu(), s, {}, 3, c);
      CHECK(o.lowering == "tensor cores (wgmma)");
      CHECK(o.nan_count == 0);
      CHECK(o.rel_rmse < 1e-2);
    }
  }
}

TEST_CASE("gpu: a user GEMM with two programs a block (knob wg_programs), and with its stores transposed across quads, matches the reference") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(8);
  // The benchmark's shape of the schedule: 128 rows (two wgmma row blocks) a warpgroup, staged
  // stores, persistent; ragged edges.
  const Config c = Config::from_json(
      R"({"blocks":{"m":128,"n":128,"k":64},"num_warps":4,"num_stages":3,"knobs":{"lowering":0,"persistent":1,"persistent_blocks":2,"wg_programs":2}})");
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{640, 384, 512}, {300, 264, 328}}) check_gemm_bias_gelu(m, n, k, c, rng);
  // The untuned GEMM config (128 x 256, 4 stages): no room to stage the result, which leaves
  // transposed across quads (whole tiles) or from the fragments (ragged ones).
  const Config q = Config::from_json(
      R"({"blocks":{"m":128,"n":256,"k":64},"num_warps":8,"num_stages":4,"knobs":{"lowering":0,"persistent":1,"persistent_blocks":3,"raster_group":8}})");
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{640, 768, 512}, {300, 264, 328}}) check_gemm_bias_gelu(m, n, k, q, rng);
}

TEST_CASE("gpu: README attention on the tensor cores (bf16, f16, e4m3, causal and not, ragged) matches the reference") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(11);
  struct Case {
    DType t;
    std::vector<int64_t> shape;
    bool causal;
    const char* config;
    double tol;
  };
  const std::vector<Case> cases = {
      {DType::bf16, {2, 3, 256, 128}, false, R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2})", 1e-2},
      {DType::bf16, {2, 3, 300, 128}, true, R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2})", 1e-2},
      {DType::f16, {1, 2, 200, 64}, true, R"({"blocks":{"m":64,"n":64},"num_warps":4,"num_stages":3})", 2e-3},
      {DType::bf16, {1, 2, 333, 64}, false, R"({"blocks":{"m":128,"n":64},"num_warps":8,"num_stages":3})", 1e-2},
      {DType::e4m3, {1, 2, 256, 128}, false, R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2})", 6e-2},
      {DType::e4m3, {1, 2, 190, 64}, true, R"({"blocks":{"m":64,"n":64},"num_warps":4,"num_stages":2})", 6e-2},
      // Persistent blocks looping over several programs each: the ring slots of Q (once per
      // program) and of K and V carry over from one program to the next.
      {DType::bf16, {2, 3, 300, 64}, true,
       R"({"blocks":{"m":64,"n":64},"num_warps":4,"num_stages":2,"knobs":{"persistent":1,"persistent_blocks":4}})", 1e-2},
      {DType::bf16, {2, 3, 256, 128}, false,
       R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2,"knobs":{"persistent":1,"persistent_blocks":5}})", 1e-2},
      {DType::f16, {1, 3, 256, 64}, true,
       R"({"blocks":{"m":128,"n":64},"num_warps":8,"num_stages":3,"knobs":{"persistent":1,"persistent_blocks":2,"warp_specialize":0}})",
       2e-3},
      // The warpgroups taking turns at their wgmmas (knob wg_turns): over several programs per
      // block (the named barriers' arrivals pair up per run of the loop), without a producer
      // warpgroup, and with a ragged causal tail.
      {DType::bf16, {2, 3, 300, 128}, true,
       R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2,"knobs":{"persistent":1,"persistent_blocks":5,"wg_turns":1}})",
       1e-2},
      {DType::f16, {1, 3, 256, 64}, true,
       R"({"blocks":{"m":128,"n":64},"num_warps":8,"num_stages":3,"knobs":{"warp_specialize":0,"wg_turns":1}})", 2e-3},
      {DType::e4m3, {1, 2, 256, 128}, false, R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2,"knobs":{"wg_turns":1}})",
       6e-2},
      // O += P.V one iteration late (knob overlap; 2, the default, rescales the accumulator after
      // the late dot's wait): ragged key tails (the late V tile's k tail zeroed after the loop),
      // several programs per block, with and without turns, fp8 P; one case of overlap 1.
      {DType::bf16, {2, 3, 300, 128}, true,
       R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2,"knobs":{"persistent":1,"persistent_blocks":5,"overlap":2}})",
       1e-2},
      {DType::bf16, {2, 3, 333, 128}, false,
       R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2,"knobs":{"overlap":2,"wg_turns":1}})", 1e-2},
      {DType::f16, {1, 3, 256, 64}, true, R"({"blocks":{"m":128,"n":64},"num_warps":8,"num_stages":3,"knobs":{"overlap":1}})",
       2e-3},
      {DType::e4m3, {1, 2, 256, 128}, false,
       R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2,"knobs":{"overlap":2,"wg_turns":1}})", 6e-2},
      {DType::bf16, {1, 2, 100, 64}, false, R"({"blocks":{"m":64,"n":64},"num_warps":4,"num_stages":2,"knobs":{"overlap":2}})",
       1e-2},
      // fp8 V copied K-major by the producer warpgroup in P's key order (knob fp8_key_order): ragged
      // causal tails, several programs per block, one warpgroup.
      {DType::e4m3, {2, 3, 300, 128}, true,
       R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":3,"knobs":{"persistent":1,"persistent_blocks":5,"fp8_key_order":1}})",
       6e-2},
      {DType::e4m3, {1, 2, 190, 64}, true, R"({"blocks":{"m":64,"n":64},"num_warps":4,"num_stages":2,"knobs":{"fp8_key_order":1}})",
       6e-2},
      // Longest first on a persistent grid: the producer warpgroup, the transposer warps and the
      // tiles' warps walk the same order of programs.
      {DType::bf16, {2, 3, 300, 128}, true,
       R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":2,"knobs":{"persistent":1,"persistent_blocks":5,"longest_first":1,"overlap":2}})",
       1e-2},
      {DType::e4m3, {2, 3, 300, 128}, true,
       R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":4,"knobs":{"persistent":1,"persistent_blocks":5,"longest_first":1,"overlap":2}})",
       6e-2},
      // Two blocks an SM of one tile warpgroup each (knob simt_min_blocks: setmaxnreg shares the
      // SM's registers out among both blocks' warpgroups).
      {DType::e4m3, {2, 3, 300, 128}, true,
       R"({"blocks":{"m":64,"n":128},"num_warps":4,"num_stages":2,"knobs":{"simt_min_blocks":2}})", 6e-2},
      {DType::bf16, {2, 3, 300, 128}, false,
       R"({"blocks":{"m":64,"n":64},"num_warps":4,"num_stages":2,"knobs":{"simt_min_blocks":2,"overlap":2}})", 1e-2},
      // Three K-major slots of V's copy (knob copy_stages), over several programs per block.
      {DType::e4m3, {2, 3, 300, 128}, true,
       R"({"blocks":{"m":128,"n":128},"num_warps":8,"num_stages":4,"knobs":{"persistent":1,"persistent_blocks":5,"copy_stages":3,"overlap":2}})",
       6e-2},
  };
  for (const Case& c : cases) {
    CAPTURE(fmt::format("{} {} causal={} {}", name(c.t), fmt::join(c.shape, "x"), c.causal, c.config));
    std::vector<HostTensor> t = {random_tensor(c.t, c.shape, rng), random_tensor(c.t, c.shape, rng),
                                 random_tensor(c.t, c.shape, rng), HostTensor(DType::bf16, c.shape)};
    const double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(c.shape[3]));
    const Outcome o = run_both(examples::readme_attention(), t, {scale, c.causal}, 3, Config::from_json(c.config));
    CHECK(o.lowering == "tensor cores (wgmma)");
    CHECK(o.nan_count == 0);
    CHECK(o.rel_rmse < c.tol);
  }
  // V stored transposed (readme_attention_vt): fp8's P.V operand K-major as stored, no copy; the
  // load and its transpose one iteration late with the dot (knob overlap 1 and 2).
  // Schedules 0-2: knob overlap 0-2 on persistent blocks; 3: one tile warpgroup a block, two blocks
  // an SM (knob simt_min_blocks).
  for (DType t : {DType::e4m3, DType::bf16})
    for (int schedule = 0; schedule < 4; ++schedule)
      for (bool causal : {false, true}) {
        const int64_t B = 2, H = 3, S = 304, D = 128;
        const std::string config =
            schedule == 3
                ? std::string(R"({"blocks":{"m":64,"n":128},"num_warps":4,"num_stages":2,"knobs":{"overlap":2,"simt_min_blocks":2}})")
                : fmt::format(
                      R"({{"blocks":{{"m":128,"n":128}},"num_warps":8,"num_stages":{},"knobs":{{"overlap":{},"persistent":1,"persistent_blocks":5}}}})",
                      t == DType::e4m3 ? 4 : 2, schedule);
        CAPTURE(fmt::format("readme_attention_vt {} {} causal={}", name(t), config, causal));
        const HostTensor v = random_tensor(t, {B, H, S, D}, rng);
        HostTensor vt(t, {B, H, D, S});
        for (int64_t bh = 0; bh < B * H; ++bh)
          for (int64_t j = 0; j < S; ++j)
            for (int64_t d = 0; d < D; ++d) vt.set((bh * D + d) * S + j, v.at((bh * S + j) * D + d));
        std::vector<HostTensor> tv = {random_tensor(t, {B, H, S, D}, rng), random_tensor(t, {B, H, S, D}, rng), vt,
                                      HostTensor(DType::bf16, {B, H, S, D})};
        const Config cfg = Config::from_json(config);
        const Outcome o = run_both(examples::readme_attention_vt(), tv, {1.4426950408889634 / std::sqrt(double(D)), causal}, 3, cfg);
        CHECK(o.lowering == "tensor cores (wgmma)");
        CHECK(o.nan_count == 0);
        CHECK(o.rel_rmse < (t == DType::e4m3 ? 6e-2 : 1e-2));
      }
}

TEST_CASE("gpu: user kernels on mma.sync for sm_80 and sm_89 (PTX on this GPU) match the reference") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(13);
  const char* kMma = "tensor cores (mma.sync)";
  for (const char* json : {R"({"blocks":{"m":128,"n":128,"k":32},"num_warps":8,"knobs":{"lowering":0}})",
                           R"({"blocks":{"m":64,"n":64,"k":64},"num_warps":4,"knobs":{"lowering":0}})"}) {
    const Config c = Config::from_json(json);
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{256, 256, 512}, {200, 136, 328}})
      for (bool kn : {false, true}) {
        CAPTURE(json);
        CAPTURE(fmt::format("sm_80 gemm_bias_gelu {} x {} x {}, b {}", m, n, k, kn ? "[K, N]" : "[N, K]"));
        std::vector<HostTensor> t = {random_tensor(DType::bf16, {m, k}, rng, 0.5),
                                     random_tensor(DType::bf16, kn ? std::vector<int64_t>{k, n} : std::vector<int64_t>{n, k}, rng, 0.5),
                                     random_tensor(DType::f32, {n}, rng), HostTensor(DType::bf16, {m, n})};
        const Outcome o = run_both(examples::gemm_bias_gelu(kn), t, {}, 3, c, "sm_80");
        CHECK(o.lowering == kMma);
        CHECK(o.nan_count == 0);
        CHECK(o.rel_rmse < 1e-2);
      }
  }
  struct Case {
    DType t;
    std::vector<int64_t> shape;
    bool causal;
    const char* arch;
    const char* config;
    double tol;
  };
  const std::vector<Case> cases = {
      {DType::bf16, {2, 3, 300, 128}, true, "sm_80", R"({"blocks":{"m":64,"n":64},"num_warps":4})", 1e-2},
      {DType::f16, {1, 2, 256, 64}, false, "sm_80", R"({"blocks":{"m":128,"n":64},"num_warps":8})", 2e-3},
      {DType::e4m3, {1, 2, 190, 64}, true, "sm_89", R"({"blocks":{"m":64,"n":64},"num_warps":4})", 6e-2},
  };
  for (const Case& c : cases) {
    CAPTURE(fmt::format("{} {} {} causal={} {}", c.arch, name(c.t), fmt::join(c.shape, "x"), c.causal, c.config));
    std::vector<HostTensor> t = {random_tensor(c.t, c.shape, rng), random_tensor(c.t, c.shape, rng),
                                 random_tensor(c.t, c.shape, rng), HostTensor(DType::bf16, c.shape)};
    const double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(c.shape[3]));
    const Outcome o = run_both(examples::readme_attention(), t, {scale, c.causal}, 3, Config::from_json(c.config), c.arch);
    CHECK(o.lowering == kMma);
    CHECK(o.nan_count == 0);
    CHECK(o.rel_rmse < c.tol);
  }
}

TEST_CASE("gpu: a grouped GEMM (MoE) whose row ranges are read from the GPU matches the reference, on wgmma and mma.sync") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(17);
  // 8 experts of uneven sizes, one empty.
  const std::vector<double> offs = {0, 300, 301, 301, 700, 1000, 1129, 1500, 1536};
  const int64_t T = 1536, G = 8, N = 512, K = 384;
  for (const char* arch : {"", "sm_80"}) {
    CAPTURE(std::string(arch));
    HostTensor o(DType::i64, {G + 1});
    for (int64_t i = 0; i <= G; ++i) o.set(i, offs[i]);
    std::vector<HostTensor> t = {random_tensor(DType::bf16, {T, K}, rng, 0.5), random_tensor(DType::bf16, {G, N, K}, rng, 0.5), o,
                                 HostTensor(DType::bf16, {T, N})};
    const ir::Function f = examples::grouped_gemm().trace({TensorSpec{DType::bf16, {T, K}}, TensorSpec{DType::bf16, {G, N, K}},
                                                           TensorSpec{DType::i64, {G + 1}}, TensorSpec{DType::bf16, {T, N}}});
    const Outcome r = run_both(examples::grouped_gemm(), t, {}, 3, codegen::untuned_config(f, *arch ? arch : "sm_90a"), arch);
    CHECK(r.lowering == (*arch ? "tensor cores (mma.sync)" : "tensor cores (wgmma)"));
    CHECK(r.nan_count == 0);
    CHECK(r.rel_rmse < 1e-2);
  }
}

TEST_CASE("gpu: varlen attention over packed sequences (row ranges read from the GPU) matches the reference, on wgmma and mma.sync") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(19);
  // 5 sequences of uneven lengths (one of a single row, one empty), 8 query heads on 2 kv heads.
  const std::vector<double> cu = {0, 300, 301, 301, 812, 1000};
  const int64_t B = 5, T = 1000, H = 8, Hkv = 2, D = 128;
  const double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(D));
  for (const char* arch : {"", "sm_80"})
    for (bool causal : {false, true}) {
      CAPTURE(std::string(arch));
      CAPTURE(causal);
      HostTensor c(DType::i64, {B + 1});
      for (int64_t i = 0; i <= B; ++i) c.set(i, cu[i]);
      std::vector<HostTensor> t = {random_tensor(DType::bf16, {T, H, D}, rng), random_tensor(DType::bf16, {T, Hkv, D}, rng),
                                   random_tensor(DType::bf16, {T, Hkv, D}, rng), c, c, HostTensor(DType::bf16, {T, H, D})};
      const ir::Function f = examples::attention_varlen().trace(
          {TensorSpec{DType::bf16, {T, H, D}}, TensorSpec{DType::bf16, {T, Hkv, D}}, TensorSpec{DType::bf16, {T, Hkv, D}},
           TensorSpec{DType::i64, {B + 1}}, TensorSpec{DType::i64, {B + 1}}, TensorSpec{DType::bf16, {T, H, D}},
           RuntimeScalar{static_cast<float>(scale)}, causal});
      Config cfg = codegen::untuned_config(f, *arch ? arch : "sm_90a");
      if (!*arch) cfg.blocks["n"] = 64;   // no spills (tests/test_mma.cpp)
      const Outcome r = run_both(examples::attention_varlen(), t, {scale, causal}, 5, cfg, arch);
      CHECK(r.lowering == (*arch ? "tensor cores (mma.sync)" : "tensor cores (wgmma)"));
      CHECK(r.nan_count == 0);
      CHECK(r.rel_rmse < 1e-2);
    }
}

TEST_CASE("gpu: a launch whose dots stay on the SIMT path says so once, with the dot's line and the reason") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(3);
  std::vector<HostTensor> t = {random_tensor(DType::f32, {64, 64}, rng), random_tensor(DType::f32, {64, 64}, rng),
                               random_tensor(DType::f32, {64}, rng), HostTensor(DType::bf16, {64, 64})};
  const Config c = Config::from_json(R"({"blocks":{"m":64,"n":64,"k":32},"knobs":{"lowering":0}})");
  for (int launch = 0; launch < 2; ++launch) {
    const Outcome o = run_both(examples::gemm_bias_gelu(false), t, {}, 3, c);
    CHECK(o.lowering == "simt");
    CHECK(o.rel_rmse < 1e-2);
  }
  int found = 0;
  for (const std::string& r : simt_dot_reports())
    if (r.find("kernel 'gemm_bias_gelu_nk': dot at ") != std::string::npos && r.find("user_kernels.cpp:") != std::string::npos &&
        r.find("operands f32 x f32") != std::string::npos && r.find("stays on the SIMT path") != std::string::npos)
      ++found;
  CHECK(found == 1);
}

TEST_CASE("gpu: attention variants written as user code (sink logits, MLA head dims, head dim 96) match the reference") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(13);
  const double scale = 1.4426950408889634 / std::sqrt(128.0);
  // "": the untuned config; "+...": knobs over it.
  for (const char* config : {"", R"(+{"knobs":{"overlap":1}})", R"(+{"knobs":{"overlap":0}})", R"({"blocks":{"m":64,"n":64},"num_warps":4,"num_stages":2})"}) {
    CAPTURE(std::string(config));
    auto cfg_for = [&](const Kernel& k, const std::vector<HostTensor>& t, const std::vector<Arg>& tail) {
      if (*config && *config != '+') return Config::from_json(config);
      std::vector<Arg> args;
      for (const auto& x : t) args.push_back(x.view());
      args.insert(args.end(), tail.begin(), tail.end());
      const Config base = codegen::untuned_config(k.trace(specs_for(k, args, false)), "sm_90a");
      return *config ? Config::from_json(config + 1, base) : base;
    };
    {
      const std::vector<int64_t> s = {2, 3, 200, 128};
      std::vector<HostTensor> t = {random_tensor(DType::bf16, s, rng), random_tensor(DType::bf16, s, rng),
                                   random_tensor(DType::bf16, s, rng), random_tensor(DType::f32, {3}, rng, 2.0),
                                   HostTensor(DType::bf16, s)};
      const std::vector<Arg> tail = {scale};
      const Outcome o = run_both(examples::sink_attention(), t, tail, 4, cfg_for(examples::sink_attention(), t, tail));
      CHECK(o.lowering == "tensor cores (wgmma)");
      CHECK(o.nan_count == 0);
      CHECK(o.rel_rmse < 1e-2);
    }
    {
      const std::vector<int64_t> sqk = {1, 3, 300, 192}, sv = {1, 3, 300, 128};
      std::vector<HostTensor> t = {random_tensor(DType::bf16, sqk, rng), random_tensor(DType::bf16, sqk, rng),
                                   random_tensor(DType::bf16, sv, rng), HostTensor(DType::bf16, sv)};
      const std::vector<Arg> tail = {scale};
      const Outcome o = run_both(examples::mla_attention(), t, tail, 3, cfg_for(examples::mla_attention(), t, tail));
      CHECK(o.lowering == "tensor cores (wgmma)");
      CHECK(o.nan_count == 0);
      CHECK(o.rel_rmse < 1e-2);
    }
    {
      const std::vector<int64_t> s = {2, 2, 256, 96};
      std::vector<HostTensor> t = {random_tensor(DType::bf16, s, rng), random_tensor(DType::bf16, s, rng),
                                   random_tensor(DType::bf16, s, rng), HostTensor(DType::bf16, s)};
      const std::vector<Arg> tail = {scale, true};
      const Outcome o = run_both(examples::readme_attention(), t, tail, 3, cfg_for(examples::readme_attention(), t, tail));
      CHECK(o.lowering == "tensor cores (wgmma)");
      CHECK(o.nan_count == 0);
      CHECK(o.rel_rmse < 1e-2);
    }
  }
}

TEST_CASE("gpu: attention backward as user code (dK / dV and dQ) on wgmma and mma.sync matches the reference") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(17);
  const int64_t B = 1, H = 2, S = 200, D = 128;   // S ragged against every block
  const std::vector<int64_t> shape = {B, H, S, D}, rows = {B, H, S};
  const double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(D));   // log2 units
  for (bool causal : {false, true})
    for (const char* arch : {"sm_90a", "sm_80"}) {
      CAPTURE(causal);
      CAPTURE(std::string(arch));
      const HostTensor q = random_tensor(DType::bf16, shape, rng), k = random_tensor(DType::bf16, shape, rng),
                       v = random_tensor(DType::bf16, shape, rng), dout = random_tensor(DType::bf16, shape, rng);
      // The forward's LSE (log2 units) in float64; delta = rowsum(dO * O) may be any row vector here.
      HostTensor lse(DType::f32, rows), delta = random_tensor(DType::f32, rows, rng, 0.1);
      for (int64_t bh = 0; bh < B * H; ++bh)
        for (int64_t i = 0; i < S; ++i) {
          std::vector<double> s;
          for (int64_t j = 0; j < (causal ? i + 1 : S); ++j) {
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += q.at((bh * S + i) * D + d) * k.at((bh * S + j) * D + d);
            s.push_back(dot * scale);
          }
          const double mx = *std::max_element(s.begin(), s.end());
          double sum = 0;
          for (double x : s) sum += std::exp2(x - mx);
          lse.set(bh * S + i, mx + std::log2(sum));
        }
      const std::vector<Arg> tail = {scale, causal};
      const std::string lowering = std::string(arch) == "sm_80" ? "tensor cores (mma.sync)" : "tensor cores (wgmma)";
      std::vector<HostTensor> kv = {q, k, v, dout, lse, delta, HostTensor(DType::bf16, shape), HostTensor(DType::bf16, shape)};
      const Config ckv = untuned_for(kernels::attention_bwd_dkdv(), kv, tail, arch);
      for (size_t out : {size_t{6}, size_t{7}}) {
        CAPTURE(out == 6 ? "dk" : "dv");
        const Outcome o = run_both(kernels::attention_bwd_dkdv(), kv, tail, out, ckv, arch);
        CHECK(o.lowering == lowering);
        CHECK(o.nan_count == 0);
        CHECK(o.rel_rmse < 2e-2);
      }
      std::vector<HostTensor> qt = {q, k, v, dout, lse, delta, HostTensor(DType::bf16, shape)};
      const Outcome o = run_both(kernels::attention_bwd_dq(), qt, tail, 6, untuned_for(kernels::attention_bwd_dq(), qt, tail, arch), arch);
      CAPTURE("dq");
      CHECK(o.lowering == lowering);
      CHECK(o.nan_count == 0);
      CHECK(o.rel_rmse < 2e-2);
    }
}

TEST_CASE("gpu: atomic adds (split-K GEMM on wgmma and mma.sync, the fused attention backward's dQ) match the reference") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(23);
  // Split-K GEMM: 3 x 2 x 4 programs add into each output tile; c starts from random values (an
  // atomic add keeps them). Ragged M and N; K split into tiles of 128 (its last one partial).
  for (const char* arch : {"sm_90a", "sm_80"}) {
    CAPTURE(std::string(arch));
    std::vector<HostTensor> t = {random_tensor(DType::bf16, {300, 464}, rng), random_tensor(DType::bf16, {200, 464}, rng),
                                 random_tensor(DType::f32, {300, 200}, rng)};
    Config c = untuned_for(examples::splitk_gemm(), t, {}, arch);
    c.blocks["ks"] = 128;
    const Outcome o = run_both(examples::splitk_gemm(), t, {}, 2, c, arch, /*keep_out=*/true);
    CHECK(o.lowering == (std::string(arch) == "sm_80" ? "tensor cores (mma.sync)" : "tensor cores (wgmma)"));
    CHECK(o.nan_count == 0);
    CHECK(o.rel_rmse < 1e-5);   // f32 sums of the same bf16 products, in another order
  }
  // The SIMT path: every program adds a slice into the same tiles, rank-1 slices, masked, a scalar,
  // transposed (f32 and i32; each output starts from random values).
  for (DType dt : {DType::f32, DType::i32}) {
    CAPTURE(name(dt));
    const std::vector<std::vector<int64_t>> shapes = {{3, 70, 45}, {70, 45}, {45}, {70, 45}, {1}, {45, 70}};
    for (size_t out = 1; out < shapes.size(); ++out) {
      CAPTURE(out);
      std::vector<HostTensor> t;
      for (const auto& s : shapes) {
        HostTensor h = random_tensor(DType::f32, s, rng, 4.0);
        HostTensor x(dt, s);
        for (int64_t i = 0; i < h.numel(); ++i) x.set(i, dt == DType::i32 ? std::round(h.at(i)) : h.at(i));
        t.push_back(std::move(x));
      }
      t.emplace_back(dt, std::vector<int64_t>{3, 45, 70});
      const Outcome o = run_both(tj_codegen_test::k_atomic_add(), t, {}, out, Config::from_json(R"({"blocks":{"r":32,"c":16},"num_warps":4})"),
                                 "", /*keep_out=*/true);
      CHECK(o.nan_count == 0);
      // f32: the adds come in another order; the total (out 4) sums 9450 terms of either sign.
      CHECK(o.rel_rmse <= (dt == DType::i32 ? 0.0 : out == 4 ? 1e-4 : 1e-6));
    }
  }
  // The attention backward in one pass: dK, dV stored, dQ added by every key tile (dq_acc starts
  // from random values).
  const int64_t B = 1, H = 2, S = 200, D = 128;
  const std::vector<int64_t> shape = {B, H, S, D}, rows = {B, H, S};
  const double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(D));
  for (bool causal : {false, true})
    for (const char* arch : {"sm_90a", "sm_80"}) {
      CAPTURE(causal);
      CAPTURE(std::string(arch));
      const HostTensor q = random_tensor(DType::bf16, shape, rng), k = random_tensor(DType::bf16, shape, rng),
                       v = random_tensor(DType::bf16, shape, rng), dout = random_tensor(DType::bf16, shape, rng);
      // Any row vectors for lse and delta: the kernels' arithmetic is what is compared here.
      const HostTensor lse = random_tensor(DType::f32, rows, rng, 0.5), delta = random_tensor(DType::f32, rows, rng, 0.1);
      const HostTensor dq0 = random_tensor(DType::f32, shape, rng);
      const std::vector<Arg> tail = {scale, causal};
      for (size_t out : {size_t{6}, size_t{7}, size_t{8}}) {
        CAPTURE(out == 6 ? "dk" : out == 7 ? "dv" : "dq_acc");
        std::vector<HostTensor> t = {q, k, v, dout, lse, delta, HostTensor(DType::bf16, shape), HostTensor(DType::bf16, shape), dq0};
        const Config c = untuned_for(kernels::attention_bwd_fused(), t, tail, arch);
        const Outcome o = run_both(kernels::attention_bwd_fused(), t, tail, out, c, arch, /*keep_out=*/out == 8);
        CHECK(o.lowering == (std::string(arch) == "sm_80" ? "tensor cores (mma.sync)" : "tensor cores (wgmma)"));
        CHECK(o.nan_count == 0);
        CHECK(o.rel_rmse < 2e-2);
      }
    }
}
