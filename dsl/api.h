#pragma once
// The user-facing tile language. A kernel body is ordinary C++ over these handles; running
// it once under a Builder records the IR (see dsl/kernel.h).
#include <array>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "dsl/builder.h"
#include "core/types.h"

namespace tj {

using Loc = std::source_location;

template <class T>
concept Number = std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;

// A handle to a traced value: a tile of some shape, or a scalar (rank 0). Copying a
// variable-backed handle (tj::Var) takes a snapshot of its current value.
class Tile {
 public:
  Tile() = default;
  Tile(const Tile& other);
  Tile& operator=(const Tile& other);
  static Tile from_value(int value) { Tile t; t.value_ = value; return t; }

  int id() const;                        // the value now (reads a variable)
  const TileType& type() const;
  DType dtype() const { return type().dtype; }
  int rank() const { return type().rank(); }
  bool valid() const { return value_ >= 0 || var_ >= 0; }

  Tile to(DType t, Loc loc = Loc::current()) const;         // cast
  Tile T(Loc loc = Loc::current()) const;                   // transpose (rank 2)
  Tile col(Loc loc = Loc::current()) const;                 // [m] -> [m, 1]
  Tile row(Loc loc = Loc::current()) const;                 // [n] -> [1, n]
  Tile expand_dims(int axis, Loc loc = Loc::current()) const;

 protected:
  int value_ = -1;
  int var_ = -1;
};

using Int = Tile;   // a scalar index value (i64)

// A right-hand operand: a tile or a C++ number. Converting to it records the source
// location of the expression, which operators cannot take as a default argument.
struct Operand {
  Operand(const Tile& t, Loc loc = Loc::current()) : tile(t), loc(loc) {}
  template <Number T>
  Operand(T v, Loc loc = Loc::current())
      : number(static_cast<double>(v)), is_number(true), is_integer(std::is_integral_v<T>), loc(loc) {}

  Tile tile;
  double number = 0;
  bool is_number = false;
  bool is_integer = false;
  Loc loc;
};

// Loop-carried state: assignment inside a loop updates it for the next iteration.
class Var : public Tile {
 public:
  Var(const Tile& init, Loc loc = Loc::current());
  Var(const Var&) = delete;
  Var& operator=(const Var& v) { return *this = Operand(static_cast<const Tile&>(v)); }
  Var& operator=(Operand v);
  // Operators cannot take a source location; the value's own (last traced) op stands in.
  Var& operator=(const Tile& v);
  Var& operator+=(Operand v);
  Var& operator-=(Operand v);
  Var& operator*=(Operand v);
  Var& operator/=(Operand v);

 private:
  Var& assign(int value, const ir::SourceLoc& loc);
};

// The index of a tile loop: the current tile's start, its extent and block size.
class TileIndex {
 public:
  TileIndex(int begin_value, int loop_end, int block_id)
      : begin_(begin_value), loop_end_(loop_end), block_(block_id) {}
  Int begin() const { return Tile::from_value(begin_); }
  Int end(Loc loc = Loc::current()) const;          // min(begin + block, loop end)
  Tile index(Loc loc = Loc::current()) const;       // i32 [block]: begin + 0, 1, ...
  Int block_size(Loc loc = Loc::current()) const;
  int block_id() const { return block_; }
  int loop_end_value() const { return loop_end_; }

