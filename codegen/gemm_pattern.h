#pragma once
// What the tensor-core GEMM lowerings share (codegen/lower_gemm_sm90.cpp: wgmma + TMA on
// sm_90a; codegen/lower_gemm_sm80.cpp: mma.sync + cp.async on sm_80/sm_89/sm_90): the match
// of the GEMM loop nest and the writer of the epilogue generated from the kernel's own ops.
//
// The pattern (after tracing; block names are free):
//
//   for m in tile(M_end)            launch loop, begins at 0
//     for n in tile(N_end)          launch loop, begins at 0
//       acc = zeros({m, n}, f32)    a tj::Var
//       for k in tile(K_end)        begins at 0; K_end is A's or B's K dim
//         acc = dot(a.load(m, k), b.load(n, k).T(), acc)
//       <epilogue>                  elementwise ops on acc (scales, bias, casts, where, ...),
//                                   loads indexed by m, n or scalars, scalars and constants
//       c.store(..m.., ..n.., value)   exactly one store; m and n each index one dim of c
//
// with a [M, K], b [N, K] both e4m3/e5m2 (any pair) or both bf16 or both f16. Ops before the
// k loop that do not touch acc (e.g. loading a scale) are fine: they are pure and move to the
// epilogue. Anything else (other loops, reductions, a second store, b loaded as [k, n],
// mixed operand types, f32 operands) is not this pattern.
//
// The epilogue runs in the accumulator layout both instruction families share: per thread, a
// few row blocks (index tj_mb) of two rows each (tj_h: rows r and r + 8) and a few column
// octets (tj_j) of one column pair each (tj_e: columns c and c + 1); register
// tj_acc[tj_mb][4 * tj_j + 2 * tj_h + tj_e]. Every epilogue value is classified by what it
// depends on: scalar (once per thread), row (per tile: 2 per row block), column (per column
// pair: loaded once per tile), or element; each is computed at that rate. No shared memory.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen::gemm {

// How an epilogue value varies over the tile: not at all, along rows (m), along columns (n),
// or both. Values of the first three kinds are computed once per thread / per tile / per
// column pair; element values per accumulator register.
enum class Rate : uint8_t { scalar = 0, row = 1, col = 2, elem = 3 };

// A matched GEMM: the loops, the operand loads, the epilogue ops and their rates.
struct Match {
  const ir::Function* f = nullptr;
  const ir::Op* lm = nullptr;     // launch loops and the K loop
  const ir::Op* ln = nullptr;
  const ir::Op* lk = nullptr;
  int m_block = -1, n_block = -1, k_block = -1;
  int m_idx = -1, n_idx = -1, k_idx = -1;   // loop index values (tile starts)
  const ir::Op* load_a = nullptr;
  const ir::Op* load_b = nullptr;
  const ir::Op* dot = nullptr;
  int acc_var = -1;
  const ir::Op* store = nullptr;
  std::vector<const ir::Op*> hoisted;    // scalar ops at the top level and in the m loop body
  std::vector<const ir::Op*> epilogue;   // every other op of the n loop body but acc, the K loop, the store
  DType ta{}, tb{};
  std::vector<const ir::Op*> defs;       // defining op per value id
  std::vector<Rate> rate;                // per value id (epilogue and hoisted values)
  // The store: which tensor dim the row / column coordinate indexes.
  int store_row_dim = -1, store_col_dim = -1;
};

// Fills `g` when `f` has the GEMM shape above (any target, any config): the cheap structural
// test. False: not a GEMM of this form.
bool match(const ir::Function& f, Match& g);

// Whether A or B has a static K whose rows cannot start at multiples of `bytes` in a
// contiguous tensor (K * element size not a multiple): TMA and 16-byte cp.async cannot read it.
bool static_rows_misaligned(const Match& g, int bytes);

