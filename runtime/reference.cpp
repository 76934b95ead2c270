#include "runtime/reference.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <iostream>
#include <limits>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "core/numerics.h"

namespace tj {

namespace {

using ir::BinaryFn;
using ir::Op;
using ir::OpKind;
using ir::UnaryFn;

[[noreturn]] void fail_at(const Op& op, const std::string& msg) {
  throw Error(op.loc.known() ? fmt::format("{}: {}", op.loc.str(), msg) : msg);
}

// ---- element semantics ----------------------------------------------------------------
// One place for what a single element of every op computes; both the executor and the
// host-side scalar evaluator (launch_shape) use these.

int64_t to_i64(double x) { return static_cast<int64_t>(x); }

// An integer result of type `t`: i32 wraps to 32 bits (two's complement); i1 is 0/1.
double wrap_int(DType t, int64_t v) {
  switch (t) {
    case DType::i32: return static_cast<double>(static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v))));
    case DType::i1: return v != 0 ? 1.0 : 0.0;
    default: return static_cast<double>(v);
  }
}

// A float result computed in f32: rounded to float, then (f16/bf16/fp8) to the dtype.
double float_result(DType t, float r) {
  return t == DType::f32 ? static_cast<double>(r) : static_cast<double>(numerics::round_to(t, r));
}

// IEEE maxNum/minNum as CUDA fmaxf/fminf: a NaN operand loses; -0 < +0.
float max_num(float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}
float min_num(float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

double unary_elem(const Op& op, UnaryFn fn, DType t, double x) {
  if (fn == UnaryFn::logical_not) return x != 0 ? 0.0 : 1.0;
  if (is_int(t)) {
    const auto u = static_cast<uint64_t>(to_i64(x));
    if (fn == UnaryFn::neg) return wrap_int(t, static_cast<int64_t>(0 - u));
    if (fn == UnaryFn::abs) return wrap_int(t, static_cast<int64_t>(to_i64(x) < 0 ? 0 - u : u));
    fail_at(op, fmt::format("{} of an integer tile ({})", ir::name(fn), name(t)));
  }
  if (!is_float(t)) fail_at(op, fmt::format("{} of a {} tile", ir::name(fn), name(t)));
  const float f = static_cast<float>(x);
  float r = 0;
  switch (fn) {
    case UnaryFn::neg: r = -f; break;
    case UnaryFn::abs: r = std::fabs(f); break;
    case UnaryFn::exp2:   // as on the GPU (ex2.approx.ftz): a result below 2^-126 is 0
      r = std::exp2(f);
      if (r < std::numeric_limits<float>::min()) r = 0.0f;
      break;
    case UnaryFn::log2: r = std::log2(f); break;
    case UnaryFn::exp: r = std::exp(f); break;
    case UnaryFn::log: r = std::log(f); break;
    case UnaryFn::sqrt: r = static_cast<float>(std::sqrt(static_cast<double>(f))); break;
    case UnaryFn::rsqrt: r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(f))); break;
    case UnaryFn::tanh: r = std::tanh(f); break;
    case UnaryFn::logical_not: break;
  }
  return float_result(t, r);
}

bool compare(BinaryFn fn, double a, double b) {
  switch (fn) {
    case BinaryFn::lt: return a < b;
    case BinaryFn::le: return a <= b;
    case BinaryFn::gt: return a > b;
    case BinaryFn::ge: return a >= b;
    case BinaryFn::eq: return a == b;
    case BinaryFn::ne: return a != b;
    default: return false;
  }
}

// `rt` is the result's dtype (i1 for comparisons and logical ops; otherwise the operands').
double binary_elem(const Op& op, BinaryFn fn, DType rt, double a, double b) {
  if (ir::is_comparison(fn)) return compare(fn, a, b) ? 1.0 : 0.0;
  if (fn == BinaryFn::logical_and) return (a != 0 && b != 0) ? 1.0 : 0.0;
  if (fn == BinaryFn::logical_or) return (a != 0 || b != 0) ? 1.0 : 0.0;
  if (is_int(rt) || rt == DType::i1) {
    const int64_t x = to_i64(a), y = to_i64(b);
    const auto ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
    int64_t r = 0;
    switch (fn) {
      case BinaryFn::add: r = static_cast<int64_t>(ux + uy); break;
      case BinaryFn::sub: r = static_cast<int64_t>(ux - uy); break;
      case BinaryFn::mul: r = static_cast<int64_t>(ux * uy); break;
      case BinaryFn::maximum: r = std::max(x, y); break;
      case BinaryFn::minimum: r = std::min(x, y); break;
      case BinaryFn::div:
      case BinaryFn::floordiv:
      case BinaryFn::mod: {
        if (y == 0) fail_at(op, fmt::format("integer {} by zero ({} {} 0)", ir::name(fn), x, ir::name(fn)));
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          r = fn == BinaryFn::mod ? 0 : x;   // wraps
          break;
        }
        int64_t q = x / y, m = x % y;        // truncating
        if (fn == BinaryFn::div) r = q;
        else if (fn == BinaryFn::floordiv) r = (m != 0 && ((m < 0) != (y < 0))) ? q - 1 : q;
        else r = (m != 0 && ((m < 0) != (y < 0))) ? m + y : m;
        break;
      }
      default: fail_at(op, fmt::format("{} on integers", ir::name(fn)));
    }
    return wrap_int(rt, r);
  }
  // Floats: f32 inputs are exact in double; + - * / computed in double and rounded once to
  // float give the correctly rounded f32 result. f16/bf16 compute in f32, then round.
  const float fa = static_cast<float>(a), fb = static_cast<float>(b);
  float r = 0;
  switch (fn) {
    case BinaryFn::add: r = static_cast<float>(static_cast<double>(fa) + fb); break;
    case BinaryFn::sub: r = static_cast<float>(static_cast<double>(fa) - fb); break;
    case BinaryFn::mul: r = static_cast<float>(static_cast<double>(fa) * fb); break;
    case BinaryFn::div: r = static_cast<float>(static_cast<double>(fa) / fb); break;
    case BinaryFn::maximum: r = max_num(fa, fb); break;
    case BinaryFn::minimum: r = min_num(fa, fb); break;
    case BinaryFn::floordiv: r = std::floor(static_cast<float>(static_cast<double>(fa) / fb)); break;
    case BinaryFn::mod: {
      float q = std::floor(static_cast<float>(static_cast<double>(fa) / fb));
      r = static_cast<float>(fa - static_cast<double>(q) * fb);
      break;
    }
    default: fail_at(op, fmt::format("{} on floats", ir::name(fn)));
  }
  return float_result(rt, r);
}

