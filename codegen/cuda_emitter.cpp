// The CUDA emitter: the kernel, its launch decode, scalar and SIMT ops (emit_mma.cpp: the
// tensor-core ops).
#include "codegen/cuda_emitter.h"
#include "codegen/emitter_knobs.h"
#include "codegen/key_parity.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "codegen/emitter.h"
#include "codegen/issue_early.h"
#include "codegen/mask_bounds.h"
#include "codegen/prefetch_loads.h"
#include "codegen/program_trips.h"
#include "codegen/lowering.h"
#include "core/numerics.h"
#include "dsl/error.h"
#include "dsl/passes.h"
#include "dsl/rules.h"

namespace tj::codegen::emitter {

// Knob longest_first: the L2 that a group of outer programs' operands may fill together (the
// attention template's measured budget for 16-bit inputs, a fraction of Hopper's L2).
constexpr int64_t kGroupL2Bytes = int64_t(8) << 20;

// ---- analysis ----------------------------------------------------------------------------------

void Emitter::analyze() {
  def_.assign(f_.values.size(), nullptr);
  uses_.assign(f_.values.size(), 0);
  range_.assign(f_.values.size(), Range{});
  divisor_.assign(f_.values.size(), 1);
  loop_end_.assign(f_.values.size(), -1);
  loop_begin_.assign(f_.values.size(), -1);
  names_.assign(f_.values.size(), "");
  ir::walk(f_.body, [&](const Op& op, int) {
    if (op.result >= 0) def_[op.result] = &op;
  });
  // Transposes used only as dot operands are folded into the dot's operand staging, and as the
  // value of unmasked stores of two tile dims into the store's addressing (the source tile stored
  // with its axes swapped: no exchange through shared memory).
  std::map<int, int> transpose_uses, folded_uses;
  ir::walk(f_.body, [&](const Op& op, int) {
    for (size_t i = 0; i < op.operands.size(); ++i) {
      int v = op.operands[i];
      if (def_[v] && def_[v]->kind == OpKind::transpose) {
        ++transpose_uses[v];
        if ((op.kind == OpKind::dot && i < 2) || store_folds_transpose(op, i)) ++folded_uses[v];
      }
    }
  });
  for (auto [v, n] : transpose_uses)
    if (folded_uses[v] == n) folded_.insert(v);
  ir::walk(f_.body, [&](const Op& op, int) {
    for (size_t i = 0; i < op.operands.size(); ++i) {
      int v = op.operands[i];
      if (((op.kind == OpKind::dot && i < 2) || store_folds_transpose(op, i)) && folded_.count(v)) v = def_[v]->operands[0];
      ++uses_[v];
    }
    if (op.kind == OpKind::loop) ++uses_[op.body_index];
    compute_range(op);
  });
  // A register operand of a tensor-core dot cast from f32 to the operand's type, and used only by
  // the dot: the dot's own conversion (to the A fragment, or into its buffer) rounds the same way,
  // so the dot takes the f32 tile and the cast goes.
  for (MmaDot& d : mma_.dots)
    for (MmaOperand* o : {&d.a, &d.b}) {
      if (o->source == MmaOperand::Source::staged || o->transposed) continue;
      const Op* c = def_[o->value];
      if (!c || c->kind != OpKind::cast || uses_[o->value] != 1 || f_.type(c->operands[0]).dtype != DType::f32 ||
          f_.type(o->value).rank() != 2)
        continue;
      --uses_[o->value];
      ++uses_[c->operands[0]];
      o->value = c->operands[0];
    }
  // 1 + tanh(y) of f32 (GELU's), the tanh used only there: one tj::dev::one_plus_tanh(y), the same
  // value in real arithmetic, cheaper and without the cancellation near tanh(y) = -1. Not with
  // fast_math, whose tanh.approx is one instruction already.
  if (!fast_math_)
    ir::walk(f_.body, [&](const Op& op, int) {
      if (op.kind != OpKind::binary || op.binary != BinaryFn::add || f_.type(op.result).dtype != DType::f32) return;
      for (int side = 0; side < 2; ++side) {
        const Op* one = def_[op.operands[1 - side]];
        const Op* t = def_[op.operands[side]];
        if (!one || one->kind != OpKind::const_value || one->fval != 1.0 || !t || t->kind != OpKind::unary ||
            t->unary != UnaryFn::tanh || uses_[op.operands[side]] != 1 || f_.type(t->operands[0]).dtype != DType::f32)
          continue;
        one_plus_tanh_[op.result] = t->operands[0];
        --uses_[op.operands[side]];
        --uses_[op.operands[1 - side]];
        ++uses_[t->operands[0]];
        return;
      }
    });
  // A store whose value is a cast from f32 to the tensor's float dtype, used only there: the
  // store's own conversion rounds the same way (to nearest even), so it takes the f32 tile and
  // the cast goes (a rounding, then a conversion again, per element: attention's and GEMMs'
  // epilogues).
  ir::walk(f_.body, [&](const Op& op, int) {
    if (op.kind != OpKind::store) return;
    const int v = op.operands.at(op.indices.size());
    const Op* c = def_[v];
    const DType to = f_.params[op.param].dtype;
    if (!c || c->kind != OpKind::cast || uses_[v] != 1 || f_.type(v).dtype != to || f_.type(c->operands[0]).dtype != DType::f32 ||
        !(to == DType::f16 || to == DType::bf16 || to == DType::e4m3 || to == DType::e5m2) ||
        !plan_.of(c->operands[0]).same_registers(plan_.of(v)))
      return;
    store_cast_[&op] = c->operands[0];
    --uses_[v];
    ++uses_[c->operands[0]];
  });
  // Scalar indices that can leave a static dim (every load and store, staged ones too).
  ir::walk(f_.body, [&](const Op& op, int) {
    if (op.kind != OpKind::load && !ir::is_store(op.kind)) return;
    for (size_t d = 0; d < op.indices.size(); ++d)
      if (op.indices[d].kind == ir::Index::Kind::scalar) check_scalar_index(op, static_cast<int>(d), range(op.operands[d]));
  });
  // Dead code: pure ops whose results are never used free their operands, to a fixpoint.
  std::set<const Op*> dead;
  for (bool changed = true; changed;) {
    changed = false;
    ir::walk(f_.body, [&](const Op& op, int) {
      if (dead.count(&op) || !pure_and_unused(op)) return;
      dead.insert(&op);
      changed = true;
      for (size_t i = 0; i < op.operands.size(); ++i) {
        int v = op.operands[i];
        if (((op.kind == OpKind::dot && i < 2) || store_folds_transpose(op, i)) && folded_.count(v)) v = def_[v]->operands[0];
        --uses_[v];
      }
    });
  }
}

bool Emitter::store_folds_transpose(const Op& op, size_t i) const {
  if (!ir::is_store(op.kind) || op.ival == 1 || i != op.indices.size()) return false;
  const Op* t = def_[op.operands[i]];
  if (!t || t->kind != OpKind::transpose || !plan_.of(t->operands[0]).in_registers() || f_.type(t->operands[0]).rank() != 2)
    return false;
  // Only accumulator fragments: in them 8 lanes hold 8 adjacent rows, so a swapped store still
  // writes runs of adjacent elements. A SIMT tile's lanes and vectors run along its columns, and
  // stored swapped each lane would write its own far-apart elements (H200: the e4m3 quantizer
  // that writes a transpose ran 3x slower so); it goes through shared memory instead.
  if (plan_.of(t->operands[0]).kind != LayoutKind::mma) return false;
  int tile_dims = 0;
  for (const ir::Index& ix : op.indices) tile_dims += ix.kind != ir::Index::Kind::scalar;
  return tile_dims == 2;
}

namespace {
// A divisor of every value of a constant: itself (0: any, as a large power of two).
int64_t divisor_of_constant(int64_t c) { return c == 0 ? int64_t(1) << 62 : c < 0 ? (c == kMin ? 1 : -c) : c; }
int64_t mul_divisors(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) || r > (int64_t(1) << 62) ? int64_t(1) << 62 : r;
}
}  // namespace

void Emitter::compute_range(const Op& op) {
  compute_divisor(op);
  auto set = [&](int v, Range r) { range_[v] = r; };
  if (op.kind == OpKind::loop) {
    Range b = range(op.operands[0]), e = range(op.operands[1]);
    Range idx;
    idx.lo = b.lo;
    if (e.known_hi()) {
      idx.hi = e.hi - 1;
      if (op.loop_kind == ir::LoopKind::tile && b.constant()) {
        int64_t bs = cfg_.block(f_, op.block_id);
        idx.hi = e.hi <= b.lo ? b.lo : b.lo + floordiv64(e.hi - 1 - b.lo, bs) * bs;
      }
    }
    set(op.body_index, idx);
    return;
  }
  if (op.result < 0) return;
  const TileType& t = f_.type(op.result);
  if (!t.is_scalar() || !is_int(t.dtype)) return;
  switch (op.kind) {
    case OpKind::const_value: set(op.result, Range::exactly(op.ival)); break;
    case OpKind::block_size: set(op.result, Range::exactly(cfg_.block(f_, op.block_id))); break;
    case OpKind::tensor_dim: set(op.result, Range{0, kMax}); break;
    case OpKind::cast: {
      const TileType& from = f_.type(op.operands[0]);
      if (is_int(from.dtype)) {
        Range r = range(op.operands[0]);
        if (t.dtype == DType::i64 || (r.known_lo() && r.known_hi() && r.lo >= INT32_MIN && r.hi <= INT32_MAX)) set(op.result, r);
      } else if (from.dtype == DType::i1) {
        set(op.result, Range{0, 1});
      }
      break;
    }
    case OpKind::binary: {
      Range a = range(op.operands[0]), b = range(op.operands[1]);
      Range r;
      switch (op.binary) {
        case BinaryFn::add: r = {sat_add(a.lo, b.lo), sat_add(a.hi, b.hi)}; break;
        case BinaryFn::sub:
          r = {b.known_hi() && a.known_lo() ? sat_add(a.lo, -b.hi) : kMin, b.known_lo() && a.known_hi() ? sat_add(a.hi, -b.lo) : kMax};
          break;
        case BinaryFn::mul:
          if (a.known_lo() && a.known_hi() && b.known_lo() && b.known_hi()) {
            __int128 p[4] = {(__int128)a.lo * b.lo, (__int128)a.lo * b.hi, (__int128)a.hi * b.lo, (__int128)a.hi * b.hi};
            __int128 lo = *std::min_element(p, p + 4), hi = *std::max_element(p, p + 4);
            if (lo >= kMin && hi <= kMax) r = {(int64_t)lo, (int64_t)hi};
          } else if (a.known_lo() && b.known_lo() && a.lo >= 0 && b.lo >= 0) {
            r.lo = 0;
          }
          break;
        case BinaryFn::maximum: r = {std::max(a.lo, b.lo), std::max(a.hi, b.hi)}; break;
        case BinaryFn::minimum: r = {std::min(a.lo, b.lo), std::min(a.hi, b.hi)}; break;
        case BinaryFn::floordiv:
          if (b.constant() && b.lo > 0) r = {a.known_lo() ? floordiv64(a.lo, b.lo) : kMin, a.known_hi() ? floordiv64(a.hi, b.lo) : kMax};
          break;
        case BinaryFn::div:
          if (b.constant() && b.lo > 0 && a.known_lo() && a.lo >= 0) r = {a.lo / b.lo, a.known_hi() ? a.hi / b.lo : kMax};
          break;
        case BinaryFn::mod:
          if (b.constant() && b.lo > 0) {
            r = {0, b.lo - 1};
            if (a.known_lo() && a.known_hi() && a.lo >= 0 && a.hi < b.lo) r = a;
          }
          break;
        default: break;
      }
      set(op.result, r);
      break;
    }
    default: break;
  }
}

// A scalar index whose range, from the launch's and loops' static bounds, leaves a static dim is
// a mistake (a head index over q's heads used on k with fewer): such an element reads 0 and a
// store there is dropped, a silently wrong answer. Say so at the user's line.
void Emitter::check_scalar_index(const Op& op, int d, const Range& r) const {
  const ir::Param& p = f_.params.at(op.param);
  const int64_t dim = p.static_shape[d];
  if (dim < 0 || !r.known_lo() || !r.known_hi() || (r.lo >= 0 && r.hi < dim)) return;
  throw Error(fmt::format("kernel '{}': the {} at {} indexes dim {} of '{}' (size {}) with a scalar that ranges over [{}, {}]: "
                          "past the dim an element would read 0 and a store would be dropped. Index within the dim (e.g. "
                          "a grouped-query head as h / (H / Hkv))",
                          f_.name, op.kind == OpKind::load ? "load" : ir::name(op.kind), op.loc.str(), d, p.name, dim, r.lo, r.hi));
}

