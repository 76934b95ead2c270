// The GEMM pattern both tensor-core lowerings take (see gemm_pattern.h): the match and the
// epilogue writer.
#include "codegen/gemm_pattern.h"

#include <fmt/format.h>

#include <set>
#include <string>
#include <vector>

#include "codegen/emitter_knobs.h"
#include "codegen/scalar_expr.h"
#include "dsl/ir.h"

namespace tj::codegen::gemm {

using ir::Op;
using ir::OpKind;
using scalar::cast_expr;
using scalar::dtag;
using scalar::literal;
using scalar::reg_type;
using scalar::int_literal;
using scalar::identifier;
using scalar::reserved_name;
using scalar::unary_expr;
using scalar::binary_expr;

namespace {

// gemm_common.cuh's staging geometry: 64 bytes of each row per chunk, rows 64 bytes apart
// (its pieces swizzled: gemm_stage_offset).
constexpr int kGemmStageChunkBytes = 64;
constexpr int kGemmStagePitch = 64;

Rate join(Rate a, Rate b) { return static_cast<Rate>(static_cast<int>(a) | static_cast<int>(b)); }

bool is_scalar_leaf(const Op& op) {
  return op.kind == OpKind::const_value || op.kind == OpKind::scalar_param || op.kind == OpKind::tensor_dim ||
         op.kind == OpKind::block_size;
}

bool is_zero_const(const Match& g, int v) {
  const Op* d = g.defs.at(v);
  return d && d->kind == OpKind::const_value && is_int(g.f->type(v).dtype) && d->ival == 0;
}

// Is `v` the size of dim `axis` of tensor `param` (the same op, or the same constant)?
bool is_dim_of(const Match& g, int v, int param, int axis) {
  const Op* d = g.defs.at(v);
  if (!d) return false;
  if (d->kind == OpKind::tensor_dim) return d->param == param && d->axis == axis;
  const int64_t s = g.f->params.at(param).static_shape.at(axis);
  return d->kind == OpKind::const_value && s >= 0 && d->ival == s;
}

// Each dim of a value's shape must be the m block, the n block or a constant 1, each block at
// most once: then the value is a function of (row, column).
bool shape_ok(const Match& g, const TileType& t) {
  bool seen_m = false, seen_n = false;
  if (t.rank() > 2) return false;
  for (const Dim& d : t.shape) {
    if (d.is_const()) {
      if (d.value != 1) return false;
    } else if (d.value == g.m_block) {
      if (seen_m) return false;
      seen_m = true;
    } else if (d.value == g.n_block) {
      if (seen_n) return false;
      seen_n = true;
    } else {
      return false;
    }
  }
  return true;
}

// How one index of a load/store is resolved in the epilogue.
struct IndexUse {
  enum Kind : uint8_t { scalar, row, col, zero } kind = scalar;
  int value = -1;   // scalar: the index value
};

std::optional<std::vector<IndexUse>> resolve_indices(const Match& g, const Op& op, size_t n_indices) {
  std::vector<IndexUse> out;
  const ir::Param& p = g.f->params.at(op.param);
  for (size_t d = 0; d < n_indices; ++d) {
    const ir::Index& ix = op.indices.at(d);
    const int v = op.operands.at(d);
    IndexUse u;
    switch (ix.kind) {
      case ir::Index::Kind::scalar:
        if (g.rate.at(v) != Rate::scalar) return std::nullopt;
        u.kind = IndexUse::scalar;
        u.value = v;
        break;
      case ir::Index::Kind::block:
        if (ix.block_id == g.m_block && v == g.m_idx) u.kind = IndexUse::row;
        else if (ix.block_id == g.n_block && v == g.n_idx) u.kind = IndexUse::col;
        else return std::nullopt;
        break;
      case ir::Index::Kind::all:
        if (p.static_shape.at(d) != 1) return std::nullopt;
        u.kind = IndexUse::zero;
        break;
    }
    out.push_back(u);
  }
  return out;
}

// The cheap structural part; fills g (no config needed). False: not a GEMM of this form.

}  // namespace

// ---- the match -----------------------------------------------------------------------------

bool match(const ir::Function& f, Match& g) {
  g.f = &f;
  g.defs.assign(f.values.size(), nullptr);
  ir::walk(f.body, [&](const Op& op, int) {
    if (op.result >= 0) g.defs[op.result] = &op;
  });
  g.rate.assign(f.values.size(), Rate::scalar);

  // Two launch loops, perfectly nested (mark_launch_loops guarantees scalar ops beside them).
  auto single_loop = [&](const ir::Region& r, const Op*& loop) {
    for (const Op& op : r.ops) {
      if (op.kind == OpKind::loop) {
        if (loop) return false;
        loop = &op;
      } else if (op.result >= 0 && f.type(op.result).is_scalar() && !f.values[op.result].is_var) {
        g.hoisted.push_back(&op);
      } else {
        return false;
      }
    }
    return loop != nullptr;
  };
  if (!single_loop(f.body, g.lm) || !single_loop(*g.lm->body, g.ln)) return false;
  for (const Op* l : {g.lm, g.ln})
    if (!l->launch || l->loop_kind != ir::LoopKind::tile) return false;
  for (const Op* h : g.hoisted)
    if (!is_scalar_leaf(*h) && h->kind != OpKind::unary && h->kind != OpKind::binary && h->kind != OpKind::cast)
      return false;
  g.m_block = g.lm->block_id;
  g.n_block = g.ln->block_id;
  g.m_idx = g.lm->body_index;
  g.n_idx = g.ln->body_index;
  if (!is_zero_const(g, g.lm->operands[0]) || !is_zero_const(g, g.ln->operands[0])) return false;

  // The n loop body: acc, the K loop, the epilogue and one store.
  for (const Op& op : g.ln->body->ops) {
    switch (op.kind) {
      case OpKind::var_decl: {
        if (g.acc_var >= 0) return false;
        const Op* init = g.defs.at(op.operands[0]);
        const TileType& t = f.type(op.result);
        if (!init || init->kind != OpKind::full || init->fval != 0.0 || t.dtype != DType::f32 || t.rank() != 2 ||
            !(t.shape[0] == Dim::block(g.m_block)) || !(t.shape[1] == Dim::block(g.n_block)))
          return false;
        g.acc_var = op.result;
        break;
      }
      case OpKind::loop:
        if (g.lk || g.acc_var < 0 || op.launch || op.loop_kind != ir::LoopKind::tile) return false;
        g.lk = &op;
        break;
      case OpKind::store:
        if (g.store || !g.lk || op.ival == 1) return false;   // masked stores: not this pattern
        g.store = &op;
        break;
      case OpKind::var_read:
        if (op.operands[0] != g.acc_var || !g.lk) return false;
        g.epilogue.push_back(&op);
        break;
      case OpKind::var_write:
      case OpKind::reduce:
      case OpKind::dot:
      case OpKind::store_add:
        return false;
      default:
        g.epilogue.push_back(&op);
        break;
    }
  }
  if (!g.lk || !g.store) return false;
  g.k_block = g.lk->block_id;
  g.k_idx = g.lk->body_index;
  if (!is_zero_const(g, g.lk->operands[0])) return false;

  // The K loop body: acc = dot(load a[m, k], transpose(load b[n, k]), acc).
  const Op* rd = nullptr;
  const Op* tr = nullptr;
  const Op* wr = nullptr;
  std::vector<const Op*> loads;
  for (const Op& op : g.lk->body->ops) {
    switch (op.kind) {
      case OpKind::const_value:
      case OpKind::block_size: break;
      case OpKind::load: loads.push_back(&op); break;
      case OpKind::transpose:
        if (tr) return false;
        tr = &op;
        break;
      case OpKind::var_read:
        if (rd || op.operands[0] != g.acc_var) return false;
        rd = &op;
        break;
      case OpKind::dot:
        if (g.dot) return false;
        g.dot = &op;
        break;
      case OpKind::var_write:
        if (wr || op.operands[0] != g.acc_var) return false;
        wr = &op;
        break;
      default: return false;
    }
  }
  const Op* d = g.dot;
  if (!d || !rd || !wr || loads.size() != 2 || d->ival != 1 || d->operands.size() != 5) return false;
  if (wr->operands[1] != d->result || d->operands[2] != rd->result) return false;
  if (d->operands[3] != g.k_idx || d->operands[4] != g.lk->operands[1]) return false;
  g.load_a = g.defs.at(d->operands[0]);
  const Op* bop = g.defs.at(d->operands[1]);
  if (!g.load_a || g.load_a->kind != OpKind::load || !bop) return false;
  if (bop->kind != OpKind::transpose || bop != tr) return false;   // b loaded as [k, n]: not yet
  g.load_b = g.defs.at(bop->operands[0]);
  if (!g.load_b || g.load_b->kind != OpKind::load || g.load_a == g.load_b) return false;
  auto index_is = [&](const Op& ld, size_t i, int block, int value) {
    return ld.indices.at(i).kind == ir::Index::Kind::block && ld.indices[i].block_id == block && ld.operands.at(i) == value;
  };
  if (g.load_a->indices.size() != 2 || !index_is(*g.load_a, 0, g.m_block, g.m_idx) ||
      !index_is(*g.load_a, 1, g.k_block, g.k_idx))
    return false;
  if (g.load_b->indices.size() != 2 || !index_is(*g.load_b, 0, g.n_block, g.n_idx) ||
      !index_is(*g.load_b, 1, g.k_block, g.k_idx))
    return false;
  g.ta = f.params.at(g.load_a->param).dtype;
  g.tb = f.params.at(g.load_b->param).dtype;
  const bool fp8 = is_fp8(g.ta) && is_fp8(g.tb);
  const bool half = g.ta == g.tb && (g.ta == DType::bf16 || g.ta == DType::f16);
  if (!fp8 && !half) return false;
  // K_end is A's or B's K: positions past it are zero-filled by TMA like the masked loads.
  const int k_end = g.lk->operands[1];
  if (!is_dim_of(g, k_end, g.load_a->param, 1) && !is_dim_of(g, k_end, g.load_b->param, 1)) return false;

  // The m and n tile starts may only index loads and the store (as block indices) or start an
  // arange: any other use would make a value differ between tiles that the rates cannot tell.
  auto index_only_uses = [&](const Op& op) {
    for (size_t i = 0; i < op.operands.size(); ++i) {
      const int v = op.operands[i];
      if (v != g.m_idx && v != g.n_idx) continue;
      const bool as_block = (op.kind == OpKind::load || op.kind == OpKind::store) && i < op.indices.size() &&
                            op.indices[i].kind == ir::Index::Kind::block;
      if (!as_block && op.kind != OpKind::arange) return false;
    }
    return true;
  };
  for (const Op* op : g.epilogue)
    if (!index_only_uses(*op)) return false;
  if (!index_only_uses(*g.store)) return false;

  // Epilogue: every value is a function of (row, column); classify by rate.
  for (const Op* h : g.hoisted) g.rate[h->result] = Rate::scalar;
  for (const Op* op : g.epilogue) {
    if (op->result < 0) return false;
    const TileType& t = f.type(op->result);
    if (!shape_ok(g, t)) return false;
    Rate r = Rate::scalar;
    switch (op->kind) {
      case OpKind::const_value:
      case OpKind::scalar_param:
      case OpKind::tensor_dim:
      case OpKind::block_size:
      case OpKind::full: break;
      case OpKind::var_read: r = Rate::elem; break;
      case OpKind::arange:
        if (op->block_id == g.m_block && op->operands[0] == g.m_idx) r = Rate::row;
        else if (op->block_id == g.n_block && op->operands[0] == g.n_idx) r = Rate::col;
        else return false;
        break;
      case OpKind::load: {
        auto idx = resolve_indices(g, *op, op->indices.size());
        if (!idx) return false;
        for (const IndexUse& u : *idx)
          if (u.kind == IndexUse::row) r = join(r, Rate::row);
          else if (u.kind == IndexUse::col) r = join(r, Rate::col);
        break;
      }
      case OpKind::unary:
      case OpKind::binary:
      case OpKind::where:
      case OpKind::cast:
      case OpKind::expand_dims:
      case OpKind::broadcast:
      case OpKind::transpose:
        for (int v : op->operands) r = join(r, g.rate.at(v));
        break;
      default: return false;
    }
    // A value's rate must agree with its shape (a [m] tile varies along rows only, ...).
    if (r != Rate::scalar && t.is_scalar()) return false;
    g.rate[op->result] = r;
  }
  // The store: c[..m.., ..n..] = value (a float tensor).
  const Op& st = *g.store;
  const ir::Param& cp = f.params.at(st.param);
  if (!is_float(cp.dtype)) return false;
  auto idx = resolve_indices(g, st, st.indices.size());
  if (!idx) return false;
  for (size_t dd = 0; dd < idx->size(); ++dd) {
    if ((*idx)[dd].kind == IndexUse::row) {
      if (g.store_row_dim >= 0) return false;
      g.store_row_dim = static_cast<int>(dd);
    } else if ((*idx)[dd].kind == IndexUse::col) {
      if (g.store_col_dim >= 0) return false;
      g.store_col_dim = static_cast<int>(dd);
    }
  }
  if (g.store_row_dim < 0 || g.store_col_dim < 0) return false;
  return true;
}

bool static_rows_misaligned(const Match& g, int bytes) {
  for (const Op* ld : {g.load_a, g.load_b}) {
    const ir::Param& p = g.f->params.at(ld->param);
    const int64_t k = p.static_shape.at(1);
    if (k >= 0 && (k * size_bytes(p.dtype)) % bytes != 0) return true;
  }
  return false;
}

Config tile_config(const Match& g, int64_t m, int64_t n, int64_t k) {
  const ir::Function& f = *g.f;
  Config c = default_config(f);
  for (auto [block, size] : {std::pair{g.m_block, m}, std::pair{g.n_block, n}, std::pair{g.k_block, k}})
    if (f.blocks.at(block).fixed <= 0) c.blocks[f.blocks.at(block).name] = size;
  return c;
}

// ---- the epilogue writer -----------------------------------------------------------------------

EpilogueWriter::EpilogueWriter(const Match& g, const Config& cfg)
    : g_(g), f_(*g.f), cfg_(cfg), fast_math_(knobs::fast_math.on(cfg)) {
  names_.assign(f_.values.size(), "");
  std::set<std::string> taken;
  for (size_t i = 0; i < f_.params.size(); ++i) {
    std::string n = identifier(f_.params[i].name);
    if (reserved_name(n) || taken.count(n)) n = fmt::format("p{}_{}", i, n);
    taken.insert(n);
    pnames_.push_back(n);
  }
  liveness();
  // The store's value; a final cast to the output dtype is left to the store (same rounding).
  const Op& st = *g_.store;
  store_value_ = st.operands.at(st.indices.size());
  const Op* d = g_.defs.at(store_value_);
  int uses = 0;
  for (const Op* op : g_.epilogue)
    for (int o : op->operands) uses += o == store_value_;
  for (int o : st.operands) uses += o == store_value_;
  if (d && d->kind == OpKind::cast && f_.type(d->operands[0]).dtype == DType::f32 && uses == 1) {
    store_value_ = d->operands[0];
    live_[d->result] = false;
  }
}

void EpilogueWriter::line(const std::string& s, const ir::SourceLoc* loc) {
  out_ += std::string(2 * indent_, ' ') + s;
  if (loc && loc->known()) out_ += fmt::format("  // @ {}:{}", loc->file, loc->line);
  out_ += "\n";
}

std::string EpilogueWriter::param_dim(int param, int axis) const {
  const int64_t s = f_.params.at(param).static_shape.at(axis);
  return s >= 0 ? int_literal(s, DType::i64) : fmt::format("{}.shape[{}]", pnames_.at(param), axis);
}

std::vector<std::string> EpilogueWriter::kernel_params() const {
  std::vector<std::string> params;
  for (size_t i = 0; i < f_.params.size(); ++i) {
    const ir::Param& p = f_.params[i];
    if (p.is_tensor()) params.push_back(fmt::format("tj::dev::TensorArg<{}> {}", p.rank(), pnames_[i]));
    else if (p.kind == ir::ParamKind::scalar_f32) params.push_back(fmt::format("float {}", pnames_[i]));
    else params.push_back(fmt::format("long long {}", pnames_[i]));
  }
  return params;
}

std::string EpilogueWriter::entry_name() const {
  std::string entry = identifier(f_.name);
  if (reserved_name(entry)) entry = "tj_kernel_" + entry;
  return entry;
}

void EpilogueWriter::liveness() {
  live_.assign(f_.values.size(), false);
  std::vector<int> work;
  auto mark = [&](int v) {
    if (v >= 0 && !live_[v]) {
      live_[v] = true;
      work.push_back(v);
    }
  };
  for (int v : g_.store->operands) mark(v);
  for (const Op* l : {g_.lm, g_.ln, g_.lk}) mark(l->operands[1]);
  while (!work.empty()) {
    int v = work.back();
    work.pop_back();
    const Op* d = g_.defs.at(v);
    if (!d || d->kind == OpKind::loop || d->kind == OpKind::var_read) continue;
    for (int o : d->operands) mark(o);
  }
}

std::pair<std::string, std::string> EpilogueWriter::address(const Op& op, size_t n) {
  const std::string& T = pnames_.at(op.param);
  std::vector<std::string> offs, oks;
  auto idx = resolve_indices(g_, op, n);
  for (size_t d = 0; d < n; ++d) {
    const IndexUse& u = (*idx)[d];
    const std::string lim = param_dim(op.param, static_cast<int>(d));
    std::string i;
    switch (u.kind) {
      case IndexUse::scalar: i = ref(u.value); break;
      case IndexUse::row: i = "tj_row"; break;
      case IndexUse::col: i = "tj_col"; break;
      case IndexUse::zero: continue;
    }
    if (u.kind == IndexUse::scalar) {
      const Op* c = g_.defs.at(u.value);
      if (c && c->kind == OpKind::const_value && c->ival == 0) {
        oks.push_back(fmt::format("tj::dev::in_range(0LL, {})", lim));
        continue;
      }
    }
    offs.push_back(fmt::format("({}) * {}.stride[{}]", i, T, d));
    oks.push_back(fmt::format("tj::dev::in_range({}, {})", i, lim));
  }
  return {offs.empty() ? "0LL" : fmt::format("{}", fmt::join(offs, " + ")),
          oks.empty() ? "true" : fmt::format("{}", fmt::join(oks, " && "))};
}

std::string EpilogueWriter::op_expr(const Op& op) {
  const TileType& rt = f_.type(op.result);
  switch (op.kind) {
    case OpKind::load: {
      auto [off, ok] = address(op, op.indices.size());
      return fmt::format("tj::dev::load_scalar<{}>({}.data, {}, {})", dtag(f_.params.at(op.param).dtype),
                         pnames_.at(op.param), off, ok);
    }
    case OpKind::unary: return unary_expr(op.unary, rt.dtype, ref(op.operands[0]), fast_math_);
    case OpKind::binary:
      return binary_expr(op.binary, f_.type(op.operands[0]).dtype, rt.dtype, ref(op.operands[0]), ref(op.operands[1]));
    case OpKind::where: return fmt::format("{} ? {} : {}", ref(op.operands[0]), ref(op.operands[1]), ref(op.operands[2]));
    case OpKind::cast: return cast_expr(f_.type(op.operands[0]).dtype, rt.dtype, ref(op.operands[0]));
    default: return "";
  }
}

void EpilogueWriter::emit_value(const Op& op, Rate ctx) {
  const int v = op.result;
  const TileType& t = f_.type(v);
  switch (op.kind) {
    case OpKind::const_value:
    case OpKind::full: names_[v] = literal(op.fval, op.ival, t.dtype); return;
    case OpKind::block_size: names_[v] = int_literal(cfg_.block(f_, op.block_id), t.dtype); return;
    case OpKind::scalar_param: names_[v] = pnames_.at(op.param); return;
    case OpKind::tensor_dim: names_[v] = param_dim(op.param, op.axis); return;
    case OpKind::expand_dims:
    case OpKind::broadcast:
    case OpKind::transpose: names_[v] = ref(op.operands[0]); return;
    case OpKind::var_read: names_[v] = "tj_acc[tj_mb][4 * tj_j + 2 * tj_h + tj_e]"; return;
    case OpKind::arange: names_[v] = g_.rate[v] == Rate::row ? "(int)tj_row" : "(int)tj_col"; return;
    default: break;
  }
  const std::string expr = op_expr(op);
  const std::string n = fmt::format("v{}", v);
  switch (ctx) {
    case Rate::scalar:
      line(fmt::format("const {} {} = {};", reg_type(t.dtype), n, expr), &op.loc);
      names_[v] = n;
      break;
    case Rate::row:
      line(fmt::format("{}[tj_mb][tj_h] = {};", n, expr), &op.loc);
      names_[v] = n + "[tj_mb][tj_h]";
      break;
    case Rate::col:
      line(fmt::format("{}[tj_e] = {};", n, expr), &op.loc);
      names_[v] = n + "[tj_e]";
      break;
    case Rate::elem:
      line(fmt::format("const {} {} = {};", reg_type(t.dtype), n, expr), &op.loc);
      names_[v] = n;
      break;
  }
}

bool EpilogueWriter::is_alias(const Op& op) const {
  switch (op.kind) {
    case OpKind::const_value:
    case OpKind::full:
    case OpKind::block_size:
    case OpKind::scalar_param:
    case OpKind::tensor_dim:
    case OpKind::expand_dims:
    case OpKind::broadcast:
    case OpKind::transpose:
    case OpKind::var_read:
    case OpKind::arange:
      return true;
    default: return false;
  }
}

void EpilogueWriter::emit_rate(const std::vector<const Op*>& ops, Rate r) {
  for (const Op* op : ops) {
    if (!live_[op->result] || g_.rate[op->result] != r) continue;
    emit_value(*op, r);
  }
}

void EpilogueWriter::emit_hoisted() { emit_rate(g_.hoisted, Rate::scalar); }

void EpilogueWriter::emit_scalar_epilogue() {
  line("// Epilogue values that are the same for every element.");
  emit_rate(g_.epilogue, Rate::scalar);
}

void EpilogueWriter::emit_store_setup() {
  const Op& st = *g_.store;
  const ir::Param& cparam = f_.params.at(st.param);
  std::vector<std::string> soffs, soks;
  auto idx = resolve_indices(g_, st, st.indices.size());
  for (size_t d = 0; d < idx->size(); ++d) {
    const IndexUse& u = (*idx)[d];
    if (u.kind != IndexUse::scalar) continue;
    soffs.push_back(fmt::format("({}) * {}.stride[{}]", ref(u.value), pnames_[st.param], d));
    soks.push_back(fmt::format("tj::dev::in_range({}, {})", ref(u.value), param_dim(st.param, static_cast<int>(d))));
  }
  const std::string C = pnames_[st.param];
  const int cbytes = size_bytes(cparam.dtype);
  line(fmt::format("const long long tj_c_off = {};", soffs.empty() ? "0LL" : fmt::format("{}", fmt::join(soffs, " + "))));
  line(fmt::format("const bool tj_c_ok = {};", soks.empty() ? "true" : fmt::format("{}", fmt::join(soks, " && "))));
  line(fmt::format("const bool tj_vec = {}.stride[{}] == 1 && ({}.stride[{}] & 1LL) == 0 && "
                   "((unsigned long long)(({}::mem*){}.data + tj_c_off) & {}ULL) == 0;",
                   C, g_.store_col_dim, C, g_.store_row_dim, dtag(cparam.dtype), C, 2 * cbytes - 1));
}

void EpilogueWriter::emit_tile_epilogue(const AccLayout& acc) {
  const Op& st = *g_.store;
  const ir::Param& cparam = f_.params.at(st.param);
  const std::string C = pnames_[st.param];
  const std::string row_expr = fmt::format("const long long tj_row = tj_row0 + {} * tj_mb + 8 * tj_h;", acc.row_block_stride);
  // Row values and the output row pointers: once per tile.
  bool any_col = false;
  for (const Op* op : g_.epilogue)
    if (live_[op->result] && !is_alias(*op)) {
      if (g_.rate[op->result] == Rate::row)
        line(fmt::format("{} v{}[{}][2];", reg_type(f_.type(op->result).dtype), op->result, acc.row_blocks));
      any_col |= g_.rate[op->result] == Rate::col;
    }
  const std::string mem = dtag(cparam.dtype) + "::mem";
  line(fmt::format("{}* tj_cp[{}][2];   // c at (row, tj_col0)", mem, acc.row_blocks));
  line(fmt::format("bool tj_rok[{}][2];", acc.row_blocks));
  line(fmt::format("const int tj_cleft = (int)tj::dev::imax<long long>(-1LL, tj::dev::imin<long long>({} - tj_col0, 1LL << 30));",
                   param_dim(st.param, g_.store_col_dim)));
  line(fmt::format("// Per row: 2 rows per m{} block per thread.", acc.row_block_stride));
  line("#pragma unroll");
  line(fmt::format("for (int tj_mb = 0; tj_mb < {}; ++tj_mb) {{", acc.row_blocks));
  line("#pragma unroll");
  line("  for (int tj_h = 0; tj_h < 2; ++tj_h) {");
  indent_ += 2;
  line(row_expr);
  line(fmt::format("tj_rok[tj_mb][tj_h] = tj_c_ok && tj::dev::in_range(tj_row, {});", param_dim(st.param, g_.store_row_dim)));
  line(fmt::format("tj_cp[tj_mb][tj_h] = ({}*){}.data + tj_c_off + (tj_rok[tj_mb][tj_h] ? tj_row * {}.stride[{}] + tj_col0 * {}.stride[{}] : 0LL);",
                   mem, C, C, g_.store_row_dim, C, g_.store_col_dim));
  emit_rate(g_.epilogue, Rate::row);
  indent_ -= 2;
  line("  }");
  line("}");
  const int cbytes = size_bytes(cparam.dtype);
  const int chunk_octets = kGemmStageChunkBytes / (8 * cbytes);   // octets of columns per 64-byte chunk
  const bool staged = !acc.stage_buf.empty() && acc.col_octets % chunk_octets == 0;
  if (staged) {
    // A contiguous output row with 16-byte aligned rows goes out in whole 16-byte pieces.
    line(fmt::format("const bool tj_stage = {}.stride[{}] == 1 && (({}.stride[{}] * {}) & 15LL) == 0 && "
                     "((unsigned long long)(({}*){}.data + tj_c_off) & 15ULL) == 0;",
                     C, g_.store_col_dim, C, g_.store_row_dim, cbytes, mem, C));
    if (!acc.stage_sync.empty()) line(acc.stage_sync);
    line(fmt::format("unsigned char* const tj_sbuf = {};", acc.stage_buf));
    line(fmt::format("const int tj_srow = ({0}) >> 2, tj_sbyte = 2 * (({0}) & 3) * {1};   // this thread's pair in a chunk",
                     acc.lane, cbytes));
    line("#pragma unroll");
    line(fmt::format("for (int tj_ch = 0; tj_ch < {}; ++tj_ch) {{", acc.col_octets / chunk_octets));
    ++indent_;
    line("#pragma unroll");
    line(fmt::format("for (int tj_jj = 0; tj_jj < {}; ++tj_jj) {{", chunk_octets));
    ++indent_;
    line(fmt::format("const int tj_j = tj_ch * {} + tj_jj;", chunk_octets));
  } else {
    line("#pragma unroll");
    line(fmt::format("for (int tj_j = 0; tj_j < {}; ++tj_j) {{", acc.col_octets));
    ++indent_;
  }
  line("const long long tj_colp = tj_col0 + 8 * tj_j;");
  if (any_col) {
    line("// Values per column: the pair tj_colp, tj_colp + 1.");
    for (const Op* op : g_.epilogue)
      if (live_[op->result] && !is_alias(*op) && g_.rate[op->result] == Rate::col)
        line(fmt::format("{} v{}[2];", reg_type(f_.type(op->result).dtype), op->result));
    line("#pragma unroll");
    line("for (int tj_e = 0; tj_e < 2; ++tj_e) {");
    ++indent_;
    line("const long long tj_col = tj_colp + tj_e;");
    emit_rate(g_.epilogue, Rate::col);
    --indent_;
    line("}");
  } else {
    emit_rate(g_.epilogue, Rate::col);
  }
  line("#pragma unroll");
  line(fmt::format("for (int tj_mb = 0; tj_mb < {}; ++tj_mb) {{", acc.row_blocks));
  line("#pragma unroll");
  line("  for (int tj_h = 0; tj_h < 2; ++tj_h) {");
  indent_ += 2;
  line(row_expr);
  line("float tj_out[2];");
  line("#pragma unroll");
  line("for (int tj_e = 0; tj_e < 2; ++tj_e) {");
  ++indent_;
  line("const long long tj_col = tj_colp + tj_e;");
  line("(void)tj_row;");
  line("(void)tj_col;");
  emit_rate(g_.epilogue, Rate::elem);
  line(fmt::format("tj_out[tj_e] = {};", ref(store_value_)), &st.loc);
  --indent_;
  line("}");
  const std::string direct = fmt::format(
      "tj::dev::gemm_store_pair<{}>(tj_cp[tj_mb][tj_h], tj_rok[tj_mb][tj_h], tj_cleft, 8 * tj_j, {}.stride[{}], "
      "tj_out[0], tj_out[1], tj_vec);",
      dtag(cparam.dtype), C, g_.store_col_dim);
  if (staged) {
    line(fmt::format("if (tj_stage) tj::dev::gemm_stage_pair<{}>(tj_sbuf, tj::dev::gemm_stage_offset(tj_srow + 16 * tj_mb + 8 * tj_h, "
                     "tj_sbyte + 8 * tj_jj * {}), tj_out[0], tj_out[1]);",
                     dtag(cparam.dtype), cbytes),
         &st.loc);
    line("else " + direct, &st.loc);
  } else {
    line(direct, &st.loc);
  }
  indent_ -= 2;
  line("  }");
  line("}");
  --indent_;
  line("}");
  if (staged) {
    line("if (tj_stage) {");
    line("  __syncwarp();");
    line(fmt::format("  tj::dev::gemm_flush_chunk<{}, {}, {}>(tj_sbuf, ({}*){}.data + tj_c_off, {}.stride[{}], {}, {}, {} + {} * tj_ch, "
                     "{}, tj_c_ok, {});",
                     dtag(cparam.dtype), acc.row_blocks, acc.row_block_stride, mem, C, C, g_.store_row_dim, acc.warp_row0,
                     param_dim(st.param, g_.store_row_dim), acc.warp_col0, kGemmStageChunkBytes / cbytes,
                     param_dim(st.param, g_.store_col_dim), acc.lane),
         &st.loc);
    line("  __syncwarp();   // the buffer is rewritten by the next chunk");
    line("}");
    --indent_;
    line("}");
  }
}

int64_t staged_store_bytes_per_warp(int row_blocks) { return int64_t(row_blocks) * 16 * kGemmStagePitch; }

}  // namespace tj::codegen::gemm
