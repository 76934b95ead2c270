// The driver API wrappers. Without a GPU only the "unavailable" behaviour is checked and
// the GPU tests report themselves as skipped.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/driver.h"
#include "runtime/memory.h"
#include "runtime/nvrtc.h"
#include "tests/gpu.h"

using namespace tj::runtime;

TEST_CASE("driver: availability is reported with a reason") {
  Driver& d = driver();
  if (d.available()) {
    CHECK(d.unavailable_reason().empty());
    CHECK(d.device_count() > 0);
    CHECK(d.version() >= 12000);
    CHECK(d.library_loaded());
  } else {
    MESSAGE("CUDA driver unavailable: " << d.unavailable_reason());
    CHECK_FALSE(d.unavailable_reason().empty());
    // Using the GPU without one fails with a tj::Error that says why.
    try {
      current_device();
      FAIL("current_device() should throw without a usable driver");
    } catch (const tj::Error& e) {
      CHECK(std::string(e.what()).find(d.unavailable_reason()) != std::string::npos);
    }
    CHECK_THROWS_AS(DeviceBuffer(16), tj::Error);
    CHECK_THROWS_AS(Stream(), tj::Error);
  }
}

TEST_CASE("driver: error text and check") {
  Driver& d = driver();
  CHECK_NOTHROW(d.check(CUDA_SUCCESS, "nothing"));
  try {
    d.check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(42 bytes)");
    FAIL("check should throw");
  } catch (const tj::CudaError& e) {
    CHECK(e.code() == CUDA_ERROR_OUT_OF_MEMORY);
    std::string msg = e.what();
    CHECK(msg.find("cuMemAlloc(42 bytes)") != std::string::npos);
    // With a driver the error has its name; without one, its number.
    if (d.library_loaded()) CHECK(msg.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
    else CHECK(msg.find("CUresult 2") != std::string::npos);
  }
}

TEST_CASE("device: arch and feature predicates") {
  DeviceInfo h100;
  h100.cc_major = 9;
  h100.cc_minor = 0;
  CHECK(h100.arch() == "sm_90a");
  CHECK(h100.supports_fp8());
  CHECK(h100.supports_wgmma());
  DeviceInfo a100;
  a100.cc_major = 8;
  a100.cc_minor = 0;
  CHECK(a100.arch() == "sm_80");
  CHECK_FALSE(a100.supports_fp8());
  CHECK_FALSE(a100.supports_wgmma());
  DeviceInfo l40;
  l40.cc_major = 8;
  l40.cc_minor = 9;
  CHECK(l40.arch() == "sm_89");
  CHECK(l40.supports_fp8());
  CHECK_FALSE(l40.supports_wgmma());
  DeviceInfo b200;
  b200.cc_major = 10;
  b200.cc_minor = 0;
  CHECK(b200.arch() == "sm_100");
  CHECK(b200.supports_fp8());
  CHECK_FALSE(b200.supports_wgmma());
}

TEST_CASE("gpu: device properties") {
  TJ_REQUIRE_GPU();
  const DeviceInfo& dev = current_device();
  MESSAGE("GPU: " << dev.name << " sm_" << dev.cc_major << dev.cc_minor);
  CHECK_FALSE(dev.name.empty());
  CHECK(dev.cc_major >= 5);
  CHECK(dev.sm_count > 0);
  CHECK(dev.total_mem > 0);
  CHECK(dev.max_threads_per_block >= 1024);
  CHECK(dev.max_smem_per_block_optin >= 48 * 1024);
  CHECK(dev.driver_version == driver().version());
  CHECK(&current_device() == &dev);
  MemoryInfo m = memory_info();
  CHECK(m.total_bytes > 0);
  CHECK(m.free_bytes <= m.total_bytes);
}

TEST_CASE("gpu: device memory copies and fills") {
  TJ_REQUIRE_GPU();
  constexpr size_t n = 1 << 20;
  std::mt19937 rng(1234);
  std::vector<uint8_t> host(n);
  for (auto& b : host) b = static_cast<uint8_t>(rng());

  DeviceBuffer a(n);
  CHECK(a.size() == n);
  CHECK(a.ptr() != 0);
  a.copy_from_host(host.data(), n);
  std::vector<uint8_t> back(n, 0);
  a.copy_to_host(back.data(), n);
  CHECK(back == host);

  // Partial copies with offsets.
  std::vector<uint8_t> part(100);
  a.copy_to_host(part.data(), 100, 4000);
  CHECK(std::memcmp(part.data(), host.data() + 4000, 100) == 0);
  CHECK_THROWS_AS(a.copy_to_host(part.data(), 100, n - 50), tj::Error);

  // Device to device, then fills.
  DeviceBuffer b(n);
  b.copy_from(a, n);
  CHECK(b.to_host<uint8_t>() == host);
  b.memset(0xab);
  for (uint8_t v : b.to_host<uint8_t>()) {
    if (v != 0xab) {
      FAIL("memset value mismatch");
      break;
    }
  }
  b.fill32(0xdeadbeef);
  std::vector<uint32_t> words = b.to_host<uint32_t>();
  CHECK(words.size() == n / 4);
  CHECK(std::all_of(words.begin(), words.end(), [](uint32_t w) { return w == 0xdeadbeefu; }));

  // Asynchronous variants on a stream.
  Stream s;
  DeviceBuffer c(n);
  c.copy_from_host_async(host.data(), n, s);
  c.copy_from_async(a, n / 2, s);
  std::vector<uint8_t> async_back(n, 0);
  c.copy_to_host_async(async_back.data(), n, s);
  s.synchronize();
  CHECK(async_back == host);
  c.memset_async(0, s);
  c.fill32_async(7, s);
  s.synchronize();
  std::vector<uint32_t> sevens = c.to_host<uint32_t>();
  CHECK(std::all_of(sevens.begin(), sevens.end(), [](uint32_t w) { return w == 7u; }));

  // Moves transfer ownership.
  CUdeviceptr p = a.ptr();
  DeviceBuffer moved(std::move(a));
  CHECK(moved.ptr() == p);
  CHECK(a.ptr() == 0);
  CHECK(a.empty());
}

namespace {
constexpr const char* kAxpbyKernel = R"(
extern "C" __global__ void tj_test_axpby(float a, const float* x, float b, const float* y,
                                         float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + b * y[i];
}

// Reverses each block's slice through dynamic shared memory.
extern "C" __global__ void tj_test_reverse(const int* in, int* out) {
  extern __shared__ int buf[];
  int base = blockIdx.x * blockDim.x;
  buf[threadIdx.x] = in[base + threadIdx.x];
  __syncthreads();
  out[base + threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}
)";
}  // namespace

TEST_CASE("gpu: compile, load and launch a kernel") {
  TJ_REQUIRE_GPU();
  const DeviceInfo& dev = current_device();
  CompileOptions opts;
  opts.arch = dev.arch();
  CompileResult compiled = compile_cuda(kAxpbyKernel, "axpby.cu", opts);
  Module module(compiled.cubin);
  CUfunction f = module.function("tj_test_axpby");
  FunctionAttributes attrs = Module::attributes(f);
  CHECK(attrs.num_regs > 0);
  CHECK(attrs.local_bytes == 0);
  CHECK(attrs.max_threads_per_block >= 256);
  CHECK_THROWS_AS(module.function("no_such_kernel"), tj::CudaError);

  const int n = 100003;  // not a multiple of the block size
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = dist(rng);
    y[i] = dist(rng);
  }
  DeviceBuffer dx = DeviceBuffer::from_host(x);
  DeviceBuffer dy = DeviceBuffer::from_host(y);
  DeviceBuffer dout((n + 1) * sizeof(float));
  dout.memset(0xff);  // poison: NaN everywhere, including one element past the end
  float a = 1.5f, b = -0.25f;
  CUdeviceptr px = dx.ptr(), py = dy.ptr(), pout = dout.ptr();
  int count = n;
  void* args[] = {&a, &px, &b, &py, &pout, &count};
  Stream stream;
  Event start, stop;
  start.record(stream);
  launch(f, Dim3((n + 255) / 256), Dim3(256), 0, stream, args);
  stop.record(stream);
  stop.synchronize();
  CHECK(Event::elapsed_ms(start, stop) >= 0.f);
  std::vector<float> out = dout.to_host<float>();
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    float expect = a * x[i] + b * y[i];
    if (!(std::fabs(out[i] - expect) <= 1e-5f * (1.f + std::fabs(expect)))) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(std::isnan(out[n]));  // untouched past the end
  CHECK(max_active_blocks_per_sm(f, 256, 0) > 0);
}

