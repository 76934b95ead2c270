#include "codegen/attention_hooks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "codegen/scalar_expr.h"

namespace tj::codegen {

namespace {

using ir::Op;
using ir::OpKind;

constexpr size_t kLibraryParams = 10;   // attention_fp8's tensors and scalars

bool fail(std::string* why, std::string msg) {
  if (why) *why = std::move(msg);
  return false;
}

// Tagged ops (with the region holding them) in trace order.
void collect_tagged(const ir::Region& r, std::vector<std::pair<const Op*, const ir::Region*>>& out) {
  for (const Op& op : r.ops) {
    if (!op.tag.empty()) out.push_back({&op, &r});
    if (op.body) collect_tagged(*op.body, out);
  }
}

// Copies region `src` without its tagged ops, renaming values through `remap`; false when an
// untagged op reads a value that has no name in the copy or an extra parameter.
bool copy_untagged(const ir::Region& src, ir::Region& dst, const std::vector<int>& remap) {
  dst.id = src.id;
  for (const Op& op : src.ops) {
    if (!op.tag.empty()) continue;
    if (op.param >= static_cast<int>(kLibraryParams)) return false;
    Op c = ir::copy_attributes(op);
    c.result = op.result >= 0 ? remap[op.result] : -1;
    for (int v : op.operands) {
      if (remap[v] < 0) return false;
      c.operands.push_back(remap[v]);
    }
    c.body_index = op.body_index >= 0 ? remap[op.body_index] : -1;
    if (op.body) {
      c.body = std::make_unique<ir::Region>();
      if (!copy_untagged(*op.body, *c.body, remap)) return false;
    }
    dst.ops.push_back(std::move(c));
  }
  return true;
}

bool is_score_tile(const ir::Function& f, int v) {
  const TileType& t = f.type(v);
  return t.dtype == DType::f32 && t.rank() == 2;
}

}  // namespace

std::optional<AttentionHooks> split_attention_hooks(const ir::Function& f, std::string* why) {
  std::vector<std::pair<const Op*, const ir::Region*>> tagged;
  collect_tagged(f.body, tagged);
  if (tagged.empty()) return std::nullopt;
  AttentionHooks h;
  std::vector<bool> hook_value(f.values.size(), false);
  const ir::Region* region = tagged.front().second;
  for (auto [op, r] : tagged) {
    if (r != region) return fail(why, "hook ops sit in more than one loop body"), std::nullopt;
    if (op->tag != "score_mod" && op->tag != "mask_mod")
      return fail(why, fmt::format("unknown tag '{}'", op->tag)), std::nullopt;
    if (op->body || ir::is_store(op->kind) || op->kind == OpKind::var_write || op->kind == OpKind::var_decl)
      return fail(why, fmt::format("a hook may not hold a {}", ir::name(op->kind))), std::nullopt;
    if (op->result >= 0) hook_value[op->result] = true;
    h.ops.push_back(op);
    (op->tag == "score_mod" ? h.score_mod : h.mask_mod) = true;
  }
  // The score the hooks read: the one untagged score tile they use.
  std::set<int> inputs;
  for (const Op* op : h.ops)
    for (int v : op->operands)
      if (!hook_value[v] && is_score_tile(f, v)) inputs.insert(v);
  if (inputs.size() != 1) return fail(why, "the hooks do not read exactly one score tile"), std::nullopt;
  h.score_in = *inputs.begin();
  // The score the kernel goes on with: the one hook value untagged ops read.
  std::set<int> outputs;
  ir::walk(f.body, [&](const Op& op, int) {
    if (!op.tag.empty()) return;
    for (int v : op.operands)
      if (hook_value[v]) outputs.insert(v);
  });
  if (outputs.size() != 1 || !is_score_tile(f, *outputs.begin()))
    return fail(why, "the kernel does not read exactly one score tile from the hooks"), std::nullopt;
  h.result = *outputs.begin();
  for (const Op* op : h.ops) {
    if (op->tag == "score_mod") h.score_out = op->result;   // the last one
  }
  if (h.mask_mod) {
    const Op* last = h.ops.back();
    if (last->tag != "mask_mod" || last->kind != OpKind::where || last->result != h.result)
      return fail(why, "the mask hook does not end in where(keep, score, -inf)"), std::nullopt;
    h.keep = last->operands[0];
  } else if (h.score_out != h.result) {
    return fail(why, "the score hook's last op is not the kernel's score"), std::nullopt;
  }

  // The skeleton: f without the tagged ops, their score in place of the hooks' result.
  std::vector<int> remap(f.values.size(), -1);
  ir::Function& g = h.skeleton;
  for (size_t v = 0; v < f.values.size(); ++v) {
    if (hook_value[v]) continue;
    remap[v] = static_cast<int>(g.values.size());
    g.values.push_back(f.values[v]);
  }
  remap[h.result] = remap[h.score_in];
  g.name = f.name;
  if (f.params.size() < kLibraryParams) return fail(why, "too few parameters"), std::nullopt;
  for (size_t i = kLibraryParams; i < f.params.size(); ++i)
    if (f.params[i].kind != ir::ParamKind::tensor_in)
      return fail(why, fmt::format("extra parameter '{}' is not an input tensor", f.params[i].name)), std::nullopt;
  g.params.assign(f.params.begin(), f.params.begin() + kLibraryParams);
  g.blocks = f.blocks;
  g.num_regions = f.num_regions;
  if (!copy_untagged(f.body, g.body, remap))
    return fail(why, "code outside the hooks reads hook values or the variant's inputs"), std::nullopt;
  return h;
}

// ---- writing the hooks -----------------------------------------------------------------------

namespace {

// Hook tile values that are positions or copies: an arange of the query / key tile start is the
// element's q / kv (kPosQ / kPosKv); expand_dims and broadcast copy their operand (its id).
// nullopt (with *why) for an arange of anything else.
constexpr int kPosQ = -2, kPosKv = -3;
std::optional<std::map<int, int>> position_aliases(const AttentionHooks& h, const HookSymbols& sym, std::string* why) {
  std::map<int, int> alias;
  for (const Op* op : h.ops) {
    if (op->kind == OpKind::arange) {
      if (op->operands[0] == sym.m_start) alias[op->result] = kPosQ;
      else if (op->operands[0] == sym.n_start) alias[op->result] = kPosKv;
      else return fail(why, "a hook builds positions from something other than the query / key tile"), std::nullopt;
    } else if (op->kind == OpKind::expand_dims || op->kind == OpKind::broadcast) {
      alias[op->result] = op->operands[0];
    }
  }
  return alias;
}

// A score hook's result as d * s + a * kv + b * q + g, each coefficient an expression of the
// CTA's scalars (written for a member function; nullopt: 0).
struct LinearScore {
  std::optional<std::string> d, a, b, g;
};
std::optional<std::string> sum(const std::optional<std::string>& x, const std::optional<std::string>& y, char op) {
  if (!y) return x;
  if (!x) return op == '+' ? y : std::optional<std::string>("(-" + *y + ")");
  return fmt::format("({} {} {})", *x, op, *y);
}
std::optional<std::string> product(const std::string& u, const std::optional<std::string>& x) {
  return x ? std::optional<std::string>(fmt::format("({} * {})", u, *x)) : std::nullopt;
}

class HookWriter {
 public:
  // The score hook as a LinearScore, when it is one: sums, differences and negations of the score,
  // the positions and the CTA's scalars, products with those scalars, int -> float casts.
  std::optional<LinearScore> linear_score(std::string* why);

