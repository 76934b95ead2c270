#pragma once
// tilejit device library: Hopper (sm_90a) building blocks for `dot` and its pipelines.
//
//   mbarrier      mbar_init / mbar_arrive / mbar_arrive_expect_tx / mbar_try_wait / mbar_test_wait / mbar_wait / mbar_wait_sleep ...
//   TMA           TmaDescriptor, prefetch_tma_descriptor, tma_load_{2,3,4,5}d (+ multicast,
//                 + L2 hint), tma_store_{2,3,4,5}d, tma_store_commit / tma_store_wait<N>
//   cluster       cluster_ctarank, cluster_sync, mbar_arrive_cluster
//   wgmma         make_smem_desc / make_desc_kmajor / make_desc_mnmajor, desc_advance,
//                 wgmma_fence / wgmma_commit / wgmma_wait<N>, mma_async_ss / mma_async_rs
//                 (hopper_wgmma.cuh), fence_acc
//   registers     setmaxnreg_inc<R> / setmaxnreg_dec<R>
//   matrices      ldmatrix_x4_trans / stmatrix_x4 (8 x 8 16-bit matrices, shared memory)
//   fragments     acc_row / acc_col, acc_row_max / acc_row_sum, quad_allreduce_*, acc_scale_rows
//                 (frag.cuh: acc_to_a_bf16 / acc_to_a_f16 / acc_to_a_fp8 / acc_to_a_fp8_kperm /
//                 acc_to_a_fp8_keys_by_parity; swizzle.cuh: SmemSwizzle, swizzle_offset)
//
// Compiled by NVRTC with no CUDA toolkit header, and by nvcc -std=c++17. The sm_90 parts only
// exist when compiling for __CUDA_ARCH__ >= 900 (wgmma and setmaxnreg: sm_90a only), and in
// nvcc's host pass (declarations only), so including this file never breaks an sm_80 build;
// using an sm_90 function from sm_80 device code is a compile error (undeclared), on purpose.
// The fragment helpers at the end are plain arithmetic and shuffles: available everywhere.
//
// Shared-memory operand conventions used by the descriptors (see make_desc_kmajor):
//   K-major, swizzle W in {128, 64, 32} bytes: a tile of R rows (M or N) is stored as R rows of W
//   bytes (rows at W-byte stride, 8-row groups at 8*W), 16-byte chunks XOR-swizzled by the
//   address bits exactly as TMA's CU_TENSOR_MAP_SWIZZLE_{128,64,32}B writes them. The tile base
//   must be aligned to 8*W bytes (1024 for 128B) so the swizzle phase is 0 (base_offset = 0).
//   One wgmma consumes 32 bytes of K (k32 fp8, k16 bf16/f16); the k-th 32-byte slice of a row
//   is selected by desc_advance(desc, 32 * k). If the tile's K extent exceeds W, further
//   W-byte column blocks follow as separate [R][W] blocks (what a TMA box of W bytes gives).

#include "fp8.cuh"
#include "tile.cuh"   // griddep_wait / griddep_launch_dependents
#include "hopper_wgmma.cuh"
#include "swizzle.cuh"   // SmemSwizzle, swizzle_offset
#include "frag.cuh"   // acc_to_a_bf16 / acc_to_a_f16 / acc_to_a_fp8, byte_perm

#if !defined(__CUDA_ARCH__) || (__CUDA_ARCH__ >= 900)
#define TJ_SM90_ENABLED 1
#else
#define TJ_SM90_ENABLED 0
#endif
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TJ_SM90A_ENABLED 1
#else
#define TJ_SM90A_ENABLED 0
#endif

namespace tj {
namespace dev {

// Opaque 128-byte TMA descriptor, layout-compatible with CUtensorMap (alignas(64)). Pass it to a
// kernel as `const __grid_constant__ TmaDescriptor` and hand its address to the tma_* functions.
struct alignas(64) TmaDescriptor {
  unsigned long long data[16];
};

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31u; }
// Warp-uniform warpgroup index of this thread in a 1-D block (broadcast from lane 0 so the
// compiler knows it is uniform).
__device__ __forceinline__ int warpgroup_idx() {
  return __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128u), 0);
}
__device__ __forceinline__ int warp_idx_in_warpgroup() {
  return __shfl_sync(0xffffffffu, (int)((threadIdx.x / 32u) & 3u), 0);
}

