#include "dsl/rules.h"

#include <fmt/format.h>

namespace tj::rules {

namespace {
bool is_one(const Dim& d) { return d.is_const() && d.value == 1; }

// Why a mismatch that involves a tile loop's block dimension is one: such a dimension equals only
// itself (its loop's tiles), never a constant or another loop's block, whatever their sizes.
std::string block_mismatch_hint(const Shape& a, const Shape& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 1; i <= n; ++i) {
    const Dim &da = a[a.size() - i], &db = b[b.size() - i];
    if (da == db || is_one(da) || is_one(db)) continue;
    if (!da.is_const() || !db.is_const())
      return " (a tile loop's block dimension matches only tiles of that same loop, not a constant or another "
             "loop's block of the same size)";
  }
  return "";
}
}  // namespace

std::optional<Shape> broadcast(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const Dim* da = i < n - a.size() ? nullptr : &a[i - (n - a.size())];
    const Dim* db = i < n - b.size() ? nullptr : &b[i - (n - b.size())];
    if (!da) out[i] = *db;
    else if (!db) out[i] = *da;
    else if (*da == *db) out[i] = *da;
    else if (is_one(*da)) out[i] = *db;
    else if (is_one(*db)) out[i] = *da;
    else return std::nullopt;
  }
  return out;
}

bool broadcastable_to(const Shape& from, const Shape& to) {
  auto b = broadcast(from, to);
  return b && *b == to;
}

std::optional<DType> promote(DType a, DType b, std::string* why) {
  if (a == b) {
    if (is_fp8(a)) {
      *why = fmt::format("arithmetic on {} tiles is not supported: convert with .to(tj::DType::f32) first", name(a));
      return std::nullopt;
    }
    return a;
  }
  if (is_fp8(a) || is_fp8(b)) {
    *why = fmt::format("arithmetic mixing {} and {} is not supported: convert the fp8 tile with .to(tj::DType::f32) first",
                       name(a), name(b));
    return std::nullopt;
  }
  if (a == DType::i1 || b == DType::i1) {
    *why = fmt::format("cannot mix a boolean (i1) tile with {} in arithmetic: use tj::where", name(a == DType::i1 ? b : a));
    return std::nullopt;
  }
  if (is_float(a) && is_float(b)) return DType::f32;   // f16/bf16 with anything wider
  if (is_float(a)) return a;
  if (is_float(b)) return b;
  return DType::i64;                                    // i32 with i64
}

std::optional<TileType> binary(ir::BinaryFn fn, const TileType& a, const TileType& b, std::string* why,
                               const ir::Function* f) {
  auto shape = broadcast(a.shape, b.shape);
  if (!shape) {
    *why = fmt::format("shapes {} and {} do not broadcast{}", shape_str(f, a.shape), shape_str(f, b.shape),
                       block_mismatch_hint(a.shape, b.shape));
    return std::nullopt;
  }
  using F = ir::BinaryFn;
  if (fn == F::logical_and || fn == F::logical_or) {
    if (a.dtype != DType::i1 || b.dtype != DType::i1) {
      *why = fmt::format("&& and || need boolean tiles, got {} and {}", name(a.dtype), name(b.dtype));
      return std::nullopt;
    }
    return TileType{DType::i1, *shape};
  }
  DType da = a.dtype, db = b.dtype;
  if (ir::is_comparison(fn) && da == db && da == DType::i1 && (fn == F::eq || fn == F::ne))
    return TileType{DType::i1, *shape};
  auto t = promote(da, db, why);
  if (!t) return std::nullopt;
  if ((fn == F::mod || fn == F::floordiv) && !is_int(*t)) {
    *why = fmt::format("{} needs integer operands, got {}", ir::name(fn), name(*t));
    return std::nullopt;
  }
  if (ir::is_comparison(fn)) return TileType{DType::i1, *shape};
  return TileType{*t, *shape};
}

std::optional<TileType> unary(ir::UnaryFn fn, const TileType& x, std::string* why) {
  if (fn == ir::UnaryFn::logical_not) {
    if (x.dtype != DType::i1) { *why = fmt::format("! needs a boolean tile, got {}", name(x.dtype)); return std::nullopt; }
    return x;
  }
  if (is_fp8(x.dtype)) {
    *why = fmt::format("{} of an {} tile is not supported: convert with .to(tj::DType::f32) first", ir::name(fn), name(x.dtype));
    return std::nullopt;
  }
  if (x.dtype == DType::i1) { *why = fmt::format("{} of a boolean tile", ir::name(fn)); return std::nullopt; }
  if (fn == ir::UnaryFn::neg || fn == ir::UnaryFn::abs) return x;
  if (!is_float(x.dtype)) {
    *why = fmt::format("{} needs a floating-point tile, got {}: convert with .to(tj::DType::f32)", ir::name(fn), name(x.dtype));
    return std::nullopt;
  }
  return x;
}

