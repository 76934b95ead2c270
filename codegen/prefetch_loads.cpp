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
    std::vector<size_t> picks;
    for (size_t i = 0; i < r.ops[p].body->ops.size(); ++i)
      if (qualifies(r.ops[p], *r.ops[p].body, r.ops[p].body->ops[i])) picks.push_back(i);
    if (picks.empty()) return 0;
    std::vector<Op> head;   // ops that go before the loop
    const ir::SourceLoc loc = r.ops[p].loc;
    const int outer = r.id, inner = r.ops[p].body->id, index = r.ops[p].body_index;
    const TileType i64 = f_.type(index);
    // The last tile's start, b + ((e - b - 1) floordiv block) * block: the next tile's index is
    // clamped to it, so that the last iteration's load ahead (never read) stays inside the loop's
    // range, where the emitter's range analysis can leave its bounds checks out.
    auto scalar = [&](std::vector<Op>& into, int region, OpKind kind, std::vector<int> operands, auto&& set) {
      Op op = make(kind, loc, std::move(operands));
      set(op);
      op.result = value(i64, region);
      const int v = op.result;
      into.push_back(std::move(op));
      return v;
    };
    auto bin = [&](std::vector<Op>& into, int region, ir::BinaryFn fn, int x, int y) {
      return scalar(into, region, OpKind::binary, {x, y}, [&](Op& op) { op.binary = fn; });
    };
    const int block_id = r.ops[p].block_id, b = r.ops[p].operands[0], e = r.ops[p].operands[1];
    const int one = scalar(head, outer, OpKind::const_value, {}, [](Op& op) { op.ival = 1; });
    const int size = scalar(head, outer, OpKind::block_size, {}, [&](Op& op) { op.block_id = block_id; });
    const int span = bin(head, outer, ir::BinaryFn::sub, bin(head, outer, ir::BinaryFn::sub, e, b), one);
    const int last = bin(head, outer, ir::BinaryFn::add, b,
                         bin(head, outer, ir::BinaryFn::mul, bin(head, outer, ir::BinaryFn::floordiv, span, size), size));
    std::vector<Op> tail;   // the body's new last ops
    const int step = scalar(tail, inner, OpKind::block_size, {}, [&](Op& op) { op.block_id = block_id; });
    const int next_index = bin(tail, inner, ir::BinaryFn::minimum, bin(tail, inner, ir::BinaryFn::add, index, step), last);
    for (size_t n = picks.size(); n-- > 0;) {   // from the back: earlier positions stay valid
      auto& ops = r.ops[p].body->ops;
      const size_t at = picks[n];
      Op load = std::move(ops[at]);
      ops.erase(ops.begin() + static_cast<long>(at));
      const TileType type = f_.type(load.result);
      // Before the loop: the first tile's load, the variable.
      Op first = with_index(load, index, b);
      first.result = value(type, outer);
      Op decl = make(OpKind::var_decl, load.loc, {first.result});
      decl.result = value(type, outer, true);
      const int var = decl.result;
      // In the body: this tile's value where the load was; the next tile's load, written last.
      Op read = make(OpKind::var_read, load.loc, {var});
      read.result = load.result;   // every use reads it as before
      Op next = with_index(load, index, next_index);
      next.result = value(type, inner);
      Op write = make(OpKind::var_write, load.loc, {var, next.result});
      ops.insert(ops.begin() + static_cast<long>(at), std::move(read));
      tail.push_back(std::move(next));
      tail.push_back(std::move(write));
      head.push_back(std::move(first));
      head.push_back(std::move(decl));
    }
    for (Op& op : tail) r.ops[p].body->ops.push_back(std::move(op));
    const size_t before = head.size();
    r.ops.insert(r.ops.begin() + static_cast<long>(p), std::make_move_iterator(head.begin()), std::make_move_iterator(head.end()));
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
      } else if (f_.values.at(v).defining_region == body.id) {   // (a nested region's values are out of its scope)
        return false;
      }
    }
    return at_tile && !only_dots(body, op.result);
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
