// Tensor-core planning (see mma_plan.h).
#include "codegen/mma_plan.h"
#include "codegen/emitter_knobs.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "codegen/layout.h"
#include "core/error.h"

namespace tj::codegen {

using ir::Op;
using ir::OpKind;

const char* wgmma_type(DType t) {
  switch (t) {
    case DType::e4m3: return "tj::dev::WG_E4M3";
    case DType::e5m2: return "tj::dev::WG_E5M2";
    case DType::bf16: return "tj::dev::WG_BF16";
    default: return "tj::dev::WG_F16";
  }
}

const MmaDot* MmaPlan::dot_of(const Op* op) const {
  for (const MmaDot& d : dots)
    if (d.op == op) return &d;
  return nullptr;
}

const StagedLoad* MmaPlan::staged_of(const Op* op) const {
  for (const StagedLoad& s : staged)
    if (s.op == op) return &s;
  return nullptr;
}

namespace {

constexpr int64_t kMaxAccRegisters = 192;   // f32 accumulator registers a thread may hold

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// The largest swizzle (128, 64 or 32 bytes) whose column blocks tile `bytes`, or 0.
int swizzle_for(int64_t bytes) {
  for (int sw : {128, 64, 32})
    if (bytes % sw == 0) return sw;
  return 0;
}

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

// What the planner knows about the IR: the defining op, the uses and the enclosing loops of
// every value and op.
struct Facts {
  const ir::Function& f;
  const Config& cfg;
  std::vector<const Op*> def;
  std::vector<std::vector<std::pair<const Op*, int>>> uses;   // (op, operand index)
  std::map<const Op*, std::vector<const Op*>> loops;         // enclosing loops, outermost first
  std::map<const Op*, const ir::Region*> region_of;
  std::map<int, const Op*> index_of;                         // loop index value -> its loop

