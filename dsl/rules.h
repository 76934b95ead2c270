#pragma once
// Typing rules shared by the tracer (which reports errors at the user's line as ops are
// created) and the verifier (which re-checks whole functions, e.g. after passes).
#include <optional>
#include <string>

#include "dsl/ir.h"

namespace tj::rules {

// Numpy-style broadcast of two shapes (right-aligned; equal dims or constant 1).
std::optional<Shape> broadcast(const Shape& a, const Shape& b);
// Can a tile of shape `from` be broadcast to `to` (same rank after right alignment)?
bool broadcastable_to(const Shape& from, const Shape& to);

// Element type of an arithmetic op on two dtypes; empty with `why` set when not allowed.
std::optional<DType> promote(DType a, DType b, std::string* why);

// Each returns the result type, or an empty optional with `why` set. `f` (optional) names the
// tile loops' blocks in `why`.
std::optional<TileType> binary(ir::BinaryFn fn, const TileType& a, const TileType& b, std::string* why,
                               const ir::Function* f = nullptr);
std::optional<TileType> unary(ir::UnaryFn fn, const TileType& x, std::string* why);
std::optional<TileType> reduce(const TileType& x, int axis, std::string* why);
std::optional<TileType> dot(const TileType& a, const TileType& b, const TileType* acc, std::string* why,
                            const ir::Function* f = nullptr);
std::optional<TileType> transpose(const TileType& x, std::string* why);
std::optional<TileType> expand_dims(const TileType& x, int axis, std::string* why);
bool castable(DType from, DType to, std::string* why);

// "[m, 128]": a block dimension by its tile loop's name, an unnamed fixed-size one as "block(64)"
// (without `f`: "block_<id>").
std::string shape_str(const ir::Function* f, const Shape& s);

}  // namespace tj::rules
