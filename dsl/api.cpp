#include "dsl/api.h"

#include <fmt/format.h>

#include "dsl/rules.h"

namespace tj {

using dsl::Builder;
using dsl::to_loc;
using ir::Op;
using ir::OpKind;

namespace {

Builder& B(const ir::SourceLoc& loc) { return Builder::current(loc); }

[[noreturn]] void fail(const ir::SourceLoc& loc, const std::string& msg) { throw DslError(loc, msg); }

Op make(OpKind kind, const ir::SourceLoc& loc, std::vector<int> operands = {}) {
  Op op;
  op.kind = kind;
  op.loc = loc;
  op.operands = std::move(operands);
  return op;
}

// The value of an operand; a C++ number takes the element type of `like` (a float literal
// next to an integer tile becomes f32).
int value_of(const Operand& o, std::optional<DType> like, const ir::SourceLoc& loc) {
  if (!o.is_number) {
    if (!o.tile.valid()) fail(loc, "use of a tile handle that holds no value (was it default-constructed?)");
    return o.tile.id();
  }
  DType t = DType::f32;
  if (like) {
    if (is_float(*like)) t = *like;
    else if (is_int(*like) || *like == DType::i1) t = o.is_integer ? (*like == DType::i1 ? DType::i64 : *like) : DType::f32;
  } else if (o.is_integer) {
    t = DType::i64;
  }
  return B(loc).constant_value(o.number, t, loc);
}

// Explicitly broadcasts `value` to `shape`. Scalars stay scalars in arithmetic (every lane
// has them) unless `expand_scalars` (stores and variables hold the full shape).
int broadcast_to(int value, const Shape& shape, const ir::SourceLoc& loc, bool expand_scalars = false) {
  Builder& b = B(loc);
  const TileType& t = b.type(value);
  if (t.shape == shape || (t.is_scalar() && !expand_scalars)) return value;
  if (!rules::broadcastable_to(t.shape, shape))
    fail(loc, fmt::format("cannot broadcast {} to {}", rules::shape_str(&b.function(), t.shape),
                          rules::shape_str(&b.function(), shape)));
  Op op = make(OpKind::broadcast, loc, {value});
  return b.emit(std::move(op), TileType{t.dtype, shape});
}

int cast_to(int value, DType to, const ir::SourceLoc& loc) {
  Builder& b = B(loc);
  DType from = b.type(value).dtype;
  if (from == to) return value;
  std::string why;
  if (!rules::castable(from, to, &why)) fail(loc, why);
  if (auto c = b.constant(value)) return b.constant_value(*c, to, loc);
  Op op = make(OpKind::cast, loc, {value});
  TileType t = b.type(value);
  t.dtype = to;
  return b.emit(std::move(op), t);
}

std::optional<double> fold(ir::BinaryFn fn, double x, double y, bool integer) {
  using F = ir::BinaryFn;
  switch (fn) {
    case F::add: return x + y;
    case F::sub: return x - y;
    case F::mul: return x * y;
    case F::div: return integer ? std::nullopt : std::optional<double>(x / y);
    case F::maximum: return std::max(x, y);
    case F::minimum: return std::min(x, y);
    case F::floordiv: return y == 0 ? std::nullopt : std::optional<double>(std::floor(x / y));
    case F::mod: return y == 0 ? std::nullopt : std::optional<double>(x - y * std::floor(x / y));
    default: return std::nullopt;
  }
}

int emit_unary(ir::UnaryFn fn, const Tile& x, const ir::SourceLoc& loc) {
  Builder& b = B(loc);
  int v = x.id();
  std::string why;
  auto t = rules::unary(fn, b.type(v), &why);
  if (!t) fail(loc, why);
  Op op = make(OpKind::unary, loc, {v});
  op.unary = fn;
  return b.emit(std::move(op), *t);
}

}  // namespace

// ---- Tile -----------------------------------------------------------------------------

Tile::Tile(const Tile& other) : value_(other.var_ >= 0 ? other.id() : other.value_) {}

Tile& Tile::operator=(const Tile& other) {
  value_ = other.var_ >= 0 ? other.id() : other.value_;
  var_ = -1;
  return *this;
}

int Tile::id() const {
  if (var_ < 0) return value_;
  Builder& b = B({});
  Op op = make(OpKind::var_read, b.last_loc(), {var_});
  return b.emit(std::move(op), b.type(var_));
}

const TileType& Tile::type() const {
  Builder& b = B({});
  return b.type(var_ >= 0 ? var_ : value_);
}

Tile Tile::to(DType t, Loc loc) const { return from_value(cast_to(id(), t, to_loc(loc))); }

Tile Tile::T(Loc l) const {
  auto loc = to_loc(l);
  Builder& b = B(loc);
  int v = id();
  std::string why;
  auto t = rules::transpose(b.type(v), &why);
  if (!t) fail(loc, why);
  return from_value(b.emit(make(OpKind::transpose, loc, {v}), *t));
}

Tile Tile::expand_dims(int axis, Loc l) const {
  auto loc = to_loc(l);
  Builder& b = B(loc);
  int v = id();
  std::string why;
  auto t = rules::expand_dims(b.type(v), axis, &why);
  if (!t) fail(loc, why);
  Op op = make(OpKind::expand_dims, loc, {v});
  op.axis = axis;
  return from_value(b.emit(std::move(op), *t));
}

Tile Tile::col(Loc loc) const {
  if (rank() != 1) fail(to_loc(loc), fmt::format(".col() needs a rank-1 tile, got rank {}", rank()));
  return expand_dims(1, loc);
}
Tile Tile::row(Loc loc) const {
  if (rank() != 1) fail(to_loc(loc), fmt::format(".row() needs a rank-1 tile, got rank {}", rank()));
  return expand_dims(0, loc);
}

// ---- Var ------------------------------------------------------------------------------

Var::Var(const Tile& init, Loc l) {
  auto loc = to_loc(l);
  Builder& b = B(loc);
  if (!init.valid()) fail(loc, "a tj::Var needs a tile to start from (e.g. tj::full({m}, 0.0, tj::DType::f32))");
  int v = init.id();
  var_ = b.emit(make(OpKind::var_decl, loc, {v}), b.type(v), /*is_var=*/true);
}

Var& Var::operator=(const Tile& v) {
  int value = v.id();
  return assign(value, B({}).loc_of(value));
}

Var& Var::operator=(Operand v) {
  auto loc = to_loc(v.loc);
  return assign(value_of(v, B(loc).type(var_).dtype, loc), loc);
}

Var& Var::assign(int value, const ir::SourceLoc& loc) {
  Builder& b = B(loc);
  const TileType var_type = b.type(var_);
  const TileType& t = b.type(value);
  if (t.dtype != var_type.dtype)
    fail(loc, fmt::format("assigning a {} tile to a tj::Var of {}: convert with .to(tj::DType::{})", name(t.dtype),
                          name(var_type.dtype), name(var_type.dtype)));
  if (!rules::broadcastable_to(t.shape, var_type.shape))
    fail(loc, fmt::format("assigning a tile of shape {} to a tj::Var of shape {}", rules::shape_str(&b.function(), t.shape),
                          rules::shape_str(&b.function(), var_type.shape)));
  value = broadcast_to(value, var_type.shape, loc, /*expand_scalars=*/true);
  b.emit(make(OpKind::var_write, loc, {var_, value}));
  return *this;
}

Var& Var::operator+=(Operand v) { return *this = Operand(binary(ir::BinaryFn::add, Operand(static_cast<const Tile&>(*this), v.loc), v, v.loc), v.loc); }
Var& Var::operator-=(Operand v) { return *this = Operand(binary(ir::BinaryFn::sub, Operand(static_cast<const Tile&>(*this), v.loc), v, v.loc), v.loc); }
Var& Var::operator*=(Operand v) { return *this = Operand(binary(ir::BinaryFn::mul, Operand(static_cast<const Tile&>(*this), v.loc), v, v.loc), v.loc); }
Var& Var::operator/=(Operand v) { return *this = Operand(binary(ir::BinaryFn::div, Operand(static_cast<const Tile&>(*this), v.loc), v, v.loc), v.loc); }

// ---- tile loops ------------------------------------------------------------------------

namespace {
int block_size_value(int block_id, const ir::SourceLoc& loc) {
  Builder& b = B(loc);
  int64_t fixed = b.function().blocks.at(block_id).fixed;
  if (fixed > 0) return b.constant_value(static_cast<double>(fixed), DType::i64, loc);
  Op op = make(OpKind::block_size, loc);
  op.block_id = block_id;
  return b.emit(std::move(op), TileType{DType::i64, {}});
}

int scalar_int(const Operand& o, const char* what, const ir::SourceLoc& loc) {
  int v = value_of(o, DType::i64, loc);
  const TileType& t = B(loc).type(v);
  if (!t.is_scalar() || !is_int(t.dtype))
    fail(loc, fmt::format("{} must be an integer scalar, got a {} tile of shape {}", what, name(t.dtype),
                          rules::shape_str(&B(loc).function(), t.shape)));
  return v;
}
}  // namespace

Int TileIndex::end(Loc l) const {
  auto loc = to_loc(l);
  Tile start = Tile::from_value(begin_);
  Tile stop = start + Operand(Tile::from_value(block_size_value(block_, loc)), l);
  return minimum(stop, Tile::from_value(loop_end_), l);
}

Tile TileIndex::index(Loc l) const {
  auto loc = to_loc(l);
  Op op = make(OpKind::arange, loc, {begin_});
  op.block_id = block_;
  return Tile::from_value(B(loc).emit(std::move(op), TileType{DType::i32, {Dim::block(block_)}}));
}

Int TileIndex::block_size(Loc l) const { return Tile::from_value(block_size_value(block_, to_loc(l))); }

namespace detail {

LoopRange::LoopRange(ir::LoopKind kind, Operand begin, Operand end, Block block, Loc l)
    : kind_(kind), loc_(to_loc(l)) {
  begin_ = scalar_int(begin, kind == ir::LoopKind::grid ? "the start of grid()" : "the start of tile()", loc_);
  end_ = scalar_int(end, kind == ir::LoopKind::grid ? "the extent of grid()" : "the end of tile()", loc_);
  if (kind == ir::LoopKind::tile) {
    if (block.size < 0) fail(loc_, fmt::format("block size must be positive, got {}", block.size));
    block_ = B(loc_).new_block(block.name, block.size, loc_);
  }
}

LoopRange::~LoopRange() { close(); }

void LoopRange::open() {
  // Its block is one loop's: a second loop over the same range would share a block dimension
  // (and so tiles) with the first.
  if (ran_) fail(loc_, "this tile range has already run its loop: call tile() again for a second loop");
  ran_ = true;
  index_ = B(loc_).open_loop(kind_, begin_, end_, block_, loc_);
  open_ = true;
}

void LoopRange::close() {
  if (!open_) return;
  open_ = false;
  if (Builder::active()) B(loc_).close_loop();
}

}  // namespace detail

detail::GridRange grid(Operand n, Loc loc) { return detail::GridRange(ir::LoopKind::grid, Operand(0, loc), n, {}, loc); }
detail::TileRange tile(Operand end, Block block, Loc loc) {
  return detail::TileRange(ir::LoopKind::tile, Operand(0, loc), end, std::move(block), loc);
}
detail::TileRange tile(Operand begin, Operand end, Block block, Loc loc) {
  return detail::TileRange(ir::LoopKind::tile, begin, end, std::move(block), loc);
}

// ---- tensors ---------------------------------------------------------------------------

int TensorArg::rank() const { return B({}).function().params.at(param_).rank(); }
DType TensorArg::dtype() const { return B({}).function().params.at(param_).dtype; }

void TensorArg::check_rank(int r, Loc l) const {
  auto loc = to_loc(l);
  const auto& p = B(loc).function().params.at(param_);
  if (p.rank() != r) fail(loc, fmt::format("'{}' has rank {}, not {}", p.name, p.rank(), r));
}

Int TensorArg::dim(int axis, Loc l) const {
  auto loc = to_loc(l);
  Builder& b = B(loc);
  const auto& p = b.function().params.at(param_);
  if (axis < 0 || axis >= p.rank()) fail(loc, fmt::format("'{}' has rank {}: no dimension {}", p.name, p.rank(), axis));
  if (p.static_shape[axis] >= 0) return Tile::from_value(b.constant_value(double(p.static_shape[axis]), DType::i64, loc));
  Op op = make(OpKind::tensor_dim, loc);
  op.param = param_;
  op.axis = axis;
  return Tile::from_value(b.emit(std::move(op), TileType{DType::i64, {}}));
}

std::optional<int64_t> TensorArg::static_dim(int axis, Loc l) const {
  auto loc = to_loc(l);
  const auto& p = B(loc).function().params.at(param_);
  if (axis < 0 || axis >= p.rank()) fail(loc, fmt::format("'{}' has rank {}: no dimension {}", p.name, p.rank(), axis));
  if (p.static_shape[axis] < 0) return std::nullopt;
  return p.static_shape[axis];
}

namespace {
// Resolves load/store indices: one operand per tensor dimension and the tile's shape.
Shape resolve_indices(const ir::Param& p, std::vector<IndexArg>& idx, Op& op, const ir::SourceLoc& loc) {
  Builder& b = B(loc);
  if (static_cast<int>(idx.size()) != p.rank())
    fail(loc, fmt::format("'{}' has rank {} but {} indices were given", p.name, p.rank(), idx.size()));
  Shape shape;
  for (size_t i = 0; i < idx.size(); ++i) {
    IndexArg& a = idx[i];
    ir::Index index{a.kind, a.block};
    switch (a.kind) {
      case ir::Index::Kind::scalar: {
        int v = a.is_literal ? b.constant_value(double(a.literal), DType::i64, loc) : a.value;
        const TileType& t = b.type(v);
        if (!t.is_scalar() || !is_int(t.dtype))
          fail(loc, fmt::format("index {} of '{}' must be an integer scalar, a tile index or tj::all; got a {} tile of shape {}",
                                i, p.name, name(t.dtype), rules::shape_str(&b.function(), t.shape)));
        op.operands.push_back(v);
        break;
      }
      case ir::Index::Kind::block:
        op.operands.push_back(a.value);
        shape.push_back(Dim::block(a.block));
        break;
      case ir::Index::Kind::all:
        if (p.static_shape[i] < 0)
          fail(loc, fmt::format("tj::all needs a static size, but dimension {} of '{}' is dynamic", i, p.name));
        op.operands.push_back(b.constant_value(0, DType::i64, loc));
        shape.push_back(Dim::constant(p.static_shape[i]));
        break;
    }
    op.indices.push_back(index);
  }
  return shape;
}
// The parameter a load or gather reads; outputs cannot be read.
ir::Param readable_param(Builder& b, int param, const ir::SourceLoc& loc) {
  const ir::Param p = b.function().params.at(param);
  if (p.kind == ir::ParamKind::tensor_out)
    fail(loc, fmt::format("'{}' is an output (tj::Out): declare it tj::InOut to read it", p.name));
  return p;
}
}  // namespace

Tile TensorArg::load_impl(std::vector<IndexArg> idx, Loc l) const {
  auto loc = to_loc(l);
  Builder& b = B(loc);
  const ir::Param p = readable_param(b, param_, loc);
  Op op = make(OpKind::load, loc);
  op.param = param_;
  Shape shape = resolve_indices(p, idx, op, loc);
  return Tile::from_value(b.emit(std::move(op), TileType{p.dtype, shape}));
}

Tile TensorArg::gather(std::vector<Operand> idx, Loc l) const {
  auto loc = to_loc(l);
  Builder& b = B(loc);
  const ir::Param p = readable_param(b, param_, loc);
  if (static_cast<int>(idx.size()) != p.rank())
    fail(loc, fmt::format("gather: '{}' has rank {} but {} index tiles were given", p.name, p.rank(), idx.size()));
  std::vector<int> values;
  Shape shape;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (idx[i].is_number && !idx[i].is_integer)
      fail(loc, fmt::format("gather: index {} of '{}' must be an integer, got {}", i, p.name, idx[i].number));
    const int v = value_of(idx[i], DType::i64, loc);
    const TileType& t = b.type(v);
    if (!is_int(t.dtype))
      fail(loc, fmt::format("gather: index {} of '{}' must be an integer tile or scalar, got a {} tile", i, p.name, name(t.dtype)));
    auto s = rules::broadcast(shape, t.shape);
    if (!s)
      fail(loc, fmt::format("gather: the index tiles of '{}' do not broadcast together: {} and {} (index {})", p.name,
                            rules::shape_str(&b.function(), shape), rules::shape_str(&b.function(), t.shape), i));
    shape = *s;
    values.push_back(v);
  }
  Op op = make(OpKind::gather, loc);
  op.param = param_;
  for (int v : values) op.operands.push_back(broadcast_to(v, shape, loc));
  return Tile::from_value(b.emit(std::move(op), TileType{p.dtype, shape}));
}

