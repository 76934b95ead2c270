#pragma once
// tilejit device library: what the GEMM main loops (hopper_gemm.cuh: wgmma + TMA on sm_90a;
// ampere_gemm.cuh: mma.sync + cp.async on sm_80/sm_89) and their generated epilogues share:
// the grouped tile raster and the paired output store. No includes: the store's element tags
// (tj::dev::f32, bf16, ...) come from tile.cuh, which generated code includes first.

namespace tj {
namespace dev {

// Tiles over an M x N output, visited in a grouped raster order for L2 reuse.
struct TileRaster {
  int tiles_m;   // tile rows (the sm_90a loop counts cluster tiles)
  int tiles_n;
  int total;
  int group_m;
  // Grouped raster: walk group_m tile rows down, then move one column right.
  __device__ __forceinline__ void get(int t, int& tm, int& tn) const {
    const int per_group = group_m * tiles_n;
    const int g = t / per_group;
    const int first_m = g * group_m;
    int gsize = tiles_m - first_m;
    gsize = gsize < group_m ? gsize : group_m;
    const int r = t - g * per_group;
    tm = first_m + r % gsize;
    tn = r / gsize;
  }
};

// Stores two adjacent output elements of a row of an output tensor of element type E (tile.cuh's
// tags carry the conversion). `p` points at the row's element in column `col0` (a thread's first
// column of the tile), `col_left` = number of columns from col0 to the end of the tensor
// (clamped to int), `jcol` the pair's offset from col0 (a compile-time constant once the caller's
// loop is unrolled, so addresses are immediate offsets), `s1` the column stride in elements.
// `vec_ok`: s1 == 1 and p + jcol is aligned to two elements whenever jcol is even, so an
// in-bounds pair is one store.
template <class Mem>
struct GemmPair;
template <>
struct GemmPair<float> { struct alignas(8) T { float x, y; }; };
template <>
struct GemmPair<unsigned short> { struct alignas(4) T { unsigned short x, y; }; };
template <>
struct GemmPair<unsigned char> { struct alignas(2) T { unsigned char x, y; }; };

template <class E>
__device__ __forceinline__ void gemm_store_pair(typename E::mem* p, bool row_ok, int col_left, int jcol,
                                                long long s1, float v0, float v1, bool vec_ok) {
  typedef typename E::mem M;
  if (!row_ok) return;
  if (vec_ok && jcol + 1 < col_left) {
    typename GemmPair<M>::T pr;
    E::st(&pr.x, v0);
    E::st(&pr.y, v1);
    *reinterpret_cast<typename GemmPair<M>::T*>(p + jcol) = pr;
    return;
  }
  if (jcol < col_left) E::st(p + jcol * s1, v0);
  if (jcol + 1 < col_left) E::st(p + (jcol + 1) * s1, v1);
}

// ---- staged output (sm_90a epilogue): each warp writes its accumulator pieces (4-byte pairs
// scattered over 8 rows) into a small shared-memory buffer, then stores whole 16-byte row pieces
// (full 32-byte sectors) -- the accumulator layout's direct stores fill half of every sector per
// instruction. A chunk is 64 bytes of each of the warp's rows: kRowBlocks blocks of 16 rows,
// kGemmStagePitch bytes apart, unpadded; the four 16-byte pieces of row r are stored in the
// order piece ^ s(r), s(r) = bit 1 of r -> bit 1, bit 2 of r -> bit 0. Then the pair writes of
// a warp (4-byte pairs: 8 rows x one piece; 8-byte pairs: 4 rows x two pieces per half warp)
// and the 16-byte piece reads (2 whole rows per quarter warp) all hit 32 distinct banks (a
// padded pitch of 80 bytes left 8-byte pairs and the piece reads 2-way conflicts).
constexpr int kGemmStageChunkBytes = 64;
constexpr int kGemmStagePitch = kGemmStageChunkBytes;

// Byte offset in the staging buffer of byte b (0..63) of the chunk's row r.
__device__ __forceinline__ int gemm_stage_offset(int r, int b) {
  const int s = (((r >> 1) & 1) << 1) | ((r >> 2) & 1);
  return r * kGemmStagePitch + ((((b >> 4) ^ s) << 4) | (b & 15));
}

// The pair (v0, v1) at byte `off` of the warp's staging buffer.
template <class E>
__device__ __forceinline__ void gemm_stage_pair(unsigned char* buf, int off, float v0, float v1) {
  typedef typename E::mem M;
  typename GemmPair<M>::T pr;
  E::st(&pr.x, v0);
  E::st(&pr.y, v1);
  *reinterpret_cast<typename GemmPair<M>::T*>(buf + off) = pr;
}

// One staged chunk to global memory. `c` = the output at (row 0, column 0) of its scalar indices,
// `rs` its row stride in elements (the column stride is 1; c, rs and col0 keep 16-byte pieces
// aligned), `row0` the warp's first row, `col0` the chunk's first column, M x N the output's
// extent; `ok` = the scalar indices are in range. The warp's rows are row0 + kRowBlockStride * mb
// + 0..15 (64: wgmma's m64 blocks, one warp's 16 rows each; 16: a warp's own m16 mma.sync tiles).
// Lane l writes piece l % 4 of rows l / 4 + 8 p.
template <class E, int kRowBlocks, int kRowBlockStride>
__device__ __forceinline__ void gemm_flush_chunk(const unsigned char* buf, typename E::mem* c, long long rs,
                                                 long long row0, long long M, long long col0, long long N,
                                                 bool ok, int lane) {
  typedef typename E::mem Mm;
  constexpr int kPer = 16 / (int)sizeof(Mm);   // elements per 16-byte piece
  if (!ok) return;
  const int piece = lane & 3;
  const long long col = col0 + piece * kPer;
  if (col >= N) return;
#pragma unroll
  for (int mb = 0; mb < kRowBlocks; ++mb) {
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int r = (lane >> 2) + 8 * pass;
      const long long row = row0 + kRowBlockStride * mb + r;
      if (row >= M) continue;
      const unsigned char* src = buf + gemm_stage_offset(16 * mb + r, 16 * piece);
      Mm* dst = c + row * rs + col;
      if (col + kPer <= N) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      } else {
#pragma unroll
        for (int e = 0; e < kPer; ++e)
          if (col + e < N) dst[e] = reinterpret_cast<const Mm*>(src)[e];
      }
    }
  }
}

}  // namespace dev
}  // namespace tj
