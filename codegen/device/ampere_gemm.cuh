#pragma once
// tilejit device library: the cp.async + ldmatrix + mma.sync GEMM main loop for sm_80 and
// sm_89 (and sm_90 without the 'a' features). The code generator
// (codegen/lower_gemm_sm80.cpp) instantiates Sm80Gemm<Cfg> in a generated kernel and writes
// the epilogue itself, from the IR ops that follow the K loop.
//
//   D[BM x BN tile] = A[M,K] . B[N,K]^T   (fp32 accumulation in mma.sync registers)
//
// A, B: K-major rows (row-major A M x K, row-major B N x K), bf16/f16 (both the same) with
// mma.sync m16n8k16 on sm_80+, or e4m3/e5m2 (any pair) with m16n8k32 on sm_89+. One mma k step
// is 32 bytes of K in both cases, so everything below counts K in bytes.
//
// Global -> shared: each thread copies 16-byte chunks with cp.async (L2 only), zero-filling
// rows past the operand's end and the part of a chunk past the end of K (src-size < 16), into a
// kStages-deep ring of stages: one cp.async group per stage, stage kb + kStages - 1 issued while
// stage kb is computed. Row starts must be 16-byte aligned (the launcher checks).
//
// Shared layout: a stage is an A tile [BM][kBK bytes] then a B tile [BN][kBK bytes]. Chunk c of
// row r sits at chunk c ^ swizzle(r): an ldmatrix phase reads one chunk column of 8 consecutive
// rows, and the XOR spreads those 8 chunks over the 8 different 16-byte bank groups of a
// 128-byte line (no bank conflicts, no padding), whatever the row length (32 to 256 bytes).
//
// Warps: kWarpsM x kWarpsN; warp (wm, wn) computes rows [wm*WM, +WM) and columns [wn*WN, +WN)
// of the tile as (WM/16) x (WN/8) m16n8 mma tiles. Accumulators, per thread (lane = l):
//   acc[mi][4*ni + 2*h + e] = D[m0 + wm*WM + 16*mi + 8*h + l/4][n0 + wn*WN + 8*ni + 2*(l%4) + e]
// (the mma.sync C fragment; the same (row block, h, column octet, e) shape as the sm_90a
// epilogue, so generated epilogues are shared).
//
// Use (every thread of the block runs this; one block per output tile):
//   tj::dev::Sm80Gemm<Cfg> g;
//   if (!g.init(smem, M, N, K, group_m)) return;     // blocks past the last tile
//   float acc[Cfg::kMTiles][4 * Cfg::kNTiles];
//   g.zero(acc);
//   g.mainloop(acc, GemmOperand{A...}, GemmOperand{B...});
//   // epilogue from registers: rows g.row0() + 16*mi + 8*h, columns g.col0() + 8*ni + e
#include "gemm_common.cuh"
#include "mma_sync.cuh"   // mma_m16n8

namespace tj {
namespace dev {

enum MmaType : int { MMA_BF16 = 0, MMA_F16 = 1, MMA_E4M3 = 2, MMA_E5M2 = 3 };

template <int kTA_, int kTB_, int kBM_, int kBN_, int kBKBytes_, int kStages_, int kWarpsM_, int kWarpsN_>
struct Sm80GemmCfg {
  static constexpr int kTA = kTA_;            // MmaType of A and of B
  static constexpr int kTB = kTB_;
  static constexpr bool kFp8 = kTA == MMA_E4M3 || kTA == MMA_E5M2;
  static constexpr int kElemBytes = kFp8 ? 1 : 2;
  static constexpr int kBM = kBM_;            // tile rows
  static constexpr int kBN = kBN_;            // tile columns
  static constexpr int kBK = kBKBytes_;       // bytes of K per stage
  static constexpr int kBKElems = kBK / kElemBytes;
  static constexpr int kStages = kStages_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWM = kBM / kWarpsM;   // rows per warp
  static constexpr int kWN = kBN / kWarpsN;   // columns per warp
  static constexpr int kMTiles = kWM / 16;    // m16 mma tiles per warp
  static constexpr int kNTiles = kWN / 8;     // n8 mma tiles per warp
  static constexpr int kChunks = kBK / 16;    // 16-byte chunks per tile row and stage
  static constexpr int kKSteps = kBK / 32;    // mma k steps per stage
  static constexpr int kABytes = kBM * kBK;   // per stage
  static constexpr int kBBytes = kBN * kBK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kAccRegs = kMTiles * kNTiles * 4;