bool Emitter::provably_inside(int start, int64_t extent, int64_t dim) const {
  if (dim < 0) return false;
  Range r = range(start);
  return r.known_lo() && r.lo >= 0 && r.known_hi() && r.hi <= dim - extent;
}

bool Emitter::pure_and_unused(const Op& op) const {
  switch (op.kind) {
    case OpKind::store:
    case OpKind::store_add:
    case OpKind::var_write:
    case OpKind::loop:
      return false;
    default:
      return op.result >= 0 && uses_[op.result] == 0;
  }
}

// ---- output helpers -------------------------------------------------------------------------------

std::string Emitter::marker(const ir::SourceLoc& loc) const {
  if (!loc.known()) return "";
  return fmt::format("  // @ {}:{}", loc.file, loc.line);
}

void Emitter::line(const std::string& code, const ir::SourceLoc* loc) {
  if (!code.empty() && code[0] == '}')   // a scope closes: the loads defined inside it are gone
    std::erase_if(loaded_, [&](const auto& e) { return e.second.indent > indent_; });
  body_ += std::string(2 * indent_, ' ') + code + (loc ? marker(*loc) : std::string()) + "\n";
}

std::string Emitter::alias(const Layout& l) {
  if (l.is_mma()) {
    if (!arr_alias_.count("ArrMma")) {
      arr_alias_["ArrMma"] = l.arr.mma_cuda_type();
      alias_lines_.insert(alias_lines_.begin(), fmt::format("using ArrMma = {};  // the tensor cores' accumulator warps",
                                                            l.arr.mma_cuda_type()));
    }
    std::string type = l.cuda_type("ArrMma");
    auto it = layout_alias_.find(type);
    if (it != layout_alias_.end()) return it->second;
    std::string name = fmt::format("M{}x{}{}", l.extent_r, l.extent_c, l.columns_by_parity() ? "p" : "");
    layout_alias_[type] = name;
    alias_lines_.push_back(fmt::format("using {} = {};  // accumulator layout, {} per thread{}", name, type, l.slots(),
                                       l.columns_by_parity() ? ", columns by parity (even columns first)" : ""));
    return name;
  }
  const bool flat = !plan_.has_2d || !(l.arr == plan_.arr2);
  std::string arr = flat ? "Arr1d" : "Arr2d";
  if (!arr_alias_.count(arr)) {
    const Arrangement& a = flat ? l.arr : plan_.arr2;
    arr_alias_[arr] = a.cuda_type();
    alias_lines_.insert(alias_lines_.begin(),
                        fmt::format("using {} = {};  // {} thread rows x {} thread columns", arr, a.cuda_type(), a.rows(), a.cols()));
  }
  std::string type = l.cuda_type(arr);
  auto it = layout_alias_.find(type);
  if (it != layout_alias_.end()) return it->second;
  std::string name = !flat ? fmt::format("L{}x{}", l.extent_r, l.extent_c)
                     : l.extent_r == 1 ? fmt::format("L{}", l.extent_c)
                                       : fmt::format("L{}x{}_flat", l.extent_r, l.extent_c);
  layout_alias_[type] = name;
  alias_lines_.push_back(fmt::format("using {} = {};  // {} per thread", name, type, l.slots()));
  return name;
}

void Emitter::need_smem(int64_t bytes, const std::string& what) {
  if (bytes > smem_) {
    smem_ = bytes;
    smem_what_ = what;
  }
}

void Emitter::check_tile(int v, const Layout& l, const ir::SourceLoc& loc) {
  check_slots(l, fmt::format("{}{}", name(f_.type(v).dtype), rules::shape_str(&f_, f_.type(v).shape)), loc);
}

void Emitter::check_slots(const Layout& l, const std::string& what, const ir::SourceLoc& loc) {
  if (!l.is_distributed() || l.slots() <= kMaxTileElementsPerThread) return;
  throw Error(fmt::format(
      "kernel '{}' with config {}: the {} tile ({}x{} = {} elements) at {} needs {} elements per thread with {} threads, "
      "more than the {} the CUDA backend's SIMT path allows for one tile: use smaller block sizes or more warps",
      f_.name, cfg_.to_json(), what, l.extent_r, l.extent_c, l.extent_r * l.extent_c, loc.str(), l.slots(), plan_.threads,
      kMaxTileElementsPerThread));
}

std::string Emitter::define(int v, const std::string& expr, const ir::SourceLoc& loc) {
  const Layout& l = plan_.of(v);
  check_tile(v, l, loc);
  std::string n = fmt::format("v{}", v);
  names_[v] = n;
  if (l.is_scalar()) line(fmt::format("const {} {} = {};", reg_type(f_.type(v).dtype), n, expr), &loc);
  else line(fmt::format("const {} {} = {};", tile_type(f_.type(v).dtype, l), n, expr), &loc);
  return n;
}

std::string Emitter::operand(int v, const Layout& want, const ir::SourceLoc& loc) {
  return convert(ref(v), plan_.of(v), want, f_.type(v).dtype, loc, v);
}

std::string Emitter::convert(const std::string& expr, const Layout& have, const Layout& want, DType t,
                             const ir::SourceLoc& loc, int v) {
  if (have.is_scalar() && want.is_scalar()) return expr;
  Conversion c = plan_conversion(have, want, reg_bytes(t));
  if (c.kind != Conversion::Kind::exchange) return c.expr(expr, want.is_scalar() ? "" : alias(want));
  need_smem(c.smem_bytes, fmt::format("a layout conversion at {}", loc.str()));
  check_tile(v, want, loc);
  std::string n = fresh(v, "x");
  line(fmt::format("const {} {} = {};", tile_type(t, want), n, c.expr(expr, alias(want))), &loc);
  return n;
}

void Emitter::compute_divisor(const Op& op) {
  if (op.kind == OpKind::loop) {
    const int64_t step = op.loop_kind == ir::LoopKind::tile ? cfg_.block(f_, op.block_id) : 1;
    divisor_[op.body_index] = std::gcd(divisor(op.operands[0]), step);
    loop_end_[op.body_index] = op.operands[1];
    loop_begin_[op.body_index] = op.operands[0];
    return;
  }
  if (op.result < 0) return;
  const TileType& t = f_.type(op.result);
  if (!t.is_scalar() || !is_int(t.dtype)) return;
  int64_t d = 1;
  switch (op.kind) {
    case OpKind::const_value: d = divisor_of_constant(op.ival); break;
    case OpKind::block_size: d = divisor_of_constant(cfg_.block(f_, op.block_id)); break;
    case OpKind::cast: d = is_int(f_.type(op.operands[0]).dtype) ? divisor(op.operands[0]) : 1; break;
    case OpKind::binary: {
      const int64_t a = divisor(op.operands[0]), b = divisor(op.operands[1]);
      switch (op.binary) {
        case BinaryFn::add:
        case BinaryFn::sub:
        case BinaryFn::maximum:
        case BinaryFn::minimum: d = std::gcd(a, b); break;
        case BinaryFn::mul: d = mul_divisors(a, b); break;
        default: break;
      }
      break;
    }
    default: break;
  }
  divisor_[op.result] = d;
}

bool Emitter::provably_full(int vb, int ve, int64_t extent) const {
  Range b = range(vb), e = range(ve);
  if (b.known_hi() && e.known_lo() && b.hi <= e.lo - extent) return true;
  // A tile loop's index below its end, both multiples of the extent: index + extent <= end.
  return extent > 0 && vb >= 0 && vb < (int)loop_end_.size() && loop_end_[vb] >= 0 && end_at_most(loop_end_[vb], ve, loop_begin_[vb]) &&
         divisor(vb) % extent == 0 &&
         divisor(ve) % extent == 0;
}

// Whether a tile loop that starts at `begin` and ends at e runs no index at or past v: e is v, or
// min(x, y) with x or y such, or max(begin, y) with y such (codegen/mask_bounds.h's ends: where
// y <= begin the loop runs no index at all).
bool Emitter::end_at_most(int e, int v, int begin) const {
  if (e == v) return true;
  const Op* d = e >= 0 && e < (int)def_.size() ? def_[e] : nullptr;
  if (!d || d->kind != OpKind::binary) return false;
  if (d->binary == BinaryFn::minimum) return end_at_most(d->operands[0], v, begin) || end_at_most(d->operands[1], v, begin);
  if (d->binary == BinaryFn::maximum)
    for (int side = 0; side < 2; ++side)
      if (d->operands[side] == begin && end_at_most(d->operands[1 - side], v, begin)) return true;
  return false;
}

// ---- expressions ---------------------------------------------------------------------------------




std::string Emitter::unary_expr(UnaryFn fn, DType t, const std::string& x) const {
  return scalar::unary_expr(fn, t, x, fast_math_);
}
std::string Emitter::binary_expr(BinaryFn fn, DType od, DType rd, const std::string& a, const std::string& b) const {
  return scalar::binary_expr(fn, od, rd, a, b);
}
std::string Emitter::cast_expr(DType from, DType to, const std::string& x) const { return scalar::cast_expr(from, to, x); }

// ---- emission ----------------------------------------------------------------------------------------

void Emitter::emit_region(const ir::Region& r) {
  for (const Op& op : r.ops) emit_op(op);
}

bool Emitter::touches_written_memory(const Op& op) const {
  if (ir::is_store(op.kind)) return true;
  if ((op.kind == OpKind::load || op.kind == OpKind::gather) && f_.params.at(op.param).kind != ir::ParamKind::tensor_in)
    return true;
  if (op.body)
    for (const Op& inner : op.body->ops)
      if (touches_written_memory(inner)) return true;
  return false;
}

void Emitter::wait_before(const Op& op) {
  if (!starts_early_ || waited_ || !touches_written_memory(op)) return;
  line("tj::dev::griddep_wait();", &op.loc);   // at the DSL line that needs it
  waited_ = true;
}

void Emitter::emit_op(const Op& op) {
  if (pure_and_unused(op)) return;
  wait_before(op);
  if (auto w = async_.before.find(&op); w != async_.before.end() && !suppress_async_) emit_wait(w->second, &op.loc);
  if (op.kind == OpKind::loop) emit_ring_prologue(op);
  if (const StagedLoad* st = mma_.staged_of(&op)) {
    emit_staged_load(op, *st);
  } else if (const MmaDot* d = mma_.dot_of(&op)) {
    emit_mma_dot(op, *d);
  } else {
    emit_simt_op(op);
  }
  note_computed(op);
  if (&op == pass_after_) {
    // Knob wg_programs: the program's last ring wait is done (its last dots may still run): the
    // other slot may start its main loop while this one finishes its dots and its epilogue.
    line(persistent_ ? "const long long tj_next = tj_slot == 0 ? tj_pid + 1 : tj_pid + 2LL * gridDim.x - 1;"
                     : "const long long tj_next = tj_slot == 0 ? tj_pid + 1 : tj_total;");
    line("if (tj_next < tj_total) tj::dev::slot_pass(1 - tj_slot);   // the other slot's next program may wait on the rings");
  }
  if (auto w = async_.after.find(&op); w != async_.after.end() && !suppress_async_)
    emit_wait(w->second, &op.loc, op.kind == OpKind::loop ? &op : nullptr);
}

void Emitter::emit_simt_op(const Op& op) {
  switch (op.kind) {
    case OpKind::const_value:
    case OpKind::scalar_param:
    case OpKind::tensor_dim:
    case OpKind::block_size:
      emit_scalar_leaf(op);
      break;
    case OpKind::loop: emit_loop(op); break;
    case OpKind::load:
    case OpKind::store:
    case OpKind::store_add:
      emit_memory(op);
      break;
    case OpKind::gather: emit_gather(op); break;
    case OpKind::full:
    case OpKind::arange:
    case OpKind::unary:
    case OpKind::binary:
    case OpKind::where:
    case OpKind::cast:
      emit_elementwise(op);
      break;
    case OpKind::expand_dims:
    case OpKind::transpose:
    case OpKind::broadcast:
      emit_shape(op);
      break;
    case OpKind::reduce: emit_reduce(op); break;
    case OpKind::dot: emit_dot(op); break;
    case OpKind::var_decl:
    case OpKind::var_read:
    case OpKind::var_write:
      emit_var(op);
      break;
  }
}

// Constants, parameters, tensor dims and block sizes are named inline (no statement).
void Emitter::emit_scalar_leaf(const Op& op) { names_[op.result] = leaf_name(op); }

std::string Emitter::leaf_name(const Op& op) const {
  const TileType& t = f_.type(op.result);
  switch (op.kind) {
    case OpKind::const_value: return literal(op.fval, op.ival, t.dtype);
    case OpKind::block_size: return int_literal(cfg_.block(f_, op.block_id), t.dtype);
    case OpKind::scalar_param: return names_param_.at(op.param);
    case OpKind::tensor_dim: {
      const ir::Param& p = f_.params.at(op.param);
      return p.static_shape.at(op.axis) >= 0 ? int_literal(p.static_shape[op.axis], DType::i64)
                                             : fmt::format("{}.shape[{}]", names_param_.at(op.param), op.axis);
    }
    default: return "";
  }
}

