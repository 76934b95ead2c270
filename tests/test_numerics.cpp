// tj::numerics: conversions between f32 and bf16 / f16 / e4m3 / e5m2, checked against
// independent reference algorithms (nearest value by search over every code, ties to even),
// the compiler's _Float16 where it exists, and the OCP FP8 / PTX cvt.rn.satfinite rules.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codegen/device/exp2_fma.cuh"   // host-compilable device math
#include "core/numerics.h"

using namespace tj;
using namespace tj::numerics;

namespace {

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

// A format described independently of the implementation: its values come from a plain
// formula, and rounding is a search over all of them.
struct RefFormat {
  int mbits, ebits, bias;
  bool ieee_special;       // all-ones exponent is inf/NaN (f16, bf16, e5m2); e4m3: only S.1111.111 is NaN
  bool satfinite;          // overflow -> +-max (fp8); otherwise -> +-inf
  uint32_t sign_bit;
  uint32_t nan_code;       // what conversions produce for NaN
  std::vector<std::pair<double, uint32_t>> table;   // non-negative finite values, ascending

  int total_bits() const { return 1 + ebits + mbits; }

  // Decodes with a plain formula; `finite` false for inf/NaN.
  double value(uint32_t code, bool* finite) const {
    uint32_t e = (code >> mbits) & ((1u << ebits) - 1), m = code & ((1u << mbits) - 1);
    bool neg = (code & sign_bit) != 0;
    *finite = true;
    if (ieee_special && e == (1u << ebits) - 1) {
      *finite = false;
      return m ? NAN : (neg ? -INFINITY : INFINITY);
    }
    if (!ieee_special && e == (1u << ebits) - 1 && m == (1u << mbits) - 1) {
      *finite = false;
      return NAN;
    }
    double frac = e ? 1.0 + m / double(1u << mbits) : m / double(1u << mbits);
    double v = frac * std::pow(2.0, double(e ? int(e) - bias : 1 - bias));
    return neg ? -v : v;
  }

  RefFormat(int mb, int eb, int b, bool ieee, bool sat, uint32_t nan)
      : mbits(mb), ebits(eb), bias(b), ieee_special(ieee), satfinite(sat), sign_bit(1u << (mb + eb)), nan_code(nan) {
    for (uint32_t c = 0; c < sign_bit; ++c) {
      bool finite;
      double v = value(c, &finite);
      if (finite) table.push_back({v, c});
    }
    std::sort(table.begin(), table.end());
  }

  double max_finite() const { return table.back().first; }

  // Round to nearest, ties to the even code, by search.
  uint32_t round(double x) const {
    if (std::isnan(x)) return nan_code;
    uint32_t sign = std::signbit(x) ? sign_bit : 0;
    double a = std::fabs(x);
    uint32_t inf_code = ((1u << ebits) - 1) << mbits;
    uint32_t max_code = table.back().second;
    // Overflow: beyond max + half an ulp of the top binade (ties there round to the odd max's
    // even neighbour, i.e. up), or infinite.
    double top_ulp = table.back().first - table[table.size() - 2].first;
    if (std::isinf(a) || a >= max_finite() + top_ulp / 2) {
      if (satfinite) return sign | max_code;
      return sign | inf_code;
    }
    if (a > max_finite()) return sign | max_code;
    auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(a, 0u));
    if (it->first == a) return sign | it->second;
    auto lo = it - 1;
    double dl = a - lo->first, dh = it->first - a;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | it->second;
    return sign | ((lo->second & 1u) == 0 ? lo->second : it->second);
  }
};

const RefFormat& ref_e4m3() { static RefFormat f(3, 4, 7, false, true, 0x7F); return f; }
const RefFormat& ref_e5m2() { static RefFormat f(2, 5, 15, true, true, 0x7F); return f; }
const RefFormat& ref_f16() { static RefFormat f(10, 5, 15, true, false, 0x7FFF); return f; }
const RefFormat& ref_bf16() { static RefFormat f(7, 8, 127, true, false, 0x7FFF); return f; }