std::optional<TileType> reduce(const TileType& x, int axis, std::string* why) {
  if (axis < 0 || axis >= x.rank()) {
    *why = fmt::format("reduction axis {} is out of range for a rank-{} tile", axis, x.rank());
    return std::nullopt;
  }
  if (x.dtype == DType::i1 || is_fp8(x.dtype)) {
    *why = fmt::format("reductions need an f32, f16, bf16, i32 or i64 tile, got {}: convert with .to({})", name(x.dtype),
                       x.dtype == DType::i1 ? "tj::DType::i32" : "tj::DType::f32");
    return std::nullopt;
  }
  TileType out = x;
  out.shape.erase(out.shape.begin() + axis);
  return out;
}

std::optional<TileType> dot(const TileType& a, const TileType& b, const TileType* acc, std::string* why,
                            const ir::Function* f) {
  if (a.rank() != 2 || b.rank() != 2) {
    *why = fmt::format("dot needs rank-2 tiles, got ranks {} and {}", a.rank(), b.rank());
    return std::nullopt;
  }
  if (!(a.shape[1] == b.shape[0])) {
    *why = fmt::format("dot: inner dimensions differ: {} · {}{}", shape_str(f, a.shape), shape_str(f, b.shape),
                       block_mismatch_hint({a.shape[1]}, {b.shape[0]}));
    return std::nullopt;
  }
  bool fp8_pair = is_fp8(a.dtype) && is_fp8(b.dtype);
  if (a.dtype != b.dtype && !fp8_pair) {
    *why = fmt::format("dot operands must have the same dtype (or both be fp8), got {} and {}", name(a.dtype), name(b.dtype));
    return std::nullopt;
  }
  if (!is_float(a.dtype)) {
    *why = fmt::format("dot needs floating-point operands, got {}", name(a.dtype));
    return std::nullopt;
  }
  TileType out{DType::f32, {a.shape[0], b.shape[1]}};
  if (acc) {
    if (acc->dtype != DType::f32) {
      *why = fmt::format("dot accumulator must be f32, got {}", name(acc->dtype));
      return std::nullopt;
    }
    if (acc->shape != out.shape) {
      *why = fmt::format("dot accumulator shape {} does not match the product's {}{}", shape_str(f, acc->shape),
                         shape_str(f, out.shape), block_mismatch_hint(acc->shape, out.shape));
      return std::nullopt;
    }
  }
  return out;
}

std::optional<TileType> transpose(const TileType& x, std::string* why) {
  if (x.rank() != 2) { *why = fmt::format("transpose needs a rank-2 tile, got rank {}", x.rank()); return std::nullopt; }
  return TileType{x.dtype, {x.shape[1], x.shape[0]}};
}

std::optional<TileType> expand_dims(const TileType& x, int axis, std::string* why) {
  if (axis < 0 || axis > x.rank()) {
    *why = fmt::format("expand_dims axis {} is out of range for a rank-{} tile", axis, x.rank());
    return std::nullopt;
  }
  TileType out = x;
  out.shape.insert(out.shape.begin() + axis, Dim::constant(1));
  return out;
}

bool castable(DType from, DType to, std::string* why) {
  if (from == DType::i1 && is_fp8(to)) {
    *why = "cannot cast a boolean tile to fp8";
    return false;
  }
  return true;
}

namespace {
// A tile loop's block as the user wrote it: its config name, or block(N) for an unnamed fixed size
// (the builder names those block_<id>).
std::string block_name(const ir::BlockSymbol& b, int64_t id) {
  if (b.fixed > 0 && b.name == fmt::format("block_{}", id)) return fmt::format("block({})", b.fixed);
  return b.name;
}
}  // namespace

std::string shape_str(const ir::Function* f, const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    if (s[i].is_const()) out += std::to_string(s[i].value);
    else if (f && s[i].value >= 0 && s[i].value < (int64_t)f->blocks.size()) out += block_name(f->blocks[s[i].value], s[i].value);
    else out += fmt::format("block_{}", s[i].value);
  }
  return out + "]";
}

}  // namespace tj::rules
