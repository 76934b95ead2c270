// Exported kernels (`tilejit export`) on the GPU, against the JIT path: same outputs, and the
// host time per launch. Needs a GPU and $TILEJIT_EXPORT_DIR: a `tilejit export` directory with
// libtilejit_exports.so, as scripts/embed_bundle.sh makes it (vector_add with a dynamic and a
// [4096] specialization, attention f32 [1,2,128,64] causal 0 and 1, for the GPU's arch). The
// exported library is plain C linked against libcuda only, so this test needs no LLVM.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <random>
#include <string>

#include "gpu.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/memory.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;

namespace {

struct TjTensor {   // the exported header's tj_tensor
  void* data;
  int32_t dtype;
  int32_t rank;
  const int64_t* shape;
  const int64_t* strides;
};
using VectorAddLaunch = int (*)(CUstream, const TjTensor*, const TjTensor*, const TjTensor*);
using AttentionLaunch = int (*)(CUstream, const TjTensor*, const TjTensor*, const TjTensor*, const TjTensor*, float, int);
using LastError = const char* (*)();

// The exported library, or nullptr after printing why the test is skipped.
void* exported_library() {
  static void* handle = [] () -> void* {
    const char* dir = std::getenv("TILEJIT_EXPORT_DIR");
    if (!dir || !*dir) return nullptr;
    std::string path = std::string(dir) + "/libtilejit_exports.so";
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) std::cerr << "cannot load " << path << ": " << dlerror() << "\n";
    return h;
  }();
  return handle;
}

#define TJ_REQUIRE_EXPORT()                                                                                        \
  do {                                                                                                             \
    if (!exported_library()) {                                                                                     \
      const std::string m_ = "SKIPPED: " + ::tj_test::current_test_name() +                                        \
                             ": set TILEJIT_EXPORT_DIR to a `tilejit export` directory with libtilejit_exports.so " \
                             "(scripts/embed_bundle.sh)";                                                          \
      MESSAGE(m_);                                                                                                 \
      std::cerr << m_ << std::endl;                                                                                \
      return;                                                                                                      \
    }                                                                                                              \
  } while (0)

template <class F>
F sym(const char* name) {
  void* p = dlsym(exported_library(), name);
  REQUIRE_MESSAGE(p != nullptr, name);
  return reinterpret_cast<F>(p);
}

// The shape pointer must outlive the call: take it from the tensor that owns it, not from a
// temporary view.
TjTensor c_tensor(const DeviceTensor& t) {
  return TjTensor{t.view().data, static_cast<int32_t>(t.dtype()), static_cast<int32_t>(t.shape().size()), t.shape().data(),
                  nullptr};
}

HostTensor random_tensor(DType dt, std::vector<int64_t> shape, std::mt19937& rng) {
  HostTensor t(dt, std::move(shape));
  std::normal_distribution<double> n(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, n(rng));
  return t;
}

