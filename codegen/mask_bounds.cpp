#include "codegen/mask_bounds.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace tj::codegen {

namespace {

using ir::BinaryFn;
using ir::Op;
using ir::OpKind;
using ir::UnaryFn;

// Past any index: a threshold that keeps every tile (or none).
constexpr int64_t kFar = int64_t(1) << 60;

// coef * i + sum of k * scalar + constant: an integer in terms of the loop index i and of scalars
// defined outside the loop (the terms, by value id).
struct Affine {
  int64_t coef = 0, constant = 0;
  std::map<int, int64_t> terms;

  static Affine of(int64_t c) {
    Affine a;
    a.constant = c;
    return a;
  }
  static Affine index() {
    Affine a;
    a.coef = 1;
    return a;
  }
  static Affine term(int v) {
    Affine a;
    a.terms[v] = 1;
    return a;
  }
  Affine scaled(int64_t k) const {
    Affine a;
    if (k == 0) return a;
    a.coef = coef * k;
    a.constant = constant * k;
    for (const auto& [v, c] : terms) a.terms[v] = c * k;
    return a;
  }
  Affine operator+(const Affine& o) const {
    Affine a = *this;
    a.coef += o.coef;
    a.constant += o.constant;
    for (const auto& [v, c] : o.terms)
      if ((a.terms[v] += c) == 0) a.terms.erase(v);
    return a;
  }
  Affine operator-(const Affine& o) const { return *this + o.scaled(-1); }
  Affine operator+(int64_t c) const { return *this + of(c); }
  // this - o where that is a constant.
  std::optional<int64_t> minus(const Affine& o) const {
    const Affine d = *this - o;
    if (d.coef != 0 || !d.terms.empty()) return std::nullopt;
    return d.constant;
  }
};

// The values an integer tile takes over one iteration's tile, bounded below and above.
struct Interval {
  Affine lo, hi;
  int64_t div = 0;   // > 0: the values are floordiv(lo .. hi, div), lo and hi in terms of the index
};


// A threshold on the loop index, free of it: -inf, +inf, an affine, or max / min / a select of
// those (select: args[0] where `value` > 0, else args[1]).
struct Bound {
  enum class Kind : uint8_t { below, above, affine, max, min, select };
  Kind kind = Kind::below;
  Affine value;
  std::vector<Bound> args;
};
Bound below() { return {}; }
Bound above() { return {Bound::Kind::above, {}, {}}; }
Bound affine(Affine a) { return {Bound::Kind::affine, std::move(a), {}}; }

Bound bmax(Bound x, Bound y) {
  if (x.kind == Bound::Kind::below) return y;
  if (y.kind == Bound::Kind::below) return x;
  if (x.kind == Bound::Kind::above || y.kind == Bound::Kind::above) return above();
  if (x.kind == Bound::Kind::affine && y.kind == Bound::Kind::affine)
    if (auto d = x.value.minus(y.value)) return *d >= 0 ? x : y;
  return {Bound::Kind::max, {}, {std::move(x), std::move(y)}};
}
Bound bmin(Bound x, Bound y) {
  if (x.kind == Bound::Kind::above) return y;
  if (y.kind == Bound::Kind::above) return x;
  if (x.kind == Bound::Kind::below || y.kind == Bound::Kind::below) return below();
  if (x.kind == Bound::Kind::affine && y.kind == Bound::Kind::affine)
    if (auto d = x.value.minus(y.value)) return *d <= 0 ? x : y;
  return {Bound::Kind::min, {}, {std::move(x), std::move(y)}};
}
// `positive` where cond > 0, else `otherwise` (cond free of the index).
Bound select(const Affine& cond, Bound positive, Bound otherwise) {
  if (cond.terms.empty()) return cond.constant > 0 ? positive : otherwise;
  return {Bound::Kind::select, cond, {std::move(positive), std::move(otherwise)}};
}

// Whether bound <= x (bound >= x) for every value of the terms.
bool at_most(const Bound& b, const Affine& x) {
  switch (b.kind) {
    case Bound::Kind::below: return true;
    case Bound::Kind::above: return false;
    case Bound::Kind::affine: {
      const auto d = b.value.minus(x);
      return d && *d <= 0;
    }
    case Bound::Kind::max:
    case Bound::Kind::select: return at_most(b.args[0], x) && at_most(b.args[1], x);
    case Bound::Kind::min: return at_most(b.args[0], x) || at_most(b.args[1], x);
  }
  return false;
}
bool at_least(const Bound& b, const Affine& x) {
  switch (b.kind) {
    case Bound::Kind::below: return false;
    case Bound::Kind::above: return true;
    case Bound::Kind::affine: {
      const auto d = b.value.minus(x);
      return d && *d >= 0;
    }
    case Bound::Kind::min:
    case Bound::Kind::select: return at_least(b.args[0], x) && at_least(b.args[1], x);
    case Bound::Kind::max: return at_least(b.args[0], x) || at_least(b.args[1], x);
  }
  return false;
}

// A set of loop indices that contains {i < a} and {i > b} (and maybe more): the indices whose
// whole tile a mask is known to fail (or hold) on, as two tails.
struct Tails {
  Bound a = below(), b = above();
};
Tails unite(Tails x, Tails y) { return {bmax(std::move(x.a), std::move(y.a)), bmin(std::move(x.b), std::move(y.b))}; }
Tails meet(Tails x, Tails y) { return {bmin(std::move(x.a), std::move(y.a)), bmax(std::move(x.b), std::move(y.b))}; }

// The indices where d > 0, for d of index coefficient 0 or +-1 (others: none known).
Tails positive(const Affine& d) {
  Affine rest = d;
  rest.coef = 0;
  // Every index ({i < +inf} and {i > -inf}), or none: both tails, so that meeting it with a tail
  // gives that tail or nothing.
  if (d.coef == 0) return {select(rest, above(), below()), select(rest, below(), above())};
  if (d.coef == 1) return {below(), affine(rest.scaled(-1))};          // i + r > 0: i > -r
  if (d.coef == -1) return {affine(rest), above()};                     // r - i > 0: i < r
  return {};
}

// One side of a comparison: an affine, or (div > 0) floordiv of one.
struct Side {
  Affine a;
  int64_t div = 0;
};
// The indices where x < y (x <= y), as "d > 0": floordiv(P, c) < y is P < c y, and x < floordiv(Q,
// c) is c (x + 1) <= Q, for integers and c > 0.
Tails lt(const Side& x, const Side& y) {
  if (x.div && y.div) return {};
  if (x.div) return positive(y.a.scaled(x.div) - x.a);
  if (y.div) return positive(y.a - (x.a + 1).scaled(y.div) + 1);
  return positive(y.a - x.a);
}
Tails le(const Side& x, const Side& y) {
  if (x.div && y.div) return {};
  if (x.div) return positive((y.a + 1).scaled(x.div) - x.a);
  if (y.div) return positive(y.a - x.a.scaled(y.div) + 1);
  return positive(y.a - x.a + 1);
}

// Where a boolean tile fails (holds) on the whole tile.
struct Truth {
  Tails fails, holds;
};

// What an op's value is, given that the masked tile is -inf: a constant, or a variable's value at
// the start of the iteration.
struct Fact {
  enum class Kind : uint8_t { unknown, neg_inf, zero, one, same };
  Kind kind = Kind::unknown;
  int var = -1;
  bool operator==(const Fact&) const = default;
};

class Bounder {
 public:
  Bounder(ir::Function& f, const Config& c) : f_(f), c_(c) {
    def_.assign(f.values.size(), nullptr);
    ir::walk(f.body, [&](const Op& op, int) {
      if (op.result >= 0) def_[op.result] = &op;
    });
  }