void TensorArg::store_impl(std::vector<IndexArg> idx, const Operand& v, const Tile* mask, bool add) const {
  auto loc = to_loc(v.loc);
  Builder& b = B(loc);
  const ir::Param p = b.function().params.at(param_);
  const char* what = add ? (mask ? "atomic_add_where" : "atomic_add") : (mask ? "store_where" : "store");
  if (!p.writes())
    fail(loc, fmt::format("'{}' is an input (tj::In): declare it tj::Out or tj::InOut to {} to it", p.name,
                          add ? "add" : "store"));
  if (add && p.dtype != DType::f32 && p.dtype != DType::i32 && p.dtype != DType::i64)
    fail(loc, fmt::format("{} into '{}', which holds {}: atomic adds take f32, i32 or i64 tensors (add into an f32 "
                          "tensor, then convert it in a second kernel)",
                          what, p.name, name(p.dtype)));
  Op op = make(add ? OpKind::store_add : OpKind::store, loc);
  op.param = param_;
  Shape shape = resolve_indices(p, idx, op, loc);
  int value = value_of(v, p.dtype, loc);
  const TileType& t = b.type(value);
  if (t.dtype != p.dtype)
    fail(loc, fmt::format("{} a {} tile into '{}', which holds {}: convert with .to(tj::DType::{})", add ? "adding" : "storing",
                          name(t.dtype), p.name,
                          name(p.dtype), name(p.dtype)));
  if (!rules::broadcastable_to(t.shape, shape))
    fail(loc, fmt::format("{} a tile of shape {} into a slice of shape {} of '{}'", add ? "adding" : "storing",
                          rules::shape_str(&b.function(), t.shape),
                          rules::shape_str(&b.function(), shape), p.name));
  op.operands.push_back(broadcast_to(value, shape, loc, /*expand_scalars=*/true));
  if (mask) {
    const TileType& mt = b.type(mask->id());
    if (mt.dtype != DType::i1)
      fail(loc, fmt::format("{} into '{}': the mask is a {} tile; it must be boolean (a comparison)", what, p.name,
                            name(mt.dtype)));
    if (!rules::broadcastable_to(mt.shape, shape))
      fail(loc, fmt::format("{} into '{}': a mask of shape {} does not broadcast to the slice's shape {}", what, p.name,
                            rules::shape_str(&b.function(), mt.shape), rules::shape_str(&b.function(), shape)));
    op.ival = 1;
    op.operands.push_back(broadcast_to(mask->id(), shape, loc, /*expand_scalars=*/true));
  }
  b.emit(std::move(op));
}