double cast_elem(DType from, DType to, double x) {
  if (from == to) return x;
  if (to == DType::i1) return x != 0 ? 1.0 : 0.0;
  if (is_int(to) && (is_int(from) || from == DType::i1)) return wrap_int(to, to_i64(x));
  // float -> float (x is exact in f32, so one rounding from double is the f32 cast),
  // int -> float (one rounding from the exact integer), float -> int (truncate, saturate).
  return numerics::round_double_to(to, x);
}

// ---- values ---------------------------------------------------------------------------

struct Value {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<double> data;
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  bool is_scalar() const { return shape.empty(); }
  double scalar() const { return data.at(0); }
};

int64_t product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_text(DType t, const std::vector<int64_t>& s) { return fmt::format("{}[{}]", name(t), fmt::join(s, ", ")); }

// ---- bound context: arguments and block sizes -------------------------------------------

struct Bound {
  const ir::Function& f;
  const std::vector<ArgValue>& args;
  std::vector<int64_t> blocks;

  Bound(const ir::Function& fn, const Config& cfg, const std::vector<ArgValue>& a) : f(fn), args(a) {
    for (int b = 0; b < static_cast<int>(f.blocks.size()); ++b) {
      int64_t size = cfg.block(f, b);
      if (size < 1)
        throw Error(fmt::format("kernel '{}': block '{}' must be positive, got {}", f.name, f.blocks[b].name, size));
      blocks.push_back(size);
    }
  }

  const TensorView& tensor(int param) const { return std::get<TensorView>(args.at(param)); }

  std::vector<int64_t> resolve(const Shape& s) const {
    std::vector<int64_t> out;
    out.reserve(s.size());
    for (const Dim& d : s) out.push_back(d.is_const() ? d.value : blocks.at(d.value));
    return out;
  }

  // const_value, scalar_param, tensor_dim and block_size: values known before launch.
  double leaf(const Op& op) const {
    const DType t = f.type(op.result).dtype;
    switch (op.kind) {
      case OpKind::const_value:
        if (t == DType::i1) return op.ival != 0 ? 1.0 : 0.0;
        if (is_int(t)) return wrap_int(t, op.ival);
        return numerics::round_double_to(t, op.fval);   // folded constants may hold more bits
      case OpKind::scalar_param: {
        const double v = std::get<float>(args.at(op.param));
        return is_int(t) ? wrap_int(t, to_i64(v)) : v;
      }
      case OpKind::tensor_dim: return static_cast<double>(tensor(op.param).shape.at(op.axis));
      case OpKind::block_size: return static_cast<double>(blocks.at(op.block_id));
      default: fail_at(op, fmt::format("'{}' is not a leaf scalar op", ir::name(op.kind)));
    }
  }
};

// Host-side scalar evaluation of launch bounds: leaf ops and scalar unary/binary/cast,
// recursively through their operands. A launch loop's bounds are defined in the regions that
// enclose it -- the function's body and the launch loops around it -- so only their own ops are
// indexed, not the kernel's inner loops (every launch evaluates this).
class ScalarEvaluator {
 public:
  ScalarEvaluator(const Bound& b, const std::vector<const Op*>& chain)
      : b_(b), defs_(b.f.values.size(), nullptr), memo_(b.f.values.size()), known_(b.f.values.size(), 0) {
    auto index = [&](const ir::Region& r) {
      for (const Op& op : r.ops)
        if (op.result >= 0) defs_[op.result] = &op;
    };
    index(b.f.body);
    for (const Op* loop : chain)
      if (loop->body) index(*loop->body);
  }