  // Plans every loop of r and of the regions inside it, then rewrites them (from the back).
  int run(ir::Region& r) {
    plan(r);
    std::sort(plans_.begin(), plans_.end(), [](const Plan& x, const Plan& y) { return x.at > y.at; });
    for (Plan& p : plans_) {
      Op& loop = p.region->ops[p.at];
      loop.operands[0] = p.begin;
      loop.operands[1] = p.end;
      p.region->ops.insert(p.region->ops.begin() + static_cast<long>(p.at), std::make_move_iterator(p.head.begin()),
                           std::make_move_iterator(p.head.end()));
    }
    return static_cast<int>(plans_.size());
  }

 private:
  struct Plan {
    ir::Region* region;
    size_t at;               // the loop's position in region->ops
    std::vector<Op> head;    // the bounds' ops, to go before it
    int begin, end;
  };

  void plan(ir::Region& r) {
    for (size_t p = 0; p < r.ops.size(); ++p) {
      Op& op = r.ops[p];
      if (!op.body) continue;
      plan(*op.body);
      if (op.kind == OpKind::loop && !op.launch && op.loop_kind == ir::LoopKind::tile) plan_loop(r, p);
    }
  }

  void plan_loop(ir::Region& r, size_t p) {
    const Op& loop = r.ops[p];
    loop_ = &loop;
    inside_.clear();
    hoisted_.clear();
    quotient_values_.clear();
    ir::walk(*loop.body, [&](const Op& op, int) {
      if (op.result >= 0) inside_.insert(op.result);
      if (op.body) inside_.insert(op.body_index);
    });
    // The tiles that some mask rules out and that change nothing.
    Tails skip;
    bool any = false;
    for (const Op& op : loop.body->ops) {
      if (op.kind != OpKind::where) continue;
      const bool fails = negative_infinity(op.operands[2]), holds = negative_infinity(op.operands[1]);
      if (fails == holds || !neutral(loop, op.result)) continue;
      const Truth t = truth(op.operands[0], 0);
      skip = unite(std::move(skip), fails ? t.fails : t.holds);
      if (!any) loc_ = def_.at(op.operands[0]) ? def_.at(op.operands[0])->loc : op.loc;   // the mask's line, for the markers
      any = true;
    }
    if (!any) return;
    const std::optional<Affine> b0 = scalar(loop.operands[0]);
    const bool lower = !(b0 && at_most(skip.a, *b0)) && !at_most_any(skip.a, loop.operands[0], BinaryFn::maximum),
               upper = skip.b.kind != Bound::Kind::above && !at_least_end(skip.b, loop.operands[1]);
    if (!lower && !upper) return;
    Plan plan{&r, p, {}, loop.operands[0], loop.operands[1]};
    head_ = &plan.head;
    region_ = r.id;
    // Let B be the block, b and e the bounds: the first kept tile b + ceil((max(a, b) - b) / B) B,
    // the end of the last, b + (floor((b' - b) / B) + 1) B, where a and b' are the skipped tails.
    const int block = emit_op(OpKind::block_size, {}, i64(), [&](Op& o) { o.block_id = loop.block_id; });
    if (lower) {
      const int from = bin(BinaryFn::maximum, emit(skip.a), plan.begin);
      const int ahead = bin(BinaryFn::add, bin(BinaryFn::sub, from, plan.begin), bin(BinaryFn::sub, block, constant(1)));
      const int tiles = bin(BinaryFn::floordiv, ahead, block);
      plan.begin = bin(BinaryFn::add, plan.begin, bin(BinaryFn::mul, tiles, block));
    }
    if (upper) {
      const int last = bin(BinaryFn::floordiv, bin(BinaryFn::sub, emit(skip.b), loop.operands[0]), block);
      const int stop = bin(BinaryFn::add, loop.operands[0], bin(BinaryFn::mul, bin(BinaryFn::add, last, constant(1)), block));
      plan.end = bin(BinaryFn::maximum, plan.begin, bin(BinaryFn::minimum, loop.operands[1], stop));
    }
    plans_.push_back(std::move(plan));
  }

