#pragma once
// tilejit device library: the wgmma (sm_90a) building blocks of the generic tensor-core lowering
// (codegen/mma_plan.h decides which dots use them; codegen/emit_mma.cpp calls them). The tiles
// they work on (MmaArr, Mma, SmemOperand, stage_operand, tile_to_a_frag) are mma_layout.cuh's.
//
//   smem_desc<O>      the wgmma descriptor of a piece of an operand tile in shared memory.
//   Ring<S>           the barriers of a ring of S shared-memory slots that TMA fills and warps
//                     release.
//   wgmma_ss / wgmma_rs  a warpgroup's share of acc += A . B on sm_90a, A from shared memory or
//                     from registers (tile_to_a_frag makes its fragments); fence_tile keeps the
//                     compiler off an in-flight accumulator.
//   zero_k_tail       zeroes the positions of a staged tile past a dot's k range.
//   transpose_8bit    an fp8 tile copied from the MN-major layout TMA wrote into the K-major one
//                     wgmma reads (the producer warpgroup's transposed copies).
//   Turns<G>          G consumer warpgroups take turns issuing their wgmmas (named barriers), so
//                     that one's elementwise work runs while the tensor cores take another's dots.
#include "mma_layout.cuh"
#include "hopper.cuh"

namespace tj {
namespace dev {

// ---------------------------------------------------------------- descriptors
// The wgmma descriptor of the piece of operand tile O (SmemOperand) at shared address `base` that
// starts at M/N index mn0 (a multiple of 8; MN-major: of SW / element bytes) and byte kb0 of K
// (a multiple of 32; MN-major: the piece starts at K row kb0 / element bytes, a multiple of 8).
template <class O>
TJ_DEV constexpr int desc_offset(int mn0, int kb0) {
  constexpr int R = O::rows, SW = O::swizzle, ES = O::elem_bytes;
  if constexpr (!O::mn_major) return (kb0 / SW) * R * SW + mn0 * SW + kb0 % SW;
  else return ((mn0 * ES) / SW) * R * SW + (kb0 / ES) * SW;
}
template <class O>
TJ_DEV unsigned long long smem_desc(unsigned base, int mn0, int kb0) {
  constexpr int R = O::rows, SW = O::swizzle, mode = O::mode;
  const unsigned a = base + (unsigned)desc_offset<O>(mn0, kb0);
  if constexpr (!O::mn_major) return make_smem_desc(a, mode, 16u, 8u * SW);
  else return make_smem_desc(a, mode, (unsigned)(R * SW), 8u * SW);
}
// The descriptor of the piece at (mn0 + dmn, kb0 + dkb) from that of the piece at (mn0, kb0):
// the start address moves by the pieces' byte distance (shared addresses stay below 2^18, so the
// 14-bit address field never carries). dmn a multiple of 64 rows, dkb of 32 bytes: the distance
// is a compile-time constant where they are.
template <class O>
TJ_DEV unsigned long long desc_step(unsigned long long d, int dmn, int dkb) {
  static_assert(!O::mn_major || (64 * O::elem_bytes) % O::swizzle == 0, "MN-major pieces start at whole swizzle atoms");
  return desc_advance(d, (unsigned)desc_offset<O>(dmn, dkb));
}

#if TJ_SM90_ENABLED
// ---------------------------------------------------------------- TMA rings
// The barriers of S slots that a producer fills (TMA) and consumer warps release: full[s] takes
// one producer arrival plus the bytes; empty[s] one arrival per consumer warp. Fill n (counted
// from 0 over the kernel's life) goes to slot n % S.
template <int S>
struct Ring {
  unsigned long long* bar;   // full[0..S), then empty[0..S)
  TJ_DEV unsigned long long* full(unsigned n) const { return bar + n % S; }
  TJ_DEV unsigned long long* empty(unsigned n) const { return bar + S + n % S; }
  // One thread, before the block's first use (then fence_mbarrier_init and a block barrier).
  // fill_warps: arrivals that complete a fill (1: the TMA thread's, with the bytes; a ring the
  // threads fill takes one per filling warp).
  TJ_DEV void init(unsigned consumer_warps, unsigned fill_warps = 1) const {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mbar_init(bar + s, fill_warps);
      mbar_init(bar + S + s, consumer_warps);
    }
  }
  // Producer: wait until fill n - S has been released, then expect `bytes` on fill n.
  TJ_DEV void acquire(unsigned n, unsigned bytes) const {
    if (n >= (unsigned)S) mbar_wait_sleep(empty(n), ((n / S) - 1) & 1);
    mbar_arrive_expect_tx(full(n), bytes);
  }
  // Filling warps (threads, not TMA): wait until fill n - S has been released ...
  TJ_DEV void acquire_slot(unsigned n) const {
    if (n >= (unsigned)S) mbar_wait(empty(n), ((n / S) - 1) & 1);
  }
  // ... and, every thread of each filling warp once its writes are made visible to the tensor
  // cores (fence_proxy_async_shared), complete their part of fill n.
  TJ_DEV void filled(unsigned n) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(full(n));
  }
  // Consumers: wait until fill n has landed.
  TJ_DEV void wait(unsigned n) const { mbar_wait(full(n), (n / S) & 1); }
  // Every thread of each consumer warp, once no thread of the warp reads fill n any more.
  TJ_DEV void release(unsigned n) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(empty(n));
  }
};
#endif