  double eval(int value) {
    if (known_.at(value)) return memo_[value];
    if (!defs_[value])
      throw Error(fmt::format("kernel '{}': a launch loop bound depends on a loop index (%{})", b_.f.name, value));
    const Op& op = *defs_[value];
    double r = 0;
    switch (op.kind) {
      case OpKind::const_value:
      case OpKind::scalar_param:
      case OpKind::tensor_dim:
      case OpKind::block_size: r = b_.leaf(op); break;
      case OpKind::unary:
        r = unary_elem(op, op.unary, b_.f.type(op.operands[0]).dtype, eval(op.operands[0]));
        break;
      case OpKind::binary:
        r = binary_elem(op, op.binary, b_.f.type(op.result).dtype, eval(op.operands[0]), eval(op.operands[1]));
        break;
      case OpKind::cast:
        r = cast_elem(b_.f.type(op.operands[0]).dtype, b_.f.type(op.result).dtype, eval(op.operands[0]));
        break;
      default:
        fail_at(op, fmt::format("kernel '{}': a launch loop bound depends on a '{}' op, which the host cannot evaluate",
                                b_.f.name, ir::name(op.kind)));
    }
    if (!b_.f.type(op.result).is_scalar()) fail_at(op, "a launch loop bound is not a scalar");
    memo_[value] = r;
    known_[value] = 1;
    return r;
  }

 private:
  const Bound& b_;
  // By value id (dense): three allocations instead of a hash node per op.
  std::vector<const Op*> defs_;
  std::vector<double> memo_;
  std::vector<char> known_;
};

// The chain of launch loops, outermost first.
std::vector<const Op*> launch_chain(const ir::Function& f) {
  std::vector<const Op*> chain;
  const ir::Region* region = &f.body;
  while (region) {
    const Op* next = nullptr;
    for (const Op& op : region->ops) {
      if (op.kind != OpKind::loop || !op.launch) continue;
      if (next) throw Error(fmt::format("kernel '{}': two launch loops in one region (the IR is malformed)", f.name));
      next = &op;
    }
    if (!next) break;
    chain.push_back(next);
    region = next->body.get();
  }
  return chain;
}

int64_t loop_extent(const Op& loop, int64_t begin, int64_t end, const Bound& b) {
  const int64_t n = std::max<int64_t>(0, end - begin);
  if (loop.loop_kind == ir::LoopKind::grid) return n;
  const int64_t block = b.blocks.at(loop.block_id);
  return (n + block - 1) / block;
}

LaunchShape compute_launch(const Bound& b) {
  LaunchShape ls;
  const std::vector<const Op*> chain = launch_chain(b.f);
  ScalarEvaluator ev(b, chain);
  for (const Op* loop : chain) {
    const int64_t begin = to_i64(ev.eval(loop->operands[0])), end = to_i64(ev.eval(loop->operands[1]));
    ls.extents.push_back(loop_extent(*loop, begin, end, b));
    ls.programs *= ls.extents.back();
  }
  return ls;
}

// ---- the executor ---------------------------------------------------------------------

class Executor {
 public:
  Executor(const Bound& b, const LaunchShape& ls, const ReferenceOptions& opt)
      : b_(b), f_(b.f), launch_(ls), opt_(opt), env_(b.f.values.size()) {}

  void run_program(int64_t program, const std::vector<int64_t>& coords) {
    program_ = program;
    coords_ = &coords;
    launch_level_ = 0;
    tracing_ = opt_.trace && (opt_.trace_program < 0 || opt_.trace_program == program);
    if (tracing_) std::cerr << fmt::format("[tj ref] kernel '{}' program {} of {}\n", f_.name, program, launch_.programs);
    exec_region(f_.body);
  }

 private:
  const Bound& b_;
  const ir::Function& f_;
  const LaunchShape& launch_;
  const ReferenceOptions& opt_;
  std::vector<Value> env_;
  int64_t program_ = 0;
  const std::vector<int64_t>* coords_ = nullptr;
  size_t launch_level_ = 0;
  bool tracing_ = false;
  int depth_ = 0;

  const Value& val(int id) const { return env_.at(id); }
  int64_t ival(int id) const { return to_i64(env_.at(id).scalar()); }

  Value make(int result) const {
    Value v;
    v.dtype = f_.type(result).dtype;
    v.shape = b_.resolve(f_.type(result).shape);
    v.data.assign(product(v.shape), 0.0);
    return v;
  }

  Value scalar_value(DType t, double x) const { return Value{t, {}, {x}}; }

  void set(const Op& op, Value v) {
    const TileType& t = f_.type(op.result);
    if (v.dtype != t.dtype || v.shape != b_.resolve(t.shape))
      fail_at(op, fmt::format("internal error: {} produced {} but its type is {}", ir::name(op.kind),
                              shape_text(v.dtype, v.shape), shape_text(t.dtype, b_.resolve(t.shape))));
    if (tracing_) trace(op, v);
    env_[op.result] = std::move(v);
  }

  void exec_region(const ir::Region& r) {
    for (const Op& op : r.ops) exec(op);
  }

