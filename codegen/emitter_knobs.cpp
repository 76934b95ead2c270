#include "codegen/emitter_knobs.h"

namespace tj::codegen::knobs {

const KnobSpec lowering{"lowering", 1, "1", "0 skips the pattern lowerings (sm90_gemm, sm80_gemm, sm90_attention): the CUDA emitter takes the kernel"};
const KnobSpec mma{"mma", 1, "1", "0 keeps every dot on the SIMT path; 1 puts dots on the tensor cores (wgmma) where they fit"};
const KnobSpec warp_specialize{
    "warp_specialize", 1, "1",
    "1: a producer warpgroup issues the TMA fills of the staged operands it can compute, ahead of use, and gives its registers "
    "to the tiles' warpgroups; 0: a thread of the tiles' warps issues them between its own work"};
const KnobSpec persistent{"persistent", 0, "0 (the untuned config: 1 where every program does the same work)",
                          "1: the launch's blocks loop over the programs (the tensor cores' kernels: one block an SM; SIMT "
                          "kernels: as many as fit an SM)"};
const KnobSpec persistent_blocks{"persistent_blocks", 0, "0", "with persistent: at most this many blocks (0: as many as run at once)"};
const KnobSpec raster_group{"raster_group", 1, "1 (the untuned config: 8 with persistent)",
                            "G in [1, 64]: the last two tile launch loops in groups of G outer tiles (L2 reuse)"};
const KnobSpec longest_first{"longest_first", 0, "0 (the untuned config: 1 where a loop's bounds depend on the program)",
                             "1: launch loops whose index raises an inner loop's trip count decode slowest, counted down"};
const KnobSpec wg_turns{
    "wg_turns", 0, "0",
    "1: in each loop inside a program, the warpgroups that hold the tiles take turns issuing its wgmma dots (named "
    "barriers), so that one warpgroup's elementwise work (a softmax) runs while the tensor cores take another's dots"};
const KnobSpec wg_programs{
    "wg_programs", 1, "1",
    "P in {1, 2} (wgmma with a producer warpgroup): the block holds P sets of the program's warps (num_warps each), each "
    "running programs of its own and taking the operand rings in turn (one ring set, filled in program order), so that one "
    "set's epilogue runs while the tensor cores take the other's dots (CUTLASS's ping-pong schedule)"};
const KnobSpec overlap{
    "overlap", 0, "0 (the untuned config: 2 for nests of two or more wgmma dots that no launch loop's tiles widen)",
    "1: in a loop whose body issues a first wgmma dot and ends with a chained one into a loop-carried accumulator "
    "(attention's S = Q.K^T and O += P.V), the chained dot and the ops that only feed it run one iteration late, so the "
    "elementwise work between the dots (the softmax) overlaps the chained dot on the tensor cores; 2: the same, with the "
    "chained dot's accumulator operand (acc * alpha) made at the end of the iteration, when no dot is in flight"};
const KnobSpec stage_stores{
    "stage_stores", 1, "1",
    "1: a store of a tile in the tensor cores' accumulator layout (rows contiguous in memory) goes through shared memory and "
    "leaves in 16-byte row chunks, and an atomic add of an f32 one (rows or columns contiguous; sm_90 on) in 16-byte vector "
    "reductions, where that costs no block per SM (on the target's SMs and on Hopper's); 2: wherever the "
    "block's shared memory has room; where neither, 16-bit tiles leave in 16-byte row pieces transposed across each quad "
    "of lanes (no shared memory); 3: always that; 0: each thread stores its fragments (4 or 8 bytes each)"};
const KnobSpec fp8_key_order{
    "fp8_key_order", 1, "1 where the copied tile is whole pieces of 16 rows x 32 bytes, else 0",
    "1: where an fp8 dot's a operand goes in from the accumulator layout (P of P.V) and its b is copied K-major by the "
    "producer warpgroup, the copy orders K as P's registers hold it, so that P's fragments need no shuffles across a quad "
    "(and the copy moves 16 x 32-byte pieces by ldmatrix.trans / stmatrix: H200, README attention e4m3, +7-11%); 0: P's "
    "fragments are exchanged within each quad"};
const KnobSpec key_parity{
    "key_parity", 1, "1",
    "1: where an fp8 dot's a operand goes in from the accumulator layout (P of P.V) and comes from the result of a dot whose "
    "b operand's rows are staged in order (S = Q.K^T, K by TMA or copied), K's rows are staged even rows first, then odd "
    "ones, and S with the tiles computed from it holds its columns in that order, so that P's fragments need no shuffles "
    "(codegen/key_parity.h); 0: in order"};
const KnobSpec prefetch_program{
    "prefetch_program", 1, "1",
    "1 (persistent blocks, a producer warpgroup): tiles loaded outside the program's loops (attention's Q) take two ring "
    "slots, so that the producer fills the next program's while this one runs; 0: one slot, filled once this program is "
    "done with it"};
const KnobSpec copy_stages{
    "copy_stages", 2, "2",
    "slots of the K-major ring that an fp8 operand's transposed copy fills (the producer warpgroup's copy runs that many "
    "fills ahead of the dots that read it), 1 to num_stages"};
const KnobSpec issue_early{
    "issue_early", 1, "1",
    "1 (with the tensor cores): in each inner loop's body, the loads of input tensors that the threads read and the dots whose "
    "operands come from loads alone are issued first, so that their latency overlaps the rest of the body "
    "(codegen/issue_early.h); 0: the order of the user's code"};
const KnobSpec prefetch_loads{
    "prefetch_loads", 1, "1",
    "1 (with the tensor cores): a vector that a loop inside the program loads from an input tensor at its own tile, for the "
    "threads (an attention backward's LSE and delta), is loaded for the next tile while this one runs, into a loop-carried "
    "variable (codegen/prefetch_loads.h); 0: loaded where the user's code loads it"};
const KnobSpec mask_bounds{
    "mask_bounds", 1, "1",
    "1: a tile loop inside a program that masks a tile with where(mask, s, -inf), and whose iteration changes nothing where the "
    "mask fails on the whole tile, runs from the first to the last tile the mask keeps, bounds solved from the mask's index "
    "comparisons (codegen/mask_bounds.h: a sliding window's backward visits the window's tiles, not every tile to the end); "
    "0: the loop's own bounds"};
const KnobSpec pin_waits{
    "pin_waits", 0, "0",
    "1 (wgmma): the tiles computed between two wgmma waits are pinned above the second (a shared-memory store of a word that "
    "depends on them), so that ptxas cannot sink them below it and they overlap the dots in flight; 0: ptxas places them "
    "(it puts the README attention's late P.V wait before the softmax's exp2s, yet that ran as fast on an H200; the "
    "attention backward's dQ kernel ran faster pinned at S 16k, its dK / dV kernel slower: bench/RESULTS.md)"};
const KnobSpec fast_math{"fast_math", 0, "0", "1: exp2 / log2 / exp / log / sqrt / tanh as the GPU's approximations"};
const KnobSpec simt_vec{"simt_vec", 1, "1 (the untuned config of a streaming kernel: 16 bytes of its widest element, codegen/simt_config.h)", "adjacent columns per thread of the SIMT layout (power of two up to 16)"};
const KnobSpec simt_lanes_c{"simt_lanes_c", 8, "chosen from the tile shapes", "lanes of a warp along the columns (SIMT layout)"};
const KnobSpec simt_warps_c{"simt_warps_c", 1, "chosen from the tile shapes", "warps along the columns (SIMT layout)"};
const KnobSpec simt_min_blocks{"simt_min_blocks", 0, "0", "blocks per SM the registers must allow (__launch_bounds__)"};

namespace {
const bool registered = register_knob_table(
    "emitter", {&lowering, &mma, &warp_specialize, &persistent, &persistent_blocks, &raster_group, &longest_first, &wg_turns, &wg_programs, &overlap, &stage_stores, &fp8_key_order, &key_parity, &prefetch_program, &copy_stages, &issue_early, &prefetch_loads, &mask_bounds, &pin_waits, &fast_math,
                &simt_vec, &simt_lanes_c, &simt_warps_c, &simt_min_blocks});
}  // namespace

}  // namespace tj::codegen::knobs