bool Emitter::single_trip(const Op& loop) const {
  if (loop.loop_kind != ir::LoopKind::tile || loop.launch) return false;
  const Range b = range(loop.operands[0]), e = range(loop.operands[1]);
  if (!b.constant() || !e.constant()) return false;
  const int64_t extent = e.lo - b.lo;
  return extent > 0 && extent <= cfg_.block(f_, loop.block_id);
}

void Emitter::emit_loop(const Op& op) {
  std::string idx = fmt::format("v{}", op.body_index);
  names_[op.body_index] = idx;
  const std::string b = ref(op.operands[0]), e = ref(op.operands[1]);
  // A SIMT tile loop of one trip runs its body in the enclosing scope, its index the constant
  // start: loads of In tensors that two such loops repeat (a row read by a first pass and again
  // by a second) are then one load, and the row stays in registers between the passes.
  if (!mma_.on_tensor_cores() && single_trip(op)) {
    names_[op.body_index] = b;
    line(fmt::format("// one trip of the tile loop ({} to {} in a block of {}): its body in this scope", b, e,
                     cfg_.block(f_, op.block_id)),
         &op.loc);
    emit_region(*op.body);
    return;
  }
  if (overlap_ && mma_.wgmma() && !op.launch) {
    bool has_dot = false;
    for (const Op& o : op.body->ops) has_dot |= o.kind == OpKind::dot && mma_.dot_of(&o) != nullptr;
    if (has_dot) {
      const OverlapLoop o = plan_overlap(f_, op, mma_, async_, [&](int v) {
        const Layout& l = plan_.of(v);
        return l.is_scalar() ? 0 : l.slots();
      });
      if (o.why.empty()) return emit_overlapped_loop(op, o);
      line(fmt::format("// knob overlap: not this loop: {}", o.why), &op.loc);
    }
  }
  // Knob wg_turns: the warpgroups take turns issuing the dots of this loop's body (not of loops
  // inside it: those take their own turns).
  if (wg_turns_ && mma_.wgmma() && mma_.warpgroups >= 2 && !op.launch) {
    const Op* last = nullptr;
    for (const Op& o : op.body->ops)
      if (o.kind == OpKind::dot && mma_.dot_of(&o)) {
        turns_[&o] = Turn{&op, false};
        last = &o;
      }
    if (last) {
      turns_[last].last = true;
      line(fmt::format("if ({} < {}) tj::dev::Turns<{}>::start();   // warpgroup 0 issues first", b, e, mma_.warpgroups),
           &op.loc);
    }
  }
  if (op.loop_kind == ir::LoopKind::grid)
    line(fmt::format("for (long long {0} = {1}; {0} < {2}; ++{0}) {{", idx, b, e), &op.loc);
  else
    line(fmt::format("for (long long {0} = {1}; {0} < {2}; {0} += {3}) {{", idx, b, e,
                     int_literal(cfg_.block(f_, op.block_id), DType::i64)),
         &op.loc);
  ++indent_;
  since_wait_.clear();   // a pin inside names only the body's tiles
  emit_ring_iteration(op);
  emit_region(*op.body);
  if (auto w = async_.body_end.find(&op); w != async_.body_end.end()) emit_wait(w->second, nullptr);
  since_wait_.clear();
  --indent_;
  line("}");
}

void Emitter::emit_launch() {
  std::vector<const Op*> chain;
  std::vector<const ir::Region*> regions{&f_.body};
  for (;;) {
    const Op* l = nullptr;
    for (const Op& op : regions.back()->ops)
      if (op.kind == OpKind::loop && op.launch) l = &op;
    if (!l) break;
    chain.push_back(l);
    regions.push_back(l->body.get());
  }
  if (starts_early_) line("tj::dev::griddep_launch_dependents();  // the next kernel on the stream may start");
  if (chain.empty()) {
    if (slots_ > 1)
      throw Error(fmt::format("kernel '{}': knob wg_programs = {} needs launch loops (programs to run side by side); this kernel "
                              "is one program",
                              f_.name, slots_));
    line("// One program: no launch loops.");
    if (mma_.producer_warp) emit_producer(regions, chain, [] {}, [] {});
    emit_region(f_.body);
    return;
  }
  const size_t n = chain.size();
  // The ops that launch-loop bounds depend on come first: the extents need them.
  std::vector<int> stack;
  for (const Op* l : chain) stack.insert(stack.end(), l->operands.begin(), l->operands.end());
  while (!stack.empty()) {
    int v = stack.back();
    stack.pop_back();
    const Op* d = v >= 0 ? def_[v] : nullptr;
    if (!d || hoisted_.count(d)) continue;
    hoisted_.insert(d);
    stack.insert(stack.end(), d->operands.begin(), d->operands.end());
  }
  for (size_t k = 0; k < n; ++k)
    for (const Op& op : regions[k]->ops)
      if (hoisted_.count(&op)) emit_op(op);

  std::string total;
  for (size_t k = 0; k < n; ++k) {
    const Op& l = *chain[k];
    Range b = range(l.operands[0]), e = range(l.operands[1]);
    const int64_t bs = l.loop_kind == ir::LoopKind::tile ? cfg_.block(f_, l.block_id) : 1;
    std::string extent;
    if (b.constant() && e.constant()) {
      int64_t span = std::max<int64_t>(0, e.lo - b.lo);
      extent = int_literal((span + bs - 1) / bs, DType::i64);
    } else {
      std::string span = b.constant() && b.lo == 0 ? ref(l.operands[1])
                                                   : fmt::format("{} - {}", ref(l.operands[1]), ref(l.operands[0]));
      extent = bs == 1 ? fmt::format("tj::dev::imax(0LL, {})", span)
                       : fmt::format("tj::dev::imax(0LL, tj::dev::cdiv<long long>({}, {}LL))", span, bs);
    }
    line(fmt::format("const long long tj_n{} = {};", k, extent), &l.loc);
    total += (total.empty() ? "" : " * ") + fmt::format("tj_n{}", k);
  }
  line(fmt::format("const long long tj_total = {};   // programs", total));
  if (persistent_) {
    line("(void)tj_programs;   // persistent: the launch's blocks loop over the programs");
  } else if (slots_ > 1) {
    line(fmt::format("// This block runs programs {0} * its index .. (knob wg_programs: one a slot of {1} threads).", slots_,
                     plan_.threads));
    line("const long long tj_block = (long long)blockIdx.x + (long long)blockIdx.y * (long long)gridDim.x;");
  } else {
    line("// This block runs one program of the launch nest (innermost launch loop fastest).");
    line("const long long tj_pid = (long long)blockIdx.x + (long long)blockIdx.y * (long long)gridDim.x;");
    // (A block without a program still waits: no kernel may finish before the one it started beside.)
    line(starts_early_ ? "if (tj_pid >= tj_total) { tj::dev::griddep_wait(); return; }" : "if (tj_pid >= tj_total) return;");
  }
  // The program's launch-loop indices from tj_pid: innermost fastest, or, with knob raster_group
  // G > 1, the last two tile loops in groups of G tiles of the outer one (neighbouring programs
  // then share operand tiles in L2).
  // Launch loops whose index a bound of a loop inside the program depends on (causal attention's
  // query tiles; the backward's key tiles, whose query loop starts at the key tile): `growing`,
  // and of those the ones whose programs run shorter the larger the index (program_trips.h).
  std::set<size_t> growing, shrinking;
  for (size_t k = 0; k < n; ++k) {
    const int trend = trip_trend(f_, cfg_, *chain[k]);
    if (trend != 0) growing.insert(k);
    if (trend < 0) shrinking.insert(k);
  }
  const bool raster = !(longest_first_ && !growing.empty()) && raster_group_ > 1 && n >= 2 &&
                      chain[n - 2]->loop_kind == ir::LoopKind::tile && chain[n - 1]->loop_kind == ir::LoopKind::tile;
  // Knob longest_first with growing loops: the longest programs first, over groups of outer
  // programs (the other launch loops: attention's heads) whose operands fit kGroupL2Bytes of L2
  // together (or raster_group of them, where the knob is set): a group's longest programs of
  // every outer index first, outer indices fastest, then the programs before them. Programs that
  // run together then share their operands in L2, and the short ones fill the grid's tail.
  const bool grouped = longest_first_ && !growing.empty();
  program_order_ = grouped;
  std::string group_size;
  if (grouped) {
    const int64_t g = knobs::raster_group.of(cfg_, 0);
    if (g > 0) {
      group_size = fmt::format("{}u", g);
    } else {
      // The bytes of the tensors that loops inside a program load, per outer index.
      std::set<int> params;
      for (const Op* l : chain)
        ir::walk(*l->body, [&](const Op& op, int) {
          if (op.kind == OpKind::loop && !op.launch)
            ir::walk(*op.body, [&](const Op& in, int) {
              if (in.kind == OpKind::load || in.kind == OpKind::gather) params.insert(in.param);
            });
        });
      std::vector<std::string> bytes;
      for (int p : params) {
        const ir::Param& t = f_.params.at(p);
        std::string b = fmt::format("{}LL", size_bytes(t.dtype));
        for (size_t d = 0; d < t.static_shape.size(); ++d) b += " * " + dim_limit(p, static_cast<int>(d));
        bytes.push_back(b);
      }
      std::string outer = "1LL";
      for (size_t k = 0; k < n; ++k)
        if (!growing.count(k)) outer += fmt::format(" * tj_n{}", k);
      group_size = bytes.empty() ? std::string("1u")
                                 : fmt::format("(unsigned)tj::dev::imin((long long)tj_total, {}LL * ({}) / tj::dev::imax(1LL, {}))",
                                               kGroupL2Bytes, outer, fmt::join(bytes, " + "));
    }
  }
  // The flat outer and growing indices by the attention template's order (attn_tile_order.cuh:
  // .bh the outer index, .m_tile the growing one), each decoded innermost fastest.
  std::vector<size_t> outer, grow;
  for (size_t k = 0; k < n; ++k) (growing.count(k) ? grow : outer).push_back(k);
  auto group_counts = [&] {
    auto product = [](const std::vector<size_t>& ks) {
      std::string r = "1u";
      for (size_t k : ks) r += fmt::format(" * (unsigned)tj_n{}", k);
      return r;
    };
    line("// knob longest_first: the longest programs first, over groups of outer programs (not innermost fastest)");
    line(fmt::format("const unsigned tj_on = {}, tj_gn = {};   // outer programs, growing ones per outer index", product(outer),
                     product(grow)));
    line(fmt::format("const unsigned tj_group = {};   // outer programs a group", group_size));
  };
  // Persistent blocks over the longest-first order (one program set a block): rounds of programs
  // that follow the order's period, every other one backwards (attn_tile_order.cuh: attn_rounds).
  const bool rounds = grouped && persistent_ && slots_ == 1;
  auto decode = [&] {
    std::vector<std::string> idx(n);
    if (grouped) {
      if (!rounds) group_counts();
      line(fmt::format("const tj::dev::AttnTile tj_lf = tj::dev::attn_tile_longest_first((unsigned){}, tj_gn, tj_on, tj_group);",
                       rounds ? "tj::dev::attn_round_pid((unsigned)tj_pid, blockIdx.x, tj_rounds, (unsigned)tj_total)" : "tj_pid"));
      for (const auto* ks : {&outer, &grow}) {
        const std::string flat = ks == &outer ? "(unsigned)tj_lf.bh" : "(unsigned)tj_lf.m_tile";
        std::string stride;
        for (size_t p = ks->size(); p-- > 0;) {
          const size_t k = (*ks)[p];
          std::string i = stride.empty() ? flat : fmt::format("{} / ({})", flat, stride);
          if (p > 0) i = fmt::format("({}) % (unsigned)tj_n{}", i, k);
          // The order counts growing indices down; one whose programs shrink walks up instead.
          idx[k] = shrinking.count(k) ? fmt::format("((long long)tj_n{} - 1 - (long long)({}))", k, i)
                                      : fmt::format("(long long)({})", i);
          stride += (stride.empty() ? "" : " * ") + fmt::format("(unsigned)tj_n{}", k);
        }
      }
    }
    const size_t plain = grouped ? 0 : raster ? n - 2 : n;   // loops decoded innermost fastest
    const std::string pid = raster ? "tj_outer" : "tj_pid";
    if (raster) {
      const std::string na = fmt::format("tj_n{}", n - 2), nb = fmt::format("tj_n{}", n - 1);
      if (n > 2) line(fmt::format("const long long tj_outer = tj_pid / ({} * {});", na, nb));
      line(fmt::format("const long long tj_pair = tj_pid % ({} * {});", na, nb));
      line(fmt::format("const long long tj_gsize = {}LL * {}, tj_g0 = tj_pair / tj_gsize * {}LL;", raster_group_, nb,
                       raster_group_));
      line(fmt::format("const long long tj_gh = tj::dev::imin<long long>({} - tj_g0, {}LL);   // raster group {}", na,
                       raster_group_, raster_group_));
      idx[n - 2] = "tj_g0 + tj_pair % tj_gsize % tj_gh";
      idx[n - 1] = "tj_pair % tj_gsize / tj_gh";
    }
    // Decode order, slowest first: the loops as written, or, with knob longest_first, the loops whose
    // index raises an inner loop's trip count first and counted down (the longest programs start
    // first, and the short ones fill the tail).
    std::vector<size_t> order;
    for (size_t k = 0; k < plain; ++k)
      if (longest_first_ && growing.count(k)) order.push_back(k);
    for (size_t k = 0; k < plain; ++k)
      if (!(longest_first_ && growing.count(k))) order.push_back(k);
    for (size_t p = 0; p < order.size(); ++p) {
      const size_t k = order[p];
      std::string stride;
      for (size_t q = p + 1; q < order.size(); ++q) stride += (stride.empty() ? "" : " * ") + fmt::format("tj_n{}", order[q]);
      std::string i = stride.empty() ? pid : order.size() - p > 2 ? fmt::format("{} / ({})", pid, stride) : fmt::format("{} / {}", pid, stride);
      if (p > 0) i = fmt::format("{} % tj_n{}", i, k);
      if (longest_first_ && growing.count(k)) i = fmt::format("tj_n{} - 1 - {}", k, p > 0 ? "(" + i + ")" : i);
      idx[k] = i;
    }
    for (size_t k = 0; k < n; ++k) {
      const Op& l = *chain[k];
      Range br = range(l.operands[0]);
      const std::string b = br.constant() && br.lo == 0 ? "" : ref(l.operands[0]) + " + ";
      const std::string bs = l.loop_kind == ir::LoopKind::tile ? int_literal(cfg_.block(f_, l.block_id), DType::i64) : "";
      const std::string& i = idx[k];
      std::string value = l.loop_kind == ir::LoopKind::grid ? b + (i == "tj_pid" ? i : "(" + i + ")")
                          : i != "tj_pid"                   ? fmt::format("{}({}) * {}", b, i, bs)
                                                            : fmt::format("{}{} * {}", b, i, bs);
      names_[l.body_index] = fmt::format("v{}", l.body_index);
      line(fmt::format("const long long v{} = {};", l.body_index, value), &l.loc);
    }
  };
  auto program_begin = [&] {
    if (slots_ > 1 && emitting_producer_) {
      // Knob wg_programs: the producer fills the slots' rings program by program, in the order
      // the slots run them (slot s of block b: programs S * b + s, then S * (b + grid) + s, ..).
      const std::string first = persistent_ ? "(long long)blockIdx.x" : "tj_block";
      line(persistent_ ? fmt::format("for (long long tj_q = {}; tj_q * {} < tj_total; tj_q += gridDim.x) {{", first, slots_)
                       : fmt::format("for (long long tj_q = {0}; tj_q == {0}; ++tj_q) {{", first));
      ++indent_;
      line(fmt::format("for (int tj_ps = 0; tj_ps < {}; ++tj_ps) {{   // slot tj_ps's program", slots_));
      ++indent_;
      line(fmt::format("const long long tj_pid = tj_q * {} + tj_ps;", slots_));
      line("if (tj_pid >= tj_total) break;");
    } else if (slots_ > 1) {
      line(persistent_ ? fmt::format("for (long long tj_pid = (long long)blockIdx.x * {0} + tj_slot; tj_pid < tj_total; tj_pid "
                                     "+= (long long)gridDim.x * {0}) {{   // this slot's programs",
                                     slots_)
                       : fmt::format("for (long long tj_pid = tj_block * {} + tj_slot; tj_pid < tj_total; tj_pid = tj_total) {{   "
                                     "// this slot's program",
                                     slots_));
      ++indent_;
      // The rings hold the fills in the producer's order: the other slot's program that it filled
      // just before this one (slot 1: the same round's; slot 0: the last round's) is skipped by
      // counting its fills (its loops' trip counts, from scalar arithmetic as the producer has them).
      line(persistent_ ? "const long long tj_prev = tj_slot == 1 ? tj_pid - 1 : tj_pid - 2LL * gridDim.x + 1;"
                       : "const long long tj_prev = tj_slot == 1 ? tj_pid - 1 : -1;");
      line("if (tj_prev >= 0) {   // skip the fills of the other slot's program just before this one");
      ++indent_;
      line("const long long tj_pid = tj_prev;");
      decode();
      emit_producer_nest(regions, chain, ProducerRole::count);
      --indent_;
      line("}");
      line("if (tj_prev >= 0) tj::dev::slot_take(tj_slot);   // that program's last ring wait is done");
    } else if (rounds) {
      group_counts();
      line("const unsigned tj_rounds = tj::dev::attn_rounds(tj::dev::imin(tj_group, tj_on) * tj_gn, gridDim.x);   // blocks past it idle");
      line("for (long long tj_pid = blockIdx.x; tj_pid < (blockIdx.x < tj_rounds ? tj_total : 0LL); tj_pid += tj_rounds) {   // this "
           "block's programs, a round of tj_rounds apart");
      ++indent_;
    } else if (persistent_) {
      line("for (long long tj_pid = blockIdx.x; tj_pid < tj_total; tj_pid += gridDim.x) {   // this block's programs");
      ++indent_;
    }
    decode();
  };
  auto program_end = [&] {
    if (slots_ > 1 && emitting_producer_) {
      for (int k = 0; k < 2; ++k) {
        --indent_;
        line("}");
      }
    } else if (persistent_ || slots_ > 1) {
      --indent_;
      line("}");
    }
  };
  if (mma_.producer_warp) emit_producer(regions, chain, program_begin, program_end);
  program_begin();
  for (size_t k = 0; k < n; ++k)
    for (const Op& op : regions[k]->ops)
      if (&op != chain[k] && !hoisted_.count(&op)) emit_op(op);
  // Knob wg_programs: the slot passes the rings' turn once the program's last op that waits on
  // them has made its last wait (emit_op, before that op's closing wgmma wait): its last dots and
  // its epilogue then overlap the other slot's main loop.
  const Op* last_ring_op = nullptr;
  for (const Op& op : regions[n]->ops) {
    const StagedLoad* st = mma_.staged_of(&op);
    if ((st && st->producer) || holds_producer_load(op, mma_)) last_ring_op = &op;
  }
  if (slots_ > 1 && !last_ring_op)
    throw Error(fmt::format("kernel '{}': knob wg_programs = {} needs the operands the producer stages to be loaded inside the "
                            "innermost launch loop",
                            f_.name, slots_));
  if (slots_ > 1) pass_after_ = last_ring_op;
  emit_region(*regions[n]);
  pass_after_ = nullptr;
  program_end();
}