  void exec(const Op& op) {
    switch (op.kind) {
      case OpKind::const_value:
      case OpKind::scalar_param:
      case OpKind::tensor_dim:
      case OpKind::block_size: set(op, scalar_value(f_.type(op.result).dtype, b_.leaf(op))); return;
      case OpKind::loop: exec_loop(op); return;
      case OpKind::full: {
        Value v = make(op.result);
        const double x = v.dtype == DType::i1 ? (op.ival != 0 ? 1.0 : 0.0)
                         : is_int(v.dtype)    ? wrap_int(v.dtype, op.ival)
                                              : numerics::round_double_to(v.dtype, op.fval);
        std::fill(v.data.begin(), v.data.end(), x);
        set(op, std::move(v));
        return;
      }
      case OpKind::arange: {
        Value v = make(op.result);
        const int64_t start = ival(op.operands.at(0));
        for (int64_t i = 0; i < v.numel(); ++i) v.data[i] = wrap_int(v.dtype, start + i);
        set(op, std::move(v));
        return;
      }
      case OpKind::load: exec_load(op); return;
      case OpKind::store:
      case OpKind::store_add: exec_store(op); return;
      case OpKind::gather: exec_gather(op); return;
      case OpKind::unary: {
        const Value& x = val(op.operands.at(0));
        Value v = make(op.result);
        for (int64_t i = 0; i < v.numel(); ++i) v.data[i] = unary_elem(op, op.unary, x.dtype, at(x, i));
        set(op, std::move(v));
        return;
      }
      case OpKind::binary: {
        const Value& a = val(op.operands.at(0));
        const Value& c = val(op.operands.at(1));
        Value v = make(op.result);
        check_operand(op, a, v);
        check_operand(op, c, v);
        for (int64_t i = 0; i < v.numel(); ++i) v.data[i] = binary_elem(op, op.binary, v.dtype, at(a, i), at(c, i));
        set(op, std::move(v));
        return;
      }
      case OpKind::where: {
        const Value& c = val(op.operands.at(0));
        const Value& x = val(op.operands.at(1));
        const Value& y = val(op.operands.at(2));
        Value v = make(op.result);
        check_operand(op, c, v);
        check_operand(op, x, v);
        check_operand(op, y, v);
        for (int64_t i = 0; i < v.numel(); ++i) v.data[i] = at(c, i) != 0 ? at(x, i) : at(y, i);
        set(op, std::move(v));
        return;
      }
      case OpKind::cast: {
        const Value& x = val(op.operands.at(0));
        Value v = make(op.result);
        for (int64_t i = 0; i < v.numel(); ++i) v.data[i] = cast_elem(x.dtype, v.dtype, at(x, i));
        set(op, std::move(v));
        return;
      }
      case OpKind::expand_dims: {
        Value v = val(op.operands.at(0));
        v.shape.insert(v.shape.begin() + op.axis, 1);
        set(op, std::move(v));
        return;
      }
      case OpKind::transpose: {
        const Value& x = val(op.operands.at(0));
        Value v = make(op.result);
        const int64_t rows = x.shape.at(0), cols = x.shape.at(1);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) v.data[j * rows + i] = x.data[i * cols + j];
        set(op, std::move(v));
        return;
      }
      case OpKind::broadcast: {
        Value v = make(op.result);
        broadcast_into(op, val(op.operands.at(0)), v);
        set(op, std::move(v));
        return;
      }
      case OpKind::reduce: exec_reduce(op); return;
      case OpKind::dot: exec_dot(op); return;
      case OpKind::var_decl:
      case OpKind::var_read: set(op, val(op.operands.at(0))); return;
      case OpKind::var_write: {
        const int var = op.operands.at(0);
        env_[var] = val(op.operands.at(1));
        if (tracing_) trace(op, env_[var]);
        return;
      }
    }
    fail_at(op, "unknown op kind");
  }

  // Element i of an operand that is a scalar or has the result's shape.
  static double at(const Value& x, int64_t i) { return x.is_scalar() ? x.data[0] : x.data[i]; }

  void check_operand(const Op& op, const Value& x, const Value& result) const {
    if (!x.is_scalar() && x.shape != result.shape)
      fail_at(op, fmt::format("operand of shape {} is neither a scalar nor the result's shape {}",
                              shape_text(x.dtype, x.shape), shape_text(result.dtype, result.shape)));
  }

  // Numpy broadcast of `x` (right-aligned) into the preallocated `out`.
  void broadcast_into(const Op& op, const Value& x, Value& out) const {
    if (x.is_scalar()) {
      std::fill(out.data.begin(), out.data.end(), x.data[0]);
      return;
    }
    const int r = static_cast<int>(out.shape.size());
    const int off = r - static_cast<int>(x.shape.size());
    if (off < 0) fail_at(op, "broadcast to a lower rank");
    std::vector<int64_t> src_stride(r, 0);
    int64_t s = 1;
    for (int d = r - 1; d >= off; --d) {
      const int64_t xd = x.shape[d - off];
      if (xd != 1 && xd != out.shape[d])
        fail_at(op, fmt::format("cannot broadcast {} to {}", shape_text(x.dtype, x.shape), shape_text(out.dtype, out.shape)));
      src_stride[d] = xd == 1 ? 0 : s;
      s *= xd;
    }
    std::vector<int64_t> idx(r, 0);
    for (int64_t i = 0; i < out.numel(); ++i) {
      int64_t src = 0;
      for (int d = 0; d < r; ++d) src += idx[d] * src_stride[d];
      out.data[i] = x.data[src];
      for (int d = r - 1; d >= 0; --d) {
        if (++idx[d] < out.shape[d]) break;
        idx[d] = 0;
      }
    }
  }

  void exec_loop(const Op& loop) {
    const int64_t begin = ival(loop.operands.at(0)), end = ival(loop.operands.at(1));
    const bool tile = loop.loop_kind == ir::LoopKind::tile;
    const int64_t step = tile ? b_.blocks.at(loop.block_id) : 1;
    auto run_body = [&](int64_t index) {
      env_[loop.body_index] = scalar_value(DType::i64, static_cast<double>(index));
      if (tracing_)
        std::cerr << fmt::format("[tj ref] {:{}}{} %{} = {}{}\n", "", 2 * depth_, tile ? "tile" : "grid", loop.body_index,
                                 index, loop.launch ? "  (launch)" : "");
      ++depth_;
      exec_region(*loop.body);
      --depth_;
    };
    if (loop.launch) {
      // One point of the launch nest: this program's coordinate on this loop.
      const size_t level = launch_level_++;
      const int64_t extent = loop_extent(loop, begin, end, b_);
      if (level >= coords_->size() || extent != launch_.extents.at(level))
        fail_at(loop, "internal error: the launch loop's extent differs from the launch shape");
      run_body(begin + (*coords_)[level] * step);
      --launch_level_;
      return;
    }
    for (int64_t index = begin; index < end; index += step) run_body(index);
  }

  struct Slice {
    std::vector<int64_t> start;     // per tensor dim
    std::vector<int> tile_dim;      // per tensor dim: the tile dim it maps to, or -1 (scalar)
    std::vector<int64_t> shape;     // the tile's shape
  };

  Slice slice(const Op& op) const {
    const ir::Param& p = f_.params.at(op.param);
    Slice s;
    for (int d = 0; d < p.rank(); ++d) {
      const ir::Index& ix = op.indices.at(d);
      s.start.push_back(ival(op.operands.at(d)));
      switch (ix.kind) {
        case ir::Index::Kind::scalar: s.tile_dim.push_back(-1); break;
        case ir::Index::Kind::block:
          s.tile_dim.push_back(static_cast<int>(s.shape.size()));
          s.shape.push_back(b_.blocks.at(ix.block_id));
          break;
        case ir::Index::Kind::all:
          s.tile_dim.push_back(static_cast<int>(s.shape.size()));
          s.shape.push_back(b_.tensor(op.param).shape.at(d));
          break;
      }
    }
    return s;
  }

  // Calls fn(tile element, inside, tensor offset) for every element of the slice; `inside` is
  // false where some index is out of bounds (masked). Offsets may be negative (negative strides).
  template <class Fn>
  void for_each_element(const Op& op, const Slice& s, Fn&& fn) const {
    const TensorView& t = b_.tensor(op.param);
    const std::vector<int64_t> strides = t.effective_strides();   // copy: the result may be thread-local
    const int rank = t.rank();
    const int64_t n = product(s.shape);
    std::vector<int64_t> idx(s.shape.size(), 0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t offset = 0;
      bool inside = true;
      for (int d = 0; d < rank; ++d) {
        const int64_t pos = s.start[d] + (s.tile_dim[d] >= 0 ? idx[s.tile_dim[d]] : 0);
        if (pos < 0 || pos >= t.shape[d]) {
          inside = false;
          break;
        }
        offset += pos * strides[d];
      }
      fn(i, inside, offset);
      for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
        if (++idx[d] < s.shape[d]) break;
        idx[d] = 0;
      }
    }
  }

  void exec_load(const Op& op) {
    const Slice s = slice(op);
    const TensorView& t = b_.tensor(op.param);
    Value v = make(op.result);
    if (v.shape != s.shape) fail_at(op, "internal error: the load's type differs from its slice");
    for_each_element(op, s, [&](int64_t i, bool inside, int64_t offset) {
      v.data[i] = inside ? numerics::load_element(t.data, t.dtype, offset) : 0.0;
    });
    set(op, std::move(v));
  }

  void exec_gather(const Op& op) {
    const TensorView& t = b_.tensor(op.param);
    const std::vector<int64_t> strides = t.effective_strides();
    Value v = make(op.result);
    std::vector<const Value*> idx;
    for (int o : op.operands) {
      idx.push_back(&val(o));
      check_operand(op, *idx.back(), v);
    }
    for (int64_t i = 0; i < v.numel(); ++i) {
      int64_t offset = 0;
      bool inside = true;
      for (size_t d = 0; d < idx.size(); ++d) {
        const int64_t x = static_cast<int64_t>(at(*idx[d], i));
        inside &= x >= 0 && x < t.shape[d];
        offset += x * strides[d];
      }
      v.data[i] = inside ? numerics::load_element(t.data, t.dtype, offset) : 0.0;
    }
    set(op, std::move(v));
  }

  // The atomic add's element: f32 rounds the sum once (the GPU's red.add.f32), integers wrap as
  // two's complement.
  static void add_element(void* data, DType t, int64_t offset, double x) {
    if (t == DType::i32 || t == DType::i64) {
      int64_t old = 0;
      std::memcpy(&old, static_cast<unsigned char*>(data) + offset * size_bytes(t), size_bytes(t));
      if (t == DType::i32) {
        const auto sum = static_cast<uint32_t>(static_cast<int32_t>(old)) + static_cast<uint32_t>(static_cast<int64_t>(x));
        std::memcpy(static_cast<unsigned char*>(data) + offset * 4, &sum, 4);
      } else {
        const uint64_t sum = static_cast<uint64_t>(old) + static_cast<uint64_t>(static_cast<int64_t>(x));
        std::memcpy(static_cast<unsigned char*>(data) + offset * 8, &sum, 8);
      }
      return;
    }
    numerics::store_element(data, t, offset, static_cast<double>(static_cast<float>(numerics::load_element(data, t, offset))) + x);
  }

  void exec_store(const Op& op) {
    const Slice s = slice(op);
    const TensorView& t = b_.tensor(op.param);
    const Value& x = val(op.operands.at(op.indices.size()));
    const Value* mask = op.ival == 1 ? &val(op.operands.at(op.indices.size() + 1)) : nullptr;
    if (!x.is_scalar() && x.shape != s.shape)
      fail_at(op, fmt::format("storing a tile of shape {} into a slice of shape [{}] of '{}'", shape_text(x.dtype, x.shape),
                              fmt::join(s.shape, ", "), f_.params.at(op.param).name));
    int64_t written = 0, masked = 0;
    for_each_element(op, s, [&](int64_t i, bool inside, int64_t offset) {
      if (!inside || (mask && at(*mask, i) == 0.0)) {
        ++masked;
        return;
      }
      if (op.kind == OpKind::store_add) add_element(t.data, t.dtype, offset, at(x, i));
      else numerics::store_element(t.data, t.dtype, offset, at(x, i));
      ++written;
    });
    if (tracing_)
      std::cerr << fmt::format("[tj ref] {:{}}{} {}[{}]: {} written, {} masked  ({})\n", "", 2 * depth_,
                               op.kind == OpKind::store ? "store" : "store_add", f_.params.at(op.param).name,
                               fmt::join(s.start, ", "), written, masked, op.loc.str());
  }

  // Positions [0, n) along a block axis take part while valid_begin + i < valid_end.
  int64_t valid_count(const Op& op, size_t first, int64_t n) const {
    if (op.operands.size() < first + 2) return n;
    const int64_t vb = ival(op.operands[first]), ve = ival(op.operands[first + 1]);
    return std::clamp<int64_t>(ve - vb, 0, n);
  }

  void exec_reduce(const Op& op) {
    const Value& x = val(op.operands.at(0));
    Value v = make(op.result);
    const int axis = op.axis;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[d];
    for (size_t d = axis + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
    const int64_t n = x.shape.at(axis);
    const int64_t valid = valid_count(op, 1, n);
    if (is_int(x.dtype)) {
      reduce_int(op, x, v, outer, inner, n, valid);
      set(op, std::move(v));
      return;
    }
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t in = 0; in < inner; ++in) {
        float acc = op.reduce == ir::ReduceFn::sum   ? 0.0f
                    : op.reduce == ir::ReduceFn::max ? -std::numeric_limits<float>::infinity()
                                                     : std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < valid; ++i) {
          const float e = static_cast<float>(x.data[(o * n + i) * inner + in]);
          switch (op.reduce) {
            case ir::ReduceFn::sum: acc = static_cast<float>(static_cast<double>(acc) + e); break;
            case ir::ReduceFn::max: acc = max_num(acc, e); break;
            case ir::ReduceFn::min: acc = min_num(acc, e); break;
          }
        }
        v.data[o * inner + in] = float_result(v.dtype, acc);
      }
    }
    set(op, std::move(v));
  }

  // Integer reductions in the dtype: sums wrap (two's complement); an empty max / min is the
  // dtype's lowest / highest value.
  void reduce_int(const Op& op, const Value& x, Value& v, int64_t outer, int64_t inner, int64_t n, int64_t valid) const {
    const bool i32 = x.dtype == DType::i32;
    const int64_t lo = i32 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min();
    const int64_t hi = i32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        int64_t acc = op.reduce == ir::ReduceFn::sum ? 0 : op.reduce == ir::ReduceFn::max ? lo : hi;
        for (int64_t i = 0; i < valid; ++i) {
          const int64_t e = to_i64(x.data[(o * n + i) * inner + in]);
          switch (op.reduce) {
            case ir::ReduceFn::sum:
              acc = to_i64(wrap_int(x.dtype, static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(e))));
              break;
            case ir::ReduceFn::max: acc = std::max(acc, e); break;
            case ir::ReduceFn::min: acc = std::min(acc, e); break;
          }
        }
        v.data[o * inner + in] = static_cast<double>(acc);
      }
  }

  void exec_dot(const Op& op) {
    const Value& a = val(op.operands.at(0));
    const Value& c = val(op.operands.at(1));
    const bool has_acc = op.ival == 1;
    Value v = make(op.result);
    const int64_t M = a.shape.at(0), K = a.shape.at(1), N = c.shape.at(1);
    if (c.shape.at(0) != K) fail_at(op, "internal error: dot inner dimensions differ");
    const int64_t valid = valid_count(op, has_acc ? 3 : 2, K);
    if (has_acc) {
      const Value& acc = val(op.operands.at(2));
      if (acc.shape != v.shape) fail_at(op, "internal error: dot accumulator shape");
      v.data = acc.data;
    }
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        float sum = static_cast<float>(v.data[m * N + n]);
        for (int64_t k = 0; k < valid; ++k) {
          const float p = static_cast<float>(a.data[m * K + k] * c.data[k * N + n]);   // exact product, rounded once
          sum = static_cast<float>(static_cast<double>(sum) + p);
        }
        v.data[m * N + n] = sum;
      }
    }
    set(op, std::move(v));
  }

  void trace(const Op& op, const Value& v) const {
    std::string what;
    switch (op.kind) {
      case OpKind::unary: what = std::string(ir::name(op.unary)); break;
      case OpKind::binary: what = std::string(ir::name(op.binary)); break;
      case OpKind::reduce: what = fmt::format("reduce_{} axis {}", ir::name(op.reduce), op.axis); break;
      case OpKind::load: what = fmt::format("load {}", f_.params.at(op.param).name); break;
      case OpKind::var_write: what = fmt::format("write %{}", op.operands.at(0)); break;
      default: what = std::string(ir::name(op.kind)); break;
    }
    std::string summary;
    if (v.numel() == 0) {
      summary = "empty";
    } else if (v.is_scalar() && v.dtype != DType::i1) {
      summary = fmt::format("= {}", v.data[0]);
    } else if (v.dtype == DType::i1) {
      int64_t ones = 0;
      for (double x : v.data) ones += x != 0;
      summary = fmt::format("true {} of {}", ones, v.numel());
    } else {
      double lo = std::numeric_limits<double>::infinity(), hi = -lo;
      int64_t nan = 0, inf = 0;
      for (double x : v.data) {
        if (std::isnan(x)) { ++nan; continue; }
        if (std::isinf(x)) ++inf;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      summary = nan == v.numel() ? fmt::format("all NaN") : fmt::format("min {:.6g} max {:.6g}", lo, hi);
      if (nan) summary += fmt::format("  NaN {}", nan);
      if (inf) summary += fmt::format("  inf {}", inf);
    }
    const std::string lhs = op.kind == OpKind::var_write ? std::string() : fmt::format("%{} = ", op.result);
    std::cerr << fmt::format("[tj ref] {:{}}{}{} : {}  {}  ({})\n", "", 2 * depth_, lhs, what, shape_text(v.dtype, v.shape),
                             summary, op.loc.str());
  }
};