#if TJ_SM90_ENABLED
// ------------------------------------------------------------------------------- misc sm_90
// One lane of the warp returns true (elect.sync); all 32 lanes must call it.
__device__ __forceinline__ bool elect_one_sync() {
  unsigned pred = 0;
  asm volatile(
      "{\n.reg .b32 r;\n.reg .pred p;\n"
      "elect.sync r|p, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(pred));
  return pred != 0u;
}

// ------------------------------------------------------------------------------- mbarrier
// All mbarrier functions take a pointer to a 64-bit barrier object in shared memory.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned arrive_count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrive_count)
               : "memory");
}
__device__ __forceinline__ void mbar_inval(unsigned long long* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Makes mbarrier.init visible to the other threads / the async proxy / the cluster. Call after
// the inits, before the __syncthreads() (or cluster_sync()) that publishes them.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Orders this thread's generic-proxy shared-memory accesses with later async-proxy ones (TMA
// store from smem written by threads; wgmma reading smem written by threads).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile(
      "{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar))
      : "memory");
}
// Arrive and add `tx_bytes` to the expected transaction count of the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned tx_bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(tx_bytes)
               : "memory");
}
// Add expected transaction bytes without arriving.
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned tx_bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(tx_bytes)
               : "memory");
}
// Arrive on the barrier at the same shared-memory offset in CTA `cta_rank` of this cluster
// (may be this CTA). Default (.release.cta) semantics, as CUTLASS's ClusterBarrier uses: enough
// to release a pipeline stage whose readers were wgmma/TMA (already complete), and cheap (a
// plain SYNCS.ARRIVE). Use mbar_arrive_cluster_release when the peer must see this thread's
// ordinary memory writes: that one costs a MEMBAR.ALL.GPU.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned long long* bar, unsigned cta_rank) {
  asm volatile(
      "{\n.reg .b32 ra;\n"
      "mapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(bar)),
      "r"(cta_rank)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive_cluster_release(unsigned long long* bar,
                                                            unsigned cta_rank) {
  asm volatile(
      "{\n.reg .b32 ra;\n"
      "mapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(bar)),
      "r"(cta_rank)
      : "memory");
}
// One parity probe per PTX instruction below, all of the same shape: the predicate comes back as
// 0/1 (an asm output cannot be a predicate).
#define TJ_MBAR_PROBE(NAME, INSTR)                                              \
  __device__ __forceinline__ bool NAME(unsigned long long* bar, unsigned phase) { \
    unsigned ok;                                                                \
    asm volatile("{\n.reg .pred p;\n" INSTR " p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n" \
                 : "=r"(ok)                                                     \
                 : "r"(smem_u32(bar)), "r"(phase)                               \
                 : "memory");                                                   \
    return ok != 0u;                                                            \
  }
// True once the phase with parity `phase` (0/1) has completed. Waiting for parity 1 on a freshly
// initialized barrier returns true at once (the "previous" phase counts as complete).
TJ_MBAR_PROBE(mbar_try_wait, "mbarrier.try_wait.parity.shared::cta.b64")
// Non-blocking: whether that phase has completed now (try_wait may suspend the thread a while).
TJ_MBAR_PROBE(mbar_test_wait, "mbarrier.test_wait.parity.shared::cta.b64")
// Same as mbar_try_wait with acquire at cluster scope (the arrivals came from other CTAs).
TJ_MBAR_PROBE(mbar_try_wait_cluster, "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64")
#undef TJ_MBAR_PROBE
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned phase) {
  while (!mbar_try_wait(bar, phase)) {
  }
}
// A wait expected to be long (a producer's for a free ring slot, which comes when the consumers
// are done with it, a whole iteration of theirs later): try_wait with a suspend-time hint, so
// that the thread sleeps until the phase completes instead of polling again every few dozen
// cycles; a polling warp takes issue slots from the consumer warps on its scheduler (H200, ncu:
// the README attention's producer polled 6.5M times, 7% of the kernel's warp instructions).
__device__ __forceinline__ void mbar_wait_sleep(unsigned long long* bar, unsigned phase) {
  unsigned ok;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(smem_u32(bar)), "r"(phase), "n"(1000000)
        : "memory");
  } while (ok == 0u);
}
__device__ __forceinline__ void mbar_wait_cluster(unsigned long long* bar, unsigned phase) {
  while (!mbar_try_wait_cluster(bar, phase)) {
  }
}

