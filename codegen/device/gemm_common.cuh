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

}  // namespace dev
}  // namespace tj
