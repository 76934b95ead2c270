#pragma once
// tilejit device tile library: the SIMT building blocks that generated kernels call
// (namespace tj::dev). Compiled by NVRTC with no CUDA toolkit header: only builtins and the
// other embedded files (fp8.cuh for the f32 <-> f16/bf16/e4m3/e5m2 conversions).
//
// Register tiles. A tile value lives in registers as Tile<T, L>: `T v[L::slots]` per thread,
// where T is the register type of its dtype (float for every float dtype, already rounded to
// that dtype; int; long long; bool) and L a Blocked layout:
//
//   Arr<LR, LC, WR, WC, V> the block's threads as a grid of thread rows x thread columns:
//                         a warp is LR x LC lanes (lane = lr * LC + lc), the block WR x WC
//                         warps (warp = wr * WC + wc); thread row = lr + LR * wr, thread
//                         column = lc + LC * wc. Each thread column holds V adjacent columns
//                         (V > 1: loads and stores move V elements at once where memory allows).
//                         Arr::rows = LR * WR; Arr::cols = LC * WC * V, the columns one
//                         repetition covers.
//   Blocked<A, ER, EC>    a tile with extent ER along the thread rows and EC along the thread
//                         columns. Slot (i, j) (index i * sc + j) of a thread holds the element
//                         at raw coordinates (row() + i * rows, col() + j % vec + (j / vec) *
//                         cols), vec = V (1 for EC = 1: a row slice holds one slot). An extent
//                         smaller than the thread grid is replicated (coordinate = raw % E); the
//                         last repetition of an extent that is not a multiple is padding
//                         (clamped coordinate). Only "primary" slots (raw < E) count in
//                         reductions and stores; every slot holds a valid element, so
//                         elementwise code never needs a mask.
//
// A rank-2 tile [R, C] has R along the rows and C along the columns. A rank-1 tile lies along
// the rows (the "row slice": what a row reduction gives, broadcast as [R, 1] for free) or the
// columns (the "column slice", broadcast as [1, C] for free); a rank-1 tile in a kernel without
// rank-2 tiles uses Arr<1, 32, 1, W>: thread t holds elements t, t + 32W, ...
//
// Every function is uniform: all threads of the tiles' warps call it (some use sync_threads).
// Scratch shared memory comes from the caller (one dynamic buffer reused by every op).
#include "fp8.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define TJ_DEV __device__ __forceinline__
#else
#define TJ_DEV inline
#endif

