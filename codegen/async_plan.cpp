// The asynchronous schedule of tensor-core dots (see async_plan.h): an abstract run of the
// kernel's ops that tracks which wgmma groups are in flight.
#include "codegen/async_plan.h"

#include <algorithm>
#include <functional>
#include <set>

namespace tj::codegen {

using ir::Op;
using ir::OpKind;

namespace {

struct Group {
  const Op* dot = nullptr;
  bool previous = false;   // issued in the previous iteration of the loop being run
};

struct State {
  std::vector<Group> pending;              // issue order, oldest first
  std::map<int, const Op*> var_writer;     // variable -> the in-place dot that last wrote it
  bool has(const Op* dot) const {
    return std::any_of(pending.begin(), pending.end(), [&](const Group& g) { return g.dot == dot; });
  }
};

class Planner {
 public:
  Planner(const ir::Function& f, const MmaPlan& mma, AsyncPlan& out) : f_(f), mma_(mma), out_(out) {
    def_.assign(f.values.size(), nullptr);
    uses_.assign(f.values.size(), {});
    ir::walk(f.body, [&](const Op& op, int) {
      if (op.result >= 0) def_[op.result] = &op;
      for (size_t i = 0; i < op.operands.size(); ++i) uses_[op.operands[i]].push_back({&op, static_cast<int>(i)});
    });
    find_in_place();
    find_anchors(f.body);
  }

  void run() {
    State s;
    run_region(f_.body, s);
  }

 private:
  const ir::Function& f_;
  const MmaPlan& mma_;
  AsyncPlan& out_;
  std::vector<const Op*> def_;
  std::vector<std::vector<std::pair<const Op*, int>>> uses_;
  // Staged load -> the op of its region that holds its last reader (the dot, or a loop).
  std::map<int, const Op*> anchor_;

  bool tensor_core(const Op* op) const { return op && op->kind == OpKind::dot && mma_.dot_of(op); }

  void find_in_place() {
    for (const MmaDot& d : mma_.dots) {
      const auto& u = uses_[d.op->result];
      if (u.size() == 1 && u[0].first->kind == OpKind::var_write && u[0].second == 1)
        out_.in_place[d.op] = u[0].first->operands[0];
    }
    ir::walk(f_.body, [&](const Op& op, int) {
      if (op.kind != OpKind::var_read || uses_[op.result].empty()) return;
      for (auto [user, slot] : uses_[op.result]) {
        auto it = out_.in_place.find(user);
        if (slot != 2 || user->ival != 1 || it == out_.in_place.end() || it->second != op.operands[0]) return;
      }
      out_.alias_reads[&op] = op.operands[0];
    });
  }

  // The op of `r` that is or holds a reader of each staged load defined in `r`, last in order.
  void find_anchors(const ir::Region& r) {
    for (const Op& op : r.ops) {
      if (op.body) find_anchors(*op.body);
      for (size_t i = 0; i < mma_.staged.size(); ++i) {
        const StagedLoad& s = mma_.staged[i];
        if (s.copy) continue;   // copied where it stands: no slot to release
        bool in_region = false;
        for (const Op& o : r.ops) in_region |= &o == s.op;
        if (!in_region) continue;
        bool holds = false;
        std::function<void(const Op&)> visit = [&](const Op& o) {
          holds |= std::find(s.readers.begin(), s.readers.end(), &o) != s.readers.end();
          if (o.body)
            for (const Op& inner : o.body->ops) visit(inner);
        };
        visit(op);
        if (holds) anchor_[static_cast<int>(i)] = &op;
      }
    }
  }

  // Completes every pending group up to and including position `last`; records the wait.
  AsyncPlan::Wait complete_through(State& s, int last) {
    AsyncPlan::Wait w;
    if (last < 0) return w;
    w.pending = static_cast<int>(s.pending.size()) - 1 - last;
    for (int i = 0; i <= last; ++i) {
      const Group& g = s.pending[i];
      w.completed.push_back(g.dot);
      for (size_t l = 0; l < mma_.staged.size(); ++l) {
        auto a = anchor_.find(static_cast<int>(l));
        if (a != anchor_.end() && a->second == g.dot) w.releases.push_back({static_cast<int>(l), g.previous});
      }
    }
    s.pending.erase(s.pending.begin(), s.pending.begin() + last + 1);
    for (auto it = s.var_writer.begin(); it != s.var_writer.end();)
      it = s.has(it->second) ? std::next(it) : s.var_writer.erase(it);
    return w;
  }

  int position(const State& s, const Op* dot) const {
    for (size_t i = s.pending.size(); i-- > 0;)
      if (s.pending[i].dot == dot) return static_cast<int>(i);
    return -1;
  }

