/* A host-memory fake of libcuda (tests/test_export.cpp builds it as libcuda.so.1): lets the C
 * example in examples/embed run end to end on a machine without a GPU. "Device" memory is
 * malloc'ed, modules are the CUBIN pointers, and cuLaunchKernel computes vector_add (f32, the
 * kernel ABI's TensorArg<1> {data, shape, stride}) on the host; it refuses other kernels with
 * CUDA_ERROR_NOT_SUPPORTED. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
static const char* g_fn_names[64]; static int g_nfn;
CUresult cuInit(unsigned f) { return 0; }
CUresult cuDeviceGetCount(int* n) { *n = 1; return 0; }
CUresult cuDeviceGet(int* d, int o) { *d = 0; return 0; }
CUresult cuDeviceGetName(char* s, int n, int d) { snprintf(s, n, "Mock GPU"); return 0; }
CUresult cuDeviceGetAttribute(int* v, int a, int d) { *v = a == 75 ? 9 : a == 76 ? 0 : 132; return 0; }
CUresult cuDevicePrimaryCtxRetain(void** c, int d) { *c = (void*)0x1234; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { return 0; }
static void* g_ctx;
CUresult cuCtxSetCurrent(void* c) { g_ctx = c; return 0; }
CUresult cuCtxGetCurrent(void** c) { *c = g_ctx; return 0; }
CUresult cuCtxGetDevice(int* d) { *d = 0; return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuMemAlloc_v2(unsigned long long* p, size_t n) { *p = (uintptr_t)malloc(n); return 0; }
CUresult cuMemFree_v2(unsigned long long p) { free((void*)(uintptr_t)p); return 0; }
CUresult cuMemcpyHtoD_v2(unsigned long long d, const void* s, size_t n) { memcpy((void*)(uintptr_t)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void* d, unsigned long long s, size_t n) { memcpy(d, (void*)(uintptr_t)s, n); return 0; }
CUresult cuMemsetD8_v2(unsigned long long d, unsigned char v, size_t n) { memset((void*)(uintptr_t)d, v, n); return 0; }
CUresult cuModuleLoadData(void** m, const void* img) { *m = (void*)img; return 0; }
CUresult cuModuleGetFunction(void** f, void* m, const char* name) { g_fn_names[g_nfn] = name; *f = (void*)(intptr_t)(g_nfn++ + 1); return 0; }
CUresult cuFuncSetAttribute(void* f, int a, int v) { return 0; }
CUresult cuTensorMapEncodeTiled(void* map, int a, unsigned r, void* g, const void* d, const void* s, const void* b, const void* e, int i, int sw, int l, int o) { return 0; }
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, void* st, void** params, void** extra) {
  const char* name = g_fn_names[(intptr_t)f - 1];
  if (strcmp(name, "vector_add") == 0) {
    int64_t* x = params[0]; int64_t* y = params[1]; int64_t* o = params[2];
    int64_t n = x[1], i;
    for (i = 0; i < n; ++i)
      ((float*)(uintptr_t)o[0])[i * o[2]] = ((float*)(uintptr_t)x[0])[i * x[2]] + ((float*)(uintptr_t)y[0])[i * y[2]];
    return 0;
  }
  return 801; /* CUDA_ERROR_NOT_SUPPORTED */
}
CUresult cuGetErrorName(CUresult r, const char** s) { *s = "CUDA_ERROR_MOCK"; return 0; }
CUresult cuGetErrorString(CUresult r, const char** s) { *s = "mock"; return 0; }
