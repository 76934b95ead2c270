#pragma once
// tilejit device library: the register fragments of the tensor cores' A operand, shared by
// wgmma (sm_90a) and mma.sync (sm_80 on), whose per-warp A fragments are the same: a warp's 16
// rows, 32 bytes of K per step, 4 registers per thread.
//
//   WgType                      the operand types (WG_E4M3, WG_E5M2, WG_BF16, WG_F16)
//   byte_perm                   prmt.b32
//   a_frag_regs<N, bytes>       registers of the A fragments of N columns
//   acc_to_a_bf16 / acc_to_a_f16 / acc_to_a_fp8
//                               f32 accumulator registers -> A fragments (exact)
//   fp8_kperm_col / acc_to_a_fp8_kperm
//                               the same for fp8 without shuffles, for a B operand whose K comes
//                               in that permuted order
//   fp8_pairs                   a thread's fp8 pairs of one 32-column step and row half
//   keys_by_parity_col / acc_to_a_fp8_keys_by_parity
//                               the same without shuffles for a tile whose columns hold the
//                               even keys, then the odd ones (K's rows loaded so)
//
// Plain arithmetic and shuffles: compiled for every architecture, and on the host by the
// emulated tests (tests/test_codegen_emulated.cpp), which supply the shuffles.
#include "fp8.cuh"

