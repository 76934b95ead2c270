// MUFU throughput on sm_90 (bench/proto): ex2 / tanh in f32 against their packed f16x2 / bf16x2 forms,
// in elements per clock per SM, at the GPU's max clock. The FP8 attention softmax needs one ex2 per score, as
// many as the tensor cores take scores at D 128 (16 per clock per SM); this asks whether packed forms
// would halve that. (H200, session 10: no -- every form runs 16 elements per clock per SM; the packed
// ones issue half the instructions, each taking twice as long.) Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a bench/proto/mufu_throughput.cu -o /tmp/mufu && /tmp/mufu
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
template <int OP>
__global__ void k(float* out, int iters, float seed) {
  float a[8]; unsigned h[8];
  for (int i = 0; i < 8; ++i) { a[i] = seed * (threadIdx.x + i) * 1e-3f - 1.0f; __half2 t = __floats2half2_rn(a[i], -a[i]); h[i] = *reinterpret_cast<unsigned*>(&t); }
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (OP == 0) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(a[i]));
      if (OP == 1) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(h[i]));
      if (OP == 2) asm volatile("tanh.approx.f32 %0, %0;" : "+f"(a[i]));
      if (OP == 3) asm volatile("tanh.approx.f16x2 %0, %0;" : "+r"(h[i]));
      if (OP == 4) asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(h[i]));
    }
  }
  float s = 0; for (int i = 0; i < 8; ++i) s += a[i] + __uint_as_float(h[i]);
  if (s == 12345.f) out[0] = s;
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  float* out; cudaMalloc(&out, 4);
  const char* names[] = {"ex2.f32", "ex2.f16x2", "tanh.f32", "tanh.f16x2", "ex2.bf16x2"};
  const int elems_per_op[] = {1, 2, 1, 2, 2};
  const int iters = 4096, blocks = sms * 8, threads = 256;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int op = 0; op < 5; ++op) {
    auto launch = [&] {
      switch (op) { case 0: k<0><<<blocks, threads>>>(out, iters, 1.f); break; case 1: k<1><<<blocks, threads>>>(out, iters, 1.f); break;
                    case 2: k<2><<<blocks, threads>>>(out, iters, 1.f); break; case 3: k<3><<<blocks, threads>>>(out, iters, 1.f); break;
                    default: k<4><<<blocks, threads>>>(out, iters, 1.f); }
    };
    launch(); cudaDeviceSynchronize();
    float best = 1e9;
    for (int r = 0; r < 5; ++r) { cudaEventRecord(e0); launch(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); best = ms < best ? ms : best; }
    double ops = double(blocks) * threads * iters * 8;   // MUFU instructions (per thread)
    double elems = ops * elems_per_op[op];
    double ghz = clk * 1e-6;   // max clock (the SM may run slower)
    printf("%-11s %.3f ms  %.1f Gelem/s  %.2f elem/clk/SM at %.2f GHz (%.2f instr/clk/SM)\n", names[op], best, elems / best * 1e-6,
           elems / (best * 1e-3) / (ghz * 1e9) / sms, ghz, ops / (best * 1e-3) / (ghz * 1e9) / sms);
  }
  return 0;
}
