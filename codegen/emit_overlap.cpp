// The CUDA emitter: a loop with its chained dot one iteration late (knob overlap; the plan is
// codegen/overlap_plan.h's). Iteration j of the emitted loop:
//   1. the ops up to the first dot, and its issue (S_j);
//   2. if j is not the first: the late ops of iteration j - 1 (acc *= alpha_{j-1}; the chained
//      dot's issue, O += P_{j-1} . V_{j-1}), from the values carried over the back edge;
//   3. the wait for the first dot only (the chained one stays in flight), the releases of the
//      slots it read, and the rest of the body (the softmax of S_j) while the chained dot runs;
//   4. (the rest's results pinned above it) the wait for the chained dot, the release of its slots, and the carries: the fragment
//      operand converted to A fragments (only now: the in-flight dot read the previous ones), the
//      other carried values copied.
// After the loop, the last iteration's late ops. The async plan's waits inside the body are
// replaced by these; its waits before and after the loop stand.
// Knob overlap 2: the late ops that make the chained dot's accumulator operand (acc * alpha_j)
// run at the end of iteration j instead, right after the wait for the chained dot of j - 1, and
// leave their result in the accumulator variable: no instruction then touches the accumulator's
// registers while the first dot of j + 1 is in flight (ptxas otherwise waits for that dot there,
// warning C7517), as FlashAttention-3 orders its rescale.
#include "codegen/emitter.h"
#include "core/error.h"