// A 1 compiled in puts a row's elements at immediate offsets from one address: ptxas then keeps
// one 64-bit address per row, not one per element.
std::string stride_of(const ir::Param& p, const std::string& tensor, int d) {
  const int64_t s = p.static_stride(d);
  return s >= 0 ? int_literal(s, DType::i64) : fmt::format("{}.stride[{}]", tensor, d);
}

std::string Emitter::loop_step(const Op& loop) const {
  return loop.loop_kind == ir::LoopKind::tile ? int_literal(cfg_.block(f_, loop.block_id), DType::i64) : "1LL";
}

std::string Emitter::dim_limit(int param, int d) const {
  const int64_t dim = f_.params.at(param).static_shape[d];
  return dim >= 0 ? int_literal(dim, DType::i64) : fmt::format("{}.shape[{}]", names_param_.at(param), d);
}

std::pair<std::string, std::string> Emitter::scalar_index_terms(const Op& op,
                                                                const std::function<std::string(int)>& val) const {
  const ir::Param& p = f_.params.at(op.param);
  std::vector<std::string> offsets, oks;
  for (size_t d = 0; d < op.indices.size(); ++d) {
    if (op.indices[d].kind != ir::Index::Kind::scalar) continue;
    const int idx = op.operands[d];
    const Range r = range(idx);   // a value's range holds in every iteration
    if (!(r.constant() && r.lo == 0))
      offsets.push_back(fmt::format("{} * {}", val(idx), stride_of(p, names_param_.at(op.param), static_cast<int>(d))));
    if (!provably_inside(idx, 1, p.static_shape[d]))
      oks.push_back(fmt::format("tj::dev::in_range({}, {})", val(idx), dim_limit(op.param, static_cast<int>(d))));
  }
  return {offsets.empty() ? "0" : fmt::format("{}", fmt::join(offsets, " + ")),
          oks.empty() ? "true" : fmt::format("{}", fmt::join(oks, " && "))};
}

bool Emitter::staging_fits(int64_t stage) const {
  // Only where the block still fits, and (knob value 1) as many blocks per SM fit as without it,
  // on the target's SMs and on Hopper's, the largest that run sm_80 / sm_89 code (mma.sync's
  // attention runs two blocks per SM there). (Knob wg_programs: each slot has its own scratch and
  // staging.)
  auto block_bytes = [&](int64_t stage) {
    const int64_t per_slot = (smem_ + 15) / 16 * 16 + std::max(stage_bytes_, stage);
    return 1024 + mma_.smem_bytes + slots_ * per_slot;
  };
  const int64_t without = block_bytes(0), with = block_bytes(stage);
  const int64_t block_threads = tile_threads() + (mma_.producer_warp ? 128 : 0);
  // (A block with a producer warpgroup takes every register of its SM: setmaxnreg shares them out.)
  auto blocks = [&](int64_t per_sm, int64_t bytes) {
    return std::min({per_sm / (bytes + 1024), target_.max_threads_per_sm() / std::max<int64_t>(1, block_threads),
                     mma_.producer_warp ? int64_t{1} : kMax});
  };
  const int64_t hopper_sm = codegen::Target::parse("sm_90a").smem_per_sm();
  return with <= target_.max_smem_per_block() &&
         (knobs::stage_stores.of(cfg_) == 2 || (blocks(target_.smem_per_sm(), with) == blocks(target_.smem_per_sm(), without) &&
                                                blocks(hopper_sm, with) == blocks(hopper_sm, without)));
}

