// Keys by parity (see key_parity.h).
#include "codegen/key_parity.h"

#include <algorithm>
#include <set>
#include <vector>

#include "codegen/emitter_knobs.h"

namespace tj::codegen {

using ir::Op;
using ir::OpKind;

namespace {

struct Graph {
  std::vector<const Op*> def;
  std::vector<std::vector<const Op*>> uses;
};

Graph graph_of(const ir::Function& f) {
  Graph g;
  g.def.assign(f.values.size(), nullptr);
  g.uses.assign(f.values.size(), {});
  ir::walk(f.body, [&](const Op& op, int) {
    if (op.result >= 0) g.def[op.result] = &op;
    for (int v : op.operands)
      if (v >= 0) g.uses[v].push_back(&op);
  });
  return g;
}

// Ops whose result holds its operands' columns where they have any (elementwise ops, broadcasts,
// variables).
bool keeps_columns(OpKind k) {
  switch (k) {
    case OpKind::unary:
    case OpKind::binary:
    case OpKind::where:
    case OpKind::cast:
    case OpKind::broadcast:
    case OpKind::expand_dims:
    case OpKind::var_decl:
    case OpKind::var_read: return true;
    default: return false;
  }
}

// The values tied column for column to dot d1's result, or empty where one of them rules the
// order out (key_parity.h lists what may touch them).
std::set<int> tied_columns(const Graph& g, const LayoutPlan& layouts, const MmaDot& d1, const MmaDot& d2, int64_t n) {
  // A value with columns: a rank-2 tile wider than 1, or a column slice.
  auto has_columns = [&](int v) {
    const Layout& l = layouts.of(v);
    return (l.rank == 2 && l.extent_c > 1) || (l.rank == 1 && l.dim0_on_cols);
  };
  std::set<int> in;
  std::vector<int> work{d1.op->result};
  auto tie = [&](int v) {
    if (v >= 0 && has_columns(v) && in.insert(v).second) work.push_back(v);
  };
  while (!work.empty()) {
    const int v = work.back();
    work.pop_back();
    const Layout& l = layouts.of(v);
    if (!l.is_mma() || l.extent_c != n) return {};
    // What made it.
    if (const Op* d = g.def[v]) {
      if (keeps_columns(d->kind)) {
        for (int o : d->operands) tie(o);
      } else switch (d->kind) {
        case OpKind::reduce:   // over the rows: a column slice
          if (d->axis != 0) return {};
          tie(d->operands[0]);
          break;
        case OpKind::dot:
          if (d != d1.op) return {};
          if (d->ival == 1) tie(d->operands[2]);
          break;
        case OpKind::full:
        case OpKind::arange:
        case OpKind::load:
          break;
        default: return {};
      }
    }
    // What reads it.
    for (const Op* u : g.uses[v]) {
      if (keeps_columns(u->kind)) {
        tie(u->result);
        continue;
      }
      switch (u->kind) {
        case OpKind::var_write:   // the variable and its new value
          tie(u->operands[0]);
          tie(u->operands[1]);
          break;
        case OpKind::reduce:   // over the rows: a column slice; over the columns: a row, whatever their order
          if (u->operands[0] != v) break;
          if (u->axis == 0) tie(u->result);
          break;
        case OpKind::dot:
          if (u == d2.op && u->operands[0] == v && v == d2.a.value) break;   // P of P.V, as fragments
          if (u == d1.op && u->ival == 1 && u->operands[2] == v) break;      // d1's accumulator operand
          return {};
        default: return {};   // stores, transposes, gathers, loads indexed by it
      }
    }
  }
  return in;
}

}  // namespace

int order_keys_by_parity(const ir::Function& f, const Config& cfg, MmaPlan& mma, LayoutPlan& layouts) {
  if (!knobs::key_parity.on(cfg) || !mma.on_tensor_cores() || mma.warps_c != 1) return 0;
  const Graph g = graph_of(f);
  int ordered = 0;
  for (const MmaDot& d2 : mma.dots) {
    if (d2.a.source != MmaOperand::Source::fragment || size_bytes(d2.ta) != 1 || d2.k % 32 != 0) continue;
    if (d2.b.source == MmaOperand::Source::staged && mma.staged.at(d2.b.staged).permute_k) continue;   // in order already
    if (layouts.of(d2.a.value).columns_by_parity()) continue;
    for (const MmaDot& d1 : mma.dots) {
      if (&d1 == &d2 || d1.n != d2.k || d1.b.source != MmaOperand::Source::staged) continue;
      StagedLoad& s = mma.staged.at(d1.b.staged);
      if (s.transposed_copy || s.tile.mn_major || s.tile.rows != d1.n || s.rows_by_parity ||
          s.readers != std::vector<const Op*>{d1.op})
        continue;
      const std::set<int> tied = tied_columns(g, layouts, d1, d2, d2.k);
      if (!tied.count(d2.a.value)) continue;
      for (int v : tied) layouts.values[v].by_parity = true;
      s.rows_by_parity = true;
      if (!s.copy) {
        // A tensor map of its own where another staged load shares this one.
        const bool shared = std::any_of(mma.staged.begin(), mma.staged.end(),
                                        [&](const StagedLoad& o) { return &o != &s && !o.copy && o.tma == s.tma; });
        MmaPlan::Tma t = mma.tmas.at(s.tma);
        t.element_strides.assign(t.box.size(), 1);
        t.element_strides.at(s.row_dim) = 2;
        if (shared) {
          mma.tmas.push_back(t);
          s.tma = static_cast<int>(mma.tmas.size()) - 1;
        } else {
          mma.tmas.at(s.tma) = t;
        }
      }
      ++ordered;
      break;
    }
  }
  return ordered;
}

}  // namespace tj::codegen
