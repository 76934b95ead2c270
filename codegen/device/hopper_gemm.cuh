#pragma once
// tilejit device library: the warp-specialized TMA + wgmma GEMM main loop for sm_90a, built
// only from the hopper.cuh building blocks. The code generator (codegen/lower_gemm_sm90.cpp)
// instantiates Sm90Gemm<Cfg> in a generated kernel and writes the epilogue itself, from the
// IR ops that follow the K loop; fp8_gemm_kernel<Cfg> below is the same main loop with a
// fixed FP8 scaled-GEMM epilogue (the prototype that bench/proto measures).
//
//   D[M,N] = A[M,K] . B[N,K]^T   (fp32 accumulation in wgmma registers)
//
// A, B: K-major (row-major A MxK, row-major B NxK), e4m3/e5m2 (any pair) or bf16/f16 (both the
// same), loaded by TMA (2-D tensor maps with box {W bytes of K, rows}, W = min(BK bytes, 128),
// CU_TENSOR_MAP_SWIZZLE_<W>B, zero fill) into a kStages-deep ring of shared-memory stages
// guarded by full/empty mbarriers. A stage holds BK bytes of K of the A tile (BM rows) and of
// the B tile (BN rows), each as BK/W column blocks of [rows][W bytes]. One wgmma consumes 32
// bytes of K (k32 for fp8, k16 for 16-bit types).
//
// Warp specialization: 384 threads = 3 warpgroups. WG0 = producer (setmaxnreg.dec<40>, one
// thread issues TMA), WG1/WG2 = consumers (setmaxnreg.inc<232>).
//   cooperative (kPingpong = false): a tile is BM x BN with BM = 2 * kWgM; consumer c computes
//     rows [c*kWgM, (c+1)*kWgM) of every tile; both consume every stage.
//   pingpong (kPingpong = true): a tile is BM x BN with BM = kWgM; consumer c takes every other
//     tile of the CTA's sequence, so one consumer's epilogue overlaps the other's main loop.
// Persistent: any grid that is a multiple of kClusterM works (typically the number of clusters
// that fit at once); cluster tiles ((kClusterM * BM) x BN) are visited in a grouped raster
// order (group_m cluster-tile rows per group, for L2 reuse). kClusterM = 2: the two CTAs of a
// cluster share the B tile; each loads half of it and multicasts it to both.
// kPromote (the tensor core's FP8 accumulation keeps fewer bits than fp32): P > 0 = accumulate
// P stages' K blocks (P * BK elements of K) in a separate register tile, then wait for it and
// add it into the fp32 accumulator (like cuBLASLt without fast accumulation); twice the
// registers. P = 1 waits for the tensor cores at every stage; larger P waits every P stages
// (CUTLASS's "promotion interval") and keeps a stage in flight in between; cooperative
// consumers promote at staggered K blocks (consumer 1 first after P/2 stages).
//
// Use (every thread of the block runs this):
//   tj::dev::Sm90Gemm<Cfg> g;
//   g.init(smem, tj::dev::GemmProblem{M, N, K, group_m});   // M, N: tile loops; K: the K loop
//   if (g.is_producer()) {
//     g.produce(&tma_a, &tma_b);
//   } else {
//     g.consumer_begin();
//     float acc[Cfg::kMBlocks][Cfg::kBN / 2];
//     g.zero(acc);
//     g.consume(acc, [&] {   // once per tile, after its K loop:
//       // epilogue: acc[mb][i] is D[g.m0 + 64*mb + acc_row(i, g.tid)][g.n0 + acc_col(i, g.tid)]
//     });                    // (or: for (; g.tile_valid(); g.next_tile()) { g.mainloop(acc); ... })
//   }
//   g.finish();
//
// Host side: tensor maps as above (box rows: Cfg::kABoxRows for A, Cfg::kBBoxRows for B),
// launch with cluster dims (kClusterM, 1, 1), 384 threads, dynamic shared memory
// Cfg::kSmemBytes; see bench/proto/fp8_gemm_proto.cu and runtime/jit.cpp.

#include "gemm_common.cuh"
#include "hopper.cuh"

