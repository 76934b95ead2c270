// The generic tensor-core lowering's untuned config and tunables (see mma_config.h).
#include "codegen/mma_config.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "codegen/emitter_knobs.h"
#include "codegen/issue_early.h"
#include "codegen/layout.h"
#include "codegen/lowering.h"
#include "codegen/mma_plan.h"
#include "codegen/prefetch_loads.h"
#include "codegen/program_trips.h"
#include "core/error.h"

namespace tj::codegen {

namespace {

// The ids of the blocks that size a launch loop's tiles.
std::set<int> launch_blocks(const ir::Function& f) {
  std::set<int> out;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind == ir::OpKind::loop && op.launch && op.loop_kind == ir::LoopKind::tile) out.insert(op.block_id);
  });
  return out;
}

void set_block(const ir::Function& f, Config& c, const Dim& d, int64_t size, std::set<int64_t>& chosen) {
  if (!d.is_block() || !chosen.insert(d.value).second) return;
  const ir::BlockSymbol& b = f.blocks.at(d.value);
  if (b.fixed <= 0) c.blocks[b.name] = size;
}

// Whether every program runs the same loop trip counts: no bound of a loop inside the program
// depends on a launch loop's index.
bool uniform_work(const ir::Function& f, const Config& c) {
  bool uniform = true;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind == ir::OpKind::loop && op.launch) uniform = uniform && trip_trend(f, c, op) == 0;
  });
  return uniform;
}

}  // namespace