// ---- construction ------------------------------------------------------------------------

DimArg::DimArg(const Tile& static_size) {
  Builder& b = B({});
  auto c = b.constant(static_size.id());
  if (!c || !is_int(b.type(static_size.id()).dtype))
    throw DslError(b.last_loc(), "a tile dimension must be a tile index, an integer or a static size (this one is only known at run time)");
  dim = Dim::constant(static_cast<int64_t>(*c));
}

DimArg::DimArg(const detail::TileRange& loop) : dim(Dim::block(loop.block_id())) {}

Tile full(std::initializer_list<DimArg> shape, double value, DType dtype, Loc l) {
  auto loc = to_loc(l);
  Shape s;
  for (const auto& d : shape) {
    if (d.dim.is_const() && d.dim.value <= 0) fail(loc, fmt::format("tile dimensions must be positive, got {}", d.dim.value));
    s.push_back(d.dim);
  }
  Op op = make(OpKind::full, loc);
  op.fval = value;
  op.ival = static_cast<int64_t>(value);
  return Tile::from_value(B(loc).emit(std::move(op), TileType{dtype, s}));
}

Tile zeros(std::initializer_list<DimArg> shape, DType dtype, Loc loc) { return full(shape, 0.0, dtype, loc); }

Tile constant(double value, DType dtype, Loc l) {
  auto loc = to_loc(l);
  return Tile::from_value(B(loc).constant_value(value, dtype, loc));
}

