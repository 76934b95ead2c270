#include "dsl/passes.h"

#include <fmt/format.h>

#include <unordered_map>
#include <unordered_set>

#include "dsl/error.h"
#include "dsl/rules.h"

namespace tj::passes {

using ir::Op;
using ir::OpKind;

namespace {

using DefMap = std::unordered_map<int, const Op*>;

void collect_defs(const ir::Region& r, DefMap& defs) {
  ir::walk(r, [&](const Op& op, int) {
    if (op.result >= 0) defs[op.result] = &op;
  });
}

bool is_scalar_op(const ir::Function& f, const Op& op) {
  switch (op.kind) {
    case OpKind::const_value:
    case OpKind::scalar_param:
    case OpKind::tensor_dim:
    case OpKind::block_size:
      return true;
    case OpKind::unary:
    case OpKind::binary:
    case OpKind::cast:
      return f.type(op.result).is_scalar();
    default:
      return false;
  }
}

// Can the host compute `value` before launch (from tensor dims, scalars, block sizes)?
bool host_computable(const ir::Function& f, const DefMap& defs, int value) {
  auto it = defs.find(value);
  if (it == defs.end()) return false;   // a loop index
  const Op& op = *it->second;
  if (!is_scalar_op(f, op)) return false;
  for (int v : op.operands)
    if (!host_computable(f, defs, v)) return false;
  return true;
}

}  // namespace

// Scalar work every program may recompute: scalar arithmetic and scalar loads (reads have
// no side effects), e.g. a per-(batch, head) descale loaded between two launch loops.
bool is_per_program_op(const ir::Function& f, const Op& op) {
  if (is_scalar_op(f, op)) return true;
  return (op.kind == OpKind::load || op.kind == OpKind::gather || op.kind == OpKind::where) && f.type(op.result).is_scalar();
}

void mark_launch_loops(ir::Function& f) {
  DefMap defs;
  collect_defs(f.body, defs);
  ir::Region* region = &f.body;
  while (region) {
    Op* only_loop = nullptr;
    bool perfect = true;
    for (Op& op : region->ops) {
      if (op.kind == OpKind::loop) {
        if (only_loop) perfect = false;
        only_loop = &op;
      } else if (!is_per_program_op(f, op) || only_loop) {
        perfect = false;   // work beside the loop, or anything after it
      }
    }
    if (!perfect || !only_loop) break;
    if (!host_computable(f, defs, only_loop->operands[0]) || !host_computable(f, defs, only_loop->operands[1])) break;
    only_loop->launch = true;
    region = only_loop->body.get();
  }
}

namespace {

struct Verifier {
  const ir::Function& f;
  std::vector<std::unordered_set<int>> scopes;
  std::unordered_set<int> open_blocks;

  [[noreturn]] void fail(const Op& op, const std::string& msg) {
    throw DslError(op.loc, fmt::format("invalid IR ({}): {}", ir::name(op.kind), msg));
  }

  bool visible(int v) const {
    for (const auto& s : scopes)
      if (s.count(v)) return true;
    return false;
  }

  const TileType& type(const Op& op, size_t i) {
    if (i >= op.operands.size()) fail(op, fmt::format("missing operand {}", i));
    return f.type(op.operands[i]);
  }

  void expect(const Op& op, bool ok, const std::string& msg) {
    if (!ok) fail(op, msg);
  }

  void check_shape_scope(const Op& op, const TileType& t) {
    for (const Dim& d : t.shape)
      if (d.is_block() && !open_blocks.count(static_cast<int>(d.value)))
        fail(op, fmt::format("a tile with block dim {} is used outside the scope that runs its tile loop (declare a "
                             "Var that holds its tiles where the loop runs, not in an enclosing loop or after it)",
                             f.blocks.at(d.value).name));
  }

