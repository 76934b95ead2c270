#pragma once
// tilejit device library: the tensor cores' tiles, for wgmma (sm_90a, mma.cuh) and mma.sync
// (sm_80 on, mma_sync.cuh) alike; codegen/mma_plan.h decides which dots use them.
//
//   MmaArr<WR, WC>    a block's warps for tensor-core tiles: WR warp rows x WC warp columns
//                     (warp = wr * WC + wc). wgmma stacks every warp along the rows (WC = 1):
//                     warps 4g..4g+3 are warpgroup g.
//   Mma<A, ER, EC>    the accumulator fragment of wgmma (sm_90a) and mma.sync (sm_80 on) as a
//                     register-tile layout, with the interface of tile.cuh's Blocked, so that
//                     every generic tile function (map, load, store, reduce, broadcast,
//                     exchange) works on it. Per warp, 16-row groups: thread (lane l) of warp
//                     (wr, wc) holds rows 16 * (wr + WR * b) + l / 4 + 8 * h (row block b, half
//                     h) and columns wc * EC / WC + 8 * j + 2 * (l % 4) + e (octet j, element e).
//                     Registers are in wgmma's order: block b's EC / WC / 2 registers, within it
//                     4 * j + 2 * h + e; so block b of a tile is the `float* d` of a wgmma
//                     m64nN (N = EC) of the warpgroup, and the same holds per warp for mma.sync
//                     m16n8 tiles. Rank-1 slices: ER = 1 (a row of columns, replicated over the
//                     rows) or EC = 1 (a column of rows, replicated over a quad's 4 lanes).
//   Mma<A, ER, EC, 1> the same registers with the columns by parity: the thread's column c above
//                     holds column keys_by_parity_col(c, EC) (frag.cuh) of the tile, the even
//                     columns first (scores of keys whose rows were loaded so, for an fp8 P
//                     whose A fragments then need no shuffles; codegen/key_parity.h).
//   SmemOperand<...>  a dot operand tile in shared memory, swizzled as TMA writes it.
//   tile_to_a_frag    a register tile in the accumulator layout as A fragments.
//   store_staged / store_quads   an accumulator tile stored in 16-byte row pieces, through
//                     shared memory or by a transpose across each quad (16-bit elements).
//   store_add_staged  an f32 accumulator tile's atomic adds as 16-byte vector reductions,
//                     through shared memory.
//   stage_operand<..> writes a register tile into a swizzled operand tile (operands that TMA
//                     cannot load); mask_k_cols zeroes the columns past a dot's k range.
//   align_smem<N>     a shared-memory pointer rounded up to N bytes.
// Plain C++ on the tiles: every architecture, and the host (tests/test_codegen_emulated.cpp).
#include "tile.cuh"
#include "swizzle.cuh"
#include "frag.cuh"