// ---- elementwise -----------------------------------------------------------------------

Tile binary(ir::BinaryFn fn, const Operand& a, const Operand& b, Loc l) {
  auto loc = to_loc(l);
  Builder& bld = B(loc);
  if (a.is_number && b.is_number) fail(loc, "an operation between two C++ numbers needs no tilejit op");
  int va = a.is_number ? -1 : value_of(a, std::nullopt, loc);
  int vb = b.is_number ? -1 : value_of(b, std::nullopt, loc);
  if (va < 0) va = value_of(a, bld.type(vb).dtype, loc);
  if (vb < 0) vb = value_of(b, bld.type(va).dtype, loc);
  std::string why;
  auto t = rules::binary(fn, bld.type(va), bld.type(vb), &why, &bld.function());
  if (!t) fail(loc, fmt::format("{}: {}", ir::name(fn), why));
  if (!ir::is_comparison(fn) && fn != ir::BinaryFn::logical_and && fn != ir::BinaryFn::logical_or) {
    va = cast_to(va, t->dtype, loc);
    vb = cast_to(vb, t->dtype, loc);
  } else if (ir::is_comparison(fn) && bld.type(va).dtype != bld.type(vb).dtype) {
    std::string ignore;
    if (auto common = rules::promote(bld.type(va).dtype, bld.type(vb).dtype, &ignore)) {
      va = cast_to(va, *common, loc);
      vb = cast_to(vb, *common, loc);
    }
  }
  auto ca = bld.constant(va), cb = bld.constant(vb);
  if (ca && cb) {
    if (auto r = fold(fn, *ca, *cb, is_int(t->dtype))) return Tile::from_value(bld.constant_value(*r, t->dtype, loc));
  }
  va = broadcast_to(va, t->shape, loc);
  vb = broadcast_to(vb, t->shape, loc);
  Op op = make(OpKind::binary, loc, {va, vb});
  op.binary = fn;
  return Tile::from_value(bld.emit(std::move(op), *t));
}

