#pragma once
// Layout assignment: where each IR value lives on the GPU (which thread holds which element).
//
// Kinds:
//   scalar       rank-0 values: a C++ local computed identically by every thread.
//   distributed  the SIMT register layout (codegen/device/tile.cuh, Blocked): the block's
//                threads form a grid of thread rows x thread columns (an Arrangement); a tile
//                has an extent along the rows and one along the columns, each covered
//                cyclically (thread row r holds rows r, r + rows, ...; likewise columns).
//                Rank-2 tiles [R, C] put R on the rows and C on the columns; a rank-1 tile lies
//                along the rows (row slice: what a row reduction yields; expand_dims(1) and
//                the broadcast to [R, C] are free) or the columns (column slice), or, in a
//                kernel without rank-2 tiles, along the columns of the flat arrangement
//                (thread t holds elements t, t + T, ... — coalesced 1-D access).
//   mma          the tensor cores' accumulator fragment (codegen/device/mma.cuh, Mma): dot
//                results on the tensor cores and every rank-2 value tied to them by elementwise
//                ops, variables and broadcasts, on the MmaArr of the block's warps (wgmma: every
//                warp along the rows). Rank-1 values reduced from them or broadcast into them
//                are its row slices ([R] as [R, 1]) or column slices ([C] as [1, C]). Extents:
//                rows 1 or a multiple of 16 per warp row, columns 1 or a multiple of 8 per warp
//                column; a value tied to the family that does not fit keeps the SIMT layout.
//                `by_parity`: the same registers with the tile's columns by parity (even columns
//                first; codegen/key_parity.h decides where).
//   shared       a tile that TMA copies into shared memory for the tensor cores (MmaPlan's
//                staged loads): it has no registers; its value is the slot's address.
//
// Choice of the 2-D arrangement (one per kernel, so that every rank-2 tile shares it and
// broadcasts along rows or columns never move data): lanes along the columns = the largest
// power of two <= min(8, smallest column extent > 1); the other lanes go to the rows; warps go
// to the rows as far as the smallest row extent > 1 allows, the rest to the columns. Config
// knobs "simt_lanes_c" and "simt_warps_c" override the choice. Knob "simt_vec" (a power of two
// up to 16, default 1) gives each thread column that many adjacent columns, so that loads and
// stores along contiguous rows move them in one access (16 bytes for 8 bf16).
//
// Conversions between layouts are explicit steps (plan_conversion): the emitter asks for one
// wherever an op needs its operand in another layout. A new layout kind adds conversions and op
// implementations; the emitter's structure stays.
#include <cstdint>
#include <string>
#include <vector>

#include "dsl/config.h"
#include "codegen/target.h"
#include "dsl/ir.h"

namespace tj::codegen {

enum class LayoutKind : uint8_t { scalar, distributed, mma, shared };
std::string_view name(LayoutKind k);

// The block's threads as lanes_r x lanes_c lanes per warp and warps_r x warps_c warps.
struct Arrangement {
  int lanes_r = 1, lanes_c = 32, warps_r = 1, warps_c = 1;
  int vec = 1;                                     // adjacent columns per thread column
  int rows() const { return lanes_r * warps_r; }   // thread rows
  int cols() const { return lanes_c * warps_c; }   // thread columns
  int col_cover() const { return cols() * vec; }   // columns one repetition covers
  int threads() const { return 32 * warps_r * warps_c; }
  std::string cuda_type() const;                   // "tj::dev::Arr<4, 8, 4, 1>" ("..., 1, 8>" with vec 8)
  std::string mma_cuda_type() const;               // "tj::dev::MmaArr<8, 1>" (warps only)
  static Arrangement mma(int warps_r, int warps_c) { return Arrangement{8, 4, warps_r, warps_c, 2}; }
  bool operator==(const Arrangement&) const = default;
};

struct Layout {
  LayoutKind kind = LayoutKind::scalar;
  int rank = 0;                     // of the tile
  // distributed:
  Arrangement arr;
  int64_t extent_r = 1;             // tile extent along the thread rows (1: none)
  int64_t extent_c = 1;             // tile extent along the thread columns (1: none)
  bool dim0_on_cols = false;        // rank 1: the tile's dim lies along the columns
  // mma, extent_c > 1: the thread's column c holds the tile's column keys_by_parity_col(c,
  // extent_c) (device Mma<A, R, C, 1>), set by order_keys_by_parity (codegen/key_parity.h).
  bool by_parity = false;