void Emitter::emit_memory(const Op& op) {
  const ir::Param& p = f_.params.at(op.param);
  const std::string& T = names_param_.at(op.param);
  const bool is_store = ir::is_store(op.kind);
  const bool add = op.kind == OpKind::store_add;   // atomic, element by element
  struct TileDim {
    int tensor_dim;
    int start;
    int64_t extent;
  };
  std::vector<TileDim> tile_dims;
  for (size_t d = 0; d < op.indices.size(); ++d) {
    if (op.indices[d].kind == ir::Index::Kind::scalar) continue;
    const int64_t extent = op.indices[d].kind == ir::Index::Kind::block ? cfg_.block(f_, op.indices[d].block_id) : p.static_shape[d];
    tile_dims.push_back({static_cast<int>(d), op.operands[d], extent});
  }
  auto [offset, ok] = scalar_index_terms(op, [&](int v) { return ref(v); });
  const std::string E = dtag(p.dtype);

  if (tile_dims.empty()) {
    if (is_store) {
      int v = op.operands.at(op.indices.size());
      if (auto it = store_cast_.find(&op); it != store_cast_.end()) v = it->second;
      if (op.ival == 1) ok = fmt::format("{} && {}", ok, ref(op.operands.at(op.indices.size() + 1)));   // the mask
      line(fmt::format("tj::dev::{}<{}>({}.data, {}, {}, {});", add ? "store_add_scalar" : "store_scalar", E, T, offset, ok, ref(v)),
           &op.loc);
    } else {
      define(op.result, fmt::format("tj::dev::load_scalar<{}>({}.data, {}, {})", E, T, offset, ok), op.loc);
    }
    return;
  }

  // The tile's layout; a scalar stored into a slice is first broadcast to the slice.
  Layout L;
  std::string value;
  bool swapped = false;   // a folded transpose: tile dim t of the store is the source's dim 1 - t
  if (is_store) {
    int v = op.operands.at(op.indices.size());
    if (auto it = store_cast_.find(&op); it != store_cast_.end()) v = it->second;
    if (store_folds_transpose(op, op.indices.size()) && folded_.count(v)) {
      v = def_[v]->operands[0];
      swapped = true;
    }
    L = plan_.of(v);
    value = ref(v);
    if (L.is_scalar()) {
      L = tile_dims.size() == 2 ? Layout::blocked2(plan_.arr2, tile_dims[0].extent, tile_dims[1].extent)
                                : Layout::col_slice(plan_.arr1, tile_dims[0].extent);
      check_slots(L, fmt::format("{} slice of '{}'", name(p.dtype), p.name), op.loc);
      value = fmt::format("tj::dev::full<{}>({})", alias(L), value);
    }
  } else {
    L = plan_.of(op.result);
  }
  std::string spans[2] = {"{0, 0, 1}", "{0, 0, 1}"};
  bool checks[2] = {false, false};
  for (size_t t = 0; t < tile_dims.size(); ++t) {
    const TileDim& td = tile_dims[t];
    const int axis = L.axis_of_dim(static_cast<int>(swapped ? 1 - t : t));
    const int64_t dim = p.static_shape[td.tensor_dim];
    spans[axis] = fmt::format("{{{}, {}, {}}}", ref(td.start), stride_of(p, T, td.tensor_dim), dim_limit(op.param, td.tensor_dim));
    checks[axis] = !provably_inside(td.start, td.extent, dim);
  }
  if (is_store && op.ival == 1) {
    // A masked store: the mask in the value's layout, element by element.
    const int mask = op.operands.at(op.indices.size() + 1);
    const std::string m = plan_.of(mask).is_scalar() ? fmt::format("tj::dev::full<{}>({})", alias(L), ref(mask))
                                                     : operand(mask, L, op.loc);
    line(fmt::format("tj::dev::{}<{}, {}, {}, {}>({}.data, {}, {}, {}, {}, {}, {});", add ? "store_add_where" : "store_where", E,
                     alias(L), checks[0], checks[1], T, offset, ok, spans[0], spans[1], value, m),
         &op.loc);
  } else if (add) {
    // An f32 accumulator tile whose rows or columns are the unit-stride dim (compiled in) is added
    // in 16-byte vector reductions through shared memory on sm_90 on (knob stage_stores, as the
    // stores), each warp staging its own part in a region past the scratch.
    const int64_t mode = knobs::stage_stores.of(cfg_);
    const bool two_dims = L.is_mma() && !L.columns_by_parity() && tile_dims.size() == 2 && L.extent_r > 1 && L.extent_c > 1;
    auto unit_axis = [&](int axis) {   // the tile dim on layout axis `axis` has a compiled-in stride 1
      for (size_t t = 0; t < tile_dims.size(); ++t)
        if (L.axis_of_dim(static_cast<int>(swapped ? 1 - t : t)) == axis && p.static_stride(tile_dims[t].tensor_dim) == 1) return true;
      return false;
    };
    const int64_t warps_r = two_dims ? L.arr.warps_r : 1, warps_c = two_dims ? L.arr.warps_c : 1;
    const bool rows_unit = two_dims && unit_axis(0), cols_unit = two_dims && !rows_unit && unit_axis(1);
    const int64_t line_len = rows_unit ? L.extent_r / warps_r : L.extent_c / warps_c;
    const int64_t stage = rows_unit ? L.extent_c * (L.extent_r + warps_r * 4) * 4 : L.extent_r * (L.extent_c + warps_c * 4) * 4;
    if (mode != 0 && mode != 3 && p.dtype == DType::f32 && target_.sm() >= 90 && (rows_unit || cols_unit) && line_len % 4 == 0 &&
        staging_fits(stage)) {
      stage_bytes_ = std::max(stage_bytes_, stage);
      line(fmt::format("tj::dev::store_add_staged<{}, {}, {}, {}>({}.data, {}, {}, {}, {}, {}, tj_smem + tj_stage_at);   // atomic, "
                       "16-byte vector reductions through shared memory",
                       alias(L), checks[0], checks[1], rows_unit, T, offset, ok, spans[0], spans[1], value),
           &op.loc);
      return;
    }
    line(fmt::format("tj::dev::store_add<{}, {}, {}, {}>({}.data, {}, {}, {}, {}, {});   // atomic, element by element", E,
                     alias(L), checks[0], checks[1], T, offset, ok, spans[0], spans[1], value),
         &op.loc);
  } else if (is_store) {
    // A tile in the accumulator layout whose rows are contiguous in memory (stride 1 compiled
    // in) leaves through shared memory in 16-byte row chunks (knob stage_stores); each warp stages
    // its own rows and columns (tj::dev::StoreStage) in a region past the scratch.
    const int elem = size_bytes(p.dtype), chunk = 16 / std::max(1, elem);
    const int64_t warps_c = L.is_mma() ? L.arr.warps_c : 1;
    const int64_t stage = L.extent_r * (L.extent_c + warps_c * chunk) * elem;
    const int64_t mode = knobs::stage_stores.of(cfg_);
    const bool rows_contiguous = !swapped && L.is_mma() && !L.columns_by_parity() && tile_dims.size() == 2 && L.extent_r > 1 && L.extent_c > 1 &&
                                 L.axis_of_dim(1) == 1 && p.static_stride(tile_dims[1].tensor_dim) == 1;
    const bool staged = mode != 0 && mode != 3 && rows_contiguous && 16 % elem == 0 && (L.extent_c / warps_c) % chunk == 0 &&
                        staging_fits(stage);
    // Not staged (no room, or knob value 3): 16-bit tiles whose warps hold whole groups of 4
    // octets leave in 16-byte row pieces after a transpose across each quad (no shared memory).
    if (!staged && mode != 0 && rows_contiguous && elem == 2 && (L.extent_c / warps_c) % 32 == 0) {
      line(fmt::format("tj::dev::store_quads<{}, {}, {}, {}>({}.data, {}, {}, {}, {}, {});   // 16-byte row pieces, transposed "
                       "across quads",
                       E, alias(L), checks[0], checks[1], T, offset, ok, spans[0], spans[1], value),
           &op.loc);
      return;
    }
    if (staged) {
      stage_bytes_ = std::max(stage_bytes_, stage);
      line(fmt::format("tj::dev::store_staged<{}, {}, {}, {}>({}.data, {}, {}, {}, {}, {}, tj_smem + tj_stage_at);   // through "
                       "shared memory, 16-byte row chunks",
                       E, alias(L), checks[0], checks[1], T, offset, ok, spans[0], spans[1], value),
           &op.loc);
      return;
    }
    line(fmt::format("tj::dev::store<{}, {}, {}, {}>({}.data, {}, {}, {}, {}, {});", E, alias(L), checks[0], checks[1], T,
                     offset, ok, spans[0], spans[1], value),
         &op.loc);
  } else {
    const std::string expr = fmt::format("tj::dev::load<{}, {}, {}, {}>({}.data, {}, {}, {}, {})", E, alias(L), checks[0],
                                         checks[1], T, offset, ok, spans[0], spans[1]);
    const bool read_only = p.kind == ir::ParamKind::tensor_in;
    if (auto it = loaded_.find(expr); read_only && it != loaded_.end()) {
      names_[op.result] = it->second.name;
      line(fmt::format("// the same tile of '{}' as {}: loaded once", p.name, it->second.name), &op.loc);
      return;
    }
    const std::string n = define(op.result, expr, op.loc);
    if (read_only) loaded_[expr] = LoadedTile{n, indent_};
  }
}

void Emitter::emit_elementwise(const Op& op) {
  const TileType& rt = f_.type(op.result);
  const Layout& L = plan_.of(op.result);
  if (op.kind == OpKind::full) {
    std::string value = literal(op.fval, op.ival, rt.dtype);
    define(op.result, L.is_scalar() ? value : fmt::format("tj::dev::full<{}>({})", alias(L), value), op.loc);
    return;
  }
  if (op.kind == OpKind::arange) {
    define(op.result, fmt::format("tj::dev::arange<{}, {}>({})", alias(L), L.axis_of_dim(0), ref(op.operands[0])), op.loc);
    return;
  }
  if (auto it = one_plus_tanh_.find(op.result); it != one_plus_tanh_.end()) {
    const int y = it->second;
    if (L.is_scalar()) define(op.result, fmt::format("tj::dev::one_plus_tanh({})", ref(y)), op.loc);
    else define_mapped(op, L, "[]", {"float a"}, "tj::dev::one_plus_tanh(a)", {operand(y, L, op.loc)});
    return;
  }
  static const char* const kParam[] = {"a", "b", "c"};
  std::vector<std::string> params, args, vars;
  for (size_t i = 0; i < op.operands.size(); ++i) {
    int v = op.operands[i];
    const bool scalar = plan_.of(v).is_scalar();
    args.push_back(scalar || L.is_scalar() ? ref(v) : operand(v, L, op.loc));
    params.push_back(fmt::format("{} {}", reg_type(f_.type(v).dtype), kParam[i]));
    vars.push_back(L.is_scalar() ? ref(v) : kParam[i]);
  }
  std::string expr;
  switch (op.kind) {
    case OpKind::unary: expr = unary_expr(op.unary, rt.dtype, vars[0]); break;
    case OpKind::binary: expr = binary_expr(op.binary, f_.type(op.operands[0]).dtype, rt.dtype, vars[0], vars[1]); break;
    case OpKind::where: expr = fmt::format("{} ? {} : {}", vars[0], vars[1], vars[2]); break;
    case OpKind::cast: expr = cast_expr(f_.type(op.operands[0]).dtype, rt.dtype, vars[0]); break;
    default: break;
  }
  // A mask made of index comparisons (causal attention's m.index().col() >= n.index().row()) holds
  // on the whole tile in most iterations: there the where is a copy, decided once per tile by
  // interval arithmetic on the indices.
  if (op.kind == OpKind::where && !L.is_scalar()) {
    if (auto whole = uniform_truth(op.operands[0])) {
      const std::string n = fmt::format("v{}", op.result), w = n + "_whole";
      line(fmt::format("const bool {} = {};   // the mask holds on the whole tile", w, whole->first), &op.loc);
      line(fmt::format("[[maybe_unused]] {} {};", tile_type(rt.dtype, L), n), &op.loc);   // unused when pushed through
      line(fmt::format("if ({}) {} = {};", w, n,
                       plan_.of(op.operands[1]).is_scalar() ? fmt::format("tj::dev::full<{}>({})", alias(L), args[1]) : args[1]),
           &op.loc);
      line(fmt::format("else {} = tj::dev::map<{}>([]({}) {{ return {}; }}, {});", n, alias(L), fmt::join(params, ", "), expr,
                       fmt::join(args, ", ")),
           &op.loc);
      names_[op.result] = n;
      masked_[op.result] = MaskedValue{w, args[0], args[1], args[2], n, plan_.of(op.operands[2]).is_scalar(), ""};
      return;
    }
  }
  if ((op.kind == OpKind::unary || op.kind == OpKind::binary || op.kind == OpKind::cast) && !L.is_scalar() &&
      push_through_mask(op, L, params, expr, args))
    return;
  // A large f32 tile times a broadcast vector (attention's acc * alpha.col()): the factors are all
  // 1 in most iterations (no row maximum moved), and a warp that holds only ones skips the
  // product (lazy rescaling).
  if (op.kind == OpKind::binary && op.binary == BinaryFn::mul && rt.dtype == DType::f32 && !L.is_scalar() && L.slots() >= 16) {
    for (int side = 0; side < 2; ++side) {
      const Op* b = def_[op.operands[side]];
      if (!b || b->kind != OpKind::broadcast) continue;
      const int factor = b->operands[0];
      const Layout& fl = plan_.of(factor);
      if (fl.is_scalar() || f_.type(factor).dtype != DType::f32 || fl.slots() > 4 ||
          f_.type(op.operands[1 - side]).dtype != DType::f32)
        continue;
      const std::string n = fmt::format("v{}", op.result);
      line(fmt::format("{} {} = {};", tile_type(rt.dtype, L), n, args[1 - side]), &op.loc);
      line(fmt::format("if (tj::dev::any_not_one({})) {} = tj::dev::map<{}>([]({}) {{ return {}; }}, {});   // x * 1 == x",
                       ref(factor), n, alias(L), fmt::join(params, ", "), expr, fmt::join(args, ", ")),
           &op.loc);
      names_[op.result] = n;
      return;
    }
  }
  // f32 division: tj::dev::divide (IEEE division bit for bit, without CUDA's branch per element;
  // a broadcast divisor's reciprocal once per row).
  if (op.kind == OpKind::binary && op.binary == BinaryFn::div && rt.dtype == DType::f32 && !L.is_scalar() &&
      f_.type(op.operands[0]).dtype == DType::f32 && f_.type(op.operands[1]).dtype == DType::f32) {
    auto tile = [&](int i) {
      return plan_.of(op.operands[i]).is_scalar() ? fmt::format("tj::dev::full<{}>({})", alias(L), args[i]) : args[i];
    };
    define(op.result, fmt::format("tj::dev::divide({}, {})", tile(0), tile(1)), op.loc);
    return;
  }
  define_mapped(op, L, "[]", params, expr, args);
}