// Random floats: uniformly random bit patterns (every exponent, NaNs included) half of the
// time, otherwise values near the format's range.
float random_float(std::mt19937& rng, double scale) {
  if (rng() & 1u) return from_bits(rng());
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::uniform_int_distribution<int> e(-30, 30);
  return static_cast<float>(u(rng) * scale * std::ldexp(1.0, e(rng) / 2));
}

}  // namespace

TEST_CASE("numerics: e4m3 decodes every code and all 256 round-trip") {
  CHECK(e4m3_to_f32(0x00) == 0.0f);
  CHECK(std::signbit(e4m3_to_f32(0x80)));
  CHECK(e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));    // min subnormal
  CHECK(e4m3_to_f32(0x07) == 7 * std::ldexp(1.0f, -9));
  CHECK(e4m3_to_f32(0x08) == std::ldexp(1.0f, -6));    // min normal
  CHECK(e4m3_to_f32(0x38) == 1.0f);
  CHECK(e4m3_to_f32(0x7E) == 448.0f);
  CHECK(e4m3_to_f32(0xFE) == -448.0f);
  CHECK(e4m3_to_f32(0x78) == 256.0f);                  // exponent 15 is finite in E4M3FN
  CHECK(std::isnan(e4m3_to_f32(0x7F)));
  CHECK(std::isnan(e4m3_to_f32(0xFF)));
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(static_cast<uint8_t>(c));
    bool finite;
    const double r = ref_e4m3().value(c, &finite);
    CHECK(same(v, static_cast<float>(r)));
    if (std::isnan(v)) {
      ++nans;
      CHECK(f32_to_e4m3(v) == 0x7F);
      continue;
    }
    CHECK(!std::isinf(v));
    CHECK(f32_to_e4m3(v) == c);                        // exact values encode to themselves
    CHECK(round_to(DType::e4m3, v) == v);
  }
  CHECK(nans == 2);
  for (int c = 0; c < 0x7E; ++c) CHECK(e4m3_to_f32(c) < e4m3_to_f32(c + 1));   // monotone
}

TEST_CASE("numerics: e5m2 decodes every code and all 256 round-trip") {
  CHECK(e5m2_to_f32(0x01) == std::ldexp(1.0f, -16));
  CHECK(e5m2_to_f32(0x04) == std::ldexp(1.0f, -14));
  CHECK(e5m2_to_f32(0x3C) == 1.0f);
  CHECK(e5m2_to_f32(0x7B) == 57344.0f);
  CHECK(e5m2_to_f32(0x7C) == INFINITY);
  CHECK(e5m2_to_f32(0xFC) == -INFINITY);
  for (int c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) CHECK(std::isnan(e5m2_to_f32(c)));
  for (int c = 0; c < 256; ++c) {
    const float v = e5m2_to_f32(static_cast<uint8_t>(c));
    bool finite;
    CHECK(same(v, static_cast<float>(ref_e5m2().value(c, &finite))));
    if (std::isnan(v)) CHECK(f32_to_e5m2(v) == 0x7F);
    else if (std::isinf(v)) CHECK(f32_to_e5m2(v) == (v > 0 ? 0x7B : 0xFB));   // satfinite
    else CHECK(f32_to_e5m2(v) == c);
  }
  for (int c = 0; c < 0x7C; ++c) CHECK(e5m2_to_f32(c) < e5m2_to_f32(c + 1));
}