// default_config(f) with the GEMM's m, n and k blocks set to these sizes (blocks the kernel
// fixes itself keep their size): the base of a lowering's untuned config.
Config tile_config(const Match& g, int64_t m, int64_t n, int64_t k);

// How one thread's accumulator registers map onto the tile (see the header comment): row
// block tj_mb starts `row_block_stride` rows after the previous one; `col_octets` octets.
struct AccLayout {
  int row_blocks = 0;
  int row_block_stride = 0;   // 64 for wgmma's m64 blocks, 16 for mma.sync's m16 tiles
  int col_octets = 0;
  // Staged stores (gemm_common.cuh, gemm_flush_chunk): when stage_buf is set, an output with
  // unit column stride and 16-byte aligned rows goes out through this warp's shared-memory buffer
  // (expression stage_buf) in chunks of 64 bytes per row. Expressions: warp_row0 = the warp's
  // first row, warp_col0 = its first column, lane = the lane index; stage_sync = a statement run
  // before the buffer is first written (empty when it is the warp's own memory).
  std::string stage_buf, warp_row0, warp_col0, lane, stage_sync;
};

// Shared memory per consumer warp that staged stores need (AccLayout::stage_buf), for
// `row_blocks` m64 blocks per warpgroup.
int64_t staged_store_bytes_per_warp(int row_blocks);

// Writes the parts of a generated GEMM kernel that come from the kernel's own ops: parameter
// names, the values every program computes, the epilogue. The lowering writes the rest (its
// header, main loop, launch shape) around them, through line() into the same body.
class EpilogueWriter {
 public:
  EpilogueWriter(const Match& g, const Config& cfg);

  // The kernel's parameters as the generated signature declares them (ABI of cuda_emitter.h).
  std::vector<std::string> kernel_params() const;
  // The extern "C" entry name.
  std::string entry_name() const;
  // The C++ name of parameter `param`, and the size of its dim `axis` (a literal if static).
  const std::string& param_name(int param) const { return pnames_.at(param); }
  std::string param_dim(int param, int axis) const;
  // The expression of value `v` (valid in the context of its rate).
  const std::string& ref(int v) const { return names_.at(v); }

  // Appends a line to the body at the current indentation, with `// @ file:line` for `loc`.
  void line(const std::string& s, const ir::SourceLoc* loc = nullptr);
  void indent(int delta) { indent_ += delta; }
  const std::string& body() const { return out_; }

  // Scalar values of the top level and the m loop (loop bounds, scales every program loads).
  void emit_hoisted();
  // Epilogue values that are the same for every element (inside the thread's code path).
  void emit_scalar_epilogue();
  // The store's base offset and mask (scalar indices) and whether pairs can be stored at once:
  // tj_c_off, tj_c_ok, tj_vec.
  void emit_store_setup();
  // Per tile, after the main loop has filled tj_acc and the lowering has defined tj_row0 (the
  // thread's first row) and tj_col0 (its first column): row values and output pointers, column
  // values, then each element's value and the stores. Leaves the indentation as it found it.
  void emit_tile_epilogue(const AccLayout& acc);

 private:
  const Match& g_;
  const ir::Function& f_;
  const Config& cfg_;
  bool fast_math_;
  std::vector<std::string> pnames_;   // C++ name per parameter
  std::vector<std::string> names_;    // reference per value, valid in its rate's context
  std::vector<bool> live_;
  int store_value_ = -1;              // the stored value (a final cast to c's dtype left to the store)
  std::string out_;
  int indent_ = 1;

  void liveness();
  bool is_alias(const ir::Op& op) const;
  void emit_rate(const std::vector<const ir::Op*>& ops, Rate r);
  // Defines the value of `op` in the current context (statement or inline name).
  void emit_value(const ir::Op& op, Rate ctx);
  std::string op_expr(const ir::Op& op);
  // The address offset and mask of a load/store's element at the context's (row, col).
  std::pair<std::string, std::string> address(const ir::Op& op, size_t n_indices);
};

}  // namespace tj::codegen::gemm