namespace tj::codegen::emitter {

std::string Emitter::value_type(int v) {
  const Layout& l = plan_.of(v);
  return l.is_scalar() ? reg_type(f_.type(v).dtype) : tile_type(f_.type(v).dtype, l);
}

void Emitter::emit_late_ops(const Op& loop, const OverlapLoop& o, const std::string& index,
                            const std::function<std::string(int)>& use, const std::set<const Op*>& prep) {
  // The late ops read the loop index, the carried values and their ring slots of the iteration
  // they belong to.
  const std::map<int, std::string> saved_names = [&] {
    std::map<int, std::string> m{{loop.body_index, names_[loop.body_index]}};
    for (int v : o.carried) m[v] = names_[v];
    return m;
  }();
  names_[loop.body_index] = index;
  for (int v : o.carried) names_[v] = fmt::format("tj_c{}", v);
  if (o.fragment >= 0) carried_fragment_[o.chained] = fmt::format("tj_pa{}", o.chained->result);
  for (const Op& op : loop.body->ops)
    if (const StagedLoad* s = mma_.staged_of(&op); s && o.late.count(&op)) use_name_[staged_index(*s)] = use(staged_index(*s));
  const int acc_in = prep.empty() ? -1 : o.chained->operands[2];
  const std::string acc_in_name = acc_in >= 0 ? names_[acc_in] : "";
  if (acc_in >= 0) names_[acc_in] = names_[o.acc_var];   // prepared at the previous iteration's end
  for (const Op& op : loop.body->ops)
    if (o.late.count(&op) && !prep.count(&op)) emit_op(op);
  if (acc_in >= 0) names_[acc_in] = acc_in_name;
  use_name_.clear();
  carried_fragment_.clear();
  for (const auto& [v, n] : saved_names) names_[v] = n;
}

void Emitter::emit_overlapped_loop(const Op& op, const OverlapLoop& o) {
  const std::string idx = fmt::format("v{}", op.body_index);
  names_[op.body_index] = idx;
  const std::string b = ref(op.operands[0]), e = ref(op.operands[1]), step = loop_step(op);
  const int G = mma_.warpgroups;
  const MmaDot& cd = *mma_.dot_of(o.chained);
  // Knob overlap 2: the late ops the chained dot's accumulator operand is made of (not its
  // staged loads), and the carried values only they read (not carried then).
  std::set<const Op*> prep;
  if (rescale_at_end_ && o.chained->ival == 1) {
    std::function<void(int)> add = [&](int v) {
      const Op* d = v >= 0 ? def_[v] : nullptr;
      if (!d || !o.late.count(d) || mma_.staged_of(d) || prep.count(d)) return;
      prep.insert(d);
      for (int x : d->operands) add(x);
    };
    add(o.chained->operands[2]);
  }
  std::vector<int> carried;
  for (int v : o.carried) {
    bool used = false;
    for (const Op* x : o.late)
      if (!prep.count(x))
        for (int a : x->operands) used = used || a == v;
    if (used || prep.empty()) carried.push_back(v);
  }
  line(fmt::format("// knob overlap: the dot at line {} and the {} op(s) that only feed it run one iteration late, while "
                   "the next iteration's work after its first dot (line {}) runs",
                   o.chained->loc.line, o.late.size() - 1, o.first->loc.line),
       &op.loc);
  const std::string last = fmt::format("tj_i{}", op.body_index);
  line(fmt::format("long long {} = {};   // the index of the iteration whose late ops run next", last, b));
  std::string frags;
  if (o.fragment >= 0) {
    frags = fmt::format("tj_pa{}", o.chained->result);
    line(fmt::format("unsigned {}[{}];   // the late dot's A fragments, carried", frags, a_frag_regs(cd)));
  }
  for (int v : carried) line(fmt::format("{} tj_c{};   // carried to the late ops", value_type(v), v));
  const bool turns = wg_turns_ && G >= 2;
  if (turns) {
    // Only the first dot takes turns: the late ops may hold a block barrier (a staged tile's k
    // tail zeroed), which a warpgroup must not reach while it holds the turn.
    turns_[o.first] = Turn{&op, true};
    line(fmt::format("if ({} < {}) tj::dev::Turns<{}>::start();   // warpgroup 0 issues first", b, e, G), &op.loc);
  }
  line(fmt::format("for (long long {0} = {1}; {0} < {2}; {0} += {3}) {{", idx, b, e, step), &op.loc);
  ++indent_;
  emit_ring_iteration(op);
  // The releases the async plan makes inside the body, of the slots the first dot's side reads:
  // once the first dot is complete. (The late loads' slots: once the chained dot is.)
  AsyncPlan::Wait early, late;
  auto collect = [&](const AsyncPlan::Wait& w) {
    for (const AsyncPlan::Release& r : w.releases) {
      const StagedLoad& s = mma_.staged[r.staged];
      if (s.home == &op && !o.late.count(s.op)) early.releases.push_back(r);
    }
  };
  for (const Op& x : op.body->ops) {
    if (auto w = async_.before.find(&x); w != async_.before.end()) collect(w->second);
    if (auto w = async_.after.find(&x); w != async_.after.end()) collect(w->second);
  }
  if (auto w = async_.body_end.find(&op); w != async_.body_end.end()) collect(w->second);
  for (const Op& x : op.body->ops)
    if (const StagedLoad* s = mma_.staged_of(&x); s && o.late.count(&x))
      late.releases.push_back(AsyncPlan::Release{staged_index(*s), true});

  suppress_async_ = true;
  bool head = true;
  for (const Op& x : op.body->ops) {
    if (o.late.count(&x)) continue;
    emit_op(x);
    if (&x != o.first) continue;
    head = false;
    line(fmt::format("if ({} != {}) {{   // the late ops of the previous iteration", idx, b));
    ++indent_;
    emit_late_ops(op, o, last, [](int i) { return fmt::format("(tj_u{} - 1u)", i); }, prep);
    --indent_;
    line("}");
    line(fmt::format("if ({} != {}) tj::dev::wgmma_wait<1>(); else tj::dev::wgmma_wait<0>();   // the first dot is complete",
                     idx, b));
    line(fmt::format("tj::dev::fence_tile({});", dot_dest(*o.first)));
    emit_wait(early, nullptr);
    since_wait_.clear();   // the rest of the body, pinned above the late dot's wait
  }
  suppress_async_ = false;
  if (head) throw Error(fmt::format("internal error: kernel '{}': knob overlap lost the first dot at {}", f_.name, o.first->loc.str()));
  // The rest of the body's results stay above the wait, so that they overlap the late dot
  // (knob pin_waits; otherwise ptxas sinks their instructions below it).
  emit_pin();
  line("tj::dev::wgmma_wait<0>();   // the late dot is complete");
  line(fmt::format("tj::dev::fence_tile({});", dot_dest(*o.chained)));
  if (!frags.empty()) line(fmt::format("tj::dev::fence_frags({});", frags));
  emit_wait(late, nullptr);
  // The carries, for the next iteration's late ops.
  if (!frags.empty()) emit_a_frags(*o.chained, cd, frags);
  if (!prep.empty()) {
    line("// knob overlap 2: the next late dot's accumulator, prepared now (no dot in flight)");
    for (const Op& x : op.body->ops)
      if (prep.count(&x)) emit_op(x);
    line(fmt::format("{} = {};", names_[o.acc_var], ref(o.chained->operands[2])));
  }
  for (int v : carried) line(fmt::format("tj_c{} = {};", v, ref(v)));
  line(fmt::format("{} = {};", last, idx));
  --indent_;
  line("}");
  since_wait_.clear();
  line(fmt::format("if ({} < {}) {{   // the last iteration's late ops", b, e));
  ++indent_;
  emit_late_ops(op, o, last, [](int i) { return fmt::format("(tj_use{} - 1u)", i); }, prep);
  line("tj::dev::wgmma_wait<0>();");
  line(fmt::format("tj::dev::fence_tile({});", dot_dest(*o.chained)));
  --indent_;
  line("}");
  since_wait_.clear();
}

}  // namespace tj::codegen::emitter