TEST_CASE("numerics: fp8 ties go to even, just off a tie goes to the nearer") {
  struct Case { uint8_t (*enc)(float); float (*dec)(uint8_t); int last_finite; };
  for (Case cs : {Case{f32_to_e4m3, e4m3_to_f32, 0x7E}, Case{f32_to_e5m2, e5m2_to_f32, 0x7B}}) {
    int ties = 0;
    for (int c = 0; c < cs.last_finite; ++c) {
      for (uint8_t sign : {uint8_t(0), uint8_t(0x80)}) {
        const float lo = cs.dec(c | sign), hi = cs.dec((c + 1) | sign);
        const float mid = (lo + hi) / 2;                     // exact: one more bit than fp8
        CHECK(static_cast<double>(mid) == (static_cast<double>(lo) + hi) / 2);
        const int even = (c % 2 == 0) ? c : c + 1;
        CHECK(cs.enc(mid) == (even | sign));
        CHECK(cs.enc(std::nextafter(mid, lo)) == (c | sign));
        CHECK(cs.enc(std::nextafter(mid, hi)) == ((c + 1) | sign));
        ++ties;
      }
    }
    CHECK(ties == 2 * cs.last_finite);
  }
  // Specific ties: below the smallest subnormal, between subnormals, at the top.
  CHECK(f32_to_e4m3(std::ldexp(1.0f, -10)) == 0x00);                   // half the min subnormal -> 0
  CHECK(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)) == 0x01);
  CHECK(f32_to_e4m3(-std::ldexp(1.0f, -10)) == 0x80);                  // keeps the sign
  CHECK(f32_to_e4m3(1.5f * std::ldexp(1.0f, -9)) == 0x02);             // 1.5 quanta -> 2 (even)
  CHECK(f32_to_e4m3(2.5f * std::ldexp(1.0f, -9)) == 0x02);             // 2.5 quanta -> 2 (even)
  CHECK(f32_to_e4m3(7.5f * std::ldexp(1.0f, -9)) == 0x08);             // subnormal -> min normal
  CHECK(f32_to_e4m3(1.0625f) == 0x38);                                 // 1 + 1/16: tie -> 1.0
  CHECK(f32_to_e4m3(1.1875f) == 0x3A);                                 // 1.125..1.25 tie -> 1.25
  CHECK(f32_to_e5m2(std::ldexp(1.0f, -17)) == 0x00);
  CHECK(f32_to_e5m2(1.125f) == 0x3C);                                  // tie -> 1.0
  CHECK(f32_to_e5m2(1.375f) == 0x3E);                                  // 1.25..1.5 tie -> 1.5
}

TEST_CASE("numerics: fp8 saturates (satfinite) and keeps NaN") {
  for (float x : {448.0f, 449.0f, 463.99f, 464.0f, 465.0f, 480.0f, 1000.0f, 1e30f, 3.4e38f, INFINITY}) {
    CHECK(f32_to_e4m3(x) == 0x7E);
    CHECK(f32_to_e4m3(-x) == 0xFE);
  }
  CHECK(f32_to_e4m3(std::nextafter(448.0f, 0.0f)) == 0x7E);
  CHECK(f32_to_e4m3(432.0f) == 0x7E);   // tie between 416 (0x7D) and 448 (0x7E) -> even 0x7E
  CHECK(f32_to_e4m3(424.0f) == 0x7D);
  for (float x : {57344.0f, 57345.0f, 61439.0f, 61440.0f, 65536.0f, 1e30f, INFINITY}) {
    CHECK(f32_to_e5m2(x) == 0x7B);
    CHECK(f32_to_e5m2(-x) == 0xFB);
  }
  CHECK(round_to(DType::e4m3, 1e6f) == 448.0f);
  CHECK(round_to(DType::e5m2, -INFINITY) == -57344.0f);
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::signaling_NaN(), from_bits(0x7F800001u), from_bits(0xFFFFFFFFu),
                        from_bits(0x7FC12345u)};
  for (float n : nans) {
    CHECK(f32_to_e4m3(n) == 0x7F);   // canonical NaN, sign dropped (as cuda_fp8.hpp / PTX)
    CHECK(f32_to_e5m2(n) == 0x7F);
    CHECK(f32_to_bf16(n) == 0x7FFF);
    CHECK(f32_to_f16(n) == 0x7FFF);
    CHECK(std::isnan(round_to(DType::e4m3, n)));
    CHECK(std::isnan(round_to(DType::e5m2, n)));
  }
  CHECK(f32_to_e4m3(-0.0f) == 0x80);
  CHECK(f32_to_e5m2(-1e-30f) == 0x80);
  CHECK(f32_to_e4m3(0.0f) == 0x00);
}

