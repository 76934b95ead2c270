#include "codegen/prefetch_loads.h"

#include <functional>
#include <map>
#include <vector>

namespace tj::codegen {

namespace {

using ir::Op;
using ir::OpKind;

class Prefetcher {
 public:
  explicit Prefetcher(ir::Function& f) : f_(f) {}

  bool region(ir::Region& r) {
    bool moved = false;
    for (size_t p = 0; p < r.ops.size(); ++p) {
      if (!r.ops[p].body) continue;
      moved |= region(*r.ops[p].body);
      if (r.ops[p].kind == OpKind::loop && !r.ops[p].launch && r.ops[p].loop_kind == ir::LoopKind::tile) {
        const size_t added = loop(r, p);
        moved |= added > 0;
        p += added;   // the loop moved down past the ops put before it
      }
    }
    return moved;
  }

 private:
  // Carries the qualifying loads of the loop at r.ops[p]; returns how many ops went before it.
  size_t loop(ir::Region& r, size_t p) {
    ir::Region& body = *r.ops[p].body;
    std::vector<size_t> picks;
    for (size_t i = 0; i < body.ops.size(); ++i)
      if (qualifies(r.ops[p], body, body.ops[i])) picks.push_back(i);
    size_t before = 0;
    for (size_t n = picks.size(); n-- > 0;) {   // from the back: earlier positions stay valid
      Op& l = r.ops[p + before];
      const size_t at = picks[n];
      Op load = std::move(l.body->ops[at]);
      l.body->ops.erase(l.body->ops.begin() + static_cast<long>(at));
      const TileType type = f_.type(load.result);
      const int outer = r.id, inner = l.body->id, index = l.body_index;
      // Before the loop: the first tile's load, the variable.
      Op first = with_index(load, index, l.operands[0]);
      first.result = value(type, outer);
      Op decl = make(OpKind::var_decl, load.loc, {first.result});
      decl.result = value(type, outer, true);
      const int var = decl.result;
      // In the body: this tile's value where the load was; the next tile's load, written last.
      Op read = make(OpKind::var_read, load.loc, {var});
      read.result = load.result;   // every use reads it as before
      Op step = make(OpKind::block_size, load.loc, {});
      step.block_id = l.block_id;
      step.result = value(f_.type(index), inner);
      Op next_index = make(OpKind::binary, load.loc, {index, step.result});
      next_index.binary = ir::BinaryFn::add;
      next_index.result = value(f_.type(index), inner);
      Op next = with_index(load, index, next_index.result);
      next.result = value(type, inner);
      Op write = make(OpKind::var_write, load.loc, {var, next.result});
      auto& ops = l.body->ops;
      ops.insert(ops.begin() + static_cast<long>(at), std::move(read));
      ops.push_back(std::move(step));
      ops.push_back(std::move(next_index));
      ops.push_back(std::move(next));
      ops.push_back(std::move(write));
      r.ops.insert(r.ops.begin() + static_cast<long>(p + before), std::move(decl));
      r.ops.insert(r.ops.begin() + static_cast<long>(p + before), std::move(first));
      before += 2;
    }
    return before;
  }

  // A load of an input tensor, rank 0 or 1, at the loop's own tile (a block index of its block
  // whose start is the loop index) and otherwise loop-invariant indices, read by more than dots.
  bool qualifies(const Op& loop, const ir::Region& body, const Op& op) const {
    if (op.kind != OpKind::load || f_.params.at(op.param).kind != ir::ParamKind::tensor_in) return false;
    if (f_.type(op.result).rank() > 1) return false;
    bool at_tile = false;
    size_t operand = 0;
    for (const ir::Index& ix : op.indices) {
      if (ix.kind == ir::Index::Kind::all) continue;
      const int v = op.operands.at(operand++);
      if (v == loop.body_index) {
        if (ix.kind != ir::Index::Kind::block || ix.block_id != loop.block_id) return false;
        at_tile = true;
      } else if (f_.values.at(v).defining_region == body.id || defined_inside(body, v)) {
        return false;
      }
    }
    return at_tile && !only_dots(body, op.result);
  }

  // Whether value v is defined by an op in a region nested inside `body`.
  static bool defined_inside(const ir::Region& body, int v) {
    bool found = false;
    ir::walk(body, [&](const Op& op, int) { found |= op.result == v || op.body_index == v; });
    return found;
  }

  // Whether every use of v in `body` (nested regions included) is a dot's a or b operand.
  static bool only_dots(const ir::Region& body, int v) {
    bool any = false, others = false;
    ir::walk(body, [&](const Op& op, int) {
      for (size_t i = 0; i < op.operands.size(); ++i)
        if (op.operands[i] == v) {
          any = true;
          others |= !(op.kind == OpKind::dot && i < 2);
        }
    });
    return any && !others;
  }

  static Op make(OpKind kind, const ir::SourceLoc& loc, std::vector<int> operands) {
    Op op;
    op.kind = kind;
    op.loc = loc;
    op.operands = std::move(operands);
    return op;
  }

  // `load` with the index operand `from` replaced by `to` (no result yet).
  static Op with_index(const Op& load, int from, int to) {
    Op op = ir::copy_attributes(load);
    op.loc = load.loc;
    op.operands = load.operands;
    for (int& v : op.operands)
      if (v == from) v = to;
    return op;
  }

  int value(const TileType& t, int region, bool is_var = false) {
    f_.values.push_back(ir::ValueInfo{t, is_var, region});
    return static_cast<int>(f_.values.size()) - 1;
  }

  ir::Function& f_;
};

}  // namespace

ir::Function prefetch_loads(const ir::Function& f, bool* moved) {
  ir::Function out = ir::clone(f);
  const bool any = Prefetcher(out).region(out.body);
  if (moved) *moved = any;
  return out;
}

}  // namespace tj::codegen
