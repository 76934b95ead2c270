// Compiles the device tile library (codegen/device/*.cuh) with NVRTC, the way generated code
// will be compiled at run time: no CUDA toolkit header, the .cuh files passed as in-memory
// headers. Checks sm_90a (wgmma, TMA, the FP8 GEMM kernel) and sm_80 (the headers must still
// compile; only the arch-neutral parts are used), and prints compile times.
//
//   g++ -std=c++17 bench/proto/nvrtc_check.cpp -I/usr/local/cuda/include
//       -L/usr/local/cuda/lib64 -lnvrtc -Wl,-rpath,/usr/local/cuda/lib64 -o nvrtc_check
//   ./nvrtc_check codegen/device [out_dir]      (writes the sm_90a cubin to out_dir if given)
#include <nvrtc.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static bool compile(const char* what, const std::string& src, const char* arch,
                    const std::vector<std::string>& names, const std::vector<std::string>& bodies,
                    const std::vector<std::string>& name_exprs, const std::string& out_cubin) {
  std::vector<const char*> hn, hb;
  for (size_t i = 0; i < names.size(); ++i) {
    hn.push_back(names[i].c_str());
    hb.push_back(bodies[i].c_str());
  }
  nvrtcProgram p;
  nvrtcCreateProgram(&p, src.c_str(), "tj_generated.cu", (int)hn.size(), hb.data(), hn.data());
  for (auto& e : name_exprs) nvrtcAddNameExpression(p, e.c_str());
  std::string a = std::string("--gpu-architecture=") + arch;
  const char* opts[] = {a.c_str(), "-std=c++17", "--use_fast_math", "-default-device"};
  auto t0 = std::chrono::steady_clock::now();
  nvrtcResult r = nvrtcCompileProgram(p, 3, opts);
  auto t1 = std::chrono::steady_clock::now();
  size_t n = 0;
  nvrtcGetProgramLogSize(p, &n);
  std::string log(n, '\0');
  nvrtcGetProgramLog(p, &log[0]);
  size_t cub = 0;
  if (r == NVRTC_SUCCESS) nvrtcGetCUBINSize(p, &cub);
  printf("%-52s %-8s %s  %.0f ms  cubin %zu B\n", what, arch,
         r == NVRTC_SUCCESS ? "OK  " : "FAIL",
         std::chrono::duration<double, std::milli>(t1 - t0).count(), cub);
  if (log.size() > 1) printf("%s\n", log.c_str());
  if (r == NVRTC_SUCCESS && !out_cubin.empty()) {
    std::vector<char> bin(cub);
    nvrtcGetCUBIN(p, bin.data());
    std::ofstream(out_cubin, std::ios::binary).write(bin.data(), (std::streamsize)bin.size());
  }
  nvrtcDestroyProgram(&p);
  return r == NVRTC_SUCCESS;
}

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "codegen/device";
  std::string out = argc > 2 ? argv[2] : "";
  std::vector<std::string> names = {"fp8.cuh", "tile.cuh", "hopper.cuh", "hopper_wgmma.cuh", "gemm_common.cuh", "hopper_gemm.cuh"};
  std::vector<std::string> bodies;
  for (auto& n : names) {
    bodies.push_back(slurp(dir + "/" + n));
    if (bodies.back().empty()) {
      printf("cannot read %s/%s\n", dir.c_str(), n.c_str());
      return 2;
    }
  }
  bool ok = true;
  // 1) the FP8 GEMM proof kernel, sm_90a
  const std::string gemm = R"(
#include "hopper_gemm.cuh"
using Cfg = tj::dev::Fp8GemmCfg<64, 256, 4, false, 2, false, tj::dev::GEMM_OUT_BF16>;
template __global__ void tj::dev::fp8_gemm_kernel<Cfg>(const __grid_constant__ tj::dev::TmaDescriptor,
    const __grid_constant__ tj::dev::TmaDescriptor, const tj::dev::Fp8GemmParams);
)";
  ok &= compile("hopper_gemm.cuh: fp8_gemm_kernel<128x256, cluster 2>", gemm, "sm_90a", names,
                bodies,
                {"tj::dev::fp8_gemm_kernel<tj::dev::Fp8GemmCfg<64, 256, 4, false, 2, false, 0>>"},
                out.empty() ? "" : out + "/nvrtc_fp8_gemm_sm90a.cubin");
  // 2) every building block, sm_90a (an attention-like chain: SS, acc -> fp8 A, RS)
  const std::string blocks = R"(