Tile operator+(const Tile& a, Operand b) { return binary(ir::BinaryFn::add, Operand(a, b.loc), b, b.loc); }
Tile operator-(const Tile& a, Operand b) { return binary(ir::BinaryFn::sub, Operand(a, b.loc), b, b.loc); }
Tile operator*(const Tile& a, Operand b) { return binary(ir::BinaryFn::mul, Operand(a, b.loc), b, b.loc); }
Tile operator/(const Tile& a, Operand b) { return binary(ir::BinaryFn::div, Operand(a, b.loc), b, b.loc); }
Tile operator%(const Tile& a, Operand b) { return binary(ir::BinaryFn::mod, Operand(a, b.loc), b, b.loc); }
Tile operator<(const Tile& a, Operand b) { return binary(ir::BinaryFn::lt, Operand(a, b.loc), b, b.loc); }
Tile operator<=(const Tile& a, Operand b) { return binary(ir::BinaryFn::le, Operand(a, b.loc), b, b.loc); }
Tile operator>(const Tile& a, Operand b) { return binary(ir::BinaryFn::gt, Operand(a, b.loc), b, b.loc); }
Tile operator>=(const Tile& a, Operand b) { return binary(ir::BinaryFn::ge, Operand(a, b.loc), b, b.loc); }
Tile operator==(const Tile& a, Operand b) { return binary(ir::BinaryFn::eq, Operand(a, b.loc), b, b.loc); }
Tile operator!=(const Tile& a, Operand b) { return binary(ir::BinaryFn::ne, Operand(a, b.loc), b, b.loc); }
Tile operator&&(const Tile& a, Operand b) { return binary(ir::BinaryFn::logical_and, Operand(a, b.loc), b, b.loc); }
Tile operator||(const Tile& a, Operand b) { return binary(ir::BinaryFn::logical_or, Operand(a, b.loc), b, b.loc); }