namespace tj {
namespace dev {

enum GemmOutType : int { GEMM_OUT_BF16 = 0, GEMM_OUT_F32 = 1 };

// The problem the main loop walks: tiles over [0, M) x [0, N), K blocks over [0, K).
struct GemmProblem {
  int M, N, K;
  int group_m;             // raster group height in cluster tiles (>= 1)
};

template <int kTA_, int kTB_, int kBM_, int kBN_, int kBKBytes_, int kStages_, bool kPingpong_,
          int kClusterM_, int kPromote_>
struct Sm90GemmCfg {
  static constexpr int kTA = kTA_;            // WgType of A and of B
  static constexpr int kTB = kTB_;
  static constexpr bool kFp8 = kTA == WG_E4M3 || kTA == WG_E5M2;
  static constexpr int kElemBytes = kFp8 ? 1 : 2;
  static constexpr int kBM = kBM_;            // tile rows (the whole CTA's tile)
  static constexpr int kBN = kBN_;            // tile columns: multiple of 16, <= 256
  static constexpr int kStages = kStages_;
  static constexpr bool kPingpong = kPingpong_;
  static constexpr int kClusterM = kClusterM_;  // 1 or 2 (B multicast)
  static constexpr int kPromote = kPromote_;   // promotion interval in stages; 0: none

  static constexpr int kWgM = kPingpong ? kBM : kBM / 2;  // rows per consumer warpgroup
  static constexpr int kBK = kBKBytes_;       // K bytes per stage
  static constexpr int kSwzBytes = kBK < 128 ? kBK : 128;  // W: one swizzle row
  static constexpr int kSwizzle =
      kSwzBytes == 128 ? SWIZZLE_128B : kSwzBytes == 64 ? SWIZZLE_64B : SWIZZLE_32B;
  static constexpr int kKBlocks = kBK / kSwzBytes;         // column blocks per stage
  static constexpr int kBKElems = kBK / kElemBytes;        // K elements per stage
  static constexpr int kSwzElems = kSwzBytes / kElemBytes; // TMA box inner extent (elements)
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

  static_assert(kFp8 == (kTB == WG_E4M3 || kTB == WG_E5M2), "A and B: both fp8 or both 16-bit");
  static_assert(kFp8 || kTA == kTB, "16-bit wgmma needs A and B of the same type");
  static_assert(kWgM == 64 || kWgM == 128, "rows per consumer warpgroup must be 64 or 128");
  static_assert(kBN % 16 == 0 && kBN >= 16 && kBN <= 256, "BN: multiple of 16 in [16, 256]");
  static_assert(kBK == 32 || kBK == 64 || kBK == 128 || kBK == 256 || kBK == 512,
                "BK bytes: 32, 64, 128, 256 or 512");
  static_assert(kClusterM == 1 || kClusterM == 2, "kClusterM must be 1 or 2");
  static_assert(kBBoxRows % 8 == 0, "B half tile must be a multiple of 8 rows");
  static_assert(kPromote >= 0 && kPromote <= 16, "kPromote: 0 (off) or a promotion interval in stages");
  static_assert(kAccRegs * (kPromote ? 2 : 1) <= 192, "accumulators exceed the register budget");
  static_assert(kStages >= 1, "at least one stage");
  static_assert(kSmemBytes <= 232448, "shared memory exceeds 227 KB");
};

// The prototype's FP8 configuration (e4m3 x e4m3, 128-byte K blocks): kWgM rows per consumer.
template <int kWgM_, int kBN_, int kStages_, bool kPingpong_, int kClusterM_, bool kPromote_,
          int kOut_>
struct Fp8GemmCfg : Sm90GemmCfg<WG_E4M3, WG_E4M3, kPingpong_ ? kWgM_ : 2 * kWgM_, kBN_, 128,
                                kStages_, kPingpong_, kClusterM_, kPromote_> {
  static constexpr int kOut = kOut_;
};

#if TJ_SM90A_ENABLED

template <class Cfg>
struct Sm90Gemm {
  static constexpr int S = Cfg::kStages;
  static constexpr int BN = Cfg::kBN;
  static constexpr int BM = Cfg::kBM;
  static constexpr int CM = Cfg::kClusterM;
  static constexpr int W = Cfg::kSwzBytes;