  static_assert(kFp8 == (kTB == MMA_E4M3 || kTB == MMA_E5M2), "A and B: both fp8 or both 16-bit");
  static_assert(kFp8 || kTA == kTB, "16-bit mma.sync needs A and B of the same type");
  static_assert(kBM % (16 * kWarpsM) == 0, "each warp takes a multiple of 16 rows");
  static_assert(kBN % (16 * kWarpsN) == 0, "each warp takes a multiple of 16 columns (ldmatrix.x4 of B: two n8 tiles)");
  static_assert(kBK == 32 || kBK == 64 || kBK == 128 || kBK == 256, "BK bytes: 32, 64, 128 or 256");
  static_assert(kThreads % kChunks == 0, "a pass of cp.async covers whole rows");
  static_assert(kStages >= 1, "at least one stage");
};

// One operand as the main loop reads it: row r of the tensor starts at data + r * row_bytes.
struct GemmOperand {
  const unsigned char* data;
  long long rows;        // rows that exist; the tile rows past them are zeros
  long long row_bytes;   // row stride in bytes (a multiple of 16)
  long long k_bytes;     // bytes of each row that take part (min(tensor K, the K loop's end) * element
                         // size); the rest of the K block is zeros
};

// ---------------------------------------------------------------- PTX wrappers (sm_80+)

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; bytes [src_bytes, 16) of the destination are zeroed
// (src_bytes = 0 reads nothing).
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// (cp_async_commit, cp_async_wait<N>: mma_sync.cuh)

// Four 8x8 matrices of 16-bit elements (8 rows of 16 bytes each); lanes 8i..8i+7 give the row
// addresses of matrix i, which lands in register i (lane l holds row l/4, bytes 4*(l%4)..+3).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The WgType (frag.cuh) of MmaType t.
TJ_HD constexpr int wg_type(int t) {
  return t == MMA_BF16 ? WG_BF16 : t == MMA_F16 ? WG_F16 : t == MMA_E4M3 ? WG_E4M3 : WG_E5M2;
}
// d (4 fp32: the m16n8 C fragment) += a (m16 x 32 bytes of K) . b (32 bytes of K x n8).
template <int TA, int TB>
__device__ __forceinline__ void mma_m16n8_32bytes(float* d, const unsigned (&a)[4], const unsigned (&b)[2]) {
  mma_m16n8<wg_type(TA), wg_type(TB)>(d, a, b);
}

// ---------------------------------------------------------------- the main loop

template <class Cfg>
struct Sm80Gemm {
  static constexpr int S = Cfg::kStages;
  static constexpr int BM = Cfg::kBM;
  static constexpr int BN = Cfg::kBN;
  static constexpr int BK = Cfg::kBK;
  static constexpr int C = Cfg::kChunks;
  // The swizzle: rows that share a 128-byte line (short rows) get the same XOR value; it
  // repeats every 8 rows (kLineRows * kPeriod == 8), so it depends only on a row's index mod 8.
  static constexpr int kLineRows = C >= 8 ? 1 : 8 / C;
  static constexpr int kPeriod = C >= 8 ? 8 : C;

  unsigned smem;        // shared address of stage 0
  int lane, warp_m, warp_n;
  int m0, n0;           // the tile's first row and column
  int num_kb;           // K blocks

