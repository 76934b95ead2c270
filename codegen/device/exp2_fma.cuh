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

}  // namespace dev
}  // namespace tj