  HookWriter(const ir::Function& f, const AttentionHooks& h, const HookSymbols& sym) : f_(f), h_(h), sym_(sym) {}

  std::optional<HooksSource> run(const std::string& type, const std::string& var, const HookOptions& options,
                                 std::string* why);

 private:
  enum class Ctx { init, member };
  bool prepare(std::string* why);
  DType dtype(int v) const { return f_.type(v).dtype; }
  bool scalar(int v) const { return f_.type(v).rank() == 0; }
  std::string field(int v) const { return fmt::format("v{}", v); }
  std::string value(int v, Ctx ctx, const std::string& var) const;
  std::optional<std::string> scalar_expr(const Op& op, const std::string& var, std::string* why) const;
  std::optional<std::string> element_expr(const Op& op, std::string* why) const;
  std::optional<std::string> float_positions(int v) const;
  std::optional<LinearScore> linear(int v) const;
  // v through its copies: kQ, kKv, kScore, or the value the copies start from
  int resolve(int v) const {
    for (auto a = alias_.find(v); a != alias_.end() && v >= 0; a = alias_.find(v)) v = a->second;
    return v;
  }
  std::optional<std::string> gather_expr(const Op& op, Ctx ctx, const std::string& var, std::string* why) const;
  std::string interval(int v) const;
  std::string interval_expr(const Op& op) const;