  unsigned char* sA;                 // [S][kKBlocks][BM][W]
  unsigned char* sB;                 // [S][kKBlocks][BN][W]
  unsigned long long* full_bar;
  unsigned long long* empty_bar;
  // Pingpong only: order_bar[c] completes a phase when consumer c has passed every full-barrier
  // wait of its current tile. The other consumer waits for it before its next tile, so that
  // the two never wait on the same stage barrier more than one phase apart (parity waits
  // cannot tell phase r from r+2) -- and it serializes their main loops, as intended.
  unsigned long long* order_bar;
  // Past the barriers, 16-byte aligned: what the launch allocates beyond Cfg::kSmemBytes (the
  // generated epilogue's output staging buffers, gemm_common.cuh).
  unsigned char* scratch;
  TileRaster rs;
  int num_kb;
  int cluster_id, num_clusters;
  int wg;
  unsigned rank;
  // consumer state
  int c;           // consumer index 0/1
  int tid;         // thread within the warpgroup (0..127)
  int t, t_step;   // current cluster tile, step to the next one
  int local;       // pingpong: index of this tile in the CTA's tile sequence (c, c+2, ...)
  unsigned it;     // k-block counter of this consumer in the CTA's stage sequence
  // kPromote: the partial sums of the current promotion interval (the wgmma accumulators).
  float part[Cfg::kPromote ? Cfg::kMBlocks : 1][Cfg::kPromote ? BN / 2 : 1];
  int m0, n0;      // this consumer's current rows start at m0 (its first row), columns at n0

  // Every thread of the block: carve shared memory, init the barriers, synchronize.
  __device__ __forceinline__ void init(unsigned char* smem_raw, const GemmProblem& p) {
    // 1024-byte alignment for the 128B swizzle (the descriptor's base offset is 0).
    const unsigned raw_addr = smem_u32(smem_raw);
    unsigned char* smem = smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
    sA = smem;
    sB = smem + S * Cfg::kABytes;
    full_bar = reinterpret_cast<unsigned long long*>(smem + S * Cfg::kStageBytes);
    empty_bar = full_bar + S;
    order_bar = empty_bar + S;
    scratch = smem + ((S * Cfg::kStageBytes + (2 * S + 2) * 8 + 15) & ~15);
    wg = warpgroup_idx();
    rank = (CM > 1) ? cluster_ctarank() : 0u;
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
    const int tiles_m_cta = (p.M + BM - 1) / BM;
    rs.tiles_m = (tiles_m_cta + CM - 1) / CM;
    rs.tiles_n = (p.N + BN - 1) / BN;
    rs.total = rs.tiles_m * rs.tiles_n;
    rs.group_m = p.group_m < 1 ? 1 : p.group_m;
    num_kb = (p.K + Cfg::kBKElems - 1) / Cfg::kBKElems;
    // Hide a compile-time K (static shapes) from the optimizer: it would unroll the K loops
    // whole (e.g. 64 copies of the promote loop), ignoring `#pragma unroll 1`.
    asm volatile("mov.b32 %0, %0;" : "+r"(num_kb));
    cluster_id = blockIdx.x / CM;
    num_clusters = gridDim.x / CM;
  }

  __device__ __forceinline__ bool is_producer() const { return wg == 0; }

  // Warpgroup 0: one thread streams A and B tiles into the stage ring.
  __device__ __forceinline__ void produce(const TmaDescriptor* tma_a, const TmaDescriptor* tma_b) {
    setmaxnreg_dec<40>();
    if (warp_idx_in_warpgroup() == 0 && lane_id() == 0) {
      prefetch_tma_descriptor(tma_a);
      prefetch_tma_descriptor(tma_b);
      int s = 0;
      unsigned ph = 0;
#pragma unroll 1
      for (int tt = cluster_id; tt < rs.total; tt += num_clusters) {
        int tm, tn;
        rs.get(tt, tm, tn);
        const int tile_m0 = (tm * CM + (int)rank) * BM;
        const int tile_n0 = tn * BN;
#pragma unroll 1
        for (int kb = 0; kb < num_kb; ++kb) {
          mbar_wait(&empty_bar[s], ph ^ 1u);
          mbar_arrive_expect_tx(&full_bar[s], (unsigned)Cfg::kStageBytes);
#pragma unroll
          for (int cb = 0; cb < Cfg::kKBlocks; ++cb) {
            const int kc = kb * Cfg::kBKElems + cb * Cfg::kSwzElems;
            tma_load_2d(sA + s * Cfg::kABytes + cb * (BM * W), tma_a, &full_bar[s], kc, tile_m0);
            if (CM == 1) {
              tma_load_2d(sB + s * Cfg::kBBytes + cb * (BN * W), tma_b, &full_bar[s], kc, tile_n0);
            } else {
              tma_load_2d_multicast(sB + s * Cfg::kBBytes + cb * (BN * W) +
                                        rank * (Cfg::kBBoxRows * W),
                                    tma_b, &full_bar[s], kc, tile_n0 + (int)rank * Cfg::kBBoxRows,
                                    (unsigned short)((1u << CM) - 1u));
            }
          }
          if (++s == S) {
            s = 0;
            ph ^= 1u;
          }
        }
      }
    }
  }