  Facts(const ir::Function& fn, const Config& c) : f(fn), cfg(c), def(fn.values.size(), nullptr), uses(fn.values.size()) {
    std::vector<const Op*> stack;
    std::function<void(const ir::Region&)> visit = [&](const ir::Region& r) {
      for (const Op& op : r.ops) {
        if (op.result >= 0) def[op.result] = &op;
        for (size_t i = 0; i < op.operands.size(); ++i) uses[op.operands[i]].push_back({&op, static_cast<int>(i)});
        loops[&op] = stack;
        region_of[&op] = &r;
        if (op.body) {
          index_of[op.body_index] = &op;
          stack.push_back(&op);
          visit(*op.body);
          stack.pop_back();
        }
      }
    };
    visit(f.body);
  }
  std::vector<int64_t> shape(int v) const { return bind_shape(f, cfg, f.type(v)); }
  // The innermost enclosing loop of `op` that runs inside a program (not a launch loop).
  const Op* home(const Op* op) const {
    const auto& ls = loops.at(op);
    for (auto it = ls.rbegin(); it != ls.rend(); ++it)
      if (!(*it)->launch) return *it;
    return nullptr;
  }
  bool inside(const Op* op, const Op* loop) const {
    const auto& ls = loops.at(op);
    return std::find(ls.begin(), ls.end(), loop) != ls.end();
  }
};

std::string at(const Op& op) { return fmt::format("dot at {}", op.loc.str()); }

// Whether scalar `v` comes from loop indices, parameters, dims and constants by scalar arithmetic
// alone (loop == null), or can be recomputed for another iteration of `loop`: from its index, from
// values defined before it and from scalar arithmetic in its body.
bool scalar_closure(const Facts& fx, int v, const Op* loop, std::set<int>& seen) {
  if (loop && v == loop->body_index) return true;
  if (!seen.insert(v).second) return true;
  if (auto l = fx.index_of.find(v); l != fx.index_of.end()) return !loop || (!fx.inside(l->second, loop) && l->second != loop);
  const Op* d = fx.def.at(v);
  if (!d) return false;
  if (loop && !fx.inside(d, loop)) return true;   // defined before the loop: in scope at its start
  if (!fx.f.type(v).is_scalar() || fx.f.values[v].is_var) return false;
  switch (d->kind) {
    case OpKind::const_value:
    case OpKind::scalar_param:
    case OpKind::tensor_dim:
    case OpKind::block_size:
      return true;
    case OpKind::unary:
    case OpKind::binary:
    case OpKind::cast:
    case OpKind::where:
      for (int o : d->operands)
        if (!scalar_closure(fx, o, loop, seen)) return false;
      return true;
    default: return false;   // variables, loads: the value depends on the program's state
  }
}

// Is value `v` the size of dim `axis` of tensor `param`?
bool is_dim_of(const Facts& fx, int v, int param, int axis) {
  const Op* d = fx.def.at(v);
  if (!d) return false;
  if (d->kind == OpKind::tensor_dim) return d->param == param && d->axis == axis;
  const int64_t s = fx.f.params.at(param).static_shape.at(axis);
  return d->kind == OpKind::const_value && s >= 0 && d->ival == s;
}

// The tensor dims of a load's two tile dims, or nullopt for other loads.
std::optional<std::pair<int, int>> tile_dims(const Op& ld) {
  std::vector<int> dims;
  for (size_t d = 0; d < ld.indices.size(); ++d)
    if (ld.indices[d].kind != ir::Index::Kind::scalar) dims.push_back(static_cast<int>(d));
  if (dims.size() != 2) return std::nullopt;
  return std::pair{dims[0], dims[1]};
}

// Whether TMA can copy the tile of load `ld` (its rows along tensor dim `d0`, its contiguous
// bytes along the last dim `d1`); else why not.
std::optional<std::string> tma_refusal(const Facts& fx, const Op& ld) {
  const ir::Param& p = fx.f.params.at(ld.param);
  auto td = tile_dims(ld);
  if (!td) return "not a 2-D tile";
  const auto [d0, d1] = *td;
  if (p.rank() > 5) return fmt::format("'{}' has {} dims (TMA takes at most 5)", p.name, p.rank());
  if (d1 != p.rank() - 1) return fmt::format("the tile of '{}' does not span its last dim", p.name);
  if (!p.static_strides.empty() && p.static_stride(d1) != 1)
    return fmt::format("the last dim of '{}' is not known to be contiguous", p.name);
  const auto s = fx.shape(ld.result);
  const int es = size_bytes(p.dtype);
  if (s[0] > 256 || s[0] % 8 != 0) return fmt::format("{} rows (TMA boxes take multiples of 8 up to 256)", s[0]);
  if (swizzle_for(s[1] * es) == 0) return fmt::format("rows of {} bytes (not a multiple of 32)", s[1] * es);
  // A static row pitch that is not a multiple of 16 bytes cannot be a tensor map's stride.
  int64_t pitch = 1;
  for (int d = p.rank() - 1; d > 0; --d) {
    const int64_t stride = p.static_stride(d - 1) > 0 ? p.static_stride(d - 1)
                           : p.static_shape.at(d) >= 0 && pitch > 0 ? pitch * p.static_shape.at(d) : -1;
    if (stride > 0 && p.static_shape.at(d - 1) != 1 && (stride * es) % 16 != 0)
      return fmt::format("dim {} of '{}' has a stride of {} bytes (TMA needs multiples of 16)", d - 1, p.name, stride * es);
    pitch = stride;
  }
  return std::nullopt;
}

// The operand value with transposes folded, and whether it was transposed.
std::pair<int, bool> underlying(const Facts& fx, int v) {
  const Op* d = fx.def.at(v);
  if (d && d->kind == OpKind::transpose) return {d->operands[0], true};
  return {v, false};
}

// Why dot `op` cannot run on the tensor cores' `isa` of target `t`, or nullopt.
std::optional<std::string> mma_refusal(const Facts& fx, const Op& op, const Config& cfg, const Target& t, MmaPlan::Isa isa,
                                       MmaDot& d) {
  const ir::Function& f = fx.f;
  d.op = &op;
  d.ta = f.type(op.operands[0]).dtype;
  d.tb = f.type(op.operands[1]).dtype;
  const auto rs = fx.shape(op.result);
  const auto as = fx.shape(op.operands[0]);
  d.m = rs[0];
  d.n = rs[1];
  d.k = as[1];
  const bool fp8 = is_fp8(d.ta) && is_fp8(d.tb);
  if (!fp8 && !(is_16bit(d.ta) && d.ta == d.tb))
    return fmt::format("operands {} x {} (the tensor cores take bf16 x bf16, f16 x f16 or fp8 x fp8)", name(d.ta),
                       name(d.tb));
  if (fp8 && !t.has_fp8())
    return fmt::format("fp8 operands on {} (mma.sync takes e4m3 / e5m2 from sm_89)", t.arch);
  const bool wg = isa == MmaPlan::Isa::wgmma;
  if (wg && cfg.num_warps % 4 != 0)
    return fmt::format("num_warps = {} (wgmma runs on warpgroups of 4 warps)", cfg.num_warps);
  const int64_t rows = 16 * cfg.num_warps;
  if (d.m % rows != 0)
    return fmt::format("its {} rows are not a multiple of {} ({} with num_warps = {})", d.m, rows,
                       wg ? "64 per warpgroup" : "16 per warp", cfg.num_warps);
  if (d.n % 8 != 0) return fmt::format("its {} columns are not a multiple of 8", d.n);
  const int es = size_bytes(d.ta);
  if ((d.k * es) % 32 != 0) return fmt::format("K = {} is not a multiple of {} (32 bytes)", d.k, 32 / es);
  if (swizzle_for(d.k * es) == 0) return fmt::format("K = {} elements of {} bytes", d.k, es);
  const int64_t regs = d.m * d.n / (32 * cfg.num_warps);
  if (regs > kMaxAccRegisters)
    return fmt::format("its {} x {} f32 result needs {} registers per thread with {} warps (at most {})", d.m, d.n, regs,
                       cfg.num_warps, kMaxAccRegisters);
  return std::nullopt;
}

// The widest wgmma n (a multiple of `unit`, at most 256) whose instructions tile n.
int n_per_instruction(int64_t n, int unit) {
  for (int64_t c = std::min<int64_t>(256, n) / unit * unit; c >= unit; c -= unit)
    if (n % c == 0) return static_cast<int>(c);
  return 0;
}

}  // namespace

MmaPlan plan_mma(const ir::Function& f, const Config& cfg, const Target& t) {
  MmaPlan plan;
  Facts fx(f, cfg);
  std::vector<const Op*> dot_ops;
  ir::walk(f.body, [&](const Op& op, int) {
    if (op.kind == OpKind::dot) dot_ops.push_back(&op);
  });
  if (dot_ops.empty()) return plan;
  const MmaPlan::Isa isa = t.has_wgmma() ? MmaPlan::Isa::wgmma : MmaPlan::Isa::mma_sync;
  const bool wg = isa == MmaPlan::Isa::wgmma;

  // 1. The dots that fit the tensor cores.
  std::vector<MmaDot> dots;
  for (const Op* op : dot_ops) {
    MmaDot d;
    if (auto why = mma_refusal(fx, *op, cfg, t, isa, d)) {
      plan.simt_dots.push_back(fmt::format("{}: {}", at(*op), *why));
      continue;
    }
    dots.push_back(d);
  }
  if (dots.empty()) return plan;
  std::set<const Op*> tc;
  for (const MmaDot& d : dots) tc.insert(d.op);

  // 2. Operands. A load is staged when every use is an operand (a or b) of a tensor-core dot,
  // directly or through transposes used only so.
  auto only_dot_operand_uses = [&](int load_value) {
    std::vector<int> values{load_value};
    for (size_t i = 0; i < values.size(); ++i) {
      for (auto [user, slot] : fx.uses[values[i]]) {
        if (user->kind == OpKind::transpose && values[i] == load_value) {
          values.push_back(user->result);
          continue;
        }
        if (!tc.count(user) || slot > 1) return false;
      }
    }
    return true;
  };
  // A load's fills can run ahead of its home loop: its indices are computable for later iterations.
  auto prefetchable = [&](const Op& ld, const Op* home) {
    std::set<int> seen;
    for (size_t i = 0; i < ld.indices.size(); ++i)
      if (!scalar_closure(fx, ld.operands[i], home, seen)) return false;
    return true;
  };
  // The producer warpgroup runs the loop nest's scalar arithmetic alone: it can issue the fills of
  // loads whose indices and enclosing loop bounds need nothing else.
  auto producer_computable = [&](const Op& ld) {
    std::set<int> seen;
    for (size_t i = 0; i < ld.indices.size(); ++i)
      if (!scalar_closure(fx, ld.operands[i], nullptr, seen)) return false;
    for (const Op* l : fx.loops.at(&ld))
      for (int v : l->operands)
        if (!scalar_closure(fx, v, nullptr, seen)) return false;
    return true;
  };
  // Whether the producer warpgroup will fill a load ahead of use (its transposer warps copy then).
  auto producer_ahead = [&](const Op& ld) {
    const Op* home = fx.home(&ld);
    return wg && knobs::warp_specialize.on(cfg) && producer_computable(ld) && (!home || prefetchable(ld, home));
  };
  // fp8 loads whose readers need them K-major, copied transposed by the producer warpgroup.
  std::set<const Op*> transposed;
  // The shared-memory tile each dot operand needs if staged; a load is staged when every
  // reader needs the same one and TMA can copy it.
  auto staged_tile = [&](const MmaDot& d, int which, const MmaOperand& o) -> std::optional<SmemTile> {
    const int es = size_bytes(d.ta);
    const Op* ld = fx.def.at(o.value);
    if (!ld || ld->kind != OpKind::load || !only_dot_operand_uses(o.value)) return std::nullopt;
    // TMA's limits (wgmma); the threads' copy (mma.sync) takes any 2-D tile of whole 32-byte steps.
    if (wg ? tma_refusal(fx, *ld).has_value() : !tile_dims(*ld).has_value()) return std::nullopt;
    // K-major: a not transposed ([M, K] with K contiguous), b transposed ([N, K]).
    const bool k_major = which == 0 ? !o.transposed : o.transposed;
    const auto vs = fx.shape(o.value);
    SmemTile tile{vs[0], vs[1] * es, swizzle_for(vs[1] * es), !k_major, es};
    if (tile.swizzle == 0) return std::nullopt;
    // MN-major tiles of 16-bit types only (wgmma's transposed descriptors, ldmatrix.trans);
    // wgmma reads a's 64 rows per instruction in whole column blocks.
    if (tile.mn_major && !is_16bit(d.ta)) {
      // fp8: TMA writes it as memory holds it; the producer warpgroup's transposed copy makes the
      // K-major tile (rows and bytes in whole 4 x 4 byte blocks, K in whole 32-byte steps).
      if (es != 1 || tile.rows % 32 != 0 || tile.row_bytes % 16 != 0 || !producer_ahead(*ld)) return std::nullopt;
      transposed.insert(ld);
      return tile;
    }
    if (tile.mn_major && wg && which == 0 && (64 * es) % tile.swizzle != 0) return std::nullopt;
    return tile;
  };
  std::map<const Op*, std::vector<SmemTile>> wanted;   // load -> the tiles its readers need
  std::vector<const Op*> wanted_order;                 // the loads in program order (not by address)
  std::set<const Op*> unstageable;
  for (MmaDot& d : dots)
    for (int which = 0; which < 2; ++which) {
      MmaOperand& o = which == 0 ? d.a : d.b;
      std::tie(o.value, o.transposed) = underlying(fx, d.op->operands[which]);
      const Op* ld = fx.def.at(o.value);
      if (auto tile = staged_tile(d, which, o)) {
        if (!wanted.count(ld)) wanted_order.push_back(ld);
        wanted[ld].push_back(*tile);
      } else if (ld) {
        unstageable.insert(ld);
      }
    }
  std::map<const Op*, int> staged_index;
  for (const Op* ld : wanted_order) {
    const std::vector<SmemTile>& tiles = wanted.at(ld);
    // A slot holds rows of bytes as TMA writes them; K-major and MN-major readers see the same
    // bytes (a [m, d] tile is k = d for one dot and k = m for another), each through its own
    // descriptors.
    const bool agree = std::all_of(tiles.begin(), tiles.end(), [&](const SmemTile& t) {
      return t.rows == tiles[0].rows && t.row_bytes == tiles[0].row_bytes && t.swizzle == tiles[0].swizzle;
    });
    if (!agree || unstageable.count(ld)) continue;
    StagedLoad s;
    s.op = ld;
    s.copy = !wg;
    s.home = fx.home(ld);
    s.tile = tiles[0];
    if (transposed.count(ld)) {
      // Every reader takes the K-major copy: rows and bytes swapped.
      const bool all_mn = std::all_of(tiles.begin(), tiles.end(), [](const SmemTile& t) { return t.mn_major; });
      if (!all_mn) continue;
      s.transposed_copy = true;
      s.tile.mn_major = false;   // the fill: the slot's bytes as in memory (rows K, bytes M or N)
      s.read_tile = SmemTile{s.tile.row_bytes, s.tile.rows, swizzle_for(s.tile.rows), false, 1};
      if (s.read_tile.swizzle == 0) continue;
    }
    std::tie(s.row_dim, s.inner_dim) = *tile_dims(*ld);
    staged_index[ld] = static_cast<int>(plan.staged.size());
    plan.staged.push_back(s);
  }
  for (MmaDot& d : dots) {
    const int es = size_bytes(d.ta);
    for (int which = 0; which < 2; ++which) {
      MmaOperand& o = which == 0 ? d.a : d.b;
      auto it = staged_index.find(fx.def.at(o.value));
      if (it != staged_index.end()) {
        o.source = MmaOperand::Source::staged;
        o.staged = it->second;
        o.tile = *staged_tile(d, which, o);   // the slot's bytes, as this dot reads them
        if (plan.staged[o.staged].transposed_copy) o.tile = plan.staged[o.staged].read_tile;
        plan.staged[o.staged].readers.push_back(d.op);
      } else {
        // A register tile, written K-major into a buffer of its own.
        o.source = MmaOperand::Source::registers;
        o.tile = SmemTile{which == 0 ? d.m : d.n, d.k * es, swizzle_for(d.k * es), false, es};
        o.buffer = static_cast<int>(plan.buffers.size());
        plan.buffers.push_back(OperandBuffer{d.op, which, o.tile, 0});
      }
    }
    // wgmma n per instruction: an MN-major b takes whole column blocks per instruction (n is a
    // multiple of the block's columns, since its rows are).
    const int unit = d.b.tile.mn_major ? std::max<int>(8, d.b.tile.swizzle / es) : 8;
    d.n_per_instr = wg ? n_per_instruction(d.n, unit) : 8;
    if (d.n_per_instr == 0) throw Error(fmt::format("internal error: no wgmma width tiles the {} columns of the {}", d.n, at(*d.op)));
    // k range: positions past k_end contribute nothing. Staged operands read zeros past the
    // tensor's dims; where k_end is not that dim, the tail of the last tile must be zeroed.
    const size_t kpos = d.op->ival == 1 ? 3 : 2;
    if (d.op->operands.size() >= kpos + 2) {
      const int ke = d.op->operands[kpos + 1];
      for (int which = 0; which < 2; ++which) {
        const MmaOperand& o = which == 0 ? d.a : d.b;
        if (o.source != MmaOperand::Source::staged) {
          d.k_masked = true;
          continue;
        }
        const StagedLoad& s = plan.staged[o.staged];
        const bool k_on_rows = which == 0 ? o.transposed : !o.transposed;
        if (!is_dim_of(fx, ke, s.op->param, k_on_rows ? s.row_dim : s.inner_dim)) d.k_masked = true;
      }
    }
    plan.dots.push_back(d);
  }

  // 3. Rings (TMA): a staged load in a loop inside the program advances with it; it runs ahead
  // when its indices can be computed for later iterations.
  for (StagedLoad& s : plan.staged) {
    if (s.home) {
      s.prefetch = prefetchable(*s.op, s.home);
      s.stages = s.prefetch ? std::max(1, cfg.num_stages) : 1;
    }
    // K-major slots (knob copy_stages, default 2: the dots read one while the next is copied);
    // the TMA ring runs ahead of the copy.
    if (s.transposed_copy) {
      const int64_t want = knobs::copy_stages.of(cfg);
      if (want < 1) throw Error(fmt::format("kernel '{}': knob copy_stages must be at least 1, got {}", f.name, want));
      s.read_stages = static_cast<int>(std::min<int64_t>(want, s.stages));
    }
    if (s.copy) {   // the tiles' threads copy it: no producer, no tensor map
      s.producer = false;
      continue;
    }
    s.producer = producer_computable(*s.op);
    // A load outside the program's loops (attention's Q) in persistent blocks: a second slot, so
    // that the producer fills the next program's tile while this program runs, instead of after
    // its last use (its latency otherwise opens every program).
    if (!s.home && s.producer && wg && knobs::persistent.on(cfg) && knobs::prefetch_program.on(cfg)) s.stages = 2;
    const ir::Param& p = f.params.at(s.op->param);
    s.box.assign(p.rank(), 1);
    s.box[s.row_dim] = static_cast<int>(s.tile.rows);
    s.box[s.inner_dim] = s.tile.swizzle / s.tile.elem_bytes;
    auto it = std::find_if(plan.tmas.begin(), plan.tmas.end(), [&](const MmaPlan::Tma& m) {
      return m.param == s.op->param && m.box == s.box && m.swizzle == s.tile.swizzle;
    });
    if (it == plan.tmas.end()) {
      plan.tmas.push_back(MmaPlan::Tma{s.op->param, s.box, s.tile.swizzle, {}});
      it = plan.tmas.end() - 1;
    }
    s.tma = static_cast<int>(it - plan.tmas.begin());
  }

  plan.isa = plan.dots.empty() ? MmaPlan::Isa::none : isa;
  plan.warps_r = cfg.num_warps;
  plan.warps_c = 1;
  // mma.sync where every dot reads both operands from shared memory: a 2-D grid of warps, each
  // on a block of rows and columns, so that a warp's ldmatrix loads per k step (its rows of A
  // plus its columns of B) are fewest: 128 x 128 on 4 warps, 64 x 64 each, reads 2x less than
  // 32 x 128 each. (A register A operand needs its rows' every K column in one warp: rows only.)
  if (!wg && !plan.dots.empty() &&
      std::all_of(plan.dots.begin(), plan.dots.end(), [](const MmaDot& d) {
        return d.a.source == MmaOperand::Source::staged && d.b.source == MmaOperand::Source::staged;
      })) {
    int64_t best = -1;
    for (int wc = 1; wc <= cfg.num_warps; wc *= 2) {
      if (cfg.num_warps % wc != 0) continue;
      const int wr = cfg.num_warps / wc;
      int64_t cost = 0;
      for (const MmaDot& d : plan.dots) {
        if (d.m % (16 * wr) != 0 || d.n % (8 * wc) != 0) cost = -1;
        if (cost >= 0) cost += d.m / wr + d.n / wc;
      }
      if (cost >= 0 && (best < 0 || cost < best)) {
        best = cost;
        plan.warps_r = wr;
        plan.warps_c = wc;
      }
    }
  }
  plan.warpgroups = wg ? cfg.num_warps / 4 : 0;
  plan.fp8_key_order = static_cast<int>(knobs::fp8_key_order.of(cfg, -1));
  plan.producer_warp = wg && knobs::warp_specialize.on(cfg) &&
                       std::any_of(plan.staged.begin(), plan.staged.end(), [](const StagedLoad& s) { return s.producer; });
  if (!plan.producer_warp)
    for (StagedLoad& s : plan.staged) {
      s.producer = false;
      if (!s.home) s.stages = 1;
    }
  return plan;
}

void finish_mma_plan(MmaPlan& plan, const std::function<bool(int value)>& in_accumulator_layout) {
  // An a operand in the accumulator layout is the A fragment of a register-A wgmma: its
  // registers go in as they are (16-bit) or after a byte shuffle (fp8), without shared memory.
  for (MmaDot& d : plan.dots) {
    MmaOperand& a = d.a;
    if (a.source != MmaOperand::Source::registers || a.transposed || !in_accumulator_layout(a.value)) continue;
    a.source = MmaOperand::Source::fragment;
    a.buffer = -1;
  }
  std::erase_if(plan.buffers, [&](const OperandBuffer& b) {
    const MmaDot* d = plan.dot_of(b.dot);
    return b.operand == 0 && d && d->a.source == MmaOperand::Source::fragment;
  });
  for (MmaDot& d : plan.dots)
    for (MmaOperand* o : {&d.a, &d.b}) {
      if (o->source != MmaOperand::Source::registers) continue;
      const int which = o == &d.a ? 0 : 1;
      for (size_t i = 0; i < plan.buffers.size(); ++i)
        if (plan.buffers[i].dot == d.op && plan.buffers[i].operand == which) o->buffer = static_cast<int>(i);
    }
  // fp8 P.V: the transposed copy of V puts K in the order P's fragments come in. By default where
  // the copy moves whole pieces of 16 keys x 32 bytes (transpose_8bit's ldmatrix.trans / stmatrix
  // form; the 4 x 4-byte blocks in key order cost more than P's shuffles save).
  for (StagedLoad& s : plan.staged) {
    const bool pieces = s.tile.rows % 16 == 0 && s.tile.row_bytes % 32 == 0;
    if (!s.transposed_copy || plan.fp8_key_order == 0 || (plan.fp8_key_order < 0 && !pieces)) continue;
    s.permute_k = !s.readers.empty() && std::all_of(s.readers.begin(), s.readers.end(), [&](const Op* r) {
      const MmaDot* d = plan.dot_of(r);
      return d && d->a.source == MmaOperand::Source::fragment && d->b.source == MmaOperand::Source::staged &&
             &plan.staged.at(d->b.staged) == &s && size_bytes(d->ta) == 1;
    });
  }
  // Shared memory: rings and buffers at 1024-byte boundaries (the 128-byte swizzle's period),
  // then the barriers.
  int64_t off = 0;
  for (StagedLoad& s : plan.staged) {
    s.slot_stride = round_up(s.tile.bytes(), 1024);
    s.smem_offset = off;
    off += s.slot_stride * s.stages;
  }
  for (StagedLoad& s : plan.staged) {
    if (!s.transposed_copy) continue;
    s.read_slot_stride = round_up(s.read_tile.bytes(), 1024);
    s.read_offset = off;
    off += s.read_slot_stride * s.read_stages;
  }
  for (OperandBuffer& b : plan.buffers) {
    b.smem_offset = off;
    off += round_up(b.tile.bytes(), 1024);
  }
  for (StagedLoad& s : plan.staged) {
    if (s.copy) continue;
    s.barriers = off;
    off += 16 * s.stages;
    if (s.transposed_copy) {
      s.read_barriers = off;
      off += 16 * s.read_stages;
    }
  }
  plan.smem_bytes = round_up(off, 16);
}

}  // namespace tj::codegen