TEST_CASE("numerics: fp8 matches a search over all codes for many floats") {
  std::mt19937 rng(1234);
  int checked = 0;
  for (int i = 0; i < 400000; ++i) {
    const float x = random_float(rng, 300.0);
    REQUIRE(f32_to_e4m3(x) == ref_e4m3().round(x));
    REQUIRE(f32_to_e5m2(x) == ref_e5m2().round(x));
    ++checked;
  }
  // A sweep over every 4099th float bit pattern: all exponents, both signs.
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
    const float x = from_bits(static_cast<uint32_t>(u));
    REQUIRE(f32_to_e4m3(x) == ref_e4m3().round(x));
    REQUIRE(f32_to_e5m2(x) == ref_e5m2().round(x));
    ++checked;
  }
  CHECK(checked > 1000000);
}

TEST_CASE("numerics: f16 matches a search reference and the compiler's _Float16") {
  // Decoding: all 65536 codes.
  for (uint32_t c = 0; c < 65536; ++c) {
    bool finite;
    CHECK(same(f16_to_f32(c), static_cast<float>(ref_f16().value(c, &finite))));
  }
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_to_f32(0x7BFF) == 65504.0f);
  CHECK(f16_to_f32(0x7C00) == INFINITY);
  // Encoding: exact values, overflow, subnormal ties.
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);
  CHECK(f32_to_f16(65519.99f) == 0x7BFF);
  CHECK(f32_to_f16(65520.0f) == 0x7C00);    // tie above max rounds to even: inf
  CHECK(f32_to_f16(-1e10f) == 0xFC00);
  CHECK(f32_to_f16(INFINITY) == 0x7C00);
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);          // half the min subnormal -> 0
  CHECK(f32_to_f16(std::ldexp(3.0f, -26)) == 0x0001);          // 0.75 quantum -> 1
  CHECK(f32_to_f16(std::ldexp(3.0f, -25)) == 0x0002);          // 1.5 quanta -> 2
  CHECK(f32_to_f16(-std::ldexp(1.0f, -30)) == 0x8000);
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);   // tie -> even (1.0)
  CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  std::mt19937 rng(42);
  for (int i = 0; i < 1000000; ++i) {
    const float x = random_float(rng, 60000.0);
    const uint16_t got = f32_to_f16(x);
    REQUIRE(got == ref_f16().round(x));
#ifdef __FLT16_MAX__
    if (!std::isnan(x)) {
      const _Float16 h = static_cast<_Float16>(x);
      uint16_t hb;
      std::memcpy(&hb, &h, 2);
      REQUIRE(got == hb);
    }
#endif
    REQUIRE(same(round_to(DType::f16, x), f16_to_f32(got)));
  }
}

TEST_CASE("numerics: bf16 matches a search reference") {
  CHECK(bf16_to_f32(0x3F80) == 1.0f);
  CHECK(bf16_to_f32(0x7F80) == INFINITY);
  CHECK(std::isnan(bf16_to_f32(0x7FC0)));
  CHECK(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);    // tie -> even
  CHECK(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  CHECK(f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)) == 0x3F81);
  CHECK(f32_to_bf16(3.4e38f) == 0x7F80);                         // rounds past max -> inf
  CHECK(f32_to_bf16(from_bits(0x7F7F7FFFu)) == 0x7F7F);
  CHECK(f32_to_bf16(from_bits(0x7F7F8000u)) == 0x7F80);          // tie at the top: even is inf
  CHECK(f32_to_bf16(from_bits(0x00000001u)) == 0x0000);          // f32 subnormals round too
  CHECK(f32_to_bf16(from_bits(0x00008000u)) == 0x0000);          // tie -> even 0
  CHECK(f32_to_bf16(from_bits(0x00018000u)) == 0x0002);          // tie -> even
  CHECK(f32_to_bf16(from_bits(0x80008001u)) == 0x8001);
  for (uint32_t c = 0; c < 65536; ++c) {
    bool finite;
    CHECK(same(bf16_to_f32(c), static_cast<float>(ref_bf16().value(c, &finite))));
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const float x = random_float(rng, 1e30);
    const uint16_t got = f32_to_bf16(x);
    REQUIRE(got == ref_bf16().round(x));
    REQUIRE(got == f64_to_bf16(x));
    REQUIRE(same(round_to(DType::bf16, x), bf16_to_f32(got)));
  }
}

