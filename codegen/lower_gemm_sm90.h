#pragma once
// The sm_90a GEMM lowering: recognizes a GEMM loop nest and emits the warp-specialized
// TMA + wgmma pipeline of codegen/device/hopper_gemm.cuh with an epilogue generated from the
// kernel's own ops. Registered with the pattern-lowering registry at static initialization
// (name "sm90_gemm"); these entry points are for tests and tools. The match and the epilogue
// writer live in codegen/gemm_pattern.h, shared with the sm_80/sm_89 mma.sync lowering
// (codegen/lower_gemm_sm80.h).
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
// mixed operand types, f32 operands) is left to the SIMT path.
//
// Epilogue in the accumulator layout: each consumer thread holds, per wgmma m64 block, two
// rows (r0, r0 + 8) and BN/4 column pairs. Every epilogue value is classified by what it
// depends on: scalar (once per thread), row (per tile: 2 per m64 block), column (per column
// pair: loaded once per tile), or element; each is computed at that rate. No shared memory.
//
// Config: blocks m (BM), n (BN), k (BK): BM 64 (pingpong) or 128/256 (cooperative; pingpong
// takes 128 too), BN 16..256, BK * element size in {32, 64, 128, 256, 512} bytes; num_stages
// (pipeline depth); knobs "warp_specialize" (0 auto: cooperative when BM >= 128, else
// pingpong; 1 cooperative; 2 pingpong), "cluster" (1, or 2: CTA pairs share B by TMA
// multicast), "raster_group" (tile-row group height for L2 reuse, default 8), "promote"
// (fp8's tensor-core accumulation keeps fewer bits than fp32; P > 0: P stages' partial products
// go into a separate register tile that is then added into the fp32 accumulator, like cuBLASLt
// without fast accumulation; P = 1 promotes every BK elements of K and waits for the tensor
// cores each stage, larger P waits less often; twice the accumulator registers; fp8 only, and
// on by default: P = 4 unless the config sets "promote": 0 for the faster, less precise fast
// accumulation). Configs that match but cannot work throw tj::Error naming the limit. Untuned
// default (autotune::untuned_config): fp8 128 x 192 x 128-byte tiles, 5 stages, cluster 2;
// bf16 / f16 128 x 256 x 64, 4 stages, cluster 2.
//
// TMA: A and B are read through tensor maps, so their rows must start at 16-byte multiples.
// With static shapes the lowering declines (SIMT path) when K * element size is not a multiple
// of 16 (no contiguous tensor of that shape can be read by TMA); with dynamic shapes it lowers
// and tj::launch reports encode_tma's error ("... stride of N bytes, not a multiple of 16 ...")
// for layouts TMA cannot take (unaligned rows, base address, non-unit inner stride).
// A caveat of zero fill: when A's and B's K dims differ, the extra K columns of the longer
// operand multiply zeros (infinities there would give NaN, where the reference skips them).
#include <optional>

#include "codegen/cuda_emitter.h"

namespace tj::codegen {

// Whether `f` has the GEMM shape above (any target, any config): the cheap structural test.
bool is_sm90_gemm_pattern(const ir::Function& f);

// The lowering itself (what the registry calls): empty when `f`, `cfg` or `t` do not fit.
std::optional<GeneratedKernel> lower_gemm_sm90(const ir::Function& f, const Config& cfg, const Target& t);

}  // namespace tj::codegen