  // The dots `op` needs complete before it runs.
  std::vector<const Op*> needs(const Op& op, const State& s) const {
    std::vector<const Op*> need;
    auto want = [&](const Op* d) {
      if (d && s.has(d)) need.push_back(d);
    };
    auto writer = [&](int var) {
      auto it = s.var_writer.find(var);
      return it == s.var_writer.end() ? nullptr : it->second;
    };
    for (int v : op.operands) {
      const Op* d = def_[v];
      if (tensor_core(d) && !out_.in_place.count(d)) want(d);
    }
    switch (op.kind) {
      case OpKind::var_read:
        if (!out_.alias_reads.count(&op)) want(writer(op.operands[0]));
        break;
      case OpKind::var_write: {
        const Op* d = def_[op.operands[1]];
        if (!(tensor_core(d) && out_.in_place.count(d))) want(writer(op.operands[0]));
        break;
      }
      case OpKind::dot:
        if (tensor_core(&op)) {
          const MmaDot* md = mma_.dot_of(&op);
          if (md->a.source == MmaOperand::Source::registers || md->b.source == MmaOperand::Source::registers)
            want(&op);   // its register operands' buffers are rewritten: its last group must be done
          // Its A fragments are converted by the threads right before it is issued: a wgmma whose
          // register inputs the threads define while other groups are in flight makes ptxas
          // serialize every wgmma of the kernel (C7513), so those groups complete first.
          if (md->a.source == MmaOperand::Source::fragment && mma_.wgmma())
            for (const Group& g : s.pending) want(g.dot);
          auto ip = out_.in_place.find(&op);
          if (ip != out_.in_place.end() && op.ival == 1) {
            const Op* acc = def_[op.operands[2]];
            const bool alias = acc && out_.alias_reads.count(acc) && out_.alias_reads.at(acc) == ip->second;
            if (!alias) want(writer(ip->second));   // the variable is overwritten with the accumulator
          }
        }
        break;
      default: break;
    }
    return need;
  }

  void clear_records(const ir::Region& r) {
    ir::walk(r, [&](const Op& op, int) {
      out_.before.erase(&op);
      out_.after.erase(&op);
      out_.body_end.erase(&op);
    });
  }

  void run_region(const ir::Region& r, State& s) {
    for (const Op& op : r.ops) {
      std::vector<const Op*> need = needs(op, s);
      int last = -1;
      for (const Op* d : need) last = std::max(last, position(s, d));
      if (last >= 0) out_.before[&op] = complete_through(s, last);
      if (op.kind == OpKind::loop) {
        run_loop(op, s);
      } else if (tensor_core(&op) && mma_.wgmma()) {   // mma.sync completes where it stands
        s.pending.push_back(Group{&op, false});
        auto ip = out_.in_place.find(&op);
        if (ip != out_.in_place.end()) s.var_writer[ip->second] = &op;
      }
    }
  }

  bool reads_slots(const Op* dot) const {
    const MmaDot* d = mma_.dot_of(dot);
    return d && (d->a.source == MmaOperand::Source::staged || d->b.source == MmaOperand::Source::staged);
  }

  void run_loop(const Op& loop, State& s) {
    // Nothing from before the loop stays in flight into it.
    if (!s.pending.empty()) {
      AsyncPlan::Wait w = complete_through(s, static_cast<int>(s.pending.size()) - 1);
      auto& b = out_.before[&loop];
      if (b.pending < 0) b = w;
      else {
        b.pending = 0;
        b.completed.insert(b.completed.end(), w.completed.begin(), w.completed.end());
        b.releases.insert(b.releases.end(), w.releases.begin(), w.releases.end());
      }
    }
    std::vector<Group> carried;
    State end;
    for (int pass = 0; pass < 6; ++pass) {
      clear_records(*loop.body);
      State body;
      for (const Group& g : carried) {
        body.pending.push_back(Group{g.dot, true});
        auto ip = out_.in_place.find(g.dot);
        if (ip != out_.in_place.end()) body.var_writer[ip->second] = g.dot;
      }
      for (const auto& [var, d] : s.var_writer) body.var_writer.emplace(var, d);
      run_region(*loop.body, body);
      // The previous iteration's groups, and this iteration's results that are not variables,
      // complete by the end of the body.
      int last = -1;
      for (size_t i = 0; i < body.pending.size(); ++i)
        if (body.pending[i].previous || !out_.in_place.count(body.pending[i].dot)) last = static_cast<int>(i);
      if (last >= 0) out_.body_end[&loop] = complete_through(body, last);
      std::vector<Group> next = body.pending;
      const bool same = next.size() == carried.size() &&
                        std::equal(next.begin(), next.end(), carried.begin(), [](const Group& a, const Group& b) { return a.dot == b.dot; });
      carried = next;
      end = body;
      if (same) break;
    }
    // At the exit the last iteration's groups are pending. A loop whose dots read staged slots
    // completes them, and releases the slots whose last readers it holds.
    State after = s;
    after.pending.clear();
    for (const Group& g : carried) after.pending.push_back(Group{g.dot, false});
    for (const auto& [var, d] : end.var_writer) after.var_writer[var] = d;
    AsyncPlan::Wait exit;
    const bool slots = std::any_of(carried.begin(), carried.end(), [&](const Group& g) { return reads_slots(g.dot); });
    if (slots) exit = complete_through(after, static_cast<int>(after.pending.size()) - 1);
    for (const auto& [l, a] : anchor_)
      if (a == &loop) exit.releases.push_back({l, false});
    if (!exit.empty()) out_.after[&loop] = exit;
    s = after;
  }
};

}  // namespace

AsyncPlan plan_async(const ir::Function& f, const MmaPlan& mma) {
  AsyncPlan plan;
  if (mma.dots.empty()) return plan;
  Planner(f, mma, plan).run();
  return plan;
}

}  // namespace tj::codegen
