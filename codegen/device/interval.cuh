#pragma once
// tilejit device library: interval arithmetic for block classification. The attention lowering
// evaluates a mask hook's ops on a whole block of (query, key) positions at once -- every value
// as the range it can take over the block, every boolean as whether it can be true / false --
// to skip key blocks the mask rules out entirely and to drop the per-element mask on blocks it
// keeps entirely (codegen/lower_attention_sm90.cpp). Conservative by construction: an op it
// cannot bound gives the full range ("either"), which only costs the per-element mask.
//
// Integers are held as 64-bit integers (exact floor division and modulo), floats as floats:
// the classification runs once per key block on every thread, so it must cost a few integer
// instructions, not double-precision conversions. "Unbounded" integer ends are +-2^61, kept
// there by saturation so sums of two never overflow. Wrap-around of the DSL's i32 ops is not
// modelled.

namespace tj {
namespace dev {

template <class T>
struct Iv {     // a value in [lo, hi]
  T lo, hi;
};
using IvI = Iv<long long>;
using IvF = Iv<float>;
struct IvB {    // a boolean: can it be true, can it be false
  bool t, f;
};

constexpr long long kIvBig = 1ll << 61;

// The interval type of an element type: floats as IvF, integers as IvI.
template <class T> struct IvOf { using type = long long; };
template <> struct IvOf<float> { using type = float; };

__device__ __forceinline__ long long iv_sat(long long x) { return x > kIvBig ? kIvBig : (x < -kIvBig ? -kIvBig : x); }
__device__ __forceinline__ float iv_inf_f() { return __int_as_float(0x7f800000); }

__device__ __forceinline__ IvI iv_point(long long x) { return IvI{iv_sat(x), iv_sat(x)}; }
__device__ __forceinline__ IvI iv_point(int x) { return IvI{x, x}; }
__device__ __forceinline__ IvF iv_point(float x) { return IvF{x, x}; }
__device__ __forceinline__ IvB ivb_point(bool x) { return IvB{x, !x}; }
template <class T> __device__ __forceinline__ Iv<T> iv_any();
template <> __device__ __forceinline__ IvI iv_any<long long>() { return IvI{-kIvBig, kIvBig}; }
template <> __device__ __forceinline__ IvF iv_any<float>() { return IvF{-iv_inf_f(), iv_inf_f()}; }
__device__ __forceinline__ IvB ivb_any() { return IvB{true, true}; }
// NaN bounds (inf - inf, 0 * inf, ...) know nothing.
__device__ __forceinline__ IvF iv_checked(float lo, float hi) { return (lo <= hi) ? IvF{lo, hi} : iv_any<float>(); }

__device__ __forceinline__ IvI iv_add(IvI a, IvI b) { return IvI{iv_sat(a.lo + b.lo), iv_sat(a.hi + b.hi)}; }
__device__ __forceinline__ IvF iv_add(IvF a, IvF b) { return iv_checked(a.lo + b.lo, a.hi + b.hi); }
__device__ __forceinline__ IvI iv_sub(IvI a, IvI b) { return IvI{iv_sat(a.lo - b.hi), iv_sat(a.hi - b.lo)}; }
__device__ __forceinline__ IvF iv_sub(IvF a, IvF b) { return iv_checked(a.lo - b.hi, a.hi - b.lo); }
__device__ __forceinline__ IvI iv_mul(IvI a, IvI b) {
  const long long small = 1ll << 30;   // products of these stay far from overflow
  if (a.lo < -small || a.hi > small || b.lo < -small || b.hi > small) return iv_any<long long>();
  const long long p0 = a.lo * b.lo, p1 = a.lo * b.hi, p2 = a.hi * b.lo, p3 = a.hi * b.hi;
  return IvI{min(min(p0, p1), min(p2, p3)), max(max(p0, p1), max(p2, p3))};
}
__device__ __forceinline__ IvF iv_mul(IvF a, IvF b) {
  const float p0 = a.lo * b.lo, p1 = a.lo * b.hi, p2 = a.hi * b.lo, p3 = a.hi * b.hi;
  return iv_checked(fminf(fminf(p0, p1), fminf(p2, p3)), fmaxf(fmaxf(p0, p1), fmaxf(p2, p3)));
}
__device__ __forceinline__ IvF iv_div(IvF a, IvF b) {
  if (b.lo <= 0.0f && b.hi >= 0.0f) return iv_any<float>();
  const float q0 = a.lo / b.lo, q1 = a.lo / b.hi, q2 = a.hi / b.lo, q3 = a.hi / b.hi;
  return iv_checked(fminf(fminf(q0, q1), fminf(q2, q3)), fmaxf(fmaxf(q0, q1), fmaxf(q2, q3)));
}
__device__ __forceinline__ long long iv_floor_div(long long a, long long c) {   // c > 0
  const long long q = a / c;
  return (a % c != 0 && a < 0) ? q - 1 : q;
}
// Integer division by a positive constant is monotone (truncating `div`, flooring `floordiv`).
__device__ __forceinline__ IvI iv_div(IvI a, IvI b) {
  if (b.lo != b.hi || b.lo <= 0) return iv_any<long long>();
  return IvI{a.lo / b.lo, a.hi / b.lo};
}
__device__ __forceinline__ IvI iv_floordiv(IvI a, IvI b) {
  if (b.lo != b.hi || b.lo <= 0) return iv_any<long long>();
  return IvI{iv_floor_div(a.lo, b.lo), iv_floor_div(a.hi, b.lo)};
}
// Floored modulo by a positive constant c: exact while [lo, hi] stays in one period.
__device__ __forceinline__ IvI iv_mod(IvI a, IvI b) {
  if (b.lo != b.hi || b.lo <= 0) return iv_any<long long>();
  const long long c = b.lo, k = iv_floor_div(a.lo, c);
  if (iv_floor_div(a.hi, c) == k) return IvI{a.lo - k * c, a.hi - k * c};
  return IvI{0, c - 1};
}
template <class T> __device__ __forceinline__ Iv<T> iv_max(Iv<T> a, Iv<T> b) {
  return Iv<T>{a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
}
template <class T> __device__ __forceinline__ Iv<T> iv_min(Iv<T> a, Iv<T> b) {
  return Iv<T>{a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi};
}
template <class T> __device__ __forceinline__ Iv<T> iv_neg(Iv<T> a) { return Iv<T>{-a.hi, -a.lo}; }
template <class T> __device__ __forceinline__ Iv<T> iv_abs(Iv<T> a) {
  if (a.lo >= T(0)) return a;
  if (a.hi <= T(0)) return Iv<T>{-a.hi, -a.lo};
  return Iv<T>{T(0), -a.lo > a.hi ? -a.lo : a.hi};
}
// Non-decreasing float functions (exp2, exp, log2, log, sqrt, tanh): the ends map to the ends.
template <class F>
__device__ __forceinline__ IvF iv_monotone(IvF a, F f) {
  return iv_checked(f(a.lo), f(a.hi));
}

template <class T> __device__ __forceinline__ IvB iv_lt(Iv<T> a, Iv<T> b) { return IvB{a.lo < b.hi, !(a.hi < b.lo)}; }
template <class T> __device__ __forceinline__ IvB iv_le(Iv<T> a, Iv<T> b) { return IvB{a.lo <= b.hi, !(a.hi <= b.lo)}; }
template <class T> __device__ __forceinline__ IvB iv_gt(Iv<T> a, Iv<T> b) { return iv_lt(b, a); }
template <class T> __device__ __forceinline__ IvB iv_ge(Iv<T> a, Iv<T> b) { return iv_le(b, a); }
template <class T> __device__ __forceinline__ IvB iv_eq(Iv<T> a, Iv<T> b) {
  const bool overlap = a.lo <= b.hi && b.lo <= a.hi;
  const bool same_point = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  return IvB{overlap, !same_point};
}
template <class T> __device__ __forceinline__ IvB iv_ne(Iv<T> a, Iv<T> b) {
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

template <class T> __device__ __forceinline__ Iv<T> iv_where(IvB c, Iv<T> a, Iv<T> b) {
  if (!c.f) return a;
  if (!c.t) return b;
  return Iv<T>{a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
}
__device__ __forceinline__ IvB iv_where(IvB c, IvB a, IvB b) {
  if (!c.f) return a;
  if (!c.t) return b;
  return IvB{a.t || b.t, a.f || b.f};
}
// Casts: booleans to and from numbers, integers to floats (monotone), floats to integers
// (truncation toward zero: monotone).
__device__ __forceinline__ IvI iv_int_from_bool(IvB a) { return IvI{a.f ? 0 : 1, a.t ? 1 : 0}; }
__device__ __forceinline__ IvF iv_float_from_bool(IvB a) { return IvF{a.f ? 0.0f : 1.0f, a.t ? 1.0f : 0.0f}; }
__device__ __forceinline__ IvB iv_to_bool(IvI a) { return IvB{a.lo != 0 || a.hi != 0, a.lo <= 0 && a.hi >= 0}; }
__device__ __forceinline__ IvB iv_to_bool(IvF a) {
  return IvB{a.lo != 0.0f || a.hi != 0.0f, a.lo <= 0.0f && a.hi >= 0.0f};
}
__device__ __forceinline__ IvF iv_to_float(IvI a) {
  return IvF{a.lo <= -kIvBig ? -iv_inf_f() : (float)a.lo, a.hi >= kIvBig ? iv_inf_f() : (float)a.hi};
}
__device__ __forceinline__ IvI iv_to_int(IvF a) {
  const float big = (float)kIvBig;
  if (!(a.lo <= a.hi)) return iv_any<long long>();
  return IvI{a.lo <= -big ? -kIvBig : (long long)truncf(a.lo), a.hi >= big ? kIvBig : (long long)truncf(a.hi)};
}

// What a mask's boolean says about the whole block: 0 never kept, 1 always kept, 2 either.
__device__ __forceinline__ int iv_block_class(IvB keep) { return !keep.t ? 0 : (!keep.f ? 1 : 2); }

// A gather's values over a box of indices (one integer interval per dimension of tensor `t`,
// anything with data / shape[] / stride[]): the range of the elements inside the box (a range
// query: a block mask read at [q / BQ, kv / BK] over a key block scans a few cells), and 0 when
// the box reaches outside the tensor (out-of-range reads give 0). Boxes of more than
// kIvGatherCells elements give the type's whole range instead of scanning.
constexpr long long kIvGatherCells = 256;
template <class T, class TA, class... I>
__device__ __forceinline__ Iv<typename IvOf<T>::type> iv_gather(const TA& t, I... ivs) {
  using V = typename IvOf<T>::type;
  constexpr int R = sizeof...(I);
  const IvI box[R] = {ivs...};
  long long lo[R], n[R];
  long long cells = 1;
  bool outside = false;
#pragma unroll
  for (int d = 0; d < R; ++d) {
    lo[d] = box[d].lo > 0 ? box[d].lo : 0;
    const long long hi = box[d].hi < t.shape[d] - 1 ? box[d].hi : t.shape[d] - 1;
    outside = outside || box[d].lo < 0 || box[d].hi > t.shape[d] - 1;
    if (lo[d] > hi) return iv_point((V)0);   // every index out of range: every read is 0
    n[d] = hi - lo[d] + 1;
    cells = cells > kIvGatherCells ? cells : cells * n[d];
  }
  if (cells > kIvGatherCells) return iv_any<V>();
  V vlo = (V)0, vhi = (V)0;   // 0 is in the range when some index is out of range
  bool first = !outside;
  // 32-bit cell arithmetic (cells <= kIvGatherCells): a 64-bit division is a long subroutine, and
  // every CTA classifies its key blocks this way before its first load.
  for (int c = 0; c < (int)cells; ++c) {
    int rest = c;
    long long offset = 0;
#pragma unroll
    for (int d = R - 1; d >= 0; --d) {
      const int nd = (int)n[d];
      offset += (lo[d] + rest % nd) * t.stride[d];
      rest /= nd;
    }
    const V x = (V)(static_cast<const T*>(t.data)[offset]);
    vlo = first || x < vlo ? x : vlo;
    vhi = first || x > vhi ? x : vhi;
    first = false;
  }
  return Iv<V>{vlo, vhi};
}

}  // namespace dev
}  // namespace tj