 private:
  int begin_, loop_end_, block_;
};

namespace detail { class TileRange; }

// One dimension of a shape given to full/zeros: a tile loop's block, or a static size. A tile
// range named before its loop (`auto rows = tile(S); Var acc = zeros({rows, D}, ...); for (auto
// s : rows) ...`) gives its block to a Var that the loop updates tile by tile.
struct DimArg {
  DimArg(const TileIndex& t) : dim(Dim::block(t.block_id())) {}
  DimArg(const detail::TileRange& loop);
  template <std::integral T>
  DimArg(T n) : dim(Dim::constant(static_cast<int64_t>(n))) {}
  DimArg(const Tile& static_size);   // must fold to a constant (e.g. a static tensor dim)
  Dim dim;
};

struct AllTag {};
inline constexpr AllTag all{};

// How a load/store indexes one tensor dimension.
struct IndexArg {
  IndexArg(const Tile& scalar) : kind(ir::Index::Kind::scalar), value(scalar.id()) {}
  IndexArg(const TileIndex& t) : kind(ir::Index::Kind::block), value(t.begin().id()), block(t.block_id()) {}
  IndexArg(AllTag) : kind(ir::Index::Kind::all) {}
  template <std::integral T>
  IndexArg(T i) : kind(ir::Index::Kind::scalar), literal(static_cast<int64_t>(i)), is_literal(true) {}
  ir::Index::Kind kind;
  int value = -1;
  int block = -1;
  int64_t literal = 0;
  bool is_literal = false;
};

// Choice of block size for tile(): tunable (default), named, or fixed.
struct Block {
  std::string name;
  int64_t size = 0;
};
inline Block block(std::string name) { return Block{std::move(name), 0}; }
inline Block block(int64_t fixed_size) { return Block{{}, fixed_size}; }

// A tensor kernel parameter. In, Out and InOut say how the kernel uses it.
class TensorArg {
 public:
  TensorArg(int param) : param_(param) {}
  int param() const { return param_; }
  int rank() const;
  DType dtype() const;
  Int dim(int axis, Loc loc = Loc::current()) const;
  // The size of dimension `axis` when the trace compiles it in (a static shape), else
  // nullopt (a dynamic dim, known only at run time). Lets a kernel specialize on shapes,
  // e.g. a [1] scale tensor (per tensor) against an [M] one (per row).
  std::optional<int64_t> static_dim(int axis, Loc loc = Loc::current()) const;
  template <int R>
  std::array<Int, R> shape(Loc loc = Loc::current()) const {
    check_rank(R, loc);
    std::array<Int, R> out;
    for (int i = 0; i < R; ++i) out[i] = dim(i, loc);
    return out;
  }

  Tile load(IndexArg a, Loc loc = Loc::current()) const { return load_impl({a}, loc); }
  Tile load(IndexArg a, IndexArg b, Loc loc = Loc::current()) const { return load_impl({a, b}, loc); }
  Tile load(IndexArg a, IndexArg b, IndexArg c, Loc loc = Loc::current()) const {
    return load_impl({a, b, c}, loc);
  }
  Tile load(IndexArg a, IndexArg b, IndexArg c, IndexArg d, Loc loc = Loc::current()) const {
    return load_impl({a, b, c, d}, loc);
  }
  Tile load(IndexArg a, IndexArg b, IndexArg c, IndexArg d, IndexArg e, Loc loc = Loc::current()) const {
    return load_impl({a, b, c, d, e}, loc);
  }

  // Reads one element per position of the index tiles (one integer tile or scalar per
  // dimension, broadcast together: the result has their common shape), e.g. a block mask
  // t.gather({b, h, floordiv(q, 128), floordiv(kv, 128)}). Out-of-range positions read 0.
  Tile gather(std::vector<Operand> idx, Loc loc = Loc::current()) const;