bool Emitter::push_through_mask(const Op& op, const Layout& L, const std::vector<std::string>& params, const std::string& expr,
                                const std::vector<std::string>& args) {
  const MaskedValue* mv = nullptr;
  std::vector<std::string> a = args, b = args;
  std::vector<const MaskedValue*> from(op.operands.size(), nullptr);   // the masked operands
  for (size_t i = 0; i < op.operands.size(); ++i) {
    const int v = op.operands[i];
    auto it = masked_.find(v);
    if (it == masked_.end() || it->second.name != ref(v) || args[i] != ref(v)) continue;
    if (mv && (mv->whole != it->second.whole || mv->mask != it->second.mask)) return false;
    mv = from[i] = &it->second;
    a[i] = mv->a;
    b[i] = mv->b;
  }
  if (!mv) return false;
  const MaskedValue m = *mv;
  const std::string n = fmt::format("v{}", op.result), T = reg_type(f_.type(op.result).dtype);
  auto mapped = [&](const std::vector<std::string>& xs) {
    return fmt::format("tj::dev::map<{}>([]({}) {{ return {}; }}, {})", alias(L), fmt::join(params, ", "), expr, fmt::join(xs, ", "));
  };
  const std::string type = tile_type(f_.type(op.result).dtype, L);
  // The failing arm from scalars and vectors that the tile broadcasts alone (attention's
  // exp2(-inf - m.col()): m a row's value) is computed once per vector element, not per tile
  // element (2 exp2s a thread instead of 64), and broadcast where the select reads it.
  std::string vec;          // the vector layout's alias ("" while every operand is a scalar)
  bool small = true;
  std::vector<std::string> bv = b;
  for (size_t i = 0; i < op.operands.size() && small; ++i) {
    const int v = op.operands[i];
    if (const MaskedValue* f = from[i]) {
      if (f->b_scalar) continue;
      if (f->b_vector.empty() || (!vec.empty() && vec != f->b_vector)) small = false;
      else vec = f->b_vector;
      continue;
    }
    if (plan_.of(v).is_scalar()) continue;
    const Op* d = def_[v];
    if (d && d->kind == OpKind::broadcast && !plan_.of(d->operands[0]).is_scalar()) {
      const std::string a = alias(plan_.of(d->operands[0]));
      if (vec.empty() || vec == a) {
        vec = a;
        bv[i] = ref(d->operands[0]);
        continue;
      }
    }
    small = false;
  }
  if (!small) {   // a tile in the value's layout: vector arms broadcast to it
    vec.clear();
    for (size_t i = 0; i < op.operands.size(); ++i)
      if (from[i] && !from[i]->b_vector.empty()) b[i] = fmt::format("tj::dev::broadcast<{}>({})", alias(L), b[i]);
  }
  const bool b_scalar = small && vec.empty();
  std::string b_decl, b_value, b_read = n + "_b";
  if (b_scalar) {
    b_decl = fmt::format("{} {}_b = {{}};", T, n);
    b_value = fmt::format("[]({}) {{ return {}; }}({})", fmt::join(params, ", "), expr, fmt::join(bv, ", "));
  } else if (small) {
    b_decl = fmt::format("tj::dev::Tile<{}, {}> {}_b;", T, vec, n);
    b_value = fmt::format("tj::dev::map<{}>([]({}) {{ return {}; }}, {})", vec, fmt::join(params, ", "), expr, fmt::join(bv, ", "));
    b_read = fmt::format("tj::dev::broadcast<{}>({}_b)", alias(L), n);
  } else {
    b_decl = fmt::format("{} {}_b;", type, n);
    b_value = mapped(b);
  }
  // The failing arm only on tiles the mask cuts (its ops, an exp2 per element, would otherwise
  // run on every tile): it is read only there, by this op's select and the next pushed-through
  // op's failing arm, under the same `whole`.
  line(fmt::format("const {} {}_a = {};   // through the mask: its arm where it holds", type, n, mapped(a)), &op.loc);
  line(fmt::format("[[maybe_unused]] {}", b_decl), &op.loc);
  line(fmt::format("[[maybe_unused]] {} {};", type, n), &op.loc);
  line(fmt::format("if ({}) {} = {}_a;", m.whole, n, n), &op.loc);
  line("else {   // and where it fails", &op.loc);
  line(fmt::format("  {}_b = {};", n, b_value), &op.loc);
  line(fmt::format("  {} = tj::dev::map<{}>([](bool c, {} a, {} b) {{ return c ? a : b; }}, {}, {}_a, {});", n, alias(L), T, T,
                   m.mask, n, b_read),
       &op.loc);
  line("}", &op.loc);
  names_[op.result] = n;
  masked_[op.result] = MaskedValue{m.whole, m.mask, n + "_a", n + "_b", n, b_scalar, small ? vec : ""};
  return true;
}

