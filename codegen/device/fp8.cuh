#pragma once
// tilejit device library: conversions between f32 and e4m3 / e5m2 / bf16 / f16.
//
// Compiled by NVRTC at run time with no CUDA toolkit header available, and by nvcc -std=c++17.
// Storage types are plain integers: unsigned char for one fp8 byte, unsigned short for two
// fp8 bytes or one bf16/f16, unsigned int for packed pairs (low element in the low bits).
//
// Hardware paths use PTX cvt (fp8 <-> f32/f16 needs sm_89+; bf16/f16 need sm_80+). Every
// conversion also has a software path (the *_sw functions, usable on the host too) that is
// meant to match the hardware bit for bit:
//   f32 -> e4m3 / e5m2: round to nearest even, .satfinite (|x| beyond the largest finite value,
//                       and +-inf, give +-448 for e4m3 / +-57344 for e5m2), any NaN -> 0x7f
//                       (canonical, sign dropped: what cuda_fp8.hpp's f32 emulation gives; checked
//                       against the hardware over all 2^32 inputs by bench/proto/hopper_unit.cu).
//   e4m3 / e5m2 -> f32: exact (every fp8 value is an f16 value); NaN -> 0x7fffffff.
//   f32 -> bf16 / f16:  round to nearest even, overflow to inf, NaN -> canonical 0x7fff.
//   bf16 / f16 -> f32:  exact.
// Packed x2 functions take (lo, hi): `lo` lands in the low byte / low half.

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define TJ_HD __host__ __device__ __forceinline__
#else
#define TJ_HD inline
#endif

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
#define TJ_HAS_FP8_CVT 1
#else
#define TJ_HAS_FP8_CVT 0
#endif