Tile operator-(const Tile& a) {
  auto loc = B({}).loc_of(a.id());
  if (auto c = B(loc).constant(a.id())) return Tile::from_value(B(loc).constant_value(-*c, a.dtype(), loc));
  return Tile::from_value(emit_unary(ir::UnaryFn::neg, a, loc));
}
Tile operator!(const Tile& a) { return Tile::from_value(emit_unary(ir::UnaryFn::logical_not, a, B({}).loc_of(a.id()))); }

Tile floordiv(Operand a, Operand b, Loc loc) { return binary(ir::BinaryFn::floordiv, a, b, loc); }
Tile cdiv(Operand a, Operand b, Loc loc) {
  Tile num = binary(ir::BinaryFn::add, a, b, loc);
  num = binary(ir::BinaryFn::sub, Operand(num, loc), Operand(1, loc), loc);
  return binary(ir::BinaryFn::floordiv, Operand(num, loc), b, loc);
}
Tile maximum(Operand a, Operand b, Loc loc) { return binary(ir::BinaryFn::maximum, a, b, loc); }
Tile minimum(Operand a, Operand b, Loc loc) { return binary(ir::BinaryFn::minimum, a, b, loc); }

Tile where(Operand cond, Operand a, Operand b, Loc l) {
  auto loc = to_loc(l);
  Builder& bld = B(loc);
  if (cond.is_number) fail(loc, "where: the condition must be a boolean tile (a comparison)");
  int vc = cond.tile.id();
  if (bld.type(vc).dtype != DType::i1)
    fail(loc, fmt::format("where: the condition must be a boolean tile (a comparison), got {}", name(bld.type(vc).dtype)));
  if (a.is_number && b.is_number) fail(loc, "where: at least one of the two values must be a tile");
  int va = a.is_number ? -1 : value_of(a, std::nullopt, loc);
  int vb = b.is_number ? -1 : value_of(b, std::nullopt, loc);
  if (va < 0) va = value_of(a, bld.type(vb).dtype, loc);
  if (vb < 0) vb = value_of(b, bld.type(va).dtype, loc);
  std::string why;
  auto dt = rules::promote(bld.type(va).dtype, bld.type(vb).dtype, &why);
  if (!dt) fail(loc, "where: " + why);
  auto s1 = rules::broadcast(bld.type(va).shape, bld.type(vb).shape);
  auto s = s1 ? rules::broadcast(*s1, bld.type(vc).shape) : std::nullopt;
  if (!s)
    fail(loc, fmt::format("where: shapes {}, {} and {} do not broadcast", rules::shape_str(&bld.function(), bld.type(vc).shape),
                          rules::shape_str(&bld.function(), bld.type(va).shape),
                          rules::shape_str(&bld.function(), bld.type(vb).shape)));
  va = broadcast_to(cast_to(va, *dt, loc), *s, loc);
  vb = broadcast_to(cast_to(vb, *dt, loc), *s, loc);
  vc = broadcast_to(vc, *s, loc);
  return Tile::from_value(bld.emit(make(OpKind::where, loc, {vc, va, vb}), TileType{*dt, *s}));
}