  __device__ __forceinline__ void set_tile() {
    if (t < rs.total) {
      int tm, tn;
      rs.get(t, tm, tn);
      m0 = (tm * CM + (int)rank) * BM + (Cfg::kPingpong ? 0 : c * Cfg::kWgM);
      n0 = tn * BN;
    }
  }

  // Warpgroups 1 and 2: take the register budget and the first tile.
  __device__ __forceinline__ void consumer_begin() {
    setmaxnreg_inc<232>();
    c = wg - 1;
    tid = (int)(threadIdx.x & 127u);
    t = Cfg::kPingpong ? cluster_id + c * num_clusters : cluster_id;
    t_step = Cfg::kPingpong ? 2 * num_clusters : num_clusters;
    it = Cfg::kPingpong ? (unsigned)(c * num_kb) : 0u;
    local = c;
    set_tile();
  }
  __device__ __forceinline__ bool tile_valid() const { return t < rs.total; }
  __device__ __forceinline__ void next_tile() {
    t += t_step;
    local += 2;
    set_tile();
  }

  __device__ __forceinline__ void zero(float (&acc)[Cfg::kMBlocks][BN / 2]) {
#pragma unroll
    for (int mb = 0; mb < Cfg::kMBlocks; ++mb) acc_fill<BN>(acc[mb], 0.0f);
  }

  __device__ __forceinline__ void release_stage(unsigned long long* bar) {
    if ((threadIdx.x & 31u) == 0u) {
      if (CM == 1) {
        mbar_arrive(bar);
      } else {
#pragma unroll
        for (int r = 0; r < CM; ++r) mbar_arrive_cluster(bar, (unsigned)r);
      }
    }
  }

  // One K step (32 bytes of K) of every m64 block: offsets inside the stage's column blocks.
  static __device__ __forceinline__ unsigned a_koff(int kk) {
    return (unsigned)(((32 * kk) / W) * (BM * W) + (32 * kk) % W);
  }
  static __device__ __forceinline__ unsigned b_koff(int kk) {
    return (unsigned)(((32 * kk) / W) * (BN * W) + (32 * kk) % W);
  }

  static __device__ __forceinline__ void advance_stage(unsigned& s, unsigned& ph) {
    if (++s == (unsigned)S) {
      s = 0;
      ph ^= 1u;
    }
  }

  // One stage's wgmmas into t (fresh: the first overwrites t instead of adding), committed as
  // one batch.
  __device__ __forceinline__ void issue_batch(float (&t)[Cfg::kMBlocks][BN / 2], unsigned s,
                                              unsigned long long da0, unsigned long long db0,
                                              bool fresh) {
    constexpr int TA = Cfg::kTA, TB = Cfg::kTB;
    const unsigned long long da = desc_advance(da0, s * (unsigned)Cfg::kABytes);
    const unsigned long long db = desc_advance(db0, s * (unsigned)Cfg::kBBytes);
#pragma unroll
    for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(t[mb]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kBK / 32; ++kk) {
#pragma unroll
      for (int mb = 0; mb < Cfg::kMBlocks; ++mb) {
        mma_async_ss<BN, TA, TB>(t[mb], desc_advance(da, (unsigned)(mb * 64 * W) + a_koff(kk)),
                                 desc_advance(db, b_koff(kk)), (!fresh || kk > 0) ? 1 : 0);
      }
    }
    wgmma_commit();
#pragma unroll
    for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(t[mb]);
  }

  // kPromote: the current tile's first K block into `part`, from the stage (s, ph) of K block `it`.
  __device__ __forceinline__ void issue_first_kblock(unsigned& s, unsigned& ph, unsigned long long da0,
                                                     unsigned long long db0) {
    s = it % (unsigned)S;
    ph = (it / (unsigned)S) & 1u;
    mbar_wait(&full_bar[s], ph);
    issue_batch(part, s, da0, db0, true);
  }