TEST_CASE("gpu: launch with more than 48 KiB of dynamic shared memory") {
  TJ_REQUIRE_GPU();
  const DeviceInfo& dev = current_device();
  const int threads = 1024;
  const size_t smem = 64 * 1024;  // only 4 KiB are used; the launch still needs the opt-in (at load)
  if (dev.max_smem_per_block_optin < static_cast<int>(smem)) {
    MESSAGE("device allows only " << dev.max_smem_per_block_optin << " bytes per block");
    return;
  }
  CompileOptions opts;
  opts.arch = dev.arch();
  Module module(compile_cuda(kAxpbyKernel, "axpby.cu", opts).cubin);
  CUfunction f = module.function("tj_test_reverse");
  const int blocks = 8;
  std::vector<int> in(blocks * threads);
  std::mt19937 rng(7);
  for (int& v : in) v = static_cast<int>(rng());
  DeviceBuffer din = DeviceBuffer::from_host(in);
  DeviceBuffer dout(in.size() * sizeof(int));
  dout.fill32(0x7fc00000u);
  CUdeviceptr pin = din.ptr(), pout = dout.ptr();
  void* args[] = {&pin, &pout};
  // Not opted in yet: the launch is refused, and the error says what is missing.
  CHECK_THROWS_WITH_AS(launch(f, Dim3(blocks), Dim3(threads), smem, nullptr, args),
                       doctest::Contains("dynamic smem=65536 bytes; above 48 KiB the function must be opted in when it "
                                         "is loaded: Module::opt_in_shared_bytes"),
                       tj::Error);
  Module::opt_in_shared_bytes(f, smem);
  launch(f, Dim3(blocks), Dim3(threads), smem, nullptr, args);
  synchronize();
  CHECK(Module::attributes(f).max_dynamic_shared_bytes >= static_cast<int>(smem));
  std::vector<int> out = dout.to_host<int>();
  int wrong = 0;
  for (int blk = 0; blk < blocks; ++blk)
    for (int t = 0; t < threads; ++t)
      wrong += out[blk * threads + t] != in[blk * threads + threads - 1 - t];
  CHECK(wrong == 0);
}

TEST_CASE("gpu: cluster launch through cuLaunchKernelEx") {
  TJ_REQUIRE_GPU();
  const DeviceInfo& dev = current_device();
  if (dev.cc_major < 9) {
    MESSAGE("thread-block clusters need sm_90 or newer; this GPU is " << dev.arch());
    return;
  }
  const char* src = R"(
extern "C" __global__ void tj_test_cluster_rank(unsigned* out) {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) out[blockIdx.x] = rank;
}
)";
  CompileOptions opts;
  opts.arch = dev.arch();
  Module module(compile_cuda(src, "cluster.cu", opts).cubin);
  CUfunction f = module.function("tj_test_cluster_rank");
  const unsigned blocks = 16;
  DeviceBuffer out(blocks * sizeof(unsigned));
  out.memset(0xff);
  CUdeviceptr p = out.ptr();
  void* args[] = {&p};
  launch(f, Dim3(blocks), Dim3(32), 0, nullptr, args, Dim3(2));
  synchronize();
  std::vector<unsigned> ranks = out.to_host<unsigned>();
  for (unsigned i = 0; i < blocks; ++i) CHECK(ranks[i] == i % 2);
}