  // Whether b <= some lower bound of the scalar v that `through` (maximum) makes: v = max(x, y) >= x.
  bool at_most_any(const Bound& b, int v, BinaryFn through) const {
    const Op* d = def_.at(v);
    if (!d || d->kind != OpKind::binary || d->binary != through) return false;
    for (int o : d->operands) {
      const auto a = scalar(o);
      if ((a && at_most(b, *a)) || at_most_any(b, o, through)) return true;
    }
    return false;
  }
  // Whether b >= e - 1 for the loop's end e (through minimum: e = min(x, y) <= x).
  bool at_least_end(const Bound& b, int e) const {
    if (const auto a = scalar(e); a && at_least(b, *a + -1)) return true;
    const Op* d = def_.at(e);
    if (!d || d->kind != OpKind::binary || d->binary != BinaryFn::minimum) return false;
    return at_least_end(b, d->operands[0]) || at_least_end(b, d->operands[1]);
  }

  // ---- the mask: intervals of its integer tiles, where it fails and holds -------------------------

  std::optional<int64_t> constant_int(int v) const {
    const Op* d = def_.at(v);
    if (!d) return std::nullopt;
    if (d->kind == OpKind::broadcast || d->kind == OpKind::expand_dims || (d->kind == OpKind::cast && is_int(f_.type(v).dtype)))
      return constant_int(d->operands[0]);
    if (d->kind == OpKind::const_value && is_int(f_.type(v).dtype)) return d->ival;
    return std::nullopt;
  }