namespace tj {
namespace dev {

// ---------------------------------------------------------------- bit casts
TJ_HD unsigned f32_as_u32(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  union { float f; unsigned u; } c; c.f = f; return c.u;
#endif
}
TJ_HD float u32_as_f32(unsigned u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  union { float f; unsigned u; } c; c.u = u; return c.f;
#endif
}

// ---------------------------------------------------------------- software encoders
namespace detail {
// Round-to-nearest-even right shift of x by s (1 <= s <= 31).
TJ_HD unsigned rne_shift(unsigned x, unsigned s) {
  unsigned r = x >> s;
  unsigned rem = x & ((1u << s) - 1u);
  unsigned half = 1u << (s - 1u);
  return r + ((rem > half || (rem == half && (r & 1u))) ? 1u : 0u);
}
// f32 -> small float with MB mantissa bits and exponent bias BIAS, satfinite; MAXF is the
// f32 bit pattern of the largest finite value, MAXC its code (without sign).
template <unsigned MB, unsigned BIAS, unsigned MAXF, unsigned MAXC>
TJ_HD unsigned char f32_to_small_satfinite(float x) {
  unsigned u = f32_as_u32(x);
  unsigned sign = (u >> 24) & 0x80u;
  unsigned a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned char)0x7fu;          // NaN -> canonical 0x7f
  if (a >= MAXF) return (unsigned char)(MAXC | sign);        // includes +-inf: saturate
  unsigned e = a >> 23;                                      // biased f32 exponent
  unsigned m = a & 0x7fffffu;
  const unsigned emin_normal = 127u - BIAS + 1u;             // smallest normal exponent
  unsigned code;
  if (e >= emin_normal) {
    // normal: re-bias and round the mantissa; a carry moves into the exponent correctly.
    unsigned x2 = ((e - 127u + BIAS) << 23) | m;
    code = rne_shift(x2, 23u - MB);
  } else {
    // subnormal in the target (or zero): value / quantum, quantum = 2^(1-BIAS-MB)
    unsigned s = (e == 0u) ? m : (m | 0x800000u);
    unsigned ee = (e == 0u) ? 1u : e;
    unsigned sh = 151u - BIAS - MB - ee;                     // >= 24 - MB here
    code = (sh > 25u) ? 0u : rne_shift(s, sh);
  }
  return (unsigned char)(code | sign);
}
}  // namespace detail

// f32 -> e4m3 (bias 7, 3 mantissa bits, max 448 = 0x7e, NaN 0x7f)
TJ_HD unsigned char f32_to_e4m3_sw(float x) {
  return detail::f32_to_small_satfinite<3u, 7u, 0x43e00000u, 0x7eu>(x);
}
// f32 -> e5m2 (bias 15, 2 mantissa bits, max 57344 = 0x7b, inf 0x7c)
TJ_HD unsigned char f32_to_e5m2_sw(float x) {
  return detail::f32_to_small_satfinite<2u, 15u, 0x47600000u, 0x7bu>(x);
}

// f32 -> bf16, round to nearest even, NaN -> 0x7fff
TJ_HD unsigned short f32_to_bf16_sw(float x) {
  unsigned u = f32_as_u32(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
TJ_HD float bf16_to_f32_sw(unsigned short h) { return u32_as_f32((unsigned)h << 16); }

// f32 -> f16, round to nearest even, overflow -> inf, NaN -> 0x7fff
TJ_HD unsigned short f32_to_f16_sw(float x) {
  unsigned u = f32_as_u32(x);
  unsigned sign = (u >> 16) & 0x8000u;
  unsigned a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)0x7fffu;
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);   // >= 65520 rounds to inf
  unsigned e = a >> 23, m = a & 0x7fffffu, code;
  if (e >= 113u) {                                                 // normal f16 (>= 2^-14)
    code = detail::rne_shift(((e - 112u) << 23) | m, 13u);
  } else {
    unsigned s = (e == 0u) ? m : (m | 0x800000u);
    unsigned ee = (e == 0u) ? 1u : e;
    unsigned sh = 126u - ee;                                       // quantum 2^-24
    code = (sh > 25u) ? 0u : detail::rne_shift(s, sh);
  }
  return (unsigned short)(code | sign);
}
TJ_HD float f16_to_f32_sw(unsigned short h) {
  unsigned sign = ((unsigned)h & 0x8000u) << 16;
  unsigned e = ((unsigned)h >> 10) & 0x1fu, m = (unsigned)h & 0x3ffu;
  if (e == 0x1fu) return u32_as_f32(m ? 0x7fffffffu : (sign | 0x7f800000u));
  if (e == 0u) {
    if (m == 0u) return u32_as_f32(sign);
    // subnormal: m * 2^-24, exact in f32
    float v = (float)m * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return u32_as_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// e4m3 -> f32 (exact), NaN (0x7f/0xff) -> 0x7fffffff
TJ_HD float e4m3_to_f32_sw(unsigned char b) {
  unsigned sign = ((unsigned)b & 0x80u) << 24;
  unsigned e = ((unsigned)b >> 3) & 0xfu, m = (unsigned)b & 7u;
  if (e == 15u && m == 7u) return u32_as_f32(0x7fffffffu);
  if (e == 0u) {
    float v = (float)m * 0.001953125f;                   // m * 2^-9
    return u32_as_f32(f32_as_u32(v) | sign);
  }
  return u32_as_f32(sign | ((e + 120u) << 23) | (m << 20));
}
// e5m2 -> f32 (exact), inf kept, NaN -> 0x7fffffff
TJ_HD float e5m2_to_f32_sw(unsigned char b) {
  unsigned sign = ((unsigned)b & 0x80u) << 24;
  unsigned e = ((unsigned)b >> 2) & 0x1fu, m = (unsigned)b & 3u;
  if (e == 31u) return u32_as_f32(m ? 0x7fffffffu : (sign | 0x7f800000u));
  if (e == 0u) {
    float v = (float)m * 1.52587890625e-5f;              // m * 2^-16
    return u32_as_f32(f32_as_u32(v) | sign);
  }
  return u32_as_f32(sign | ((e + 112u) << 23) | (m << 21));
}

// ---------------------------------------------------------------- f32 <-> fp8 (hardware)
// Two f32 -> e4m3x2 (lo in bits 0..7, hi in bits 8..15).
TJ_HD unsigned short f32x2_to_e4m3x2(float lo, float hi) {
#if TJ_HAS_FP8_CVT
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (unsigned short)(f32_to_e4m3_sw(lo) | ((unsigned)f32_to_e4m3_sw(hi) << 8));
#endif
}
TJ_HD unsigned short f32x2_to_e5m2x2(float lo, float hi) {
#if TJ_HAS_FP8_CVT
  unsigned short r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (unsigned short)(f32_to_e5m2_sw(lo) | ((unsigned)f32_to_e5m2_sw(hi) << 8));
#endif
}
// f16x2 (low element in the low half) -> e4m3x2 (low element in the low byte), saturating.
TJ_HD unsigned short f16x2_to_e4m3x2(unsigned v) {
#if TJ_HAS_FP8_CVT
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(r) : "r"(v));
  return r;
#else
  return f32x2_to_e4m3x2(f16_to_f32_sw((unsigned short)(v & 0xffffu)), f16_to_f32_sw((unsigned short)(v >> 16)));
#endif
}
TJ_HD unsigned char f32_to_e4m3(float x) { return (unsigned char)(f32x2_to_e4m3x2(x, 0.0f) & 0xffu); }
TJ_HD unsigned char f32_to_e5m2(float x) { return (unsigned char)(f32x2_to_e5m2x2(x, 0.0f) & 0xffu); }
// Four f32 -> e4m3x4 / e5m2x4 (a in bits 0..7, ..., d in bits 24..31).
TJ_HD unsigned f32x4_to_e4m3x4(float a, float b, float c, float d) {
  return (unsigned)f32x2_to_e4m3x2(a, b) | ((unsigned)f32x2_to_e4m3x2(c, d) << 16);
}
TJ_HD unsigned f32x4_to_e5m2x4(float a, float b, float c, float d) {
  return (unsigned)f32x2_to_e5m2x2(a, b) | ((unsigned)f32x2_to_e5m2x2(c, d) << 16);
}

// ---------------------------------------------------------------- fp8 -> f16x2 / f32
// e4m3x2 -> f16x2 (packed: low element in the low half). Software: exact decode.
TJ_HD unsigned e4m3x2_to_f16x2(unsigned short v) {
#if TJ_HAS_FP8_CVT
  unsigned r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
#else
  // Every e4m3 value is exact in f16; NaN -> 0x7fff (canonical).
  unsigned out = 0;
  for (int i = 0; i < 2; ++i) {
    unsigned b = (v >> (8 * i)) & 0xffu;
    unsigned sign = (b & 0x80u) << 8, e = (b >> 3) & 0xfu, m = b & 7u, h;
    if (e == 15u && m == 7u) h = 0x7fffu;
    else if (e == 0u) {
      // m * 2^-9 as f16: normalize (f16 min normal 2^-14, so all are normal when m != 0)
      if (m == 0u) h = sign;
      else {
        // m << s = mm in [8,16): value = mm/8 * 2^(-6-s), f16 exponent field 9 - s
        unsigned ee = 9u, mm = m;
        while ((mm & 8u) == 0u) { mm <<= 1; --ee; }
        h = sign | (ee << 10) | ((mm & 7u) << 7);
      }
    } else h = sign | ((e + 8u) << 10) | (m << 7);
    out |= h << (16 * i);
  }
  return out;
#endif
}
TJ_HD unsigned e5m2x2_to_f16x2(unsigned short v) {
#if TJ_HAS_FP8_CVT
  unsigned r;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
#else
  unsigned lo = ((unsigned)v & 0xffu) << 8, hi = (unsigned)v & 0xff00u;
  if ((lo & 0x7fffu) > 0x7c00u) lo = 0x7fffu;
  if ((hi & 0x7fffu) > 0x7c00u) hi = 0x7fffu;
  return lo | (hi << 16);
#endif
}

// f16 / bf16 <-> f32 (hardware cvt where it exists; sm_80+ for everything used here)
TJ_HD float f16_to_f32(unsigned short h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  return f16_to_f32_sw(h);
#endif
}
TJ_HD unsigned short f32_to_f16(float x) {
#if defined(__CUDA_ARCH__)
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
#else
  return f32_to_f16_sw(x);
#endif
}
TJ_HD unsigned f32x2_to_f16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (unsigned)f32_to_f16(lo) | ((unsigned)f32_to_f16(hi) << 16);
#endif
}
TJ_HD float bf16_to_f32(unsigned short h) { return u32_as_f32((unsigned)h << 16); }
TJ_HD unsigned short f32_to_bf16(float x) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
#else
  return f32_to_bf16_sw(x);
#endif
}
TJ_HD unsigned f32x2_to_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (unsigned)f32_to_bf16_sw(lo) | ((unsigned)f32_to_bf16_sw(hi) << 16);
#endif
}