std::optional<Config> mma_default_config(const ir::Function& f, const Target& t) {
  std::vector<const ir::Op*> dots;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind == ir::OpKind::dot) dots.push_back(&op);
  });
  if (dots.empty()) return std::nullopt;
  const std::set<int> launch = launch_blocks(f);
  auto wide = [&](const ir::Op* d) {   // its columns are a launch loop's tiles (a GEMM's)
    const TileType& r = f.type(d->result);
    return r.rank() == 2 && r.shape[1].is_block() && launch.count(static_cast<int>(r.shape[1].value));
  };
  const bool gemm_like = std::any_of(dots.begin(), dots.end(), wide);
  const bool wg = t.has_wgmma();
  // The accumulators of all its dots share the registers: at most `cap` of a thread's (160: of 232
  // with wgmma, the rest for the operands and the epilogue; FlashAttention-2's 192 of 255 for
  // mma.sync's attention-like pairs of dots, measured fastest at 128 x 64 on 4 warps for D 128).
  auto attempt = [&](int64_t row_block, int warps, int64_t cap, int64_t& regs, int64_t wide_cols) {
    Config c = default_config(f);
    c.num_warps = warps;
    const int64_t loop_cols = wg ? 128 : 64, k_bytes = wg ? 128 : 64;
    // Rows first: a block that is any dot's rows takes row_block, whatever other dots do with it;
    // then the columns and the K steps that are nobody's rows.
    std::set<int64_t> chosen;   // blocks sized here
    std::set<int64_t> rows;     // blocks that are some dot's rows: never narrowed
    for (const ir::Op* d : dots) {
      const TileType& r = f.type(d->result);
      if (r.rank() != 2) continue;
      set_block(f, c, r.shape[0], row_block, chosen);
      if (r.shape[0].is_block()) rows.insert(r.shape[0].value);
    }
    for (const ir::Op* d : dots) {
      const TileType& r = f.type(d->result);
      const TileType& a = f.type(d->operands[0]);
      if (r.rank() != 2 || a.rank() != 2) continue;
      set_block(f, c, r.shape[1], wide(d) ? wide_cols : loop_cols, chosen);
      set_block(f, c, a.shape[1], k_bytes / size_bytes(a.dtype), chosen);
    }
    // Halve the widest dot's columns (never a block that is some dot's rows) until the
    // accumulators fit the cap.
    for (int guard = 0; guard < 8; ++guard) {
      const MmaPlan p = plan_mma(f, c, t);
      regs = 0;
      const MmaDot* widest = nullptr;   // of the dots whose columns are a tunable block
      for (const MmaDot& d : p.dots) {
        regs += d.m * d.n / (32 * c.num_warps);
        const Dim& n = f.type(d.op->result).shape[1];
        if (n.is_block() && !rows.count(n.value) && f.blocks.at(n.value).fixed <= 0 && d.n > 32 &&
            (!widest || d.n > widest->n))
          widest = &d;
      }
      if (regs <= cap || !widest) break;
      c.blocks[f.blocks.at(f.type(widest->op->result).shape[1].value).name] = widest->n / 2;
    }
    return c;
  };
  // wgmma: two warpgroups of 64 rows each; 256 columns where the columns are a launch loop's
  // tiles (a GEMM's: wide wgmmas read A once per 256 columns), 128 where a loop inside the
  // program steps over them (attention's keys: the scores, their exp2 and the output share the
  // registers); K steps of 128 bytes. mma.sync (no wgmma): operands read through ldmatrix from
  // slots the threads fill; 128 x 128 GEMM tiles on 4 warps of 64 x 64 (a 2-D warp grid: H200
  // running sm_80 code, B [K, N] 4096^3: 156 TFLOP/s, 8 warps of 32 x 64: 126); where a loop steps over
  // the columns (attention), FlashAttention-2's shape: 4 warps of 32 rows, 64 columns (16 rows a
  // warp where 32 do not fit the registers); K steps of 64 bytes.
  int64_t regs = 0;
  const bool pair = !wg && !gemm_like && dots.size() <= 2;
  Config c = attempt(128, wg ? 8 : 4, pair ? 192 : 160, regs, wg ? 256 : 128);
  // (More than two dots, as in attention's backward, keep more tiles live than their accumulators:
  // 16 rows a warp there.)
  if (!wg && !gemm_like && (regs > 192 || !pair)) c = attempt(64, 4, 160, regs, 128);
  // A GEMM-like grid of fewer than 64 programs of 128 x 256 (Hoppers have 114-132 SMs: most would
  // idle) takes 128 columns, twice the programs (H200, the library's bf16 gemm at 1024^3 through
  // this lowering: 128 x 128 on 8 warps 192.8 TFLOP/s, 128 x 256 133.9; at 2048^3, 128 programs
  // of 128 x 256, 639.1 against 593.2).
  if (wg && gemm_like) {
    const std::optional<int64_t> programs = static_programs(f, c);
    if (programs && *programs < 64) c = attempt(128, 8, 160, regs, 128);
  }
  // Programs that all do the same work loop in persistent blocks (the next program's operands load
  // during this one's epilogue), GEMM-like tile grids in L2-friendly groups. Where a loop's bounds
  // depend on the program (causal attention), the longest programs go first; short ones (at most
  // 32 iterations in the longest program) loop in persistent blocks too, in rounds that pair long with
  // short, and longer ones leave the balance to the hardware's block scheduling (H200, README
  // attention causal, same run, persistent against not: bf16 D 128 S 1k (8 iterations) 428.6 vs
  // 371.0 TFLOP/s, S 4k (32) 591.8 vs 594.6, S 16k (128) 647.5 vs 685.1; D 64 S 4k 379.8 vs 337.9;
  // e4m3 S 4k 702.2 vs 685.7, S 16k 784.5 vs 833.3).
  // (mma.sync: its copy rings start with each loop, so a persistent block has nothing to overlap.)
  // Attention-like nests on wgmma run their chained dot one iteration late, its accumulator's
  // rescale after the wait for it (knob overlap 2; H100, README attention D 128, same run: S 1k-16k
  // +1-10% over overlap 1, which was +8-13% over none on an H200; turns on top of it lose 1-4%).
  if (wg && !gemm_like && dots.size() >= 2) c.knobs[knobs::overlap.name] = 2;
  // Attention-like nests whose accumulators take at most 96 registers a thread (head dim 64) and
  // whose programs all do the same work take three warpgroups of 64 rows: each K / V tile serves
  // 192 query rows (H200, README attention D 64 S 4k, same run: 192 x 128 on 12 warps 507.9
  // TFLOP/s, 128 x 128 on 8 434.0; causal 330.8 against 378.6: the diagonal's partial tiles).
  if (wg && !gemm_like && dots.size() >= 2 && regs <= 96 && uniform_work(f, c)) {
    int64_t regs3 = 0;
    Config three = attempt(192, 12, 160, regs3, 256);
    three.knobs = c.knobs;
    if (regs3 <= 96) c = three;
  }
  // Loads carried one iteration ahead (knob prefetch_loads) hold their registers across the
  // iteration: not where the accumulators already take more than the cap (the fused attention
  // backward's five dots: 176 a thread on sm_90a, whose spills doubled with them).
  if (regs > 160) c.knobs[knobs::prefetch_loads.name] = 0;
  if (uniform_work(f, c)) {
    if (wg) c.knobs[knobs::persistent.name] = 1;
    c.knobs[knobs::raster_group.name] = 8;
  } else {
    c.knobs[knobs::longest_first.name] = 1;
    const std::optional<int64_t> trips = longest_program_trips(f, c);
    if (wg && trips && *trips <= 32) c.knobs[knobs::persistent.name] = 1;
  }
  // As many stages as fit the shared memory, from 4 down; mma.sync's attention-like pairs from 2,
  // so that two blocks of 4 warps share an SM where its shared memory allows (H200 running sm_80
  // code, README attention S 4096 D 128: 3 stages 152 TFLOP/s, 2 stages 209).
  // GEMM-like nests on wgmma whose results are not 16-bit take one stage less where that makes
  // room to stage their stores (the emitter's knob stage_stores), but not below 3; 16-bit results
  // leave without shared memory, transposed across quads (H200, bias + GELU 4096^3 / 8192^3 and bmm
  // 16 x 2048^3, 128 x 256 tiles: 4 stages through quads 702 / 767 / 746 TFLOP/s, 3 stages staged
  // 672 / 740 / 714, 4 stages from the fragments 636 / 714 / 643).
  auto staging_bytes = [&](const LayoutPlan& layouts) {
    int64_t bytes = 0;
    ir::walk(f.body, [&](const ir::Op& op, int) {
      if (op.kind != ir::OpKind::store || op.ival == 1) return;
      const Layout& L = layouts.of(op.operands.at(op.indices.size()));
      const ir::Param& out = f.params.at(op.param);
      if (!L.is_mma() || L.extent_r <= 1 || L.extent_c <= 1 || out.static_stride(out.rank() - 1) != 1 ||
          size_bytes(out.dtype) == 2)
        return;
      const int elem = size_bytes(out.dtype), chunk = 16 / std::max(1, elem);
      bytes = std::max(bytes, L.extent_r * (L.extent_c + L.arr.warps_c * chunk) * elem);
    });
    return bytes;
  };
  bool tensor_cores = true;
  auto most_stages = [&](Config c) -> std::optional<Config> {
    std::optional<Config> fits;   // the most stages that fit without staging
    for (int stages = pair ? 2 : 4; stages >= 1; --stages) {
      c.num_stages = stages;
      MmaPlan p = plan_mma(f, c, t);
      if (p.dots.empty()) {   // the dots do not fit the tensor cores even so: not ours
        tensor_cores = false;
        return std::nullopt;
      }
      const LayoutPlan layouts = assign_layouts(f, c, t, &p);
      finish_mma_plan(p, [&](int v) { return layouts.of(v).is_mma(); });
      if (p.smem_bytes + 1024 + 8192 > t.max_smem_per_block()) continue;
      if (!(wg && gemm_like)) return c;
      if (!fits) fits = c;
      if (p.smem_bytes + 1024 + std::max<int64_t>(8192, staging_bytes(layouts)) <= t.max_smem_per_block()) return c;
      if (stages <= 3) return fits;
    }
    return fits;
  };
  std::optional<Config> best = most_stages(c);
  if (!tensor_cores) return std::nullopt;
  // On persistent blocks the program's own tiles (attention's Q) take a second slot (knob
  // prefetch_program), but not at the price of a stage of the loops' rings (bf16 attention at
  // D 256: one stage of K and V with Q's two, two with one).
  if (best && wg && knobs::persistent.on(c)) {
    Config one = c;
    one.knobs[knobs::prefetch_program.name] = 0;
    const std::optional<Config> alt = most_stages(one);
    if (alt && alt->num_stages > best->num_stages) best = alt;
  }
  return best;
}

