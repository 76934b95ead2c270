// Knob overlap's plan: which ops of a loop body run one iteration late (see overlap_plan.h).
#include "codegen/overlap_plan.h"

#include <fmt/format.h>

#include <algorithm>

namespace tj::codegen {

namespace {

// The values an op of the body reads: a tensor-core dot's operands as it reads them (transposes
// and casts folded) and as written (the folded ops' results, so that those ops follow the dot),
// its accumulator and k range; any other op's operands.
std::vector<int> inputs(const ir::Op& op, const MmaPlan& mma) {
  if (const MmaDot* d = mma.dot_of(&op)) {
    std::vector<int> in = op.operands;
    in.push_back(d->a.value);
    in.push_back(d->b.value);
    return in;
  }
  return op.operands;
}

// Whether a copy of the value carries over the back edge cheaply: a scalar or a small tile
// (row vectors; not a score tile).
constexpr int kMaxCarriedSlots = 8;

}  // namespace

OverlapLoop plan_overlap(const ir::Function& f, const ir::Op& loop, const MmaPlan& mma, const AsyncPlan& async,
                         const std::function<int(int)>& slots) {
  OverlapLoop o;
  auto fail = [&](std::string why) {
    o.why = std::move(why);
    o.late.clear();
    o.carried.clear();
    return o;
  };
  if (!mma.wgmma()) return fail("its dots are not on wgmma");
  if (!mma.producer_warp) return fail("no producer warpgroup fills its operands (knob warp_specialize)");
  const std::vector<ir::Op>& body = loop.body->ops;
  std::vector<const ir::Op*> dots;
  for (const ir::Op& op : body) {
    if (op.body) return fail("a loop inside its body");
    if (op.kind == ir::OpKind::dot && mma.dot_of(&op)) dots.push_back(&op);
  }
  if (dots.size() != 2) return fail(fmt::format("{} tensor-core dots in its body (two: a first and a chained one)", dots.size()));
  o.first = dots[0];
  o.chained = dots[1];
  auto ip = async.in_place.find(o.chained);
  if (ip == async.in_place.end() || o.chained->ival != 1)
    return fail("its last dot does not accumulate into a loop-carried variable");
  o.acc_var = ip->second;
  const MmaDot& cd = *mma.dot_of(o.chained);
  if (cd.a.source == MmaOperand::Source::fragment) o.fragment = cd.a.value;

  std::map<int, const ir::Op*> def;   // values defined in the body
  for (const ir::Op& op : body)
    if (op.result >= 0) def[op.result] = &op;
  std::map<int, std::vector<const ir::Op*>> users;   // in the body
  for (const ir::Op& op : body)
    for (int v : inputs(op, mma)) users[v].push_back(&op);

  // The late ops: the chained dot, and to a fixpoint every other op whose result only late ops
  // read. Never: the first dot, the fragment (carried as A fragments), stores, variable writes, a
  // read of a variable other than the accumulator (a late read would see the next iteration's
  // value), and a staged load the producer warpgroup does not fill.
  o.late.insert(o.chained);
  for (bool changed = true; changed;) {
    changed = false;
    for (auto it = body.rbegin(); it != body.rend(); ++it) {
      const ir::Op& op = *it;
      if (o.late.count(&op) || op.result < 0 || &op == o.first || op.result == o.fragment) continue;
      if (ir::is_store(op.kind) || op.kind == ir::OpKind::var_write || op.kind == ir::OpKind::var_decl ||
          (op.kind == ir::OpKind::dot && mma.dot_of(&op)))
        continue;
      if (op.kind == ir::OpKind::var_read && op.operands[0] != o.acc_var) continue;
      if (const StagedLoad* s = mma.staged_of(&op); s && (!s->producer || s->home != &loop)) continue;
      const auto u = users.find(op.result);
      if (u == users.end() || u->second.empty()) continue;
      if (std::all_of(u->second.begin(), u->second.end(), [&](const ir::Op* r) { return o.late.count(r) > 0; })) {
        o.late.insert(&op);
        changed = true;
      }
    }
  }
  // The rest of the body must neither read nor write the accumulator: it would see it one
  // iteration early.
  for (const ir::Op& op : body) {
    if (o.late.count(&op)) continue;
    if ((op.kind == ir::OpKind::var_read || op.kind == ir::OpKind::var_write) && op.operands[0] == o.acc_var &&
        !(op.kind == ir::OpKind::var_write && op.operands.size() > 1 && op.operands[1] == o.chained->result))
      return fail(fmt::format("the body reads or writes the accumulator outside its chained dot (line {})", op.loc.line));
  }
  // What the late ops read from the rest of the body.
  std::set<int> carried;
  for (const ir::Op* op : o.late)
    for (int v : inputs(*op, mma)) {
      auto d = def.find(v);
      if (v < 0 || d == def.end() || o.late.count(d->second) || v == o.fragment) continue;
      if (slots(v) > kMaxCarriedSlots)
        return fail(fmt::format("its chained dot needs a tile of {} registers a thread from the same iteration (line {})",
                                slots(v), d->second->loc.line));
      carried.insert(v);
    }
  o.carried.assign(carried.begin(), carried.end());
  return o;
}

}  // namespace tj::codegen