// fp8 -> f32 through f16 (hardware on sm_89+), exact software decode otherwise.
TJ_HD void e4m3x2_to_f32x2(unsigned short v, float& lo, float& hi) {
#if TJ_HAS_FP8_CVT
  unsigned h2 = e4m3x2_to_f16x2(v);
  lo = f16_to_f32((unsigned short)(h2 & 0xffffu));
  hi = f16_to_f32((unsigned short)(h2 >> 16));
#else
  lo = e4m3_to_f32_sw((unsigned char)(v & 0xffu));
  hi = e4m3_to_f32_sw((unsigned char)(v >> 8));
#endif
}
TJ_HD void e5m2x2_to_f32x2(unsigned short v, float& lo, float& hi) {
#if TJ_HAS_FP8_CVT
  unsigned h2 = e5m2x2_to_f16x2(v);
  lo = f16_to_f32((unsigned short)(h2 & 0xffffu));
  hi = f16_to_f32((unsigned short)(h2 >> 16));
#else
  lo = e5m2_to_f32_sw((unsigned char)(v & 0xffu));
  hi = e5m2_to_f32_sw((unsigned char)(v >> 8));
#endif
}
TJ_HD float e4m3_to_f32(unsigned char b) {
  float lo, hi;
  e4m3x2_to_f32x2((unsigned short)b, lo, hi);
  return lo;
}
TJ_HD float e5m2_to_f32(unsigned char b) {
  float lo, hi;
  e5m2x2_to_f32x2((unsigned short)b, lo, hi);
  return lo;
}

}  // namespace dev
}  // namespace tj