  // A scalar integer as an affine (lo == hi).
  std::optional<Affine> scalar(int v) const {
    const auto i = interval(v, 0);
    if (!i || !f_.type(v).is_scalar()) return std::nullopt;
    return i->lo;
  }

  std::optional<Interval> interval(int v, int depth) const {
    if (depth > 32 || !is_int(f_.type(v).dtype)) return std::nullopt;
    if (v == loop_->body_index) return Interval{Affine::index(), Affine::index()};
    const Op* d = def_.at(v);
    const bool scalar = f_.type(v).is_scalar();
    // A scalar defined outside the loop, or an input's element the loop loads at indices defined
    // outside it (a prefix length per batch entry): the same in every iteration.
    auto leaf = [&]() -> std::optional<Interval> {
      if (!scalar || !invariant(v, 0)) return std::nullopt;
      return Interval{Affine::term(v), Affine::term(v)};
    };
    if (!d) return leaf();
    switch (d->kind) {
      case OpKind::const_value: return Interval{Affine::of(d->ival), Affine::of(d->ival)};
      case OpKind::block_size: {
        const int64_t size = c_.block(f_, d->block_id);
        return Interval{Affine::of(size), Affine::of(size)};
      }
      case OpKind::arange: {
        const auto s = interval(d->operands[0], depth + 1);
        if (!s || s->div) return std::nullopt;
        return Interval{s->lo, s->hi + (c_.block(f_, d->block_id) - 1)};
      }
      case OpKind::expand_dims:
      case OpKind::broadcast: return interval(d->operands[0], depth + 1);
      case OpKind::cast: {
        if (!is_int(f_.type(d->operands[0]).dtype)) return leaf();
        return interval(d->operands[0], depth + 1);
      }
      case OpKind::unary: {
        if (d->unary != UnaryFn::neg) return leaf();
        const auto x = interval(d->operands[0], depth + 1);
        if (!x || x->div) return leaf();
        return Interval{x->hi.scaled(-1), x->lo.scaled(-1)};
      }
      case OpKind::binary: {
        if (d->binary == BinaryFn::mul) {
          for (int side = 0; side < 2; ++side) {
            const auto k = constant_int(d->operands[side]);
            if (!k) continue;
            const auto x = interval(d->operands[1 - side], depth + 1);
            if (!x || x->div) return leaf();
            return *k >= 0 ? Interval{x->lo.scaled(*k), x->hi.scaled(*k)} : Interval{x->hi.scaled(*k), x->lo.scaled(*k)};
          }
          return leaf();
        }
        if (d->binary == BinaryFn::floordiv) {
          // floordiv by a positive constant is monotone: [lo // c, hi // c]. Free of the index, the
          // bounds are new terms; with it, the comparisons solve them (lt / le).
          const auto k = constant_int(d->operands[1]);
          const auto x = k && *k > 0 ? interval(d->operands[0], depth + 1) : std::nullopt;
          if (!x || x->div) return leaf();
          if (x->lo.coef == 0 && x->hi.coef == 0) return Interval{Affine::term(quotient(x->lo, *k)), Affine::term(quotient(x->hi, *k))};
          return Interval{x->lo, x->hi, *k};
        }
        if (d->binary != BinaryFn::add && d->binary != BinaryFn::sub) return leaf();
        const auto x = interval(d->operands[0], depth + 1), y = interval(d->operands[1], depth + 1);
        if (!x || !y || x->div || y->div) return leaf();
        if (d->binary == BinaryFn::add) return Interval{x->lo + y->lo, x->hi + y->hi};
        return Interval{x->lo - y->hi, x->hi - y->lo};
      }
      default: return leaf();
    }
  }

