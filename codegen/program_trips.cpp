#include "codegen/program_trips.h"

#include <algorithm>
#include <functional>
#include <map>

#include "dsl/static_extents.h"

namespace tj::codegen {

namespace {

// Integer scalars of static value under config c: constants, static tensor dims, block sizes, and
// integer arithmetic on those (ir::fold_binary); launch loop indices at the values `at` gives (begin or end - 1 of their
// loop: a tile loop's `end()`, min(start + block, end), is then its start + block or the loop's end).
class StaticScalars {
 public:
  enum class At { nothing, first, last };
  StaticScalars(const ir::Function& f, const Config& c) : f_(f), c_(c) {
    ir::walk(f.body, [&](const ir::Op& op, int) {
      if (op.result >= 0) def_[op.result] = &op;
      if (op.kind == ir::OpKind::loop && op.launch) launch_[op.body_index] = &op;
    });
  }
  // Launch loop indices at their first or last value, each (`only`: that one loop; the others at `rest`).
  void set(At all) { at_all_ = all, only_ = nullptr; }
  void set(const ir::Op* only, At at, At rest) { only_ = only, at_only_ = at, at_all_ = rest; }

  std::optional<int64_t> value(int v, int depth = 0) const {
    if (depth > 24) return std::nullopt;
    if (auto l = launch_.find(v); l != launch_.end()) {
      const At at = l->second == only_ ? at_only_ : at_all_;
      if (at == At::nothing) return std::nullopt;
      const auto b = value(l->second->operands[at == At::first ? 0 : 1], depth + 1);
      return b ? std::optional<int64_t>(at == At::first ? *b : *b - 1) : std::nullopt;
    }
    auto it = def_.find(v);
    if (it == def_.end()) return std::nullopt;
    const ir::Op& d = *it->second;
    switch (d.kind) {
      case ir::OpKind::const_value:
        if (is_int(f_.type(v).dtype)) return d.ival;
        return std::nullopt;
      case ir::OpKind::tensor_dim: {
        const int64_t s = f_.params.at(d.param).static_shape.at(d.axis);
        return s >= 0 ? std::optional<int64_t>(s) : std::nullopt;
      }
      case ir::OpKind::block_size: return c_.block(f_, d.block_id);
      case ir::OpKind::binary: {
        const auto a = value(d.operands[0], depth + 1), b = value(d.operands[1], depth + 1);
        if (!a || !b) return std::nullopt;
        return ir::fold_binary(d.binary, *a, *b);
      }
      default: return std::nullopt;
    }
  }

  // A loop's trip count, where its bounds are known.
  std::optional<int64_t> trips(const ir::Op& loop) const {
    const auto b = value(loop.operands[0]), e = value(loop.operands[1]);
    if (!b || !e) return std::nullopt;
    const int64_t step = loop.loop_kind == ir::LoopKind::tile ? c_.block(f_, loop.block_id) : 1;
    return std::max<int64_t>(0, (*e - *b + step - 1) / step);
  }

  // The most iterations of a loop inside the program, and their sum.
  struct Work {
    int64_t most = 0, total = 0;
  };
  std::optional<Work> work() const {
    Work w;
    bool known = true;
    ir::walk(f_.body, [&](const ir::Op& op, int) {
      if (op.kind != ir::OpKind::loop || op.launch || !known) return;
      const auto n = trips(op);
      if (!n) known = false;
      else w.most = std::max(w.most, *n), w.total += *n;
    });
    return known ? std::optional<Work>(w) : std::nullopt;
  }

 private:
  const ir::Function& f_;
  const Config& c_;
  std::map<int, const ir::Op*> def_;
  std::map<int, const ir::Op*> launch_;   // by the index value they define
  At at_all_ = At::nothing, at_only_ = At::nothing;
  const ir::Op* only_ = nullptr;
};

}  // namespace

std::optional<int64_t> static_programs(const ir::Function& f, const Config& c) {
  StaticScalars s(f, c);
  int64_t programs = 1;
  bool known = true;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind != ir::OpKind::loop || !op.launch || !known) return;
    const auto n = s.trips(op);
    if (!n) known = false;
    else programs *= *n;
  });
  return known ? std::optional<int64_t>(programs) : std::nullopt;
}

std::optional<int64_t> longest_program_trips(const ir::Function& f, const Config& c) {
  StaticScalars s(f, c);
  std::optional<int64_t> most;
  for (auto at : {StaticScalars::At::first, StaticScalars::At::last}) {
    s.set(at);
    const auto w = s.work();
    if (!w) return std::nullopt;
    most = std::max(most.value_or(0), w->most);
  }
  return most;
}

int trip_trend(const ir::Function& f, const Config& c, const ir::Op& launch) {
  std::map<int, const ir::Op*> def;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.result >= 0) def[op.result] = &op;
  });
  std::function<bool(int, int)> depends = [&](int v, int depth) {
    if (v == launch.body_index) return true;
    auto it = def.find(v);
    if (it == def.end() || depth > 64) return false;
    for (int o : it->second->operands)
      if (depends(o, depth + 1)) return true;
    return false;
  };
  bool begins = false, ends = false;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind != ir::OpKind::loop || op.launch) return;
    begins = begins || depends(op.operands[0], 0);
    ends = ends || depends(op.operands[1], 0);
  });
  if (!begins && !ends) return 0;
  StaticScalars s(f, c);
  s.set(&launch, StaticScalars::At::first, StaticScalars::At::first);
  const auto first = s.work();
  s.set(&launch, StaticScalars::At::last, StaticScalars::At::first);
  const auto last = s.work();
  if (first && last && first->total != last->total) return last->total > first->total ? 1 : -1;
  return begins && !ends ? -1 : 1;
}

}  // namespace tj::codegen