namespace tj {
namespace dev {

// ---------------------------------------------------------------- the accumulator layout
template <int WR, int WC>
struct MmaArr {
  static constexpr int lanes_r = 8, lanes_c = 4, warps_r = WR, warps_c = WC;
  static constexpr int threads = 32 * WR * WC;
  static TJ_DEV int lane() { return (int)threadIdx.x & 31; }
  static TJ_DEV int warp() { return program_tid() >> 5; }
  static TJ_DEV int wr() { return warp() / WC; }
  static TJ_DEV int wc() { return warp() % WC; }
};

template <class A, long long ER, long long EC, int P = 0>
struct Mma {
  using arr = A;
  static constexpr long long er = ER, ec = EC;
  static constexpr bool by_parity = P == 1 && EC > 1;
  static_assert(P == 0 || P == 1, "Mma: columns in order (0) or by parity (1)");
  static_assert(!by_parity || (A::warps_c == 1 && EC % 16 == 0), "Mma: columns by parity on warps along the rows, whole octets per half");
  static_assert(ER == 1 || ER % (16 * A::warps_r) == 0, "Mma: the rows must be 16 per warp row, or a multiple");
  static_assert(EC == 1 || EC % (8 * A::warps_c) == 0, "Mma: the columns must be 8 per warp column, or a multiple");
  static constexpr int row_blocks = ER == 1 ? 1 : (int)(ER / (16 * A::warps_r));
  static constexpr int warp_cols = EC == 1 ? 1 : (int)(EC / A::warps_c);
  static constexpr int sr = ER == 1 ? 1 : 2 * row_blocks;
  static constexpr int sc = EC == 1 ? 1 : warp_cols / 4;
  static constexpr int slots = sr * sc;
  static constexpr int vec = EC == 1 || by_parity ? 1 : 2;   // a thread's columns come in adjacent pairs (in order)
  // Raw coordinates are unique per (thread, slot) over the block; a slice (extent 1) keeps the
  // raw coordinate of its replicas, and only the replica at raw 0 is primary.
  static TJ_DEV int raw_r(int i) { return 16 * (A::wr() + A::warps_r * (i >> 1)) + 8 * (i & 1) + (A::lane() >> 2); }
  static TJ_DEV int raw_c(int j) {
    return A::wc() * (EC == 1 ? 8 : warp_cols) + 8 * (j >> 1) + 2 * (A::lane() & 3) + (j & 1);
  }
  static TJ_DEV int coord_r(int i) { return ER == 1 ? 0 : raw_r(i); }
  static TJ_DEV int coord_c(int j) { return EC == 1 ? 0 : by_parity ? keys_by_parity_col(raw_c(j), (int)EC) : raw_c(j); }
  static TJ_DEV bool primary_r(int i) { return ER != 1 || raw_r(i) == 0; }
  static TJ_DEV bool primary_c(int j) { return EC != 1 || raw_c(j) == 0; }
  static TJ_DEV constexpr int idx(int i, int j) {
    return ER == 1 ? j : EC == 1 ? i : (i >> 1) * (warp_cols / 2) + 4 * (j >> 1) + 2 * (i & 1) + (j & 1);
  }
  template <long long R, long long C> using with_extents = Mma<A, R, C, C == 1 ? 0 : P>;
};

// ---------------------------------------------------------------- staged stores
// Stores an accumulator-layout tile as store() does (same addressing and masking), through
// shared memory: each warp writes its own rows x columns of the tile into its region of `stage`
// (a row every warp_cols + 16 bytes of elements: the 8 rows of one fragment store fall on
// distinct banks), then moves them out in 16-byte row chunks -- where a fragment's own stores
// are 4 or 8 bytes from 8 rows per instruction (half-sector writes). Only the warp itself
// synchronizes (__syncwarp): no warp waits for another. A chunk across the column limit, unaligned
// or with strided columns goes element by element.
template <class E, class L>
struct StoreStage {
  using M = typename E::mem;
  static constexpr int chunk = 16 / (int)sizeof(M);                               // elements per 16 bytes
  static constexpr int rows = 16 * L::row_blocks, pitch = L::warp_cols + chunk;   // one warp's region
  static constexpr long long warp_bytes = (long long)rows * pitch * (long long)sizeof(M);
  static constexpr long long bytes = warp_bytes * L::arr::threads / 32;
};
template <class E, class L, bool CR, bool CC>
TJ_DEV void store_staged(void* data, long long offset, bool ok, Span r, Span c, const Tile<typename E::reg, L>& x,
                         unsigned char* stage) {
  using M = typename E::mem;
  using S = StoreStage<E, L>;
  using A = typename L::arr;
  static_assert(L::er > 1 && L::ec > 1 && L::warp_cols % S::chunk == 0, "store_staged: whole 16-byte chunks per warp row");
  static_assert(!L::by_parity, "store_staged: columns in order");
  M* w = reinterpret_cast<M*>(stage + S::warp_bytes * A::warp());
  const int lane = A::lane();
#pragma unroll
  for (int i = 0; i < L::sr; ++i)
#pragma unroll
    for (int j0 = 0; j0 < L::sc; j0 += 2) {
      alignas(8) M pair[2];
      E::st(&pair[0], x.v[L::idx(i, j0)]);
      E::st(&pair[1], x.v[L::idx(i, j0 + 1)]);
      detail::Group<M, 2>::copy(w + (16 * (i >> 1) + 8 * (i & 1) + (lane >> 2)) * S::pitch + 8 * (j0 >> 1) + 2 * (lane & 3), pair);
    }
  __syncwarp();
  if (ok) {
    M* base = static_cast<M*>(data) + offset;
    constexpr int per_row = L::warp_cols / S::chunk;
#pragma unroll 4
    for (int k = lane; k < S::rows * per_row; k += 32) {
      const int lr = k / per_row, lc = (k - lr * per_row) * S::chunk;
      const long long pr = r.start + 16 * (A::wr() + A::warps_r * (lr >> 4)) + (lr & 15);
      const long long pc = c.start + A::wc() * L::warp_cols + lc;
      if (CR && !in_range(pr, r.limit)) continue;
      const M* src = w + lr * S::pitch + lc;
      M* g = base + pr * r.stride + pc;
      if (c.stride == 1 && (!CC || (pc >= 0 && pc + S::chunk <= c.limit)) && ((unsigned long long)g & 15ull) == 0) {
        *reinterpret_cast<uint4*>(g) = *reinterpret_cast<const uint4*>(src);
        continue;
      }
      for (int e = 0; e < S::chunk; ++e)
        if (!CC || in_range(pc + e, c.limit)) base[pr * r.stride + (pc + e) * c.stride] = src[e];
    }
  }
  __syncwarp();   // the region's reads are done before the warp's next staged store writes it
}

// ---------------------------------------------------------------- staged atomic adds
// The DSL's atomic_add of an f32 accumulator-layout tile (same addressing and masking as
// store_add) as 16-byte vector reductions (red.global.add.v4.f32, sm_90 on): each warp writes its
// rows x columns into its region of `stage` in the memory's order, lines of contiguous elements
// (T: the tile's rows are the unit-stride dim, so that a line holds a column's rows), then adds 4
// contiguous elements per instruction, where a fragment's own adds are 4 bytes each (a quarter of
// the instructions and of the L2's reduction operations). Only the warp itself synchronizes
// (__syncwarp). A chunk across a limit, unaligned or off the unit stride goes element by element.
template <class L, bool T>
struct AddStage {
  static constexpr int rows = 16 * L::row_blocks;                 // a warp's rows and columns
  static constexpr int lines = T ? L::warp_cols : rows;           // lines of the memory's order
  static constexpr int line_len = T ? rows : L::warp_cols;        // contiguous elements a line
  static constexpr int pitch = line_len + 4;                      // 4 floats apart: distinct banks
  static constexpr long long warp_bytes = (long long)lines * pitch * 4;
  static constexpr long long bytes = warp_bytes * L::arr::threads / 32;
};
TJ_DEV void red_add_v4(float* p, const float* v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
               : "memory");
#else
  for (int e = 0; e < 4; ++e) f32::add(p + e, v[e]);
#endif
}
template <class L, bool CR, bool CC, bool T>
TJ_DEV void store_add_staged(void* data, long long offset, bool ok, Span r, Span c, const Tile<float, L>& x,
                             unsigned char* stage) {
  using S = AddStage<L, T>;
  using A = typename L::arr;
  static_assert(L::er > 1 && L::ec > 1 && S::line_len % 4 == 0, "store_add_staged: whole 16-byte chunks per warp line");
  static_assert(!L::by_parity, "store_add_staged: columns in order");
  float* w = reinterpret_cast<float*>(stage + S::warp_bytes * A::warp());
  const int lane = A::lane();
#pragma unroll
  for (int i = 0; i < L::sr; ++i)
#pragma unroll
    for (int j = 0; j < L::sc; ++j) {
      const int lr = 16 * (i >> 1) + 8 * (i & 1) + (lane >> 2), lc = 8 * (j >> 1) + 2 * (lane & 3) + (j & 1);
      w[T ? lc * S::pitch + lr : lr * S::pitch + lc] = x.v[L::idx(i, j)];
    }
  __syncwarp();
  if (ok) {
    float* base = static_cast<float*>(data) + offset;
    constexpr int per_line = S::line_len / 4;
#pragma unroll 4
    for (int k = lane; k < S::lines * per_line; k += 32) {
      const int ln = k / per_line, e0 = (k - ln * per_line) * 4;
      const int lr = T ? e0 : ln, lc = T ? ln : e0;   // the chunk's first element, in the warp's rows / columns
      const long long pr = r.start + 16 * (A::wr() + A::warps_r * (lr >> 4)) + (lr & 15);
      const long long pc = c.start + A::wc() * L::warp_cols + lc;
      const float* src = w + ln * S::pitch + e0;
      float* g = base + pr * r.stride + pc * c.stride;
      const bool whole = T ? r.stride == 1 && (!CR || (pr >= 0 && pr + 4 <= r.limit)) && (!CC || in_range(pc, c.limit))
                           : c.stride == 1 && (!CC || (pc >= 0 && pc + 4 <= c.limit)) && (!CR || in_range(pr, r.limit));
      if (whole && ((unsigned long long)g & 15ull) == 0) {
        red_add_v4(g, src);
        continue;
      }
      for (int e = 0; e < 4; ++e) {
        const long long er = pr + (T ? e : 0), ec = pc + (T ? 0 : e);
        if ((!CR || in_range(er, r.limit)) && (!CC || in_range(ec, c.limit))) f32::add(base + er * r.stride + ec * c.stride, src[e]);
      }
    }
  }
  __syncwarp();   // the region's reads are done before the warp's next staged add or store writes it
}

// ---------------------------------------------------------------- quad-transposed stores
// Stores a 16-bit accumulator-layout tile as store() does, without shared memory: in each 8-row
// group a quad's 4 lanes hold 2 adjacent columns of each octet; a 4 x 4 transpose across the quad
// (two shfl_xor rounds) gives each lane 8 adjacent columns of one row, which it writes as one
// 16-byte store, so that a warp instruction writes 64 contiguous bytes of each of 8 rows (the
// fragment's own stores write 16 bytes of each of 8 rows: half-sector writes). Where the tile is
// not whole, aligned and unit-stride (one test, the same in every thread: the shuffles need the
// whole warp), store() takes it.
template <class E, class L, bool CR, bool CC>
TJ_DEV void store_quads(void* data, long long offset, bool ok, Span r, Span c, const Tile<typename E::reg, L>& x) {
  using M = typename E::mem;
  using A = typename L::arr;
  static_assert(sizeof(M) == 2 && L::er > 1 && L::ec > 1 && L::warp_cols % 32 == 0,
                "store_quads: 16-bit elements, whole groups of 4 octets per warp");
  static_assert(!L::by_parity, "store_quads: columns in order");
  M* base = static_cast<M*>(data) + offset;
  const bool whole = ok && c.stride == 1 && (r.stride * (long long)sizeof(M)) % 16 == 0 &&
                     (!CR || (r.start >= 0 && r.start + L::er <= r.limit)) &&
                     (!CC || (c.start >= 0 && c.start + L::ec <= c.limit)) &&
                     ((unsigned long long)(base + r.start * r.stride + c.start) & 15ull) == 0;
  if (!whole) {
    store<E, L, CR, CC>(data, offset, ok, r, c, x);
    return;
  }
  const int q = A::lane() & 3;
  const bool b0 = (q & 1) != 0, b1 = (q & 2) != 0;
#pragma unroll
  for (int i = 0; i < L::sr; ++i) {
    const long long pr = r.start + L::coord_r(i);
#pragma unroll
    for (int g = 0; g < L::warp_cols / 32; ++g) {
      unsigned w[4];   // w[o]: this lane's 2 columns of octet 4 g + o
#pragma unroll
      for (int o = 0; o < 4; ++o) {
        alignas(4) M pair[2];
        E::st(&pair[0], x.v[L::idx(i, 2 * (4 * g + o))]);
        E::st(&pair[1], x.v[L::idx(i, 2 * (4 * g + o) + 1)]);
        w[o] = *reinterpret_cast<const unsigned*>(pair);
      }
      // Transpose across the quad: exchange the words whose octet differs from the lane in bit 1,
      // then in bit 0; w[o] ends as lane o's 2 columns of octet 4 g + q.
#pragma unroll
      for (int o = 0; o < 2; ++o) {
        const unsigned y = __shfl_xor_sync(0xffffffffu, b1 ? w[o] : w[o | 2], 2);
        if (b1) w[o] = y;
        else w[o | 2] = y;
      }
#pragma unroll
      for (int o = 0; o < 4; o += 2) {
        const unsigned y = __shfl_xor_sync(0xffffffffu, b0 ? w[o] : w[o | 1], 1);
        if (b0) w[o] = y;
        else w[o | 1] = y;
      }
      const long long pc = c.start + A::wc() * L::warp_cols + 8 * (4 * g + q);
      uint4 v;
      v.x = w[0];
      v.y = w[1];
      v.z = w[2];
      v.w = w[3];
      *reinterpret_cast<uint4*>(base + pr * r.stride + pc) = v;
    }
  }
}

// ---------------------------------------------------------------- shared-memory operands
// A dot operand tile in shared memory with swizzle SW bytes (128, 64 or 32), as a TMA box of SW
// bytes along the contiguous dim writes it (hopper.cuh's conventions), its base 8 * SW aligned:
//   K-major  (MN = false): R rows (M or N) of KB bytes of K, in KB / SW column blocks of [R][SW];
//   MN-major (MN = true):  R rows of K of KB bytes of M or N, in KB / SW column blocks of [R][SW]
//                          (16-bit types only).
// wgmma reads it through descriptors (mma.cuh: smem_desc), mma.sync through ldmatrix's row
// addresses (mma_sync.cuh), both at offset().
template <int R, int KB, int SW, bool MN, int ES>
struct SmemOperand {
  static_assert(SW == 128 || SW == 64 || SW == 32, "swizzle of 32, 64 or 128 bytes");
  static_assert(KB % SW == 0, "whole column blocks");
  static constexpr int bytes = R * KB;
  static constexpr int rows = R, row_bytes = KB, elem_bytes = ES, swizzle = SW;
  static constexpr int mode = SW == 128 ? SWIZZLE_128B : SW == 64 ? SWIZZLE_64B : SWIZZLE_32B;
  static constexpr bool mn_major = MN;
  // Byte offset of element (row r, byte b of the row's KB) from the tile base, swizzled.
  static TJ_DEV unsigned offset(int r, int b) {
    return swizzle_offset((unsigned)((b / SW) * R * SW + r * SW + b % SW), mode);
  }
};

// A register tile in the accumulator layout (rows M, columns K) as the A fragments of register-A
// wgmmas or mma.syncs (per warp the same): a[RB][K * element bytes / 32][4] (16-bit: the pairs as they are; fp8: bytes moved
// across each quad, exact).
// InOrder (fp8): the other operand's K comes in fp8_kperm_col's order (frag.cuh), so the fragments
// are the thread's own bytes; so are they where x's columns are by parity (L::by_parity, the
// other operand's K in order).
template <int T, int RB, int K, class L, bool InOrder = false>
TJ_DEV void tile_to_a_frag(const Tile<float, L>& x, unsigned* a) {
  constexpr int KS = (T == WG_BF16 || T == WG_F16) ? K / 16 : K / 32;
  static_assert(!L::by_parity || ((T == WG_E4M3 || T == WG_E5M2) && K == L::ec), "columns by parity: fp8 fragments of the whole tile");
#pragma unroll
  for (int b = 0; b < RB; ++b) {
    const float* d = x.v + b * (K / 2);
    if constexpr (T == WG_BF16) acc_to_a_bf16<K>(d, a + b * KS * 4);
    else if constexpr (T == WG_F16) acc_to_a_f16<K>(d, a + b * KS * 4);
    else if constexpr (L::by_parity) acc_to_a_fp8_keys_by_parity<K, T>(d, a + b * KS * 4);
    else if constexpr (InOrder) acc_to_a_fp8_kperm<K, T>(d, a + b * KS * 4);
    else acc_to_a_fp8<K, T>(d, a + b * KS * 4);
  }
}

// ---------------------------------------------------------------- operands from registers
// x with the columns at or past ke - kb set to 0 (a dot's k range on its a operand's columns).
template <class T, class L>
TJ_DEV Tile<T, L> mask_k_cols(const Tile<T, L>& x, long long kb, long long ke) {
  Tile<T, L> out;
#pragma unroll
  for (int i = 0; i < L::sr; ++i)
#pragma unroll
    for (int j = 0; j < L::sc; ++j) out.v[L::idx(i, j)] = kb + L::coord_c(j) < ke ? x.v[L::idx(i, j)] : T(0);
  return out;
}

// Writes a register tile [D0, D1] (any layout; E the element type) into the operand tile O at
// `base` (a generic pointer to shared memory): ROWS_DIM names the tile dim that indexes O's rows
// (K-major: M or N; MN-major: K), the other one its bytes. With KMASK, elements whose k
// position (along the other dim of a K-major tile) is at or past ke - kb are written as 0.
// Every thread writes its primary elements; the caller orders the writes before the tensor
// cores read them (fence the async proxy, then a block barrier).
template <class E, class O, int ROWS_DIM, bool KMASK, class L>
TJ_DEV void stage_operand(const Tile<typename E::reg, L>& x, unsigned char* base, long long kb, long long ke) {
  using M = typename E::mem;
  static_assert(!O::mn_major, "register operands are staged K-major");
#pragma unroll
  for (int i = 0; i < L::sr; ++i)
#pragma unroll
    for (int j = 0; j < L::sc; ++j) {
      if (!(L::primary_r(i) && L::primary_c(j))) continue;
      const int r = ROWS_DIM == 0 ? L::coord_r(i) : L::coord_c(j);
      const int c = ROWS_DIM == 0 ? L::coord_c(j) : L::coord_r(i);
      const bool keep = !KMASK || kb + c < ke;
      E::st(reinterpret_cast<M*>(base + O::offset(r, c * (int)sizeof(M))), keep ? x.v[L::idx(i, j)] : typename E::reg(0));
    }
}

// `p` (shared memory) rounded up to a multiple of N bytes of the shared window: the swizzle of
// an operand tile repeats every 8 x its width, so tile bases sit on such boundaries.
template <unsigned N>
TJ_DEV unsigned char* align_smem(unsigned char* p) {
#if defined(__CUDA_ARCH__)
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
#else
  const unsigned a = (unsigned)(unsigned long long)p;
#endif
  return p + ((N - (a & (N - 1))) & (N - 1));
}

}  // namespace dev
}  // namespace tj
