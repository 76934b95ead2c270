#pragma once
// tilejit device library: 2^x on the FMA and integer pipes, for softmaxes that would otherwise
// queue on the MUFU (ex2.approx: 16 per SM per clock on Hopper, while an FP8 wgmma retires a
// score's Q.K^T and P.V in the same time; FlashAttention-4 moves part of its exp2s to the FMA
// pipes for the same reason).
//
// Usable on the host too (tests compare it with std::exp2 over every range the softmax feeds it).
//   x = j + f, j = round(x) by the magic-number add (no F2I / FRND: those run at the MUFU's rate),
//   f in [-0.5, 0.5];
//   2^f by a cubic, minimax in relative error on [-0.5, 0.5]: |rel err| < 7.6e-5 (an e4m3 P
//   keeps 3 mantissa bits, a bf16 P 8: both far coarser);
//   2^j as the float whose exponent field is j + 127, built by one shift.
// x below -127 gives 0 exactly (so a masked score, -inf, gives a 0 probability, as ex2 does);
// NaN stays NaN (max.NaN keeps it; fmaxf would turn it into 0); x must be <= 128.
// 9 instructions: FMNMX, 3 FADD, 3 FFMA, SHL, FMUL.

#include "fp8.cuh"   // TJ_HD, f32_as_u32 / u32_as_f32
#if !defined(__CUDACC_RTC__)
#include <cmath>   // fmaf on the host (NVRTC has it built in)
#endif

namespace tj {
namespace dev {

namespace exp2_detail {
// 1.5 * 2^23 + 127: x + this rounds to an integer whose low mantissa bits are round(x) + 127
constexpr float kRoundBias = 12583039.0f;
constexpr float kC0 = 9.999280572e-01f, kC1 = 6.932609677e-01f, kC2 = 2.426110506e-01f, kC3 = 5.517154932e-02f;

TJ_HD float max_nan(float x, float lo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float y;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(x), "f"(lo));
  return y;
#else
  return (x != x || x > lo) ? x : lo;
#endif
}
}  // namespace exp2_detail

TJ_HD float exp2_fma(float x) {
  using namespace exp2_detail;
  x = max_nan(x, -127.0f);
  const float t = x + kRoundBias;
  const float j = t - kRoundBias;   // round(x): both adds round to nearest, the compiler keeps them
  const float f = x - j;
  const float p = fmaf(fmaf(fmaf(kC3, f, kC2), f, kC1), f, kC0);
  // (round(x) + 127) << 23: the bits of 2^round(x); 0 (the float 0) for round(x) = -127
  const float two_j = u32_as_f32(f32_as_u32(t) << 23);
  return p * two_j;
}

// Two 2^x at once in f16x2 arithmetic, for P values an e4m3 cast takes next (3 mantissa bits, so
// f16's 11 carry them with room): x_lo, x_hi <= 8.75 (the softmax's range with its offset and
// slack). Returns the f16x2 (x_lo in the low half) for f16x2_to_e4m3x2. About 5 instructions a value
// on the FMA and integer pipes where exp2_fma takes 9, none on the MUFU:
//   h = f16x2(x), clamped below at -15 (max.NaN: NaN stays NaN);
//   t = h + 1551 rounds to the integer 1551 + round(h) (ulp 1 in [1024, 2048)); j = t - 1551,
//   f = h - j in [-0.5, 0.5];
//   2^f by a quadratic, minimax in relative error on [-0.5, 0.5] (1.7e-3; f16 rounding adds about
//   2^-11 per step, and x's own rounding to f16 up to 2^-8 ln 2 at 8.75: 5.3e-3 at most in all,
//   a tenth of e4m3's step);
//   2^j as the f16 whose exponent field is j + 15, from t's low bits: (t << 10) & 0x7c00 per half;
//   0 for j = -15, so x <= -14.5 (a masked score's -inf) gives 0 exactly.
// The host path rounds every step to f16 as the GPU does (the fma once, from its f32 result).
namespace exp2_detail {
constexpr float kH0 = 1.00044316f, kH1 = 0.70344841f, kH2 = 0.23842914f;
}  // namespace exp2_detail

TJ_HD unsigned exp2_f16x2(float x_lo, float x_hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned h0 = f32x2_to_f16x2(x_lo, x_hi);
  unsigned h, t, j, f, p, r;
  const unsigned lo = 0xcb80cb80u;      // -15, -15
  const unsigned magic = 0x660f660fu;   // 1551, 1551
  asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(h) : "r"(h0), "r"(lo));
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(t) : "r"(h), "r"(magic));
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(j) : "r"(t), "r"(magic));
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(f) : "r"(h), "r"(j));
  const unsigned c0 = f32x2_to_f16x2(exp2_detail::kH0, exp2_detail::kH0);
  const unsigned c1 = f32x2_to_f16x2(exp2_detail::kH1, exp2_detail::kH1);
  const unsigned c2 = f32x2_to_f16x2(exp2_detail::kH2, exp2_detail::kH2);
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(p) : "r"(c2), "r"(f), "r"(c1));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(p) : "r"(p), "r"(f), "r"(c0));
  const unsigned two_j = (t << 10) & 0x7c007c00u;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(p), "r"(two_j));
  return r;
#else
  auto r16 = [](float v) { return f16_to_f32_sw(f32_to_f16_sw(v)); };
  auto one = [&](float x) -> unsigned {
    float h = r16(x);
    h = (h != h || h > -15.0f) ? h : -15.0f;
    const float t = r16(h + 1551.0f);
    const float j = r16(t - 1551.0f);
    const float f = r16(h - j);
    const float p = r16(fmaf(r16(fmaf(r16(exp2_detail::kH2), f, r16(exp2_detail::kH1))), f, r16(exp2_detail::kH0)));
    const unsigned two_j = ((unsigned)f32_to_f16_sw(t) << 10) & 0x7c00u;
    return f32_to_f16_sw(p * f16_to_f32_sw((unsigned short)two_j));
  };
  return one(x_lo) | (one(x_hi) << 16);
#endif
}

}  // namespace dev
}  // namespace tj
