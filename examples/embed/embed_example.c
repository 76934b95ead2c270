/* embed_example.c: a plain C program that runs kernels exported by `tilejit export`, linked
 * with the exported objects and libcuda only (no NVRTC, no tilejit library, no C++ runtime).
 *
 * Export, build and run (see README.md beside this file):
 *
 *   tilejit export vector_add attention --arch sm_90a \
 *       --shapes vector_add:dynamic vector_add:4096 attention:1,2,128,64 --causal both \
 *       --test-data -o out/export
 *   cc -std=c11 -O2 -Iout/export -I/usr/local/cuda/include embed_example.c \
 *       out/export/libtilejit_exports.a -L/usr/local/cuda/lib64/stubs -lcuda -lm -o embed_example
 *   ./embed_example out/export [--bench]
 *
 * What it does:
 *   1. vector_add and attention through their typed C API (NAME_launch with tj_tensor, and
 *      attention again through NAME_launch_dlpack with DLTensors), checked against a float64
 *      reference written here in C;
 *   2. every test-data file the export wrote (testdata/NAME.I.tjtd: inputs and outputs of
 *      tilejit's CPU reference executor), through the generic NAME_launchv of whatever kernel
 *      it names: this is how exported kernels this program knows nothing about (the FP8 GEMM
 *      and FP8 attention, say) are run and checked;
 *   3. an error path: a launch with the wrong dtype returns a code and a message, it does not exit;
 *   4. with --bench, the host time per exported launch;
 *   5. that no NVRTC, tilejit or LLVM library was loaded into the process (/proc/self/maps).
 * Exit status: 0 when everything matched, 1 otherwise, 77 without a CUDA GPU. */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tilejit_exports.h"

#define CHECK_CU(call)                                                               \
  do {                                                                               \
    CUresult r_ = (call);                                                            \
    if (r_ != CUDA_SUCCESS) {                                                        \
      const char* n_ = NULL;                                                         \
      cuGetErrorName(r_, &n_);                                                       \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, n_ ? n_ : "?"); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

static int g_failures = 0;

static void report(const char* what, int ok, const char* detail) {
  printf("%-58s %s%s%s\n", what, ok ? "OK" : "MISMATCH", detail && *detail ? "  " : "", detail ? detail : "");
  if (!ok) ++g_failures;
}

/* ---- small helpers ------------------------------------------------------------------------ */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double uniform(void) { /* [0, 1) */
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (double)(g_rng >> 11) / 9007199254740992.0;
}
static double gaussian(void) {
  double u = uniform(), v = uniform();
  return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static CUdeviceptr upload(const void* host, size_t bytes) {
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc(&p, bytes ? bytes : 1));
  if (host && bytes) CHECK_CU(cuMemcpyHtoD(p, host, bytes));
  return p;
}

static tj_tensor tensor(CUdeviceptr p, tj_dtype dtype, int rank, const int64_t* shape) {
  tj_tensor t;
  t.data = (void*)(uintptr_t)p;
  t.dtype = dtype;
  t.rank = rank;
  t.shape = shape;
  t.strides = NULL; /* contiguous */
  return t;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* Element decoding for the test data (little-endian). */
static double half_to_double(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return s ? -v : v;
}
static double fp8_to_double(uint8_t b, int e5m2) {
  int s = b >> 7;
  double v;
  if (e5m2) {
    int e = (b >> 2) & 31, m = b & 3;
    v = e == 0 ? ldexp(m, -16) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 4, e - 17);
  } else { /* e4m3fn: no infinities, 0x7F/0xFF are NaN */
    int e = (b >> 3) & 15, m = b & 7;
    v = (e == 15 && m == 7) ? NAN : e == 0 ? ldexp(m, -9) : ldexp(m + 8, e - 10);
  }
  return s ? -v : v;
}
static double element(const unsigned char* p, int dtype, int64_t i) {
  switch (dtype) {
    case TJ_F32: { float f; memcpy(&f, p + 4 * i, 4); return f; }
    case TJ_F16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return half_to_double(h); }
    case TJ_BF16: { uint16_t h; uint32_t w; float f; memcpy(&h, p + 2 * i, 2); w = (uint32_t)h << 16; memcpy(&f, &w, 4); return f; }
    case TJ_E4M3: return fp8_to_double(p[i], 0);
    case TJ_E5M2: return fp8_to_double(p[i], 1);
    case TJ_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case TJ_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
    default: return p[i];
  }
}
static int dtype_size(int dtype) {
  static const int sizes[] = {4, 2, 2, 1, 1, 4, 8, 1};
  return dtype >= 0 && dtype < 8 ? sizes[dtype] : 1;
}

