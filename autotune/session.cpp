// The worker's side of tuning: arguments on the GPU, candidates loaded from CUBINs, checked
// against the reference output and timed with CUDA events. See autotune/worker.h.
#include "autotune/session.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "autotune/worker.h"
#include "runtime/device.h"
#include "runtime/disk_cache.h"
#include "runtime/driver.h"
#include "runtime/hash.h"
#include "runtime/jit.h"
#include "runtime/memory.h"
#include "runtime/nvrtc.h"
#include "runtime/owned_tensor.h"

namespace tj::autotune {

const std::string& worker_kernels_source() {
  static const std::string source = R"CUDA(// tilejit tuning worker: output comparison and fault injection.
typedef unsigned int tj_u32;
typedef unsigned short tj_u16;
typedef unsigned char tj_u8;

__device__ __forceinline__ float tj_from_f16(tj_u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ float tj_from_e4m3(tj_u8 b) {
  const tj_u32 s = (b >> 7) & 1u, e = (b >> 3) & 15u, m = b & 7u;
  if (e == 15u && m == 7u) return __int_as_float(0x7fc00000);
  float v = e == 0u ? (float)m * 0.001953125f : __int_as_float((int)(((e + 120u) << 23) | (m << 20)));
  return s ? -v : v;
}

// dtype codes: tj::DType (f32, f16, bf16, e4m3, e5m2, i32, i64, i1).
__device__ __forceinline__ float tj_load(const void* p, long long i, int dtype) {
  switch (dtype) {
    case 0: return ((const float*)p)[i];
    case 1: return tj_from_f16(((const tj_u16*)p)[i]);
    case 2: return __int_as_float((int)(((tj_u32)((const tj_u16*)p)[i]) << 16));
    case 3: return tj_from_e4m3(((const tj_u8*)p)[i]);
    case 4: return tj_from_f16((tj_u16)(((tj_u32)((const tj_u8*)p)[i]) << 8));
    case 5: return (float)((const int*)p)[i];
    case 6: return (float)((const long long*)p)[i];
    default: return (float)((const tj_u8*)p)[i];
  }
}

// result[0]: max |out - ref| (float bits), [1]: max |ref|, [2]: elements where exactly one
// of out/ref is NaN, [3]: elements where out/ref are infinite and differ.
extern "C" __global__ void tj_compare(const void* out, const void* ref, long long n, int dtype, tj_u32* result) {
  float max_err = 0.0f, max_ref = 0.0f;
  tj_u32 nan_mismatch = 0, inf_mismatch = 0;
  const float inf = __int_as_float(0x7f800000);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const float o = tj_load(out, i, dtype), r = tj_load(ref, i, dtype);
    const bool on = o != o, rn = r != r;
    if (on || rn) {
      if (on != rn) ++nan_mismatch;
      continue;
    }
    if (fabsf(o) == inf || fabsf(r) == inf) {
      if (o != r) ++inf_mismatch;
      continue;
    }
    max_err = fmaxf(max_err, fabsf(o - r));
    max_ref = fmaxf(max_ref, fabsf(r));
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    max_err = fmaxf(max_err, __shfl_xor_sync(0xffffffffu, max_err, offset));
    max_ref = fmaxf(max_ref, __shfl_xor_sync(0xffffffffu, max_ref, offset));
    nan_mismatch += __shfl_xor_sync(0xffffffffu, nan_mismatch, offset);
    inf_mismatch += __shfl_xor_sync(0xffffffffu, inf_mismatch, offset);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMax(result + 0, __float_as_uint(max_err));
    atomicMax(result + 1, __float_as_uint(max_ref));
    if (nan_mismatch) atomicAdd(result + 2, nan_mismatch);
    if (inf_mismatch) atomicAdd(result + 3, inf_mismatch);
  }
}

// Test-only faulting candidates.
extern "C" __global__ void tj_fault_illegal_address(int* p) { *(volatile int*)p = 1; }
extern "C" __global__ void tj_fault_hang(volatile int* flag) {
  while (*flag == 0) __nanosleep(1000);
}
)CUDA";
  return source;
}

