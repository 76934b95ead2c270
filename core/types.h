#pragma once
// Element types and tile shapes shared by the IR, the code generator and the runtime.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tj {

enum class DType : uint8_t { f32, f16, bf16, e4m3, e5m2, i32, i64, i1 };

std::string_view name(DType t);                 // "f32", "bf16", "e4m3", ...
std::optional<DType> dtype_from_name(std::string_view s);
int size_bytes(DType t);                        // i1 counts as 1 byte
bool is_float(DType t);
bool is_fp8(DType t);
bool is_int(DType t);                           // i32, i64 (not i1)

// One dimension of a tile: a compile-time constant, or the block size of a tile loop,
// whose value the Config chooses (a tunable) after tracing.
struct Dim {
  enum class Kind : uint8_t { constant, block };
  Kind kind = Kind::constant;
  int64_t value = 1;   // constant: the size; block: the id of the block-size symbol

  static Dim constant(int64_t n) { return {Kind::constant, n}; }
  static Dim block(int block_id) { return {Kind::block, block_id}; }
  bool is_const() const { return kind == Kind::constant; }
  bool is_block() const { return kind == Kind::block; }
  bool operator==(const Dim&) const = default;
};

using Shape = std::vector<Dim>;

// The type of an IR value: an element type and a tile shape (rank 0 is a scalar).
struct TileType {
  DType dtype = DType::f32;
  Shape shape;
  int rank() const { return static_cast<int>(shape.size()); }
  bool is_scalar() const { return shape.empty(); }
  bool operator==(const TileType&) const = default;
};

}  // namespace tj