/* max |got - want| <= tol * max(1, max |want|), and no NaN where the reference has none. */
static int compare(const unsigned char* got, const unsigned char* want, int dtype, int64_t n, double tol, char* detail,
                   size_t detail_size) {
  double max_err = 0, max_ref = 0;
  int64_t nans = 0, i;
  for (i = 0; i < n; ++i) {
    double g = element(got, dtype, i), w = element(want, dtype, i);
    if (isnan(w)) continue;
    if (isnan(g)) { ++nans; continue; }
    if (fabs(g - w) > max_err) max_err = fabs(g - w);
    if (fabs(w) > max_ref) max_ref = fabs(w);
  }
  snprintf(detail, detail_size, "max err %.3g (max |ref| %.3g, tol %.2g)%s", max_err, max_ref, tol, nans ? ", NaN!" : "");
  return nans == 0 && max_err <= tol * (max_ref > 1 ? max_ref : 1);
}

/* ---- 1. the typed C API ---------------------------------------------------------------------- */

#ifdef TILEJIT_EXPORT_VECTOR_ADD_H
static void run_vector_add(int64_t n, const char* label) {
  float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
  int64_t i, bad = 0;
  int64_t shape[1];
  CUdeviceptr dx, dy, dout;
  tj_tensor tx, ty, tout;
  tj_status s;
  char what[128], detail[128];
  shape[0] = n;
  for (i = 0; i < n; ++i) {
    x[i] = (float)gaussian();
    y[i] = (float)gaussian();
  }
  dx = upload(x, n * sizeof(float));
  dy = upload(y, n * sizeof(float));
  dout = upload(NULL, n * sizeof(float));
  CHECK_CU(cuMemsetD8(dout, 0xFF, n * sizeof(float)));
  tx = tensor(dx, TJ_F32, 1, shape);
  ty = tensor(dy, TJ_F32, 1, shape);
  tout = tensor(dout, TJ_F32, 1, shape);
  snprintf(what, sizeof what, "vector_add_launch f32[%lld] (%s)", (long long)n, label);
  s = vector_add_launch(NULL, &tx, &ty, &tout);
  if (s == TJ_ERROR_SHAPE || s == TJ_ERROR_DTYPE) {
    printf("%-58s skipped (not exported: %s)\n", what, vector_add_last_error());
  } else if (s != TJ_SUCCESS) {
    report(what, 0, vector_add_last_error());
  } else {
    CHECK_CU(cuCtxSynchronize());
    CHECK_CU(cuMemcpyDtoH(out, dout, n * sizeof(float)));
    for (i = 0; i < n; ++i) bad += out[i] != x[i] + y[i]; /* one f32 rounding: exact */
    snprintf(detail, sizeof detail, "%lld of %lld elements differ", (long long)bad, (long long)n);
    report(what, bad == 0, detail);
  }
  cuMemFree(dx);
  cuMemFree(dy);
  cuMemFree(dout);
  free(x);
  free(y);
  free(out);
}
#endif

#ifdef TILEJIT_EXPORT_ATTENTION_H
/* o = softmax(q kᵀ / sqrt(D)) v per (batch, head), in float64; causal keeps keys j <= i. */
static void attention_reference(const float* q, const float* k, const float* v, double* o, int B, int H, int S, int D,
                                int causal) {
  int bh, i, j, d;
  double* p = malloc(sizeof(double) * S);
  for (bh = 0; bh < B * H; ++bh) {
    const float *qb = q + (size_t)bh * S * D, *kb = k + (size_t)bh * S * D, *vb = v + (size_t)bh * S * D;
    for (i = 0; i < S; ++i) {
      double mx = -INFINITY, sum = 0;
      int last = causal ? i : S - 1;
      for (j = 0; j <= last; ++j) {
        double s = 0;
        for (d = 0; d < D; ++d) s += (double)qb[i * D + d] * kb[j * D + d];
        p[j] = s / sqrt((double)D);
        if (p[j] > mx) mx = p[j];
      }
      for (j = 0; j <= last; ++j) sum += (p[j] = exp(p[j] - mx));
      for (d = 0; d < D; ++d) {
        double acc = 0;
        for (j = 0; j <= last; ++j) acc += p[j] * vb[j * D + d];
        o[((size_t)bh * S + i) * D + d] = acc / sum;
      }
    }
  }
  free(p);
}

