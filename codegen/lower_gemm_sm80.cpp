// The sm_80 / sm_89 GEMM lowering (see lower_gemm_sm80.h): the shared pattern match
// (codegen/gemm_pattern.h), a config plan, then CUDA that instantiates tj::dev::Sm80Gemm
// (codegen/device/ampere_gemm.cuh) around the epilogue the shared writer generates.
#include "codegen/lower_gemm_sm80.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "codegen/emitter_knobs.h"
#include "codegen/gemm_pattern.h"
#include "codegen/lowering.h"
#include "dsl/ir.h"
#include "core/error.h"

namespace tj::codegen {

namespace {

const KnobSpec kRasterGroup{"raster_group", 8, "8", "tile-row group height of the grid's rasterization, for L2 reuse"};
const KnobSpec kStagedStore{"staged_store", 1, "1", "the epilogue stores through shared memory in 16-byte pieces where it fits"};
const bool knobs_registered = register_knob_table("sm80_gemm", {&kRasterGroup, &kStagedStore, &knobs::fast_math});

const char* mma_type(DType t) {
  switch (t) {
    case DType::e4m3: return "tj::dev::MMA_E4M3";
    case DType::e5m2: return "tj::dev::MMA_E5M2";
    case DType::bf16: return "tj::dev::MMA_BF16";
    default: return "tj::dev::MMA_F16";
  }
}

// Whether the target has mma.sync for the operand types: 16-bit on every target this lowering
// serves, fp8 from sm_89.
bool target_has_mma_for(const gemm::Match& g, const Target& t) { return !is_fp8(g.ta) || t.has_fp8(); }

// ---- the chosen configuration --------------------------------------------------------------

struct Plan {
  int bm = 0, bn = 0, bk_elems = 0, bk_bytes = 0, stages = 0, group = 8;
  int warps = 0, warps_m = 0, warps_n = 0;
  int wm = 0, wn = 0;               // rows and columns per warp
  int m_tiles = 0, n_tiles = 0;     // m16 / n8 mma tiles per warp
  int64_t smem = 0;
  bool staged_store = false;        // the epilogue stores through the (then free) stage memory
};

// The split of `warps` warps over a bm x bn tile: every warp a multiple of 16 rows and of 16
// columns, as square as possible (fewest shared-memory reads per mma), ties to more rows per
// warp. False when no split works.
bool split_warps(int bm, int bn, int warps, int& warps_m, int& warps_n) {
  double best = -1;
  for (int wm = 1; wm <= warps; wm *= 2) {
    const int wn = warps / wm;
    if (bm % (16 * wm) != 0 || bn % (16 * wn) != 0) continue;
    const double skew = std::abs(std::log2(double(bm / wm) / double(bn / wn)));
    const bool more_rows = best >= 0 && skew == best && bm / wm > bn / wn;
    if (best < 0 || skew < best || more_rows) {
      best = skew;
      warps_m = wm;
      warps_n = wn;
    }
  }
  return best >= 0;
}

Plan plan_config(const gemm::Match& g, const ir::Function& f, const Config& cfg, const Target& t) {
  Plan p;
  p.bm = static_cast<int>(cfg.block(f, g.m_block));
  p.bn = static_cast<int>(cfg.block(f, g.n_block));
  p.bk_elems = static_cast<int>(cfg.block(f, g.k_block));
  const int esize = size_bytes(g.ta);
  p.bk_bytes = p.bk_elems * esize;
  p.stages = cfg.num_stages;
  p.warps = cfg.num_warps;
  p.group = static_cast<int>(kRasterGroup.of(cfg));
  const std::string& mname = f.blocks.at(g.m_block).name;
  const std::string& nname = f.blocks.at(g.n_block).name;
  const std::string& kname = f.blocks.at(g.k_block).name;
  auto fail = [&](const std::string& why) {
    return Error(fmt::format("kernel '{}' with config {}: the {} GEMM lowering (mma.sync + cp.async) cannot use this config: {} "
                             "(or set knob \"lowering\": 0 for the SIMT path)",
                             f.name, cfg.to_json(), t.arch, why));
  };
  if (p.warps < 1 || p.warps > 16 || (p.warps & (p.warps - 1)) != 0)
    throw fail(fmt::format("num_warps must be 1, 2, 4, 8 or 16, got {}", p.warps));
  if (p.bk_bytes != 32 && p.bk_bytes != 64 && p.bk_bytes != 128 && p.bk_bytes != 256)
    throw fail(fmt::format("block '{}' x {} bytes must be 32, 64, 128 or 256 bytes (mma k steps of 32 bytes), got {} elements",
                           kname, esize, p.bk_elems));
  if (!split_warps(p.bm, p.bn, p.warps, p.warps_m, p.warps_n))
    throw fail(fmt::format("block '{}' = {} x block '{}' = {} cannot be split over {} warps so that each warp gets a multiple "
                           "of 16 rows and of 16 columns (use fewer warps or larger blocks)",
                           mname, p.bm, nname, p.bn, p.warps));
  p.wm = p.bm / p.warps_m;
  p.wn = p.bn / p.warps_n;
  p.m_tiles = p.wm / 16;
  p.n_tiles = p.wn / 8;
  // A thread holds its warp's accumulators (wm x wn / 32) next to fragments and addresses; a
  // block of 32 * warps threads has 64K registers.
  const int acc = p.wm * p.wn / 32;
  const int acc_limit = std::min(128, 65536 / (32 * p.warps) / 2);
  if (acc > acc_limit)
    throw fail(fmt::format("{} accumulator registers per thread ({} x {} per warp) exceed the {} a thread can hold with {} warps",
                           acc, p.wm, p.wn, acc_limit, p.warps));
  if (p.group < 1) throw fail(fmt::format("knob raster_group must be >= 1, got {}", p.group));
  if (p.stages < 1) throw fail("num_stages must be >= 1");
  const int64_t stage = int64_t(p.bm + p.bn) * p.bk_bytes;
  p.smem = p.stages * stage;
  // The epilogue's output staging reuses the stages' memory (free after the K loop), growing it
  // where a small tile's stages are smaller than the warps' buffers.
  const int64_t staging = int64_t(p.warps) * gemm::staged_store_bytes_per_warp(p.m_tiles);
  p.staged_store = kStagedStore.on(cfg) && std::max(p.smem, staging) <= t.max_smem_per_block();
  if (p.staged_store) p.smem = std::max(p.smem, staging);
  if (p.smem > t.max_smem_per_block())
    throw fail(fmt::format("{} stages of {} bytes ({}x{} A and {}x{} B bytes) need {} bytes of shared memory, more than the "
                           "{} bytes a block can use on {}",
                           p.stages, stage, p.bm, p.bk_bytes, p.bn, p.bk_bytes, p.smem, t.max_smem_per_block(), t.arch));
  return p;
}

// ---- emission -----------------------------------------------------------------------------------

// The GemmOperand initializer of the A or B load: rows of K from the tensor, K limited to the
// K loop's end (positions past it take no part, as in the reference).
std::string operand_init(const gemm::EpilogueWriter& w, const gemm::Match& g, const ir::Op& load) {
  const ir::Function& f = *g.f;
  const int param = load.param;
  const std::string& T = w.param_name(param);
  const int esize = size_bytes(f.params.at(param).dtype);
  return fmt::format("{{(const unsigned char*){}.data, {}, {}.stride[0] * {}LL, tj::dev::imin<long long>((long long)tj_K, {}) * {}LL}}",
                     T, w.param_dim(param, 0), T, esize, w.param_dim(param, 1), esize);
}

GeneratedKernel write_kernel(const gemm::Match& g, const Plan& p, const Config& cfg, const Target& target) {
  const ir::Function& f = *g.f;
  gemm::EpilogueWriter w(g, cfg);
  const bool fp8 = is_fp8(g.ta);
  const int threads = 32 * p.warps;

  // ---- header
  std::string src;
  src += fmt::format("// tilejit: kernel '{}' for {}, generated by the sm_80 GEMM lowering (codegen/lower_gemm_sm80.cpp).\n",
                     f.name, target.arch);
  src += fmt::format("// config: {}\n", cfg.to_json());
  src += fmt::format("// {} x {} tiles, {} bytes of K per stage, {} cp.async stages, {} warps as {} x {} ({} x {} each), raster "
                     "group {}; m16n8k{} mma.sync ({} x {}).\n",
                     p.bm, p.bn, p.bk_bytes, p.stages, p.warps, p.warps_m, p.warps_n, p.wm, p.wn, p.group, fp8 ? 32 : 16,
                     name(g.ta), name(g.tb));
  src += "// One block per output tile (codegen/device/ampere_gemm.cuh); the epilogue below runs in the accumulator\n"
         "// layout: per thread, rows tj_row0 + 16*mb + 8*h and column pairs tj_col0 + 8*j + {0, 1}. Each statement\n"
         "// ends with `// @ file:line` (the DSL line).\n";
  src += "#include \"tile.cuh\"\n#include \"ampere_gemm.cuh\"\n\n";
  src += fmt::format("using tj_cfg = tj::dev::Sm80GemmCfg<{}, {}, {}, {}, {}, {}, {}, {}>;\n\n", mma_type(g.ta), mma_type(g.tb),
                     p.bm, p.bn, p.bk_bytes, p.stages, p.warps_m, p.warps_n);
  const std::string entry = w.entry_name();

  // ---- body
  w.line("extern __shared__ __align__(128) unsigned char tj_smem[];");
  w.line("// Loop bounds and other values every program computes.");
  w.emit_hoisted();
  w.line(fmt::format("const int tj_M = (int)({});", w.ref(g.lm->operands[1])), &g.lm->loc);
  w.line(fmt::format("const int tj_N = (int)({});", w.ref(g.ln->operands[1])), &g.ln->loc);
  w.line(fmt::format("const int tj_K = (int)({});", w.ref(g.lk->operands[1])), &g.lk->loc);
  w.line("tj::dev::Sm80Gemm<tj_cfg> tj_g;");
  w.line(fmt::format("if (!tj_g.init(tj_smem, tj_M, tj_N, tj_K, {})) return;   // blocks past the last tile", p.group));
  w.line(fmt::format("// cp.async: '{}' [{} x {} elements], '{}' [{} x {}] per stage.", f.params[g.load_a->param].name, p.bm,
                     p.bk_elems, f.params[g.load_b->param].name, p.bn, p.bk_elems));
  w.line(fmt::format("const tj::dev::GemmOperand tj_a = {};", operand_init(w, g, *g.load_a)), &g.load_a->loc);
  w.line(fmt::format("const tj::dev::GemmOperand tj_b = {};", operand_init(w, g, *g.load_b)), &g.load_b->loc);
  w.line(fmt::format("float tj_acc[{}][{}];", p.m_tiles, 4 * p.n_tiles));
  w.line("tj_g.zero(tj_acc);");
  w.line("tj_g.mainloop(tj_acc, tj_a, tj_b);   // the K loop", &g.dot->loc);
  // The epilogue's per-thread values come after the main loop: nothing of it stays live there.
  w.emit_scalar_epilogue();
  w.emit_store_setup();
  w.line("const long long tj_row0 = tj_g.row0();");
  w.line("const long long tj_col0 = tj_g.col0();");
  gemm::AccLayout layout{p.m_tiles, 16, p.n_tiles, "", "", "", "", ""};
  if (p.staged_store) {
    layout.stage_buf = fmt::format("tj_smem + (threadIdx.x >> 5) * {}", gemm::staged_store_bytes_per_warp(p.m_tiles));
    layout.warp_row0 = "(long long)tj_g.m0 + tj_g.warp_m * tj_cfg::kWM";
    layout.warp_col0 = "(long long)tj_g.n0 + tj_g.warp_n * tj_cfg::kWN";
    layout.lane = "tj_g.lane";
    layout.stage_sync = "if (tj_stage) __syncthreads();   // the stages are free once every warp has left the K loop";
  }
  w.emit_tile_epilogue(layout);

  GeneratedKernel k;
  k.name = f.name;
  k.entry = entry;
  k.threads = threads;
  k.dynamic_smem_bytes = static_cast<size_t>(p.smem);
  k.device_headers = {"tile.cuh", "fp8.cuh", "gemm_common.cuh", "ampere_gemm.cuh"};
  k.aligned16_params = {g.load_a->param, g.load_b->param};
  k.source = src;
  k.source += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{\n", threads, entry,
                          fmt::join(w.kernel_params(), ", "));
  k.source += w.body();
  k.source += "}\n";
  return k;
}

// sm_80, sm_89 and sm_90: the targets with mma.sync but without wgmma (sm_90a's lowering wins
// there; registration order across files is not something to rely on).
bool serves(const Target& t) { return !t.has_wgmma(); }

std::optional<GeneratedKernel> try_lower(const ir::Function& f, const Config& cfg, const Target& t) {
  if (!serves(t)) return std::nullopt;
  gemm::Match g;
  if (!gemm::match(f, g) || !target_has_mma_for(g, t)) return std::nullopt;
  // Static K whose rows cannot start at 16-byte multiples in a contiguous tensor: no cp.async.
  if (gemm::static_rows_misaligned(g, 16)) return std::nullopt;
  Plan p = plan_config(g, f, cfg, t);
  return write_kernel(g, p, cfg, t);
}

const bool registered = [] {
  register_lowering(PatternLowering{"sm80_gemm", &try_lower});
  codegen::register_knob_provider("sm80_gemm", [](const ir::Function& f, const std::string& arch) {
    std::vector<codegen::Knob> knobs;
    const auto& archs = supported_archs();
    if (std::find(archs.begin(), archs.end(), arch) == archs.end()) return knobs;
    const Target t{arch};
    gemm::Match g;
    if (!serves(t) || !gemm::match(f, g) || !target_has_mma_for(g, t)) return knobs;
    knobs.push_back({kRasterGroup.name, {1, 4, 8, 16}, kRasterGroup.fallback});
    return knobs;
  });
  // Untuned: 128 x 128 tiles, 4 warps, a 4-stage cp.async ring (fits sm_89's 99 KB for fp8).
  codegen::register_default_config_provider("sm80_gemm", [](const ir::Function& f, const std::string& arch) {
    std::optional<Config> c;
    const auto& archs = supported_archs();
    if (std::find(archs.begin(), archs.end(), arch) == archs.end()) return c;
    const Target t{arch};
    gemm::Match g;
    if (!serves(t) || !gemm::match(f, g) || !target_has_mma_for(g, t)) return c;
    c = gemm::tile_config(g, 128, 128, is_fp8(g.ta) ? 64 : 32);
    c->num_stages = 4;
    c->num_warps = 4;
    return c;
  });
  return true;
}();

}  // namespace

std::optional<GeneratedKernel> lower_gemm_sm80(const ir::Function& f, const Config& cfg, const Target& t) {
  return try_lower(f, cfg, t);
}

}  // namespace tj::codegen