  void store(IndexArg a, Operand v) const { store_impl({a}, v); }
  void store(IndexArg a, IndexArg b, Operand v) const { store_impl({a, b}, v); }
  void store(IndexArg a, IndexArg b, IndexArg c, Operand v) const { store_impl({a, b, c}, v); }
  void store(IndexArg a, IndexArg b, IndexArg c, IndexArg d, Operand v) const { store_impl({a, b, c, d}, v); }
  void store(IndexArg a, IndexArg b, IndexArg c, IndexArg d, IndexArg e, Operand v) const {
    store_impl({a, b, c, d, e}, v);
  }
  // The same, storing only the elements where `mask` (a boolean tile of the slice's shape, or one
  // that broadcasts to it) holds: a tile that ends inside the tensor stops there.
  void store_where(const Tile& mask, IndexArg a, Operand v) const { store_impl({a}, v, &mask); }
  void store_where(const Tile& mask, IndexArg a, IndexArg b, Operand v) const { store_impl({a, b}, v, &mask); }
  void store_where(const Tile& mask, IndexArg a, IndexArg b, IndexArg c, Operand v) const { store_impl({a, b, c}, v, &mask); }
  void store_where(const Tile& mask, IndexArg a, IndexArg b, IndexArg c, IndexArg d, Operand v) const {
    store_impl({a, b, c, d}, v, &mask);
  }
  // Adds the value to the slice's elements instead of storing it: each element's add is atomic,
  // so any number of programs may add into the same elements (a dQ that every key tile adds to).
  // f32, i32 and i64 tensors; the order of the adds, and so an f32 sum's rounding, is not fixed
  // from run to run (for bit-reproducible sums, give each program its own slice and reduce in a
  // second kernel). The tensor keeps what it held: zero it first to get the sum alone.
  void atomic_add(IndexArg a, Operand v) const { store_impl({a}, v, nullptr, true); }
  void atomic_add(IndexArg a, IndexArg b, Operand v) const { store_impl({a, b}, v, nullptr, true); }
  void atomic_add(IndexArg a, IndexArg b, IndexArg c, Operand v) const { store_impl({a, b, c}, v, nullptr, true); }
  void atomic_add(IndexArg a, IndexArg b, IndexArg c, IndexArg d, Operand v) const {
    store_impl({a, b, c, d}, v, nullptr, true);
  }
  void atomic_add(IndexArg a, IndexArg b, IndexArg c, IndexArg d, IndexArg e, Operand v) const {
    store_impl({a, b, c, d, e}, v, nullptr, true);
  }
  // The same, only where `mask` holds (as store_where).
  void atomic_add_where(const Tile& mask, IndexArg a, Operand v) const { store_impl({a}, v, &mask, true); }
  void atomic_add_where(const Tile& mask, IndexArg a, IndexArg b, Operand v) const { store_impl({a, b}, v, &mask, true); }
  void atomic_add_where(const Tile& mask, IndexArg a, IndexArg b, IndexArg c, Operand v) const {
    store_impl({a, b, c}, v, &mask, true);
  }
  void atomic_add_where(const Tile& mask, IndexArg a, IndexArg b, IndexArg c, IndexArg d, Operand v) const {
    store_impl({a, b, c, d}, v, &mask, true);
  }

 private:
  void check_rank(int r, Loc loc) const;
  Tile load_impl(std::vector<IndexArg> idx, Loc loc) const;
  void store_impl(std::vector<IndexArg> idx, const Operand& v, const Tile* mask = nullptr, bool add = false) const;
  int param_;
};

class In : public TensorArg { using TensorArg::TensorArg; };
class Out : public TensorArg { using TensorArg::TensorArg; };
class InOut : public TensorArg { using TensorArg::TensorArg; };

// A float32 value passed at launch (not baked into the code: changing it never recompiles).
class Scalar : public Tile {
 public:
  explicit Scalar(int value) { value_ = value; }
};

// Tags every op traced while it lives (ir::Op::tag), e.g. the user's hook inside a library
// kernel, so that a lowering can find that code again. Changes nothing the ops compute.
class TagScope {
 public:
  explicit TagScope(std::string tag, Loc loc = Loc::current());
  ~TagScope();
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;
};

// ---- loops -----------------------------------------------------------------------------
namespace detail {
class LoopRange {
 public:
  LoopRange(ir::LoopKind kind, Operand begin, Operand end, Block block, Loc loc);
  ~LoopRange();
  LoopRange(const LoopRange&) = delete;
  LoopRange& operator=(const LoopRange&) = delete;

  struct Sentinel {};
  template <class Value>
  struct Iterator {
    LoopRange* range;
    bool first = true;
    Value operator*() const { return range->template current<Value>(); }
    Iterator& operator++() { range->close(); first = false; return *this; }
    bool operator!=(Sentinel) const { return first; }
  };

  void open();
  void close();
  template <class Value>
  Value current() const;
  int block_id() const { return block_; }

