#pragma once
// The tilejit IR: a kernel is a tree of regions holding ops; values are tiles (rank 0 is a
// scalar). Mutable state lives in explicit variables (var_decl / var_read / var_write) so
// that the traced C++ loop body maps one-to-one onto loops with loop-carried state.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/types.h"

namespace tj::ir {

// Where the user's C++ created an op; errors and generated code point back to it.
struct SourceLoc {
  std::string file;
  int line = 0;
  int column = 0;
  std::string function;
  bool known() const { return line > 0; }
  std::string str() const;   // "file:line:column", or "<unknown>"
};

enum class OpKind : uint8_t {
  // scalars and parameters
  const_value,   // fval/ival -> scalar of `dtype`
  scalar_param,  // runtime kernel argument `param` -> scalar f32 / i64
  tensor_dim,    // size of dimension `axis` of tensor parameter `param` (i64 scalar)
  block_size,    // the block size `block_id` as an i64 scalar (constant once bound)
  // control flow
  loop,          // operands: begin, end. grid: index in [begin, end); tile: index = tile start
  // tile construction
  full,          // scalar value broadcast to `type`
  arange,        // operand: tile start; result i32[block] = start + [0, block)
  // memory
  load,          // operands: one per index (see `indices`); `param` is the tensor
  store,         // operands: indices..., value [, mask (ival == 1: an i1 tile of the value's shape)]
  store_add,     // as store, adding the value to the tensor's elements, atomically per element (f32 / i32 / i64)
  gather,        // operands: one integer tile per dim of `param` (broadcast to the result's shape);
                 // element e reads param[i0[e], i1[e], ...], 0 where an index is out of range
  // elementwise
  unary,         // `unary` names the function
  binary,        // `binary` names the function; operands broadcast
  where,         // cond, a, b
  cast,          // to `type.dtype`
  // shape
  expand_dims,   // insert a unit dim at `axis`
  transpose,     // rank-2 transpose
  broadcast,     // to `type.shape` (explicit form of the implicit broadcast)
  // reductions and contraction
  reduce,        // `reduce` along `axis`; operands: x [, valid_begin, valid_end]
  dot,           // a [M,K], b [K,N] [, acc [M,N]] [, k_begin, k_end]
  // variables
  var_decl,      // operand: initial value; result: the variable
  var_read,      // operand: variable
  var_write,     // operands: variable, value
};

enum class UnaryFn : uint8_t { neg, exp2, log2, exp, log, sqrt, rsqrt, abs, tanh, logical_not };
enum class BinaryFn : uint8_t {
  add, sub, mul, div, maximum, minimum, mod, floordiv,
  lt, le, gt, ge, eq, ne, logical_and, logical_or
};
enum class ReduceFn : uint8_t { sum, max, min };
enum class LoopKind : uint8_t { grid, tile };

std::string_view name(OpKind k);
std::string_view name(UnaryFn f);
std::string_view name(BinaryFn f);
std::string_view name(ReduceFn f);
// store or store_add: an op that writes a tensor's elements (same operands and indices).
inline bool is_store(OpKind k) { return k == OpKind::store || k == OpKind::store_add; }
bool is_comparison(BinaryFn f);

// How one tensor dimension is indexed by a load or store.
struct Index {
  enum class Kind : uint8_t {
    scalar,  // operand: i64 scalar; the dimension is dropped from the tile
    block,   // operand: tile start; `block_id` sets the extent; masked against the tensor dim
    all,     // the whole (static) dimension
  };
  Kind kind = Kind::scalar;
  int block_id = -1;
};

struct Region;

struct Op {
  OpKind kind{};
  int result = -1;              // value id, or -1 for ops without a result
  std::vector<int> operands;    // value ids
  SourceLoc loc;

  // Attributes; which ones matter depends on `kind`.
  double fval = 0;              // const_value (floats), full
  int64_t ival = 0;             // const_value (ints)
  int param = -1;               // scalar_param / tensor_dim / load / store / store_add
  int axis = -1;                // tensor_dim / expand_dims / reduce
  int block_id = -1;            // block_size / loop (tile) / arange
  UnaryFn unary{};
  BinaryFn binary{};
  ReduceFn reduce{};
  LoopKind loop_kind{};
  bool launch = false;          // loop: mapped onto the launch grid
  std::vector<Index> indices;   // load / store / store_add
  std::unique_ptr<Region> body; // loop; its first value is the loop index (`body_index`)
  int body_index = -1;          // loop: value id of the index inside the body
  // The named part of the user's code that traced this op (tj::TagScope), e.g. "score_mod" for
  // an attention hook; empty otherwise. Lowerings use it to find user code spliced into a
  // library kernel; it never changes what the op computes.
  std::string tag;
};

struct Region {
  int id = 0;
  std::vector<Op> ops;
};

enum class ParamKind : uint8_t { tensor_in, tensor_out, tensor_inout, scalar_f32, scalar_i64 };

struct Param {
  std::string name;
  ParamKind kind{};
  DType dtype{};                        // element type (tensors) or the scalar type
  std::vector<int64_t> static_shape;    // tensors: size per dim, -1 where dynamic
  std::vector<int64_t> static_strides;  // tensors: stride per dim in elements, -1 where dynamic (empty: all)
  int64_t static_stride(int d) const { return d < static_cast<int>(static_strides.size()) ? static_strides[d] : -1; }
  bool is_tensor() const { return kind <= ParamKind::tensor_inout; }
  bool writes() const { return kind == ParamKind::tensor_out || kind == ParamKind::tensor_inout; }
  int rank() const { return static_cast<int>(static_shape.size()); }
};

struct ValueInfo {
  TileType type;
  bool is_var = false;                  // a variable (var_decl result), not a tile
  int defining_region = 0;              // id of the region that defines it
};

struct BlockSymbol {
  std::string name;                     // the config's name ("m"), or "block_<id>" when unnamed
  int64_t fixed = 0;                    // > 0 when the user fixed it in tile(n, size)
  SourceLoc loc;                        // the tile() that created it
};

struct Function {
  std::string name;
  std::vector<Param> params;
  std::vector<ValueInfo> values;
  std::vector<BlockSymbol> blocks;
  Region body;
  int num_regions = 1;                  // region ids: 0 is `body`

  const TileType& type(int value) const { return values.at(value).type; }
};

// Visits every op in pre-order; `fn(op, depth)`.
template <class Fn>
void walk(const Region& r, Fn&& fn, int depth = 0) {
  for (const Op& op : r.ops) {
    fn(op, depth);
    if (op.body) walk(*op.body, fn, depth + 1);
  }
}

std::string print(const Function& f);              // human-readable IR text
Op copy_attributes(const Op& op);                   // op's kind and attributes: no result, operands or body
Region clone(const Region& r);                      // a deep copy (loop bodies included)
Function clone(const Function& f);
std::string type_str(const Function& f, const TileType& t);

}  // namespace tj::ir
