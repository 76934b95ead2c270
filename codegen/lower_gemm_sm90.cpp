// The sm_90a GEMM lowering (see lower_gemm_sm90.h): the shared pattern match
// (codegen/gemm_pattern.h), then CUDA emission that instantiates tj::dev::Sm90Gemm
// (codegen/device/hopper_gemm.cuh) around the epilogue the shared writer generates.
#include "codegen/lower_gemm_sm90.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "codegen/emitter_knobs.h"
#include "codegen/gemm_pattern.h"
#include "codegen/lowering.h"
#include "codegen/mma_plan.h"
#include "dsl/ir.h"
#include "core/error.h"

namespace tj::codegen {

namespace {

// FP8 wgmma accumulates with fewer bits than fp32 (errors grow with K), so fp8 GEMMs promote
// into fp32 registers every 4 K blocks unless the config sets "promote": 0 -- precise by
// default, like cuBLASLt without fast accumulation. Every 4 (512 elements of K with 128-byte
// blocks): on an H100 the fastest interval measured (1 and 2 cost 10-40% more), with f32-output
// errors of ~2e-4 at K = 16384 and bf16-output errors equal to cuBLASLt's (bench/RESULTS.md).
int64_t promote_fallback(const gemm::Match& g) { return is_fp8(g.ta) ? 4 : 0; }

// ---- knobs --------------------------------------------------------------------------------------

const KnobSpec kWarpSpecialize{"warp_specialize", 0, "0",
                               "0: cooperative when block m >= 128, else pingpong; 1: cooperative (two consumer warpgroups "
                               "share a tile); 2: pingpong (one consumer warpgroup per tile)"};
const KnobSpec kCluster{"cluster", 1, "1 (the untuned config: 2)", "1, or 2: CTA pairs share B by TMA multicast"};
const KnobSpec kRasterGroup{"raster_group", 8, "8", "tile-row group height of the grid's rasterization, for L2 reuse"};
const KnobSpec kPromote{"promote", 4, "4 for fp8, else 0",
                        "fp8: every P stages' partial products are added into an fp32 accumulator (0: the tensor core's own, "
                        "faster and less precise, fp8 accumulation)"};
const KnobSpec kStagedStore{"staged_store", 1, "1", "the epilogue stores through shared memory in 16-byte pieces where it fits"};
const bool knobs_registered =
    register_knob_table("sm90_gemm", {&kWarpSpecialize, &kCluster, &kRasterGroup, &kPromote, &kStagedStore, &knobs::fast_math});

// ---- the chosen configuration --------------------------------------------------------------

struct Plan {
  int bm = 0, bn = 0, bk_elems = 0, bk_bytes = 0, stages = 0, cluster = 1, group = 8, promote = 0;
  bool pingpong = false;
  bool staged_store = false;   // the epilogue stores through shared memory (gemm_common.cuh)
  int wg_m = 0, m_blocks = 0, swz_bytes = 0;
  int64_t smem = 0;
};

Plan plan_config(const gemm::Match& g, const ir::Function& f, const Config& cfg, const Target& t) {
  Plan p;
  p.bm = static_cast<int>(cfg.block(f, g.m_block));
  p.bn = static_cast<int>(cfg.block(f, g.n_block));
  p.bk_elems = static_cast<int>(cfg.block(f, g.k_block));
  const int esize = size_bytes(g.ta);
  p.bk_bytes = p.bk_elems * esize;
  p.stages = cfg.num_stages;
  p.cluster = static_cast<int>(kCluster.of(cfg));
  p.group = static_cast<int>(kRasterGroup.of(cfg));
  p.promote = static_cast<int>(kPromote.of(cfg, promote_fallback(g)));
  const int64_t ws = kWarpSpecialize.of(cfg);
  const std::string& mname = f.blocks.at(g.m_block).name;
  const std::string& nname = f.blocks.at(g.n_block).name;
  const std::string& kname = f.blocks.at(g.k_block).name;
  auto fail = [&](const std::string& why) {
    return Error(fmt::format("kernel '{}' with config {}: the sm_90a GEMM lowering (wgmma + TMA) cannot use this config: {} "
                             "(or set knob \"lowering\": 0 for the SIMT path)",
                             f.name, cfg.to_json(), why));
  };
  if (ws < 0 || ws > 2) throw fail(fmt::format("knob warp_specialize must be 0 (auto), 1 (cooperative) or 2 (pingpong), got {}", ws));
  p.pingpong = ws == 2 || (ws == 0 && p.bm < 128);
  p.wg_m = p.pingpong ? p.bm : p.bm / 2;
  if (p.wg_m != 64 && p.wg_m != 128)
    throw fail(p.pingpong ? fmt::format("pingpong needs block '{}' = 64 or 128, got {}", mname, p.bm)
                          : fmt::format("cooperative needs block '{}' = 128 or 256, got {}", mname, p.bm));
  p.m_blocks = p.wg_m / 64;
  if (p.bn < 16 || p.bn > 256 || p.bn % 16 != 0)
    throw fail(fmt::format("block '{}' must be a multiple of 16 in [16, 256] (wgmma n), got {}", nname, p.bn));
  if (p.bk_bytes != 32 && p.bk_bytes != 64 && p.bk_bytes != 128 && p.bk_bytes != 256 && p.bk_bytes != 512)
    throw fail(fmt::format("block '{}' x {} bytes must be 32, 64, 128, 256 or 512 bytes, got {} elements", kname, esize,
                           p.bk_elems));
  p.swz_bytes = std::min(p.bk_bytes, 128);
  if (p.cluster != 1 && p.cluster != 2) throw fail(fmt::format("knob cluster must be 1 or 2, got {}", p.cluster));
  if (p.group < 1) throw fail(fmt::format("knob raster_group must be >= 1, got {}", p.group));
  if (p.promote < 0 || p.promote > 16)
    throw fail(fmt::format("knob promote must be 0 (off) or a promotion interval of 1 to 16 stages, got {}", p.promote));
  if (p.promote && !is_fp8(g.ta))
    throw fail("knob promote is for fp8 inputs (16-bit wgmma accumulates in fp32 already)");
  const int acc = p.m_blocks * p.bn / 2 * (p.promote ? 2 : 1);
  if (acc > 192)
    throw fail(fmt::format("{} accumulator registers per thread ({} rows x {} columns per consumer warpgroup{}) exceed the "
                           "192 the consumers can hold{}",
                           acc, p.wg_m, p.bn, p.promote ? ", doubled by fp32 promotion" : "",
                           p.promote ? "; use a smaller tile, or set knob \"promote\": 0 for the tensor core's own "
                                       "(faster, less precise) fp8 accumulation"
                                     : ""));
  if (p.stages < 1) throw fail("num_stages must be >= 1");
  const int64_t stage = int64_t(p.bm + p.bn) * p.bk_bytes;
  p.smem = 1024 + p.stages * stage + (2 * p.stages + 2) * 8;
  // The epilogue's output staging (8 consumer warps) where it fits beside the stages; otherwise
  // the accumulator layout's direct stores.
  const int64_t staging = 8 * gemm::staged_store_bytes_per_warp(p.m_blocks);
  p.staged_store = kStagedStore.on(cfg) && ((p.smem + 15) & ~int64_t(15)) + staging <= t.max_smem_per_block();
  if (p.staged_store) p.smem = ((p.smem + 15) & ~int64_t(15)) + staging;
  if (p.smem > t.max_smem_per_block())
    throw fail(fmt::format("{} stages of {} bytes ({}x{} A and {}x{} B bytes) need {} bytes of shared memory, more than the "
                           "{} bytes a block can use",
                           p.stages, stage, p.bm, p.bk_bytes, p.bn, p.bk_bytes, p.smem, t.max_smem_per_block()));
  return p;
}

// ---- emission -----------------------------------------------------------------------------------

GeneratedKernel write_kernel(const gemm::Match& g, const Plan& p, const Config& cfg, const Target& target) {
  const ir::Function& f = *g.f;
  gemm::EpilogueWriter w(g, cfg);

  // ---- header
  std::string src;
  const std::string esize_name(name(g.ta));
  src += fmt::format("// tilejit: kernel '{}' for {}, generated by the sm_90a GEMM lowering (codegen/lower_gemm_sm90.cpp).\n",
                     f.name, target.arch);
  src += fmt::format("// config: {}\n", cfg.to_json());
  src += fmt::format("// {} x {} tiles ({}), {} bytes of K per stage, {} stages, cluster {}, raster group {}{}; "
                     "{} x {} x {} wgmma ({} x {}).\n",
                     p.bm, p.bn, p.pingpong ? "pingpong: one consumer warpgroup per tile" : "cooperative: two consumer warpgroups per tile",
                     p.bk_bytes, p.stages, p.cluster, p.group,
                     p.promote ? fmt::format(", fp32 promotion every {} stage(s)", p.promote) : std::string(), 64, p.bn,
                     is_fp8(g.ta) ? 32 : 16, esize_name, name(g.tb));
  src += "// 384 threads: a TMA producer warpgroup and two wgmma consumer warpgroups (codegen/device/hopper_gemm.cuh);\n"
         "// the epilogue below runs in the accumulator layout: per thread, rows tj_row0 + 64*mb + 8*h and\n"
         "// column pairs tj_col0 + 8*j + {0, 1}. Each statement ends with `// @ file:line` (the DSL line).\n";
  src += "#include \"tile.cuh\"\n#include \"hopper_gemm.cuh\"\n\n";
  // hopper_wgmma.cuh predefines the common wgmma widths; any other n (e.g. 160, 224) gets its own.
  static const int kPredefined[] = {8, 16, 32, 64, 96, 128, 192, 256};
  if (std::find(std::begin(kPredefined), std::end(kPredefined), p.bn) == std::end(kPredefined))
    src += fmt::format("TJ_WGMMA_DEFINE({})\n\n", p.bn);
  src += fmt::format("using tj_cfg = tj::dev::Sm90GemmCfg<{}, {}, {}, {}, {}, {}, {}, {}, {}>;\n\n", wgmma_type(g.ta),
                     wgmma_type(g.tb), p.bm, p.bn, p.bk_bytes, p.stages, p.pingpong ? "true" : "false", p.cluster,
                     p.promote);
  std::vector<std::string> params = w.kernel_params();
  params.push_back("const __grid_constant__ tj::dev::TmaDescriptor tj_tma_a");
  params.push_back("const __grid_constant__ tj::dev::TmaDescriptor tj_tma_b");
  params.push_back("long long tj_programs");
  const std::string entry = w.entry_name();

  // ---- body
  w.line("(void)tj_programs;   // the main loop derives its tiles from the loop bounds");
  w.line("extern __shared__ __align__(1024) unsigned char tj_smem[];");
  w.line("// Loop bounds and other values every program computes.");
  w.emit_hoisted();
  w.line("tj::dev::GemmProblem tj_problem;");
  w.line(fmt::format("tj_problem.M = (int)({});", w.ref(g.lm->operands[1])), &g.lm->loc);
  w.line(fmt::format("tj_problem.N = (int)({});", w.ref(g.ln->operands[1])), &g.ln->loc);
  w.line(fmt::format("tj_problem.K = (int)({});", w.ref(g.lk->operands[1])), &g.lk->loc);
  w.line(fmt::format("tj_problem.group_m = {};", p.group));
  w.line("tj::dev::Sm90Gemm<tj_cfg> tj_g;");
  w.line("tj_g.init(tj_smem, tj_problem);");
  w.line("if (tj_g.is_producer()) {");
  w.line(fmt::format("  tj_g.produce(&tj_tma_a, &tj_tma_b);   // TMA: '{}' [{} x {} elements], '{}' [{} x {}] per stage",
                     f.params[g.load_a->param].name, p.bm, p.bk_elems, f.params[g.load_b->param].name, p.bn, p.bk_elems),
         &g.dot->loc);
  w.line("} else {");
  w.indent(1);
  w.line("tj_g.consumer_begin();");
  w.emit_scalar_epilogue();
  w.emit_store_setup();
  w.line(fmt::format("float tj_acc[{}][{}];", p.m_blocks, p.bn / 2));
  w.line("tj_g.zero(tj_acc);");
  // Every tile: the K loop, then this epilogue (Sm90Gemm::consume overlaps it with the next
  // tile's first K block where it can).
  w.line("tj_g.consume(tj_acc, [&]() {   // the K loop, then per tile:", &g.lk->loc);
  w.indent(1);
  w.line("const long long tj_row0 = (long long)tj_g.m0 + tj::dev::acc_row(0, tj_g.tid);");
  w.line("const long long tj_col0 = (long long)tj_g.n0 + 2 * (tj_g.tid & 3);");
  gemm::AccLayout layout{p.m_blocks, 64, p.bn / 8, "", "", "", "", ""};
  if (p.staged_store) {   // the consumer warps' own buffers past the barriers
    layout.stage_buf = fmt::format("tj_g.scratch + ((int)(threadIdx.x >> 5) - 4) * {}",
                                   gemm::staged_store_bytes_per_warp(p.m_blocks));
    layout.warp_row0 = "(long long)tj_g.m0 + 16 * (tj_g.tid >> 5)";
    layout.warp_col0 = "(long long)tj_g.n0";
    layout.lane = "tj_g.tid & 31";
  }
  w.emit_tile_epilogue(layout);
  w.indent(-1);
  w.line("});");
  w.indent(-1);
  w.line("}");
  w.line("tj_g.finish();");

  GeneratedKernel k;
  k.name = f.name;
  k.entry = entry;
  k.threads = 384;
  k.dynamic_smem_bytes = static_cast<size_t>(p.smem);
  k.device_headers = {"tile.cuh", "fp8.cuh", "hopper.cuh", "hopper_wgmma.cuh", "gemm_common.cuh", "hopper_gemm.cuh"};
  const int esz = size_bytes(g.ta);
  k.tma.push_back(TmaOperand{g.load_a->param, {p.bm, p.swz_bytes / esz}, p.swz_bytes, {}});
  k.tma.push_back(TmaOperand{g.load_b->param, {p.bn / p.cluster, p.swz_bytes / esz}, p.swz_bytes, {}});
  k.cluster_x = p.cluster;
  k.persistent = true;
  k.blocks_per_sm = 1;
  k.source = src;
  k.source += fmt::format("extern \"C\" __global__ void __launch_bounds__(384, 1) {}({}) {{\n", entry, fmt::join(params, ", "));
  k.source += w.body();
  k.source += "}\n";
  return k;
}

std::optional<GeneratedKernel> try_lower(const ir::Function& f, const Config& cfg, const Target& t) {
  if (!t.has_wgmma()) return std::nullopt;
  gemm::Match g;
  if (!gemm::match(f, g)) return std::nullopt;
  // Static K whose rows cannot start at 16-byte multiples in a contiguous tensor: no TMA.
  if (gemm::static_rows_misaligned(g, 16)) return std::nullopt;
  Plan p = plan_config(g, f, cfg, t);
  return write_kernel(g, p, cfg, t);
}

const bool registered = [] {
  register_lowering(PatternLowering{"sm90_gemm", &try_lower});
  codegen::register_knob_provider("sm90_gemm", [](const ir::Function& f, const std::string& arch) {
    std::vector<codegen::Knob> knobs;
    gemm::Match g;
    if (arch != "sm_90a" || !gemm::match(f, g)) return knobs;
    knobs.push_back({kWarpSpecialize.name, {0, 1, 2}, kWarpSpecialize.fallback});
    knobs.push_back({kCluster.name, {1, 2}, kCluster.fallback});
    knobs.push_back({kRasterGroup.name, {1, 4, 8, 16}, kRasterGroup.fallback});
    if (is_fp8(g.ta)) knobs.push_back({kPromote.name, {0, 1, 2, 4}, promote_fallback(g)});
    return knobs;
  });
  // Untuned: the tiles that measured best across bench_gemm's shapes (bench/RESULTS.md: fp8
  // promoted on the H100, bf16 on the H200). fp8: 4 stages of 128x192 beat 5 once the staged
  // epilogue takes its 10 KB (H100: 8192^3 +1.4%, 16384^3 +9%, 4096^3 equal).
  codegen::register_default_config_provider("sm90_gemm", [](const ir::Function& f, const std::string& arch) {
    std::optional<Config> c;
    gemm::Match g;
    if (arch != "sm_90a" || !gemm::match(f, g)) return c;
    const bool fp8 = is_fp8(g.ta);
    c = gemm::tile_config(g, 128, fp8 ? 192 : 256, fp8 ? 128 : 64);
    c->num_stages = 4;
    c->knobs[kCluster.name] = 2;
    return c;
  });
  return true;
}();

}  // namespace

bool is_sm90_gemm_pattern(const ir::Function& f) {
  gemm::Match g;
  return gemm::match(f, g);
}

std::optional<GeneratedKernel> lower_gemm_sm90(const ir::Function& f, const Config& cfg, const Target& t) {
  return try_lower(f, cfg, t);
}

}  // namespace tj::codegen