  // A term for floordiv(x, c) of an affine free of the loop index: its key (negative, into
  // quotients_; the same x and c, the same key).
  int quotient(const Affine& x, int64_t c) const {
    for (size_t i = 0; i < quotients_.size(); ++i)
      if (quotients_[i].second == c && quotients_[i].first.minus(x) == std::optional<int64_t>(0)) return -static_cast<int>(i) - 1;
    quotients_.emplace_back(x, c);
    return -static_cast<int>(quotients_.size());
  }

  // A scalar the same in every iteration: defined outside the loop, or inside it from such scalars
  // and constants, or an input's element loaded at such indices (the loop writes no input).
  bool invariant(int v, int depth) const {
    if (v == loop_->body_index) return false;
    if (!inside_.count(v)) return true;
    const Op* d = def_.at(v);
    if (!d || depth > 16 || !f_.type(v).is_scalar()) return false;
    switch (d->kind) {
      case OpKind::const_value:
      case OpKind::block_size:
      case OpKind::tensor_dim:
      case OpKind::scalar_param: return true;
      case OpKind::load:
        if (f_.params.at(d->param).kind != ir::ParamKind::tensor_in) return false;
        break;
      case OpKind::cast:
      case OpKind::unary:
      case OpKind::binary: break;
      default: return false;
    }
    return std::all_of(d->operands.begin(), d->operands.end(), [&](int o) { return invariant(o, depth + 1); });
  }

  Truth truth(int v, int depth) const {
    const Op* d = def_.at(v);
    if (depth > 32 || !d || f_.type(v).dtype != DType::i1) return {};
    switch (d->kind) {
      case OpKind::broadcast:
      case OpKind::expand_dims: return truth(d->operands[0], depth + 1);
      case OpKind::unary:
        if (d->unary == UnaryFn::logical_not) {
          Truth t = truth(d->operands[0], depth + 1);
          return {std::move(t.holds), std::move(t.fails)};
        }
        return {};
      case OpKind::binary: break;
      default: return {};
    }
    if (d->binary == BinaryFn::logical_and || d->binary == BinaryFn::logical_or) {
      Truth x = truth(d->operands[0], depth + 1), y = truth(d->operands[1], depth + 1);
      if (d->binary == BinaryFn::logical_and) return {unite(std::move(x.fails), std::move(y.fails)), meet(std::move(x.holds), std::move(y.holds))};
      return {meet(std::move(x.fails), std::move(y.fails)), unite(std::move(x.holds), std::move(y.holds))};
    }
    if ((d->binary == BinaryFn::eq || d->binary == BinaryFn::ne) && f_.type(d->operands[0]).dtype == DType::i1) {
      // Booleans: x == y fails where one holds and the other fails (documents: (q < boundary) ==
      // (kv < boundary), the boundary on one side of the key tile and the query tile).
      Truth x = truth(d->operands[0], depth + 1), y = truth(d->operands[1], depth + 1);
      Tails differ = unite(meet(x.holds, y.fails), meet(x.fails, y.holds));
      Tails same = unite(meet(x.holds, y.holds), meet(x.fails, y.fails));
      if (d->binary == BinaryFn::eq) return {std::move(differ), std::move(same)};
      return {std::move(same), std::move(differ)};
    }
    const auto x = interval(d->operands[0], depth + 1), y = interval(d->operands[1], depth + 1);
    if (!x || !y) return {};
    // x < y on the whole tile: x.hi < y.lo; x >= y: x.lo >= y.hi, that is y.hi <= x.lo.
    auto lo = [](const Interval& i) { return Side{i.lo, i.div}; };
    auto hi = [](const Interval& i) { return Side{i.hi, i.div}; };
    auto less = [&](const Interval& a, const Interval& b) { return Truth{le(hi(b), lo(a)), lt(hi(a), lo(b))}; };
    auto less_equal = [&](const Interval& a, const Interval& b) { return Truth{lt(hi(b), lo(a)), le(hi(a), lo(b))}; };
    switch (d->binary) {
      case BinaryFn::lt: return less(*x, *y);
      case BinaryFn::le: return less_equal(*x, *y);
      case BinaryFn::gt: return less(*y, *x);
      case BinaryFn::ge: return less_equal(*y, *x);
      case BinaryFn::eq: return {unite(lt(hi(*x), lo(*y)), lt(hi(*y), lo(*x))), {}};
      case BinaryFn::ne: return {{}, unite(lt(hi(*x), lo(*y)), lt(hi(*y), lo(*x)))};
      default: return {};
    }
  }

