#pragma once
// tilejit device library: interval arithmetic for block classification. The attention lowering
// evaluates a mask hook's ops on a whole block of (query, key) positions at once -- every value
// as the range it can take over the block, every boolean as whether it can be true / false --
// to skip key blocks the mask rules out entirely and to drop the per-element mask on blocks it
// keeps entirely (codegen/lower_attention_sm90.cpp). Conservative by construction: an op it
// cannot bound gives the full range ("either"), which only costs the per-element mask.
//
// Numbers are held as doubles: i32/i64 positions and sizes (|x| < 2^53) are exact, and so is
// floor(a / c) for them. Integer wrap-around of the DSL's i32 ops is not modelled.

namespace tj {
namespace dev {

struct Iv {     // a value in [lo, hi]
  double lo, hi;
};
struct IvB {    // a boolean: can it be true, can it be false
  bool t, f;
};

__device__ __forceinline__ double iv_inf() { return __longlong_as_double(0x7ff0000000000000ll); }
__device__ __forceinline__ Iv iv_point(double x) { return Iv{x, x}; }
__device__ __forceinline__ Iv iv_range(double lo, double hi) { return Iv{lo, hi}; }
__device__ __forceinline__ Iv iv_any() { return Iv{-iv_inf(), iv_inf()}; }
__device__ __forceinline__ IvB ivb_point(bool x) { return IvB{x, !x}; }
__device__ __forceinline__ IvB ivb_any() { return IvB{true, true}; }
// NaN bounds (inf - inf, 0 * inf, ...) know nothing.
__device__ __forceinline__ Iv iv_checked(double lo, double hi) {
  return (lo <= hi) ? Iv{lo, hi} : iv_any();
}

__device__ __forceinline__ Iv iv_add(Iv a, Iv b) { return iv_checked(a.lo + b.lo, a.hi + b.hi); }
__device__ __forceinline__ Iv iv_sub(Iv a, Iv b) { return iv_checked(a.lo - b.hi, a.hi - b.lo); }
__device__ __forceinline__ Iv iv_mul(Iv a, Iv b) {
  const double p0 = a.lo * b.lo, p1 = a.lo * b.hi, p2 = a.hi * b.lo, p3 = a.hi * b.hi;
  return iv_checked(fmin(fmin(p0, p1), fmin(p2, p3)), fmax(fmax(p0, p1), fmax(p2, p3)));
}
__device__ __forceinline__ Iv iv_div_float(Iv a, Iv b) {
  if (b.lo <= 0.0 && b.hi >= 0.0) return iv_any();
  const double q0 = a.lo / b.lo, q1 = a.lo / b.hi, q2 = a.hi / b.lo, q3 = a.hi / b.hi;
  return iv_checked(fmin(fmin(q0, q1), fmin(q2, q3)), fmax(fmax(q0, q1), fmax(q2, q3)));
}
// Integer division by a positive constant is monotone (trunc: `div`, floor: `floordiv`).
__device__ __forceinline__ Iv iv_div_int(Iv a, Iv b) {
  if (b.lo != b.hi || !(b.lo > 0.0)) return iv_any();
  return Iv{trunc(a.lo / b.lo), trunc(a.hi / b.lo)};
}
__device__ __forceinline__ Iv iv_floordiv(Iv a, Iv b) {
  if (b.lo != b.hi || !(b.lo > 0.0)) return iv_any();
  return Iv{floor(a.lo / b.lo), floor(a.hi / b.lo)};
}
// Floored modulo by a positive constant c: exact while [lo, hi] stays in one period.
__device__ __forceinline__ Iv iv_mod(Iv a, Iv b) {
  if (b.lo != b.hi || !(b.lo > 0.0)) return iv_any();
  const double c = b.lo, k = floor(a.lo / c);
  if (floor(a.hi / c) == k) return Iv{a.lo - k * c, a.hi - k * c};
  return Iv{0.0, c - 1.0};
}
__device__ __forceinline__ Iv iv_max(Iv a, Iv b) { return Iv{fmax(a.lo, b.lo), fmax(a.hi, b.hi)}; }
__device__ __forceinline__ Iv iv_min(Iv a, Iv b) { return Iv{fmin(a.lo, b.lo), fmin(a.hi, b.hi)}; }
__device__ __forceinline__ Iv iv_neg(Iv a) { return Iv{-a.hi, -a.lo}; }
__device__ __forceinline__ Iv iv_abs(Iv a) {
  if (a.lo >= 0.0) return a;
  if (a.hi <= 0.0) return Iv{-a.hi, -a.lo};
  return Iv{0.0, fmax(-a.lo, a.hi)};
}
// Non-decreasing functions (exp2, exp, log2, log, sqrt, tanh, casts): the ends map to the ends.
template <class F>
__device__ __forceinline__ Iv iv_monotone(Iv a, F f) {
  return iv_checked(f(a.lo), f(a.hi));
}

__device__ __forceinline__ IvB iv_lt(Iv a, Iv b) { return IvB{a.lo < b.hi, !(a.hi < b.lo)}; }
__device__ __forceinline__ IvB iv_le(Iv a, Iv b) { return IvB{a.lo <= b.hi, !(a.hi <= b.lo)}; }
__device__ __forceinline__ IvB iv_gt(Iv a, Iv b) { return iv_lt(b, a); }
__device__ __forceinline__ IvB iv_ge(Iv a, Iv b) { return iv_le(b, a); }
__device__ __forceinline__ IvB iv_eq(Iv a, Iv b) {
  const bool overlap = a.lo <= b.hi && b.lo <= a.hi;
  const bool same_point = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  return IvB{overlap, !same_point};
}
__device__ __forceinline__ IvB iv_ne(Iv a, Iv b) {
  const IvB e = iv_eq(a, b);
  return IvB{e.f, e.t};
}
// Booleans compared: (q < c) == (kv < c) is how a document mask says "same side of c".
__device__ __forceinline__ IvB iv_eq(IvB a, IvB b) { return IvB{(a.t && b.t) || (a.f && b.f), (a.t && b.f) || (a.f && b.t)}; }
__device__ __forceinline__ IvB iv_ne(IvB a, IvB b) {
  const IvB e = iv_eq(a, b);
  return IvB{e.f, e.t};
}
__device__ __forceinline__ IvB iv_and(IvB a, IvB b) { return IvB{a.t && b.t, a.f || b.f}; }
__device__ __forceinline__ IvB iv_or(IvB a, IvB b) { return IvB{a.t || b.t, a.f && b.f}; }
__device__ __forceinline__ IvB iv_not(IvB a) { return IvB{a.f, a.t}; }

__device__ __forceinline__ Iv iv_where(IvB c, Iv a, Iv b) {
  if (!c.f) return a;
  if (!c.t) return b;
  return Iv{fmin(a.lo, b.lo), fmax(a.hi, b.hi)};
}
__device__ __forceinline__ IvB iv_where(IvB c, IvB a, IvB b) {
  if (!c.f) return a;
  if (!c.t) return b;
  return IvB{a.t || b.t, a.f || b.f};
}
// Casts between number and boolean.
__device__ __forceinline__ Iv iv_from_bool(IvB a) { return Iv{a.f ? 0.0 : 1.0, a.t ? 1.0 : 0.0}; }
__device__ __forceinline__ IvB iv_to_bool(Iv a) {
  return IvB{a.lo != 0.0 || a.hi != 0.0, a.lo <= 0.0 && a.hi >= 0.0};
}
// Float -> integer casts truncate toward zero: monotone.
__device__ __forceinline__ Iv iv_trunc(Iv a) { return Iv{trunc(a.lo), trunc(a.hi)}; }

// What a mask's boolean says about the whole block: 0 never kept, 1 always kept, 2 either.
__device__ __forceinline__ int iv_block_class(IvB keep) { return !keep.t ? 0 : (!keep.f ? 1 : 2); }

}  // namespace dev
}  // namespace tj
