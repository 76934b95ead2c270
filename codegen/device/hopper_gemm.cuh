#pragma once
// tilejit device library: proof-of-concept FP8 GEMM main loop for sm_90a, built only from the
// hopper.cuh building blocks (this is the structure the code generator emits for `dot`).
//
//   C[M,N] = (A[M,K] . B[N,K]^T) * scale_a * scale_b * row_scale[m] * col_scale[n] + bias[n]
//
// A, B: e4m3, K-major (row-major A MxK, row-major B NxK), loaded by TMA (2-D tensor maps, box
// {128 B of K, rows}, CU_TENSOR_MAP_SWIZZLE_128B, zero fill) into a kStages-deep ring of shared
// memory stages guarded by full/empty mbarriers. fp32 accumulation in wgmma registers; output
// bf16 or f32, row-major with leading dimension ldc; masked for M/N tails.
//
// Warp specialization: 384 threads = 3 warpgroups. WG0 = producer (setmaxnreg.dec<40>, one
// thread issues TMA), WG1/WG2 = consumers (setmaxnreg.inc<232>).
//   cooperative (kPingpong = false): a tile is (2*kWgM) x kBN; consumer c computes rows
//     [c*kWgM, (c+1)*kWgM) of every tile; both consume every stage.
//   pingpong (kPingpong = true): a tile is kWgM x kBN; consumer c takes every other tile of the
//     CTA's sequence, so one consumer's epilogue overlaps the other's main loop.
// Persistent: grid = (number of clusters that fit) * kClusterM CTAs; cluster tiles
// ((kClusterM * BM) x kBN) are visited in a grouped raster order (group_m cluster-tile rows per
// group, for L2 reuse). kClusterM = 2: the two CTAs of a cluster share the B tile; each loads
// half of it and multicasts it to both (TMA .multicast::cluster).
// kPromote: accumulate each 128-wide K block in a separate register tile and add it into the
// fp32 accumulator (like cuBLASLt without fast accumulation); needs twice the registers.
//
// Host side: see bench/proto/fp8_gemm_proto.cu (tensor maps, launch with cluster dims,
// dynamic shared memory = Cfg::kSmemBytes).

#include "hopper.cuh"

namespace tj {
namespace dev {

enum GemmOutType : int { GEMM_OUT_BF16 = 0, GEMM_OUT_F32 = 1 };

struct Fp8GemmParams {
  int M, N, K;
  void* C;                 // row-major M x N, element type per Cfg::kOut
  long long ldc;           // leading dimension of C in elements
  const float* scale_a;    // [1] per-tensor scale of A, or nullptr (1)
  const float* scale_b;    // [1] per-tensor scale of B, or nullptr (1)
  const float* row_scale;  // [M] per-row scale, or nullptr
  const float* col_scale;  // [N] per-column scale, or nullptr
  const float* bias;       // [N] added after scaling, or nullptr
  int group_m;             // raster group height in cluster tiles (>= 1)
};

template <int kWgM_, int kBN_, int kStages_, bool kPingpong_, int kClusterM_, bool kPromote_,
          int kOut_>
struct Fp8GemmCfg {
  static constexpr int kWgM = kWgM_;          // rows per consumer warpgroup per tile: 64 or 128
  static constexpr int kBN = kBN_;            // tile columns: multiple of 16, <= 256
  static constexpr int kStages = kStages_;
  static constexpr bool kPingpong = kPingpong_;
  static constexpr int kClusterM = kClusterM_;  // 1 or 2 (B multicast)
  static constexpr bool kPromote = kPromote_;
  static constexpr int kOut = kOut_;

  static constexpr int kBK = 128;             // K bytes per stage = one 128B swizzle row
  static constexpr int kBM = kPingpong ? kWgM : 2 * kWgM;
  static constexpr int kMBlocks = kWgM / 64;  // wgmma m64 blocks per consumer
  static constexpr int kAccRegs = kMBlocks * kBN / 2;
  static constexpr int kThreads = 384;
  static constexpr int kABytes = kBM * kBK;   // per stage
  static constexpr int kBBytes = kBN * kBK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kBBoxRows = kBN / kClusterM;  // rows of B each CTA loads (TMA box rows)
  static constexpr int kABoxRows = kBM;
  static constexpr int kConsumersPerStage = kPingpong ? 1 : 2;
  static constexpr int kEmptyArrivals = kConsumersPerStage * 4 * kClusterM;  // one per warp
  // dynamic smem: 1024 B alignment slack + stages + full/empty barriers + 2 order barriers
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + (2 * kStages + 2) * 8;

