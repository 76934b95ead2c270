#pragma once
// Tensor-core planning: which dots of a kernel run on the tensor cores, and how their operands
// get there. The first pass of the generic tensor-core lowering; layout assignment
// (codegen/layout.h), the async schedule (codegen/async_plan.h) and the CUDA emitter read it.
//
// A dot runs on the tensor cores (wgmma on sm_90a, mma.sync on sm_80 / sm_89 / sm_90) when its
// operands are 16-bit (bf16 or f16, the same for both) or fp8 (e4m3 / e5m2, any pair; mma.sync
// from sm_89), its result tile fits the accumulator layout of the block's warps (rows a
// multiple of 16 per warp, 64 per warpgroup for wgmma; columns a multiple of 8) and K is a
// whole number of 32-byte steps. Each operand then reaches the tensor cores one of three ways:
//   - staged: a load whose every use is a tensor-core dot operand (directly or transposed) is
//     copied into shared memory, swizzled. wgmma: by TMA, in a ring of slots that advances with
//     its innermost enclosing loop (its home loop): while a slot is read the next ones fill, as
//     many as num_stages, where the load's indices can be computed for later iterations.
//     mma.sync: by the block's threads with cp.async, into a ring the same way (or where the
//     load stands if it cannot run ahead);
//     An fp8 load that a dot needs K-major but memory holds MN-major (V of an fp8 P.V) is staged
//     the same way when the producer warpgroup issues its fills: its other warps copy each fill
//     transposed into a ring of K-major slots that the dot reads (StagedLoad::transposed_copy);
//   - registers: any other tile is written by the block's threads into a swizzled
//     shared-memory buffer of its own before the dot (slower, for operands TMA cannot load:
//     computed tiles, tensors without a contiguous last dim, fp8 operands that are not K-major);
//   - fragment: an a operand in the accumulator layout goes in from registers.
// A dot that cannot run on the tensor cores stays on the SIMT path; the plan says why, with the
// dot's source line (MmaPlan::simt_dots), so that nothing falls back silently.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "codegen/target.h"
#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen {

// A tile in shared memory as a dot operand: `rows` rows of `row_bytes` bytes, in column blocks
// of `swizzle` bytes (device SmemOperand<rows, row_bytes, swizzle, mn_major, element bytes>).
// K-major: the rows are M (operand a) or N (operand b) and the bytes K; MN-major: the rows are
// K and the bytes M or N (16-bit types only).
struct SmemTile {
  int64_t rows = 0;
  int64_t row_bytes = 0;
  int swizzle = 128;
  bool mn_major = false;
  int elem_bytes = 2;
  int64_t bytes() const { return rows * row_bytes; }
};

// How one operand of a tensor-core dot reaches the tensor cores.
struct MmaOperand {
  // staged: TMA fills a ring slot; registers: the threads write a buffer of its own; fragment:
  // an a operand in the accumulator layout goes in from registers (wgmma's register A).
  enum class Source : uint8_t { staged, registers, fragment };
  Source source = Source::registers;
  int value = -1;        // the dot's operand with transposes folded: a load (staged) or a register tile
  bool transposed = false;   // the dot's operand is the transpose of `value`
  int staged = -1;       // index into MmaPlan::staged
  int buffer = -1;       // registers: index into MmaPlan::buffers
  SmemTile tile;         // the operand as the tensor cores read it
};

struct MmaDot {
  const ir::Op* op = nullptr;
  int64_t m = 0, n = 0, k = 0;
  DType ta{}, tb{};
  int n_per_instr = 0;   // wgmma n of one instruction (n is a multiple); mma.sync: 8
  MmaOperand a, b;
  // k positions past the dot's k range would contribute: the staged operands' rows there must
  // be zeroed when a tile ends past it (TMA fills zeros only past the tensor's dims).
  bool k_masked = false;
};