#include "hopper.cuh"
TJ_WGMMA_DEFINE(48)
using namespace tj::dev;
extern "C" __global__ void __launch_bounds__(256, 1) blocks(const __grid_constant__ TmaDescriptor td, float* out) {
  extern __shared__ __align__(1024) unsigned char sm[];
  __shared__ unsigned long long bar[2];
  if (threadIdx.x == 0) { mbar_init(&bar[0], 1); mbar_init(&bar[1], 4); fence_mbarrier_init(); }
  __syncthreads();
  if (warpgroup_idx() == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      prefetch_tma_descriptor(&td);
      mbar_wait(&bar[1], 1);
      mbar_arrive_expect_tx(&bar[0], 64 * 128 * 3);
      tma_load_2d(sm, &td, &bar[0], 0, 0);
      tma_load_3d(sm + 8192, &td, &bar[0], 0, 0, 0);
      tma_load_4d_hint(sm + 16384, &td, &bar[0], 0, 0, 0, 0, l2_policy_evict_first());
    }
    return;
  }
  setmaxnreg_inc<240>();
  mbar_wait(&bar[0], 0);
  float s[64], o[64], o48[24];
  unsigned a[16];
  wgmma_fence();
  for (int k = 0; k < 4; ++k)
    mma_async_ss<128, WG_E4M3, WG_E4M3>(s, desc_advance(make_desc_kmajor<SWIZZLE_128B>(sm), 32 * k),
                                        desc_advance(make_desc_kmajor<SWIZZLE_128B>(sm + 8192), 32 * k), k);
  wgmma_commit();
  wgmma_wait<0>();
  fence_acc<64>(s);
  float m[2] = {-1e30f, -1e30f}, l[2] = {0.f, 0.f};
  acc_row_max<128>(s, m);
  for (int i = 0; i < 64; ++i) s[i] = exp2f(s[i] - m[(i >> 1) & 1]);
  acc_row_sum_partial<128>(s, l);
  acc_to_a_fp8<128>(s, a);
  wgmma_fence();
  for (int k = 0; k < 4; ++k)
    mma_async_rs<128, WG_E4M3, WG_E4M3>(o, a + 4 * k, desc_advance(make_desc_kmajor<SWIZZLE_128B>(sm + 16384), 32 * k), k);
  mma_async_ss<48, WG_BF16, WG_BF16, 1, 1, 0, 1>(o48, make_desc_kmajor<SWIZZLE_64B>(sm),
      make_desc_mnmajor<SWIZZLE_128B>(sm + 8192, 8192, 1024), 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_acc<64>(o);
  if (lane_id() == 0) mbar_arrive(&bar[1]);
  float r[2] = {quad_allreduce_sum(l[0]), quad_allreduce_sum(l[1])};
  acc_scale_rows<128>(o, r);
  const int t = threadIdx.x & 127;
  for (int i = 0; i < 64; ++i) out[acc_row(i, t) * 128 + acc_col(i, t)] = o[i] + o48[i % 24];
  if (threadIdx.x == 128) { tma_store_2d(&td, sm, 0, 0); tma_store_commit(); tma_store_wait<0>(); }
}
)";
  ok &= compile("hopper.cuh: TMA + mbarrier + SS/RS wgmma chain", blocks, "sm_90a", names, bodies,
                {}, "");
  // 3) sm_80: the same headers must compile; only arch-neutral parts are used
  const std::string sm80 = R"(
#include "hopper.cuh"
using namespace tj::dev;
extern "C" __global__ void neutral(const float* in, unsigned* out) {
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = in[i * 128 + threadIdx.x];
  unsigned a[8], b[8];
  float m[2] = {-1e30f, -1e30f};
  acc_row_max<64>(d, m);
  acc_to_a_fp8<64>(d, a);
  acc_to_a_bf16<64>(d, b);
  float lo, hi;
  e4m3x2_to_f32x2((unsigned short)a[0], lo, hi);
  out[threadIdx.x] = a[threadIdx.x & 7] ^ b[threadIdx.x & 7] ^ f32x2_to_e5m2x2(lo, hi) ^
                     f32_to_bf16(m[0]) ^ f32_to_f16(m[1]) ^ (unsigned)make_smem_desc(0, 1, 16, 1024);
}
)";
  ok &= compile("hopper.cuh + fp8.cuh, arch-neutral parts", sm80, "sm_80", names, bodies, {}, "");
  ok &= compile("hopper.cuh + fp8.cuh, arch-neutral parts", sm80, "sm_89", names, bodies, {}, "");
  // 4) hopper_gemm.cuh included on sm_80 (kernel absent there, must not break the build)
  ok &= compile("hopper_gemm.cuh included for sm_80", "#include \"hopper_gemm.cuh\"\n", "sm_80",
                names, bodies, {}, "");
  printf("%s\n", ok ? "NVRTC: all OK" : "NVRTC: FAILURES");
  return ok ? 0 : 1;
}