  // ---- whether an iteration whose masked tile is -inf changes nothing -----------------------------

  // A constant tile or scalar's fact (-inf, 0, 1), through broadcasts.
  Fact constant_fact(int v) const {
    const Op* d = def_.at(v);
    if (!d) return {};
    if (d->kind == OpKind::broadcast || d->kind == OpKind::expand_dims) return constant_fact(d->operands[0]);
    const DType t = f_.type(v).dtype;
    double x;
    if (d->kind == OpKind::const_value) x = is_int(t) ? static_cast<double>(d->ival) : d->fval;
    else if (d->kind == OpKind::full) x = d->fval;
    else return {};
    if (is_float(t) && x == -INFINITY) return {Fact::Kind::neg_inf};
    if (x == 0) return {Fact::Kind::zero};
    if (x == 1) return {Fact::Kind::one};
    return {};
  }
  bool negative_infinity(int v) const { return constant_fact(v).kind == Fact::Kind::neg_inf; }
  bool positive_constant(int v) const {
    const Op* d = def_.at(v);
    while (d && (d->kind == OpKind::broadcast || d->kind == OpKind::expand_dims)) d = def_.at(d->operands[0]);
    if (!d) return false;
    if (d->kind == OpKind::const_value) return is_int(f_.type(d->result).dtype) ? d->ival > 0 : d->fval > 0;
    return d->kind == OpKind::full && d->fval > 0;
  }