  const ir::Function& f_;
  const AttentionHooks& h_;
  const HookSymbols& sym_;
  std::map<int, const Op*> def_;        // hook value -> its op
  static constexpr int kQ = kPosQ, kKv = kPosKv, kScore = -4;
  std::map<int, int> alias_;            // tile values that are positions (kQ, kKv) or copies of a value
  std::set<const Op*> folded_;          // the score hook's unit changes (prepare)
  int score_result_ = -1;               // the user's score_mod result, in natural units
  bool fast_math_ = false;              // per-element transcendentals as approximations
};

// How code reads value v: in init (through `var.`) or inside a member function.
std::string HookWriter::value(int v, Ctx ctx, const std::string& var) const {
  const std::string pre = ctx == Ctx::init ? var + "." : "";
  if (v == sym_.b) return pre + "b";
  if (v == sym_.h) return pre + "h";
  if (v == h_.score_in) return "tj_s";
  if (v == h_.assumed_true) return "true";
  if (auto a = alias_.find(v); a != alias_.end())
    return a->second == kQ ? "q" : a->second == kKv ? "kv" : a->second == kScore ? "tj_s" : value(a->second, ctx, var);
  auto d = def_.find(v);
  if (d != def_.end() && d->second->kind == OpKind::const_value)
    return scalar::literal(d->second->fval, d->second->ival, dtype(v));
  if (scalar(v)) return pre + field(v);
  return field(v);
}

std::optional<std::string> HookWriter::scalar_expr(const Op& op, const std::string& var, std::string* why) const {
  auto in = [&](size_t i) { return "(" + value(op.operands[i], Ctx::init, var) + ")"; };
  const DType rd = dtype(op.result);
  switch (op.kind) {
    case OpKind::tensor_dim: return fmt::format("(long long)p{}.shape[{}]", op.param, op.axis);
    case OpKind::scalar_param: return fmt::format("p{}", op.param);
    case OpKind::unary: return scalar::unary_expr(op.unary, rd, in(0), false);
    case OpKind::binary:
      return scalar::binary_expr(op.binary, dtype(op.operands[0]), rd, in(0), in(1));
    case OpKind::where: return fmt::format("({} ? {} : {})", in(0), in(1), in(2));
    case OpKind::cast: return scalar::cast_expr(dtype(op.operands[0]), rd, in(0));
    case OpKind::gather: return gather_expr(op, Ctx::init, var, why);
    case OpKind::load: {
      // A load at scalar indices is a gather of one element.
      for (const ir::Index& ix : op.indices)
        if (ix.kind != ir::Index::Kind::scalar) {
          fail(why, fmt::format("a hook loads a tile of '{}' (only scalar indices are supported)", f_.params.at(op.param).name));
          return std::nullopt;
        }
      return gather_expr(op, Ctx::init, var, why);
    }
    default: break;
  }
  fail(why, fmt::format("a hook computes a scalar with '{}' (at {})", ir::name(op.kind), op.loc.str()));
  return std::nullopt;
}

// A gather (or a load at scalar indices: one operand per dim either way) as one bounds-checked
// read (out of range: 0, as everywhere in the DSL).
std::optional<std::string> HookWriter::gather_expr(const Op& op, Ctx ctx, const std::string& var, std::string* why) const {
  const ir::Param& p = f_.params.at(op.param);
  if (p.dtype != DType::f32 && p.dtype != DType::i32 && p.dtype != DType::i64) {
    fail(why, fmt::format("a hook reads '{}' of type {} (f32, i32 and i64 inputs are supported)", p.name, name(p.dtype)));
    return std::nullopt;
  }
  std::vector<std::string> idx;
  for (int v : op.operands) idx.push_back(fmt::format("(long long)({})", value(v, ctx, var)));
  return fmt::format("tj::dev::gather_at<tj::dev::{}>(p{}, {})", name(p.dtype), op.param, fmt::join(idx, ", "));
}

std::optional<std::string> HookWriter::element_expr(const Op& op, std::string* why) const {
  auto in = [&](size_t i) { return "(" + value(op.operands[i], Ctx::member, "") + ")"; };
  const DType rd = dtype(op.result);
  switch (op.kind) {
    case OpKind::full: return scalar::literal(op.fval, op.ival, rd);
    case OpKind::unary: return scalar::unary_expr(op.unary, rd, in(0), fast_math_);
    case OpKind::binary: return scalar::binary_expr(op.binary, dtype(op.operands[0]), rd, in(0), in(1));
    case OpKind::where: return fmt::format("({} ? {} : {})", in(0), in(1), in(2));
    case OpKind::cast:
      // An int -> f32 cast of position arithmetic (ALiBi's kv - q) in the score hook: the same
      // sums in float on the positions the main loop passes as floats (exact below 2^24).
      if (op.tag == "score_mod" && rd == DType::f32 && !is_float(dtype(op.operands[0])) &&
          dtype(op.operands[0]) != DType::i1)
        if (auto f = float_positions(op.operands[0])) return *f;
      return scalar::cast_expr(dtype(op.operands[0]), rd, in(0));
    case OpKind::gather: return gather_expr(op, Ctx::member, "", why);
    default: break;
  }
  fail(why, fmt::format("a hook computes a tile with '{}' (at {}); hooks are elementwise", ir::name(op.kind),
                        op.loc.str()));
  return std::nullopt;
}

// Value v (an integer) as float arithmetic on tj_qf / tj_kvf: q, kv, integer constants and scalar
// fields combined by +, - and negation; nothing for anything else.
std::optional<std::string> HookWriter::float_positions(int v) const {
  if (auto a = alias_.find(v); a != alias_.end()) {
    if (a->second == kQ) return std::string("tj_qf");
    if (a->second == kKv) return std::string("tj_kvf");
    if (a->second == kScore) return std::nullopt;
    return float_positions(a->second);
  }
  auto d = def_.find(v);
  if (d == def_.end()) return std::nullopt;
  const Op& op = *d->second;
  if (op.kind == OpKind::const_value || scalar(v)) return fmt::format("(float)({})", value(v, Ctx::member, ""));
  if (op.kind == OpKind::unary && op.unary == ir::UnaryFn::neg) {
    auto a = float_positions(op.operands[0]);
    return a ? std::optional<std::string>("(-" + *a + ")") : std::nullopt;
  }
  if (op.kind == OpKind::binary && (op.binary == ir::BinaryFn::add || op.binary == ir::BinaryFn::sub)) {
    auto a = float_positions(op.operands[0]), b = float_positions(op.operands[1]);
    if (!a || !b) return std::nullopt;
    return fmt::format("({} {} {})", *a, op.binary == ir::BinaryFn::add ? "+" : "-", *b);
  }
  return std::nullopt;
}

// Interval types by dtype: booleans, integers (64-bit), floats (interval.cuh).
const char* interval_type(DType t) {
  return t == DType::i1 ? "tj::dev::IvB" : is_float(t) ? "tj::dev::IvF" : "tj::dev::IvI";
}
std::string any_interval(DType t) {
  return t == DType::i1 ? "tj::dev::ivb_any()" : is_float(t) ? "tj::dev::iv_any<float>()" : "tj::dev::iv_any<long long>()";
}
std::string point_interval(DType t, const std::string& x) {
  if (t == DType::i1) return fmt::format("tj::dev::ivb_point({})", x);
  return fmt::format("tj::dev::iv_point(({})({}))", is_float(t) ? "float" : "long long", x);
}

// The interval expression of value v over a block of positions.
std::string HookWriter::interval(int v) const {
  if (v == h_.assumed_true) return point_interval(DType::i1, "true");
  if (auto a = alias_.find(v); a != alias_.end()) {
    if (a->second == kScore) return any_interval(DType::f32);
    return a->second == kQ ? "tj_q" : a->second == kKv ? "tj_kv" : interval(a->second);
  }
  if (v == h_.score_in) return any_interval(DType::f32);
  auto d = def_.find(v);
  const bool tile_op = d != def_.end() && !scalar(v) && d->second->kind != OpKind::const_value;
  if (tile_op) return fmt::format("iv{}", v);
  return point_interval(dtype(v), value(v, Ctx::member, ""));
}

std::string HookWriter::interval_expr(const Op& op) const {
  using ir::BinaryFn;
  using ir::UnaryFn;
  const DType rd = dtype(op.result);
  const std::string any = any_interval(rd);
  auto in = [&](size_t i) { return interval(op.operands[i]); };
  auto monotone = [&](const char* fn) {
    return fmt::format("tj::dev::iv_monotone({}, [](float x) {{ return {}(x); }})", in(0), fn);
  };
  switch (op.kind) {
    case OpKind::full: return point_interval(rd, scalar::literal(op.fval, op.ival, rd));
    case OpKind::where: return fmt::format("tj::dev::iv_where({}, {}, {})", in(0), in(1), in(2));
    case OpKind::unary:
      switch (op.unary) {
        case UnaryFn::neg: return fmt::format("tj::dev::iv_neg({})", in(0));
        case UnaryFn::abs: return fmt::format("tj::dev::iv_abs({})", in(0));
        case UnaryFn::logical_not: return fmt::format("tj::dev::iv_not({})", in(0));
        case UnaryFn::exp2: return monotone("tj::dev::exp2");
        case UnaryFn::exp: return monotone("expf");
        case UnaryFn::log2: return monotone("log2f");
        case UnaryFn::log: return monotone("logf");
        case UnaryFn::sqrt: return monotone("sqrtf");
        case UnaryFn::tanh: return monotone("tanhf");
        default: return any;
      }
    case OpKind::binary: {
      const bool int_operands = !is_float(dtype(op.operands[0]));
      // An integer compared with itself: its interval alone cannot say (kv == kv over [a, b]
      // could be any pair), the value can; a mask written so keeps its blocks whole.
      if (int_operands && op.operands[0] == op.operands[1] && ir::is_comparison(op.binary)) {
        const bool holds = op.binary == BinaryFn::eq || op.binary == BinaryFn::le || op.binary == BinaryFn::ge;
        return point_interval(DType::i1, holds ? "true" : "false");
      }
      const char* fn = nullptr;
      switch (op.binary) {
        case BinaryFn::add: fn = "iv_add"; break;
        case BinaryFn::sub: fn = "iv_sub"; break;
        case BinaryFn::mul: fn = "iv_mul"; break;
        case BinaryFn::div: fn = "iv_div"; break;
        case BinaryFn::maximum: fn = "iv_max"; break;
        case BinaryFn::minimum: fn = "iv_min"; break;
        case BinaryFn::floordiv: fn = int_operands ? "iv_floordiv" : nullptr; break;
        case BinaryFn::mod: fn = int_operands ? "iv_mod" : nullptr; break;
        case BinaryFn::lt: fn = "iv_lt"; break;
        case BinaryFn::le: fn = "iv_le"; break;
        case BinaryFn::gt: fn = "iv_gt"; break;
        case BinaryFn::ge: fn = "iv_ge"; break;
        case BinaryFn::eq: fn = "iv_eq"; break;   // numbers and booleans (interval.cuh)
        case BinaryFn::ne: fn = "iv_ne"; break;
        case BinaryFn::logical_and: fn = "iv_and"; break;
        case BinaryFn::logical_or: fn = "iv_or"; break;
      }
      return fn ? fmt::format("tj::dev::{}({}, {})", fn, in(0), in(1)) : any;
    }
    case OpKind::cast: {
      const DType from = dtype(op.operands[0]), to = dtype(op.result);
      if (from == DType::i1 && to == DType::i1) return in(0);
      if (from == DType::i1) return fmt::format("tj::dev::iv_{}_from_bool({})", is_float(to) ? "float" : "int", in(0));
      if (to == DType::i1) return fmt::format("tj::dev::iv_to_bool({})", in(0));
      if (is_float(from) && !is_float(to)) return fmt::format("tj::dev::iv_to_int({})", in(0));
      if (!is_float(from) && is_float(to)) return fmt::format("tj::dev::iv_to_float({})", in(0));
      return in(0);   // int -> int, float -> float: the ends stay the ends
    }
    case OpKind::gather: {
      // a range query over the box the index intervals span (interval.cuh)
      std::vector<std::string> idx;
      for (size_t i = 0; i < op.operands.size(); ++i) idx.push_back(in(i));
      const DType pt = f_.params.at(op.param).dtype;
      const char* elem = pt == DType::f32 ? "float" : pt == DType::i32 ? "int" : "long long";
      return fmt::format("tj::dev::iv_gather<{}>(p{}, {})", elem, op.param, fmt::join(idx, ", "));
    }
    default: return any;
  }
}

bool HookWriter::prepare(std::string* why) {
  for (const Op* op : h_.ops)
    if (op->result >= 0) def_[op->result] = op;
  auto aliases = position_aliases(h_, sym_, why);
  if (!aliases) return false;
  alias_ = std::move(*aliases);
  // The score hook's unit changes (kernels/attention_fp8.cpp traces score_mod(s * ln 2) * log2 e):
  // the main loop folds them into its score scale and its softmax, so score() works in natural
  // units and returns the user's score.
  score_result_ = h_.score_out;
  if (h_.score_mod) {
    auto const_is = [&](int v, double x) {
      auto d = def_.find(v);
      return d != def_.end() && d->second->kind == OpKind::const_value && std::fabs(d->second->fval - x) < 1e-6 * x;
    };
    auto is_mul_by = [&](const Op* op, int operand, double x) {
      return op && op->kind == OpKind::binary && op->binary == ir::BinaryFn::mul && dtype(op->result) == DType::f32 &&
             (operand < 0 || op->operands[0] == operand) && const_is(op->operands[1], x);
    };
    const Op* first = nullptr;   // the op that reads the score: s * ln 2
    for (const Op* op : h_.ops)
      if (op->tag == "score_mod" && std::find(op->operands.begin(), op->operands.end(), h_.score_in) != op->operands.end()) {
        first = op;
        break;
      }
    const Op* last = def_.count(h_.score_out) ? def_.at(h_.score_out) : nullptr;
    if (last && last->kind == OpKind::cast) {
      folded_.insert(last);
      last = def_.count(last->operands[0]) ? def_.at(last->operands[0]) : nullptr;
    }
    if (!is_mul_by(first, h_.score_in, 0.6931471805599453) || !is_mul_by(last, -1, 1.4426950408889634) || first == last)
      return fail(why, "the score hook is not score_mod(s * ln 2) * log2 e");
    alias_[first->result] = kScore;
    folded_.insert(last);
    score_result_ = last->operands[0];
  }
  return true;
}

std::optional<LinearScore> HookWriter::linear_score(std::string* why) {
  if (!prepare(why)) return std::nullopt;
  if (!h_.score_mod) return fail(why, "no score hook"), std::nullopt;
  auto l = linear(score_result_);
  if (!l) fail(why, "the score hook is not linear in the score and the positions");
  return l;
}

// Value v as a LinearScore: the score (aliased to kScore: the user's s), positions, the CTA's
// scalars and literals, combined by +, - and negation, and float products with a scalar factor.
// Integer position arithmetic (add, sub, neg) is read as float arithmetic, as float_positions
// does (exact below 2^24).
std::optional<LinearScore> HookWriter::linear(int v) const {
  v = resolve(v);
  if (v == kScore) return LinearScore{"1.0f", {}, {}, {}};
  if (v == kKv) return LinearScore{{}, "1.0f", {}, {}};
  if (v == kQ) return LinearScore{{}, {}, "1.0f", {}};
  auto d = def_.find(v);
  const bool uniform = v == sym_.b || v == sym_.h || (d != def_.end() && (d->second->kind == OpKind::const_value || scalar(v)));
  if (uniform && dtype(v) != DType::i1) return LinearScore{{}, {}, {}, fmt::format("(float)({})", value(v, Ctx::member, ""))};
  if (d == def_.end() || v == h_.score_in) return std::nullopt;
  const Op& op = *d->second;
  const bool f32 = dtype(v) == DType::f32;
  if (op.kind == OpKind::full && dtype(v) != DType::i1)
    return LinearScore{{}, {}, {}, fmt::format("(float)({})", scalar::literal(op.fval, op.ival, dtype(v)))};
  if (op.kind == OpKind::cast) {
    const DType from = dtype(op.operands[0]);
    if (!f32 || from == DType::i1 || (is_float(from) && from != DType::f32)) return std::nullopt;
    return linear(op.operands[0]);
  }
  if (!f32 && is_float(dtype(v))) return std::nullopt;   // f16 / bf16 arithmetic rounds differently
  if (op.kind == OpKind::unary && op.unary == ir::UnaryFn::neg) {
    auto x = linear(op.operands[0]);
    if (!x) return std::nullopt;
    return LinearScore{sum({}, x->d, '-'), sum({}, x->a, '-'), sum({}, x->b, '-'), sum({}, x->g, '-')};
  }
  if (op.kind != OpKind::binary) return std::nullopt;
  auto x = linear(op.operands[0]), y = linear(op.operands[1]);
  if (!x || !y) return std::nullopt;
  switch (op.binary) {
    case ir::BinaryFn::add:
    case ir::BinaryFn::sub: {
      const char c = op.binary == ir::BinaryFn::add ? '+' : '-';
      return LinearScore{sum(x->d, y->d, c), sum(x->a, y->a, c), sum(x->b, y->b, c), sum(x->g, y->g, c)};
    }
    case ir::BinaryFn::mul: {
      if (!f32) return std::nullopt;   // integer products may wrap where floats would not
      auto scalar_only = [](const LinearScore& l) { return !l.d && !l.a && !l.b; };
      if (scalar_only(*x) && x->g) std::swap(x, y);
      if (!scalar_only(*y)) return std::nullopt;
      if (!y->g) return LinearScore{};   // times 0
      return LinearScore{product(*y->g, x->d), product(*y->g, x->a), product(*y->g, x->b), product(*y->g, x->g)};
    }
    default: return std::nullopt;
  }
}

std::optional<HooksSource> HookWriter::run(const std::string& type, const std::string& var, const HookOptions& options,
                                           std::string* why) {
  if (!prepare(why)) return std::nullopt;
  fast_math_ = options.fast_math;
  const bool skip_blocks = options.skip_blocks, linear_score = options.linear_score;
  std::set<const Op*> folded = folded_;
  int score_result = score_result_;
  std::optional<LinearScore> lin;
  if (linear_score && h_.score_mod) lin = linear(score_result);
  // Other score hooks: a factor the score enters with (softcap's s / cap) and one the result leaves
  // with (its * cap) fold into the main loop's score scale and softmax scale: two FMULs less per
  // score element.
  std::string in_factor = "1.0f", out_factor = "1.0f";
  if (h_.score_mod && !lin) {
    auto uniform = [&](int v) -> std::optional<std::string> {
      auto l = linear(v);
      if (!l || l->d || l->a || l->b) return std::nullopt;
      return l->g ? *l->g : std::string("0.0f");
    };
    auto scaled = [&](const Op* op) {   // (the uniform factor, the other operand's index)
      std::optional<std::pair<std::string, int>> r;
      if (!op || op->kind != OpKind::binary || op->binary != ir::BinaryFn::mul || dtype(op->result) != DType::f32) return r;
      for (int side = 0; side < 2 && !r; ++side)
        if (auto u = uniform(op->operands[side]); u && !uniform(op->operands[1 - side])) r = {{*u, 1 - side}};
      return r;
    };
    const Op* out_op = def_.count(score_result) ? def_.at(score_result) : nullptr;
    if (auto o = scaled(out_op)) {
      out_factor = o->first;
      folded.insert(out_op);
      score_result = out_op->operands[o->second];
    }
    auto is_score = [&](int v) { return resolve(v) == kScore; };
    std::vector<const Op*> uses;   // ops that read the score, other than copies of it
    for (const Op* op : h_.ops)
      if (!is_score(op->result) && std::any_of(op->operands.begin(), op->operands.end(), is_score)) uses.push_back(op);
    if (uses.size() == 1 && !folded.count(uses[0]))
      if (auto i = scaled(uses[0]); i && is_score(uses[0]->operands[i->second])) {
        in_factor = i->first;
        alias_[uses[0]->result] = kScore;
      }
  }
  HooksSource out;
  std::string fields, score_body, keep_body, classify_body;
  // Tensors that tile gathers read per element / per block: copies of the kernel's parameters.
  std::set<int> gathered;
  for (const Op* op : h_.ops)
    if (op->kind == OpKind::gather && !scalar(op->result)) gathered.insert(op->param);
  for (int param : gathered) {
    fields += fmt::format("  tj::dev::TensorArg<{}> p{};\n", f_.params.at(param).rank(), param);
    out.init += fmt::format("{}.p{} = p{};\n", var, param, param);
  }
  for (const Op* op : h_.ops) {
    if (op->result < 0) return fail(why, "a hook op without a result"), std::nullopt;
    if (alias_.count(op->result) || op->kind == OpKind::const_value || folded.count(op) || op->result == h_.assumed_true)
      continue;
    const int v = op->result;
    const bool mask_op = op->tag == "mask_mod";
    if (mask_op && v == h_.result) continue;   // the final where: the main loop masks
    if (scalar(v)) {
      auto e = scalar_expr(*op, var, why);
      if (!e) return std::nullopt;
      fields += fmt::format("  {} {};\n", scalar::reg_type(dtype(v)), field(v));
      out.init += fmt::format("{}.{} = {};   // {}\n", var, field(v), *e, op->loc.str());
      continue;
    }
    auto e = element_expr(*op, why);
    if (!e) return std::nullopt;
    (mask_op ? keep_body : score_body) +=
        fmt::format("    const {} {} = {};   // {}\n", scalar::reg_type(dtype(v)), field(v), *e, op->loc.str());
    if (mask_op) {
      classify_body += fmt::format("    const {} iv{} = {};\n", interval_type(dtype(v)), v, interval_expr(*op));
    }
  }
  std::string& d = out.decl;
  d += fmt::format("struct {} {{\n", type);
  d += fmt::format("  static constexpr bool kScoreMod = {};\n", h_.score_mod ? "true" : "false");
  d += fmt::format("  static constexpr bool kMask = {};\n", h_.mask_mod ? "true" : "false");
  d += fmt::format("  static constexpr bool kSkipBlocks = {};\n", skip_blocks && h_.mask_mod ? "true" : "false");
  bool keep_gathers = false;
  for (const Op* op : h_.ops)
    keep_gathers = keep_gathers || (op->kind == OpKind::gather && !scalar(op->result) && op->tag == "mask_mod");
  d += fmt::format("  static constexpr bool kKeepGathers = {};\n", h_.mask_mod && keep_gathers ? "true" : "false");
  d += "  long long b, h;\n" + fields;
  d += "  __device__ __forceinline__ float score(float tj_s, int q, int kv, float tj_qf, float tj_kvf) const {\n";
  if (h_.score_mod) d += score_body + fmt::format("    return {};\n", value(score_result, Ctx::member, ""));
  else d += "    return tj_s;\n";
  d += "  }\n";
  // score(s * in, ...) * out is the user's score: the main loop folds the two factors into its
  // score scale and its softmax scale.
  d += fmt::format("  __device__ __forceinline__ float score_in_factor() const {{ return {}; }}\n", in_factor);
  d += fmt::format("  __device__ __forceinline__ float score_out_factor() const {{ return {}; }}\n", out_factor);
  // The main loop forms a linear score per key column and per row instead of per element: the
  // score hook's arithmetic leaves the per-element softmax chain (one FFMA per score is left).
  d += fmt::format("  static constexpr bool kLinearScore = {};\n", lin ? "true" : "false");
  d += "  __device__ __forceinline__ void linear_score(float& tj_d, float& tj_a, float& tj_b, float& tj_g) const {\n";
  if (lin) {
    d += "    // score(s, q, kv) = tj_d * s + tj_a * kv + tj_b * q + tj_g\n";
    auto coef = [](const std::optional<std::string>& c) { return c ? *c : std::string("0.0f"); };
    d += fmt::format("    tj_d = {};\n    tj_a = {};\n    tj_b = {};\n    tj_g = {};\n", coef(lin->d), coef(lin->a),
                     coef(lin->b), coef(lin->g));
  } else {
    d += "    tj_d = 1.0f;\n    tj_a = tj_b = tj_g = 0.0f;\n";
  }
  d += "  }\n";
  d += "  __device__ __forceinline__ bool keep(int q, int kv) const {\n";
  if (h_.mask_mod) d += keep_body + fmt::format("    return {};\n", value(h_.keep, Ctx::member, ""));
  else d += "    return true;\n";
  d += "  }\n";
  // The keys every query sees besides kv <= q: [0, causal_prefix()), clamped to [0, 2^31).
  d += "  __device__ __forceinline__ int causal_prefix() const {\n";
  if (h_.causal_prefix >= 0) {
    const std::string e = value(h_.causal_prefix, Ctx::member, "");
    d += dtype(h_.causal_prefix) == DType::i64
             ? fmt::format("    return {0} <= 0 ? 0 : {0} >= 0x7fffffffLL ? 0x7fffffff : (int){0};\n", e)
             : fmt::format("    return {0} <= 0 ? 0 : (int){0};\n", e);
  } else {
    d += "    return 0;\n";
  }
  d += "  }\n";
  d += "  __device__ __forceinline__ int classify(int q_lo, int q_hi, int kv_lo, int kv_hi) const {\n";
  if (h_.mask_mod) {
    d += "    const tj::dev::IvI tj_q{q_lo, q_hi}, tj_kv{kv_lo, kv_hi};\n";
    d += classify_body + fmt::format("    return tj::dev::iv_block_class({});\n", interval(h_.keep));
  } else {
    d += "    return 1;\n";
  }
  d += "  }\n};\n";
  out.init = fmt::format("{} {};\n{}.b = tj_b;\n{}.h = tj_h;\n", type, var, var, var) + out.init;
  return out;
}

}  // namespace

std::optional<HooksSource> hooks_source(const ir::Function& f, const AttentionHooks& h, const HookSymbols& sym,
                                        const std::string& type, const std::string& var, const HookOptions& options,
                                        std::string* why) {
  return HookWriter(f, h, sym).run(type, var, options, why);
}

bool score_hook_is_linear(const ir::Function& f, const AttentionHooks& h, const HookSymbols& sym) {
  return HookWriter(f, h, sym).linear_score(nullptr).has_value();
}

namespace {

// The mask hook's ops by result, with the positions resolved through their copies: what
// causal_conjunct and causal_prefix read.
class MaskOps {
 public:
  static std::optional<MaskOps> of(const AttentionHooks& h, const HookSymbols& sym) {
    if (!h.mask_mod || h.keep < 0) return std::nullopt;
    auto alias = position_aliases(h, sym, nullptr);
    if (!alias) return std::nullopt;
    MaskOps m;
    m.alias_ = std::move(*alias);
    for (const ir::Op* op : h.ops)
      if (op->result >= 0) m.def_[op->result] = op;
    return m;
  }
  // kPosQ, kPosKv, or the value itself when it is neither
  int position(int v) const {
    for (auto a = alias_.find(v); a != alias_.end(); a = alias_.find(v)) v = a->second;
    return v;
  }
  // the binary op that defines v, or nullptr
  const ir::Op* binary(int v) const {
    auto d = def_.find(v);
    return d != def_.end() && d->second->kind == OpKind::binary ? d->second : nullptr;
  }
  // kv <= q or q >= kv
  bool is_causal(int v) const {
    const ir::Op* op = binary(v);
    if (!op) return false;
    const int a = position(op->operands[0]), b = position(op->operands[1]);
    return (op->binary == ir::BinaryFn::le && a == kPosKv && b == kPosQ) ||
           (op->binary == ir::BinaryFn::ge && a == kPosQ && b == kPosKv);
  }
  // position(v), also through a widening integer cast (kv as i64 against an i64 bound)
  int position_widened(int v) const {
    auto d = def_.find(position(v));
    if (d != def_.end() && d->second->kind == OpKind::cast && d->second->result >= 0) {
      const int from = position(d->second->operands[0]);
      if (from == kPosQ || from == kPosKv) return from;
    }
    return position(v);
  }
  int through_broadcasts(int v) const {
    for (auto d = def_.find(v); d != def_.end() && (d->second->kind == OpKind::broadcast || d->second->kind == OpKind::expand_dims);
         d = def_.find(v))
      v = d->second->operands[0];
    return v;
  }