  static_assert(kWgM == 64 || kWgM == 128, "kWgM must be 64 or 128");
  static_assert(kBN % 16 == 0 && kBN >= 16 && kBN <= 256, "kBN: multiple of 16 in [16, 256]");
  static_assert(kClusterM == 1 || kClusterM == 2, "kClusterM must be 1 or 2");
  static_assert(kBBoxRows % 8 == 0, "B half tile must be a multiple of 8 rows");
  static_assert(kAccRegs * (kPromote ? 2 : 1) <= 160, "accumulators exceed the register budget");
  static_assert(kSmemBytes <= 232448, "shared memory exceeds 227 KB");
};

namespace detail {

struct TileRaster {
  int tiles_m;   // cluster-tile rows
  int tiles_n;
  int total;
  int group_m;
  // Grouped raster: walk group_m cluster-tile rows down, then move one column right.
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

template <class Cfg>
__device__ __forceinline__ void release_stage(unsigned long long* empty_bar) {
  if ((threadIdx.x & 31u) == 0u) {
    if (Cfg::kClusterM == 1) {
      mbar_arrive(empty_bar);
    } else {
#pragma unroll
      for (int r = 0; r < Cfg::kClusterM; ++r) mbar_arrive_cluster(empty_bar, (unsigned)r);
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void store_pair(const Fp8GemmParams& p, int row, int col, float v0,
                                           float v1, bool vec_ok) {
  const long long off = (long long)row * p.ldc + col;
  if (Cfg::kOut == GEMM_OUT_BF16) {
    unsigned short* c = reinterpret_cast<unsigned short*>(p.C) + off;
    if (vec_ok && col + 1 < p.N) {
      *reinterpret_cast<unsigned*>(c) = f32x2_to_bf16x2(v0, v1);
    } else {
      if (col < p.N) c[0] = f32_to_bf16(v0);
      if (col + 1 < p.N) c[1] = f32_to_bf16(v1);
    }
  } else {
    float* c = reinterpret_cast<float*>(p.C) + off;
    if (vec_ok && col + 1 < p.N) {
      struct alignas(8) F2 { float x, y; };
      F2 f;
      f.x = v0;
      f.y = v1;
      *reinterpret_cast<F2*>(c) = f;
    } else {
      if (col < p.N) c[0] = v0;
      if (col + 1 < p.N) c[1] = v1;
    }
  }
}

}  // namespace detail

#if TJ_SM90A_ENABLED

template <class Cfg>
__global__ void __launch_bounds__(384, 1)
    fp8_gemm_kernel(const __grid_constant__ TmaDescriptor tma_a,
                    const __grid_constant__ TmaDescriptor tma_b, const Fp8GemmParams p) {
  constexpr int S = Cfg::kStages;
  constexpr int BN = Cfg::kBN;
  constexpr int BM = Cfg::kBM;
  constexpr int CM = Cfg::kClusterM;

  extern __shared__ unsigned char smem_raw[];
  // 1024-byte alignment for the 128B swizzle (the descriptor's base offset is 0).
  const unsigned raw_addr = smem_u32(smem_raw);
  unsigned char* smem = smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  unsigned char* sA = smem;                                  // [S][kABytes]
  unsigned char* sB = smem + S * Cfg::kABytes;               // [S][kBBytes]
  unsigned long long* full_bar =
      reinterpret_cast<unsigned long long*>(smem + S * Cfg::kStageBytes);
  unsigned long long* empty_bar = full_bar + S;
  // Pingpong only: order_bar[c] completes a phase when consumer c has passed every full-barrier
  // wait of its current tile. The other consumer waits for it before its next tile, so that
  // the two never wait on the same stage barrier more than one phase apart (parity waits
  // cannot tell phase r from r+2) -- and it serializes their main loops, as intended.
  unsigned long long* order_bar = empty_bar + S;

  const int wg = warpgroup_idx();
  const unsigned rank = (CM > 1) ? cluster_ctarank() : 0u;

  if (threadIdx.x == 0) {
#pragma unroll 1
    for (int s = 0; s < S; ++s) {
      mbar_init(&full_bar[s], 1);
      mbar_init(&empty_bar[s], Cfg::kEmptyArrivals);
    }
    mbar_init(&order_bar[0], 1);
    mbar_init(&order_bar[1], 1);
    fence_mbarrier_init();
  }
  if (CM > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }

  detail::TileRaster rs;
  const int tiles_m_cta = (p.M + BM - 1) / BM;
  rs.tiles_m = (tiles_m_cta + CM - 1) / CM;
  rs.tiles_n = (p.N + BN - 1) / BN;
  rs.total = rs.tiles_m * rs.tiles_n;
  rs.group_m = p.group_m < 1 ? 1 : p.group_m;
  const int num_kb = (p.K + Cfg::kBK - 1) / Cfg::kBK;
  const int cluster_id = blockIdx.x / CM;
  const int num_clusters = gridDim.x / CM;

  if (wg == 0) {
    // ------------------------------------------------------------------ producer
    setmaxnreg_dec<40>();
    if (warp_idx_in_warpgroup() == 0 && lane_id() == 0) {
      prefetch_tma_descriptor(&tma_a);
      prefetch_tma_descriptor(&tma_b);
      int s = 0;
      unsigned ph = 0;
#pragma unroll 1
      for (int t = cluster_id; t < rs.total; t += num_clusters) {
        int tm, tn;
        rs.get(t, tm, tn);
        const int m0 = (tm * CM + (int)rank) * BM;
        const int n0 = tn * BN;
#pragma unroll 1
        for (int kb = 0; kb < num_kb; ++kb) {
          mbar_wait(&empty_bar[s], ph ^ 1u);
          mbar_arrive_expect_tx(&full_bar[s], (unsigned)Cfg::kStageBytes);
          tma_load_2d(sA + s * Cfg::kABytes, &tma_a, &full_bar[s], kb * Cfg::kBK, m0);
          if (CM == 1) {
            tma_load_2d(sB + s * Cfg::kBBytes, &tma_b, &full_bar[s], kb * Cfg::kBK, n0);
          } else {
            tma_load_2d_multicast(sB + s * Cfg::kBBytes + rank * (Cfg::kBBoxRows * Cfg::kBK),
                                  &tma_b, &full_bar[s], kb * Cfg::kBK,
                                  n0 + (int)rank * Cfg::kBBoxRows,
                                  (unsigned short)((1u << CM) - 1u));
          }
          if (++s == S) {
            s = 0;
            ph ^= 1u;
          }
        }
      }
    }
  } else {
    // ------------------------------------------------------------------ consumers
    setmaxnreg_inc<232>();
    const int c = wg - 1;                       // consumer index 0/1
    const int tid = (int)(threadIdx.x & 127u);  // thread within the warpgroup
    const float sab = (p.scale_a ? p.scale_a[0] : 1.0f) * (p.scale_b ? p.scale_b[0] : 1.0f);
    const bool vec_ok = (p.ldc & 1LL) == 0;

    // Descriptor of stage 0, this consumer's first m64 block, k slice 0.
    const int row_off = Cfg::kPingpong ? 0 : c * Cfg::kWgM;
    const unsigned long long da0 = make_desc_kmajor<SWIZZLE_128B>(sA + row_off * Cfg::kBK);
    const unsigned long long db0 = make_desc_kmajor<SWIZZLE_128B>(sB);

    float acc[Cfg::kMBlocks][BN / 2];
    float tmp[Cfg::kPromote ? Cfg::kMBlocks : 1][Cfg::kPromote ? BN / 2 : 1];
#pragma unroll
    for (int mb = 0; mb < Cfg::kMBlocks; ++mb) acc_fill<BN>(acc[mb], 0.0f);
    if constexpr (Cfg::kPromote) {
#pragma unroll
      for (int mb = 0; mb < Cfg::kMBlocks; ++mb) acc_fill<BN>(tmp[mb], 0.0f);
    }

    const int t_first = Cfg::kPingpong ? cluster_id + c * num_clusters : cluster_id;
    const int t_step = Cfg::kPingpong ? 2 * num_clusters : num_clusters;
    // k-block counter of this consumer's first tile in the CTA's stage sequence
    unsigned it = Cfg::kPingpong ? (unsigned)(c * num_kb) : 0u;
    const unsigned it_skip = Cfg::kPingpong ? (unsigned)num_kb : 0u;  // other consumer's tile

    int local = c;  // pingpong: index of this tile in the CTA's tile sequence (c, c+2, ...)
#pragma unroll 1
    for (int t = t_first; t < rs.total; t += t_step, local += 2) {
      int tm, tn;
      rs.get(t, tm, tn);
      const int m0 = (tm * CM + (int)rank) * BM + row_off;
      const int n0 = tn * BN;
      if constexpr (Cfg::kPingpong) {
        // wait until the other consumer has passed all stage waits of tile local-1
        if (local >= 1) mbar_wait(&order_bar[1 - c], (unsigned)(((local - 1) >> 1) & 1));
      }

      int prev_s = 0;
#pragma unroll 1
      for (int kb = 0; kb < num_kb; ++kb, ++it) {
        const int s = (int)(it % (unsigned)S);
        const unsigned ph = (it / (unsigned)S) & 1u;
        mbar_wait(&full_bar[s], ph);
        const unsigned long long da = desc_advance(da0, (unsigned)(s * Cfg::kABytes));
        const unsigned long long db = desc_advance(db0, (unsigned)(s * Cfg::kBBytes));
        if constexpr (Cfg::kPromote) {
#pragma unroll
          for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(tmp[mb]);
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < Cfg::kBK / 32; ++k) {
#pragma unroll
            for (int mb = 0; mb < Cfg::kMBlocks; ++mb) {
              mma_async_ss<BN, WG_E4M3, WG_E4M3>(
                  tmp[mb], desc_advance(da, (unsigned)(mb * 64 * Cfg::kBK + 32 * k)),
                  desc_advance(db, (unsigned)(32 * k)), k > 0 ? 1 : 0);
            }
          }
          wgmma_commit();
#pragma unroll
          for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(tmp[mb]);
          wgmma_wait<0>();
#pragma unroll
          for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(tmp[mb]);
          detail::release_stage<Cfg>(&empty_bar[s]);
#pragma unroll
          for (int mb = 0; mb < Cfg::kMBlocks; ++mb)
#pragma unroll
            for (int i = 0; i < BN / 2; ++i)
              acc[mb][i] = (kb == 0) ? tmp[mb][i] : acc[mb][i] + tmp[mb][i];
        } else {
#pragma unroll
          for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(acc[mb]);
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < Cfg::kBK / 32; ++k) {
#pragma unroll
            for (int mb = 0; mb < Cfg::kMBlocks; ++mb) {
              mma_async_ss<BN, WG_E4M3, WG_E4M3>(
                  acc[mb], desc_advance(da, (unsigned)(mb * 64 * Cfg::kBK + 32 * k)),
                  desc_advance(db, (unsigned)(32 * k)), (kb > 0 || k > 0) ? 1 : 0);
            }
          }
          wgmma_commit();
#pragma unroll
          for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(acc[mb]);
          // Keep one batch in flight: the previous k block's wgmmas are done after this.
          wgmma_wait<1>();
#pragma unroll
          for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(acc[mb]);
          if (kb > 0) detail::release_stage<Cfg>(&empty_bar[prev_s]);
          prev_s = s;
        }
      }
      if constexpr (Cfg::kPingpong) {
        // Every full-barrier phase of this tile has completed (warp 0 waited for all of them;
        // that the other warps may still be inside their waits does not matter).
        if (tid == 0) mbar_arrive(&order_bar[c]);
      }
      if constexpr (!Cfg::kPromote) {
        wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(acc[mb]);
        if (num_kb > 0) detail::release_stage<Cfg>(&empty_bar[prev_s]);
      }
      it += it_skip;

      // ---------------------------------------------------------------- epilogue
      const int q2 = 2 * (tid & 3);
#pragma unroll
      for (int mb = 0; mb < Cfg::kMBlocks; ++mb) {
        const int r0 = m0 + mb * 64 + acc_row(0, tid);
        float rsc[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = r0 + 8 * h;
          rsc[h] = sab * ((p.row_scale && r < p.M) ? p.row_scale[r] : 1.0f);
        }
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int col = n0 + 8 * j + q2;
          float cs0 = 1.0f, cs1 = 1.0f, b0 = 0.0f, b1 = 0.0f;
          if (p.col_scale) {
            if (col < p.N) cs0 = p.col_scale[col];
            if (col + 1 < p.N) cs1 = p.col_scale[col + 1];
          }
          if (p.bias) {
            if (col < p.N) b0 = p.bias[col];
            if (col + 1 < p.N) b1 = p.bias[col + 1];
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = r0 + 8 * h;
            if (r < p.M && col < p.N) {
              const float v0 = acc[mb][4 * j + 2 * h] * rsc[h] * cs0 + b0;
              const float v1 = acc[mb][4 * j + 2 * h + 1] * rsc[h] * cs1 + b1;
              detail::store_pair<Cfg>(p, r, col, v0, v1, vec_ok);
            }
          }
        }
      }
    }
  }

  if (CM > 1) {
    // No CTA may exit while its peer can still arrive on its barriers / multicast into it.
    __syncwarp();
    cluster_sync();
  }
}

#endif  // TJ_SM90A_ENABLED

}  // namespace dev
}  // namespace tj