static void run_attention(int causal) {
  enum { B = 1, H = 2, S = 128, D = 64 };
  const size_t n = (size_t)B * H * S * D;
  const float scale = (float)(1.4426950408889634 / sqrt((double)D)); /* log2(e) folded in */
  int64_t shape[4];
  float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o = malloc(n * 4), *o2 = malloc(n * 4);
  double* ref = malloc(n * 8);
  CUdeviceptr dq, dk, dv, d_o;
  tj_tensor tq, tk, tv, to;
  tj_status s;
  size_t i;
  double max_err = 0, max_ref = 0;
  char what[128], detail[160];
  shape[0] = B; shape[1] = H; shape[2] = S; shape[3] = D;
  for (i = 0; i < n; ++i) {
    q[i] = (float)gaussian();
    k[i] = (float)gaussian();
    v[i] = (float)gaussian();
  }
  attention_reference(q, k, v, ref, B, H, S, D, causal);
  dq = upload(q, n * 4);
  dk = upload(k, n * 4);
  dv = upload(v, n * 4);
  d_o = upload(NULL, n * 4);
  CHECK_CU(cuMemsetD8(d_o, 0xFF, n * 4));
  tq = tensor(dq, TJ_F32, 4, shape);
  tk = tensor(dk, TJ_F32, 4, shape);
  tv = tensor(dv, TJ_F32, 4, shape);
  to = tensor(d_o, TJ_F32, 4, shape);
  snprintf(what, sizeof what, "attention_launch f32[1,2,128,64] causal=%d", causal);
  s = attention_launch(NULL, &tq, &tk, &tv, &to, scale, causal);
  if (s == TJ_ERROR_SHAPE || s == TJ_ERROR_DTYPE) {
    printf("%-58s skipped (not exported: %s)\n", what, attention_last_error());
    goto done;
  }
  if (s != TJ_SUCCESS) {
    report(what, 0, attention_last_error());
    goto done;
  }
  CHECK_CU(cuCtxSynchronize());
  CHECK_CU(cuMemcpyDtoH(o, d_o, n * 4));
  for (i = 0; i < n; ++i) {
    double e = isnan(o[i]) ? INFINITY : fabs(o[i] - ref[i]);
    if (e > max_err) max_err = e;
    if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
  }
  snprintf(detail, sizeof detail, "max err %.3g vs float64 (max |ref| %.3g)", max_err, max_ref);
  report(what, max_err <= 1e-4 * (max_ref > 1 ? max_ref : 1), detail);

#ifdef TJ_EXPORT_HAVE_DLPACK
  { /* The same through DLPack tensors: what a framework hands over, no copies. */
    DLTensor dl[4];
    CUdeviceptr ptrs[4];
    int a, same = 1;
    ptrs[0] = dq; ptrs[1] = dk; ptrs[2] = dv; ptrs[3] = d_o;
    CHECK_CU(cuMemsetD8(d_o, 0xFF, n * 4));
    for (a = 0; a < 4; ++a) {
      memset(&dl[a], 0, sizeof dl[a]);
      dl[a].data = (void*)(uintptr_t)ptrs[a];
      dl[a].device.device_type = kDLCUDA;
      dl[a].device.device_id = 0;
      dl[a].ndim = 4;
      dl[a].dtype.code = kDLFloat;
      dl[a].dtype.bits = 32;
      dl[a].dtype.lanes = 1;
      dl[a].shape = shape;
      dl[a].strides = NULL;
      dl[a].byte_offset = 0;
    }
    snprintf(what, sizeof what, "attention_launch_dlpack causal=%d (same as above)", causal);
    s = attention_launch_dlpack(NULL, &dl[0], &dl[1], &dl[2], &dl[3], scale, causal);
    if (s != TJ_SUCCESS) {
      report(what, 0, attention_last_error());
    } else {
      CHECK_CU(cuCtxSynchronize());
      CHECK_CU(cuMemcpyDtoH(o2, d_o, n * 4));
      same = memcmp(o, o2, n * 4) == 0;
      report(what, same, same ? "bitwise equal" : "differs from the tj_tensor launch");
    }
  }
#endif
done:
  cuMemFree(dq);
  cuMemFree(dk);
  cuMemFree(dv);
  cuMemFree(d_o);
  free(q); free(k); free(v); free(o); free(o2); free(ref);
}
#endif

