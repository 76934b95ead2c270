#include "codegen/layout.h"
#include "codegen/emitter_knobs.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <tuple>

#include "codegen/mma_plan.h"
#include "dsl/error.h"
#include "dsl/rules.h"

namespace tj::codegen {

using ir::Op;
using ir::OpKind;

std::string_view name(LayoutKind k) {
  switch (k) {
    case LayoutKind::scalar: return "scalar";
    case LayoutKind::distributed: return "distributed";
    case LayoutKind::mma: return "mma";
    case LayoutKind::shared: return "shared";
  }
  return "?";
}

std::string Arrangement::cuda_type() const {
  if (vec == 1) return fmt::format("tj::dev::Arr<{}, {}, {}, {}>", lanes_r, lanes_c, warps_r, warps_c);
  return fmt::format("tj::dev::Arr<{}, {}, {}, {}, {}>", lanes_r, lanes_c, warps_r, warps_c, vec);
}

std::string Arrangement::mma_cuda_type() const { return fmt::format("tj::dev::MmaArr<{}, {}>", warps_r, warps_c); }

Layout Layout::scalar() { return Layout{}; }

Layout Layout::shared_tile() {
  Layout l;
  l.kind = LayoutKind::shared;
  return l;
}

bool Layout::mma_fits(const Arrangement& a, int64_t rows, int64_t cols) {
  return (rows == 1 || rows % (16 * a.warps_r) == 0) && (cols == 1 || cols % (8 * a.warps_c) == 0);
}

Layout Layout::mma2(const Arrangement& a, int64_t rows, int64_t cols) {
  Layout l = blocked2(a, rows, cols);
  l.kind = LayoutKind::mma;
  return l;
}

Layout Layout::blocked2(const Arrangement& a, int64_t rows, int64_t cols) {
  Layout l;
  l.kind = LayoutKind::distributed;
  l.rank = 2;
  l.arr = a;
  l.extent_r = rows;
  l.extent_c = cols;
  return l;
}

Layout Layout::row_slice(const Arrangement& a, int64_t n) {
  Layout l = blocked2(a, n, 1);
  l.rank = 1;
  return l;
}

Layout Layout::col_slice(const Arrangement& a, int64_t n) {
  Layout l = blocked2(a, 1, n);
  l.rank = 1;
  l.dim0_on_cols = true;
  return l;
}

int Layout::slots_r() const {
  if (is_mma()) return extent_r == 1 ? 1 : static_cast<int>(2 * extent_r / (16 * arr.warps_r));
  if (!is_distributed()) return 1;
  return static_cast<int>((extent_r + arr.rows() - 1) / arr.rows());
}

int Layout::reps_c() const {
  if (!is_distributed()) return 1;
  return static_cast<int>((extent_c + arr.col_cover() - 1) / arr.col_cover());
}

int Layout::slots_c() const {
  if (is_mma()) return extent_c == 1 ? 1 : static_cast<int>(extent_c / arr.warps_c / 4);
  if (!is_distributed()) return 1;
  return extent_c == 1 ? 1 : reps_c() * arr.vec;   // a row slice: one column, whatever the vector width
}

int Layout::axis_of_dim(int d) const {
  if (rank == 2) return d;
  return dim0_on_cols ? 1 : 0;
}

bool Layout::same_registers(const Layout& o) const {
  if (kind != o.kind) return false;
  if (is_scalar() || kind == LayoutKind::shared) return true;
  if (replicated() && o.replicated()) return true;
  return arr == o.arr && extent_r == o.extent_r && extent_c == o.extent_c && columns_by_parity() == o.columns_by_parity();
}

std::string Layout::cuda_type(const std::string& arr_name) const {
  if (columns_by_parity()) return fmt::format("tj::dev::Mma<{}, {}, {}, 1>", arr_name, extent_r, extent_c);
  return fmt::format("tj::dev::{}<{}, {}, {}>", is_mma() ? "Mma" : "Blocked", arr_name, extent_r, extent_c);
}

std::string Layout::str() const {
  if (is_mma())
    return fmt::format("{}x{} accumulator tile on {}x{} warps, {} per thread{}", extent_r, extent_c, arr.warps_r, arr.warps_c,
                       slots(), columns_by_parity() ? ", columns by parity" : "");
  if (!is_distributed()) return std::string(name(kind));
  std::string what = rank == 2 ? fmt::format("{}x{} tile", extent_r, extent_c)
                     : rank == 1 ? fmt::format("{} elements along the thread {}", dim0_on_cols ? extent_c : extent_r,
                                               dim0_on_cols ? "columns" : "rows")
                                 : std::string("single element");
  return fmt::format("{} on {}x{} lanes x {}x{} warps, {} per thread", what, arr.lanes_r, arr.lanes_c, arr.warps_r,
                     arr.warps_c, slots());
}

// ---- conversions ---------------------------------------------------------------------------

std::string Conversion::expr(const std::string& value, const std::string& to_type) const {
  switch (kind) {
    case Kind::none: return value;
    case Kind::broadcast: return fmt::format("tj::dev::broadcast<{}>({})", to_type, value);
    case Kind::exchange:
      return fmt::format("tj::dev::exchange<{}, {}, {}, {}, {}>({}, tj_smem)", to_type, dr, dc, sr, sc, value);
    case Kind::to_scalar: return fmt::format("{}.v[0]", value);
    case Kind::from_scalar: return fmt::format("tj::dev::full<{}>({})", to_type, value);
  }
  return value;
}

namespace {
// Strides that linearize a layout's tile coordinates (row-major over the tile's dims; a
// rank-2 tile [R, C] has pitch C, so [n] and [n, 1] / [1, n] share one order).
std::pair<int, int> linear_strides(const Layout& l) {
  if (l.rank == 2) return {static_cast<int>(l.extent_c), 1};
  if (l.rank == 1) return l.dim0_on_cols ? std::pair{0, 1} : std::pair{1, 0};
  return {0, 0};
}
}  // namespace

Conversion plan_conversion(const Layout& from, const Layout& to, int elem_bytes) {
  Conversion c;
  if (from.is_scalar() && to.is_scalar()) return c;
  if (from.is_scalar()) {
    c.kind = Conversion::Kind::from_scalar;
    return c;
  }
  if (to.is_scalar()) {
    if (!from.replicated()) throw Error("internal error: converting a tile of more than one element to a scalar");
    c.kind = Conversion::Kind::to_scalar;
    return c;
  }
  if (!from.in_registers() || !to.in_registers())
    throw Error(fmt::format("internal error: no conversion from a {} layout to a {} layout", name(from.kind), name(to.kind)));
  if (from.same_registers(to)) return c;
  if (from.replicated() ||
      (from.kind == to.kind && from.arr == to.arr && (from.extent_r == 1 || from.extent_r == to.extent_r) &&
       (from.extent_c == 1 || (from.extent_c == to.extent_c && from.columns_by_parity() == to.columns_by_parity())))) {
    c.kind = Conversion::Kind::broadcast;
    return c;
  }
  // Same elements in another arrangement (or a rank-1 tile as [n, 1] / [1, n]): exchange.
  const int64_t elements = from.extent_r * from.extent_c;
  if (elements != to.extent_r * to.extent_c)
    throw Error(fmt::format("internal error: no conversion from {} to {}", from.str(), to.str()));
  c.kind = Conversion::Kind::exchange;
  std::tie(c.sr, c.sc) = linear_strides(from);
  std::tie(c.dr, c.dc) = linear_strides(to);
  c.smem_bytes = elements * elem_bytes;
  return c;
}

std::vector<int64_t> bind_shape(const ir::Function& f, const Config& cfg, const TileType& t) {
  std::vector<int64_t> out;
  for (const Dim& d : t.shape) out.push_back(d.is_const() ? d.value : cfg.block(f, static_cast<int>(d.value)));
  return out;
}

// ---- assignment ------------------------------------------------------------------------------

namespace {

int64_t pow2_floor(int64_t x) {
  int64_t p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}

struct UnionFind {
  std::vector<int> parent;
  explicit UnionFind(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int find(int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  void unite(int a, int b) { parent[find(a)] = find(b); }
};

int simt_vec(const ir::Function& f, const Config& cfg) {
  const int64_t v = knobs::simt_vec.of(cfg);
  if (v < 1 || v > 16 || (v & (v - 1)))
    throw Error(fmt::format("kernel '{}': knob simt_vec must be a power of two in [1, 16], got {}", f.name, v));
  return static_cast<int>(v);
}

Arrangement choose_arrangement2(const ir::Function& f, const Config& cfg, int warps) {
  int64_t rmin = 0, cmin = 0;
  for (const auto& v : f.values) {
    if (v.type.rank() != 2) continue;
    auto s = bind_shape(f, cfg, v.type);
    if (s[0] > 1) rmin = rmin ? std::min(rmin, s[0]) : s[0];
    if (s[1] > 1) cmin = cmin ? std::min(cmin, s[1]) : s[1];
  }
  Arrangement a;
  int64_t lc;
  if (cfg.knobs.count("simt_lanes_c")) {
    lc = knobs::simt_lanes_c.of(cfg);
    if (lc < 1 || lc > 32 || (lc & (lc - 1)))
      throw Error(fmt::format("kernel '{}': knob simt_lanes_c must be a power of two in [1, 32], got {}", f.name, lc));
  } else if (cmin == 0) {
    lc = 1;
  } else if (rmin == 0) {
    lc = 32;
  } else {
    lc = std::min<int64_t>(8, pow2_floor(cmin));
    int64_t lr = 32 / lc;
    if (rmin < lr) lc = 32 / pow2_floor(rmin);
  }
  a.lanes_c = static_cast<int>(lc);
  a.lanes_r = 32 / a.lanes_c;
  if (cfg.knobs.count("simt_warps_c")) {
    int64_t wc = knobs::simt_warps_c.of(cfg);
    if (wc < 1 || warps % wc)
      throw Error(fmt::format("kernel '{}': knob simt_warps_c must divide num_warps ({}), got {}", f.name, warps, wc));
    a.warps_c = static_cast<int>(wc);
  } else {
    int wr = rmin > 0 ? static_cast<int>(std::clamp<int64_t>(pow2_floor(std::max<int64_t>(1, rmin / a.lanes_r)), 1, warps)) : 1;
    while (warps % wr) --wr;
    a.warps_c = warps / wr;
  }
  a.warps_r = warps / a.warps_c;
  a.vec = simt_vec(f, cfg);
  return a;
}

// Operands of `op` that must share a layout with its result (elementwise and variables).
void unify_rank1(const ir::Function& f, const Op& op, UnionFind& uf) {
  auto rank1 = [&](int v) { return f.type(v).rank() == 1; };
  switch (op.kind) {
    case OpKind::unary:
    case OpKind::binary:
    case OpKind::where:
    case OpKind::cast:
    case OpKind::gather:
      if (rank1(op.result))
        for (int v : op.operands)
          if (rank1(v)) uf.unite(v, op.result);
      break;
    case OpKind::var_decl:
      if (rank1(op.result)) uf.unite(op.operands[0], op.result);
      break;
    case OpKind::var_read:
      if (rank1(op.result)) uf.unite(op.operands[0], op.result);
      break;
    case OpKind::var_write:
      if (rank1(op.operands[0])) uf.unite(op.operands[1], op.operands[0]);
      break;
    default: break;
  }
}

}  // namespace

LayoutPlan assign_layouts(const ir::Function& f, const Config& cfg, const Target& target, const MmaPlan* mma) {
  LayoutPlan plan;
  const int warps = cfg.num_warps;
  if (warps < 1 || warps > 32)
    throw Error(fmt::format("kernel '{}': num_warps must be in [1, 32], got {}", f.name, warps));
  plan.threads = warps * 32;

  // Tiles of rank > 2 are not supported yet: report the first op that makes or uses one.
  ir::walk(f.body, [&](const Op& op, int) {
    auto check = [&](int v) {
      int r = f.type(v).rank();
      if (r > 2) throw DslError(op.loc, fmt::format("tiles of rank {} are not supported by the CUDA backend yet", r));
    };
    if (op.result >= 0) check(op.result);
    for (int v : op.operands) check(v);
  });

  for (const auto& v : f.values) plan.has_2d |= v.type.rank() == 2;
  plan.arr1 = Arrangement{1, 32, 1, warps, simt_vec(f, cfg)};
  plan.arr2 = plan.has_2d ? choose_arrangement2(f, cfg, warps) : plan.arr1;

  // Rank-1 tiles: values that must share a layout form classes; ops that meet rank-2 tiles
  // vote for the row slice (+) or the column slice (-).
  UnionFind uf(f.values.size());
  std::vector<int> votes(f.values.size(), 0);
  std::vector<bool> voted(f.values.size(), false);
  ir::walk(f.body, [&](const Op& op, int) { unify_rank1(f, op, uf); });
  auto vote = [&](int v, int w) {
    votes[v] += w;
    voted[v] = true;
  };
  ir::walk(f.body, [&](const Op& op, int) {
    switch (op.kind) {
      case OpKind::reduce:
        if (f.type(op.operands[0]).rank() == 2) vote(op.result, op.axis == 1 ? 1 : -1);
        break;
      case OpKind::expand_dims:
        if (f.type(op.operands[0]).rank() == 1) vote(op.operands[0], op.axis == 1 ? 1 : -1);
        break;
      case OpKind::broadcast:
        if (f.type(op.operands[0]).rank() == 1 && f.type(op.result).rank() == 2) vote(op.operands[0], -1);
        break;
      default: break;
    }
  });
  std::vector<int> class_votes(f.values.size(), 0);
  std::vector<bool> class_voted(f.values.size(), false);
  for (size_t v = 0; v < f.values.size(); ++v) {
    int root = uf.find(static_cast<int>(v));
    class_votes[root] += votes[v];
    class_voted[root] = class_voted[root] || voted[v];
  }

  // The accumulator family (tensor-core dots): rank-2 values tied to a dot result by
  // elementwise ops, variables, rank-2 broadcasts and the dot's accumulator operand; rank-1
  // values reduced from the family or broadcast into it are its slices.
  std::vector<bool> family(f.values.size(), false);
  if (mma && mma->on_tensor_cores()) {
    plan.arr_mma = Arrangement::mma(mma->warps_r, mma->warps_c);
    UnionFind uf2(f.values.size());
    auto rank2 = [&](int v) { return f.type(v).rank() == 2; };
    ir::walk(f.body, [&](const Op& op, int) {
      switch (op.kind) {
        case OpKind::unary:
        case OpKind::binary:
        case OpKind::where:
        case OpKind::cast:
        case OpKind::broadcast:
        case OpKind::var_decl:
        case OpKind::var_read:
          if (op.result >= 0 && rank2(op.result))
            for (int v : op.operands)
              if (rank2(v)) uf2.unite(v, op.result);
          break;
        case OpKind::var_write:
          if (rank2(op.operands[0])) uf2.unite(op.operands[1], op.operands[0]);
          break;
        case OpKind::dot:
          if (mma->dot_of(&op) && op.ival == 1) uf2.unite(op.operands[2], op.result);
          break;
        case OpKind::store:   // a masked store's mask is read element by element with its value
        case OpKind::store_add:
          if (op.ival == 1 && rank2(op.operands.at(op.indices.size())))
            uf2.unite(op.operands.at(op.indices.size()), op.operands.at(op.indices.size() + 1));
          break;
        default: break;
      }
    });
    std::set<int> roots;
    for (const MmaDot& d : mma->dots) roots.insert(uf2.find(d.op->result));
    for (size_t v = 0; v < f.values.size(); ++v) family[v] = rank2(static_cast<int>(v)) && roots.count(uf2.find(static_cast<int>(v)));
    // Rank-1 classes that meet the family.
    std::set<int> rank1_roots;
    ir::walk(f.body, [&](const Op& op, int) {
      if (op.kind == OpKind::reduce && family[op.operands[0]] && f.type(op.result).rank() == 1)
        rank1_roots.insert(uf.find(op.result));
      if ((op.kind == OpKind::expand_dims || op.kind == OpKind::broadcast) && family[op.result] &&
          f.type(op.operands[0]).rank() == 1)
        rank1_roots.insert(uf.find(op.operands[0]));
    });
    for (size_t v = 0; v < f.values.size(); ++v)
      if (f.type(static_cast<int>(v)).rank() == 1 && rank1_roots.count(uf.find(static_cast<int>(v)))) family[v] = true;
  }

  plan.values.resize(f.values.size());
  for (size_t v = 0; v < f.values.size(); ++v) {
    const TileType& t = f.values[v].type;
    auto s = bind_shape(f, cfg, t);
    Layout& l = plan.values[v];
    if (t.rank() == 0) {
      l = Layout::scalar();
    } else if (t.rank() == 2) {
      l = family[v] && Layout::mma_fits(plan.arr_mma, s[0], s[1]) ? Layout::mma2(plan.arr_mma, s[0], s[1])
                                                                   : Layout::blocked2(plan.arr2, s[0], s[1]);
    } else {
      int root = uf.find(static_cast<int>(v));
      const bool rows = class_votes[root] >= 0;
      if (family[v] && Layout::mma_fits(plan.arr_mma, rows ? s[0] : 1, rows ? 1 : s[0])) {
        l = Layout::mma2(plan.arr_mma, rows ? s[0] : 1, rows ? 1 : s[0]);
        l.rank = 1;
        l.dim0_on_cols = !rows;
      } else if (!class_voted[root] || !plan.has_2d) {
        l = Layout::col_slice(plan.arr1, s[0]);
      } else if (rows) {
        l = Layout::row_slice(plan.arr2, s[0]);
      } else {
        l = Layout::col_slice(plan.arr2, s[0]);
      }
    }
    plan.has_mma = plan.has_mma || l.is_mma();
  }
  // Staged loads (and transposes of them, which their dots fold) live in shared memory.
  if (mma)
    for (const StagedLoad& st : mma->staged) {
      plan.values[st.op->result] = Layout::shared_tile();
      ir::walk(f.body, [&](const Op& op, int) {
        if (op.kind == OpKind::transpose && op.operands[0] == st.op->result) plan.values[op.result] = Layout::shared_tile();
      });
    }
  return plan;
}

}  // namespace tj::codegen