double max_abs_diff(const HostTensor& a, const HostTensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double d = std::abs(a.at(i) - b.at(i));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace

TEST_CASE("export (GPU): exported vector_add and attention match the JIT path and the CPU reference") {
  TJ_REQUIRE_GPU();
  TJ_REQUIRE_EXPORT();
  runtime::current_device();   // the primary context, current on this thread
  auto vector_add = sym<VectorAddLaunch>("vector_add_launch");
  auto attention = sym<AttentionLaunch>("attention_launch");
  auto va_error = sym<LastError>("vector_add_last_error");
  auto at_error = sym<LastError>("attention_last_error");
  std::mt19937 rng(7);

  for (int64_t n : {100003, 4096}) {   // the dynamic and the static specialization
    CAPTURE(n);
    HostTensor x = random_tensor(DType::f32, {n}, rng), y = random_tensor(DType::f32, {n}, rng), ref(DType::f32, {n});
    DeviceTensor dx = DeviceTensor::from_host(x), dy = DeviceTensor::from_host(y), exported(DType::f32, {n}),
                 jit(DType::f32, {n});
    exported.fill_bytes(0xFF);
    jit.fill_bytes(0xFF);
    TjTensor tx = c_tensor(dx), ty = c_tensor(dy), to = c_tensor(exported);
    REQUIRE_MESSAGE(vector_add(nullptr, &tx, &ty, &to) == 0, va_error());
    launch(kernels::vector_add(), {dx.view(), dy.view(), jit.view()});
    runtime::synchronize();
    HostTensor got = exported.to_host(), want = jit.to_host();
    for (int64_t i = 0; i < n; ++i) ref.set(i, static_cast<float>(x.at(i)) + static_cast<float>(y.at(i)));
    CHECK(max_abs_diff(got, want) == 0);
    CHECK(max_abs_diff(got, ref) == 0);
  }

  for (int causal : {0, 1}) {
    CAPTURE(causal);
    std::vector<int64_t> shape{1, 2, 128, 64};
    HostTensor q = random_tensor(DType::f32, shape, rng), k = random_tensor(DType::f32, shape, rng),
               v = random_tensor(DType::f32, shape, rng), ref(DType::f32, shape);
    DeviceTensor dq = DeviceTensor::from_host(q), dk = DeviceTensor::from_host(k), dv = DeviceTensor::from_host(v),
                 exported(DType::f32, shape), jit(DType::f32, shape);
    exported.fill_bytes(0xFF);
    jit.fill_bytes(0xFF);
    const float scale = static_cast<float>(1.4426950408889634 / 8.0);
    TjTensor tq = c_tensor(dq), tk = c_tensor(dk), tv = c_tensor(dv), to = c_tensor(exported);
    REQUIRE_MESSAGE(attention(nullptr, &tq, &tk, &tv, &to, scale, causal) == 0, at_error());
    launch(kernels::attention(), {dq.view(), dk.view(), dv.view(), jit.view(), static_cast<double>(scale), causal != 0});
    runtime::synchronize();
    HostTensor got = exported.to_host(), want = jit.to_host();
    CHECK(max_abs_diff(got, want) <= 1e-5);   // same code and grid (unless a tuned config differs)
    std::vector<Arg> host_args{q.view(), k.view(), v.view(), ref.view(), static_cast<double>(scale), causal != 0};
    ir::Function f = kernels::attention().trace(specs_for(kernels::attention(), host_args, false));
    run_reference(f, default_config(f), {q.view(), k.view(), v.view(), ref.view(), scale});
    CHECK(max_abs_diff(got, ref) <= 2e-5 * 4);
  }
}

TEST_CASE("export (GPU): host time per launch, exported launcher vs the JIT path") {
  TJ_REQUIRE_GPU();
  TJ_REQUIRE_EXPORT();
  runtime::current_device();
  auto vector_add = sym<VectorAddLaunch>("vector_add_launch");
  auto va_error = sym<LastError>("vector_add_last_error");
  const int64_t n = 4096;
  DeviceTensor x(DType::f32, {n}), y(DType::f32, {n}), out(DType::f32, {n});
  x.fill_bytes(0);
  y.fill_bytes(0);
  TjTensor tx = c_tensor(x), ty = c_tensor(y), to = c_tensor(out);
  std::vector<Arg> args{x.view(), y.view(), out.view()};

  // The floor: cuLaunchKernel with arguments packed once, on the JIT's compiled kernel.
  const CompiledKernel& ck = compile(kernels::vector_add(), specs_for(kernels::vector_add(), args, false),
                                     default_config(kernels::vector_add().trace(specs_for(kernels::vector_add(), args, false))),
                                     CompileRequest{});
  std::vector<int64_t> wx{reinterpret_cast<int64_t>(x.view().data), n, 1}, wy{reinterpret_cast<int64_t>(y.view().data), n, 1},
      wo{reinterpret_cast<int64_t>(out.view().data), n, 1};
  void* params[] = {wx.data(), wy.data(), wo.data()};
  const auto blocks = static_cast<unsigned>(
      launch_shape(ck.ir, ck.config, {x.view(), y.view(), out.view()}).programs);

  auto us_per_launch = [&](const std::function<void()>& launch_once) {
    for (int i = 0; i < 50; ++i) launch_once();
    runtime::synchronize();
    double best = 1e30;
    for (int round = 0; round < 9; ++round) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 200; ++i) launch_once();
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200;
      best = std::min(best, us);
      runtime::synchronize();
    }
    return best;
  };
  bool exported_ok = true;
  double exported_us = us_per_launch([&] { exported_ok &= vector_add(nullptr, &tx, &ty, &to) == 0; });
  REQUIRE_MESSAGE(exported_ok, va_error());
  double jit_us = us_per_launch([&] { launch(kernels::vector_add(), args); });
  double raw_us = us_per_launch([&] {
    runtime::launch(ck.function, runtime::Dim3(blocks), runtime::Dim3(static_cast<unsigned>(ck.generated.threads)),
                    ck.generated.dynamic_smem_bytes, nullptr, params);
  });
  const std::string line = fmt::format(
      "launch overhead, vector_add f32[{}] (host us per launch, best of 9 x 200): exported {:.2f}, JIT tj::launch "
      "{:.2f}, bare cuLaunchKernel {:.2f}",
      n, exported_us, jit_us, raw_us);
  MESSAGE(line);
  std::cout << line << std::endl;
  CHECK(exported_us <= jit_us);
}