namespace detail {

using nlohmann::json;
using runtime::DeviceBuffer;

namespace {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<char> base64_decode(const std::string& in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<char> out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v = val(c);
    if (v < 0) continue;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Random N(0, 1) elements of `dtype`: a table of 4096 encoded values, picked at random.
std::vector<char> random_bytes(DType dtype, int64_t count, uint64_t seed) {
  constexpr int kTable = 4096;
  HostTensor table(dtype, {kTable});
  uint64_t s = seed;
  for (int i = 0; i < kTable; i += 2) {
    double u1 = (static_cast<double>(splitmix(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (static_cast<double>(splitmix(s) >> 11) + 0.5) / 9007199254740992.0;
    double r = std::sqrt(-2.0 * std::log(u1));
    table.set(i, r * std::cos(2 * M_PI * u2));
    table.set(i + 1, r * std::sin(2 * M_PI * u2));
  }
  const size_t esize = static_cast<size_t>(size_bytes(dtype));
  const char* t = static_cast<const char*>(table.data());
  std::vector<char> out(static_cast<size_t>(count) * esize);
  uint64_t bits = 0;
  int left = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (left == 0) {
      bits = splitmix(s);
      left = 5;
    }
    size_t pick = bits & (kTable - 1);
    bits >>= 12;
    --left;
    std::memcpy(out.data() + static_cast<size_t>(i) * esize, t + pick * esize, esize);
  }
  return out;
}

bool is_fatal(CUresult r) {
  switch (r) {
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_NOT_FOUND:
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
    case CUDA_ERROR_INVALID_CLUSTER_SIZE:
      return false;
    default: return true;
  }
}

struct Param {
  bool tensor = false;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  int role = 0;          // 0 in, 1 out, 2 inout
  double value = 0;      // scalars
  bool i64 = false;      // scalar_i64
  size_t bytes() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return static_cast<size_t>(n) * static_cast<size_t>(size_bytes(dtype));
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// One full set of arguments, packed as the generated kernels take them.
struct ArgSet {
  std::vector<DeviceBuffer> buffers;            // per param (empty for scalars)
  std::vector<std::vector<int64_t>> words;      // per param: tensor {data, shape, stride} / scalar bits
  std::vector<void*> pointers;
};

struct Fatal {
  std::string what;
};

}  // namespace

struct BenchSession::State {
  runtime::DeviceInfo dev;
  std::optional<runtime::Stream> stream;
  std::vector<Param> params;
  std::vector<ArgSet> copies;
  std::vector<DeviceBuffer> pristine;          // per param: initial contents of inout tensors
  std::vector<DeviceBuffer> reference;         // per param: reference output (outputs only)
  bool have_reference = false;
  uint64_t launches = 0;
  // worker kernels
  std::unique_ptr<runtime::Module> util;
  CUfunction compare = nullptr, fault_illegal = nullptr, fault_hang = nullptr;
  DeviceBuffer compare_result;
  DeviceBuffer hang_flag;

  void init_device() {
    if (stream) return;
    dev = runtime::current_device();
    stream.emplace();
  }

  void load_util() {
    if (util) return;
    init_device();
    const std::string arch = dev.arch();
    runtime::Hasher h;
    h.field("tilejit-worker-kernels-v1").field(arch).field(std::to_string(runtime::nvrtc_version())).field(worker_kernels_source());
    const std::string key = h.hex();
    runtime::DiskCache disk(runtime::DiskCache::default_dir());
    std::vector<char> cubin;
    if (auto hit = disk.get(key)) {
      cubin.assign(hit->begin(), hit->end());
    } else {
      runtime::CompileOptions o;
      o.arch = arch;
      o.want_ptx = false;
      auto r = runtime::compile_cuda(worker_kernels_source(), "tj_worker.cu", o);
      cubin = std::move(r.cubin);
      disk.put(key, std::string_view(cubin.data(), cubin.size()));
    }
    util = std::make_unique<runtime::Module>(cubin);
    compare = util->function("tj_compare");
    fault_illegal = util->function("tj_fault_illegal_address");
    fault_hang = util->function("tj_fault_hang");
    compare_result = DeviceBuffer(16);
    hang_flag = DeviceBuffer(16);
    hang_flag.memset(0);
  }

  json hello() {
    init_device();
    json d;
    d["name"] = dev.name;
    d["cc_major"] = dev.cc_major;
    d["cc_minor"] = dev.cc_minor;
    d["arch"] = dev.arch();
    d["driver"] = dev.driver_version;
    d["nvrtc"] = runtime::nvrtc_version();
    d["sm_count"] = dev.sm_count;
    d["l2_bytes"] = dev.l2_bytes;
    d["smem_optin"] = dev.max_smem_per_block_optin;
    d["regs_per_block"] = dev.max_regs_per_block;
    d["threads_per_block"] = dev.max_threads_per_block;
    d["total_mem"] = dev.total_mem;
    return json{{"ok", true}, {"pid", static_cast<long>(::getpid())}, {"device", d}};
  }

  json setup(const json& req) {
    init_device();
    load_util();
    params.clear();
    copies.clear();
    pristine.clear();
    reference.clear();
    have_reference = false;
    for (const auto& p : req.at("params")) {
      Param q;
      q.tensor = p.at("tensor").get<bool>();
      if (q.tensor) {
        auto dt = dtype_from_name(p.at("dtype").get<std::string>());
        if (!dt) throw Error("setup: unknown dtype " + p.at("dtype").get<std::string>());
        q.dtype = *dt;
        q.shape = p.at("shape").get<std::vector<int64_t>>();
        std::string role = p.at("role").get<std::string>();
        q.role = role == "in" ? 0 : role == "out" ? 1 : 2;
      } else {
        q.value = p.at("value").get<double>();
        q.i64 = p.value("dtype", std::string("f32")) == "i64";
      }
      params.push_back(std::move(q));
    }
    const uint64_t seed = req.value("seed", uint64_t(1));
    size_t total = 0;
    for (const Param& p : params)
      if (p.tensor) total += p.bytes();
    const size_t l2 = static_cast<size_t>(std::max(dev.l2_bytes, 0));
    size_t k = 1;
    if (total > 0 && total < 3 * l2) k = std::clamp<size_t>((3 * l2 + total - 1) / total, 2, 64);
    runtime::MemoryInfo mem = runtime::memory_info();
    while (k > 1 && k * total > mem.free_bytes / 2) --k;
    if (total > mem.free_bytes) throw Error(fmt::format("setup: the arguments need {} bytes; {} are free", total, mem.free_bytes));

    // Copy 0 from host data, the others device to device.
    pristine.resize(params.size());
    reference.resize(params.size());
    copies.resize(k);
    for (size_t c = 0; c < k; ++c) {
      ArgSet& set = copies[c];
      set.buffers.resize(params.size());
      set.words.resize(params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        const Param& p = params[i];
        if (!p.tensor) {
          int64_t w = 0;
          if (p.i64) {
            w = static_cast<int64_t>(p.value);
          } else {
            float f = static_cast<float>(p.value);
            std::memcpy(&w, &f, sizeof f);
          }
          set.words[i] = {w};
          continue;
        }
        set.buffers[i] = DeviceBuffer(std::max<size_t>(p.bytes(), 1));
        if (p.role == 1) {
          set.buffers[i].memset(0xFF);
        } else if (c == 0) {
          auto bytes = random_bytes(p.dtype, p.numel(), seed * 1000003 + i);
          if (!bytes.empty()) set.buffers[i].copy_from_host(bytes.data(), bytes.size());
        } else {
          set.buffers[i].copy_from(copies[0].buffers[i], p.bytes());
        }
        std::vector<int64_t>& w = set.words[i];
        w.push_back(static_cast<int64_t>(set.buffers[i].ptr()));
        w.insert(w.end(), p.shape.begin(), p.shape.end());
        std::vector<int64_t> stride(p.shape.size(), 1);
        for (int d = static_cast<int>(p.shape.size()) - 2; d >= 0; --d) stride[d] = stride[d + 1] * p.shape[d + 1];
        w.insert(w.end(), stride.begin(), stride.end());
      }
      for (auto& w : set.words) set.pointers.push_back(w.data());
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const Param& p = params[i];
      if (p.tensor && p.role == 2) {
        pristine[i] = DeviceBuffer(std::max<size_t>(p.bytes(), 1));
        pristine[i].copy_from(copies[0].buffers[i], p.bytes());
      }
      if (p.tensor && p.role != 0) reference[i] = DeviceBuffer(std::max<size_t>(p.bytes(), 1));
    }
    runtime::synchronize();
    return json{{"ok", true}, {"copies", k}, {"bytes", total * k}};
  }

  // A candidate ready to launch with any argument copy: the parameters, then the TMA
  // descriptors it asks for (encoded per copy), then (persistent kernels) the program count.
  struct Launchable {
    CUfunction fn = nullptr;
    runtime::Dim3 grid, block, cluster;
    size_t smem = 0;
    long long programs = 0;
    std::vector<std::vector<CUtensorMap>> maps;   // per copy
    std::vector<std::vector<void*>> pointers;     // per copy
  };

  // Fills `l` in place (its pointer arrays point into it).
  void prepare(Launchable& l, CUfunction fn, const json& req) {
    l.fn = fn;
    auto g = req.at("grid").get<std::vector<unsigned>>();
    auto b = req.at("block").get<std::vector<unsigned>>();
    auto c = req.value("cluster", std::vector<unsigned>{1, 1, 1});
    l.grid = runtime::Dim3(g.at(0), g.at(1), g.at(2));
    l.block = runtime::Dim3(b.at(0), b.at(1), b.at(2));
    l.cluster = runtime::Dim3(c.at(0), c.at(1), c.at(2));
    l.smem = req.value("smem", size_t(0));
    l.programs = req.value("programs", 0LL);
    const bool persistent = req.value("persistent", false);
    std::vector<codegen::TmaOperand> tma;
    for (const auto& t : req.value("tma", json::array())) {
      codegen::TmaOperand op;
      op.param = t.at("param").get<int>();
      op.box = t.at("box").get<std::vector<int>>();
      op.swizzle_bytes = t.value("swizzle", 128);
      op.element_strides = t.value("element_strides", std::vector<int>{});
      tma.push_back(std::move(op));
    }
    l.maps.resize(copies.size());
    l.pointers.resize(copies.size());
    for (size_t k = 0; k < copies.size(); ++k) {
      l.maps[k].reserve(tma.size());
      for (const auto& op : tma) {
        const Param& p = params.at(static_cast<size_t>(op.param));
        if (!p.tensor) throw Error(fmt::format("TMA operand {} is not a tensor", op.param));
        TensorView view{reinterpret_cast<void*>(copies[k].buffers[op.param].ptr()), p.dtype, p.shape, {}, Device::cuda};
        l.maps[k].push_back(encode_tma("candidate", fmt::format("#{}", op.param), view, op));
      }
      l.pointers[k] = copies[k].pointers;
      for (auto& m : l.maps[k]) l.pointers[k].push_back(&m);
      if (persistent) l.pointers[k].push_back(&l.programs);
    }
  }

  // Launches with copy `c`. CUDA errors propagate (the caller sorts fatal from not).
  void launch(Launchable& l, size_t c) {
    runtime::launch(l.fn, l.grid, l.block, l.smem, *stream, l.pointers.at(c).data(), l.cluster);
    ++launches;
  }

  size_t next_copy() { return static_cast<size_t>(launches % copies.size()); }

  void sync() {
    try {
      stream->synchronize();
    } catch (const CudaError& e) {
      throw Fatal{e.what()};
    }
  }

  struct Check {
    double max_error = 0, max_ref = 0;
    uint64_t nan_mismatch = 0, inf_mismatch = 0;
    bool ok = true;
    std::string detail;
  };

  Check compare_outputs(const std::vector<double>& tolerance) {
    Check all;
    size_t out_index = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const Param& p = params[i];
      if (!p.tensor || p.role == 0) continue;
      double tol = out_index < tolerance.size() ? tolerance[out_index] : 0.0;
      ++out_index;
      compare_result.memset_async(0, *stream);
      CUdeviceptr out = copies[0].buffers[i].ptr(), ref = reference[i].ptr();
      long long n = p.numel();
      int dt = static_cast<int>(p.dtype);
      CUdeviceptr res = compare_result.ptr();
      void* args[] = {&out, &ref, &n, &dt, &res};
      unsigned blocks = static_cast<unsigned>(std::clamp<long long>((n + 255) / 256, 1, 4 * std::max(dev.sm_count, 1)));
      runtime::launch(compare, runtime::Dim3(blocks), runtime::Dim3(256), 0, *stream, args);
      uint32_t r[4] = {};
      compare_result.copy_to_host_async(r, sizeof r, *stream);
      sync();
      float e, m;
      std::memcpy(&e, &r[0], 4);
      std::memcpy(&m, &r[1], 4);
      all.max_error = std::max(all.max_error, static_cast<double>(e));
      all.max_ref = std::max(all.max_ref, static_cast<double>(m));
      all.nan_mismatch += r[2];
      all.inf_mismatch += r[3];
      const double allowed = tol * (m > 0 ? m : 1.0);
      bool ok = r[2] == 0 && r[3] == 0 && e <= allowed;
      if (!ok && all.ok) {
        all.detail = fmt::format("output {} differs from the default config's: max |error| {:.4g} (allowed {:.4g} = {} x max |ref| "
                                 "{:.4g}), {} NaN and {} inf mismatches",
                                 i, e, allowed, tol, m, r[2], r[3]);
      }
      all.ok &= ok;
    }
    return all;
  }

  json bench(const json& req, bool& fatal) {
    if (copies.empty()) throw Error("bench before setup");
    json reply;
    reply["id"] = req.value("id", -1);
    auto fail = [&](const char* status, const std::string& detail) {
      reply["status"] = status;
      reply["detail"] = detail;
      return reply;
    };
    // The candidate's CUBIN.
    std::vector<char> cubin;
    if (req.contains("cubin_key")) {
      runtime::DiskCache disk(runtime::DiskCache::default_dir());
      auto hit = disk.get(req["cubin_key"].get<std::string>());
      if (!hit) return fail("error", "the CUBIN is not in the disk cache " + disk.dir().string());
      cubin.assign(hit->begin(), hit->end());
    } else {
      cubin = base64_decode(req.at("cubin_b64").get<std::string>());
    }
    std::unique_ptr<runtime::Module> module;
    CUfunction fn = nullptr;
    try {
      module = std::make_unique<runtime::Module>(cubin);
      fn = module->function(req.at("entry").get<std::string>());
    } catch (const Error& e) {
      return fail("error", std::string("cannot load the CUBIN: ") + e.what());
    }
    // Pruning from the compiled function's attributes and the device's limits.
    runtime::FunctionAttributes a = runtime::Module::attributes(fn);
    auto b = req.at("block").get<std::vector<unsigned>>();
    const long long threads = static_cast<long long>(b.at(0)) * b.at(1) * b.at(2);
    const size_t smem = req.value("smem", size_t(0));
    reply["regs"] = a.num_regs;
    reply["spill_bytes"] = a.local_bytes;
    if (threads > a.max_threads_per_block)
      return fail("pruned", fmt::format("{} threads per block, the compiled function allows {} ({} registers per thread)", threads,
                                        a.max_threads_per_block, a.num_regs));
    if (static_cast<long long>(a.num_regs) * threads > dev.max_regs_per_block)
      return fail("pruned", fmt::format("{} registers x {} threads = {} > {} registers per block", a.num_regs, threads,
                                        static_cast<long long>(a.num_regs) * threads, dev.max_regs_per_block));
    if (static_cast<long long>(a.shared_bytes) + static_cast<long long>(smem) > dev.max_smem_per_block_optin)
      return fail("pruned", fmt::format("{} bytes of static + {} of dynamic shared memory > {} per block", a.shared_bytes, smem,
                                        dev.max_smem_per_block_optin));

    try {
      runtime::Module::opt_in_shared_bytes(fn, smem);
    } catch (const Error& e) {
      return fail("error", e.what());
    }
    const int fault = req.value("fault", 0);
    if (fault == 3) std::abort();
    Launchable l;
    try {
      prepare(l, fn, req);
    } catch (const Error& e) {
      return fail("error", e.what());
    }
    try {
      if (fault == 1 || fault == 2) {
        CUdeviceptr p = fault == 1 ? CUdeviceptr(16) : hang_flag.ptr();
        void* args[] = {&p};
        runtime::launch(fault == 1 ? fault_illegal : fault_hang, runtime::Dim3(1), runtime::Dim3(1), 0, *stream, args);
        sync();
        return fail("error", "the injected fault did not fault");
      }

      // Check run on copy 0: outputs poisoned, inout tensors restored.
      for (size_t i = 0; i < params.size(); ++i) {
        const Param& p = params[i];
        if (!p.tensor) continue;
        if (p.role == 1) copies[0].buffers[i].memset_async(0xFF, *stream);
        if (p.role == 2) copies[0].buffers[i].copy_from_async(pristine[i], p.bytes(), *stream);
      }
      try {
        launch(l, 0);
      } catch (const CudaError& e) {
        if (is_fatal(e.code())) throw Fatal{e.what()};
        return fail(e.code() == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES ? "pruned" : "error", e.what());
      }
      sync();
      if (req.value("reference", false)) {
        for (size_t i = 0; i < params.size(); ++i)
          if (params[i].tensor && params[i].role != 0)
            reference[i].copy_from_async(copies[0].buffers[i], params[i].bytes(), *stream);
        sync();
        have_reference = true;
      } else if (have_reference && req.value("check", true)) {
        Check c = compare_outputs(req.value("tolerance", std::vector<double>{}));
        reply["max_error"] = c.max_error;
        reply["max_ref"] = c.max_ref;
        reply["nan_mismatch"] = c.nan_mismatch;
        reply["inf_mismatch"] = c.inf_mismatch;
        if (!c.ok) return fail("wrong", c.detail);
      }

      // Timing: one launch to size the samples, warm-up, then samples of `inner` launches
      // (rotating argument copies) between two events; the median sample per launch.
      const double best = req.value("best_ms", 0.0);
      const double early = req.value("early_stop", 3.0);
      const int repeats = std::max(1, req.value("repeats", 10));
      const double max_bench_ms = req.value("max_bench_ms", 2000.0);
      runtime::Event e0, e1;
      e0.record(*stream);
      launch(l, next_copy());
      e1.record(*stream);
      sync();
      const double est = std::max(1e-4, static_cast<double>(runtime::Event::elapsed_ms(e0, e1)));
      const int inner = static_cast<int>(std::clamp(std::ceil(0.2 / est), 1.0, 256.0));
      const int warmup = static_cast<int>(std::clamp(std::ceil(5.0 / est), 1.0, 256.0));
      if (!(best > 0 && est > 10 * early * best)) {   // far too slow: skip warm-up
        for (int i = 0; i < warmup; ++i) launch(l, next_copy());
      }
      std::vector<double> samples;
      const double t0 = now_ms();
      bool hopeless = false;
      for (int r = 0; r < repeats; ++r) {
        e0.record(*stream);
        for (int i = 0; i < inner; ++i) launch(l, next_copy());
        e1.record(*stream);
        sync();
        samples.push_back(static_cast<double>(runtime::Event::elapsed_ms(e0, e1)) / inner);
        double lo = *std::min_element(samples.begin(), samples.end());
        if (best > 0 && lo > early * best && samples.size() >= 2) {
          hopeless = true;
          break;
        }
        if (now_ms() - t0 > max_bench_ms && samples.size() >= 3) break;
      }
      reply["samples"] = samples;
      reply["inner"] = inner;
      reply["ms"] = median(samples);
      reply["status"] = hopeless ? "hopeless" : "ok";
      if (hopeless)
        reply["detail"] = fmt::format("stopped early: {:.4g} ms is more than {}x the best so far ({:.4g} ms)", median(samples),
                                      early, best);
      return reply;
    } catch (const Fatal& f) {
      fatal = true;
      return fail("fault", f.what);
    } catch (const CudaError& e) {
      // A failing synchronous call after a launch: the context is suspect.
      fatal = is_fatal(e.code());
      return fail(fatal ? "fault" : "error", e.what());
    }
  }
};

BenchSession::BenchSession() : s_(std::make_unique<State>()) {}
BenchSession::~BenchSession() = default;

std::string BenchSession::handle(const std::string& request, bool& fatal, bool& quit) {
  fatal = false;
  quit = false;
  json req;
  try {
    req = json::parse(request);
  } catch (const json::exception& e) {
    return json{{"ok", false}, {"error", std::string("bad request: ") + e.what()}}.dump();
  }
  const std::string op = req.value("op", std::string());
  try {
    if (op == "hello") return s_->hello().dump();
    if (op == "setup") return s_->setup(req).dump();
    if (op == "bench") return s_->bench(req, fatal).dump();
    if (op == "quit") {
      quit = true;
      return json{{"ok", true}}.dump();
    }
    return json{{"ok", false}, {"error", "unknown op '" + op + "'"}}.dump();
  } catch (const Fatal& f) {
    fatal = true;
    return json{{"ok", false}, {"id", req.value("id", -1)}, {"status", "fault"}, {"detail", f.what}}.dump();
  } catch (const CudaError& e) {
    fatal = is_fatal(e.code());
    return json{{"ok", false}, {"id", req.value("id", -1)}, {"status", fatal ? "fault" : "error"}, {"detail", e.what()}}.dump();
  } catch (const std::exception& e) {
    return json{{"ok", false}, {"id", req.value("id", -1)}, {"status", "error"}, {"error", e.what()}, {"detail", e.what()}}
        .dump();
  }
}

double simulated_ms(const std::string& config_json) {
  json c = json::parse(config_json);
  double penalty = 0;
  const json blocks = c.value("blocks", json::object());
  for (auto& [name, v] : blocks.items())
    penalty += 0.15 * std::abs(std::log2(static_cast<double>(v.get<int64_t>())) - 7.0);
  penalty += 0.1 * std::abs(std::log2(static_cast<double>(c.value("num_warps", 4))) - 3.0);
  return 0.5 * (1.0 + penalty);
}

namespace {
std::string simulate(const std::string& request, bool& fatal, bool& quit) {
  json req;
  try {
    req = json::parse(request);
  } catch (const json::exception& e) {
    return json{{"ok", false}, {"error", std::string("bad request: ") + e.what()}}.dump();
  }
  const std::string op = req.value("op", std::string());
  if (op == "hello") {
    json d{{"name", "Simulated GPU"}, {"cc_major", 9},      {"cc_minor", 0},           {"arch", "sm_90a"},
           {"driver", 0},              {"nvrtc", runtime::nvrtc_version()},            {"sm_count", 132},
           {"l2_bytes", 50 << 20},     {"smem_optin", 232448}, {"regs_per_block", 65536}, {"threads_per_block", 1024},
           {"total_mem", 80LL << 30}};
    return json{{"ok", true}, {"pid", static_cast<long>(::getpid())}, {"device", d}, {"simulated", true}}.dump();
  }
  if (op == "setup") return json{{"ok", true}, {"copies", 1}, {"bytes", 0}}.dump();
  if (op == "quit") {
    quit = true;
    return json{{"ok", true}}.dump();
  }
  if (op != "bench") return json{{"ok", false}, {"error", "unknown op '" + op + "'"}}.dump();
  json reply = json::object();
  reply["id"] = req.value("id", -1);
  std::string cubin;
  if (req.contains("cubin_key")) {
    runtime::DiskCache disk(runtime::DiskCache::default_dir());
    cubin = disk.get(req["cubin_key"].get<std::string>()).value_or("");
  } else {
    auto bytes = base64_decode(req.value("cubin_b64", std::string()));
    cubin.assign(bytes.begin(), bytes.end());
  }
  if (cubin.size() < 4 || cubin.compare(0, 4, "\x7f" "ELF") != 0) {
    reply["status"] = "error";
    reply["detail"] = "no CUBIN (ELF image) arrived";
    return reply.dump();
  }
  const int fault = req.value("fault", 0);
  if (fault == 3) std::abort();
  if (fault == 2)
    while (true) ::pause();
  if (fault == 1) {
    fatal = true;
    reply["status"] = "fault";
    reply["detail"] = "simulated CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)";
    return reply.dump();
  }
  // TILEJIT_TUNE_SIMULATE=<n> with n > 1: each benchmark takes n milliseconds.
  if (const char* sim = std::getenv("TILEJIT_TUNE_SIMULATE")) {
    double wait_ms = std::atof(sim);
    if (wait_ms > 1) ::usleep(static_cast<useconds_t>(wait_ms * 1000));
  }
  double ms = simulated_ms(req.value("config", std::string("{}")));
  const double best = req.value("best_ms", 0.0);
  reply["regs"] = 32;
  reply["ms"] = ms;
  reply["samples"] = json::array({ms, ms});
  reply["status"] = best > 0 && ms > req.value("early_stop", 3.0) * best ? "hopeless" : "ok";
  return reply.dump();
}
}  // namespace

std::string SimulatedSession::handle(const std::string& request, bool& fatal, bool& quit) {
  fatal = false;
  quit = false;
  try {
    return simulate(request, fatal, quit);
  } catch (const std::exception& e) {
    return json{{"ok", false}, {"status", "error"}, {"error", e.what()}, {"detail", e.what()}}.dump();
  }
}

std::unique_ptr<Session> make_session() {
  const char* sim = std::getenv("TILEJIT_TUNE_SIMULATE");
  if (sim && *sim && std::string_view(sim) != "0") return std::make_unique<SimulatedSession>();
  return std::make_unique<BenchSession>();
}

}  // namespace detail
}  // namespace tj::autotune
