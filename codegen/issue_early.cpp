#include "codegen/issue_early.h"

#include <map>
#include <set>
#include <vector>

namespace tj::codegen {

namespace {

using ir::Op;
using ir::OpKind;

// Ops that compute a value from their operands alone (no memory, no variables, no control).
bool pure(const Op& op) {
  switch (op.kind) {
    case OpKind::const_value:
    case OpKind::scalar_param:
    case OpKind::tensor_dim:
    case OpKind::block_size:
    case OpKind::full:
    case OpKind::arange:
    case OpKind::unary:
    case OpKind::binary:
    case OpKind::where:
    case OpKind::cast:
    case OpKind::expand_dims:
    case OpKind::transpose:
    case OpKind::broadcast:
    case OpKind::reduce:
      return true;
    default:
      return false;
  }
}

bool reads_input(const ir::Function& f, const Op& op) {
  return (op.kind == OpKind::load || op.kind == OpKind::gather) && f.params.at(op.param).kind == ir::ParamKind::tensor_in;
}

// Whether an op (its loop body included) reads or writes variable `var`.
bool touches_var(const Op& op, int var) {
  if ((op.kind == OpKind::var_write || op.kind == OpKind::var_read) && op.operands.at(0) == var) return true;
  if (op.body)
    for (const Op& inner : op.body->ops)
      if (touches_var(inner, var)) return true;
  return false;
}

class Scheduler {
 public:
  Scheduler(const ir::Function& f, ir::Region& r) : f_(f), r_(r) {
    for (size_t i = 0; i < r.ops.size(); ++i)
      if (r.ops[i].result >= 0) def_[r.ops[i].result] = static_cast<int>(i);
    // Uses of each value among the body's ops (nested bodies included: a use there is a thread read).
    for (const Op& op : r.ops) note_uses(op);
  }

  // Returns whether any op moved.
  bool run() {
    std::vector<bool> early(r_.ops.size(), false);
    for (size_t i = 0; i < r_.ops.size(); ++i) {
      const Op& op = r_.ops[i];
      const bool thread_load = reads_input(f_, op) && !feeds_only_dots(op.result);
      if (!thread_load && op.kind != OpKind::dot) continue;
      std::set<int> closure;
      if (collect(static_cast<int>(i), static_cast<int>(i), closure))
        for (int c : closure) early[c] = true;
    }
    // The order changes only where an early op follows one that stays.
    bool moved = false;
    for (size_t i = 1; i < early.size(); ++i) moved |= early[i] && !early[i - 1];
    if (!moved) return false;
    std::vector<Op> ops;
    ops.reserve(r_.ops.size());
    for (size_t i = 0; i < r_.ops.size(); ++i)
      if (early[i]) ops.push_back(std::move(r_.ops[i]));
    for (size_t i = 0; i < r_.ops.size(); ++i)
      if (!early[i]) ops.push_back(std::move(r_.ops[i]));
    r_.ops = std::move(ops);
    return true;
  }

 private:
  void note_uses(const Op& op) {
    for (int v : op.operands) uses_[v].push_back(&op);
    if (op.body)
      for (const Op& inner : op.body->ops) note_uses(inner);
  }

  // True when every use of `v` is a dot's a or b operand, directly or through a transpose.
  bool feeds_only_dots(int v) const {
    auto it = uses_.find(v);
    if (it == uses_.end()) return false;
    for (const Op* u : it->second) {
      if (u->kind == OpKind::transpose) {
        if (!feeds_only_dots(u->result)) return false;
      } else if (u->kind != OpKind::dot || (u->operands.size() > 0 && u->operands[0] != v && u->operands[1] != v)) {
        return false;
      }
    }
    return true;
  }

  // Adds op `i` and the body's ops it depends on to `closure` (the ops that move with op `root`);
  // false when one of them may not move to the body's start: a dot's result, anything with
  // effects, or a variable that an op before the root reads or writes (a dot that accumulates
  // into the variable's registers in place must not pass another reader either).
  bool collect(int i, int root, std::set<int>& closure) const {
    if (!closure.insert(i).second) return true;
    const Op& op = r_.ops[i];
    if (op.kind == OpKind::dot) {
      if (i != root) return false;   // a dot of a dot's result is not a leaf
    } else if (op.kind == OpKind::var_read) {
      for (int j = 0; j < root; ++j)
        if (j != i && touches_var(r_.ops[j], op.operands.at(0))) return false;
      return true;
    } else if (!pure(op) && !reads_input(f_, op)) {
      return false;
    }
    for (int v : op.operands) {
      auto d = def_.find(v);
      if (d != def_.end() && !collect(d->second, root, closure)) return false;
    }
    return true;
  }

  const ir::Function& f_;
  ir::Region& r_;
  std::map<int, int> def_;                       // value -> index of its op in the body
  std::map<int, std::vector<const Op*>> uses_;
};

bool schedule(const ir::Function& f, ir::Region& r) {
  bool moved = false;
  for (Op& op : r.ops) {
    if (!op.body) continue;
    moved |= schedule(f, *op.body);
    if (!op.launch) moved |= Scheduler(f, *op.body).run();
  }
  return moved;
}

}  // namespace

ir::Function issue_early(const ir::Function& f, bool* moved) {
  ir::Function out = ir::clone(f);
  const bool any = schedule(out, out.body);
  if (moved) *moved = any;
  return out;
}

}  // namespace tj::codegen