// ---------------------------------------------------------------- transposed copies
// Copies a tile of 8-bit elements from the MN-major layout Src (rows K, bytes M or N: a TMA fill
// of memory that holds the operand that way) into the K-major layout Dst (rows M or N, bytes K)
// that wgmma's fp8 operands need. Threads tid = 0 .. nthreads - 1 (whole warps) share the work in
// blocks of 4 x 4 bytes: four 4-byte rows in, four 4-byte rows out, bytes moved by prmt. On square
// 128 x 128-byte tiles (128-byte swizzle both ways) lane l of a warp takes block (rows 4 (l ^ t),
// bytes 4 l) of the source in its turn t, so that neither the loads nor the stores of a warp share
// a bank, and its addresses cost a few integer ops per block (ncu, H200: the general form's
// address arithmetic was most of the copy's ~66 instructions a block).
// KeyOrder: Dst's K position p holds Src row 32 (p / 32) + fp8_kperm_col(p % 32) (frag.cuh), for
// A fragments packed without shuffles (acc_to_a_fp8_kperm). On sm_90 with whole 16-row x 32-byte
// pieces that order lets ldmatrix.trans / stmatrix move 512 bytes a warp instruction pair (the
// producer warps' issue slots are the consumers' too: the 4 x 4 blocks took ~2.5x the
// instructions).
template <class Src, class Dst, bool KeyOrder = false>
TJ_DEV void transpose_8bit(const unsigned char* src, unsigned char* dst, int tid, int nthreads) {
  static_assert(Src::elem_bytes == 1 && Dst::elem_bytes == 1, "8-bit elements");
  static_assert(Src::rows == Dst::row_bytes && Src::row_bytes == Dst::rows, "Dst is Src transposed");
  static_assert(Src::rows % 4 == 0 && Src::row_bytes % 4 == 0, "whole 4 x 4 blocks");
  constexpr int NB = Src::row_bytes / 4, NR = Src::rows / 4, blocks = NB * NR;
  // Source rows of Dst's K positions 4 rb .. 4 rb + 3 (in key order: rows r, r + 1, r + 8, r + 9).
  auto row_of = [](int rb, int i) {
    return KeyOrder ? (4 * rb & ~31) + fp8_kperm_col(4 * rb & 31) + (i & 1) + 8 * (i >> 1) : 4 * rb + i;
  };
  auto block = [&](int rb, unsigned (&w)[4], unsigned (&o)[4]) {
    unsigned t0, t1, t2, t3;
    asm("prmt.b32 %0, %1, %2, 0x5140;" : "=r"(t0) : "r"(w[0]), "r"(w[1]));
    asm("prmt.b32 %0, %1, %2, 0x5140;" : "=r"(t1) : "r"(w[2]), "r"(w[3]));
    asm("prmt.b32 %0, %1, %2, 0x7362;" : "=r"(t2) : "r"(w[0]), "r"(w[1]));
    asm("prmt.b32 %0, %1, %2, 0x7362;" : "=r"(t3) : "r"(w[2]), "r"(w[3]));
    asm("prmt.b32 %0, %1, %2, 0x5410;" : "=r"(o[0]) : "r"(t0), "r"(t1));
    asm("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(o[1]) : "r"(t0), "r"(t1));
    asm("prmt.b32 %0, %1, %2, 0x5410;" : "=r"(o[2]) : "r"(t2), "r"(t3));
    asm("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(o[3]) : "r"(t2), "r"(t3));
  };
#if TJ_SM90_ENABLED
  if constexpr (KeyOrder && Src::rows % 16 == 0 && Src::row_bytes % 32 == 0) {
    // 16 keys x 32 bytes a warp instruction pair (FlashAttention-3's V transpose): ldmatrix.trans
    // gives lane l (g = l / 4, q = l % 4) keys {2q, 2q + 1} (matrices 0, 2) and {8 + 2q, 9 + 2q}
    // (1, 3) at bytes {2g, 2g + 1} of each 16-byte chunk; those four keys are exactly Dst's K
    // positions 4q .. 4q + 3 in fp8_kperm_col's order, so one prmt a row makes the stmatrix rows
    // 2g and 2g + 1. Matrix rows alternate between the two (row g of matrices 0 / 2 is Dst row 2g
    // for g < 4, 2g + 1 after; 1 / 3 the other), so that each matrix's eight rows take eight
    // distinct swizzle chunks: neither instruction shares a bank within a matrix.
    constexpr int KB = Src::rows / 16, jobs = KB * (Src::row_bytes / 32);
    const int lane = tid & 31, i = lane >> 3, r = lane & 7;
    const unsigned sel0 = lane < 16 ? 0x6420u : 0x7531u, sel1 = sel0 ^ (0x6420u ^ 0x7531u);
    const unsigned s = smem_u32(src), d = smem_u32(dst);
    const int drow = 16 * (i >> 1) + 2 * r + (((r >> 2) ^ i) & 1);   // Dst row of this lane's stmatrix address
    for (int j = tid >> 5; j < jobs; j += nthreads >> 5) {
      const int kb = j % KB, db = j / KB;   // 16 keys, 32 bytes
      unsigned x[4], y[4];
      ldmatrix_x4_trans(x, s + Src::offset(16 * kb + 8 * (i & 1) + r, 32 * db + 16 * (i >> 1)));
      y[0] = byte_perm(x[0], x[1], sel0);
      y[1] = byte_perm(x[0], x[1], sel1);
      y[2] = byte_perm(x[2], x[3], sel0);
      y[3] = byte_perm(x[2], x[3], sel1);
      stmatrix_x4(d + Dst::offset(32 * db + drow, 16 * kb), y);
    }
    return;
  }
#endif
  if constexpr (NB == 32 && NR == 32 && Src::swizzle == 128 && Dst::swizzle == 128) {
    // 128 x 128 bytes, one 128-byte swizzle atom wide both ways: byte b of row r is at r * 128 +
    // (b ^ ((r & 7) << 4)). Lane l keeps source bytes 4 l (Dst rows 4 l .. 4 l + 3, whose offsets it
    // computes once) and takes source rows 4 (l ^ t) in turn t.
    const int lane = tid & 31, c4 = 4 * lane;
    unsigned dbase[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) dbase[j] = (unsigned)(c4 + j) * 128u;
    for (int t = tid >> 5; t < 32; t += nthreads >> 5) {
      const int rb = lane ^ t;
      unsigned w[4], o[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = row_of(rb, i);
        w[i] = *reinterpret_cast<const unsigned*>(src + r * 128 + (c4 ^ ((r & 7) << 4)));
      }
      block(rb, w, o);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        *reinterpret_cast<unsigned*>(dst + dbase[j] + ((4 * rb) ^ (((c4 + j) & 7) << 4))) = o[j];
    }
    return;
  }
  for (int b = tid; b < blocks; b += nthreads) {
    const int cb = b % NB, rb = b / NB;   // source byte block (M or N), row block (K)
    unsigned w[4], o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = *reinterpret_cast<const unsigned*>(src + Src::offset(row_of(rb, i), 4 * cb));
    block(rb, w, o);
#pragma unroll
    for (int j = 0; j < 4; ++j) *reinterpret_cast<unsigned*>(dst + Dst::offset(4 * cb + j, 4 * rb)) = o[j];
  }
}

#if TJ_SM90A_ENABLED
// ---------------------------------------------------------------- wgmma
// Warp-uniform index of this thread's warpgroup among its program's (tile.cuh: program_tid).
TJ_DEV int program_warpgroup() { return __shfl_sync(0xffffffffu, program_tid() / 128, 0); }

// The calling warpgroup's share of acc += A [M x K] . B [K x N], where acc holds the registers
// of an Mma<MmaArr<4 * G, 1>, M, N> tile (RB = M / (64 * G) row blocks per warpgroup; warpgroup
// g's block b is rows 64 * (g + G * b) ..) and both operands are SmemOperands in shared memory
// (OA: rows M, OB: rows N) at a_base / b_base; KS k steps of 32 bytes; wgmma instructions of NC
// columns. accumulate = 0 overwrites acc with A . B. Issues only: wgmma_fence before, commit and
// wait after are the caller's. g: program_warpgroup(), taken once per kernel (a shuffle in the
// loop is not hoisted, and the A descriptor then is remade from it at every dot).
template <int G, int RB, int N, int NC, int KS, int TA, int TB, class OA, class OB>
TJ_DEV void wgmma_ss(float* acc, unsigned a_base, unsigned b_base, int accumulate, int g) {
  // Two descriptors, then constant steps (make_smem_desc per instruction cost ~9 uniform ops each).
  const unsigned long long da = smem_desc<OA>(a_base, 64 * g, 0), db = smem_desc<OB>(b_base, 0, 0);
#pragma unroll
  for (int s = 0; s < KS; ++s)
#pragma unroll
    for (int b = 0; b < RB; ++b)
#pragma unroll
      for (int c = 0; c < N / NC; ++c)
        mma_async_ss<NC, TA, TB, 1, 1, OA::mn_major ? 1 : 0, OB::mn_major ? 1 : 0>(
            acc + b * (N / 2) + c * (NC / 2), desc_step<OA>(da, 64 * G * b, 32 * s), desc_step<OB>(db, NC * c, 32 * s),
            (accumulate || s > 0) ? 1 : 0);
}

// The same with A from registers: a[RB][KS][4], the A fragments of this thread (acc_to_a_*).
template <int RB, int N, int NC, int KS, int TA, int TB, class OB>
TJ_DEV void wgmma_rs(float* acc, const unsigned* a, unsigned b_base, int accumulate) {
  const unsigned long long db = smem_desc<OB>(b_base, 0, 0);
#pragma unroll
  for (int s = 0; s < KS; ++s)
#pragma unroll
    for (int b = 0; b < RB; ++b)
#pragma unroll
      for (int c = 0; c < N / NC; ++c)
        mma_async_rs<NC, TA, TB, 1, 1, OB::mn_major ? 1 : 0>(acc + b * (N / 2) + c * (NC / 2), a + (b * KS + s) * 4,
                                                               desc_step<OB>(db, NC * c, 32 * s), (accumulate || s > 0) ? 1 : 0);
}

// Turn-taking of the G warpgroups that hold the tiles (FA3's inter-warpgroup schedule): warpgroup
// g takes its turn on named barrier kFirst + g (it syncs there, the previous warpgroup arrives)
// and passes it to warpgroup (g + 1) % G. Per run of a loop: the last warpgroup pre-arrives for
// warpgroup 0 (start), and skips its final pass, so that every barrier's arrivals and syncs pair
// up and the next run starts clean. Barrier 1 is sync_threads'; kFirst.. are these.
template <int G>
struct Turns {
  static constexpr int kFirst = 2;
  static_assert(G >= 2 && kFirst + G <= 16, "2 to 14 warpgroups take turns");
  TJ_DEV static int me() { return warpgroup_idx(); }
  TJ_DEV static void start() {
    if (me() == G - 1) asm volatile("bar.arrive %0, 256;" ::"r"(kFirst) : "memory");
  }
  TJ_DEV static void take() { asm volatile("bar.sync %0, 256;" ::"r"(kFirst + me()) : "memory"); }
  // last: this is the run's final pass (the last warpgroup skips it).
  TJ_DEV static void pass(bool last) {
    if (!(last && me() == G - 1)) asm volatile("bar.arrive %0, 256;" ::"r"(kFirst + (me() + 1) % G) : "memory");
  }
};

// Keeps the compiler from moving reads or writes of an in-flight accumulator across the wgmma
// issue and wait (every register of the tile).
template <class T, class L>
TJ_DEV void fence_tile(Tile<T, L>& t) {
#pragma unroll
  for (int i = 0; i < L::slots; ++i) fence_operand(t.v[i]);
}
// Keeps the computation of f32 tiles above the next wgmma wait in the SASS. Ordering the PTX is
// not enough (an empty volatile asm emits no instruction): ptxas schedules arithmetic across
// `wgmma.wait_group` and placed the wait before a softmax's exp2s, so the dot in flight no longer
// overlapped them; it keeps a shared-memory store above the wait. Lane 0 of each warp stores a
// word that depends on every register of the tiles into the warp's own word of `words` (4 bytes
// per warp of the block, never read).
template <class L>
TJ_DEV unsigned or_bits(const Tile<float, L>& t) {
  unsigned b = 0u;
#pragma unroll
  for (int i = 0; i < L::slots; ++i) b |= __float_as_uint(t.v[i]);
  return b;
}
template <class... Tiles>
TJ_DEV void pin_above_wait(unsigned char* words, const Tiles&... t) {
  const unsigned b = (or_bits(t) | ...);
  if ((threadIdx.x & 31u) == 0u)
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(smem_u32(words) + 4u * (threadIdx.x >> 5)), "r"(b) : "memory");
}
// The same for register A fragments an in-flight wgmma reads.
template <int R>
TJ_DEV void fence_frags(unsigned (&a)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) fence_operand(a[i]);
}
#endif

// Zeroes the K positions from `from` on of a staged operand tile (a tile that runs past its
// dot's k range): K-major, the bytes of every row from position `from`; MN-major, the rows from
// `from`. The NTHREADS threads that hold tiles call it.
// KeyOrder (K-major fp8 in acc_to_a_fp8_kperm's order): position p holds K index
// 32 (p / 32) + fp8_kperm_col(p % 32).
template <class O, bool MN, int NTHREADS, bool KeyOrder = false>
TJ_DEV void zero_k_tail(unsigned tile, int from) {
  constexpr int R = O::rows, KB = O::row_bytes;
  constexpr int nthreads = NTHREADS;
  if (from < 0) from = 0;
  const int first = MN ? from * KB : from * O::elem_bytes;   // MN: first byte of row `from`
  for (int b = program_tid(); b < R * KB; b += nthreads) {
    const int r = b / KB, c = b % KB;
    const bool zero = MN ? r * KB + c >= first : (KeyOrder ? (c & ~31) + fp8_kperm_col(c & 31) : c) >= first;
    if (zero) asm volatile("st.shared.u8 [%0], %1;" ::"r"(tile + O::offset(r, c)), "r"(0u) : "memory");
  }
}

}  // namespace dev
}  // namespace tj