/* ---- 2. test data through NAME_launchv ------------------------------------------------------ */

typedef struct {
  unsigned char* data;
  size_t size, pos;
  int bad;
} Reader;
static void rd(Reader* r, void* out, size_t n) {
  if (r->pos + n > r->size) { r->bad = 1; memset(out, 0, n); return; }
  memcpy(out, r->data + r->pos, n);
  r->pos += n;
}
static uint32_t rd_u32(Reader* r) { uint32_t v; rd(r, &v, 4); return v; }
static uint64_t rd_u64(Reader* r) { uint64_t v; rd(r, &v, 8); return v; }
static double rd_f64(Reader* r) { double v; rd(r, &v, 8); return v; }
static const unsigned char* rd_span(Reader* r, size_t n) {
  const unsigned char* p = r->data + r->pos;
  if (r->pos + n > r->size) { r->bad = 1; return NULL; }
  r->pos += n;
  return p;
}

static const tilejit_exports_kernel* find_kernel(const char* name, size_t len) {
  int i;
  for (i = 0; i < tilejit_exports_kernel_count; ++i)
    if (strlen(tilejit_exports_kernels[i].name) == len && memcmp(tilejit_exports_kernels[i].name, name, len) == 0)
      return &tilejit_exports_kernels[i];
  return NULL;
}

/* Returns 1 when the file existed. */
static int run_test_file(const char* path) {
  enum { kMaxArgs = 32 };
  FILE* f = fopen(path, "rb");
  Reader r;
  char magic[8];
  uint32_t name_len, desc_len, nargs, a;
  const char *name, *desc;
  tj_arg args[kMaxArgs];
  tj_tensor tensors[kMaxArgs];
  int64_t shapes[kMaxArgs][8];
  CUdeviceptr ptrs[kMaxArgs];
  const unsigned char* expected[kMaxArgs];
  size_t bytes[kMaxArgs];
  double tol[kMaxArgs];
  const tilejit_exports_kernel* kernel;
  char what[256], detail[256];
  tj_status s;
  long size;
  if (!f) return 0;
  fseek(f, 0, SEEK_END);
  size = ftell(f);
  fseek(f, 0, SEEK_SET);
  r.data = malloc(size > 0 ? (size_t)size : 1);
  r.size = fread(r.data, 1, (size_t)size, f);
  r.pos = 0;
  r.bad = 0;
  fclose(f);
  rd(&r, magic, 8);
  if (memcmp(magic, "TJTESTD1", 8) != 0 || rd_u32(&r) != 1) {
    report(path, 0, "not a tilejit test-data file (version 1)");
    free(r.data);
    return 1;
  }
  name_len = rd_u32(&r);
  name = (const char*)rd_span(&r, name_len);
  desc_len = rd_u32(&r);
  desc = (const char*)rd_span(&r, desc_len);
  nargs = rd_u32(&r);
  if (r.bad || nargs > kMaxArgs) {
    report(path, 0, "truncated or too many arguments");
    free(r.data);
    return 1;
  }
  snprintf(what, sizeof what, "%.*s_launchv %.*s", (int)name_len, name, (int)(desc_len > 120 ? 120 : desc_len), desc);
  kernel = find_kernel(name, name_len);
  if (!kernel) {
    printf("%-58s skipped (kernel not linked)\n", what);
    free(r.data);
    return 1;
  }
  memset(ptrs, 0, sizeof ptrs);
  for (a = 0; a < nargs && !r.bad; ++a) {
    uint32_t kind = rd_u32(&r);
    expected[a] = NULL;
    if (kind <= 2) {
      uint32_t dtype = rd_u32(&r), rank = rd_u32(&r), d;
      int64_t numel = 1;
      uint64_t in_bytes, out_bytes;
      const unsigned char* in;
      if (rank > 8) { r.bad = 1; break; }
      for (d = 0; d < rank; ++d) numel *= (shapes[a][d] = (int64_t)rd_u64(&r));
      tol[a] = rd_f64(&r);
      bytes[a] = (size_t)numel * dtype_size((int)dtype);
      in_bytes = rd_u64(&r);
      in = rd_span(&r, in_bytes);
      out_bytes = rd_u64(&r);
      expected[a] = rd_span(&r, out_bytes);
      if (r.bad) break;
      ptrs[a] = upload(in_bytes ? in : NULL, bytes[a]);
      if (!in_bytes) CHECK_CU(cuMemsetD8(ptrs[a], 0xFF, bytes[a] ? bytes[a] : 1)); /* poison outputs */
      tensors[a] = tensor(ptrs[a], (tj_dtype)dtype, (int)rank, shapes[a]);
      args[a].kind = TJ_ARG_TENSOR;
      args[a].value.tensor = &tensors[a];
      if (!out_bytes) expected[a] = NULL;
    } else if (kind == 4) {
      args[a].kind = TJ_ARG_INT;
      args[a].value.i = (int64_t)rd_u64(&r);
    } else {
      args[a].kind = TJ_ARG_FLOAT;
      args[a].value.f = rd_f64(&r);
    }
  }
  if (r.bad) {
    report(what, 0, "truncated test-data file");
  } else {
    s = kernel->launchv(NULL, args, (int32_t)nargs);
    if (s == TJ_ERROR_UNSUPPORTED_DEVICE) {
      printf("%-58s skipped (%s)\n", what, kernel->last_error());
    } else if (s != TJ_SUCCESS) {
      report(what, 0, kernel->last_error());
    } else {
      CHECK_CU(cuCtxSynchronize());
      for (a = 0; a < nargs; ++a) {
        unsigned char* got;
        int ok;
        if (!expected[a]) continue;
        got = malloc(bytes[a] ? bytes[a] : 1);
        CHECK_CU(cuMemcpyDtoH(got, ptrs[a], bytes[a]));
        ok = compare(got, expected[a], tensors[a].dtype, (int64_t)(bytes[a] / dtype_size(tensors[a].dtype)), tol[a],
                     detail, sizeof detail);
        report(what, ok, detail);
        free(got);
      }
    }
  }
  for (a = 0; a < nargs; ++a)
    if (ptrs[a]) cuMemFree(ptrs[a]);
  free(r.data);
  return 1;
}