  bool neutral(const Op& loop, int seed) const {
    using K = Fact::Kind;
    std::map<int, Fact> facts;
    std::set<int> changed;   // variables declared outside the loop that the iteration may change
    auto of = [&](int v) {
      auto it = facts.find(v);
      return it != facts.end() ? it->second : constant_fact(v);
    };
    auto outside = [&](int var) { return !inside_.count(var); };
    for (const Op& op : loop.body->ops) {
      if (op.body) return false;   // a loop inside: its effects are not followed
      Fact r;
      const auto a = [&] { return of(op.operands[0]); };
      const auto b = [&] { return of(op.operands[1]); };
      switch (op.kind) {
        case OpKind::store: return false;
        case OpKind::store_add: {
          size_t value = 0;
          for (const ir::Index& ix : op.indices) value += ix.kind != ir::Index::Kind::all;
          if (of(op.operands.at(value)).kind != K::zero) return false;
          continue;
        }
        case OpKind::var_write:
          if (outside(op.operands[0]) && !(of(op.operands[1]) == Fact{K::same, op.operands[0]})) changed.insert(op.operands[0]);
          continue;
        case OpKind::var_read:
          if (outside(op.operands[0]) && !changed.count(op.operands[0])) r = {K::same, op.operands[0]};
          break;
        case OpKind::where:
          if (op.result == seed) r = {K::neg_inf};
          else if (of(op.operands[1]) == of(op.operands[2])) r = of(op.operands[1]);
          break;
        case OpKind::broadcast:
        case OpKind::expand_dims:
        case OpKind::transpose: r = a(); break;
        case OpKind::cast: {
          const DType to = f_.type(op.result).dtype;
          const Fact x = a();
          if (x.kind == K::zero || x.kind == K::one) r = x;
          else if (x.kind == K::neg_inf && is_float(to) && to != DType::e4m3) r = x;   // e4m3 has no infinity
          break;
        }
        case OpKind::unary: {
          const Fact x = a();
          if (op.unary == UnaryFn::exp2 || op.unary == UnaryFn::exp) {
            if (x.kind == K::neg_inf) r = {K::zero};
            else if (x.kind == K::zero) r = {K::one};
          } else if (x.kind == K::zero && (op.unary == UnaryFn::neg || op.unary == UnaryFn::abs || op.unary == UnaryFn::tanh ||
                                           op.unary == UnaryFn::sqrt)) {
            r = x;
          }
          break;
        }
        case OpKind::binary: r = binary(op, a(), b()); break;
        case OpKind::reduce: {
          const Fact x = a();
          if (x.kind == K::zero || (x.kind == K::neg_inf && op.reduce != ir::ReduceFn::sum)) r = x;
          break;
        }
        case OpKind::dot: {
          const Fact x = a(), y = b();
          if ((x.kind == K::zero && y.kind != K::neg_inf) || (y.kind == K::zero && x.kind != K::neg_inf)) {
            const bool acc = op.operands.size() == 3 || op.operands.size() == 5;
            r = acc ? of(op.operands[2]) : Fact{K::zero};
          }
          break;
        }
        default: break;
      }
      if (op.result >= 0 && r.kind != K::unknown) facts[op.result] = r;
    }
    return changed.empty();
  }

  Fact binary(const Op& op, const Fact& x, const Fact& y) const {
    using K = Fact::Kind;
    switch (op.binary) {
      case BinaryFn::add:
        if (x.kind == K::zero) return y;
        if (y.kind == K::zero) return x;
        if (x.kind == K::neg_inf || y.kind == K::neg_inf) return {K::neg_inf};   // plus a finite value
        return {};
      case BinaryFn::sub:
        if (y.kind == K::zero) return x;
        if (x.kind == K::neg_inf && y.kind != K::neg_inf) return {K::neg_inf};
        if (x.kind == K::same && x == y) return {K::zero};
        return {};
      case BinaryFn::mul:
        if ((x.kind == K::zero && y.kind != K::neg_inf) || (y.kind == K::zero && x.kind != K::neg_inf)) return {K::zero};
        if (x.kind == K::one) return y;
        if (y.kind == K::one) return x;
        if ((x.kind == K::neg_inf && positive_constant(op.operands[1])) || (y.kind == K::neg_inf && positive_constant(op.operands[0])))
          return {K::neg_inf};
        return {};
      case BinaryFn::div:
        if (x.kind == K::zero && y.kind != K::zero) return x;
        if (y.kind == K::one) return x;
        return {};
      case BinaryFn::maximum:
        if (x.kind == K::neg_inf) return y;
        if (y.kind == K::neg_inf) return x;
        return x == y ? x : Fact{};
      case BinaryFn::minimum:
        if (x.kind == K::neg_inf || y.kind == K::neg_inf) return {K::neg_inf};
        return x == y ? x : Fact{};
      default: return {};
    }
  }

  // ---- the bounds' ops ---------------------------------------------------------------------------

  static TileType i64() { return TileType{DType::i64, {}}; }