std::string describe(const ir::Param& p) {
  std::vector<std::string> dims;
  for (int64_t d : p.static_shape) dims.push_back(d < 0 ? "?" : std::to_string(d));
  return fmt::format("{}[{}]", name(p.dtype), fmt::join(dims, ", "));
}

}  // namespace

namespace {

// The bytes [first, last) a view can touch (negative strides included); empty for no elements.
std::pair<uintptr_t, uintptr_t> byte_range(const TensorView& t) {
  if (t.numel() == 0 || !t.data) return {0, 0};
  const std::vector<int64_t> strides = t.effective_strides();
  int64_t lo = 0, hi = 0;
  for (int d = 0; d < t.rank(); ++d) {
    const int64_t reach = (t.shape[d] - 1) * strides[d];
    (reach < 0 ? lo : hi) += reach;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  const int64_t bytes = size_bytes(t.dtype);
  return {base + lo * bytes, base + (hi + 1) * bytes};
}

// An input (tj::In) that the kernel reads shares no memory with a tensor it writes: code
// generation may read an input's element once and reuse it (dsl/SEMANTICS.md), which a write
// through another view would make stale.
void check_inputs_apart(const ir::Function& f, const std::vector<ArgValue>& args) {
  // Only inputs the kernel reads: a slot that a specialization never loads (an unused rotation,
  // a bias that is not there) may hold any tensor. Which ones it reads is looked up (a walk over
  // the IR) only for an overlap: every launch comes through here.
  std::optional<std::vector<bool>> read;
  auto is_read = [&](size_t param) {
    if (!read) {
      read.emplace(f.params.size(), false);
      ir::walk(f.body, [&](const ir::Op& op, int) {
        if ((op.kind == ir::OpKind::load || op.kind == ir::OpKind::gather) && op.param >= 0) (*read)[op.param] = true;
      });
    }
    return (*read)[param];
  };
  for (size_t i = 0; i < args.size(); ++i) {
    if (f.params[i].kind != ir::ParamKind::tensor_in) continue;
    const auto in = byte_range(std::get<TensorView>(args[i]));
    if (in.first == in.second) continue;
    for (size_t j = 0; j < args.size(); ++j) {
      if (!f.params[j].is_tensor() || !f.params[j].writes()) continue;
      const TensorView& w = std::get<TensorView>(args[j]);
      const auto out = byte_range(w);
      if (w.device != std::get<TensorView>(args[i]).device || out.first == out.second) continue;
      if (in.first < out.second && out.first < in.second && is_read(i))
        throw Error(fmt::format("kernel '{}': input '{}' shares memory with '{}', which the kernel writes: an input (tj::In) "
                                "must not change during a launch; pass separate buffers, or declare '{}' tj::InOut",
                                f.name, f.params[i].name, f.params[j].name, f.params[i].name));
    }
  }
}

}  // namespace

void check_arguments(const ir::Function& f, const std::vector<ArgValue>& args, bool require_host) {
  if (args.size() != f.params.size()) {
    std::vector<std::string> names;
    for (const auto& p : f.params) names.push_back(p.name);
    throw Error(fmt::format("kernel '{}' takes {} arguments ({}), {} were given", f.name, f.params.size(),
                            fmt::join(names, ", "), args.size()));
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const ir::Param& p = f.params[i];
    // Formatted only for a message: every launch checks its arguments.
    const auto at = [&] { return fmt::format("kernel '{}': argument '{}'", f.name, p.name); };
    if (!p.is_tensor()) {
      if (!std::holds_alternative<float>(args[i]))
        throw Error(fmt::format("{}: expected a runtime scalar ({}), got a tensor ({})", at(), name(p.dtype),
                                std::get<TensorView>(args[i]).describe()));
      const float v = std::get<float>(args[i]);
      if (is_int(p.dtype) && (!std::isfinite(v) || std::trunc(v) != v))
        throw Error(fmt::format("{}: expected an integer value ({}), got {}", at(), name(p.dtype), v));
      continue;
    }
    if (!std::holds_alternative<TensorView>(args[i]))
      throw Error(fmt::format("{}: expected a tensor ({}), got a scalar ({})", at(), describe(p), std::get<float>(args[i])));
    const TensorView& t = std::get<TensorView>(args[i]);
    if (t.dtype != p.dtype) throw Error(fmt::format("{}: expected {}, got {}", at(), name(p.dtype), name(t.dtype)));
    if (t.rank() != p.rank())
      throw Error(fmt::format("{}: expected rank {} ({}), got rank {} ({})", at(), p.rank(), describe(p), t.rank(), t.describe()));
    for (int d = 0; d < t.rank(); ++d) {
      if (t.shape[d] < 0) throw Error(fmt::format("{}: dimension {} is negative ({})", at(), d, t.shape[d]));
      if (p.static_shape[d] >= 0 && t.shape[d] != p.static_shape[d])
        throw Error(fmt::format("{}: dimension {} is {} but the kernel was traced for {}", at(), d, t.shape[d], p.static_shape[d]));
    }
    if (!t.strides.empty() && static_cast<int>(t.strides.size()) != t.rank())
      throw Error(fmt::format("{}: {} strides given for a rank-{} tensor", at(), t.strides.size(), t.rank()));
    const std::vector<int64_t> strides = t.effective_strides();
    for (int d = 0; d < t.rank(); ++d)
      if (p.static_stride(d) >= 0 && strides[d] != p.static_stride(d))
        throw Error(fmt::format("{}: stride {} is {} but the kernel was compiled for stride {} there ({})", at(), d, strides[d],
                                p.static_stride(d), t.describe()));
    if (require_host) {
      if (t.device != Device::host)
        throw Error(fmt::format("{}: the CPU reference executor needs host memory, got a device tensor ({})", at(), t.describe()));
      if (!t.data && t.numel() > 0) throw Error(fmt::format("{}: data is null ({})", at(), t.describe()));
    }
  }
  check_inputs_apart(f, args);
}

LaunchShape launch_shape(const ir::Function& f, const Config& cfg, const std::vector<ArgValue>& args) {
  check_arguments(f, args, /*require_host=*/false);
  Bound b(f, cfg, args);
  return compute_launch(b);
}

void run_reference(const ir::Function& f, const Config& cfg, const std::vector<ArgValue>& args,
                   const ReferenceOptions& options) {
  check_arguments(f, args, /*require_host=*/true);
  Bound b(f, cfg, args);
  const LaunchShape ls = compute_launch(b);
  Executor ex(b, ls, options);
  std::vector<int64_t> coords(ls.extents.size(), 0);
  for (int64_t p = 0; p < ls.programs; ++p) {
    int64_t rest = p;
    for (int d = static_cast<int>(coords.size()) - 1; d >= 0; --d) {
      coords[d] = rest % ls.extents[d];
      rest /= ls.extents[d];
    }
    ex.run_program(p, coords);
  }
}

}  // namespace tj