 private:
  std::map<int, int> alias_;
  std::map<int, const ir::Op*> def_;
};

}  // namespace

int causal_conjunct(const AttentionHooks& h, const HookSymbols& sym) {
  const std::optional<MaskOps> mask = MaskOps::of(h, sym);
  if (!mask) return -1;
  // keep implies every value it ands in, so keep == c && keep[c := true] for such a c, wherever
  // else c is read (the hooks take it as true everywhere: a score where c is false is masked).
  std::function<int(int)> find = [&](int v) {
    if (mask->is_causal(v)) return v;
    const ir::Op* op = mask->binary(v);
    if (!op || op->binary != ir::BinaryFn::logical_and) return -1;
    for (int operand : op->operands)
      if (const int c = find(mask->through_broadcasts(operand)); c >= 0) return c;
    return -1;
  };
  return find(h.keep);
}

int causal_prefix(const ir::Function& f, const AttentionHooks& h, const HookSymbols& sym) {
  const std::optional<MaskOps> mask = MaskOps::of(h, sym);
  if (!mask) return -1;
  const ir::Op* either = mask->binary(mask->through_broadcasts(h.keep));
  if (!either || either->binary != ir::BinaryFn::logical_or) return -1;
  // kv < E or E > kv: E's scalar, or -1
  auto below = [&](int v) {
    const ir::Op* op = mask->binary(v);
    if (!op) return -1;
    const int a = mask->position_widened(op->operands[0]), b = mask->position_widened(op->operands[1]);
    int e = -1;
    if (op->binary == ir::BinaryFn::lt && a == kPosKv) e = b;
    if (op->binary == ir::BinaryFn::gt && b == kPosKv) e = a;
    if (e < 0) return -1;   // a position or nothing
    e = mask->through_broadcasts(e);
    return f.type(e).rank() == 0 && is_int(f.type(e).dtype) ? e : -1;
  };
  for (int side = 0; side < 2; ++side) {
    const int c = mask->through_broadcasts(either->operands[side]), p = mask->through_broadcasts(either->operands[1 - side]);
    if (mask->is_causal(c))
      if (const int e = below(p); e >= 0) return e;
  }
  return -1;
}

}  // namespace tj::codegen