 protected:
  ir::LoopKind kind_;
  int begin_ = -1, end_ = -1, block_ = -1, index_ = -1;
  bool open_ = false, ran_ = false;
  ir::SourceLoc loc_;
};

template <>
inline Int LoopRange::current<Int>() const { return Tile::from_value(index_); }
template <>
inline TileIndex LoopRange::current<TileIndex>() const { return TileIndex(index_, end_, block_); }

class GridRange : public LoopRange {
 public:
  using LoopRange::LoopRange;
  Iterator<Int> begin() { open(); return {this}; }
  Sentinel end() { return {}; }
};
class TileRange : public LoopRange {
 public:
  using LoopRange::LoopRange;
  Iterator<TileIndex> begin() { open(); return {this}; }
  Sentinel end() { return {}; }
};
}  // namespace detail

// `for (auto i : grid(n))`: one program (or loop iteration) per i in [0, n).
detail::GridRange grid(Operand n, Loc loc = Loc::current());
// `for (auto t : tile(n))`: tiles of a tunable block size over [0, n) (or [begin, end)).
detail::TileRange tile(Operand end, Block block = {}, Loc loc = Loc::current());
detail::TileRange tile(Operand begin, Operand end, Block block = {}, Loc loc = Loc::current());

// ---- tile construction -----------------------------------------------------------------
Tile full(std::initializer_list<DimArg> shape, double value, DType dtype, Loc loc = Loc::current());
Tile zeros(std::initializer_list<DimArg> shape, DType dtype, Loc loc = Loc::current());
Tile constant(double value, DType dtype, Loc loc = Loc::current());

// ---- elementwise -----------------------------------------------------------------------
Tile operator+(const Tile& a, Operand b);
Tile operator-(const Tile& a, Operand b);
Tile operator*(const Tile& a, Operand b);
Tile operator/(const Tile& a, Operand b);
Tile operator%(const Tile& a, Operand b);
Tile operator<(const Tile& a, Operand b);
Tile operator<=(const Tile& a, Operand b);
Tile operator>(const Tile& a, Operand b);
Tile operator>=(const Tile& a, Operand b);
Tile operator==(const Tile& a, Operand b);
Tile operator!=(const Tile& a, Operand b);
Tile operator&&(const Tile& a, Operand b);
Tile operator||(const Tile& a, Operand b);
Tile operator-(const Tile& a);
Tile operator!(const Tile& a);

Tile binary(ir::BinaryFn fn, const Operand& a, const Operand& b, Loc loc);
template <Number T> Tile operator+(T a, Operand b) { return binary(ir::BinaryFn::add, Operand(a, b.loc), b, b.loc); }
template <Number T> Tile operator-(T a, Operand b) { return binary(ir::BinaryFn::sub, Operand(a, b.loc), b, b.loc); }
template <Number T> Tile operator*(T a, Operand b) { return binary(ir::BinaryFn::mul, Operand(a, b.loc), b, b.loc); }
template <Number T> Tile operator/(T a, Operand b) { return binary(ir::BinaryFn::div, Operand(a, b.loc), b, b.loc); }

Tile floordiv(Operand a, Operand b, Loc loc = Loc::current());   // integers, rounds down
Tile cdiv(Operand a, Operand b, Loc loc = Loc::current());       // integers, rounds up
Tile maximum(Operand a, Operand b, Loc loc = Loc::current());
Tile minimum(Operand a, Operand b, Loc loc = Loc::current());
Tile where(Operand cond, Operand a, Operand b, Loc loc = Loc::current());

Tile exp2(const Tile& x, Loc loc = Loc::current());
Tile log2(const Tile& x, Loc loc = Loc::current());
Tile exp(const Tile& x, Loc loc = Loc::current());
Tile log(const Tile& x, Loc loc = Loc::current());
Tile sqrt(const Tile& x, Loc loc = Loc::current());
Tile rsqrt(const Tile& x, Loc loc = Loc::current());
Tile abs(const Tile& x, Loc loc = Loc::current());
Tile tanh(const Tile& x, Loc loc = Loc::current());

// ---- reductions and contraction ----------------------------------------------------------
// Reduce along `axis`. Positions past the end of a tile loop's range are left out.
Tile sum(const Tile& x, int axis, Loc loc = Loc::current());
Tile amax(const Tile& x, int axis, Loc loc = Loc::current());
Tile amin(const Tile& x, int axis, Loc loc = Loc::current());

// a [M, K] · b [K, N] (+ acc [M, N]); products accumulate in float32.
Tile dot(const Tile& a, const Tile& b, Loc loc = Loc::current());
Tile dot(const Tile& a, const Tile& b, const Tile& acc, Loc loc = Loc::current());

}  // namespace tj