  // The promoted K loop of the current tile (kPromote > 0): its first K block is already in
  // flight in `part`, issued from stage (s, ph); on return (s, ph) is the next K block's stage.
  // P = kPromote stages accumulate in part (fresh at each interval's first stage) with one
  // batch kept in flight, then part is added into acc once every wgmma is done. (The reads of
  // part sit after an inner loop, where ptxas can see that no wgmma is in flight; reading it
  // inside the K loop makes ptxas serialize every wgmma, C7514.) The loop is software-pipelined
  // so that only the adds sit between an interval's drain and the next interval's issue: the
  // next stage's barrier is tested while the tensor cores still work.
  // Cooperative consumers share every stage, so if both promoted at the same K block the
  // tensor cores would idle while both drain and add. Consumer 1's first interval is half as
  // long: from then on one consumer's drain overlaps the other's wgmmas in flight.
  __device__ __forceinline__ void promoted_kloop(float (&acc)[Cfg::kMBlocks][BN / 2], unsigned& s, unsigned& ph,
                                                 unsigned long long da0, unsigned long long db0) {
    const int first_len = (!Cfg::kPingpong && Cfg::kPromote >= 2 && c == 1) ? Cfg::kPromote / 2 : Cfg::kPromote;
    // acc starts at 0 so that a promotion is one FADD per register: a select for the first
    // interval doubled the instruction stream, which holds the other consumer's wgmma issue
    // on the same SM sub-partitions.
    zero(acc);
#pragma unroll 1
    for (int kb0 = 0;;) {   // one promotion interval per iteration; its first K block is in flight
      const int len = kb0 == 0 ? first_len : Cfg::kPromote;
      const int kend = kb0 + len < num_kb ? kb0 + len : num_kb;
      unsigned cur = s;
      advance_stage(s, ph);
#pragma unroll 1
      for (int kb = kb0 + 1; kb < kend; ++kb) {
        mbar_wait(&full_bar[s], ph);
        issue_batch(part, s, da0, db0, false);
        wgmma_wait<1>();
#pragma unroll
        for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(part[mb]);
        release_stage(&empty_bar[cur]);
        cur = s;
        advance_stage(s, ph);
      }
      const bool more = kend < num_kb;
      const bool ready = more && mbar_test_wait(&full_bar[s], ph);
      wgmma_wait<0>();
#pragma unroll
      for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(part[mb]);
      release_stage(&empty_bar[cur]);
#pragma unroll
      for (int mb = 0; mb < Cfg::kMBlocks; ++mb)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i)
          acc[mb][i] += part[mb][i];
      if (!more) break;
      if (!ready) mbar_wait(&full_bar[s], ph);
      issue_batch(part, s, da0, db0, true);
      kb0 = kend;
    }
    it += (unsigned)num_kb;
  }

  // Shared-memory descriptors of stage 0, this consumer's first m64 block, k slice 0.
  __device__ __forceinline__ unsigned long long desc_a0() const {
    return make_desc_kmajor<Cfg::kSwizzle>(sA + (Cfg::kPingpong ? 0 : c * Cfg::kWgM) * W);
  }
  __device__ __forceinline__ unsigned long long desc_b0() const { return make_desc_kmajor<Cfg::kSwizzle>(sB); }

  // Every tile of this consumer: the K loop into acc, then epilogue() (which reads acc, m0, n0).
  // Cooperative with promotion, the next tile's first K block is issued into `part` before the
  // epilogue, so the tensor cores work through it (acc alone holds the finished tile). The
  // epilogue is written twice, after the last tile and with `part` in flight: where the two
  // paths merged, ptxas waited for the wgmmas (C7517) before the epilogue.
  template <class Epilogue>
  __device__ __forceinline__ void consume(float (&acc)[Cfg::kMBlocks][BN / 2], Epilogue&& epilogue) {
    if constexpr (Cfg::kPromote > 0 && !Cfg::kPingpong) {
      if (!tile_valid()) return;
      const unsigned long long da0 = desc_a0(), db0 = desc_b0();
      unsigned s, ph;
      issue_first_kblock(s, ph, da0, db0);
#pragma unroll 1
      for (;;) {
        promoted_kloop(acc, s, ph, da0, db0);
        if (t + t_step >= rs.total) {
          epilogue();
          break;
        }
        mbar_wait(&full_bar[s], ph);
        issue_batch(part, s, da0, db0, true);
        epilogue();   // a second copy: merged with the path above, ptxas drained part first
        next_tile();
      }
    } else {
#pragma unroll 1
      for (; tile_valid(); next_tile()) {
        mainloop(acc);
        epilogue();
      }
    }
  }