namespace tj {
namespace dev {

enum WgType : int { WG_E4M3 = 0, WG_E5M2 = 1, WG_BF16 = 2, WG_F16 = 3 };

// Bytes of {b, a} (a the low word) picked by the four selector nibbles of `sel` (prmt.b32's
// default mode: selectors 0-7, no sign replication).
__device__ __forceinline__ unsigned byte_perm(unsigned a, unsigned b, unsigned sel) {
#if defined(__CUDA_ARCH__)
  unsigned r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
#else
  const unsigned long long x = (unsigned long long)b << 32 | a;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((x >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
#endif
}

// f32 accumulator (64xN, as above) -> A-operand register fragments for the next wgmma (RS) with
// K = N: the accumulator's columns become A's K index. 4 registers per wgmma K step; pass a + 4*s
// to mma_async_rs for step s. a[] must hold a_frag_regs<N, element bytes>() registers:
//   16-bit (k16 steps, N/16 of them): N/4 registers (2 elements each)
//   fp8    (k32 steps, N/32 of them): N/8 registers (4 elements each)
// (A 16-bit fragment array sized N/8 -- the fp8 count -- is overrun by acc_to_a_bf16/f16: that
// was the "RS chain bf16" failure of bench/proto/hopper_unit.cu, whose buffer was a[N1 / 8].)
//
// 16-bit A fragment (m64k16), register j of thread t: row r0 + 8*(j%2), k = 2*(t%4) + 8*(j/2)
// (+0/+1 in the low/high half): exactly the accumulator's pairs, so no data moves.
template <int N, int ElemBytes>
TJ_HD constexpr int a_frag_regs() {
  static_assert(ElemBytes == 1 || ElemBytes == 2, "fp8 or 16-bit A fragments");
  return ElemBytes == 2 ? N / 4 : N / 8;
}
template <int N>
__device__ __forceinline__ void acc_to_a_bf16(const float* d, unsigned* a) {
  static_assert(N % 16 == 0, "bf16 A fragments need N % 16 == 0");
#pragma unroll
  for (int i = 0; i < N / 2; i += 2) a[i / 2] = f32x2_to_bf16x2(d[i], d[i + 1]);
}
template <int N>
__device__ __forceinline__ void acc_to_a_f16(const float* d, unsigned* a) {
  static_assert(N % 16 == 0, "f16 A fragments need N % 16 == 0");
#pragma unroll
  for (int i = 0; i < N / 2; i += 2) a[i / 2] = f32x2_to_f16x2(d[i], d[i + 1]);
}

// fp8 A fragment (m64k32), register j of thread t: row r0 + 8*(j%2), k = 4*(t%4) + 16*(j/2) + b
// for byte b. A thread's accumulator columns in one 32-column step are
// {2q, 2q+1, 8+2q, 9+2q, 16+2q, 17+2q, 24+2q, 25+2q} (q = t%4), so the exact conversion moves
// bytes across the quad: 2 shuffles per row half and K step (N/8 shuffles in all).
// x[j] = the fp8 pair (low byte first) of accumulator registers 16 c + 4 j + 2 h and its next:
// columns 8 j + 2 q, + 1 (q = lane % 4) of 32-column step c, row half h.
template <int T>
__device__ __forceinline__ void fp8_pairs(const float* d, int c, int h, unsigned (&x)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float lo = d[16 * c + 4 * j + 2 * h], hv = d[16 * c + 4 * j + 2 * h + 1];
    x[j] = (T == WG_E4M3) ? (unsigned)f32x2_to_e4m3x2(lo, hv) : (unsigned)f32x2_to_e5m2x2(lo, hv);
  }
}

// Shuffle-free fp8 conversion with a permuted K order (FA3's trick): A's k position k (within
// each 32-wide step) holds accumulator column fp8_kperm_col(k), and the permutation is the same
// for every row: thread t (q = t % 4) holds columns 2q + 8j + {0, 1} of a step and packs j = 0, 1
// as k 4q .. 4q + 3 and j = 2, 3 as k 16 + 4q .. 16 + 4q + 3, its own bytes. Correct only if the
// B operand's K index is permuted the same way (B row n, k position k must hold the element of
// true K index fp8_kperm_col(k)), e.g. when V is transposed into shared memory by the kernel
// itself (the attention template; the generic lowering's transposed copies, transpose_8bit).
TJ_HD int fp8_kperm_col(int k) {
  const int k16 = k & 15, t = k16 >> 2, b = k16 & 3;
  return (k & 16) + 8 * (b >> 1) + 2 * t + (b & 1);
}
template <int N, int T = WG_E4M3>
__device__ __forceinline__ void acc_to_a_fp8_kperm(const float* d, unsigned* a) {
  static_assert(N % 32 == 0, "fp8 A fragments need N % 32 == 0");
#pragma unroll
  for (int c = 0; c < N / 32; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      unsigned x[4];
      fp8_pairs<T>(d, c, h, x);
      a[4 * c + h] = x[0] | (x[1] << 16);
      a[4 * c + 2 + h] = x[2] | (x[3] << 16);
    }
  }
}

template <int N, int T = WG_E4M3>
__device__ __forceinline__ void acc_to_a_fp8(const float* d, unsigned* a) {
  static_assert(N % 32 == 0, "fp8 A fragments need N % 32 == 0");
  static_assert(T == WG_E4M3 || T == WG_E5M2, "fp8 type");
  const unsigned q = threadIdx.x & 3u;
  const unsigned odd = q & 1u, hi = q >> 1;
  const unsigned base = (threadIdx.x & 31u) & ~3u;
  const unsigned src1 = base + 2u * odd + hi;          // matching 1
  const unsigned src2 = base + 2u * odd + 1u - hi;     // matching 2
  // The words from quad lanes 2*(q%2) and 2*(q%2)+1 are r1, r2 (q < 2) or r2, r1 (q >= 2): the
  // byte selectors swap their operands instead of two selects per word pair.
  const unsigned sel_lo = hi ? 0x1054u : 0x5410u;
  const unsigned sel_hi = hi ? 0x3276u : 0x7632u;
#pragma unroll
  for (int c = 0; c < N / 32; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      unsigned x[4];
      fp8_pairs<T>(d, c, h, x);
      const unsigned u = x[0] | (x[2] << 16);   // columns 8*0.., 8*2.. of this thread
      const unsigned v = x[1] | (x[3] << 16);   // columns 8*1.., 8*3..
      const unsigned r1 = __shfl_sync(0xffffffffu, odd ? v : u, src1);
      const unsigned r2 = __shfl_sync(0xffffffffu, odd ? u : v, src2);
      a[4 * c + h] = byte_perm(r1, r2, sel_lo);
      a[4 * c + 2 + h] = byte_perm(r1, r2, sel_hi);
    }
  }
}

// Keys by parity: a tile whose N columns hold keys in the order even keys first, then odd
// (S = Q.K^T with K's rows loaded so: TMA with a traversal stride of 2 keys, or a copy that maps
// its rows so). Column n holds key keys_by_parity_col(n, N).
TJ_HD constexpr int keys_by_parity_col(int n, int N) { return n < N / 2 ? 2 * n : 2 * (n - N / 2) + 1; }
// Shuffle-free fp8 conversion of such a tile (P of P.V, V in its natural key order): accumulator
// columns 8 j + 2 q + e of octets j and j + N / 16 hold keys 16 j + 4 q + {0, 1, 2, 3}, exactly
// the k positions a thread's A fragment takes (lane quad position q; two F2FP and a merge per
// word, as acc_to_a_fp8_kperm). The permutation lives in K's rows instead of V's bytes.
// kF16Pairs: register i < kOdd with (i & 7) < kF16Pairs holds the f16x2 of keys i and i + kOdd
// (the attention template's exp2_f16x2).
template <int N, int T = WG_E4M3, int kF16Pairs = 0>
__device__ __forceinline__ void acc_to_a_fp8_keys_by_parity(const float* d, unsigned* a) {
  static_assert(N % 32 == 0, "fp8 A fragments need N % 32 == 0");
  static_assert(kF16Pairs == 0 || T == WG_E4M3, "f16x2 pairs convert to e4m3");
  constexpr int kOdd = 4 * (N / 16);   // register offset of the odd keys' column groups
  // register i < kOdd with (i & 7) < kF16Pairs holds the f16x2 of keys i and i + kOdd (exp2_f16x2)
  auto pack = [&](int i) -> unsigned {
    if ((i & 7) < kF16Pairs) return (unsigned)f16x2_to_e4m3x2(f32_as_u32(d[i]));
    return (T == WG_E4M3) ? (unsigned)f32x2_to_e4m3x2(d[i], d[kOdd + i]) : (unsigned)f32x2_to_e5m2x2(d[i], d[kOdd + i]);
  };
#pragma unroll
  for (int g = 0; g < N / 16; ++g) {   // 16-key group: k step g / 2, its half g % 2
#pragma unroll
    for (int h = 0; h < 2; ++h) {      // row g or g + 8 of the fragment
      const unsigned lo = pack(4 * g + 2 * h), hi = pack(4 * g + 2 * h + 1);
      a[4 * (g >> 1) + 2 * (g & 1) + h] = lo | (hi << 16);
    }
  }
}

}  // namespace dev
}  // namespace tj