  void op_rules(const Op& op) {
    std::string why;
    const TileType* result = op.result >= 0 ? &f.type(op.result) : nullptr;
    auto same = [&](const std::optional<TileType>& t) {
      if (!t) fail(op, why);
      if (!result || !(*t == *result))
        fail(op, fmt::format("result type {} differs from the inferred {}", result ? ir::type_str(f, *result) : "none",
                             ir::type_str(f, *t)));
    };
    switch (op.kind) {
      case OpKind::unary: same(rules::unary(op.unary, type(op, 0), &why)); break;
      case OpKind::binary: {
        const TileType &a = type(op, 0), &b = type(op, 1);
        expect(op, a.is_scalar() || a.shape == result->shape, "operand 0 must be a scalar or match the result shape");
        expect(op, b.is_scalar() || b.shape == result->shape, "operand 1 must be a scalar or match the result shape");
        same(rules::binary(op.binary, a, b, &why, &f));
        break;
      }
      case OpKind::where:
        expect(op, type(op, 0).dtype == DType::i1, "the condition must be i1");
        for (size_t i = 1; i < 3; ++i)
          expect(op, type(op, i).dtype == result->dtype, "the values must have the result's dtype");
        break;
      case OpKind::reduce: same(rules::reduce(type(op, 0), op.axis, &why)); break;
      case OpKind::transpose: same(rules::transpose(type(op, 0), &why)); break;
      case OpKind::expand_dims: same(rules::expand_dims(type(op, 0), op.axis, &why)); break;
      case OpKind::broadcast:
        expect(op, rules::broadcastable_to(type(op, 0).shape, result->shape), "operand does not broadcast to the result");
        break;
      case OpKind::dot: same(rules::dot(type(op, 0), type(op, 1), op.ival ? &type(op, 2) : nullptr, &why, &f)); break;
      case OpKind::load:
      case OpKind::store:
      case OpKind::store_add: {
        expect(op, op.param >= 0 && op.param < (int)f.params.size() && f.params[op.param].is_tensor(), "not a tensor parameter");
        const ir::Param& p = f.params[op.param];
        expect(op, (int)op.indices.size() == p.rank(), fmt::format("'{}' has rank {} but {} indices", p.name, p.rank(), op.indices.size()));
        if (ir::is_store(op.kind)) {
          expect(op, p.writes(), fmt::format("store to input '{}'", p.name));
          if (op.kind == OpKind::store_add)
            expect(op, p.dtype == DType::f32 || p.dtype == DType::i32 || p.dtype == DType::i64,
                   fmt::format("atomic add into '{}' of {}: f32, i32 and i64 only", p.name, name(p.dtype)));
          expect(op, op.operands.size() == op.indices.size() + 1 + (op.ival == 1 ? 1 : 0), "store operands: indices, value [, mask]");
          if (op.ival == 1) {
            const TileType& m = type(op, op.indices.size() + 1);
            expect(op, m.dtype == DType::i1 && m.shape == type(op, op.indices.size()).shape,
                   "a store's mask is an i1 tile of the stored value's shape");
          }
        }
        else expect(op, p.kind != ir::ParamKind::tensor_out, fmt::format("load from output '{}'", p.name));
        break;
      }
      case OpKind::gather: {
        expect(op, op.param >= 0 && op.param < (int)f.params.size() && f.params[op.param].is_tensor(), "not a tensor parameter");
        const ir::Param& p = f.params[op.param];
        expect(op, (int)op.operands.size() == p.rank(), fmt::format("'{}' has rank {} but {} index tiles", p.name, p.rank(), op.operands.size()));
        expect(op, p.kind != ir::ParamKind::tensor_out, fmt::format("gather from output '{}'", p.name));
        for (size_t i = 0; i < op.operands.size(); ++i) {
          expect(op, is_int(type(op, i).dtype), "gather indices must be integers");
          expect(op, type(op, i).is_scalar() || type(op, i).shape == result->shape, "gather indices must have the result's shape");
        }
        break;
      }
      case OpKind::var_read:
        expect(op, f.values.at(op.operands.at(0)).is_var, "operand is not a variable");
        break;
      case OpKind::var_write:
        expect(op, f.values.at(op.operands.at(0)).is_var, "operand 0 is not a variable");
        expect(op, type(op, 1) == type(op, 0), "value type differs from the variable's");
        break;
      case OpKind::loop:
        expect(op, type(op, 0).is_scalar() && is_int(type(op, 0).dtype), "loop bounds must be integer scalars");
        expect(op, type(op, 1).is_scalar() && is_int(type(op, 1).dtype), "loop bounds must be integer scalars");
        expect(op, (op.loop_kind == ir::LoopKind::tile) == (op.block_id >= 0), "tile loops (only) have a block");
        break;
      default: break;
    }
    if (result) check_shape_scope(op, *result);
  }

  void region(const ir::Region& r, bool parent_launch) {
    scopes.emplace_back();
    // A tile loop's block dim is in scope in the whole region that holds the loop: a Var the
    // loop updates tile by tile is declared before it and read after it.
    std::vector<int> region_blocks;
    for (const Op& op : r.ops)
      if (op.kind == OpKind::loop && op.block_id >= 0 && open_blocks.insert(op.block_id).second)
        region_blocks.push_back(op.block_id);
    for (const Op& op : r.ops) {
      for (int v : op.operands)
        if (!visible(v)) fail(op, fmt::format("operand %{} is not defined in an enclosing scope", v));
      op_rules(op);
      if (op.result >= 0) scopes.back().insert(op.result);
      if (op.kind == OpKind::loop) {
        if (op.launch && !parent_launch) fail(op, "a launch loop nested inside a loop that is not one");
        scopes.emplace_back();
        scopes.back().insert(op.body_index);
        region(*op.body, op.launch);
        scopes.pop_back();
      }
    }
    for (int b : region_blocks) open_blocks.erase(b);
    scopes.pop_back();
  }
};

}  // namespace

void verify(const ir::Function& f) {
  Verifier v{f, {}, {}};
  v.region(f.body, true);
}

}  // namespace tj::passes
