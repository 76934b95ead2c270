#pragma once
// tilejit device library: the mma.sync building blocks of the generic tensor-core lowering, for
// GPUs without wgmma (sm_80, sm_89; fp8 from sm_89) and sm_90 without its 'a' features
// (codegen/mma_plan.h decides which dots use them; codegen/emit_mma.cpp calls them). The tiles
// they work on (MmaArr, Mma, SmemOperand, stage_operand, tile_to_a_frag) are mma_layout.cuh's.
//
//   ldmatrix<C, T>    C (1, 2, 4) 8x8 matrices of 16-byte rows from shared memory; lanes
//                     8i..8i+7 give the row addresses of matrix i, which lands in register i
//                     (lane l: row l / 4, bytes 4 (l % 4) .. +3; T: transposed, 16-bit
//                     elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4)). For fp8 a row is
//                     16 elements: the fragment layouts of m16n8k32 take the same bytes.
//   copy_operand      a 2-D slice of a tensor into an operand tile (cp.async, 16-byte chunks;
//                     optionally its rows by parity);
//                     cp_async_commit / cp_async_wait<N> / cp_async_wait_all; zero_k_tail
//                     zeroes a tile's positions past a k range.
//   mma_m16n8<TA, TB> d (the m16n8 C fragment, 4 f32) += a (m16 x 32 bytes of K) . b (32 bytes
//                     of K x n8): m16n8k16 for bf16 / f16, m16n8k32 for e4m3 / e5m2.
//   mma_sync_ss / mma_sync_rs  a warp's share of acc += A . B, A from shared memory (warps on
//                     a 2-D grid of rows and columns) or from registers (tile_to_a_frag; warps
//                     on rows only), B from shared memory; K-major tiles through ldmatrix,
//                     MN-major ones (16-bit) through ldmatrix.trans.
//
// On the host (tests/test_codegen_emulated.cpp, where __CUDA_ARCH__ is not defined and the
// threads of a block are std::threads) the warp collectives call tj_host_ldmatrix and
// tj_host_mma_m16n8, which the host build supplies; cp.async is a copy.
#include "mma_layout.cuh"

#if !defined(__CUDA_ARCH__) && !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
void tj_host_ldmatrix(unsigned* r, int count, bool trans, const void* row);
void tj_host_mma_m16n8(int ta, int tb, float* d, const unsigned* a, const unsigned* b);
#define TJ_MMA_SYNC_HOST 1
#endif

