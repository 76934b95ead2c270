#pragma once
// The sm_80 / sm_89 GEMM lowering: the GEMM loop nest of codegen/gemm_pattern.h (the one the
// sm_90a lowering takes) becomes the cp.async + ldmatrix + mma.sync pipeline of
// codegen/device/ampere_gemm.cuh with the same generated epilogue. Registered with the
// pattern-lowering registry at static initialization (name "sm80_gemm"); it applies to targets
// sm_80, sm_89 and sm_90, never sm_90a (where the wgmma lowering takes the kernel).
//
// Operands: bf16 x bf16 or f16 x f16 (mma.sync m16n8k16, sm_80+); e4m3/e5m2 in any pair
// (m16n8k32, sm_89+: target.has_fp8()). fp8 on sm_80 is left to the SIMT path. Hopper has no
// native fp8 mma.sync: for sm_90 (and sm_89 PTX run on Hopper) ptxas converts to f16 and uses
// the f16 tensor cores -- exact (fp8 values are f16 values) but slower and with more registers
// than on Ada; sm_90a's wgmma lowering is Hopper's fast fp8 path.
//
// Config: blocks m (BM), n (BN), k (BK), num_warps, num_stages; knob "raster_group" (tile-row
// group height for L2 reuse, default 8). The warps split the BM x BN tile as a grid of
// warps_m x warps_n (the most square split where every warp gets a multiple of 16 rows and of
// 16 columns); BK * element size must be 32, 64, 128 or 256 bytes; num_stages >= 1 deep
// cp.async ring (1: no overlap of copies and math); the accumulators of a warp's tile must fit
// the registers; the stages the target's shared memory. Configs that match but cannot work
// throw tj::Error naming the limit (knob "lowering": 0 forces the SIMT path instead).
//
// cp.async copies 16-byte pieces, so A's and B's rows must start at 16-byte multiples. With
// static shapes the lowering declines (SIMT path) when K * element size is not a multiple of 16
// (no contiguous tensor of that shape works); otherwise GeneratedKernel::aligned16_params names
// A and B, and tj::launch reports layouts it cannot take (check_aligned16) before launching.
// Tails in M, N and K are zero-filled (K past min(the tensor's K, the K loop's end), exactly the
// reference's masking).
#include <optional>

#include "codegen/cuda_emitter.h"

namespace tj::codegen {

// The lowering itself (what the registry calls): empty when `f`, `cfg` or `t` do not fit.
std::optional<GeneratedKernel> lower_gemm_sm80(const ir::Function& f, const Config& cfg, const Target& t);

}  // namespace tj::codegen