std::optional<std::pair<std::string, std::string>> Emitter::index_interval(int v) const {
  const TileType& t = f_.type(v);
  if (!is_int(t.dtype)) return std::nullopt;
  if (t.is_scalar()) return std::pair{fmt::format("(long long)({})", ref(v)), fmt::format("(long long)({})", ref(v))};
  const Op* d = def_[v];
  if (!d) return std::nullopt;
  switch (d->kind) {
    case OpKind::arange: {
      const std::string start = fmt::format("(long long)({})", ref(d->operands[0]));
      return std::pair{start, fmt::format("({} + {})", start, cfg_.block(f_, d->block_id) - 1)};
    }
    case OpKind::expand_dims:
    case OpKind::broadcast:
      return index_interval(d->operands[0]);
    case OpKind::cast:
      return is_int(f_.type(d->operands[0]).dtype) ? index_interval(d->operands[0]) : std::nullopt;
    case OpKind::binary: {
      auto a = index_interval(d->operands[0]), b = index_interval(d->operands[1]);
      if (!a || !b) return std::nullopt;
      if (d->binary == BinaryFn::add)
        return std::pair{fmt::format("({} + {})", a->first, b->first), fmt::format("({} + {})", a->second, b->second)};
      if (d->binary == BinaryFn::sub)
        return std::pair{fmt::format("({} - {})", a->first, b->second), fmt::format("({} - {})", a->second, b->first)};
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

std::optional<std::pair<std::string, std::string>> Emitter::uniform_truth(int v) const {
  const Op* d = def_[v];
  if (!d || f_.type(v).dtype != DType::i1 || f_.type(v).is_scalar()) return std::nullopt;
  if (d->kind == OpKind::broadcast || d->kind == OpKind::expand_dims) return uniform_truth(d->operands[0]);
  if (d->kind == OpKind::unary && d->unary == UnaryFn::logical_not) {
    auto x = uniform_truth(d->operands[0]);
    if (!x) return std::nullopt;
    return std::pair{x->second, x->first};
  }
  if (d->kind != OpKind::binary) return std::nullopt;
  if (d->binary == BinaryFn::logical_and || d->binary == BinaryFn::logical_or) {
    auto a = uniform_truth(d->operands[0]), b = uniform_truth(d->operands[1]);
    if (!a || !b) return std::nullopt;
    const bool conj = d->binary == BinaryFn::logical_and;
    return std::pair{fmt::format("({} {} {})", a->first, conj ? "&&" : "||", b->first),
                     fmt::format("({} {} {})", a->second, conj ? "||" : "&&", b->second)};
  }
  auto x = index_interval(d->operands[0]), y = index_interval(d->operands[1]);
  if (!x || !y) return std::nullopt;
  // (holds everywhere, fails everywhere)
  switch (d->binary) {
    case BinaryFn::ge: return std::pair{fmt::format("({} >= {})", x->first, y->second), fmt::format("({} < {})", x->second, y->first)};
    case BinaryFn::gt: return std::pair{fmt::format("({} > {})", x->first, y->second), fmt::format("({} <= {})", x->second, y->first)};
    case BinaryFn::le: return std::pair{fmt::format("({} <= {})", x->second, y->first), fmt::format("({} > {})", x->first, y->second)};
    case BinaryFn::lt: return std::pair{fmt::format("({} < {})", x->second, y->first), fmt::format("({} >= {})", x->first, y->second)};
    default: return std::nullopt;
  }
}

void Emitter::define_mapped(const Op& op, const Layout& L, const char* capture, const std::vector<std::string>& params,
                            const std::string& expr, const std::vector<std::string>& args) {
  if (L.is_scalar()) {
    define(op.result, expr, op.loc);
    return;
  }
  define(op.result,
         fmt::format("tj::dev::map<{}>({}({}) {{ return {}; }}, {})", alias(L), capture, fmt::join(params, ", "), expr,
                     fmt::join(args, ", ")),
         op.loc);
}

// One element per index position: tj::dev::gather_at bounds-checks every index (0 outside).
void Emitter::emit_gather(const Op& op) {
  const TileType& rt = f_.type(op.result);
  const Layout& L = plan_.of(op.result);
  const std::string tensor = names_param_.at(op.param);
  const std::string elem = dtag(rt.dtype);
  std::vector<std::string> params, args, vars;
  for (size_t i = 0; i < op.operands.size(); ++i) {
    const int v = op.operands[i];
    const bool scalar = plan_.of(v).is_scalar();
    args.push_back(scalar || L.is_scalar() ? ref(v) : operand(v, L, op.loc));
    params.push_back(fmt::format("long long i{}", i));
    vars.push_back(L.is_scalar() ? fmt::format("(long long)({})", ref(v)) : fmt::format("i{}", i));
  }
  const std::string call = fmt::format("tj::dev::gather_at<{}>({}, {})", elem, tensor, fmt::join(vars, ", "));
  define_mapped(op, L, "[=]", params, call, args);
}

void Emitter::emit_shape(const Op& op) {
  const int src = op.operands[0];
  const Layout& L = plan_.of(op.result);
  const Layout& S = plan_.of(src);
  const DType t = f_.type(src).dtype;
  if (op.kind == OpKind::transpose) {
    if (folded_.count(op.result)) return;   // staged transposed by the dots, or stored so, that use it
    const int64_t pitch = S.extent_c | 1;
    need_smem(S.extent_r * pitch * reg_bytes(t), fmt::format("the transpose at {}", op.loc.str()));
    define(op.result, fmt::format("tj::dev::transpose<{}, {}>({}, tj_smem)", alias(L), pitch, ref(src)), op.loc);
    return;
  }
  if (S.is_scalar()) {
    define(op.result, fmt::format("tj::dev::full<{}>({})", alias(L), ref(src)), op.loc);
    return;
  }
  if (op.kind == OpKind::expand_dims) {
    define(op.result, operand(src, L, op.loc), op.loc);
    return;
  }
  // broadcast: bring the source onto the result's arrangement with its extents on the
  // matching axes (numpy alignment: trailing dims), then replicate locally.
  if (S.replicated()) {
    define(op.result, fmt::format("tj::dev::broadcast<{}>({})", alias(L), ref(src)), op.loc);
    return;
  }
  auto s = shape(src);
  const int rr = f_.type(op.result).rank(), rs = static_cast<int>(s.size());
  Layout W = L;
  W.rank = rs;
  W.extent_r = W.extent_c = 1;
  for (int i = 0; i < rs; ++i) {
    int axis = L.axis_of_dim(i + rr - rs);
    (axis == 0 ? W.extent_r : W.extent_c) = s[i];
    if (rs == 1) W.dim0_on_cols = axis == 1;
  }
  std::string x = operand(src, W, op.loc);
  define(op.result, W.same_registers(L) ? x : fmt::format("tj::dev::broadcast<{}>({})", alias(L), x), op.loc);
}

// max(x * s) over a tile x times an f32 scalar s is s * max(x) for a finite s > 0 (rounding is
// monotone, so the two are equal bit for bit) and s * min(x) for a finite s < 0; min alike. The
// scaled tile then feeds only its other uses (softmax's x * s - m, which becomes one FFMA). Other
// s (0, infinities, NaN) reduce x * s recomputed (tj::dev::times: separately rounded products,
// the same values). The rule looks through a masked where(mask, x * s, K) whose K is the
// reduction's identity (-inf for max): on a tile where the mask holds everywhere the where is
// x * s; elsewhere (and on a range's last, partial tile) the reduction runs on the masked product,
// recomputed, so that the kernel's own x * s keeps its one fusable use. Returns the reduction's
// code, or nothing where the rule does not apply.
std::string Emitter::reduce_call(const Op& op, const char* fn, int axis, DType t, const std::string& tile, bool masked) const {
  return fmt::format("tj::dev::reduce<tj::dev::{}, {}, {}, {}>({}, {}, {}, tj_smem)", fn, axis, dtag(t), masked, tile,
                     masked ? ref(op.operands[1]) : "0", masked ? ref(op.operands[2]) : "0");
}

std::optional<std::string> Emitter::scaled_extremum(const Op& op, bool range_masked) {
  if (op.reduce == ir::ReduceFn::sum) return std::nullopt;
  const int x = op.operands[0];
  const bool is_max = op.reduce == ir::ReduceFn::max;
  int prod = x;
  const MaskedValue* mv = nullptr;
  if (auto it = masked_.find(x); it != masked_.end() && it->second.name == ref(x) && def_[x] && def_[x]->kind == OpKind::where) {
    const Op* k = def_[def_[x]->operands[2]];
    if (!k || k->kind != OpKind::const_value || k->fval != (is_max ? -1.0 : 1.0) * std::numeric_limits<double>::infinity())
      return std::nullopt;
    prod = def_[x]->operands[1];
    mv = &it->second;
  }
  const Op* m = def_[prod];
  if (!m || m->kind != OpKind::binary || m->binary != BinaryFn::mul || f_.type(prod).dtype != DType::f32) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const int s = m->operands[side], t = m->operands[1 - side];
    if (!plan_.of(s).is_scalar() || f_.type(s).dtype != DType::f32 || f_.type(t).dtype != DType::f32 ||
        !plan_.of(t).same_registers(plan_.of(x)) || !plan_.of(prod).same_registers(plan_.of(x)))
      continue;
    const int axis = plan_.of(x).axis_of_dim(op.axis);
    const std::string sv = ref(s);
    auto red = [&](const char* fn, const std::string& tile, bool masked) {
      return reduce_call(op, fn, axis, DType::f32, tile, masked);
    };
    const char* same = is_max ? "op_max" : "op_min";
    const char* other = is_max ? "op_min" : "op_max";
    // Two float compares a side (NaN and the infinities fail both): a bool of finite_nonzero()
    // was made in a byte register and tested again at every iteration of the loop (SASS).
    const std::string fast =
        fmt::format("(tj::dev::finite_positive({0}) ? tj::dev::times({1}, {0}) : tj::dev::finite_positive(-({0})) ? "
                    "tj::dev::times({2}, {0}) : {3})",
                    sv, red(same, ref(t), false), red(other, ref(t), false),
                    red(same, fmt::format("tj::dev::times({}, {})", ref(t), sv), false));
    std::vector<std::string> conds;
    if (range_masked)
      conds.push_back(fmt::format("{} + {} <= {}", ref(op.operands[1]), shape(x).at(op.axis), ref(op.operands[2])));
    std::string product = fmt::format("tj::dev::times({}, {})", ref(t), sv);
    if (mv) {
      conds.push_back(mv->whole);
      product = fmt::format("tj::dev::map<{}>([](bool c, float v) {{ return c ? v : {}tj::dev::inf(); }}, {}, {})",
                            alias(plan_.of(x)), is_max ? "-" : "", mv->mask, product);
    }
    if (conds.empty()) return fast;
    return fmt::format("(({}) ? {} : {})", fmt::join(conds, " && "), fast, red(same, product, range_masked));
  }
  return std::nullopt;
}

void Emitter::emit_reduce(const Op& op) {
  const int x = op.operands[0];
  const Layout& S = plan_.of(x);
  const DType t = f_.type(x).dtype;
  const int axis = S.axis_of_dim(op.axis);
  const int64_t extent = shape(x).at(op.axis);
  const bool masked = op.operands.size() == 3 && !provably_full(op.operands[1], op.operands[2], extent);
  const char* fn = op.reduce == ir::ReduceFn::sum ? "op_sum" : op.reduce == ir::ReduceFn::max ? "op_max" : "op_min";
  // reduce<> works in the register type: f32 for floating point, the dtype for integers.
  const DType acc = is_int(t) ? t : DType::f32;
  const int bytes = reg_bytes(acc);
  if (axis == 1 && S.arr.warps_c > 1)
    need_smem(int64_t(S.slots_r()) * S.arr.rows() * S.arr.warps_c * bytes, fmt::format("the reduction at {}", op.loc.str()));
  if (axis == 0 && S.arr.warps_r > 1)
    // one value per raw column position (tile.cuh: raw_c < reps * cover) per warp row
    need_smem(int64_t(S.reps_c()) * S.arr.col_cover() * S.arr.warps_r * bytes, fmt::format("the reduction at {}", op.loc.str()));
  auto call_of = [&](bool m) { return reduce_call(op, fn, axis, t, ref(x), m); };
  // Only a loop's last tile can run past its end: the others take the unmasked reduction, decided
  // once per tile (the per-element test would sit in a softmax's hot loop).
  const std::optional<std::string> scaled = scaled_extremum(op, masked);
  const std::string call = scaled ? *scaled
                           : masked ? fmt::format("(({} + {} <= {}) ? {} : {})", ref(op.operands[1]), extent, ref(op.operands[2]),
                                                  call_of(false), call_of(true))
                                    : call_of(false);
  const Layout& R = plan_.of(op.result);
  if (R.is_scalar()) {
    define(op.result, call + ".v[0]", op.loc);
    return;
  }
  Layout N = S;   // what reduce<> returns: the reduced axis becomes extent 1
  N.rank = 1;
  (axis == 0 ? N.extent_r : N.extent_c) = 1;
  N.dim0_on_cols = axis == 0;
  if (N.same_registers(R)) {
    define(op.result, call, op.loc);
    return;
  }
  std::string tmp = fresh(op.result, "r");
  line(fmt::format("const {} {} = {};", tile_type(acc, N), tmp, call), &op.loc);
  define(op.result, convert(tmp, N, R, acc, op.loc, op.result), op.loc);
}

void Emitter::emit_dot(const Op& op) {
  int a = op.operands[0], b = op.operands[1];
  const bool ta = folded_.count(a) > 0, tb = folded_.count(b) > 0;
  if (ta) a = def_[a]->operands[0];
  if (tb) b = def_[b]->operands[0];
  const bool has_acc = op.ival == 1;
  const size_t kpos = has_acc ? 3 : 2;
  const bool has_krange = op.operands.size() >= kpos + 2;
  const Layout& L = plan_.of(op.result);
  const Layout& A = plan_.of(a);
  const int64_t M = L.extent_r, N = L.extent_c, K = ta ? A.extent_r : A.extent_c;
  const bool kmask = has_krange && !provably_full(op.operands[kpos], op.operands[kpos + 1], K);
  need_smem((M * (K | 1) + K * N) * 4,
            fmt::format("the dot at {} (stages its {}x{} and {}x{} operands as f32)", op.loc.str(), M, K, K, N));
  std::string kb = kmask ? ref(op.operands[kpos]) : "0", ke = kmask ? ref(op.operands[kpos + 1]) : "0";
  std::string args = fmt::format("{}, {}", ref(a), ref(b));
  if (has_acc) args += ", " + operand(op.operands[2], L, op.loc);
  define(op.result,
         fmt::format("tj::dev::dot<{}, {}, {}, {}>({}, {}, {}, tj_smem)", alias(L), ta, tb, kmask, args, kb, ke), op.loc);
}

void Emitter::emit_var(const Op& op) {
  if (op.kind == OpKind::var_decl) {
    const int v = op.result;
    const Layout& L = plan_.of(v);
    check_tile(v, L, op.loc);
    names_[v] = fmt::format("var{}", v);
    std::string init = operand(op.operands[0], L, op.loc);
    std::string type = L.is_scalar() ? reg_type(f_.type(v).dtype) : tile_type(f_.type(v).dtype, L);
    line(fmt::format("{} {} = {};", type, names_[v], init), &op.loc);
  } else if (op.kind == OpKind::var_read) {
    if (async_.alias_reads.count(&op)) {   // the accumulator of an in-place tensor-core dot: no copy
      names_[op.result] = ref(op.operands[0]);
      return;
    }
    define(op.result, operand(op.operands[0], plan_.of(op.result), op.loc), op.loc);
  } else {
    const int var = op.operands[0];
    const Op* d = def_[op.operands[1]];
    if (d && async_.in_place.count(d)) return;   // the dot accumulated into the variable itself
    line(fmt::format("{} = {};", ref(var), operand(op.operands[1], plan_.of(var), op.loc)), &op.loc);
  }
}

// ---- names -------------------------------------------------------------------------------------------



void Emitter::emit_header(std::string& out, const std::string& entry) {
  out += fmt::format("// tilejit: kernel '{}' for {}, generated by the CUDA emitter (codegen/cuda_emitter.cpp){}.\n", f_.name,
                     target_.arch,
                     mma_.on_tensor_cores()
                         ? fmt::format(", {} dot(s) on the tensor cores ({})", mma_.dots.size(), mma_.wgmma() ? "wgmma" : "mma.sync")
                         : "");
  out += fmt::format("// config: {}\n", cfg_.to_json());
  out += fmt::format("// {} threads per block, {} bytes of dynamic shared memory{}.\n", tile_threads() + (mma_.producer_warp ? 128 : 0), smem_,
                     fast_math_ ? ", fast math" : "");
  out += "// Register tiles are tj::dev::Tile<type, layout> (codegen/device/tile.cuh); each statement ends with\n"
         "// `// @ file:line`, the DSL line of the IR op it implements.\n";
  for (const std::string& why : mma_.simt_dots) out += fmt::format("// SIMT: {}\n", why);
  if (mma_.producer_warp)
    out += fmt::format("#define TJ_TILE_THREADS {}   // the warps before the producer warpgroup hold the tiles\n", tile_threads());
  if (slots_ > 1)
    out += fmt::format("#define TJ_PROGRAM_THREADS {}   // knob wg_programs: {} programs at once, one a slot of this many threads\n",
                       plan_.threads, slots_);
  out += mma_.wgmma() ? "#include \"mma.cuh\"\n" : mma_.on_tensor_cores() ? "#include \"mma_sync.cuh\"\n" : "#include \"tile.cuh\"\n";
  if (program_order_) out += "#include \"attn_tile_order.cuh\"\n";   // knob longest_first's order
  if (stage_bytes_ > 0)
    out += fmt::format("\nconstexpr unsigned tj_stage_at = {};   // the staged stores' region in tj_smem, past the scratch\n",
                       stage_at_);
  if (pins_used_)
    out += fmt::format("constexpr unsigned tj_pin_at = {};   // knob pin_waits: a word per warp in tj_smem, written, never read\n",
                       pin_at_);
  for (const MmaDot& d : mma_.dots) {
    if (!mma_.wgmma()) break;
    // hopper_wgmma.cuh defines the common wgmma widths; others get their own.
    static const int kPredefined[] = {8, 16, 32, 64, 96, 128, 192, 256};
    if (std::find(std::begin(kPredefined), std::end(kPredefined), d.n_per_instr) == std::end(kPredefined) &&
        out.find(fmt::format("TJ_WGMMA_DEFINE({})", d.n_per_instr)) == std::string::npos)
      out += fmt::format("TJ_WGMMA_DEFINE({})\n", d.n_per_instr);
  }
  out += "\n";
  std::vector<std::string> params;
  for (size_t i = 0; i < f_.params.size(); ++i) {
    const ir::Param& p = f_.params[i];
    if (p.is_tensor()) params.push_back(fmt::format("tj::dev::TensorArg<{}> {}", p.rank(), names_param_[i]));
    else if (p.kind == ir::ParamKind::scalar_f32) params.push_back(fmt::format("float {}", names_param_[i]));
    else params.push_back(fmt::format("long long {}", names_param_[i]));
  }
  for (size_t i = 0; i < mma_.tmas.size(); ++i)
    params.push_back(fmt::format("const __grid_constant__ tj::dev::TmaDescriptor tj_tma{}", i));
  if (persistent_) params.push_back("long long tj_programs");   // the ABI of persistent kernels (cuda_emitter.h)
  // Knob simt_min_blocks: ptxas keeps the registers low enough for that many blocks per SM
  // (__launch_bounds__'s second argument). A streaming kernel whose loads wait on DRAM may want the
  // blocks more than the registers: chunk_amax at 99 registers ran two blocks of 256 threads per SM
  // at half the DRAM bandwidth (measured on an H100; kernels/attention_fp8_forward.cpp).
  const int64_t min_blocks = knobs::simt_min_blocks.of(cfg_);
  const int64_t sm_threads = target_.max_threads_per_sm();
  if (min_blocks < 0 || min_blocks * plan_.threads > sm_threads)
    throw Error(fmt::format("kernel '{}': knob simt_min_blocks must be in [0, {}] ({} threads per block, {} per SM on "
                            "{}), got {}",
                            f_.name, sm_threads / plan_.threads, plan_.threads, sm_threads, target_.arch, min_blocks));
  // Tensor-core kernels hold large accumulators: one block per SM may take every register.
  const int64_t blocks = min_blocks > 0 ? min_blocks : mma_.on_tensor_cores() ? 1 : 0;
  const int threads = static_cast<int>(tile_threads()) + (mma_.producer_warp ? 128 : 0);
  const std::string bounds = blocks > 0 ? fmt::format("{}, {}", threads, blocks) : fmt::format("{}", threads);
  out += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{\n", bounds, entry,
                     fmt::join(params, ", "));
  if (mma_.wgmma()) {
    // The tensor-core region (rings, operand buffers, barriers) at a 1024-byte boundary, the
    // swizzle's period; the SIMT scratch after it.
    out += "  extern __shared__ __align__(1024) unsigned char tj_smem_base[];\n";
    out += "  unsigned char* const tj_tc = tj_smem_base + ((1024u - (tj::dev::smem_u32(tj_smem_base) & 1023u)) & 1023u);\n";
    if (slots_ > 1) {
      out += fmt::format("  // knob wg_programs: slot s (threads {} s ..) runs programs of its own, with a scratch of its own\n",
                         plan_.threads);
      // warp_uniform: the slot's ring uses and descriptors then stay on the uniform datapath (SASS:
      // without it each wgmma's descriptors came through R2UR from per-thread registers)
      out += fmt::format("  const int tj_slot = tj::dev::warp_uniform((int)threadIdx.x < {} ? (int)threadIdx.x / {} : 0);\n",
                         tile_threads(), plan_.threads);
      out += fmt::format("  unsigned char* const tj_smem = tj_tc + {} + tj_slot * {};\n", mma_.smem_bytes, scratch_stride_);
    } else {
      out += fmt::format("  unsigned char* const tj_smem = tj_tc + {};\n", mma_.smem_bytes);
    }
    if (mma_.warpgroups > 1)   // once: the dots' A descriptors then stay loop-invariant where A is
      out += "  const int tj_wg = tj::dev::program_warpgroup();   // this thread's warpgroup of its program's\n";
  } else if (mma_.on_tensor_cores()) {
    out += "  extern __shared__ __align__(1024) unsigned char tj_smem_base[];\n";
    out += "  unsigned char* const tj_tc = tj::dev::align_smem<1024>(tj_smem_base);   // the operand buffers\n";
    out += fmt::format("  unsigned char* const tj_smem = tj_tc + {};\n", mma_.smem_bytes);
  } else {
    out += "  extern __shared__ __align__(16) unsigned char tj_smem[];\n";
  }
  for (const auto& a : alias_lines_) out += "  " + a + "\n";
}

// The SIMT layouts split tiles over lanes and warps by halving: their blocks are powers of two
// (the accumulator layout takes any multiple of its warps' rows).
void Emitter::check_power_of_two_tiles() const {
  for (size_t v = 0; v < f_.values.size(); ++v) {
    if (!plan_.of(static_cast<int>(v)).is_distributed()) continue;
    for (const Dim& d : f_.values[v].type.shape) {
      if (!d.is_block()) continue;
      const int64_t size = cfg_.block(f_, static_cast<int>(d.value));
      if ((size & (size - 1)) != 0)
        throw Error(fmt::format("kernel '{}': block '{}' = {} sizes a tile the SIMT path holds, which takes powers of two "
                                "(target {}; tiles in the tensor cores' accumulator layout take any multiple of their warps' "
                                "rows)",
                                f_.name, f_.blocks.at(d.value).name, size, target_.arch));
    }
  }
}

GeneratedKernel Emitter::run() {
  target_.validate();
  passes::verify(f_);
  if (knobs::mma.on(cfg_)) mma_ = plan_mma(f_, cfg_, target_);
  persistent_ = knobs::persistent.on(cfg_);
  longest_first_ = knobs::longest_first.on(cfg_);
  raster_group_ = knobs::raster_group.of(cfg_);
  wg_turns_ = knobs::wg_turns.on(cfg_);
  overlap_ = knobs::overlap.on(cfg_);
  pin_waits_ = knobs::pin_waits.on(cfg_) && mma_.wgmma();
  rescale_at_end_ = knobs::overlap.of(cfg_) == 2;
  if (knobs::overlap.of(cfg_) < 0 || knobs::overlap.of(cfg_) > 2)
    throw Error(fmt::format("kernel '{}': knob overlap is 0, 1 or 2, got {}", f_.name, knobs::overlap.of(cfg_)));
  if (raster_group_ < 1 || raster_group_ > 64)
    throw Error(fmt::format("kernel '{}': knob raster_group must be in [1, 64] (1: off), got {}", f_.name, raster_group_));
  slots_ = static_cast<int>(knobs::wg_programs.of(cfg_));
  if (slots_ < 1 || slots_ > 2)
    throw Error(fmt::format("kernel '{}': knob wg_programs is 1 or 2 (programs a block runs at once), got {}", f_.name, slots_));
  if (slots_ > 1) {
    std::string why;
    if (!mma_.wgmma()) why = fmt::format("its dots are not on wgmma (target {})", target_.arch);
    else if (!mma_.producer_warp) why = "it has no producer warpgroup (knob warp_specialize 0, or no operand TMA can fill)";
    else if (wg_turns_) why = "knob wg_turns is set (the warpgroups of one program take turns)";
    else if (pin_waits_) why = "knob pin_waits is set";
    else if (std::any_of(mma_.staged.begin(), mma_.staged.end(), [](const StagedLoad& st) { return st.transposed_copy; }))
      why = "an fp8 operand is copied K-major by the producer warpgroup";
    else if (!mma_.buffers.empty())
      why = "an operand goes from registers through shared memory (a buffer each program would need)";
    else if (std::any_of(mma_.staged.begin(), mma_.staged.end(), [](const StagedLoad& st) { return !st.producer; }))
      why = "an operand is staged by the tiles' threads, not by the producer";
    if (!why.empty())
      throw Error(fmt::format("kernel '{}': knob wg_programs = {} needs wgmma dots fed by a producer warpgroup; here {}", f_.name,
                              slots_, why));
  }
  plan_ = assign_layouts(f_, cfg_, target_, &mma_);
  finish_mma_plan(mma_, [&](int v) { return plan_.of(v).is_mma(); });
  order_keys_by_parity(f_, cfg_, mma_, plan_);
  async_ = plan_async(f_, mma_);
  check_power_of_two_tiles();
  fast_math_ = knobs::fast_math.on(cfg_);
  std::set<std::string> taken;
  for (size_t i = 0; i < f_.params.size(); ++i) {
    std::string n = identifier(f_.params[i].name);
    if (reserved_name(n) || taken.count(n)) n = fmt::format("p{}_{}", i, n);
    taken.insert(n);
    names_param_.push_back(n);
  }
  analyze();
  starts_early_ = start_early_ && target_.sm() >= 90;
  if (mma_.on_tensor_cores()) emit_mma_prologue();
  emit_launch();
  if (starts_early_ && !waited_) line("tj::dev::griddep_wait();");

  const int64_t tc_bytes = mma_.on_tensor_cores() ? 1024 + mma_.smem_bytes : 0;   // with the alignment slack
  // The staged stores' region follows the scratch (tj_stage_at, in the header).
  stage_at_ = (smem_ + 15) / 16 * 16;
  if (stage_bytes_ > 0) {
    smem_ = stage_at_ + stage_bytes_;
    if (smem_what_.empty()) smem_what_ = "staged stores";
  }
  if (pins_used_) {
    pin_at_ = (smem_ + 15) / 16 * 16;
    smem_ = pin_at_ + 4 * (plan_.threads / 32);
  }
  scratch_stride_ = (smem_ + 15) / 16 * 16;   // one slot's scratch
  if (slots_ > 1) smem_ = slots_ * scratch_stride_;
  if (tc_bytes + smem_ > target_.max_smem_per_block())
    throw Error(fmt::format("kernel '{}' with config {} needs {} bytes of shared memory ({} for {}{}), more than the {} bytes "
                            "({} KB) a block can use on {}: use smaller block sizes{}",
                            f_.name, cfg_.to_json(), tc_bytes + smem_, smem_, smem_what_.empty() ? "scratch" : smem_what_,
                            tc_bytes ? fmt::format(", {} for the tensor cores' operand tiles", tc_bytes) : "",
                            target_.max_smem_per_block(), target_.max_smem_per_block() / 1024, target_.arch,
                            tc_bytes ? " or fewer stages" : ""));

  GeneratedKernel k;
  k.name = f_.name;
  k.entry = identifier(f_.name);
  if (reserved_name(k.entry)) k.entry = "tj_kernel_" + k.entry;
  k.threads = static_cast<int>(tile_threads()) + (mma_.producer_warp ? 128 : 0);
  k.programs_per_block = slots_;
  k.dynamic_smem_bytes = static_cast<size_t>(tc_bytes + (smem_ + 15) / 16 * 16);
  k.starts_early = starts_early_;
  k.persistent = persistent_;
  // A persistent SIMT kernel runs as many blocks an SM as fit (the driver's occupancy calculator,
  // at load); the tensor cores' kernels one (their shared memory takes the SM).
  k.blocks_per_sm = persistent_ && !mma_.on_tensor_cores() ? 0 : 1;
  // Knob persistent_blocks caps the persistent grid (tests make every block loop over programs).
  k.max_blocks = persistent_ ? knobs::persistent_blocks.of(cfg_) : 0;
  smem_ = static_cast<int64_t>(k.dynamic_smem_bytes);
  emit_header(k.source, k.entry);
  k.source += body_;
  k.source += "}\n";
  k.device_headers = {"tile.cuh", "fp8.cuh"};
  if (program_order_) k.device_headers.push_back("attn_tile_order.cuh");
  k.notes = mma_.simt_dots;
  if (mma_.on_tensor_cores()) k.device_headers.insert(k.device_headers.end(), {"swizzle.cuh", "frag.cuh", "mma_layout.cuh"});
  if (mma_.wgmma()) {
    k.device_headers.insert(k.device_headers.end(), {"hopper.cuh", "hopper_wgmma.cuh", "mma.cuh"});
    for (const MmaPlan::Tma& t : mma_.tmas) k.tma.push_back(TmaOperand{t.param, t.box, t.swizzle, t.element_strides});
    k.lowering = "tensor cores (wgmma)";
  } else if (mma_.on_tensor_cores()) {
    k.device_headers.push_back("mma_sync.cuh");
    k.lowering = "tensor cores (mma.sync)";
  }
  return k;
}

}  // namespace tj::codegen::emitter

namespace tj::codegen {

using emitter::Emitter;

GeneratedKernel generate_simt(const ir::Function& traced, const Config& cfg, const Target& t, bool start_early) {
  const ir::Function bounded = knobs::mask_bounds.on(cfg) ? bound_masked_loops(traced, cfg) : ir::Function{};
  const ir::Function& f = knobs::mask_bounds.on(cfg) ? bounded : traced;
  // The issue order serves kernels with dots (their latency and the tensor cores'); streaming
  // kernels keep the user's order.
  bool dots = false;
  ir::walk(f.body, [&](const ir::Op& op, int) { dots |= op.kind == ir::OpKind::dot; });
  if (dots && knobs::mma.on(cfg) && t.sm() >= 80 && (knobs::issue_early.on(cfg) || knobs::prefetch_loads.on(cfg))) {
    const ir::Function ahead = knobs::prefetch_loads.on(cfg) ? prefetch_loads(f) : ir::clone(f);
    const ir::Function scheduled = knobs::issue_early.on(cfg) ? issue_early(ahead) : ir::clone(ahead);
    return Emitter(scheduled, cfg, t, start_early).run();
  }
  return Emitter(f, cfg, t, start_early).run();
}

namespace {
// The SIMT path's tunable: simt_vec (codegen/layout.h), for kernels that no pattern lowering
// takes with their untuned config. Its other knobs have shape-dependent defaults that a knob's
// single fallback value cannot express, so the tuner leaves them alone.
const bool simt_knobs_registered = [] {
  codegen::register_knob_provider("simt", [](const ir::Function& f, const std::string& arch) {
    std::vector<codegen::Knob> knobs;
    Target t;
    try {
      t = Target::parse(arch);
    } catch (const Error&) {
      return knobs;
    }
    const Config base = untuned_config(f, arch);
    for (const PatternLowering& l : lowerings()) {
      try {
        if (l.try_lower(f, base, t)) return knobs;
      } catch (const Error&) {
        return knobs;   // the lowering's pattern, with a config it cannot use
      }
    }
    std::vector<int64_t> vecs = {1, 4, 8};
    const int64_t untuned_vec = knobs::simt_vec.of(base);   // a streaming kernel's (codegen/simt_config.h)
    if (std::find(vecs.begin(), vecs.end(), untuned_vec) == vecs.end()) {
      vecs.push_back(untuned_vec);
      std::sort(vecs.begin(), vecs.end());
    }
    knobs.push_back({"simt_vec", vecs, 1});
    return knobs;
  });
  return true;
}();
}  // namespace

GeneratedKernel generate_cuda(const ir::Function& f, const Config& cfg, const Target& t, bool start_early) {
  check_knob_names(f.name, cfg);
  if (knobs::lowering.on(cfg)) {
    for (const PatternLowering& l : lowerings()) {
      if (auto g = l.try_lower(f, cfg, t)) {
        g->lowering = l.name;
        return *std::move(g);
      }
    }
  }
  return generate_simt(f, cfg, t, start_early);
}

}  // namespace tj::codegen