namespace tj {
namespace dev {

// ---------------------------------------------------------------- programmatic dependent launch
// A kernel launched with the programmatic stream serialization attribute (sm_90+;
// LaunchOptions::start_early) may start before the previous kernel on its stream has finished.
// griddep_wait() returns once that kernel has finished and its writes are visible (at once in a
// launch without the attribute); every thread that reads or writes what the previous kernel may
// touch calls it first, and every CTA calls it before it exits, so that no kernel finishes before
// the one it started beside. griddep_launch_dependents(), by every thread of a CTA, lets the next
// kernel on the stream start (if launched so) once every CTA of this one has called it or exited.
// No-ops before sm_90.
TJ_DEV void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
TJ_DEV void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---------------------------------------------------------------- warp-uniform values
// v as lane 0 of the warp holds it. For a value the same in every lane that the compiler cannot
// prove so (it depends on threadIdx.x): what is computed from it then stays on the uniform
// datapath (wgmma descriptors, ring addresses and phases) instead of per-thread registers moved
// into uniform ones before each use (R2UR). Every lane of the warp must call it together.
TJ_DEV int warp_uniform(int v) {
#if defined(__CUDA_ARCH__)
  return __shfl_sync(0xffffffffu, v, 0);
#else
  return v;
#endif
}

// ---------------------------------------------------------------- a program's threads
// The threads that run one program: the whole block, or, in a kernel whose block runs several
// programs at once (knob wg_programs: TJ_PROGRAM_THREADS threads each, one after the other),
// those of this thread's program slot. Layouts, barriers and scalar stores count threads from
// the first of the program's.
TJ_DEV int program_tid() {
#if defined(TJ_PROGRAM_THREADS)
  return (int)threadIdx.x % TJ_PROGRAM_THREADS;
#else
  return (int)threadIdx.x;
#endif
}
TJ_DEV int program_slot() {
#if defined(TJ_PROGRAM_THREADS)
  return (int)threadIdx.x / TJ_PROGRAM_THREADS;
#else
  return 0;
#endif
}

// Knob wg_programs (two slots): the slots' programs take the operand rings in turn, in the
// producer's fill order. A slot takes its turn (named barrier 3 + its slot) before its program's
// first ring wait and passes it (the other's barrier) after its last, so that no slot waits for a
// fill more than one ring round ahead of the last one waited for (a ring slot's mbarrier phase
// parity tells only one round from the next). Each pass pairs with one take.
TJ_DEV void slot_take(int slot) {
#if defined(TJ_PROGRAM_THREADS) && defined(__CUDA_ARCH__)
  asm volatile("bar.sync %0, %1;" ::"r"(3 + slot), "n"(2 * TJ_PROGRAM_THREADS) : "memory");
#else
  (void)slot;
#endif
}
TJ_DEV void slot_pass(int to_slot) {
#if defined(TJ_PROGRAM_THREADS) && defined(__CUDA_ARCH__)
  asm volatile("bar.arrive %0, %1;" ::"r"(3 + to_slot), "n"(2 * TJ_PROGRAM_THREADS) : "memory");
#else
  (void)to_slot;
#endif
}

// ---------------------------------------------------------------- block barrier
// The barrier of the threads that hold one program's tiles: the whole block, or, in a kernel
// with a producer warpgroup (which never holds tiles), the TJ_TILE_THREADS threads before it
// (named barrier 1), or, with several programs a block, the TJ_PROGRAM_THREADS of this thread's
// (named barrier 1 + its slot).
TJ_DEV void sync_threads() {
#if defined(TJ_PROGRAM_THREADS) && defined(__CUDA_ARCH__)
  asm volatile("bar.sync %0, %1;" ::"r"(1 + program_slot()), "n"(TJ_PROGRAM_THREADS) : "memory");
#elif defined(TJ_TILE_THREADS) && defined(__CUDA_ARCH__)
  asm volatile("bar.sync 1, %0;" ::"n"(TJ_TILE_THREADS) : "memory");
#else
  __syncthreads();
#endif
}

// ---------------------------------------------------------------- kernel arguments
// A tensor parameter, passed by value: base pointer, sizes and strides (in elements).
template <int R>
struct TensorArg {
  void* data;
  long long shape[R];
  long long stride[R];
};

// One tile axis in memory: tensor index = start + coordinate; `limit` is the tensor dim.
struct Span {
  long long start;
  long long stride;
  long long limit;
};

// ---------------------------------------------------------------- small helpers
template <class A, class B> struct same_type { static constexpr bool value = false; };
template <class A> struct same_type<A, A> { static constexpr bool value = true; };

TJ_DEV float inf() { return u32_as_f32(0x7f800000u); }
TJ_DEV float nan() { return u32_as_f32(0x7fffffffu); }

template <class T> TJ_DEV T floordiv(T a, T b) {   // rounds down
  T q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <class T> TJ_DEV T mod(T a, T b) {        // floored: the sign of the divisor
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <class T> TJ_DEV T cdiv(T a, T b) { return floordiv<T>(a + b - 1, b); }
template <class T> TJ_DEV T imax(T a, T b) { return a > b ? a : b; }
template <class T> TJ_DEV T imin(T a, T b) { return a < b ? a : b; }
template <class T> TJ_DEV T iabs(T a) { return a < 0 ? -a : a; }
TJ_DEV bool in_range(long long i, long long n) { return (unsigned long long)i < (unsigned long long)n; }

// Rounding of an f32 result to a narrower float dtype (round to nearest even), kept as f32.
TJ_DEV float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }
TJ_DEV float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
TJ_DEV float round_e4m3(float x) { return e4m3_to_f32(f32_to_e4m3(x)); }
TJ_DEV float round_e5m2(float x) { return e5m2_to_f32(f32_to_e5m2(x)); }

// The DSL's exp2: the MUFU's ex2.approx.ftz (relative error about 2^-22, as exp2f's for normal
// results); a result below 2^-126 is 0, as in the CPU reference (runtime/reference.cpp). exp2f
// would add a denormal fix-up of three instructions per element around the MUFU.
TJ_DEV float exp2(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  const float r = exp2f(x);
  return r < 1.17549435e-38f ? 0.0f : r;
#endif
}

// 1 + tanh(y) as 2 / (1 + e^(-2y)), the same value in real arithmetic (the emitter's rewrite of
// a user's 1 + tanh(y), as in GELU): an ex2 and a fast division (two MUFU ops, relative error
// about 1e-6) instead of tanhf's ~17 instructions, and without the cancellation of 1 + tanh(y)
// where tanh(y) nears -1 (GELU's left tail). e^(-2y) past the f32 range gives 0, the limit.
TJ_DEV float one_plus_tanh(float y) {
#if defined(__CUDA_ARCH__)
  return __fdividef(2.0f, 1.0f + exp2(-2.88539008f * y));
#else
  return 2.0f / (1.0f + exp2(-2.88539008f * y));
#endif
}

// Fast approximations, used only with the "fast_math" config knob.
TJ_DEV float fast_log2(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return log2f(x);
#endif
}
TJ_DEV float fast_tanh(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return tanhf(x);
#endif
}
TJ_DEV float fast_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return sqrtf(x);
#endif
}

// ---------------------------------------------------------------- element types
// reg: the register type; mem: the storage type; ld/st convert; rnd rounds an f32 to the dtype.
struct f32 {
  using reg = float; using mem = float;
  static TJ_DEV float ld(const mem* p) { return *p; }
  static TJ_DEV void st(mem* p, float x) { *p = x; }
  static TJ_DEV void add(mem* p, float x) {   // the DSL's atomic_add: a reduction, no value back
#if defined(__CUDA_ARCH__)
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(x) : "memory");
#else
    atomicAdd(p, x);
#endif
  }
  static TJ_DEV float rnd(float x) { return x; }
};
struct f16 {
  using reg = float; using mem = unsigned short;
  static TJ_DEV float ld(const mem* p) { return f16_to_f32(*p); }
  static TJ_DEV void st(mem* p, float x) { *p = f32_to_f16(x); }
  static TJ_DEV float rnd(float x) { return round_f16(x); }
};
struct bf16 {
  using reg = float; using mem = unsigned short;
  static TJ_DEV float ld(const mem* p) { return bf16_to_f32(*p); }
  static TJ_DEV void st(mem* p, float x) { *p = f32_to_bf16(x); }
  static TJ_DEV float rnd(float x) { return round_bf16(x); }
};
struct e4m3 {
  using reg = float; using mem = unsigned char;
  static TJ_DEV float ld(const mem* p) { return e4m3_to_f32(*p); }
  static TJ_DEV void st(mem* p, float x) { *p = f32_to_e4m3(x); }
  static TJ_DEV float rnd(float x) { return round_e4m3(x); }
};
struct e5m2 {
  using reg = float; using mem = unsigned char;
  static TJ_DEV float ld(const mem* p) { return e5m2_to_f32(*p); }
  static TJ_DEV void st(mem* p, float x) { *p = f32_to_e5m2(x); }
  static TJ_DEV float rnd(float x) { return round_e5m2(x); }
};
struct i32 {
  using reg = int; using mem = int;
  static TJ_DEV int ld(const mem* p) { return *p; }
  static TJ_DEV void st(mem* p, int x) { *p = x; }
  static TJ_DEV void add(mem* p, int x) {
#if defined(__CUDA_ARCH__)
    asm volatile("red.global.add.s32 [%0], %1;" ::"l"(p), "r"(x) : "memory");
#else
    atomicAdd(p, x);
#endif
  }
  static TJ_DEV int rnd(int x) { return x; }
};
struct i64 {
  using reg = long long; using mem = long long;
  static TJ_DEV long long ld(const mem* p) { return *p; }
  static TJ_DEV void st(mem* p, long long x) { *p = x; }
  static TJ_DEV void add(mem* p, long long x) {   // two's complement: an unsigned add of the same bits
#if defined(__CUDA_ARCH__)
    asm volatile("red.global.add.u64 [%0], %1;" ::"l"(p), "l"((unsigned long long)x) : "memory");
#else
    atomicAdd(reinterpret_cast<unsigned long long*>(p), (unsigned long long)x);
#endif
  }
  static TJ_DEV long long rnd(long long x) { return x; }
};
struct i1 {
  using reg = bool; using mem = unsigned char;
  static TJ_DEV bool ld(const mem* p) { return *p != 0; }
  static TJ_DEV void st(mem* p, bool x) { *p = x ? 1 : 0; }
  static TJ_DEV bool rnd(bool x) { return x; }
};

// ---------------------------------------------------------------- layouts
template <int LR, int LC, int WR, int WC, int V = 1>
struct Arr {
  static_assert(LR * LC == 32, "a warp has 32 lanes");
  static_assert(V >= 1 && V <= 16 && (V & (V - 1)) == 0, "V is a power of two up to 16");
  static constexpr int lanes_r = LR, lanes_c = LC, warps_r = WR, warps_c = WC, vec = V;
  static constexpr int rows = LR * WR, cols = LC * WC * V, threads = 32 * WR * WC;
  static TJ_DEV int lane() { return (int)threadIdx.x & 31; }
  static TJ_DEV int warp() { return program_tid() >> 5; }
  static TJ_DEV int row() { return lane() / LC + LR * (warp() / WC); }
  static TJ_DEV int col() { return (lane() % LC + LC * (warp() % WC)) * V; }   // the first of its V
};

// Coordinate of a raw position along an axis of extent E covered by COVER threads.
template <long long E, int COVER>
TJ_DEV int wrap(int raw) {
  if constexpr (E % COVER == 0) return raw;                      // exact cover
  else if constexpr (E < COVER) return E == 1 ? 0 : raw % (int)E;  // replicated
  else return raw < (int)E ? raw : (int)E - 1;                   // padding of the last repetition
}

template <class A, long long ER, long long EC>
struct Blocked {
  using arr = A;
  static constexpr long long er = ER, ec = EC;
  static constexpr int vec = EC == 1 ? 1 : A::vec;
  static constexpr int sr = (int)((ER + A::rows - 1) / A::rows);
  static constexpr int sc = (int)((EC + A::cols - 1) / A::cols) * vec;
  static constexpr int slots = sr * sc;
  static TJ_DEV int raw_r(int i) { return A::row() + i * A::rows; }
  static TJ_DEV int raw_c(int j) { return A::col() + j % vec + (j / vec) * A::cols; }
  static TJ_DEV int coord_r(int i) { return wrap<ER, A::rows>(raw_r(i)); }
  static TJ_DEV int coord_c(int j) { return wrap<EC, A::cols>(raw_c(j)); }
  static TJ_DEV bool primary_r(int i) { return (ER % A::rows == 0) || raw_r(i) < (int)ER; }
  static TJ_DEV bool primary_c(int j) { return (EC % A::cols == 0) || raw_c(j) < (int)EC; }
  static TJ_DEV constexpr int idx(int i, int j) { return i * sc + j; }   // register of slot (i, j)
  template <long long R, long long C> using with_extents = Blocked<A, R, C>;
};

template <class T, class L>
struct Tile {
  T v[L::slots];
};

// The layout of a reduction's result: the reduced axis (0 rows, 1 columns) becomes extent 1.
template <class L, int AXIS>
using reduced_t = typename L::template with_extents<AXIS == 0 ? 1 : L::er, AXIS == 1 ? 1 : L::ec>;

// ---------------------------------------------------------------- construction
template <class L, class T>
TJ_DEV Tile<T, L> full(T value) {
  Tile<T, L> out;
#pragma unroll
  for (int i = 0; i < L::slots; ++i) out.v[i] = value;
  return out;
}

// i32 tile: start + position along AXIS (0 rows, 1 columns).
template <class L, int AXIS>
TJ_DEV Tile<int, L> arange(long long start) {
  Tile<int, L> out;
#pragma unroll
  for (int i = 0; i < L::sr; ++i)
#pragma unroll
    for (int j = 0; j < L::sc; ++j)
      out.v[L::idx(i, j)] = (int)(start + (AXIS == 0 ? L::coord_r(i) : L::coord_c(j)));
  return out;
}

// ---------------------------------------------------------------- memory
namespace detail {
template <int BYTES> struct Chunk;
template <> struct Chunk<1> { using type = unsigned char; };
template <> struct Chunk<2> { using type = unsigned short; };
template <> struct Chunk<4> { using type = unsigned; };
template <> struct Chunk<8> { using type = uint2; };
template <> struct Chunk<16> { using type = uint4; };

// A global load that asks L2 to fetch the whole 256-byte block around it (PTX .L2::256B, sm_80
// on): a streaming pass then keeps more bytes in flight per request. Only for loads whose row
// covers whole blocks (WIDE: a tile row of 256 bytes or more, unit stride), which use every
// byte fetched; a column or a narrow tile would waste most of each block. The "memory" clobber
// keeps it in order with the kernel's stores (InOut tensors). Measured on an H200: chunk_amax
// 24.4 -> 23.3 us, quantize_transpose_fp8_chunked 43.0 -> 39.4 us.
template <bool WIDE, class C>
TJ_DEV C ld_global(const C* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (WIDE && sizeof(C) == 16) {
    uint4 v;
    asm volatile("ld.global.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return *reinterpret_cast<C*>(&v);
  } else if constexpr (WIDE && sizeof(C) == 8) {
    uint2 v;
    asm volatile("ld.global.L2::256B.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return *reinterpret_cast<C*>(&v);
  } else if constexpr (WIDE && sizeof(C) == 4) {
    unsigned v;
    asm volatile("ld.global.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return *reinterpret_cast<C*>(&v);
  } else if constexpr (WIDE && sizeof(C) == 2) {
    unsigned short v;
    asm volatile("ld.global.L2::256B.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
    return *reinterpret_cast<C*>(&v);
  } else if constexpr (WIDE && sizeof(C) == 1) {
    unsigned short v;
    asm volatile("ld.global.L2::256B.u8 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
    return static_cast<C>(v);
  }
#endif
  return *p;
}

// V adjacent elements of M in accesses of up to 16 bytes; both ends aligned to one access.
template <class M, int V>
struct Group {
  static constexpr int bytes = (int)sizeof(M) * V;
  static constexpr int step = bytes < 16 ? bytes : 16;
  static TJ_DEV bool aligned(const M* p) { return ((unsigned long long)p & (unsigned long long)(step - 1)) == 0; }
  template <bool WIDE>
  static TJ_DEV void load(M* dst, const M* src) {
    using C = typename Chunk<step>::type;
#pragma unroll
    for (int b = 0; b < bytes; b += step)
      *reinterpret_cast<C*>(reinterpret_cast<char*>(dst) + b) =
          ld_global<WIDE>(reinterpret_cast<const C*>(reinterpret_cast<const char*>(src) + b));
  }
  static TJ_DEV void copy(M* dst, const M* src) {
    using C = typename Chunk<step>::type;
#pragma unroll
    for (int b = 0; b < bytes; b += step)
      *reinterpret_cast<C*>(reinterpret_cast<char*>(dst) + b) = *reinterpret_cast<const C*>(reinterpret_cast<const char*>(src) + b);
  }
};

// Calls f(i, j0, pr, pc) for each group of vec adjacent columns the calling thread holds: slot
// row i, first slot column j0, at tile row r.start + coord_r(i) = pr and column pc.
template <class L, class F>
TJ_DEV void each_group(Span r, Span c, F f) {
#pragma unroll
  for (int i = 0; i < L::sr; ++i)
#pragma unroll
    for (int j0 = 0; j0 < L::sc; j0 += L::vec) f(i, j0, r.start + L::coord_r(i), c.start + L::coord_c(j0));
}

// Whether every group of vec adjacent columns the calling thread holds in a unit-stride tile is
// in range (rows and columns, where CR / CC ask) and aligned to its accesses.
template <class M, class L, bool CR, bool CC>
TJ_DEV bool all_groups_whole(const M* base, Span r, Span c) {
  bool whole = true;
  each_group<L>(r, c, [&](int, int, long long pr, long long pc) {
    whole &= (!CR || in_range(pr, r.limit)) & (!CC || (pc >= 0 && pc + L::vec <= c.limit)) &
             Group<M, L::vec>::aligned(base + pr * r.stride + pc);
  });
  return whole;
}
}  // namespace detail

// Loads the tile whose element (r, c) sits at data[offset + (r.start + r) * r.stride +
// (c.start + c) * c.stride]. CR / CC: check that r.start + r (c.start + c) lies in [0, limit);
// `ok` masks the whole tile (indices of dropped dims out of range). Masked elements read 0.
// A thread's group of vec adjacent columns moves in one access where the columns are
// contiguous (c.stride 1), aligned and in range; elsewhere element by element.
// Where every group of the thread qualifies (the usual case: a whole, aligned tile), one test
// picks a path that issues all the accesses back to back. A test per group would put a branch
// between each access and the next, and the branches' join waits for each load's data: a row
// then pays the memory latency once per group (H200, softmax bf16 [16384, 4096], 4 groups a
// thread: 2.7 TB/s).
template <class E, class L, bool CR, bool CC>
TJ_DEV Tile<typename E::reg, L> load(const void* data, long long offset, bool ok, Span r, Span c) {
  using M = typename E::mem;
  using G = detail::Group<M, L::vec>;
  constexpr bool grouped = L::vec > 1 && L::ec % L::vec == 0;
  constexpr int step = grouped ? L::vec : 1;
  const M* base = static_cast<const M*>(data) + offset;
  const bool unit = grouped && c.stride == 1;
  constexpr bool wide_rows = L::ec * (long long)sizeof(M) >= 256;   // see ld_global
  Tile<typename E::reg, L> out;
  if constexpr (grouped) {
    if (unit && ok && detail::all_groups_whole<M, L, CR, CC>(base, r, c)) {
      detail::each_group<L>(r, c, [&](int i, int j0, long long pr, long long pc) {
        alignas(16) M group[L::vec];
        G::template load<wide_rows>(group, base + pr * r.stride + pc);
#pragma unroll
        for (int v = 0; v < L::vec; ++v) out.v[L::idx(i, j0 + v)] = E::ld(&group[v]);
      });
      return out;
    }
  }
#pragma unroll
  for (int i = 0; i < L::sr; ++i) {
    const long long pr = r.start + L::coord_r(i);
    const bool okr = ok && (!CR || in_range(pr, r.limit));
#pragma unroll
    for (int j0 = 0; j0 < L::sc; j0 += step) {
      if constexpr (grouped) {
        const long long pc = c.start + L::coord_c(j0);
        const M* p = base + pr * r.stride + pc;
        if (unit && okr && (!CC || (pc >= 0 && pc + L::vec <= c.limit)) && G::aligned(p)) {
          alignas(16) M group[L::vec];
          G::template load<wide_rows>(group, p);
#pragma unroll
          for (int v = 0; v < L::vec; ++v) out.v[L::idx(i, j0 + v)] = E::ld(&group[v]);
          continue;
        }
      }
#pragma unroll
      for (int j = j0; j < j0 + step; ++j) {
        const long long pc = c.start + L::coord_c(j);
        const bool okc = okr && (!CC || in_range(pc, c.limit));
        if (!okc) {
          out.v[L::idx(i, j)] = typename E::reg(0);
          continue;
        }
        const M* p = base + pr * r.stride + pc * c.stride;
        const M m = c.stride == 1 ? detail::ld_global<wide_rows>(p) : *p;
        out.v[L::idx(i, j)] = E::ld(&m);
      }
    }
  }
  return out;
}

// Stores the tile (same addressing as load); masked elements and replicas are skipped. As in
// load, one test for the whole tile picks the path of back-to-back group accesses.
template <class E, class L, bool CR, bool CC>
TJ_DEV void store(void* data, long long offset, bool ok, Span r, Span c, const Tile<typename E::reg, L>& x) {
  using M = typename E::mem;
  using G = detail::Group<M, L::vec>;
  constexpr bool grouped = L::vec > 1 && L::ec % L::vec == 0;   // then a group is primary or not as a whole
  constexpr int step = grouped ? L::vec : 1;
  M* base = static_cast<M*>(data) + offset;
  const bool unit = grouped && c.stride == 1;
  if constexpr (grouped) {
    if (unit && ok && detail::all_groups_whole<M, L, CR, CC>(base, r, c)) {
      detail::each_group<L>(r, c, [&](int i, int j0, long long pr, long long pc) {
        if (!(L::primary_r(i) && L::primary_c(j0))) return;
        alignas(16) M group[L::vec];
#pragma unroll
        for (int v = 0; v < L::vec; ++v) E::st(&group[v], x.v[L::idx(i, j0 + v)]);
        G::copy(base + pr * r.stride + pc, group);
      });
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < L::sr; ++i) {
    const long long pr = r.start + L::coord_r(i);
    const bool okr = ok && L::primary_r(i) && (!CR || in_range(pr, r.limit));
#pragma unroll
    for (int j0 = 0; j0 < L::sc; j0 += step) {
      if constexpr (grouped) {
        const long long pc = c.start + L::coord_c(j0);
        M* p = base + pr * r.stride + pc;
        if (unit && okr && L::primary_c(j0) && (!CC || (pc >= 0 && pc + L::vec <= c.limit)) && G::aligned(p)) {
          alignas(16) M group[L::vec];
#pragma unroll
          for (int v = 0; v < L::vec; ++v) E::st(&group[v], x.v[L::idx(i, j0 + v)]);
          G::copy(p, group);
          continue;
        }
      }
#pragma unroll
      for (int j = j0; j < j0 + step; ++j) {
        const long long pc = c.start + L::coord_c(j);
        const bool okc = okr && L::primary_c(j) && (!CC || in_range(pc, c.limit));
        if (okc) E::st(base + pr * r.stride + pc * c.stride, x.v[L::idx(i, j)]);
      }
    }
  }
}

namespace detail {
// Calls put(address, element) for each of the tile's primary elements in range (and, MASKED,
// where `mask` holds), one at a time: the element-wise stores below.
template <class E, class L, bool CR, bool CC, bool MASKED, class Put>
TJ_DEV void each_stored(void* data, long long offset, bool ok, Span r, Span c, const Tile<typename E::reg, L>& x,
                        const Tile<bool, L>* mask, Put put) {
  using M = typename E::mem;
  M* base = static_cast<M*>(data) + offset;
#pragma unroll
  for (int i = 0; i < L::sr; ++i) {
    const long long pr = r.start + L::coord_r(i);
    const bool okr = ok && L::primary_r(i) && (!CR || in_range(pr, r.limit));
#pragma unroll
    for (int j = 0; j < L::sc; ++j) {
      const long long pc = c.start + L::coord_c(j);
      if (okr && L::primary_c(j) && (!CC || in_range(pc, c.limit)) && (!MASKED || mask->v[L::idx(i, j)]))
        put(base + pr * r.stride + pc * c.stride, x.v[L::idx(i, j)]);
    }
  }
}
}  // namespace detail

// The same, only where `mask` holds (store_where in the DSL), one element at a time.
template <class E, class L, bool CR, bool CC>
TJ_DEV void store_where(void* data, long long offset, bool ok, Span r, Span c, const Tile<typename E::reg, L>& x,
                        const Tile<bool, L>& mask) {
  detail::each_stored<E, L, CR, CC, true>(data, offset, ok, r, c, x, &mask,
                                          [](typename E::mem* p, typename E::reg v) { E::st(p, v); });
}

// atomic_add in the DSL: each element of the tile (where `mask` holds, with a mask) added to memory
// by one atomic (E::add: f32, i32, i64), replicas skipped, so that every element is added once.
template <class E, class L, bool CR, bool CC>
TJ_DEV void store_add(void* data, long long offset, bool ok, Span r, Span c, const Tile<typename E::reg, L>& x) {
  detail::each_stored<E, L, CR, CC, false>(data, offset, ok, r, c, x, nullptr,
                                           [](typename E::mem* p, typename E::reg v) { E::add(p, v); });
}
template <class E, class L, bool CR, bool CC>
TJ_DEV void store_add_where(void* data, long long offset, bool ok, Span r, Span c, const Tile<typename E::reg, L>& x,
                            const Tile<bool, L>& mask) {
  detail::each_stored<E, L, CR, CC, true>(data, offset, ok, r, c, x, &mask,
                                          [](typename E::mem* p, typename E::reg v) { E::add(p, v); });
}

template <class E>
TJ_DEV typename E::reg load_scalar(const void* data, long long offset, bool ok) {
  return ok ? E::ld(static_cast<const typename E::mem*>(data) + offset) : typename E::reg(0);
}
template <class E>
TJ_DEV void store_scalar(void* data, long long offset, bool ok, typename E::reg x) {
  if (ok && program_tid() == 0) E::st(static_cast<typename E::mem*>(data) + offset, x);
}
template <class E>
TJ_DEV void store_add_scalar(void* data, long long offset, bool ok, typename E::reg x) {
  if (ok && program_tid() == 0) E::add(static_cast<typename E::mem*>(data) + offset, x);
}

// One element at computed indices (gathers): 0 when any index is outside its dimension.
template <class E, int R, class... I>
TJ_DEV typename E::reg gather_at(const TensorArg<R>& t, I... idx) {
  static_assert(sizeof...(I) == R, "one index per dimension");
  const long long ix[R] = {(long long)idx...};
  long long offset = 0;
  bool ok = true;
#pragma unroll
  for (int d = 0; d < R; ++d) {
    ok = ok && ix[d] >= 0 && ix[d] < t.shape[d];
    offset += ix[d] * t.stride[d];
  }
  return load_scalar<E>(t.data, offset, ok);
}

// ---------------------------------------------------------------- elementwise
template <class L, class T>
TJ_DEV const T& at(const Tile<T, L>& t, int i) { return t.v[i]; }
template <class L, class S>
TJ_DEV S at(S s, int) { return s; }   // a scalar operand: the same in every slot

// out[i] = f(x[i]...) over the slots of layout L; scalar operands are passed through.
template <class L, class F, class... X>
TJ_DEV auto map(F f, const X&... x) {
  using R = decltype(f(at<L>(x, 0)...));
  Tile<R, L> out;
#pragma unroll
  for (int i = 0; i < L::slots; ++i) out.v[i] = f(at<L>(x, i)...);
  return out;
}

// t * s elementwise, each product rounded on its own (mul.rn: never fused into an FMA, and never
// merged with the kernel's own x * s, which then stays free to fuse into its one other use).
// For a reduction's result scaled back: max(x * s) = s * max(x) for s > 0.
template <class T, class L>
TJ_DEV Tile<T, L> times(const Tile<T, L>& t, float s) {
  Tile<T, L> r;
#pragma unroll
  for (int i = 0; i < L::slots; ++i) {
#if defined(__CUDA_ARCH__)
    r.v[i] = __fmul_rn(t.v[i], s);
#else
    r.v[i] = t.v[i] * s;
#endif
  }
  return r;
}
// s > 0 and finite: then max(x * s) == max(x) * s (and the min's likewise); NaN fails.
TJ_DEV bool finite_positive(float s) { return s > 0.0f && s <= 3.40282347e38f; }

// a / b elementwise, bit for bit the `/` of CUDA C (IEEE division, round to nearest even), with no
// branch per element: CUDA's own fast sequence (the divisor's reciprocal refined by one FMA step,
// the quotient, one correction) where every a and b of the tile lies in [2^-60, 2^60] in
// magnitude -- well inside the range where CUDA's operand check (FCHK) takes that sequence, which
// is exact there -- and element by element for the whole tile otherwise (zeros, tiny or huge
// values, infinities, NaN). A divisor that repeats across the tile (a broadcast row vector: a
// softmax's or attention's row sums) has its reciprocal computed once per distinct register.
TJ_DEV bool divide_fast_ok(float x) { return (fabsf(x) >= 0x1p-60f) & (fabsf(x) <= 0x1p60f); }   // false for NaN
template <class L>
TJ_DEV Tile<float, L> divide(const Tile<float, L>& a, const Tile<float, L>& b) {
  Tile<float, L> q;
#if defined(__CUDA_ARCH__)
  // The check first: the quotients then take the registers of the operands they replace.
  bool ok = true;
#pragma unroll
  for (int i = 0; i < L::slots; ++i) ok = ok & divide_fast_ok(a.v[i]) & divide_fast_ok(b.v[i]);
  if (ok) {
#pragma unroll
    for (int i = 0; i < L::slots; ++i) {
      const float d = b.v[i];
      float y;
      asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(d));
      y = __fmaf_rn(y, __fmaf_rn(-d, y, 1.0f), y);
      const float q0 = __fmul_rn(a.v[i], y);
      q.v[i] = __fmaf_rn(y, __fmaf_rn(-d, q0, a.v[i]), q0);
    }
    return q;
  }
#endif
#pragma unroll
  for (int i = 0; i < L::slots; ++i) q.v[i] = a.v[i] / b.v[i];
  return q;
}

// Whether any thread of the calling warp holds an element of t other than 1 (warp-uniform): a
// product by t where it holds only ones is a copy (x * 1 == x for every x, NaN and infinities
// included), which the warp skips.
template <class L>
TJ_DEV bool any_not_one(const Tile<float, L>& t) {
  bool not_one = false;
#pragma unroll
  for (int i = 0; i < L::slots; ++i) not_one |= t.v[i] != 1.0f;
  return __any_sync(0xffffffffu, not_one);
}

// ---------------------------------------------------------------- data movement
// Broadcast without data exchange: along axes where the source has extent 1 (the source is
// on the destination's thread arrangement, or is a single replicated element).
template <class LD, class T, class LS>
TJ_DEV Tile<T, LD> broadcast(const Tile<T, LS>& x) {
  static_assert((LS::er == 1 && LS::ec == 1) ||
                    (same_type<typename LS::arr, typename LD::arr>::value && (LS::er == 1 || LS::er == LD::er) &&
                     (LS::ec == 1 || LS::ec == LD::ec)),
                "broadcast: the source is not on the destination's thread arrangement");
  Tile<T, LD> out;
#pragma unroll
  for (int i = 0; i < LD::sr; ++i)
#pragma unroll
    for (int j = 0; j < LD::sc; ++j)
      out.v[LD::idx(i, j)] = x.v[LS::idx(LS::er == 1 ? 0 : i, LS::ec == 1 ? 0 : j)];
  return out;
}

// Data exchange through shared memory: the source's primary elements are written to
// smem[r * SR + c * SC] (their coordinates), then each destination slot reads
// smem[r * DR + c * DC]. With suitable strides this converts between layouts, or transposes.
template <class LD, int DR, int DC, int SR, int SC, class T, class LS>
TJ_DEV Tile<T, LD> exchange(const Tile<T, LS>& x, void* smem) {
  T* s = static_cast<T*>(smem);
  sync_threads();
#pragma unroll
  for (int i = 0; i < LS::sr; ++i)
#pragma unroll
    for (int j = 0; j < LS::sc; ++j)
      if (LS::primary_r(i) && LS::primary_c(j)) s[LS::coord_r(i) * SR + LS::coord_c(j) * SC] = x.v[LS::idx(i, j)];
  sync_threads();
  Tile<T, LD> out;
#pragma unroll
  for (int i = 0; i < LD::sr; ++i)
#pragma unroll
    for (int j = 0; j < LD::sc; ++j) out.v[LD::idx(i, j)] = s[LD::coord_r(i) * DR + LD::coord_c(j) * DC];
  return out;
}

// [R, C] -> [C, R] through shared memory (row pitch P of the staged source).
template <class LD, int P, class T, class LS>
TJ_DEV Tile<T, LD> transpose(const Tile<T, LS>& x, void* smem) {
  return exchange<LD, 1, P, P, 1>(x, smem);
}

// ---------------------------------------------------------------- reductions
template <class T> TJ_DEV T lowest();
template <> TJ_DEV float lowest<float>() { return -inf(); }
template <> TJ_DEV int lowest<int>() { return (int)0x80000000u; }
template <> TJ_DEV long long lowest<long long>() { return (long long)0x8000000000000000ull; }
template <class T> TJ_DEV T highest();
template <> TJ_DEV float highest<float>() { return inf(); }
template <> TJ_DEV int highest<int>() { return 0x7fffffff; }
template <> TJ_DEV long long highest<long long>() { return 0x7fffffffffffffffll; }

// Each op reduces in the register type T: f32 for floating-point tiles; for integer tiles the
// dtype itself, sums wrapping around as two's complement (added as unsigned: no overflow UB).
struct op_sum {
  template <class T> static TJ_DEV T identity() { return T(0); }
  static TJ_DEV float f(float a, float b) { return a + b; }
  static TJ_DEV int f(int a, int b) { return (int)((unsigned)a + (unsigned)b); }
  static TJ_DEV long long f(long long a, long long b) {
    return (long long)((unsigned long long)a + (unsigned long long)b);
  }
};
struct op_max {
  template <class T> static TJ_DEV T identity() { return lowest<T>(); }
  static TJ_DEV float f(float a, float b) { return fmaxf(a, b); }
  template <class T> static TJ_DEV T f(T a, T b) { return a > b ? a : b; }
};
struct op_min {
  template <class T> static TJ_DEV T identity() { return highest<T>(); }
  static TJ_DEV float f(float a, float b) { return fminf(a, b); }
  template <class T> static TJ_DEV T f(T a, T b) { return a < b ? a : b; }
};

// Reduces along AXIS (0: thread rows, 1: thread columns) in the register type T: own slots, then a butterfly
// over the lanes of that axis, then (when warps lie along the axis) across warps through
// shared memory. With MASKED, position p along the axis takes part only if vb + p < ve.
// The result is replicated over the reduced axis; E rounds it to the dtype.
template <class Op, int AXIS, class E, bool MASKED, class L, class T>
TJ_DEV Tile<T, reduced_t<L, AXIS>> reduce(const Tile<T, L>& x, long long vb, long long ve, void* smem) {
  using A = typename L::arr;
  using LO = reduced_t<L, AXIS>;
  Tile<T, LO> out;
  if constexpr (AXIS == 1) {
#pragma unroll
    for (int i = 0; i < L::sr; ++i) {
      T acc = Op::template identity<T>();
#pragma unroll
      for (int j = 0; j < L::sc; ++j)
        if (L::primary_c(j) && (!MASKED || vb + L::coord_c(j) < ve)) acc = Op::f(acc, x.v[L::idx(i, j)]);
#pragma unroll
      for (int off = A::lanes_c / 2; off > 0; off >>= 1) acc = Op::f(acc, __shfl_xor_sync(0xffffffffu, acc, off));
      out.v[i] = acc;
    }
    if constexpr (A::warps_c > 1) {
      T* s = static_cast<T*>(smem);
      sync_threads();
      if (A::lane() % A::lanes_c == 0)
#pragma unroll
        for (int i = 0; i < L::sr; ++i) s[L::raw_r(i) * A::warps_c + A::warp() % A::warps_c] = out.v[i];
      sync_threads();
#pragma unroll
      for (int i = 0; i < L::sr; ++i) {
        T acc = Op::template identity<T>();
        for (int w = 0; w < A::warps_c; ++w) acc = Op::f(acc, s[L::raw_r(i) * A::warps_c + w]);
        out.v[i] = acc;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < L::sc; ++j) {
      T acc = Op::template identity<T>();
#pragma unroll
      for (int i = 0; i < L::sr; ++i)
        if (L::primary_r(i) && (!MASKED || vb + L::coord_r(i) < ve)) acc = Op::f(acc, x.v[L::idx(i, j)]);
#pragma unroll
      for (int off = A::lanes_r / 2; off > 0; off >>= 1)
        acc = Op::f(acc, __shfl_xor_sync(0xffffffffu, acc, off * A::lanes_c));
      out.v[j] = acc;
    }
    if constexpr (A::warps_r > 1) {
      T* s = static_cast<T*>(smem);
      sync_threads();
      if (A::lane() / A::lanes_c == 0)
#pragma unroll
        for (int j = 0; j < L::sc; ++j) s[L::raw_c(j) * A::warps_r + A::warp() / A::warps_c] = out.v[j];
      sync_threads();
#pragma unroll
      for (int j = 0; j < L::sc; ++j) {
        T acc = Op::template identity<T>();
        for (int w = 0; w < A::warps_r; ++w) acc = Op::f(acc, s[L::raw_c(j) * A::warps_r + w]);
        out.v[j] = acc;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < LO::slots; ++i) out.v[i] = E::rnd(out.v[i]);
  return out;
}

// ---------------------------------------------------------------- dot (SIMT)
namespace detail {
// Writes x's primary elements (r, c) to s[r * SR + c * SC]; with KMASK, elements whose k
// position (coordinate along KAXIS) satisfies kb + k >= ke are written as 0.
template <int SR, int SC, int KAXIS, bool KMASK, class L>
TJ_DEV void stage(const Tile<float, L>& x, float* s, long long kb, long long ke) {
#pragma unroll
  for (int i = 0; i < L::sr; ++i)
#pragma unroll
    for (int j = 0; j < L::sc; ++j) {
      if (!(L::primary_r(i) && L::primary_c(j))) continue;
      const int r = L::coord_r(i), c = L::coord_c(j);
      const bool keep = !KMASK || kb + (KAXIS == 0 ? r : c) < ke;
      s[r * SR + c * SC] = keep ? x.v[L::idx(i, j)] : 0.0f;
    }
}
}  // namespace detail

// Shared memory that dot<LO, TA, TB, ...> needs, in bytes.
template <long long M, long long N, long long K>
struct DotSmem {
  static constexpr int pa = (int)(K | 1);   // odd row pitch: the rows of A fall on different banks
  static constexpr int pb = (int)N;
  static constexpr long long bytes = (M * pa + K * pb) * 4;
};

// out[M, N] = acc + a[M, K] · b[K, N] in f32, k ascending (each step one fused multiply-add,
// which dsl/SEMANTICS.md allows). Both operands are staged in
// shared memory as f32; each thread then computes its own output slots (an outer product per
// k). TA: `a` is the [K, M] source of a transposed operand (likewise TB: `b` is [N, K]), so a
// transpose feeding a dot costs no extra exchange. With KMASK, k positions with kb + k >= ke
// contribute nothing.
template <class LO, bool TA, bool TB, bool KMASK, class LA, class LB>
TJ_DEV Tile<float, LO> dot(const Tile<float, LA>& a, const Tile<float, LB>& b, const Tile<float, LO>& acc, long long kb,
                           long long ke, void* smem) {
  constexpr long long M = LO::er, N = LO::ec, K = TA ? LA::er : LA::ec;
  static_assert((TA ? LA::ec : LA::er) == M, "dot: rows of a");
  static_assert((TB ? LB::er : LB::ec) == N, "dot: columns of b");
  static_assert((TB ? LB::ec : LB::er) == K, "dot: inner dimensions");
  using S = DotSmem<M, N, K>;
  float* sa = static_cast<float*>(smem);
  float* sb = sa + M * S::pa;
  sync_threads();
  detail::stage<TA ? 1 : S::pa, TA ? S::pa : 1, TA ? 0 : 1, KMASK>(a, sa, kb, ke);
  detail::stage<TB ? 1 : S::pb, TB ? S::pb : 1, TB ? 1 : 0, KMASK>(b, sb, kb, ke);
  sync_threads();
  Tile<float, LO> out = acc;
  int ra[LO::sr], cb[LO::sc];
#pragma unroll
  for (int i = 0; i < LO::sr; ++i) ra[i] = LO::coord_r(i) * S::pa;
#pragma unroll
  for (int j = 0; j < LO::sc; ++j) cb[j] = LO::coord_c(j);
#pragma unroll 4
  for (int k = 0; k < (int)K; ++k) {
    float av[LO::sr], bv[LO::sc];
#pragma unroll
    for (int i = 0; i < LO::sr; ++i) av[i] = sa[ra[i] + k];
#pragma unroll
    for (int j = 0; j < LO::sc; ++j) bv[j] = sb[k * S::pb + cb[j]];
#pragma unroll
    for (int i = 0; i < LO::sr; ++i)
#pragma unroll
      for (int j = 0; j < LO::sc; ++j) out.v[LO::idx(i, j)] = fmaf(av[i], bv[j], out.v[LO::idx(i, j)]);
  }
  return out;
}

template <class LO, bool TA, bool TB, bool KMASK, class LA, class LB>
TJ_DEV Tile<float, LO> dot(const Tile<float, LA>& a, const Tile<float, LB>& b, long long kb, long long ke, void* smem) {
  return dot<LO, TA, TB, KMASK>(a, b, full<LO>(0.0f), kb, ke, smem);
}

}  // namespace dev
}  // namespace tj