  // The K loop of the current tile: acc = A[m0.., :] . B[n0.., :]^T.
  __device__ __forceinline__ void mainloop(float (&acc)[Cfg::kMBlocks][BN / 2]) {
    constexpr int TA = Cfg::kTA, TB = Cfg::kTB;
    if constexpr (Cfg::kPingpong) {
      // wait until the other consumer has passed all stage waits of tile local-1
      if (local >= 1) mbar_wait(&order_bar[1 - c], (unsigned)(((local - 1) >> 1) & 1));
    }
    const unsigned long long da0 = desc_a0(), db0 = desc_b0();
    int prev_s = 0;
    if constexpr (Cfg::kPromote) {
      unsigned s, ph;
      issue_first_kblock(s, ph, da0, db0);
      promoted_kloop(acc, s, ph, da0, db0);
    }
#pragma unroll 1
    for (int kb = 0; kb < (Cfg::kPromote ? 0 : num_kb); ++kb, ++it) {
      const int s = (int)(it % (unsigned)S);
      const unsigned ph = (it / (unsigned)S) & 1u;
      mbar_wait(&full_bar[s], ph);
      if constexpr (Cfg::kPromote == 0) {
        issue_batch(acc, (unsigned)s, da0, db0, kb == 0);
        // Keep one batch in flight: the previous k block's wgmmas are done after this.
        wgmma_wait<1>();
#pragma unroll
        for (int mb = 0; mb < Cfg::kMBlocks; ++mb) fence_acc<BN / 2>(acc[mb]);
        if (kb > 0) release_stage(&empty_bar[prev_s]);
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
      if (num_kb > 0) release_stage(&empty_bar[prev_s]);
    }
    (void)prev_s;
    // (K = 0 never gets here: a tensor map cannot describe an empty dimension.)
    if constexpr (Cfg::kPingpong) it += (unsigned)num_kb;   // the other consumer's tile
  }

  // Every thread of the block, at the end.
  __device__ __forceinline__ void finish() {
    if (CM > 1) {
      // No CTA may exit while its peer can still arrive on its barriers / multicast into it.
      __syncwarp();
      cluster_sync();
    }
  }
};

#endif  // TJ_SM90A_ENABLED

// ------------------------------------------------------------------ the prototype kernel
//   C[M,N] = (A[M,K] . B[N,K]^T) * scale_a * scale_b * row_scale[m] * col_scale[n] + bias[n]
// A, B e4m3, output bf16 or f32, row-major with leading dimension ldc; masked for M/N tails.
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

namespace detail {

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
  constexpr int BN = Cfg::kBN;
  extern __shared__ unsigned char smem_raw[];
  Sm90Gemm<Cfg> g;
  GemmProblem prob;
  prob.M = p.M;
  prob.N = p.N;
  prob.K = p.K;
  prob.group_m = p.group_m;
  g.init(smem_raw, prob);
  if (g.is_producer()) {
    g.produce(&tma_a, &tma_b);
  } else {
    g.consumer_begin();
    const float sab = (p.scale_a ? p.scale_a[0] : 1.0f) * (p.scale_b ? p.scale_b[0] : 1.0f);
    const bool vec_ok = (p.ldc & 1LL) == 0;
    float acc[Cfg::kMBlocks][BN / 2];
    g.zero(acc);
#pragma unroll 1
    for (; g.tile_valid(); g.next_tile()) {
      g.mainloop(acc);
      // ---------------------------------------------------------------- epilogue
      const int tid = g.tid;
      const int q2 = 2 * (tid & 3);
#pragma unroll
      for (int mb = 0; mb < Cfg::kMBlocks; ++mb) {
        const int r0 = g.m0 + mb * 64 + acc_row(0, tid);
        float rsc[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = r0 + 8 * h;
          rsc[h] = sab * ((p.row_scale && r < p.M) ? p.row_scale[r] : 1.0f);
        }
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int col = g.n0 + 8 * j + q2;
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
  g.finish();
}

#endif  // TJ_SM90A_ENABLED

}  // namespace dev
}  // namespace tj
