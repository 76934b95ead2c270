#include "core/numerics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace tj::numerics {

namespace {

// A binary floating-point storage format narrower than f32.
struct Format {
  int mbits;            // explicit mantissa bits
  int ebits;            // exponent bits
  int bias;
  bool has_inf;         // IEEE-like: all-ones exponent is inf (m == 0) or NaN
  bool satfinite;       // overflow and +-inf saturate to +-max instead of giving inf
  double max_finite;
  uint32_t sign_bit;
  uint32_t max_code;    // largest finite, positive
  uint32_t inf_code;    // +inf (has_inf only)
  uint32_t nan_code;    // canonical NaN produced by conversions
};

constexpr Format kBF16{7, 8, 127, true, false, 0x1.FEp127, 0x8000u, 0x7F7Fu, 0x7F80u, 0x7FFFu};
constexpr Format kF16{10, 5, 15, true, false, 65504.0, 0x8000u, 0x7BFFu, 0x7C00u, 0x7FFFu};
constexpr Format kE4M3{3, 4, 7, false, true, 448.0, 0x80u, 0x7Eu, 0u, 0x7Fu};
constexpr Format kE5M2{2, 5, 15, true, true, 57344.0, 0x80u, 0x7Bu, 0x7Cu, 0x7Fu};

// Rounds `x` to the nearest value of format `F` (ties to even) and returns its code. One
// rounding from the exact double: scaling by a power of two and floor are exact here.
uint32_t encode(double x, const Format& F) {
  if (std::isnan(x)) return F.nan_code;
  const uint32_t sign = std::signbit(x) ? F.sign_bit : 0u;
  const double a = std::fabs(x);
  const uint32_t overflow = sign | (F.satfinite ? F.max_code : F.inf_code);
  if (std::isinf(a)) return overflow;
  if (a == 0) return sign;
  int ex = 0;
  (void)std::frexp(a, &ex);                       // a = fr * 2^ex, fr in [0.5, 1)
  int e = std::max(ex - 1, 1 - F.bias);           // the binade; subnormals share the lowest
  const double quantum = std::ldexp(1.0, e - F.mbits);
  const double s = a / quantum;                   // exact: a power-of-two scaling
  double r = std::floor(s);
  const double frac = s - r;                      // exact
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  if (r * quantum > F.max_finite) return overflow;
  auto m = static_cast<uint32_t>(r);              // <= 2^(mbits+1)
  const uint32_t hidden = 1u << F.mbits;
  if (m < hidden) return sign | m;                // subnormal or zero (exponent field 0)
  if (m == 2 * hidden) {                          // rounding carried into the next binade
    m = hidden;
    e += 1;
  }
  return sign | (static_cast<uint32_t>(e + F.bias) << F.mbits) | (m - hidden);
}

double decode(uint32_t code, const Format& F) {
  const uint32_t mmask = (1u << F.mbits) - 1u;
  const uint32_t emask = (1u << F.ebits) - 1u;
  const bool negative = (code & F.sign_bit) != 0;
  const uint32_t e = (code >> F.mbits) & emask;
  const uint32_t m = code & mmask;
  if (F.has_inf && e == emask) {
    if (m != 0) return std::numeric_limits<double>::quiet_NaN();
    return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  if (!F.has_inf && e == emask && m == mmask) return std::numeric_limits<double>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(static_cast<double>(m), 1 - F.bias - F.mbits)
                          : std::ldexp(static_cast<double>(m | (1u << F.mbits)), static_cast<int>(e) - F.bias - F.mbits);
  return negative ? -v : v;
}

// Float -> integer as PTX cvt.rzi.sat: truncate toward zero, saturate, NaN -> 0.
template <class Int>
Int to_int_sat(double x) {
  if (std::isnan(x)) return 0;
  const double t = std::trunc(x);
  if (t <= static_cast<double>(std::numeric_limits<Int>::min())) return std::numeric_limits<Int>::min();
  // 2^63 is not representable in int64; anything >= it saturates.
  if (t >= -static_cast<double>(std::numeric_limits<Int>::min())) return std::numeric_limits<Int>::max();
  return static_cast<Int>(t);
}

}  // namespace

uint16_t f32_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;   // NaN -> canonical quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);                      // round to nearest even; carries into
  return static_cast<uint16_t>(u >> 16);                // the exponent (and to inf) correctly
}