TEST_CASE("numerics: round_to and load/store of every dtype") {
  CHECK(round_to(DType::f32, 0.1f) == 0.1f);
  CHECK(round_to(DType::bf16, 1.00390625f) == 1.0f);
  CHECK(round_to(DType::f16, 70000.0f) == INFINITY);
  CHECK(round_to(DType::i32, -2.7f) == -2.0f);
  CHECK(round_to(DType::i32, 3e9f) == 2147483647.0f);           // saturates
  CHECK(round_to(DType::i32, NAN) == 0.0f);
  CHECK(round_to(DType::i64, 1e30f) == static_cast<float>(std::numeric_limits<int64_t>::max()));
  CHECK(round_to(DType::i1, 0.5f) == 1.0f);
  CHECK(round_to(DType::i1, 0.0f) == 0.0f);

  unsigned char buf[64];
  std::memset(buf, 0xAB, sizeof buf);
  store_element(buf, DType::f32, 3, 0.1);          // double -> float, nearest
  CHECK(load_element(buf, DType::f32, 3) == static_cast<double>(0.1f));
  store_element(buf, DType::f16, 5, 65519.0);
  CHECK(load_element(buf, DType::f16, 5) == 65504.0);
  store_element(buf, DType::bf16, 1, -3.0);
  CHECK(load_element(buf, DType::bf16, 1) == -3.0);
  // One rounding from the double: 1 + 2^-8 + 2^-30 is above the bf16 tie (f32 first would
  // round it onto the tie and then to 1.0).
  store_element(buf, DType::bf16, 2, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30));
  CHECK(load_element(buf, DType::bf16, 2) == 1.0 + std::ldexp(1.0, -7));
  store_element(buf, DType::e4m3, 7, 1000.0);
  CHECK(buf[7] == 0x7E);
  CHECK(load_element(buf, DType::e4m3, 7) == 448.0);
  store_element(buf, DType::e5m2, 9, -0.3);
  CHECK(buf[9] == f32_to_e5m2(-0.3f));
  store_element(buf, DType::e4m3, 10, NAN);
  CHECK(buf[10] == 0x7F);
  CHECK(std::isnan(load_element(buf, DType::e4m3, 10)));
  store_element(buf, DType::i32, 2, -7.9);
  CHECK(load_element(buf, DType::i32, 2) == -7.0);
  store_element(buf, DType::i64, 3, 123456789012.0);
  CHECK(load_element(buf, DType::i64, 3) == 123456789012.0);
  store_element(buf, DType::i1, 40, 2.0);
  CHECK(buf[40] == 1);
  CHECK(load_element(buf, DType::i1, 40) == 1.0);
  buf[41] = 7;
  CHECK(load_element(buf, DType::i1, 41) == 1.0);
  // Every e4m3 / e5m2 byte survives a load and a store.
  for (int c = 0; c < 256; ++c) {
    unsigned char in = static_cast<unsigned char>(c), out = 0;
    store_element(&out, DType::e4m3, 0, load_element(&in, DType::e4m3, 0));
    CHECK((out == in || (std::isnan(e4m3_to_f32(in)) && out == 0x7F)));
    store_element(&out, DType::e5m2, 0, load_element(&in, DType::e5m2, 0));
    const float v = e5m2_to_f32(in);
    CHECK((out == in || (std::isnan(v) && out == 0x7F) || (std::isinf(v) && out == ((in & 0x80u) | 0x7Bu))));
  }
}