  static __device__ __forceinline__ int swizzle(int r) { return (r / kLineRows) % kPeriod; }
  // Byte offset of chunk c of row r within an operand tile of a stage.
  static __device__ __forceinline__ int chunk_offset(int r, int c) { return r * BK + ((c ^ swizzle(r)) << 4); }

  // Every thread: picks this block's tile (grouped raster over ceil(M/BM) x ceil(N/BN) tiles);
  // false for blocks past the last tile.
  __device__ __forceinline__ bool init(unsigned char* smem_base, int M, int N, int K, int group_m) {
    TileRaster rs;
    rs.tiles_m = (M + BM - 1) / BM;
    rs.tiles_n = (N + BN - 1) / BN;
    rs.total = rs.tiles_m * rs.tiles_n;
    rs.group_m = group_m < 1 ? 1 : group_m;
    const long long program = (long long)blockIdx.x + (long long)blockIdx.y * gridDim.x;
    if (M <= 0 || N <= 0 || program >= rs.total) return false;
    int tm, tn;
    rs.get((int)program, tm, tn);
    m0 = tm * BM;
    n0 = tn * BN;
    num_kb = K > 0 ? (K + Cfg::kBKElems - 1) / Cfg::kBKElems : 0;
    // Hide a compile-time K (static shapes) from the optimizer, which would otherwise unroll the
    // K loop whole.
    asm volatile("mov.b32 %0, %0;" : "+r"(num_kb));
    smem = smem_addr(smem_base);
    lane = (int)(threadIdx.x & 31u);
    const int warp = (int)(threadIdx.x >> 5);
    warp_m = warp / Cfg::kWarpsN;
    warp_n = warp % Cfg::kWarpsN;
    return true;
  }

  // This thread's first accumulator row and column (see the header).
  __device__ __forceinline__ int row0() const { return m0 + warp_m * Cfg::kWM + (lane >> 2); }
  __device__ __forceinline__ int col0() const { return n0 + warp_n * Cfg::kWN + 2 * (lane & 3); }

  __device__ __forceinline__ void zero(float (&acc)[Cfg::kMTiles][4 * Cfg::kNTiles]) {
#pragma unroll
    for (int i = 0; i < Cfg::kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < 4 * Cfg::kNTiles; ++j) acc[i][j] = 0.0f;
  }

  // Issues this thread's cp.async copies of K block kb of a ROWS-row operand tile whose first row
  // is tensor row `first_row`. Thread t always copies chunk t % C of rows t / C + i * (threads / C).
  template <int ROWS>
  __device__ __forceinline__ void copy_tile(unsigned dst, const GemmOperand& op, long long first_row, int kb) const {
    constexpr int kRowStep = Cfg::kThreads / C;
    constexpr int kPasses = (ROWS + kRowStep - 1) / kRowStep;
    const int t = (int)threadIdx.x;
    const int c = t % C;
    const long long kbyte = (long long)kb * BK + 16 * c;
    const long long left = op.k_bytes - kbyte;
    const int k_in = left >= 16 ? 16 : (left > 0 ? (int)left : 0);
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = t / C + i * kRowStep;
      if (ROWS % kRowStep != 0 && r >= ROWS) break;
      const long long row = first_row + r;
      const int bytes = row < op.rows ? k_in : 0;
      const unsigned char* src = bytes > 0 ? op.data + row * op.row_bytes + kbyte : op.data;
      cp_async_16(dst + (unsigned)chunk_offset(r, c), src, bytes);
    }
  }

  __device__ __forceinline__ void copy_stage(int stage, int kb, const GemmOperand& a, const GemmOperand& b) const {
    const unsigned base = smem + (unsigned)(stage * Cfg::kStageBytes);
    copy_tile<BM>(base, a, m0, kb);
    copy_tile<BN>(base + Cfg::kABytes, b, n0, kb);
  }