float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_f16(float x) { return static_cast<uint16_t>(encode(x, kF16)); }
float f16_to_f32(uint16_t bits) { return static_cast<float>(decode(bits, kF16)); }
uint8_t f32_to_e4m3(float x) { return static_cast<uint8_t>(encode(x, kE4M3)); }
uint8_t f32_to_e5m2(float x) { return static_cast<uint8_t>(encode(x, kE5M2)); }
float e4m3_to_f32(uint8_t bits) { return static_cast<float>(decode(bits, kE4M3)); }
float e5m2_to_f32(uint8_t bits) { return static_cast<float>(decode(bits, kE5M2)); }

uint16_t f64_to_bf16(double x) { return static_cast<uint16_t>(encode(x, kBF16)); }
uint16_t f64_to_f16(double x) { return static_cast<uint16_t>(encode(x, kF16)); }
uint8_t f64_to_e4m3(double x) { return static_cast<uint8_t>(encode(x, kE4M3)); }
uint8_t f64_to_e5m2(double x) { return static_cast<uint8_t>(encode(x, kE5M2)); }

double round_double_to(DType t, double x) {
  switch (t) {
    case DType::f32: return static_cast<double>(static_cast<float>(x));
    case DType::f16: return decode(encode(x, kF16), kF16);
    case DType::bf16: return decode(encode(x, kBF16), kBF16);
    case DType::e4m3: return decode(encode(x, kE4M3), kE4M3);
    case DType::e5m2: return decode(encode(x, kE5M2), kE5M2);
    case DType::i32: return static_cast<double>(to_int_sat<int32_t>(x));
    case DType::i64: return static_cast<double>(to_int_sat<int64_t>(x));
    case DType::i1: return x != 0 ? 1.0 : 0.0;   // NaN != 0
  }
  return x;
}

float round_to(DType t, float x) {
  switch (t) {
    case DType::f32: return x;
    case DType::bf16: return bf16_to_f32(f32_to_bf16(x));
    default: return static_cast<float>(round_double_to(t, x));
  }
}

double load_element(const void* base, DType t, int64_t index) {
  const auto* p = static_cast<const unsigned char*>(base) + index * size_bytes(t);
  switch (t) {
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::f16: { uint16_t v; std::memcpy(&v, p, 2); return f16_to_f32(v); }
    case DType::bf16: { uint16_t v; std::memcpy(&v, p, 2); return bf16_to_f32(v); }
    case DType::e4m3: return e4m3_to_f32(*p);
    case DType::e5m2: return e5m2_to_f32(*p);
    case DType::i32: { int32_t v; std::memcpy(&v, p, 4); return static_cast<double>(v); }
    case DType::i64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DType::i1: return *p != 0 ? 1.0 : 0.0;
  }
  return 0;
}

void store_element(void* base, DType t, int64_t index, double value) {
  auto* p = static_cast<unsigned char*>(base) + index * size_bytes(t);
  switch (t) {
    case DType::f32: { float v = static_cast<float>(value); std::memcpy(p, &v, 4); return; }
    case DType::f16: { uint16_t v = f64_to_f16(value); std::memcpy(p, &v, 2); return; }
    case DType::bf16: { uint16_t v = f64_to_bf16(value); std::memcpy(p, &v, 2); return; }
    case DType::e4m3: *p = f64_to_e4m3(value); return;
    case DType::e5m2: *p = f64_to_e5m2(value); return;
    case DType::i32: { int32_t v = to_int_sat<int32_t>(value); std::memcpy(p, &v, 4); return; }
    case DType::i64: { int64_t v = to_int_sat<int64_t>(value); std::memcpy(p, &v, 8); return; }
    case DType::i1: *p = value != 0 ? 1 : 0; return;
  }
}

}  // namespace tj::numerics