namespace {
const bool registered = [] {
  register_knob_provider("mma", [](const ir::Function& f, const std::string& arch) {
    std::vector<Knob> out;
    Target t;
    try {
      t = Target::parse(arch);
    } catch (const Error&) {
      return out;
    }
    const std::optional<Config> c = mma_default_config(f, t);
    if (!c) return out;
    const MmaPlan p = plan_mma(f, *c, t);
    if (std::any_of(p.staged.begin(), p.staged.end(), [](const StagedLoad& s) { return s.producer; }))
      out.push_back({knobs::warp_specialize.name, {0, 1}, knobs::warp_specialize.fallback});
    out.push_back({knobs::persistent.name, {0, 1}, knobs::persistent.fallback});
    out.push_back({knobs::raster_group.name, {1, 8}, knobs::raster_group.fallback});
    out.push_back({knobs::longest_first.name, {0, 1}, knobs::longest_first.fallback});
    if (p.wgmma() && p.warpgroups >= 2) out.push_back({knobs::wg_turns.name, {0, 1}, knobs::wg_turns.fallback});
    if (p.wgmma() && p.dots.size() >= 2) out.push_back({knobs::overlap.name, {0, 1, 2}, knobs::overlap.fallback});
    // Threads' work between two waits happens only with two or more dots.
    if (p.wgmma() && p.dots.size() >= 2) out.push_back({knobs::pin_waits.name, {0, 1}, knobs::pin_waits.fallback});
    bool moves = false;
    issue_early(f, &moves);
    if (moves) out.push_back({knobs::issue_early.name, {0, 1}, knobs::issue_early.fallback});
    bool carried = false;
    prefetch_loads(f, &carried);
    if (carried) out.push_back({knobs::prefetch_loads.name, {0, 1}, knobs::prefetch_loads.fallback});
    if (std::any_of(p.staged.begin(), p.staged.end(), [](const StagedLoad& s) { return s.transposed_copy; }))
      out.push_back({knobs::fp8_key_order.name, {0, 1}, knobs::fp8_key_order.fallback});
    return out;
  });
  return true;
}();
}  // namespace

}  // namespace tj::codegen