// A load that TMA copies into a ring of shared-memory slots (wgmma), or that the block's threads
// copy with cp.async (mma.sync: no barriers, no tensor map): where it runs ahead, into a ring of
// `stages` slots filled num_stages - 1 iterations of its home loop ahead (one cp.async group per
// iteration, waited for and made visible by a block barrier at the top of the iteration);
// otherwise into a slot of its own where the load stands.
struct StagedLoad {
  const ir::Op* op = nullptr;
  bool copy = false;              // mma.sync: copied by the threads
  const ir::Op* home = nullptr;   // the innermost enclosing loop that is not a launch loop, or null
  bool prefetch = false;          // later iterations' indices are computable: fills run ahead
  // Its indices and every enclosing loop's bounds come from scalar arithmetic alone: the
  // producer warpgroup (MmaPlan::producer_warp) issues its fills.
  bool producer = false;
  int stages = 1;                 // slots in the ring
  SmemTile tile;                  // one slot
  int row_dim = -1, inner_dim = -1;   // tensor dims of the tile's rows and of its contiguous bytes
  std::vector<int> box;           // TMA box per tensor dim (outermost first)
  int tma = -1;                   // index of its tensor map (GeneratedKernel::tma)
  int64_t smem_offset = 0;        // slot 0, from the tensor-core region's base (1024-aligned)
  int64_t slot_stride = 0;        // bytes between slots
  int64_t barriers = 0;           // offset of its 2 * stages mbarriers
  std::vector<const ir::Op*> readers;   // the tensor-core dots that read it
  // fp8 tiles that their dots need K-major but TMA writes MN-major (V of P.V, B stored [K, N]):
  // wgmma's fp8 operands are K-major only. TMA fills the ring above (`tile`, as in memory); the
  // producer warpgroup's other warps copy each fill transposed into a second ring of
  // `read_stages` slots (`read_tile`, K-major), which the dots read and the tiles' warps release.
  bool transposed_copy = false;
  // With it and knob fp8_key_order, where every reader is an fp8 dot whose a operand goes in from
  // the accumulator layout (P of P.V): the copy orders K within each 32-byte step as the
  // accumulator's columns reach a thread, so that the A fragments are the thread's own bytes with no shuffle across its quad
  // (tj::dev::fp8_kperm_col, as the attention template orders V).
  bool permute_k = false;
  // Its slot holds the tile's even rows, then its odd ones (K of S = Q.K^T for an fp8 P whose
  // scores are by parity; codegen/key_parity.h): TMA with a traversal stride of 2 rows, two
  // boxes of half the rows per fill, or the copy's row map (mma.sync).
  bool rows_by_parity = false;
  SmemTile read_tile;
  int read_stages = 0;
  int64_t read_offset = 0, read_slot_stride = 0, read_barriers = 0;
};

// The producer warpgroup's warps after the first (whose first thread issues the TMA fills) copy
// the transposed fills (StagedLoad::transposed_copy).
inline constexpr int kTransposerWarps = 3;

// A register operand's shared-memory buffer.
struct OperandBuffer {
  const ir::Op* dot = nullptr;
  int operand = 0;                // 0: a, 1: b
  SmemTile tile;
  int64_t smem_offset = 0;
};

struct MmaPlan {
  // The tensor-core instructions of the plan's dots: wgmma (sm_90a, warpgroups, asynchronous)
  // or mma.sync (a warp's m16n8 tiles, synchronous); none without dots on the tensor cores.
  enum class Isa : uint8_t { none, wgmma, mma_sync };
  Isa isa = Isa::none;
  int warps_r = 1, warps_c = 1;   // the accumulator layout's warps (MmaArr)
  int warpgroups = 0;
  // Knob warp_specialize (default 1): an extra warpgroup whose first thread only issues the TMA
  // fills of the staged loads it can compute (StagedLoad::producer), running ahead of the tiles'
  // warps by as many slots as the rings hold; it gives its registers to them (setmaxnreg). 0: a
  // thread of the tiles' warps issues the fills between its own work.
  bool producer_warp = false;
  int fp8_key_order = -1;   // knob fp8_key_order: transposed copies in P's key order (1), not (0), or where whole pieces allow (-1)
  std::vector<MmaDot> dots;
  std::vector<StagedLoad> staged;
  std::vector<OperandBuffer> buffers;
  // One tensor map per (tensor, box, swizzle): staged loads of the same box share it.
  struct Tma {
    int param = -1;
    std::vector<int> box;
    int swizzle = 128;
    std::vector<int> element_strides;   // traversal stride per tensor dim (empty: all 1)
  };
  std::vector<Tma> tmas;
  int64_t smem_bytes = 0;         // the tensor-core region (rings, buffers, barriers)
  // "dot at file:line: reason" for every dot left on the SIMT path of a tensor-core target.
  std::vector<std::string> simt_dots;

  bool wgmma() const { return isa == Isa::wgmma; }
  bool on_tensor_cores() const { return isa != Isa::none; }
  const MmaDot* dot_of(const ir::Op* op) const;
  const StagedLoad* staged_of(const ir::Op* op) const;
  bool empty() const { return dots.empty(); }
};

// The device library's name of a wgmma operand type (tj::dev::WG_BF16, ...; hopper_wgmma.cuh).
const char* wgmma_type(DType t);

// Plans `f` (launch loops marked) for `cfg` on `t`. Never throws for a dot it cannot place: it
// leaves it on the SIMT path with a reason.
MmaPlan plan_mma(const ir::Function& f, const Config& cfg, const Target& t);

// Once layouts are assigned (codegen/layout.h): a operands in the accumulator layout become
// register fragments (no buffer), and the shared memory is laid out (offsets, smem_bytes).
void finish_mma_plan(MmaPlan& plan, const std::function<bool(int value)>& in_accumulator_layout);

}  // namespace tj::codegen