// ------------------------------------------------------------------------------- cluster
__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_nctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
// All threads of all CTAs of the cluster (aligned: every thread of each warp calls it).
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}

// ------------------------------------------------------------------------------- TMA
__device__ __forceinline__ void prefetch_tma_descriptor(const TmaDescriptor* desc) {
  asm volatile("prefetch.tensormap [%0];" ::"l"((unsigned long long)desc) : "memory");
}
// L2 cache policies for the *_hint loads.
__device__ __forceinline__ unsigned long long l2_policy_evict_first() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ unsigned long long l2_policy_evict_last() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// Tensor loads global -> shared::cluster (this CTA's smem), completing `tx` bytes on `bar`.
// Coordinates are element indices, innermost dimension first (c0 is the contiguous one);
// out-of-bounds elements of the box are filled with zeros and still count as transferred bytes.
#define TJ_TMA_LOAD_BODY(DIM, COORDS, ...)                                                      \
  asm volatile("cp.async.bulk.tensor." #DIM                                                    \
               "d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {" COORDS     \
               "}], [%2];" ::"r"(smem_u32(dst)),                                               \
               "l"((unsigned long long)desc), "r"(smem_u32(bar)), __VA_ARGS__                  \
               : "memory")
__device__ __forceinline__ void tma_load_2d(void* dst, const TmaDescriptor* desc,
                                            unsigned long long* bar, int c0, int c1) {
  TJ_TMA_LOAD_BODY(2, "%3, %4", "r"(c0), "r"(c1));
}
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaDescriptor* desc,
                                            unsigned long long* bar, int c0, int c1, int c2) {
  TJ_TMA_LOAD_BODY(3, "%3, %4, %5", "r"(c0), "r"(c1), "r"(c2));
}
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaDescriptor* desc,
                                            unsigned long long* bar, int c0, int c1, int c2,
                                            int c3) {
  TJ_TMA_LOAD_BODY(4, "%3, %4, %5, %6", "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}
__device__ __forceinline__ void tma_load_5d(void* dst, const TmaDescriptor* desc,
                                            unsigned long long* bar, int c0, int c1, int c2,
                                            int c3, int c4) {
  TJ_TMA_LOAD_BODY(5, "%3, %4, %5, %6, %7", "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4));
}
#undef TJ_TMA_LOAD_BODY

// Same with an L2 cache policy (l2_policy_*).
#define TJ_TMA_LOAD_HINT_BODY(DIM, COORDS, ...)                                                 \
  asm volatile("cp.async.bulk.tensor." #DIM                                                    \
               "d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "   \
               "[%1, {" COORDS "}], [%2], %3;" ::"r"(smem_u32(dst)),                           \
               "l"((unsigned long long)desc), "r"(smem_u32(bar)), "l"(policy), __VA_ARGS__     \
               : "memory")
__device__ __forceinline__ void tma_load_2d_hint(void* dst, const TmaDescriptor* desc,
                                                 unsigned long long* bar, int c0, int c1,
                                                 unsigned long long policy) {
  TJ_TMA_LOAD_HINT_BODY(2, "%4, %5", "r"(c0), "r"(c1));
}
__device__ __forceinline__ void tma_load_3d_hint(void* dst, const TmaDescriptor* desc,
                                                 unsigned long long* bar, int c0, int c1, int c2,
                                                 unsigned long long policy) {
  TJ_TMA_LOAD_HINT_BODY(3, "%4, %5, %6", "r"(c0), "r"(c1), "r"(c2));
}
__device__ __forceinline__ void tma_load_4d_hint(void* dst, const TmaDescriptor* desc,
                                                 unsigned long long* bar, int c0, int c1, int c2,
                                                 int c3, unsigned long long policy) {
  TJ_TMA_LOAD_HINT_BODY(4, "%4, %5, %6, %7", "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}
__device__ __forceinline__ void tma_load_5d_hint(void* dst, const TmaDescriptor* desc,
                                                 unsigned long long* bar, int c0, int c1, int c2,
                                                 int c3, int c4, unsigned long long policy) {
  TJ_TMA_LOAD_HINT_BODY(5, "%4, %5, %6, %7, %8", "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4));
}
#undef TJ_TMA_LOAD_HINT_BODY

// Multicast: the box lands at the same smem offset in every CTA of `cta_mask` (bit i = cluster
// rank i), and completes tx bytes on the barrier at `bar`'s offset in each of those CTAs.
#define TJ_TMA_LOAD_MC_BODY(DIM, COORDS, ...)                                                   \
  asm volatile("cp.async.bulk.tensor." #DIM                                                    \
               "d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "     \
               "[%0], [%1, {" COORDS "}], [%2], %3;" ::"r"(smem_u32(dst)),                     \
               "l"((unsigned long long)desc), "r"(smem_u32(bar)), "h"(cta_mask), __VA_ARGS__   \
               : "memory")
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const TmaDescriptor* desc,
                                                      unsigned long long* bar, int c0, int c1,
                                                      unsigned short cta_mask) {
  TJ_TMA_LOAD_MC_BODY(2, "%4, %5", "r"(c0), "r"(c1));
}
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const TmaDescriptor* desc,
                                                      unsigned long long* bar, int c0, int c1,
                                                      int c2, unsigned short cta_mask) {
  TJ_TMA_LOAD_MC_BODY(3, "%4, %5, %6", "r"(c0), "r"(c1), "r"(c2));
}
__device__ __forceinline__ void tma_load_4d_multicast(void* dst, const TmaDescriptor* desc,
                                                      unsigned long long* bar, int c0, int c1,
                                                      int c2, int c3, unsigned short cta_mask) {
  TJ_TMA_LOAD_MC_BODY(4, "%4, %5, %6, %7", "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}
__device__ __forceinline__ void tma_load_5d_multicast(void* dst, const TmaDescriptor* desc,
                                                      unsigned long long* bar, int c0, int c1,
                                                      int c2, int c3, int c4,
                                                      unsigned short cta_mask) {
  TJ_TMA_LOAD_MC_BODY(5, "%4, %5, %6, %7, %8", "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4));
}
#undef TJ_TMA_LOAD_MC_BODY

// Tensor stores shared::cta -> global (bulk async-group completion). Out-of-bounds parts of
// the box are not written. Threads that wrote `src` must fence_proxy_async_shared() and
// synchronize before one thread issues the store; then tma_store_commit() and, before `src`
// is reused, tma_store_wait<0>() (or <N> to keep N groups in flight).
#define TJ_TMA_STORE_BODY(DIM, COORDS, ...)                                                     \
  asm volatile("cp.async.bulk.tensor." #DIM "d.global.shared::cta.bulk_group [%0, {" COORDS   \
               "}], [%1];" ::"l"((unsigned long long)desc),                                    \
               "r"(smem_u32(src)), __VA_ARGS__                                                 \
               : "memory")
__device__ __forceinline__ void tma_store_2d(const TmaDescriptor* desc, const void* src, int c0,
                                             int c1) {
  TJ_TMA_STORE_BODY(2, "%2, %3", "r"(c0), "r"(c1));
}
__device__ __forceinline__ void tma_store_3d(const TmaDescriptor* desc, const void* src, int c0,
                                             int c1, int c2) {
  TJ_TMA_STORE_BODY(3, "%2, %3, %4", "r"(c0), "r"(c1), "r"(c2));
}
__device__ __forceinline__ void tma_store_4d(const TmaDescriptor* desc, const void* src, int c0,
                                             int c1, int c2, int c3) {
  TJ_TMA_STORE_BODY(4, "%2, %3, %4, %5", "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}
__device__ __forceinline__ void tma_store_5d(const TmaDescriptor* desc, const void* src, int c0,
                                             int c1, int c2, int c3, int c4) {
  TJ_TMA_STORE_BODY(5, "%2, %3, %4, %5, %6", "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4));
}
#undef TJ_TMA_STORE_BODY
__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Wait until at most N committed store groups are still reading their shared-memory source.
template <int N>
__device__ __forceinline__ void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// Wait until at most N committed store groups are incomplete (writes done, not just reads).
template <int N>
__device__ __forceinline__ void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8 x 8 matrices of 16-bit elements between shared memory and registers (sm_90 for
// stmatrix). Lanes 8i .. 8i + 7 give the shared addresses of matrix i's eight 16-byte rows; lane l
// holds register i of matrix i: row l / 4, elements 2 (l % 4), +1 (bytes 4 (l % 4) .. +3);
// ldmatrix_x4_trans: elements (2 (l % 4), l / 4) in the low half and (2 (l % 4) + 1, l / 4) in
// the high half, the matrix transposed as 16-bit elements.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void stmatrix_x4(unsigned addr, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
#endif  // TJ_SM90_ENABLED

// ------------------------------------------------------------------------------- wgmma
// Shared-memory matrix descriptor (64 bits):
//   bits  0-13 start address >> 4      bits 16-29 leading byte offset >> 4
//   bits 32-45 stride byte offset >> 4  bits 49-51 base offset (0: tile aligned to the swizzle
//   repeat)                             bits 62-63 swizzle (SmemSwizzle)
// Plain arithmetic: available on every arch (only the instructions that consume it are sm_90a).
TJ_HD unsigned long long make_smem_desc(unsigned smem_addr, int swizzle,
                                                             unsigned lbo_bytes,
                                                             unsigned sbo_bytes) {
  unsigned long long d = 0;
  d |= (unsigned long long)((smem_addr >> 4) & 0x3fffu);
  d |= (unsigned long long)((lbo_bytes >> 4) & 0x3fffu) << 16;
  d |= (unsigned long long)((sbo_bytes >> 4) & 0x3fffu) << 32;
  d |= (unsigned long long)(swizzle & 3) << 62;
  return d;
}
// K-major operand tile (A: rows = M, B: rows = N), layout described at the top of this file.
// Swizzled modes: LBO unused (encoded as 1), SBO = 8 rows * W bytes. For SWIZZLE_NONE the tile
// is made of 8x16-byte core matrices (8 rows of 16 contiguous bytes = 128 B each); pass the byte
// distance between core matrices adjacent in K (lbo) and adjacent in M/N (sbo), e.g. for a
// [R/8][Kbytes/16][8][16] layout: lbo = 128, sbo = Kbytes * 8.
template <int Swizzle>
__device__ __forceinline__ unsigned long long make_desc_kmajor(const void* tile,
                                                               unsigned lbo_none = 128u,
                                                               unsigned sbo_none = 256u) {
  unsigned a = smem_u32(tile);
  if (Swizzle == SWIZZLE_128B) return make_smem_desc(a, Swizzle, 16u, 1024u);
  if (Swizzle == SWIZZLE_64B) return make_smem_desc(a, Swizzle, 16u, 512u);
  if (Swizzle == SWIZZLE_32B) return make_smem_desc(a, Swizzle, 16u, 256u);
  return make_smem_desc(a, SWIZZLE_NONE, lbo_none, sbo_none);
}
// MN-major operand tile (16-bit types only; Trans = 1 in mma_async_*). With swizzle W, the tile
// is stored as blocks of [K rows][W bytes along M/N] (what a TMA box of W bytes x K rows gives):
// lbo = byte distance between blocks adjacent in M/N (each covers W/2 elements of M/N for
// 16-bit types), sbo = byte distance between 8-row groups along K (= 8 * W inside one block).
template <int Swizzle>
__device__ __forceinline__ unsigned long long make_desc_mnmajor(const void* tile,
                                                                unsigned lbo_bytes,
                                                                unsigned sbo_bytes) {
  return make_smem_desc(smem_u32(tile), Swizzle, lbo_bytes, sbo_bytes);
}
// Move the descriptor's start address by `bytes` (a multiple of 16), e.g. to the k-th 32-byte
// K slice of a K-major tile (desc_advance(d, 32 * k)) or to another 64-row block.
TJ_HD unsigned long long desc_advance(unsigned long long desc,
                                                           unsigned bytes) {
  return desc + (unsigned long long)(bytes >> 4);
}

#if TJ_SM90A_ENABLED
// Before the first wgmma of a batch, and whenever registers used as accumulators or A
// fragments were written by ordinary instructions since the last wgmma.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// Wait until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads/writes of accumulator registers across wgmma
// fence/commit/wait (call on the accumulator after issuing and after waiting).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(unsigned& r) {
  asm volatile("" : "+r"(r)::"memory");
}
__device__ __forceinline__ void fence_operand(unsigned long long& r) {
  asm volatile("" : "+l"(r)::"memory");
}
template <int R>
__device__ __forceinline__ void fence_acc(float* d) {
#pragma unroll
  for (int i = 0; i < R; ++i) fence_operand(d[i]);
}

// Per-warpgroup register budget (all 128 threads call it with the same value, multiple of 8,
// in [24, 256]). Typical: producer dec<40> (or <24>), two consumer warpgroups inc<232>.
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(R % 8 == 0 && R >= 24 && R <= 256, "setmaxnreg: multiple of 8 in [24,256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(R % 8 == 0 && R >= 24 && R <= 256, "setmaxnreg: multiple of 8 in [24,256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}
#endif  // TJ_SM90A_ENABLED

// ------------------------------------------------------------------------------- fragments
// The 64xN f32 accumulator of one wgmma m64nN is spread over the 128 threads of the warpgroup
// (t = thread index within the warpgroup, 0..127), N/2 registers each. Register i of thread t:
//   row = 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2)
//   col = 8 * (i / 4) + 2 * (t % 4) + (i % 2)
// So each thread holds two rows (r0 and r0 + 8: "row half" h = (i/2)%2) and, per row, pairs of
// adjacent columns every 8 columns; the 4 threads of a quad (same t/4) share the two rows.
// The same holds per warp for mma.sync m16n8 accumulators (t % 32 and rows 0..15).
TJ_HD int acc_row(int i, int t) {
  return ((t >> 5) << 4) + ((t & 31) >> 2) + (((i >> 1) & 1) << 3);
}
TJ_HD int acc_col(int i, int t) {
  return ((i >> 2) << 3) + ((t & 3) << 1) + (i & 1);
}

__device__ __forceinline__ float quad_allreduce_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  return v;
}
__device__ __forceinline__ float quad_allreduce_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}
// m[h] = max(m[h], max of the accumulator row h of this thread), reduced over the quad, so all
// four threads of a quad get the full-row maximum (over the N columns of this fragment).
template <int N>
__device__ __forceinline__ void acc_row_max(const float* d, float* m) {
  float a = m[0], b = m[1];
#pragma unroll
  for (int i = 0; i < N / 2; i += 4) {
    a = fmaxf(a, fmaxf(d[i], d[i + 1]));
    b = fmaxf(b, fmaxf(d[i + 2], d[i + 3]));
  }
  m[0] = quad_allreduce_max(a);
  m[1] = quad_allreduce_max(b);
}
// s[h] += sum of this thread's values of row h (no shuffles: reduce with quad_allreduce_sum
// once at the end, as online softmax does).
template <int N>
__device__ __forceinline__ void acc_row_sum_partial(const float* d, float* s) {
  float a = s[0], b = s[1];
#pragma unroll
  for (int i = 0; i < N / 2; i += 4) {
    a += d[i] + d[i + 1];
    b += d[i + 2] + d[i + 3];
  }
  s[0] = a;
  s[1] = b;
}
// s[h] += full-row sum (quad-reduced).
template <int N>
__device__ __forceinline__ void acc_row_sum(const float* d, float* s) {
  float p[2] = {0.0f, 0.0f};
  acc_row_sum_partial<N>(d, p);
  s[0] += quad_allreduce_sum(p[0]);
  s[1] += quad_allreduce_sum(p[1]);
}
// d[row h] *= s[h]
template <int N>
__device__ __forceinline__ void acc_scale_rows(float* d, const float* s) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] *= s[(i >> 1) & 1];
}
template <int N>
__device__ __forceinline__ void acc_fill(float* d, float v) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = v;
}

}  // namespace dev
}  // namespace tj