  // acc += the stage's A rows of this warp . its B rows, kKSteps mma k steps.
  __device__ __forceinline__ void compute_stage(int stage, float (&acc)[Cfg::kMTiles][4 * Cfg::kNTiles]) const {
    const unsigned a_tile = smem + (unsigned)(stage * Cfg::kStageBytes);
    const unsigned b_tile = a_tile + Cfg::kABytes;
    // ldmatrix.x4 of A (m16 x 32 bytes): matrices (rows 0-7, chunk 0), (8-15, 0), (0-7, 1),
    // (8-15, 1) = the A fragment's a0..a3. Of B (two n8 tiles x 32 bytes): (rows 0-7, chunk 0),
    // (0-7, 1), (8-15, 0), (8-15, 1) = b0, b1 of n tile 2p and of n tile 2p + 1.
    const int a_row = warp_m * Cfg::kWM + (lane & 15);
    const int a_chunk = lane >> 4;
    const int b_row = warp_n * Cfg::kWN + (lane & 7) + ((lane >> 4) << 3);
    const int b_chunk = (lane >> 3) & 1;
    const int a_swz = swizzle(a_row);   // the same for every m tile and k step (period 8)
    const int b_swz = swizzle(b_row);
#pragma unroll
    for (int ks = 0; ks < Cfg::kKSteps; ++ks) {
      unsigned af[Cfg::kMTiles][4];
      unsigned bf[Cfg::kNTiles][2];
      const unsigned a_col = (unsigned)(((2 * ks + a_chunk) ^ a_swz) << 4);
      const unsigned b_col = (unsigned)(((2 * ks + b_chunk) ^ b_swz) << 4);
#pragma unroll
      for (int mi = 0; mi < Cfg::kMTiles; ++mi) ldmatrix_x4(af[mi], a_tile + (unsigned)((a_row + 16 * mi) * BK) + a_col);
#pragma unroll
      for (int np = 0; np < Cfg::kNTiles / 2; ++np) {
        unsigned r[4];
        ldmatrix_x4(r, b_tile + (unsigned)((b_row + 16 * np) * BK) + b_col);
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < Cfg::kMTiles; ++mi)
#pragma unroll
        for (int ni = 0; ni < Cfg::kNTiles; ++ni)
          mma_m16n8_32bytes<Cfg::kTA, Cfg::kTB>(&acc[mi][4 * ni], af[mi], bf[ni]);
    }
  }

  // The K loop of the tile: acc += A[m0.., :] . B[n0.., :]^T.
  __device__ __forceinline__ void mainloop(float (&acc)[Cfg::kMTiles][4 * Cfg::kNTiles], const GemmOperand& a,
                                           const GemmOperand& b) const {
    if constexpr (S == 1) {
      // No pipelining: copy, wait, compute; the barrier before the copy keeps the previous
      // block's readers safe.
#pragma unroll 1
      for (int kb = 0; kb < num_kb; ++kb) {
        __syncthreads();
        copy_stage(0, kb, a, b);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        compute_stage(0, acc);
      }
    } else {
      // Fill S - 1 stages; then each iteration waits for the oldest, refills the stage every
      // thread finished reading in the previous iteration, and computes. Every iteration
      // commits one group (empty past the end), so "at most S - 2 in flight" always means
      // "stage kb has landed".
#pragma unroll
      for (int s = 0; s < S - 1; ++s) {
        if (s < num_kb) copy_stage(s, s, a, b);
        cp_async_commit();
      }
      int read = 0, write = S - 1;
#pragma unroll 1
      for (int kb = 0; kb < num_kb; ++kb) {
        cp_async_wait<S - 2>();
        __syncthreads();
        if (kb + S - 1 < num_kb) copy_stage(write, kb + S - 1, a, b);
        cp_async_commit();
        compute_stage(read, acc);
        read = read + 1 == S ? 0 : read + 1;
        write = write + 1 == S ? 0 : write + 1;
      }
      cp_async_wait<0>();
    }
  }
};

}  // namespace dev
}  // namespace tj
