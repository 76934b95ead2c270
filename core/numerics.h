#pragma once
// Exact conversions between float and the storage formats tilejit kernels use, matching
// what the GPU does bit for bit (PTX cvt.rn / cvt.rn.satfinite, as emulated on the host by
// CUDA's cuda_fp16.hpp / cuda_bf16.hpp / cuda_fp8.hpp):
//
//   f32 -> bf16, f16:  round to nearest, ties to even; overflow gives +-inf; subnormals
//                      rounded correctly; any NaN gives the canonical NaN 0x7fff.
//   f32 -> e4m3, e5m2: round to nearest, ties to even, saturating (satfinite): |x| beyond the
//                      largest finite value and +-inf give +-448 (0x7e/0xfe) for e4m3 and
//                      +-57344 (0x7b/0xfb) for e5m2; any NaN gives the canonical NaN 0x7f
//                      (sign dropped: cuda_fp8.hpp canonicalizes f32 NaN inputs, and the
//                      device library codegen/device/fp8.cuh does the same). Results that
//                      round to zero keep the sign (-tiny -> 0x80).
//   storage -> f32:    exact (every bf16/f16/fp8 value is an f32 value); NaN codes give a
//                      quiet NaN, e5m2 and f16 infinities give +-inf.
//
// Formats (OCP FP8 spec v1.0): e4m3 = "E4M3FN": bias 7, 3 mantissa bits, no infinities,
// NaN = S.1111.111, max 448, min subnormal 2^-9. e5m2: bias 15, 2 mantissa bits, IEEE-like
// (inf = S.11111.00, NaN = S.11111.{01,10,11}), max 57344, min subnormal 2^-16.
#include <cstdint>

#include "core/types.h"

namespace tj::numerics {

uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t bits);
uint8_t f32_to_e4m3(float x);
uint8_t f32_to_e5m2(float x);
float e4m3_to_f32(uint8_t bits);
float e5m2_to_f32(uint8_t bits);

// The same conversions from a double, rounded once (no intermediate f32 rounding). For a
// double that holds an f32 value they equal the f32 versions above.
uint16_t f64_to_bf16(double x);
uint16_t f64_to_f16(double x);
uint8_t f64_to_e4m3(double x);
uint8_t f64_to_e5m2(double x);

// `x` rounded through the storage type `t`, as a cast to `t` and back to f32 would give:
// f32 returns x; bf16/f16/e4m3/e5m2 round as above; i32/i64 truncate toward zero and
// saturate (NaN -> 0), as PTX cvt.rzi.sat; i1 gives 1 for any nonzero x (NaN included), else 0.
float round_to(DType t, float x);
// The same for a double value, rounded once (f32: double -> float, round to nearest even).
double round_double_to(DType t, double x);

// Element `index` (in elements, not bytes) of a host buffer of type `t`, exactly as a double
// (i1 is one byte: nonzero -> 1).
double load_element(const void* base, DType t, int64_t index);
// Writes `value` rounded to `t` as a cast would (floats: round to nearest even once from the
// double, with the overflow rules above; ints: truncate toward zero, saturating; i1: != 0).
void store_element(void* base, DType t, int64_t index, double value);

}  // namespace tj::numerics
