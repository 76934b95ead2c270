#pragma once
// The CUDA emitter's internals, shared by its files: cuda_emitter.cpp (the kernel, scalar and
// SIMT ops) and emit_mma.cpp (the tensor-core ops). Not an interface: codegen/cuda_emitter.h is.
#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "codegen/async_plan.h"
#include "codegen/cuda_emitter.h"
#include "codegen/layout.h"
#include "codegen/mma_plan.h"
#include "codegen/overlap_plan.h"
#include "codegen/scalar_expr.h"

namespace tj::codegen::emitter {

using ir::BinaryFn;
using ir::Op;
using ir::OpKind;
using ir::UnaryFn;
using scalar::cast_expr;
using scalar::dtag;
using scalar::literal;
using scalar::reg_type;
using scalar::rounding;
using scalar::float_literal;
using scalar::int_literal;
using scalar::round_host;
using scalar::identifier;
using scalar::reserved_name;

// Bytes of a register holding one element of dtype `t`.
inline int reg_bytes(DType t) {
  switch (t) {
    case DType::i64: return 8;
    case DType::i1: return 1;
    default: return 4;
  }
}

// ---- integer ranges (to drop masks that are provably always true) ----------------------------

struct Range {
  int64_t lo = std::numeric_limits<int64_t>::min();
  int64_t hi = std::numeric_limits<int64_t>::max();
  bool known_lo() const { return lo != std::numeric_limits<int64_t>::min(); }
  bool known_hi() const { return hi != std::numeric_limits<int64_t>::max(); }
  bool constant() const { return known_lo() && lo == hi; }
  static Range exactly(int64_t v) { return {v, v}; }
};

inline constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
inline constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

inline int64_t sat_add(int64_t a, int64_t b) {
  if (a == kMin || b == kMin) return kMin;
  if (a == kMax || b == kMax) return kMax;
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return a > 0 ? kMax : kMin;
  return r;
}

inline int64_t floordiv64(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// ---- the emitter -------------------------------------------------------------------------------

// The device type of an operand tile in shared memory (mma_layout.cuh's SmemOperand).
std::string operand_type(const SmemTile& t);
// Dim d's stride in generated code: the spec's, compiled in, else the argument's.
std::string stride_of(const ir::Param& p, const std::string& tensor, int d);

// Whether `op`'s body holds a load that the producer warpgroup stages (transposed: only those
// its transposer warps copy K-major).
bool holds_producer_load(const Op& op, const MmaPlan& mma, bool transposed = false);

class Emitter {
 public:
  Emitter(const ir::Function& f, const Config& cfg, const Target& t, bool start_early)
      : f_(f), cfg_(cfg), target_(t), start_early_(start_early) {}

  GeneratedKernel run();

 private:
  const ir::Function& f_;
  const Config& cfg_;
  const Target& target_;
  const bool start_early_;   // asked for (generate_simt)
  LayoutPlan plan_;
  bool persistent_ = false;              // knob persistent: blocks loop over the programs
  int64_t raster_group_ = 1;             // knob raster_group
  bool longest_first_ = false;           // knob longest_first
  bool program_order_ = false;           // the launch decodes programs with attn_tile_order.cuh
  int64_t stage_bytes_ = 0;              // staged stores' region (knob stage_stores), after the scratch
  int64_t stage_at_ = 0;
  bool wg_turns_ = false;                // knob wg_turns (wgmma, two or more warpgroups)
  // Knob wg_programs: programs the block runs at once, each on plan_.threads threads of its own
  // (slot s: threads s * plan_.threads ..) with a scratch of its own; the producer fills the
  // rings program by program, and each slot skips the other's fills.
  int slots_ = 1;
  bool emitting_producer_ = false;       // the producer warpgroup's nest is being emitted
  int64_t scratch_stride_ = 0;           // one slot's scratch bytes (tj_smem), set once the body is emitted
  const Op* pass_after_ = nullptr;       // the op after whose last ring wait the slot passes its turn
  int64_t tile_threads() const { return slots_ * plan_.threads; }   // the threads before the producer's
  bool overlap_ = false;                 // knob overlap (codegen/overlap_plan.h)
  bool rescale_at_end_ = false;          // knob overlap 2: the late dot's accumulator prepared at the iteration's end
  // Knob pin_waits: the f32 tiles computed since the last wgmma wait, with the indent they were
  // declared at (only those of the wait's own scope are named there); the words the pins store
  // to (tj_pin_at in tj_smem, past the staged stores' region) once any pin is emitted.
  bool pin_waits_ = false;
  std::vector<std::pair<int, int>> since_wait_;
  bool pins_used_ = false;
  int64_t pin_at_ = 0;
  // While a loop's ops are emitted out of program order (knob overlap): the async plan's waits
  // are the overlap's own, ring uses and carried values go by other names.
  bool suppress_async_ = false;
  std::map<int, std::string> use_name_;                 // staged load index -> its use's expression
  std::map<const Op*, std::string> carried_fragment_;   // dot -> its register A fragments' array
  // Knob wg_turns: the dots that take a turn, each with its loop; the loop's last such dot passes
  // the turn with the loop's final-iteration condition.
  struct Turn {
    const Op* loop = nullptr;
    bool last = false;
  };
  std::map<const Op*, Turn> turns_;
  MmaPlan mma_;                          // the dots on the tensor cores (empty: a SIMT kernel)
  AsyncPlan async_;                      // their waits and slot releases
  bool fast_math_ = false;
  // Programmatic dependent launch (start_early_ on sm_90+): the kernel lets the next one start at
  // once and waits for the previous one (griddep_wait) before the first op that touches memory
  // another kernel may write: a store, or a load of an Out / InOut tensor. Its In tensors are read
  // before that.
  bool starts_early_ = false;
  bool waited_ = false;

  std::vector<const Op*> def_;           // defining op per value
  // A value emitted as where(mask, a, b) whose mask holds on whole tiles in most iterations
  // (uniform_truth), or an elementwise op pushed through one: f(where(c, a, b), y) is computed as
  // where(c, f(a, y), f(b, y)), so that a whole tile runs the arm `a` alone and an elementwise
  // chain on it stays one expression for the compiler (softmax's x * s - m: one FFMA, no select).
  // The arms hold only while the value goes by `name` (not a carried copy of another iteration).
  struct MaskedValue {
    std::string whole;   // C++ condition: the mask holds on the whole tile
    std::string mask;    // the boolean tile, in the value's layout
    std::string a, b;    // the arms (tiles in the value's layout, or scalars)
    std::string name;    // the value's own tile
    // The failing arm's shape: a scalar, a vector of layout `b_vector` (an alias) that the
    // value's layout broadcasts, or (neither) a tile in the value's layout.
    bool b_scalar = false;
    std::string b_vector;
  };
  std::map<int, MaskedValue> masked_;
  // Emits an elementwise op with a masked operand as the where of its two arms; false where no
  // operand is masked (or two disagree on the mask).
  bool push_through_mask(const Op& op, const Layout& L, const std::vector<std::string>& params, const std::string& expr,
                         const std::vector<std::string>& args);
  std::vector<int> uses_;                // effective uses per value
  std::set<int> folded_;                 // transpose results folded into the dots that use them
  std::map<int, int> one_plus_tanh_;     // 1 + tanh(y) results -> y (tj::dev::one_plus_tanh)
  std::map<const Op*, int> store_cast_;  // stores of a cast to their float dtype -> the f32 value
  std::vector<Range> range_;             // integer scalars
  // Integer scalars: a divisor every value of it has (1: none known), and where it is a loop's
  // index, the loop's end (-1 otherwise): a tile loop's index below an end that both are
  // multiples of the block is a whole tile's start (causal attention's keys up to m.end()).
  std::vector<int64_t> divisor_;
  std::vector<int> loop_end_, loop_begin_;   // by a tile loop's index value: its bounds
  std::vector<std::string> names_;       // C++ expression per value
  std::vector<std::string> names_param_; // C++ name per parameter
  std::set<const Op*> hoisted_;          // launch-bound ops emitted before the program decode

  // Loads of In tensors already emitted, by their expression, with the indent of the statement
  // that defines them: a load with the same expression reuses the tile while that statement's
  // scope is open (In tensors are not written during a launch). Entries deeper than a closing
  // brace's line leave when it is emitted (line()).
  struct LoadedTile {
    std::string name;
    int indent = 0;
  };
  std::map<std::string, LoadedTile> loaded_;
  // Whether a tile loop runs exactly once (constant bounds, 0 < end - begin <= block): its body
  // is emitted in the enclosing scope (emit_loop).
  bool single_trip(const Op& loop) const;

  std::string body_;
  int indent_ = 1;
  int64_t smem_ = 0;
  std::string smem_what_;
  std::map<std::string, std::string> layout_alias_;   // device type -> alias
  std::vector<std::string> alias_lines_;
  std::map<std::string, std::string> arr_alias_;
  int temp_ = 0;

  // -- analysis
  void analyze();
  void compute_range(const Op& op);
  void compute_divisor(const Op& op);
  Range range(int v) const { return v >= 0 && v < (int)range_.size() ? range_[v] : Range{}; }
  int64_t divisor(int v) const { return v >= 0 && v < (int)divisor_.size() ? divisor_[v] : 1; }
  std::vector<int64_t> shape(int v) const { return bind_shape(f_, cfg_, f_.type(v)); }

  // -- output helpers
  void line(const std::string& code, const ir::SourceLoc* loc = nullptr);
  std::string marker(const ir::SourceLoc& loc) const;
  std::string alias(const Layout& l);
  // max / min of a tile times an f32 scalar (through a mask's where, and under a range mask):
  // the code of the reduction op, or nothing where the rule does not apply.
  std::optional<std::string> scaled_extremum(const ir::Op& op, bool range_masked);
  // The device call of reduction `op` (fn: op_sum / op_max / op_min) over `tile`, masked at the
  // op's valid range or not.
  std::string reduce_call(const ir::Op& op, const char* fn, int axis, DType t, const std::string& tile, bool masked) const;
  std::string tile_type(DType t, const Layout& l) { return fmt::format("tj::dev::Tile<{}, {}>", reg_type(t), alias(l)); }
  std::string fresh(int v, const char* what) { return fmt::format("v{}_{}{}", v, what, temp_++); }
  void need_smem(int64_t bytes, const std::string& what);
  std::string ref(int v) const { return names_.at(v); }
  // `v` in layout `want`, emitting a conversion statement when data must move.
  std::string operand(int v, const Layout& want, const ir::SourceLoc& loc);
  std::string convert(const std::string& expr, const Layout& have, const Layout& want, DType t, const ir::SourceLoc& loc,
                      int v);
  // Is the valid range [vb, ve) provably covering every position of an extent?
  bool provably_full(int vb, int ve, int64_t extent) const;
  bool end_at_most(int e, int v, int begin) const;
  void check_tile(int v, const Layout& l, const ir::SourceLoc& loc);
  void check_slots(const Layout& l, const std::string& what, const ir::SourceLoc& loc);

  // -- emission
  void emit_header(std::string& out, const std::string& entry);
  void emit_launch();
  void emit_region(const ir::Region& r);
  void emit_op(const Op& op);
  void emit_simt_op(const Op& op);
  void check_power_of_two_tiles() const;
  void emit_scalar_leaf(const Op& op);
  void emit_loop(const Op& op);
  // Knob overlap: `op` with its late ops one iteration behind (codegen/emit_overlap.cpp).
  void emit_overlapped_loop(const Op& op, const OverlapLoop& o);
  // The late ops of the iteration whose index is `index`, their ring uses `use(i)` (i: staged load).
  // `prep`: late ops that make the chained dot's accumulator operand, emitted at the end of
  // the iteration instead (knob overlap 2), whose result the accumulator variable then holds.
  void emit_late_ops(const Op& loop, const OverlapLoop& o, const std::string& index,
                     const std::function<std::string(int)>& use, const std::set<const Op*>& prep);
  // The C++ type of value v's registers (a tile in its layout, or a scalar).
  std::string value_type(int v);
  void emit_memory(const Op& op);
  // Whether `stage` bytes of staging past the scratch fit the block (knob stage_stores: and, at
  // value 1, leave as many blocks an SM as without).
  bool staging_fits(int64_t stage) const;
  void emit_gather(const Op& op);
  void emit_elementwise(const Op& op);
  // Defines op's result as `expr` (a scalar result) or as tj::dev::map of a lambda with `capture`
  // and `params` returning `expr` over `args` (a tile in layout L).
  void define_mapped(const Op& op, const Layout& L, const char* capture, const std::vector<std::string>& params,
                     const std::string& expr, const std::vector<std::string>& args);
  void emit_shape(const Op& op);
  void emit_reduce(const Op& op);
  void emit_dot(const Op& op);
  void emit_var(const Op& op);
  bool pure_and_unused(const Op& op) const;
  // Operand i of `op` is the value of an unmasked store (or atomic add) of two tile dims, made by a
  // transpose of a register tile: the store can take the source with its axes swapped.
  bool store_folds_transpose(const Op& op, size_t i) const;
  // A store, or a load / gather of a tensor the kernel writes, in `op` or in its body.
  bool touches_written_memory(const Op& op) const;
  // The wait for the previous kernel, once, before the first op that touches written memory.
  void wait_before(const Op& op);

  std::string unary_expr(UnaryFn fn, DType t, const std::string& x) const;
  std::string binary_expr(BinaryFn fn, DType operand, DType result, const std::string& a, const std::string& b) const;
  std::string cast_expr(DType from, DType to, const std::string& x) const;
  // Is `start + [0, extent)` provably inside [0, dim) for a static dim?
  bool provably_inside(int start, int64_t extent, int64_t dim) const;
  // A loop's step in generated code: its block size (tile loops) or 1.
  std::string loop_step(const Op& loop) const;
  // Dim d of tensor parameter `param` in generated code: the spec's size, compiled in, else the
  // argument's.
  std::string dim_limit(int param, int d) const;
  // The element offset ("0" if none) and the in-range condition ("true" if none) of load / store
  // `op`'s scalar indices, each index written by `val` (its name, or its value for another
  // iteration); ranges drop the terms that are provably 0 or true.
  std::pair<std::string, std::string> scalar_index_terms(const Op& op, const std::function<std::string(int)>& val) const;
  // Throws at the op's line when scalar index d of load / store `op`, of range r, can leave its dim.
  void check_scalar_index(const Op& op, int d, const Range& r) const;
  std::string define(int v, const std::string& expr, const ir::SourceLoc& loc);
  // Interval [lo, hi] (C++ expressions) of an integer tile made of aranges, broadcasts, casts,
  // sums and differences of them and scalars; nothing for other values.
  std::optional<std::pair<std::string, std::string>> index_interval(int v) const;
  // For a boolean tile made of comparisons of such tiles (and, or, not): the C++ conditions under
  // which it holds on the whole tile and fails on the whole tile.
  std::optional<std::pair<std::string, std::string>> uniform_truth(int v) const;
  // The C++ expression of a scalar leaf op (constant, parameter, tensor dim, block size).
  std::string leaf_name(const Op& op) const;

  // -- tensor cores (emit_mma.cpp)
  // The kernel's tensor-core setup: shared-memory regions, ring barriers, use counters.
  void emit_mma_prologue();
  // A staged load: its slot's address, once TMA has filled it (issuing the fill where the load
  // does not run ahead).
  void emit_staged_load(const Op& op, const StagedLoad& s);
  void emit_mma_dot(const Op& op, const MmaDot& d);
  // Registers of dot d's A fragments (a register A operand), and their making from its value
  // (k-masked where the tile runs past the dot's k range) into the array `frags`.
  int64_t a_frag_regs(const MmaDot& d) const;
  int64_t row_blocks(const MmaDot& d) const;   // of d's rows per warpgroup (wgmma) or warp (mma.sync)
  void emit_a_frags(const Op& dot, const MmaDot& d, const std::string& frags);
  // The async plan's wait and releases at one point.
  // `exited_loop`: the wait stands right after that loop (its last iteration's uses).
  void emit_wait(const AsyncPlan::Wait& w, const ir::SourceLoc* loc, const Op* exited_loop = nullptr);
  // Knob pin_waits: notes op's result if it is an f32 tile computed by the threads; before a
  // wgmma wait, pins the sinks of the tiles noted since the last one (those no other noted tile
  // is computed from: pinning them keeps every noted tile above the wait) and starts over.
  void note_computed(const Op& op);
  void emit_pin();
  // Before / at the top of / after a loop: the rings it drives.
  void emit_ring_prologue(const Op& loop);
  void emit_ring_iteration(const Op& loop);
  // mma.sync: the threads copy staged load `s` (cp.async) into the slot at `slot` for the
  // iteration whose loop index is `iteration` (empty: the load's own indices, where it stands).
  void emit_copy(const StagedLoad& s, const std::string& slot, const std::string& iteration);
  // The copy rings of `loop` that run ahead (mma.sync), and their common depth (0: none).
  std::vector<const StagedLoad*> copy_rings(const Op& loop) const;
  // One thread issues TMA fill `fill` of staged load `s` for the iteration whose loop index is
  // `iteration` (empty: the load's own indices, where it stands).
  void emit_fill(const StagedLoad& s, const std::string& fill, const std::string& iteration);
  // The expression of scalar `v` for another iteration of `loop` (index `iteration`).
  std::string ahead_expr(int v, const Op& loop, const std::string& iteration) const;
  int staged_index(const StagedLoad& s) const { return static_cast<int>(&s - mma_.staged.data()); }
  std::string dot_dest(const Op& dot) const;   // the registers a tensor-core dot accumulates in
  // The producer warpgroup's branch (MmaPlan::producer_warp), right after the launch decode: the
  // loop nest's scalars and loops that hold its fills, and the fills (by its first thread).
  // `program_begin` / `program_end` open and close one program (the persistent loop over programs
  // and the launch-loop decode).
  void emit_producer(const std::vector<const ir::Region*>& regions, const std::vector<const Op*>& chain,
                     const std::function<void()>& program_begin, const std::function<void()>& program_end);
  // fill: the TMA thread's fills; transpose: the transposer warps' copies (StagedLoad::transposed_copy);
  // count: the fills' use counters advanced, nothing issued (knob wg_programs: the other slot's).
  enum class ProducerRole : uint8_t { fill, transpose, count };
  void emit_producer_op(const Op& op, ProducerRole role);
  // One program's ops of the producer's nest in `role` (the launch decode emitted before).
  void emit_producer_nest(const std::vector<const ir::Region*>& regions, const std::vector<const Op*>& chain, ProducerRole role);
  // The ring the dots read a staged load from: tj_r<i>, or tj_rt<i> for a transposed copy.
  std::string read_ring(const StagedLoad& s) const;
  std::set<int> producer_needs_;
  std::map<int, std::string> pending_dest_;    // dot result value -> its registers' name
};

}  // namespace tj::codegen::emitter