  template <class Set>
  int emit_op(OpKind kind, std::vector<int> operands, const TileType& type, Set&& set) {
    Op op;
    op.kind = kind;
    op.loc = loc_;
    op.operands = std::move(operands);
    set(op);
    f_.values.push_back(ir::ValueInfo{type, false, region_});
    op.result = static_cast<int>(f_.values.size()) - 1;
    head_->push_back(std::move(op));
    return head_->back().result;
  }
  int constant(int64_t c) {
    return emit_op(OpKind::const_value, {}, i64(), [&](Op& o) { o.ival = c; });
  }
  int bin(BinaryFn fn, int x, int y) {
    const TileType t = ir::is_comparison(fn) ? TileType{DType::i1, {}} : i64();
    return emit_op(OpKind::binary, {x, y}, t, [&](Op& o) { o.binary = fn; });
  }
  int as_i64(int v) {
    if (f_.type(v).dtype == DType::i64) return v;
    return emit_op(OpKind::cast, {v}, i64(), [](Op&) {});
  }
  // v, or for an invariant scalar made inside the loop, the same ops before it.
  int outside(int v) {
    if (!inside_.count(v)) return v;
    if (auto it = hoisted_.find(v); it != hoisted_.end()) return it->second;
    const Op& op = *def_.at(v);
    std::vector<int> operands;
    for (int o : op.operands) operands.push_back(outside(o));
    const int x = emit_op(op.kind, operands, f_.type(v), [&](Op& o) {
      o = ir::copy_attributes(op);
      o.loc = op.loc;
      o.operands = operands;
      o.tag.clear();
    });
    hoisted_[v] = x;
    return x;
  }
  int quotient_value(int key) {
    if (auto it = quotient_values_.find(key); it != quotient_values_.end()) return it->second;
    const auto& [x, c] = quotients_.at(static_cast<size_t>(-key - 1));
    const int v = bin(BinaryFn::floordiv, emit(x), constant(c));
    quotient_values_[key] = v;
    return v;
  }
  int emit(const Affine& a) {
    int sum = -1;
    for (const auto& [v, k] : a.terms) {
      int x = v < 0 ? quotient_value(v) : as_i64(outside(v));
      if (sum < 0) {
        sum = k == 1 ? x : bin(BinaryFn::mul, x, constant(k));
        continue;
      }
      if (k == 1 || k == -1) sum = bin(k == 1 ? BinaryFn::add : BinaryFn::sub, sum, x);
      else sum = bin(BinaryFn::add, sum, bin(BinaryFn::mul, x, constant(k)));
    }
    if (sum < 0) return constant(a.constant);
    return a.constant == 0 ? sum : bin(BinaryFn::add, sum, constant(a.constant));
  }
  int emit(const Bound& b) {
    switch (b.kind) {
      case Bound::Kind::below: return constant(-kFar);
      case Bound::Kind::above: return constant(kFar);
      case Bound::Kind::affine: return emit(b.value);
      case Bound::Kind::max: return bin(BinaryFn::maximum, emit(b.args[0]), emit(b.args[1]));
      case Bound::Kind::min: return bin(BinaryFn::minimum, emit(b.args[0]), emit(b.args[1]));
      case Bound::Kind::select: {
        const int c = bin(BinaryFn::gt, emit(b.value), constant(0));
        const int x = emit(b.args[0]), y = emit(b.args[1]);
        return emit_op(OpKind::where, {c, x, y}, i64(), [](Op&) {});
      }
    }
    return -1;
  }

  ir::Function& f_;
  const Config& c_;
  std::vector<const Op*> def_;
  std::vector<Plan> plans_;
  // The loop being planned, the values defined inside it, and where its bounds' ops go.
  const Op* loop_ = nullptr;
  std::set<int> inside_;
  std::map<int, int> hoisted_;   // invariant scalars inside the loop that its bounds read, made before it
  mutable std::vector<std::pair<Affine, int64_t>> quotients_;   // quotient terms: floordiv(x, c)
  std::map<int, int> quotient_values_;   // and their values before the loop being rewritten
  std::vector<Op>* head_ = nullptr;
  int region_ = 0;
  ir::SourceLoc loc_;
};

}  // namespace

ir::Function bound_masked_loops(const ir::Function& f, const Config& c, int* bounded) {
  ir::Function out = ir::clone(f);
  const int n = Bounder(out, c).run(out.body);
  if (bounded) *bounded = n;
  return out;
}

}  // namespace tj::codegen