Tile exp2(const Tile& x, Loc l) { return Tile::from_value(emit_unary(ir::UnaryFn::exp2, x, to_loc(l))); }
Tile log2(const Tile& x, Loc l) { return Tile::from_value(emit_unary(ir::UnaryFn::log2, x, to_loc(l))); }
Tile exp(const Tile& x, Loc l) { return Tile::from_value(emit_unary(ir::UnaryFn::exp, x, to_loc(l))); }
Tile log(const Tile& x, Loc l) { return Tile::from_value(emit_unary(ir::UnaryFn::log, x, to_loc(l))); }
Tile sqrt(const Tile& x, Loc l) { return Tile::from_value(emit_unary(ir::UnaryFn::sqrt, x, to_loc(l))); }
Tile rsqrt(const Tile& x, Loc l) { return Tile::from_value(emit_unary(ir::UnaryFn::rsqrt, x, to_loc(l))); }
Tile abs(const Tile& x, Loc l) { return Tile::from_value(emit_unary(ir::UnaryFn::abs, x, to_loc(l))); }
Tile tanh(const Tile& x, Loc l) { return Tile::from_value(emit_unary(ir::UnaryFn::tanh, x, to_loc(l))); }

// ---- reductions and dot ------------------------------------------------------------------

namespace {
// Operands [begin, end] of the open tile loop that owns `d`, when positions past the loop's
// end must be masked; none for static dims.
std::vector<int> valid_range(const Dim& d, const ir::SourceLoc& loc) {
  if (!d.is_block()) return {};
  const auto& scope = B(loc).block_scope(static_cast<int>(d.value));
  if (!scope.open) return {};
  return {scope.begin, scope.end};
}

Tile reduce(ir::ReduceFn fn, const Tile& x, int axis, const ir::SourceLoc& loc) {
  Builder& b = B(loc);
  int v = x.id();
  const TileType& xt = b.type(v);
  if (axis < 0) axis += xt.rank();
  std::string why;
  auto t = rules::reduce(xt, axis, &why);
  if (!t) fail(loc, why);
  Op op = make(OpKind::reduce, loc, {v});
  for (int r : valid_range(xt.shape[axis], loc)) op.operands.push_back(r);
  op.reduce = fn;
  op.axis = axis;
  return Tile::from_value(b.emit(std::move(op), *t));
}

Tile dot_impl(const Tile& a, const Tile& bt, const Tile* acc, const ir::SourceLoc& loc) {
  Builder& b = B(loc);
  int va = a.id(), vb = bt.id();
  int vacc = acc ? acc->id() : -1;
  std::string why;
  auto t = rules::dot(b.type(va), b.type(vb), acc ? &b.type(vacc) : nullptr, &why, &b.function());
  if (!t) fail(loc, why);
  Op op = make(OpKind::dot, loc, {va, vb});
  op.ival = acc ? 1 : 0;
  if (acc) op.operands.push_back(vacc);
  for (int r : valid_range(b.type(va).shape[1], loc)) op.operands.push_back(r);
  return Tile::from_value(b.emit(std::move(op), *t));
}
}  // namespace

Tile sum(const Tile& x, int axis, Loc l) { return reduce(ir::ReduceFn::sum, x, axis, to_loc(l)); }
Tile amax(const Tile& x, int axis, Loc l) { return reduce(ir::ReduceFn::max, x, axis, to_loc(l)); }
Tile amin(const Tile& x, int axis, Loc l) { return reduce(ir::ReduceFn::min, x, axis, to_loc(l)); }

Tile dot(const Tile& a, const Tile& b, Loc l) { return dot_impl(a, b, nullptr, to_loc(l)); }
Tile dot(const Tile& a, const Tile& b, const Tile& acc, Loc l) { return dot_impl(a, b, &acc, to_loc(l)); }

TagScope::TagScope(std::string tag, Loc loc) { B(to_loc(loc)).push_tag(std::move(tag)); }
TagScope::~TagScope() {
  if (dsl::Builder::active()) dsl::Builder::current({}).pop_tag();
}

}  // namespace tj