  static Layout scalar();
  // A tile staged in shared memory (a wgmma operand): no thread holds it.
  static Layout shared_tile();
  // A rank-2 tile [rows, cols], or a rank-1 tile of `n` elements along the rows / columns.
  static Layout blocked2(const Arrangement& a, int64_t rows, int64_t cols);
  static Layout row_slice(const Arrangement& a, int64_t n);
  static Layout col_slice(const Arrangement& a, int64_t n);
  // The accumulator layout on `a` (Arrangement::mma): [rows, cols] with either extent 1 for a slice.
  static Layout mma2(const Arrangement& a, int64_t rows, int64_t cols);
  // Whether a [rows, cols] tile fits the accumulator layout on `a`.
  static bool mma_fits(const Arrangement& a, int64_t rows, int64_t cols);

  bool is_scalar() const { return kind == LayoutKind::scalar; }
  bool is_distributed() const { return kind == LayoutKind::distributed; }
  bool is_mma() const { return kind == LayoutKind::mma; }
  bool columns_by_parity() const { return is_mma() && by_parity && extent_c > 1; }
  bool in_registers() const { return is_distributed() || is_mma(); }   // a register tile
  int slots_r() const;              // registers per thread along the rows
  int slots_c() const;
  int reps_c() const;               // repetitions of the column cover (slots_c without the vectors)
  int slots() const { return slots_r() * slots_c(); }   // elements per thread
  // Arrangement axis (0 rows, 1 columns) that holds tile dim `d`.
  int axis_of_dim(int d) const;
  // Every thread holds the tile's only element.
  bool replicated() const { return in_registers() && extent_r == 1 && extent_c == 1; }
  // Same register contents and device type (rank and tile-dim mapping aside).
  bool same_registers(const Layout& o) const;
  std::string cuda_type(const std::string& arr_name) const;   // "tj::dev::Blocked<A0, 64, 64>", "tj::dev::Mma<A1, 128, 64>"
  std::string str() const;          // for comments and errors
};

// How the emitter converts a value from one layout to another.
struct Conversion {
  enum class Kind : uint8_t {
    none,        // same registers: use the value as is
    broadcast,   // local: replicate along axes of extent 1 (no data exchange)
    exchange,    // through shared memory
    to_scalar,   // a replicated single element -> a scalar
    from_scalar, // a scalar -> a distributed tile (every slot)
  };
  Kind kind = Kind::none;
  int64_t smem_bytes = 0;
  // Strides for `exchange` (write at r*sr + c*sc from the source, read at r*dr + c*dc).
  int dr = 0, dc = 0, sr = 0, sc = 0;
  // The device expression that converts `value` (a C++ expression of the source layout) to
  // the destination layout, whose device type is `to_type`.
  std::string expr(const std::string& value, const std::string& to_type) const;
};

// Plans the conversion of a tile of register type size `elem_bytes` from `from` to `to`
// (both of the same logical shape; a broadcast may also widen extent-1 axes).
Conversion plan_conversion(const Layout& from, const Layout& to, int elem_bytes);

// The tile extents of `t` with the config's block sizes bound.
std::vector<int64_t> bind_shape(const ir::Function& f, const Config& cfg, const TileType& t);

// The result of layout assignment for one function.
struct LayoutPlan {
  std::vector<Layout> values;       // by value id (variables included)
  bool has_2d = false;              // any rank-2 tile: `arr2` is in use
  Arrangement arr2;                 // the arrangement of rank-2 tiles and their slices
  Arrangement arr1;                 // the flat arrangement of stand-alone rank-1 tiles
  int threads = 128;
  bool has_mma = false;             // any value in the accumulator layout: `arr_mma` is in use
  Arrangement arr_mma;

  const Layout& of(int value) const { return values.at(value); }
  // The layout a tile of the given rank-1 or rank-2 extents gets on arr2 (rank 2) /
  // as a row or column slice (rank 1).
  Layout natural2(int64_t rows, int64_t cols) const { return Layout::blocked2(arr2, rows, cols); }
};

// Assigns a layout to every value of `f`; `mma` (codegen/mma_plan.h), when given, places its
// tensor-core dots' results in the accumulator layout and its staged loads in shared memory.
// Throws DslError ("tiles of rank 3 are not supported by the CUDA backend yet") at an op with a
// tile of rank > 2.
struct MmaPlan;
LayoutPlan assign_layouts(const ir::Function& f, const Config& cfg, const Target& target, const MmaPlan* mma = nullptr);

}  // namespace tj::codegen