static void run_test_data(const char* dir) {
  int k, i, files = 0;
  char path[4096];
  for (k = 0; k < tilejit_exports_kernel_count; ++k) {
    for (i = 0; i < 256; ++i) {
      snprintf(path, sizeof path, "%s/testdata/%s.%d.tjtd", dir, tilejit_exports_kernels[k].name, i);
      files += run_test_file(path);
    }
  }
  if (!files) printf("(no test data in %s/testdata: export with --test-data to check every kernel)\n", dir);
}

/* ---- 3. errors are codes, not exits ------------------------------------------------------------ */

static void error_path(void) {
#ifdef TILEJIT_EXPORT_VECTOR_ADD_H
  int64_t shape[1] = {4096};
  tj_tensor t = tensor(0x1000, TJ_I64, 1, shape); /* no exported vector_add takes i64 */
  tj_status s = vector_add_launch(NULL, &t, &t, &t);
  printf("error path: vector_add_launch(i64 tensors) -> %d (%s)\n    %s\n", (int)s, tj_status_message(s),
         vector_add_last_error());
  report("error path returns TJ_ERROR_DTYPE", s == TJ_ERROR_DTYPE, "");
  s = vector_add_launch(NULL, NULL, &t, &t);
  report("error path: NULL tensor returns TJ_ERROR_INVALID_ARGUMENT", s == TJ_ERROR_INVALID_ARGUMENT, "");
#endif
}

/* What this process has mapped: no NVRTC, no tilejit library, no LLVM, at run time too. */
static void check_no_jit_libraries(void) {
#ifdef __linux__
  FILE* f = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "nvrtc") || strstr(line, "libtilejit") || strstr(line, "libLLVM")) {
      printf("  mapped: %s", line);
      found = 1;
    }
  }
  fclose(f);
  report("no NVRTC, tilejit or LLVM library is loaded", !found, "");