namespace tj {
namespace dev {

template <int C, bool T = false>
TJ_DEV void ldmatrix(unsigned (&r)[C], const unsigned char* row) {
  static_assert(C == 1 || C == 2 || C == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(__CUDA_ARCH__)
  const unsigned a = (unsigned)__cvta_generic_to_shared(row);
  if constexpr (C == 4 && !T)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else if constexpr (C == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else if constexpr (C == 2 && !T)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  else if constexpr (C == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  else if constexpr (!T)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
#elif defined(TJ_MMA_SYNC_HOST)
  tj_host_ldmatrix(r, C, T, row);
#endif
}

// 16 bytes from global memory to shared memory, bypassing L1; bytes [src_bytes, 16) of the
// destination are zeroed (src_bytes = 0 reads nothing). Both addresses 16-byte aligned.
TJ_DEV void cp_async_chunk(unsigned char* dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
#else
  for (int b = 0; b < 16; ++b) dst[b] = b < src_bytes ? static_cast<const unsigned char*>(src)[b] : 0;
#endif
}
// Until this thread's cp.async copies have landed (then a block barrier shows them to all).
TJ_DEV void cp_async_wait_all() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}
// This thread's cp.async copies since the last commit form a group.
TJ_DEV void cp_async_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Until at most N of this thread's newest groups are in flight.
template <int N>
TJ_DEV void cp_async_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Copies a 2-D slice into operand tile O (rows of O::row_bytes bytes, as mma_layout.cuh
// swizzles them) at `dst`: byte b of row r is element c = b / sizeof(E::mem) of the slice, at
// data[offset + (r.start + r) * r.stride + (c.start + c) * c.stride]. Positions outside
// [0, limit), and all of them when !ok, read 0. A 16-byte chunk whose source is contiguous
// (c.stride 1) and 16-byte aligned moves by cp.async, any other element by element. The NT
// threads of the block call it; cp_async_wait_all and a block barrier complete it.
// RowsByParity: tile row t takes row keys_by_parity_col(t, rows) of the slice (its even rows
// first, then its odd ones: K for a score tile whose columns are by parity, Mma<.., 1>).
template <class E, class O, int NT, bool RowsByParity = false>
TJ_DEV void copy_operand(unsigned char* dst, const void* data, long long offset, bool ok, Span r, Span c) {
  using M = typename E::mem;
  constexpr int ES = (int)sizeof(M), PER = 16 / ES, CHUNKS = O::row_bytes / 16;
  static_assert(O::row_bytes % 16 == 0, "rows of whole 16-byte chunks");
  const M* base = static_cast<const M*>(data) + offset;
  for (int q = program_tid(); q < O::rows * CHUNKS; q += NT) {
    const int row = q / CHUNKS, cb = (q % CHUNKS) * 16;
    const long long pr = r.start + (RowsByParity ? keys_by_parity_col(row, O::rows) : row), pc = c.start + cb / ES;
    unsigned char* d = dst + O::offset(row, cb);
    const bool row_ok = ok && pr >= 0 && pr < r.limit;
    const M* src = base + pr * r.stride + pc * c.stride;
    if (c.stride == 1 && pc >= 0 && ((unsigned long long)src & 15u) == 0) {
      const long long n = row_ok ? (c.limit - pc < PER ? c.limit - pc : PER) : 0;
      cp_async_chunk(d, n > 0 ? (const void*)src : data, n > 0 ? (int)n * ES : 0);
    } else {
      M v[PER];
#pragma unroll
      for (int e = 0; e < PER; ++e) v[e] = (row_ok && pc + e >= 0 && pc + e < c.limit) ? src[e * c.stride] : M(0);
#pragma unroll
      for (int e = 0; e < PER; ++e) reinterpret_cast<M*>(d)[e] = v[e];
    }
  }
}

// Zeroes the K positions from `from` on of operand tile O at `tile` (a tile that runs past its
// dot's k range): K-major, the bytes of every row from position `from`; MN-major, the rows from
// `from`. The NT threads of the block call it; a block barrier completes it.
template <class O, int NT>
TJ_DEV void zero_k_tail(unsigned char* tile, int from) {
  constexpr int R = O::rows, KB = O::row_bytes;
  if (from < 0) from = 0;
  const int first = O::mn_major ? from * KB : from * O::elem_bytes;
  for (int b = program_tid(); b < R * KB; b += NT) {
    const int r = b / KB, c = b % KB;
    if (O::mn_major ? r * KB + c >= first : c >= first) tile[O::offset(r, c)] = 0;
  }
}

#define TJ_MMA_SYNC(SHAPE_TYPES)                                                                            \
  asm volatile("mma.sync.aligned." SHAPE_TYPES " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                             \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))

template <int TA, int TB>
TJ_DEV void mma_m16n8(float* d, const unsigned* a, const unsigned* b) {
  static_assert((TA == WG_BF16 || TA == WG_F16) ? TA == TB : (TB == WG_E4M3 || TB == WG_E5M2),
                "mma.sync takes bf16 x bf16, f16 x f16 or fp8 x fp8");
#if defined(__CUDA_ARCH__)
  if constexpr (TA == WG_BF16) {
    TJ_MMA_SYNC("m16n8k16.row.col.f32.bf16.bf16.f32");
  } else if constexpr (TA == WG_F16) {
    TJ_MMA_SYNC("m16n8k16.row.col.f32.f16.f16.f32");
  } else {
#if __CUDA_ARCH__ >= 890
    if constexpr (TA == WG_E4M3 && TB == WG_E4M3) TJ_MMA_SYNC("m16n8k32.row.col.f32.e4m3.e4m3.f32");
    else if constexpr (TA == WG_E4M3) TJ_MMA_SYNC("m16n8k32.row.col.f32.e4m3.e5m2.f32");
    else if constexpr (TB == WG_E4M3) TJ_MMA_SYNC("m16n8k32.row.col.f32.e5m2.e4m3.f32");
    else TJ_MMA_SYNC("m16n8k32.row.col.f32.e5m2.e5m2.f32");
#else
    __trap();   // fp8 mma.sync needs sm_89; the lowerings never ask for it below
#endif
  }
#elif defined(TJ_MMA_SYNC_HOST)
  tj_host_mma_m16n8(TA, TB, d, a, b);
#endif
}

#undef TJ_MMA_SYNC

// The A fragment of rows m0 .. m0 + 15 at K step s of operand tile O (K-major: rows M; MN-major,
// 16-bit: rows K of M) at `base`.
template <class O>
TJ_DEV void a_frag(unsigned (&a)[4], const unsigned char* base, int m0, int s) {
  const int lane = (int)threadIdx.x & 31;
  if constexpr (!O::mn_major)
    ldmatrix<4>(a, base + O::offset(m0 + (lane & 15), 32 * s + 16 * (lane >> 4)));
  else
    ldmatrix<4, true>(a, base + O::offset(16 * s + 8 * (lane >> 4) + (lane & 7), 2 * (m0 + 8 * ((lane >> 3) & 1))));
}

// The B fragments of the n8 blocks j and j + 1 (b[0..1], b[2..3]) of a warp's N columns, which
// start at n8 block n0 of operand tile O (K-major: rows N; MN-major, 16-bit: rows K of N) at
// `base`, at K step s; only block j (b[0..1]) when it is the warp's last.
template <class O, int N>
TJ_DEV void b_frags(unsigned (&b)[4], const unsigned char* base, int n0, int j, int s) {
  const int lane = (int)threadIdx.x & 31;
  const int last = j + 1 == N / 8;
  const int c = n0 + j;
  const unsigned char* row = !O::mn_major
                                 ? base + O::offset(8 * c + 8 * (lane >> 4) + (lane & 7), 32 * s + 16 * ((lane >> 3) & 1))
                                 : base + O::offset(16 * s + 8 * ((lane >> 3) & 1) + (lane & 7), 16 * (c + (lane >> 4)));
  if (!last) {
    ldmatrix<4, O::mn_major>(b, row);
  } else {
    unsigned h[2];
    ldmatrix<2, O::mn_major>(h, row);
    b[0] = h[0];
    b[1] = h[1];
  }
}

// K step s of acc += A . B for RB row blocks and the warp's N columns from n8 block n0: block
// r's A fragment at a + r * a_stride, B from operand tile OB at b (mma_sync_ss / mma_sync_rs).
template <int RB, int N, int TA, int TB, class OB>
TJ_DEV void mma_k_step(float* acc, const unsigned* a, int a_stride, const unsigned char* b, int n0, int s) {
  static_assert(!OB::mn_major || TB == WG_BF16 || TB == WG_F16, "MN-major tiles of 16-bit types only");
  static_assert(N % 8 == 0, "n8 blocks");
#pragma unroll
  for (int j = 0; j < N / 8; j += 2) {
    unsigned bf[4];
    b_frags<OB, N>(bf, b, n0, j, s);
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      mma_m16n8<TA, TB>(acc + r * (N / 2) + 4 * j, a + r * a_stride, bf);
      if (j + 1 < N / 8) mma_m16n8<TA, TB>(acc + r * (N / 2) + 4 * (j + 1), a + r * a_stride, bf + 2);
    }
  }
}

// The calling warp's share of acc += A [M x K] . B [K x N], where acc holds the registers of an
// Mma<MmaArr<WR, WC>, M, N> tile (warp (wr, wc): RB = M / (16 * WR) row blocks, block r is rows
// 16 * (wr + WR * r) .., and the N / WC columns from wc * N / WC) and both operands are
// SmemOperands in shared memory (OA: rows M, OB: rows N; K-major, or MN-major for 16-bit types)
// at a and b; KS k steps of 32 bytes. accumulate = 0 overwrites acc with A . B.
template <int WR, int WC, int RB, int N, int KS, int TA, int TB, class OA, class OB>
TJ_DEV void mma_sync_ss(float* acc, const unsigned char* a, const unsigned char* b, int accumulate) {
  static_assert(!OA::mn_major || TA == WG_BF16 || TA == WG_F16, "MN-major tiles of 16-bit types only");
  static_assert(N % (8 * WC) == 0, "8 columns per warp column, or a multiple");
  constexpr int NW = N / WC;   // the warp's columns
  if (!accumulate) {
#pragma unroll
    for (int i = 0; i < RB * NW / 2; ++i) acc[i] = 0.0f;
  }
  const int w = program_tid() >> 5, wr = w / WC, wc = w % WC;
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    unsigned af[RB][4];
#pragma unroll
    for (int r = 0; r < RB; ++r) a_frag<OA>(af[r], a, 16 * (wr + WR * r), s);
    mma_k_step<RB, NW, TA, TB, OB>(acc, &af[0][0], 4, b, wc * (NW / 8), s);
  }
}

// The same with A from registers: a[RB][KS][4], this thread's A fragments (tile_to_a_frag).
template <int RB, int N, int KS, int TA, int TB, class OB>
TJ_DEV void mma_sync_rs(float* acc, const unsigned* a, const unsigned char* b, int accumulate) {
  if (!accumulate) {
#pragma unroll
    for (int i = 0; i < RB * N / 2; ++i) acc[i] = 0.0f;
  }
#pragma unroll
  for (int s = 0; s < KS; ++s) mma_k_step<RB, N, TA, TB, OB>(acc, a + 4 * s, 4 * KS, b, 0, s);
}

}  // namespace dev
}  // namespace tj
