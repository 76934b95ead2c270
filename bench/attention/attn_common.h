// Shared by the attention harness translation units (bench/attention/attn_proto.cu and the
// per-group config TUs attn_configs.cu): error checks, tensor maps, the problem buffers and
// the Runner that instantiates one hopper_attention.cuh config.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "hopper_attention.cuh"

using namespace tj::dev;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__,    \
             #x);                                                                          \
      fflush(stdout);                                                                      \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)
#define CKD(x)                                                                             \
  do {                                                                                     \
    CUresult r_ = (x);                                                                     \
    if (r_ != CUDA_SUCCESS) {                                                              \
      const char* s_ = nullptr;                                                            \
      cuGetErrorString(r_, &s_);                                                           \
      printf("CU error %d (%s) at %s:%d: %s\n", (int)r_, s_ ? s_ : "?", __FILE__, __LINE__, \
             #x);                                                                          \
      fflush(stdout);                                                                      \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

static inline void sync_or_die(cudaStream_t st, const std::string& what, double timeout_s = 30.0) {
  auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    cudaError_t e = cudaStreamQuery(st);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      printf("CUDA error in %s: %s\n", what.c_str(), cudaGetErrorString(e));
      fflush(stdout);
      exit(1);
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      printf("HANG: %s did not finish within %.0f s\n", what.c_str(), timeout_s);
      fflush(stdout);
      _exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

static_assert(sizeof(TmaDescriptor) == sizeof(CUtensorMap), "TmaDescriptor size");


// ============================================================================ tensor maps
// [batch, heads, d1, d0] (d0 contiguous) as the 4-D map hopper_attention.cuh reads: dims {d0, d1,
// heads, batch}, box {b0, b1, 1, 1}.
static inline TmaDescriptor make_tma_4d(const void* base, CUtensorMapDataType dt, unsigned long long d0,
                                        unsigned long long d1, unsigned long long heads, unsigned long long batch,
                                        unsigned long long stride1_bytes, unsigned long long head_stride_bytes,
                                        unsigned b0, unsigned b1, int swizzle_bytes) {
  CUtensorMap m;
  cuuint64_t dims[4] = {d0, d1, heads, batch};
  cuuint64_t strides[3] = {stride1_bytes, head_stride_bytes, head_stride_bytes * heads};
  cuuint32_t box[4] = {b0, b1, 1, 1};
  cuuint32_t estr[4] = {1, 1, 1, 1};
  CUtensorMapSwizzle sw = swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                          : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                : CU_TENSOR_MAP_SWIZZLE_32B;
  CKD(cuTensorMapEncodeTiled(&m, dt, 4, const_cast<void*>(base), dims, strides, box, estr,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  TmaDescriptor d;
  memcpy(&d, &m, sizeof(d));
  return d;
}

// ============================================================================ problems and configs
struct Shape {
  int B, H, Sq, Skv, D;
};

enum InKind { IN_E4M3 = 0, IN_BF16 = 1, IN_F16 = 2 };

// One problem's device buffers.
struct Problem {
  Shape s;
  bool causal = false;
  int Hkv = 0;
  int Skv_pad = 0;
  unsigned short *q = nullptr, *k = nullptr, *v = nullptr;         // bf16, natural layout
  unsigned short *q16 = nullptr, *k16 = nullptr, *v16 = nullptr;   // f16 copies (lazily)
  unsigned char *q8 = nullptr, *k8 = nullptr, *vt8 = nullptr;
  float *qd = nullptr, *kd = nullptr, *vd = nullptr;
  void* out = nullptr;      // [B,H,Sq,D] up to 2 bytes per element
  float* lse = nullptr;     // [B,H,Sq]
  float* amax = nullptr;    // [1]
  float softmax_scale = 0;
  long long nq() const { return (long long)s.B * s.H * s.Sq * s.D; }
  long long nk() const { return (long long)s.B * Hkv * s.Skv * s.D; }
};

struct Runner {
  std::string name;
  int D, BN, in, out;  // in: InKind; out: AttnOutType
  bool causal, vperm;
  int smem, bm;
  std::function<std::function<void(cudaStream_t)>(Problem&, bool with_lse, float o_scale)> prepare;
};

template <class Cfg>
static Runner make_runner(const char* name) {
  Runner r;
  r.name = name;
  r.D = Cfg::kD;
  r.BN = Cfg::kBN;
  r.in = Cfg::kFp8 ? IN_E4M3 : (Cfg::kIn == WG_BF16 ? IN_BF16 : IN_F16);
  r.out = Cfg::kOut;
  r.causal = Cfg::kCausal;
  r.vperm = Cfg::kVPerm;
  r.smem = Cfg::kSmemBytes;
  r.bm = Cfg::kBM;
  r.prepare = [](Problem& P, bool with_lse, float o_scale) {
    auto kern = attn_fwd_kernel<Cfg>;
    static bool attr = false;
    if (!attr) {
      CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
      attr = true;
    }
    const Shape& s = P.s;
    const int es = Cfg::kEs;
    const unsigned long long BH = (unsigned long long)s.B * s.H;
    const void *qb, *kb, *vb;
    CUtensorMapDataType dt;
    if (Cfg::kFp8) {
      qb = P.q8;
      kb = P.k8;
      vb = P.vt8;
      dt = CU_TENSOR_MAP_DATA_TYPE_UINT8;
    } else if (Cfg::kIn == WG_BF16) {
      qb = P.q;
      kb = P.k;
      vb = P.v;
      dt = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    } else {
      qb = P.q16;
      kb = P.k16;
      vb = P.v16;
      dt = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    }
    const unsigned wq = Cfg::kWq / es;
    TmaDescriptor tq = make_tma_4d(qb, dt, s.D, s.Sq, s.H, s.B, (unsigned long long)s.D * es,
                                   (unsigned long long)s.Sq * s.D * es, wq, Cfg::kBM, Cfg::kWq);
    TmaDescriptor tk = make_tma_4d(kb, dt, s.D, s.Skv, P.Hkv, s.B, (unsigned long long)s.D * es,
                                   (unsigned long long)s.Skv * s.D * es, wq, Cfg::kBN, Cfg::kWq);
    TmaDescriptor tv;
    if (Cfg::kFp8)
      tv = make_tma_4d(vb, dt, Cfg::kVPerm ? P.Skv_pad : s.Skv, s.D, P.Hkv, s.B, (unsigned long long)P.Skv_pad,
                       (unsigned long long)s.D * P.Skv_pad, Cfg::kWv, s.D, Cfg::kWv);
    else
      tv = make_tma_4d(vb, dt, s.D, s.Skv, P.Hkv, s.B, (unsigned long long)s.D * 2,
                       (unsigned long long)s.Skv * s.D * 2, 64, Cfg::kBN, 128);
    AttnParams p;
    p.B = s.B;
    p.H = s.H;
    p.Hkv = P.Hkv;
    p.Sq = s.Sq;
    p.Skv = s.Skv;
    p.O = P.out;
    p.o_sd = 1;
    p.o_ss = s.D;
    p.o_sh = (long long)s.Sq * s.D;
    p.o_sb = (long long)s.H * s.Sq * s.D;
    p.lse = with_lse ? P.lse : nullptr;
    p.lse_ss = 1;
    p.lse_sh = s.Sq;
    p.lse_sb = (long long)s.H * s.Sq;
    p.q_descale = Cfg::kFp8 ? P.qd : nullptr;
    p.k_descale = Cfg::kFp8 ? P.kd : nullptr;
    p.v_descale = Cfg::kFp8 ? P.vd : nullptr;
    p.qd_sb = s.H;   // Q's descales per query head, K's and V's per kv head
    p.kd_sb = p.vd_sb = P.Hkv;
    p.qd_sh = p.kd_sh = p.vd_sh = 1;
    p.score_scale = P.softmax_scale * 1.4426950408889634f;
    p.o_scale = o_scale;
    p.o_amax = Cfg::kOut == ATTN_OUT_E4M3 ? P.amax : nullptr;
    dim3 grid((s.Sq + Cfg::kBM - 1) / Cfg::kBM, (unsigned)BH);
    return std::function<void(cudaStream_t)>([=](cudaStream_t st) {
      kern<<<grid, Cfg::kThreads, Cfg::kSmemBytes, st>>>(tq, tk, tv, p);
    });
  };
  return r;
}