#endif
}

/* ---- 4. launch overhead ---------------------------------------------------------------------------- */

static void bench(void) {
#ifdef TILEJIT_EXPORT_VECTOR_ADD_H
  enum { N = 4096, ROUNDS = 7, LAUNCHES = 200 };
  int64_t shape[1] = {N};
  CUdeviceptr dx = upload(NULL, N * 4), dy = upload(NULL, N * 4), dout = upload(NULL, N * 4);
  tj_tensor tx = tensor(dx, TJ_F32, 1, shape), ty = tensor(dy, TJ_F32, 1, shape), tout = tensor(dout, TJ_F32, 1, shape);
  double best = 1e30, t0;
  int round, i;
  CHECK_CU(cuMemsetD8(dx, 0, N * 4));
  CHECK_CU(cuMemsetD8(dy, 0, N * 4));
  for (i = 0; i < 50; ++i) vector_add_launch(NULL, &tx, &ty, &tout);
  CHECK_CU(cuCtxSynchronize());
  for (round = 0; round < ROUNDS; ++round) {
    t0 = now_us();
    for (i = 0; i < LAUNCHES; ++i)
      if (vector_add_launch(NULL, &tx, &ty, &tout) != TJ_SUCCESS) {
        report("bench launch", 0, vector_add_last_error());
        return;
      }
    t0 = (now_us() - t0) / LAUNCHES;
    if (t0 < best) best = t0;
    CHECK_CU(cuCtxSynchronize());
  }
  printf("launch overhead: exported vector_add_launch f32[%d]: %.2f us per launch (host, best of %d x %d)\n", N, best,
         ROUNDS, LAUNCHES);
  cuMemFree(dx);
  cuMemFree(dy);
  cuMemFree(dout);
#else
  printf("launch overhead: vector_add was not exported\n");
#endif
}

int main(int argc, char** argv) {
  const char* dir = ".";
  int do_bench = 0, i, count = 0, major = 0, minor = 0;
  CUdevice dev;
  CUcontext ctx;
  CUresult r;
  char name[256];
  for (i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--bench") == 0) do_bench = 1;
    else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: %s [EXPORT_DIR] [--bench]\n", argv[0]);
      return 0;
    } else dir = argv[i];
  }
  r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS || count == 0) {
    const char* n = NULL;
    cuGetErrorName(r, &n);
    printf("no CUDA GPU (cuInit/cuDeviceGetCount: %s, %d devices): nothing to run\n", n ? n : "?", count);
    return 77;
  }
  CHECK_CU(cuDeviceGet(&dev, 0));
  CHECK_CU(cuDeviceGetName(name, sizeof name, dev));
  CHECK_CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CHECK_CU(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(cuCtxSetCurrent(ctx));
  printf("%s (compute capability %d.%d); %d exported kernel%s\n", name, major, minor, (int)tilejit_exports_kernel_count,
         tilejit_exports_kernel_count == 1 ? "" : "s");
  for (i = 0; i < tilejit_exports_kernel_count; ++i) {
    tj_status s = tilejit_exports_kernels[i].load(); /* optional: otherwise the first launch loads */
    printf("%s", tilejit_exports_kernels[i].specializations());
    if (s != TJ_SUCCESS) printf("  (not loaded: %s)\n", tilejit_exports_kernels[i].last_error());
  }

#ifdef TILEJIT_EXPORT_VECTOR_ADD_H
  run_vector_add(4096, "a static specialization");
  run_vector_add(100003, "the dynamic-shape specialization");
#endif
#ifdef TILEJIT_EXPORT_ATTENTION_H
  run_attention(0);
  run_attention(1);
#endif
  /* TILEJIT_EXPORT_FP8_GEMM_H / TILEJIT_EXPORT_ATTENTION_FP8_H: their test data (section 2)
   * runs and checks them through fp8_gemm_launchv / attention_fp8_launchv. */
  run_test_data(dir);
  error_path();
  if (do_bench) bench();
  check_no_jit_libraries();

  cuDevicePrimaryCtxRelease(dev);
  if (g_failures) {
    printf("FAILED: %d check%s\n", g_failures, g_failures == 1 ? "" : "s");
    return 1;
  }
  printf("OK\n");
  return 0;
}