// The attention softmax's exp2 on the FMA pipes (knob attn_exp2_fma), compiled for the host here:
// the same arithmetic as on the GPU (one rounding per add and fma).
// Two of them in f16x2 for an e4m3 P (attention without an LSE, knob attn_exp2_f16), on the host with
// the GPU's f16 roundings: 2^x within 6e-3 relative down to 2^-14, and its e4m3 within one code of
// e4m3(2^x).
TEST_CASE("numerics: exp2_f16x2 is 2^x within 6e-3 relative, its e4m3 within one code of e4m3(2^x), -inf -> 0, NaN -> NaN") {
  using namespace tj::dev;
  double worst = 0.0;
  int far_codes = 0, not_zero = 0;
  for (int i = 0; i <= 25 * 1024; ++i) {   // [-16.25, 8.75]: P's range with the offset 8 and the slack 0.75
    const float x = -16.25f + static_cast<float>(i) / 1024.0f, y = -x / 2.0f;
    const unsigned r = exp2_f16x2(x, y);
    const double want = std::exp2(static_cast<double>(x));
    const double got = f16_to_f32_sw(static_cast<unsigned short>(r & 0xffffu));
    if (x >= -14.0f) worst = std::max(worst, std::abs(got / want - 1.0));
    if (x <= -14.5f) not_zero += got != 0.0;
    // the high half is its own value (y), not a copy of the low one
    if (y <= 8.75f) worst = std::max(worst, std::abs(f16_to_f32_sw(static_cast<unsigned short>(r >> 16)) / std::exp2(static_cast<double>(y)) - 1.0));
    const int code = f16x2_to_e4m3x2(r) & 0xff, exact = tj::dev::f32_to_e4m3(static_cast<float>(want));
    far_codes += std::abs(code - exact) > 1;
  }
  MESSAGE("exp2_f16x2 max relative error on [-14, 8.75]: " << worst);
  CHECK(worst < 6e-3);
  CHECK(not_zero == 0);
  CHECK(far_codes == 0);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(exp2_f16x2(-inf, -inf) == 0u);   // masked scores: a 0 probability, both halves
  CHECK(exp2_f16x2(-1e30f, 0.0f) == 0x3c000000u);   // 0 and 1.0
  const unsigned n = exp2_f16x2(nan, 1.0f);
  CHECK(std::isnan(f16_to_f32_sw(static_cast<unsigned short>(n & 0xffffu))));
  CHECK(f16_to_f32_sw(static_cast<unsigned short>(n >> 16)) == 2.0f);
  CHECK((f16x2_to_e4m3x2(n) & 0x7fu) == 0x7fu);   // e4m3's NaN code
}

TEST_CASE("numerics: exp2_fma is 2^x within 7.6e-5 relative on the softmax's range, -inf -> 0, NaN -> NaN") {
  double worst = 0.0;
  int too_big = 0;
  auto rel_err = [](float x) { return std::abs(tj::dev::exp2_fma(x) / std::exp2(static_cast<double>(x)) - 1.0); };
  for (int i = 0; i <= 135 * 4096; ++i) {   // [-127, 8]: below the max (P offset 8) down to 2^-127
    const float x = -127.0f + static_cast<float>(i) / 4096.0f;
    if (x >= -125.0f) worst = std::max(worst, rel_err(x));
    else too_big += tj::dev::exp2_fma(x) > 2.0 * std::exp2(static_cast<double>(x));   // denormal-sized, 0 at -127
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-125.0f, 8.0f);
  for (int i = 0; i < 100000; ++i) worst = std::max(worst, rel_err(u(rng)));
  MESSAGE("exp2_fma max relative error on [-125, 8]: " << worst);
  CHECK(worst < 7.6e-5);
  CHECK(too_big == 0);
  // masked scores: exactly 0, as ex2.approx gives (a fully masked row keeps l = 0)
  CHECK(tj::dev::exp2_fma(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(tj::dev::exp2_fma(-127.0f) == 0.0f);
  CHECK(tj::dev::exp2_fma(-1e30f) == 0.0f);
  CHECK(std::isnan(tj::dev::exp2_fma(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::abs(tj::dev::exp2_fma(8.0f) - 256.0f) < 256.0f * 7.6e-5f);
}
