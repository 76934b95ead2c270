// `tilejit export` and the LLVM-emitted host launcher (codegen/host_launcher.h), on any
// machine: no GPU is needed.
//
// The launcher objects are linked into shared libraries with `cc` and dlopen'ed; their CUDA
// driver calls bind to the mock driver below, which this test program exports (it is built
// with ENABLE_EXPORTS) and which records every module load, function lookup, tensor map and
// launch. So the tests check what the exported code really does: argument packing against
// the kernel ABI (codegen/cuda_emitter.h), the grid against tj::launch_shape, dispatch,
// error codes and messages, DLPack, thread-safe loading once per context, TMA descriptors,
// persistent and cluster launches. The last tests run the `tilejit export` program and build
// examples/embed against its output with cc and the toolkit's stub libcuda (the CI check).
// (tests/test_export_gpu.cpp runs the exported launchers on a GPU.)
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "autotune/cache.h"
#include "codegen/host_launcher.h"
#include "kernels/library.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/reference.h"
#include "tools/commands.h"

namespace fs = std::filesystem;
using namespace tj;

// ---- the mock driver ------------------------------------------------------------------------

namespace mock {
struct Launch {
  uintptr_t function = 0;
  unsigned grid[3] = {}, block[3] = {}, smem = 0;
  CUstream stream = nullptr;
  std::vector<std::vector<char>> params;   // bytes of each parameter (sizes from State::param_sizes)
  bool ex = false;
  unsigned cluster[3] = {0, 0, 0};
};
struct TmaCall {
  int dtype = 0, rank = 0;
  uintptr_t address = 0;
  std::vector<uint64_t> dims, strides;
  std::vector<uint32_t> box, element_strides;
  int interleave = -1, swizzle = -1, l2 = -1, oob = -1;
};
struct State {
  std::mutex m;
  int cc = 90;
  int sms = 132;
  int resident_blocks = 3;   // cuOccupancyMaxActiveBlocksPerMultiprocessor's answer
  std::vector<std::pair<int, size_t>> occupancy_asks;   // (block threads, dynamic shared memory)
  CUresult launch_result = CUDA_SUCCESS;
  CUresult load_result = CUDA_SUCCESS;
  int load_delay_ms = 0;
  std::atomic<int> module_loads{0};
  std::vector<const void*> images;
  std::vector<std::string> functions;
  std::vector<std::pair<int, int>> func_attrs;
  std::vector<Launch> launches;
  std::vector<TmaCall> tmas;
  std::vector<size_t> param_sizes;
  void reset() {
    std::lock_guard lock(m);
    cc = 90;
    sms = 132;
    resident_blocks = 3;
    occupancy_asks.clear();
    launch_result = load_result = CUDA_SUCCESS;
    load_delay_ms = 0;
    module_loads = 0;
    images.clear();
    functions.clear();
    func_attrs.clear();
    launches.clear();
    tmas.clear();
    param_sizes.clear();
  }
};
State& st() {
  static State s;
  return s;
}
thread_local CUcontext t_ctx = reinterpret_cast<CUcontext>(0x1000);
}  // namespace mock

extern "C" {
CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = mock::t_ctx;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* d) {
  *d = 0;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
  auto& s = mock::st();
  if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) *v = s.cc / 10;
  else if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) *v = s.cc % 10;
  else if (a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) *v = s.sms;
  else return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  auto& s = mock::st();
  if (s.load_delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(s.load_delay_ms));
  if (s.load_result != CUDA_SUCCESS) return s.load_result;
  std::lock_guard lock(s.m);
  int n = ++s.module_loads;
  s.images.push_back(image);
  *module = reinterpret_cast<CUmodule>(static_cast<uintptr_t>(0x100000 * n));
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  auto& s = mock::st();
  std::lock_guard lock(s.m);
  s.functions.push_back(name);
  *f = reinterpret_cast<CUfunction>(reinterpret_cast<uintptr_t>(m) + 0x10);
  return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction, int threads, size_t smem) {
  auto& s = mock::st();
  std::lock_guard lock(s.m);
  s.occupancy_asks.emplace_back(threads, smem);
  *blocks = s.resident_blocks;
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction, CUfunction_attribute a, int v) {
  auto& s = mock::st();
  std::lock_guard lock(s.m);
  s.func_attrs.emplace_back(static_cast<int>(a), v);
  return CUDA_SUCCESS;
}
static void record_params(mock::Launch& l, void** params) {
  for (size_t i = 0; i < mock::st().param_sizes.size(); ++i) {
    const char* p = static_cast<const char*>(params[i]);
    l.params.emplace_back(p, p + mock::st().param_sizes[i]);
  }
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream stream, void** params, void** extra) {
  auto& s = mock::st();
  std::lock_guard lock(s.m);
  if (s.launch_result != CUDA_SUCCESS) return s.launch_result;
  mock::Launch l;
  l.function = reinterpret_cast<uintptr_t>(f);
  l.grid[0] = gx, l.grid[1] = gy, l.grid[2] = gz;
  l.block[0] = bx, l.block[1] = by, l.block[2] = bz;
  l.smem = smem;
  l.stream = stream;
  if (extra) return CUDA_ERROR_INVALID_VALUE;
  record_params(l, params);
  s.launches.push_back(std::move(l));
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  auto& s = mock::st();
  std::lock_guard lock(s.m);
  mock::Launch l;
  l.ex = true;
  l.function = reinterpret_cast<uintptr_t>(f);
  l.grid[0] = c->gridDimX, l.grid[1] = c->gridDimY, l.grid[2] = c->gridDimZ;
  l.block[0] = c->blockDimX, l.block[1] = c->blockDimY, l.block[2] = c->blockDimZ;
  l.smem = c->sharedMemBytes;
  l.stream = c->hStream;
  for (unsigned i = 0; i < c->numAttrs; ++i) {
    if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      l.cluster[0] = c->attrs[i].value.clusterDim.x;
      l.cluster[1] = c->attrs[i].value.clusterDim.y;
      l.cluster[2] = c->attrs[i].value.clusterDim.z;
    }
  }
  if (extra) return CUDA_ERROR_INVALID_VALUE;
  record_params(l, params);
  s.launches.push_back(std::move(l));
  return CUDA_SUCCESS;
}
CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank, void* address,
                                const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  auto& s = mock::st();
  std::lock_guard lock(s.m);
  mock::TmaCall t;
  t.dtype = dtype;
  t.rank = static_cast<int>(rank);
  t.address = reinterpret_cast<uintptr_t>(address);
  for (cuuint32_t i = 0; i < rank; ++i) {
    t.dims.push_back(dims[i]);
    t.box.push_back(box[i]);
    t.element_strides.push_back(element_strides[i]);
    if (i + 1 < rank) t.strides.push_back(strides[i]);
  }
  t.interleave = interleave;
  t.swizzle = swizzle;
  t.l2 = l2;
  t.oob = oob;
  s.tmas.push_back(t);
  std::memset(map, 0, sizeof(*map));
  std::memcpy(map, &t.address, sizeof(t.address));   // marks the map with the tensor's address
  return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult r, const char** out) {
  *out = r == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES ? "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
         : r == CUDA_ERROR_NO_BINARY_FOR_GPU     ? "CUDA_ERROR_NO_BINARY_FOR_GPU"
                                                 : "CUDA_ERROR_MOCK";
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult, const char** out) {
  *out = "mock description";
  return CUDA_SUCCESS;
}
}  // extern "C"

namespace {

// The C API's structs (the generated header's tj_tensor, tj_arg).
struct TjTensor {
  void* data;
  int32_t dtype;
  int32_t rank;
  const int64_t* shape;
  const int64_t* strides;
};
struct TjArg {
  int32_t kind;
  int32_t reserved;
  union {
    const TjTensor* tensor;
    double f;
    int64_t i;
  } value;
};
static_assert(sizeof(TjTensor) == 32 && sizeof(TjArg) == 16);

enum : int {
  kSuccess = 0,
  kInvalid = 1,
  kDType = 2,
  kShape = 3,
  kAlignment = 4,
  kUnsupportedDevice = 5,
  kNoContext = 6,
  kCuda = 7,
  kTooLarge = 8
};

// Runs a shell command; its output goes to *output (and into the test log when the exit
// status is not `expect`). Returns the exit status.
int run(const std::string& cmd, std::string* output = nullptr, int expect = 0) {
  static std::atomic<int> n{0};
  fs::path log = fs::temp_directory_path() / fmt::format("tj_export_cmd_{}_{}.log", ::getpid(), n++);
  int rc = std::system(("( " + cmd + " ) > " + log.string() + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  if (output) *output = ss.str();
  fs::remove(log);
  rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  if (rc != expect) MESSAGE(fmt::format("`{}` -> {}:\n{}", cmd, rc, ss.str()));
  return rc;
}

fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("tj_export_test_{}_{}", ::getpid(), name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A kernel's specializations, compiled (NVRTC, no GPU) and wrapped into a launcher library.
struct Exported {
  codegen::LauncherKernel lk;
  std::deque<codegen::GeneratedKernel> tweaked;   // generated kernels modified by a test
  fs::path dir;
  void* so = nullptr;
  ~Exported() {
    if (so) dlclose(so);
    if (!dir.empty()) fs::remove_all(dir);
  }
  template <class F>
  F fn(const std::string& name) const {
    void* p = dlsym(so, name.c_str());
    REQUIRE_MESSAGE(p != nullptr, name);
    return reinterpret_cast<F>(p);
  }
  const char* last_error() const { return fn<const char* (*)()>(codegen::c_identifier(lk.name) + "_last_error")(); }
};

struct VariantSpec {
  VariantSpec(std::vector<ArgSpec> s, std::string a = "sm_90a") : specs(std::move(s)), arch(std::move(a)) {}
  std::vector<ArgSpec> specs;
  std::string arch;
  std::optional<Config> config;
};

std::unique_ptr<Exported> export_kernel(const Kernel& k, const std::vector<VariantSpec>& variants, const std::string& tag,
                                        const std::function<void(codegen::GeneratedKernel&)>& tweak = {}) {
  auto e = std::make_unique<Exported>();
  e->lk.name = k.name();
  e->lk.slots = k.slots();
  for (const VariantSpec& v : variants) {
    Config cfg = v.config ? *v.config : default_config(k.trace(v.specs));
    CompileRequest req;
    req.arch = v.arch;
    req.load = false;
    const CompiledKernel& ck = compile(k, v.specs, cfg, req);
    codegen::LauncherVariant lv;
    lv.ir = &ck.ir;
    lv.config = &ck.config;
    lv.kernel = &ck.generated;
    if (tweak) {
      e->tweaked.push_back(ck.generated);
      tweak(e->tweaked.back());
      lv.kernel = &e->tweaked.back();
    }
    lv.arch = v.arch;
    lv.cubin = std::string_view(ck.cubin.data(), ck.cubin.size());
    lv.specs = v.specs;
    e->lk.variants.push_back(std::move(lv));
  }
  e->dir = scratch(tag);
  const std::string obj = (e->dir / "launcher.o").string(), so = (e->dir / "launcher.so").string();
  {
    std::ofstream f(obj, std::ios::binary);
    std::string bytes = codegen::emit_launcher_object(e->lk);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  REQUIRE(run(fmt::format("cc -shared -o {} {}", so, obj)) == 0);
  e->so = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(e->so != nullptr, dlerror());
  return e;
}

TensorSpec tspec(DType t, std::vector<int64_t> shape) { return TensorSpec{t, std::move(shape)}; }

std::vector<ArgSpec> vector_add_specs(int64_t n, DType t = DType::f32) { return {tspec(t, {n}), tspec(t, {n}), tspec(t, {n})}; }

std::vector<ArgSpec> attention_specs(std::vector<int64_t> shape, bool causal, DType t = DType::f32) {
  return {tspec(t, shape), tspec(t, shape), tspec(t, shape), tspec(t, shape), RuntimeScalar{0.125f}, causal};
}

// The words of a packed TensorArg<R>: data, shape[R], stride[R].
std::vector<int64_t> words(const std::vector<char>& bytes) {
  std::vector<int64_t> w(bytes.size() / 8);
  std::memcpy(w.data(), bytes.data(), w.size() * 8);
  return w;
}

int64_t expected_programs(const CompiledKernel& ck, const std::vector<ArgValue>& args) {
  return launch_shape(ck.ir, ck.config, args).programs;
}

TensorView view(uintptr_t data, DType t, std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
  TensorView v;
  v.data = reinterpret_cast<void*>(data);
  v.dtype = t;
  v.shape = std::move(shape);
  v.strides = std::move(strides);
  v.device = Device::cuda;
  return v;
}

using VectorAddLaunch = int (*)(CUstream, const TjTensor*, const TjTensor*, const TjTensor*);
using AttentionLaunch = int (*)(CUstream, const TjTensor*, const TjTensor*, const TjTensor*, const TjTensor*, float, int);

TjTensor tj_tensor(uintptr_t data, DType t, const std::vector<int64_t>& shape, const int64_t* strides = nullptr) {
  return TjTensor{reinterpret_cast<void*>(data), static_cast<int32_t>(t), static_cast<int32_t>(shape.size()), shape.data(),
                  strides};
}

}  // namespace

TEST_CASE("export: the launcher packs vector_add's arguments like runtime/jit.cpp and launches programs blocks") {
  mock::st().reset();
  auto e = export_kernel(kernels::vector_add(), {{vector_add_specs(-1)}}, "vadd");
  const CompiledKernel& ck =
      compile(kernels::vector_add(), vector_add_specs(-1), *e->lk.variants[0].config, CompileRequest{"sm_90a", false, false});
  auto launch = e->fn<VectorAddLaunch>("vector_add_launch");
  for (int64_t n : {1000, 64, 1, 100003}) {
    mock::st().launches.clear();
    mock::st().param_sizes = {24, 24, 24};
    std::vector<int64_t> shape{n};
    // Fake device addresses 16 MB apart: the launch's check keeps an input apart from the output.
    TjTensor x = tj_tensor(0x1000000, DType::f32, shape), y = tj_tensor(0x2000000, DType::f32, shape),
             out = tj_tensor(0x3000000, DType::f32, shape);
    CUstream stream = reinterpret_cast<CUstream>(0x77);
    REQUIRE_MESSAGE(launch(stream, &x, &y, &out) == kSuccess, e->last_error());
    REQUIRE(mock::st().launches.size() == 1);
    const mock::Launch& l = mock::st().launches[0];
    std::vector<ArgValue> args{view(0x1000000, DType::f32, shape), view(0x2000000, DType::f32, shape),
                               view(0x3000000, DType::f32, shape)};
    CHECK(l.grid[0] == expected_programs(ck, args));
    CHECK(l.grid[1] == 1);
    CHECK(l.block[0] == static_cast<unsigned>(e->lk.variants[0].kernel->threads));
    CHECK(l.smem == e->lk.variants[0].kernel->dynamic_smem_bytes);
    CHECK(l.stream == stream);
    CHECK(!l.ex);
    REQUIRE(l.params.size() == 3);
    CHECK(words(l.params[0]) == std::vector<int64_t>{0x1000000, n, 1});
    CHECK(words(l.params[1]) == std::vector<int64_t>{0x2000000, n, 1});
    CHECK(words(l.params[2]) == std::vector<int64_t>{0x3000000, n, 1});
  }
  // One module load and function lookup for every launch in this context.
  CHECK(mock::st().module_loads == 1);
  REQUIRE(mock::st().functions.size() == 1);
  CHECK(mock::st().functions[0] == e->lk.variants[0].kernel->entry);
  // The CUBIN handed to the driver is the compiled one, byte for byte.
  REQUIRE(mock::st().images.size() == 1);
  CHECK(std::memcmp(mock::st().images[0], e->lk.variants[0].cubin.data(), e->lk.variants[0].cubin.size()) == 0);

  // Strides are passed through (in elements); an empty tensor launches nothing.
  mock::st().launches.clear();
  std::vector<int64_t> shape{500};
  int64_t stride2[] = {2};
  TjTensor x = tj_tensor(0x1000000, DType::f32, shape, stride2), y = tj_tensor(0x2000000, DType::f32, shape),
           out = tj_tensor(0x3000000, DType::f32, shape);
  REQUIRE(launch(nullptr, &x, &y, &out) == kSuccess);
  REQUIRE(mock::st().launches.size() == 1);
  CHECK(words(mock::st().launches[0].params[0]) == std::vector<int64_t>{0x1000000, 500, 2});
  mock::st().launches.clear();
  std::vector<int64_t> empty{0};
  TjTensor ex = tj_tensor(0, DType::f32, empty), ey = tj_tensor(0, DType::f32, empty), eo = tj_tensor(0, DType::f32, empty);
  CHECK(launch(nullptr, &ex, &ey, &eo) == kSuccess);
  CHECK(mock::st().launches.empty());
}

TEST_CASE("export: dispatch by shape, dtype, flag and architecture, and errors as codes with messages") {
  mock::st().reset();
  // Static specializations for [1,2,64,32] causal 0/1 on sm_90a and sm_80, a dynamic one on sm_80.
  std::vector<VariantSpec> vs;
  for (bool causal : {false, true})
    for (const char* arch : {"sm_80", "sm_90a"}) vs.push_back({attention_specs({1, 2, 64, 32}, causal), arch});
  vs.push_back({attention_specs({-1, -1, -1, 32}, false), "sm_80"});
  auto e = export_kernel(kernels::attention(), vs, "attention");
  auto launch = e->fn<AttentionLaunch>("attention_launch");
  auto specializations = e->fn<const char* (*)()>("attention_specializations");
  INFO(specializations());
  CHECK(std::string(specializations()).find("q=f32[?,?,?,32]") != std::string::npos);

  std::vector<int64_t> shape{1, 2, 64, 32};
  TjTensor q = tj_tensor(0x10000, DType::f32, shape), k = tj_tensor(0x20000, DType::f32, shape),
           v = tj_tensor(0x30000, DType::f32, shape), o = tj_tensor(0x40000, DType::f32, shape);
  mock::st().param_sizes = {8 + 64, 8 + 64, 8 + 64, 8 + 64, 4};
  auto entry_image = [&](size_t variant) { return static_cast<const void*>(e->lk.variants[variant].cubin.data()); };

  // cc 9.0: the sm_90a CUBIN of the matching causal flag.
  for (int causal : {0, 1}) {
    mock::st().launches.clear();
    mock::st().images.clear();
    REQUIRE_MESSAGE(launch(nullptr, &q, &k, &v, &o, 0.5f, causal) == kSuccess, e->last_error());
    REQUIRE(mock::st().launches.size() == 1);
    REQUIRE(mock::st().images.size() == 1);
    CHECK(std::memcmp(mock::st().images[0], entry_image(causal ? 3 : 1), 64) == 0);
    const mock::Launch& l = mock::st().launches[0];
    float scale = 0;
    std::memcpy(&scale, l.params[4].data(), 4);
    CHECK(scale == 0.5f);
    CHECK(words(l.params[0]) == std::vector<int64_t>{0x10000, 1, 2, 64, 32, 4096, 2048, 32, 1});
    const CompiledKernel& ck = compile(kernels::attention(), attention_specs({1, 2, 64, 32}, causal != 0),
                                       *e->lk.variants[causal ? 3 : 1].config, CompileRequest{"sm_90a", false, false});
    std::vector<ArgValue> args{view(0x10000, DType::f32, shape), view(0x20000, DType::f32, shape),
                               view(0x30000, DType::f32, shape), view(0x40000, DType::f32, shape), 0.5f};
    CHECK(l.grid[0] == expected_programs(ck, args));
  }

  // Another shape: the static entries do not fit; on cc 9.0 the dynamic sm_80 entry cannot run.
  std::vector<int64_t> other{2, 3, 100, 32};
  TjTensor q2 = tj_tensor(0x10000, DType::f32, other), k2 = tj_tensor(0x20000, DType::f32, other),
           v2 = tj_tensor(0x30000, DType::f32, other), o2 = tj_tensor(0x40000, DType::f32, other);
  CHECK(launch(nullptr, &q2, &k2, &v2, &o2, 0.5f, 0) == kUnsupportedDevice);
  CHECK(std::string(e->last_error()).find("no CUBIN for this GPU") != std::string::npos);
  CHECK(std::string(e->last_error()).find("compute capability 9.0") != std::string::npos);
  // On an sm_86 GPU the dynamic sm_80 CUBIN serves it.
  mock::t_ctx = reinterpret_cast<CUcontext>(0x2000);
  mock::st().cc = 86;
  mock::st().launches.clear();
  REQUIRE_MESSAGE(launch(nullptr, &q2, &k2, &v2, &o2, 0.5f, 0) == kSuccess, e->last_error());
  REQUIRE(mock::st().launches.size() == 1);
  CHECK(words(mock::st().launches[0].params[0])[1] == 2);
  // ... but causal=1 with that shape was not exported.
  CHECK(launch(nullptr, &q2, &k2, &v2, &o2, 0.5f, 1) == kShape);
  std::string msg = e->last_error();
  INFO(msg);
  CHECK(msg.find("attention: no exported specialization for these shapes: q=f32[2,3,100,32]") == 0);
  CHECK(msg.find("causal=1") != std::string::npos);
  CHECK(msg.find("exported: sm_90a q=f32[1,2,64,32]") != std::string::npos);
  mock::t_ctx = reinterpret_cast<CUcontext>(0x1000);
  mock::st().cc = 90;

  // Wrong dtype / rank, NULL tensors, negative dims, misaligned data.
  TjTensor qb = tj_tensor(0x10000, DType::bf16, shape);
  CHECK(launch(nullptr, &qb, &k, &v, &o, 0.5f, 0) == kDType);
  CHECK(std::string(e->last_error()).find("q=bf16[1,2,64,32]") != std::string::npos);
  std::vector<int64_t> rank3{2, 64, 32};
  TjTensor q3 = tj_tensor(0x10000, DType::f32, rank3);
  CHECK(launch(nullptr, &q3, &k, &v, &o, 0.5f, 0) == kDType);
  CHECK(launch(nullptr, nullptr, &k, &v, &o, 0.5f, 0) == kInvalid);
  CHECK(std::string(e->last_error()) == "attention: argument 'q' is NULL");
  TjTensor qmis = tj_tensor(0x10002, DType::f32, shape);
  CHECK(launch(nullptr, &qmis, &k, &v, &o, 0.5f, 0) == kAlignment);
  CHECK(std::string(e->last_error()).find("not aligned to 4 bytes (f32)") != std::string::npos);
  TjTensor qnull = tj_tensor(0, DType::f32, shape);
  CHECK(launch(nullptr, &qnull, &k, &v, &o, 0.5f, 0) == kInvalid);
  mock::st().cc = 86;
  mock::t_ctx = reinterpret_cast<CUcontext>(0x2000);
  std::vector<int64_t> negative{1, -2, 64, 32};
  TjTensor qneg = tj_tensor(0x10000, DType::f32, negative);
  CHECK(launch(nullptr, &qneg, &k, &v, &o, 0.5f, 0) == kInvalid);
  CHECK(std::string(e->last_error()).find("dimension 1 is negative (-2)") != std::string::npos);
  mock::t_ctx = reinterpret_cast<CUcontext>(0x1000);
  mock::st().cc = 90;

  // No context; a failing launch; a failing module load.
  mock::t_ctx = nullptr;
  CHECK(launch(nullptr, &q, &k, &v, &o, 0.5f, 0) == kNoContext);
  mock::t_ctx = reinterpret_cast<CUcontext>(0x1000);
  mock::st().launch_result = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  CHECK(launch(nullptr, &q, &k, &v, &o, 0.5f, 0) == kCuda);
  CHECK(std::string(e->last_error()).find("cuLaunchKernel") != std::string::npos);
  CHECK(std::string(e->last_error()).find("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (mock description)") != std::string::npos);
  mock::st().launch_result = CUDA_SUCCESS;
  mock::t_ctx = reinterpret_cast<CUcontext>(0x3000);   // a new context: loads again
  mock::st().load_result = CUDA_ERROR_NO_BINARY_FOR_GPU;
  CHECK(launch(nullptr, &q, &k, &v, &o, 0.5f, 0) == kCuda);
  CHECK(std::string(e->last_error()).find("cuModuleLoadData") != std::string::npos);
  mock::st().load_result = CUDA_SUCCESS;
  CHECK(launch(nullptr, &q, &k, &v, &o, 0.5f, 0) == kSuccess);   // the failure was not cached
  mock::t_ctx = reinterpret_cast<CUcontext>(0x1000);

  // Status strings; the last error is per thread.
  auto message = e->fn<const char* (*)(int)>("tj_status_message");
  CHECK(std::string(message(kShape)) == "no exported specialization for these shapes or flags");
  CHECK(std::string(message(kSuccess)) == "success");
  CHECK(std::string(message(99)) == "unknown tj_status");
  std::string other_thread = "unset";
  std::thread([&] { other_thread = e->last_error(); }).join();
  CHECK(other_thread.empty());
}

TEST_CASE("export: DLPack tensors and the generic launchv") {
  mock::st().reset();
  auto e = export_kernel(kernels::attention(), {{attention_specs({1, 2, 64, 32}, true, DType::bf16)}}, "dlpack");
  // DLTensor, laid out as dlpack.h's (stable ABI).
  struct DL {
    void* data;
    int32_t device_type, device_id;
    int32_t ndim;
    uint8_t code, bits;
    uint16_t lanes;
    int64_t* shape;
    int64_t* strides;
    uint64_t byte_offset;
  };
  static_assert(sizeof(DL) == 48);
  using Launch = int (*)(CUstream, const DL*, const DL*, const DL*, const DL*, float, int);
  auto launch = e->fn<Launch>("attention_launch_dlpack");
  int64_t shape[] = {1, 2, 64, 32};
  auto dl = [&](uintptr_t data) { return DL{reinterpret_cast<void*>(data), 2, 0, 4, 4, 16, 1, shape, nullptr, 256}; };
  DL q = dl(0x10000), k = dl(0x20000), v = dl(0x30000), o = dl(0x40000);
  mock::st().param_sizes = {72, 72, 72, 72, 4};
  REQUIRE_MESSAGE(launch(nullptr, &q, &k, &v, &o, 0.25f, 1) == kSuccess, e->last_error());
  REQUIRE(mock::st().launches.size() == 1);
  CHECK(words(mock::st().launches[0].params[0])[0] == 0x10000 + 256);   // byte_offset applied
  DL cpu = q;
  cpu.device_type = 1;   // kDLCPU
  CHECK(launch(nullptr, &cpu, &k, &v, &o, 0.25f, 1) == kInvalid);
  CHECK(std::string(e->last_error()).find("not in CUDA device memory") != std::string::npos);
  DL f16 = q;
  f16.code = 2;   // kDLFloat 16: f16, not exported
  CHECK(launch(nullptr, &f16, &k, &v, &o, 0.25f, 1) == kDType);
  DL weird = q;
  weird.code = 5;   // complex
  CHECK(launch(nullptr, &weird, &k, &v, &o, 0.25f, 1) == kDType);
  CHECK(std::string(e->last_error()).find("DLPack dtype (code 5, bits 16)") != std::string::npos);

  // launchv: tensors, a float scalar and the flag, in slot order.
  using LaunchV = int (*)(CUstream, const TjArg*, int32_t);
  auto launchv = e->fn<LaunchV>("attention_launchv");
  std::vector<int64_t> s{1, 2, 64, 32};
  TjTensor tq = tj_tensor(0x10000, DType::bf16, s), tk = tj_tensor(0x20000, DType::bf16, s),
           tv = tj_tensor(0x30000, DType::bf16, s), to = tj_tensor(0x40000, DType::bf16, s);
  TjArg args[6] = {};
  args[0].kind = 0, args[0].value.tensor = &tq;
  args[1].kind = 0, args[1].value.tensor = &tk;
  args[2].kind = 0, args[2].value.tensor = &tv;
  args[3].kind = 0, args[3].value.tensor = &to;
  args[4].kind = 1, args[4].value.f = 0.75;
  args[5].kind = 2, args[5].value.i = 1;
  mock::st().launches.clear();
  REQUIRE_MESSAGE(launchv(nullptr, args, 6) == kSuccess, e->last_error());
  REQUIRE(mock::st().launches.size() == 1);
  float scale = 0;
  std::memcpy(&scale, mock::st().launches[0].params[4].data(), 4);
  CHECK(scale == 0.75f);
  CHECK(launchv(nullptr, args, 5) == kInvalid);
  CHECK(std::string(e->last_error()).find("takes 6 arguments (q, k, v, o, scale, causal), got 5") != std::string::npos);
  args[5].value.i = 0;   // causal=0 was not exported
  CHECK(launchv(nullptr, args, 6) == kShape);
  args[5].value.i = 1;
  args[0].kind = 1;
  CHECK(launchv(nullptr, args, 6) == kInvalid);
}

TEST_CASE("export: launch extents follow the IR's integer semantics (floordiv, mod, min/max, division by zero)") {
  mock::st().reset();
  static const Kernel probe = kernel("extent_probe", {"x", "y", "out"}, [](In x, In y, Out out) {
    auto n = x.dim(0);
    auto m = y.dim(0);
    for (auto i : grid(floordiv(n - 50, m) + (n % m) * 2 - minimum(n, 3 * m) / 2 + maximum(m - n, 1))) {
      (void)i;
      for (auto t : tile(n, block(16))) out.store(t, x.load(t));
    }
  });
  std::vector<ArgSpec> dyn{tspec(DType::f32, {-1}), tspec(DType::f32, {-1}), tspec(DType::f32, {-1})};
  auto e = export_kernel(probe, {{dyn}}, "extents");
  const CompiledKernel& ck = compile(probe, dyn, *e->lk.variants[0].config, CompileRequest{"sm_90a", false, false});
  using Launch = int (*)(CUstream, const TjTensor*, const TjTensor*, const TjTensor*);
  auto launch = e->fn<Launch>("extent_probe_launch");
  mock::st().param_sizes = {24, 24, 24};
  for (auto [n, m] : std::vector<std::pair<int64_t, int64_t>>{{1000, 7}, {10, 3}, {3, 5}, {1000, 1}, {0, 1}, {10, 100},
                                                               {77, 13}, {5, 0}}) {
    CAPTURE(n);
    CAPTURE(m);
    std::vector<int64_t> sn{n}, sm{m};
    TjTensor x = tj_tensor(0x10000, DType::f32, sn), y = tj_tensor(0x20000, DType::f32, sm),
             out = tj_tensor(0x30000, DType::f32, sn);
    std::vector<ArgValue> args{view(0x10000, DType::f32, sn), view(0x20000, DType::f32, sm), view(0x30000, DType::f32, sn)};
    mock::st().launches.clear();
    int rc = launch(nullptr, &x, &y, &out);
    int64_t programs = -1;
    try {
      programs = expected_programs(ck, args);
    } catch (const Error&) {
      programs = -1;   // division by zero: the reference executor refuses
    }
    if (programs < 0) {
      CHECK(rc == kShape);
      CHECK(std::string(e->last_error()).find("divides by zero") != std::string::npos);
    } else if (programs == 0) {
      CHECK(rc == kSuccess);
      CHECK(mock::st().launches.empty());
    } else {
      REQUIRE_MESSAGE(rc == kSuccess, e->last_error());
      REQUIRE(mock::st().launches.size() == 1);
      CHECK(mock::st().launches[0].grid[0] == programs);
    }
  }
}

TEST_CASE("export: modules load once per context, from many threads at once") {
  mock::st().reset();
  auto e = export_kernel(kernels::vector_add(), {{vector_add_specs(-1)}}, "threads");
  auto launch = e->fn<VectorAddLaunch>("vector_add_launch");
  auto load = e->fn<int (*)()>("vector_add_load");
  mock::st().param_sizes = {24, 24, 24};
  mock::st().load_delay_ms = 20;
  std::vector<int64_t> shape{4096};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      mock::t_ctx = reinterpret_cast<CUcontext>(static_cast<uintptr_t>(0x1000 + 0x1000 * (t % 2)));   // two contexts
      TjTensor x = tj_tensor(0x10000, DType::f32, shape), y = tj_tensor(0x20000, DType::f32, shape),
               out = tj_tensor(0x30000, DType::f32, shape);
      for (int i = 0; i < 20; ++i)
        if (launch(nullptr, &x, &y, &out) != kSuccess) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  CHECK(mock::st().module_loads == 2);   // once per context
  CHECK(mock::st().launches.size() == 160);
  CHECK(load() == kSuccess);             // already loaded in this context
  CHECK(mock::st().module_loads == 2);
  mock::st().cc = 80;
  mock::t_ctx = reinterpret_cast<CUcontext>(0x9000);
  CHECK(load() == kUnsupportedDevice);   // only sm_90a was exported
  mock::t_ctx = reinterpret_cast<CUcontext>(0x1000);
}

TEST_CASE("export: TMA descriptors, persistent grids, clusters and the shared-memory opt-in") {
  mock::st().reset();
  // vector_add's code with the launch shape of a tensor-core lowering: x through TMA, a
  // persistent grid of 2 blocks per SM, clusters of 2, 100 KB of shared memory.
  auto e = export_kernel(kernels::vector_add(), {{vector_add_specs(-1)}}, "tma", [](codegen::GeneratedKernel& g) {
    g.tma.push_back(codegen::TmaOperand{0, {64}, 128, {}});
    g.persistent = true;
    g.blocks_per_sm = 2;
    g.cluster_x = 2;
    g.dynamic_smem_bytes = 100 * 1024;
  });
  auto launch = e->fn<VectorAddLaunch>("vector_add_launch");
  mock::st().param_sizes = {24, 24, 24, sizeof(CUtensorMap), 8};
  mock::st().sms = 132;
  for (int64_t n : {100000, 640, 65}) {
    CAPTURE(n);
    mock::st().launches.clear();
    mock::st().tmas.clear();
    std::vector<int64_t> shape{n};
    TjTensor x = tj_tensor(0x10000, DType::f32, shape), y = tj_tensor(0x20000, DType::f32, shape),
             out = tj_tensor(0x30000, DType::f32, shape);
    REQUIRE_MESSAGE(launch(nullptr, &x, &y, &out) == kSuccess, e->last_error());
    REQUIRE(mock::st().launches.size() == 1);
    REQUIRE(mock::st().tmas.size() == 1);
    const mock::Launch& l = mock::st().launches[0];
    const int64_t programs = (n + 63) / 64;
    int64_t blocks = std::min<int64_t>(programs, 132 * 2);
    blocks = (blocks + 1) / 2 * 2;
    CHECK(l.ex);
    CHECK(l.grid[0] == blocks);
    CHECK(l.cluster[0] == 2);
    CHECK(l.cluster[1] == 1);
    CHECK(l.smem == 100 * 1024);
    int64_t passed_programs = 0;
    std::memcpy(&passed_programs, l.params[4].data(), 8);
    CHECK(passed_programs == programs);
    uintptr_t map_address = 0;
    std::memcpy(&map_address, l.params[3].data(), sizeof(map_address));
    CHECK(map_address == 0x10000);
    const mock::TmaCall& t = mock::st().tmas[0];
    CHECK(t.dtype == CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
    CHECK(t.rank == 1);
    CHECK(t.dims == std::vector<uint64_t>{static_cast<uint64_t>(n)});
    CHECK(t.box == std::vector<uint32_t>{64});
    CHECK(t.element_strides == std::vector<uint32_t>{1});
    CHECK(t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B);
    CHECK(t.interleave == CU_TENSOR_MAP_INTERLEAVE_NONE);
    CHECK(t.l2 == CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
    CHECK(t.oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }
  // The opt-in above 48 KB happened once, at load.
  REQUIRE(mock::st().func_attrs.size() == 1);
  CHECK(mock::st().func_attrs[0] == std::make_pair(static_cast<int>(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), 100 * 1024));
  // TMA needs a 16-byte aligned base and a contiguous last dim.
  std::vector<int64_t> shape{4096};
  TjTensor mis = tj_tensor(0x10004, DType::f32, shape), y = tj_tensor(0x20000, DType::f32, shape),
           out = tj_tensor(0x30000, DType::f32, shape);
  CHECK(launch(nullptr, &mis, &y, &out) == kAlignment);
  CHECK(std::string(e->last_error()).find("must be 16-byte aligned") != std::string::npos);
  int64_t stride2[] = {2};
  TjTensor strided = tj_tensor(0x10000, DType::f32, shape, stride2);
  CHECK(launch(nullptr, &strided, &y, &out) == kAlignment);
  CHECK(std::string(e->last_error()).find("last dim must be contiguous") != std::string::npos);
}

TEST_CASE("export: two programs a block (knob wg_programs) launch half as many blocks, rounded up, then the persistent cap") {
  mock::st().reset();
  for (bool persistent : {false, true}) {
    CAPTURE(persistent);
    auto e = export_kernel(kernels::vector_add(), {{vector_add_specs(-1)}}, persistent ? "pairs_persistent" : "pairs",
                           [&](codegen::GeneratedKernel& g) {
                             g.programs_per_block = 2;
                             g.persistent = persistent;
                           });
    auto launch = e->fn<VectorAddLaunch>("vector_add_launch");
    mock::st().param_sizes = persistent ? std::vector<size_t>{24, 24, 24, 8} : std::vector<size_t>{24, 24, 24};
    mock::st().sms = 4;
    for (int64_t n : {100000, 640, 65}) {
      CAPTURE(n);
      mock::st().launches.clear();
      std::vector<int64_t> shape{n};
      TjTensor x = tj_tensor(0x10000, DType::f32, shape), y = tj_tensor(0x20000, DType::f32, shape),
               out = tj_tensor(0x30000, DType::f32, shape);
      REQUIRE_MESSAGE(launch(nullptr, &x, &y, &out) == kSuccess, e->last_error());
      REQUIRE(mock::st().launches.size() == 1);
      const int64_t programs = (n + 63) / 64, blocks = (programs + 1) / 2;
      CHECK(mock::st().launches[0].grid[0] == (persistent ? std::min<int64_t>(blocks, 4) : blocks));
    }
  }
}

TEST_CASE("export: a persistent SIMT grid takes as many blocks an SM as the occupancy calculator fits") {
  mock::st().reset();
  auto e = export_kernel(kernels::vector_add(), {{vector_add_specs(-1)}}, "persistent_simt", [](codegen::GeneratedKernel& g) {
    g.persistent = true;
    g.blocks_per_sm = 0;   // the CUDA emitter's persistent SIMT kernels
  });
  auto launch = e->fn<VectorAddLaunch>("vector_add_launch");
  mock::st().param_sizes = {24, 24, 24, 8};
  for (int resident : {3, 0}) {   // 0 (a failed fit) still launches one block an SM
    CAPTURE(resident);
    mock::st().launches.clear();
    mock::st().occupancy_asks.clear();
    mock::st().resident_blocks = resident;
    std::vector<int64_t> shape{10000000};
    TjTensor x = tj_tensor(0x10000, DType::f32, shape), y = tj_tensor(0x20000, DType::f32, shape),
             out = tj_tensor(0x30000, DType::f32, shape);
    REQUIRE_MESSAGE(launch(nullptr, &x, &y, &out) == kSuccess, e->last_error());
    REQUIRE(mock::st().launches.size() == 1);
    REQUIRE(mock::st().occupancy_asks.size() == 1);
    CHECK(mock::st().occupancy_asks[0].first == static_cast<int>(mock::st().launches[0].block[0]));
    CHECK(static_cast<int>(mock::st().launches[0].grid[0]) == 132 * std::max(resident, 1));
  }
}

// The SIMT attention exported with one extra TMA operand `op` and launched on the mock driver with
// bf16 tensors [2, 3, 100, 64] (q, k, v, o at 0x10000 .. 0x40000): the export, its launcher and
// the tensors, for more launches.
struct TmaProbe {
  std::unique_ptr<Exported> e;
  AttentionLaunch launch = nullptr;
  std::vector<int64_t> shape{2, 3, 100, 64};
  TjTensor q, k, v, o;
};
TmaProbe export_attention_with_tma(const std::string& tag, const codegen::TmaOperand& op) {
  mock::st().reset();
  TmaProbe p;
  VariantSpec simt{attention_specs({-1, -1, -1, 64}, false, DType::bf16)};
  simt.config = Config::from_json(R"({"knobs":{"mma":0}})");   // the SIMT kernel: no TMA of its own
  p.e = export_kernel(kernels::attention(), {simt}, tag, [&](codegen::GeneratedKernel& g) { g.tma.push_back(op); });
  p.launch = p.e->fn<AttentionLaunch>("attention_launch");
  mock::st().param_sizes = {72, 72, 72, 72, 4, sizeof(CUtensorMap)};
  p.q = tj_tensor(0x10000, DType::bf16, p.shape);
  p.k = tj_tensor(0x20000, DType::bf16, p.shape);
  p.v = tj_tensor(0x30000, DType::bf16, p.shape);
  p.o = tj_tensor(0x40000, DType::bf16, p.shape);
  REQUIRE_MESSAGE(p.launch(nullptr, &p.q, &p.k, &p.v, &p.o, 1.0f, 0) == kSuccess, p.e->last_error());
  REQUIRE(mock::st().tmas.size() == 1);
  return p;
}

TEST_CASE("export: a TMA map keeps every dim, with the tensor's own strides ([B, S, H, D] storage seen as [B, H, S, D])") {
  TmaProbe p = export_attention_with_tma("strided", codegen::TmaOperand{0, {1, 1, 64, 64}, 128, {}});
  auto& [e, launch, shape, q, k, v, o] = p;
  const mock::TmaCall& contiguous = mock::st().tmas[0];
  CHECK(contiguous.dtype == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
  CHECK(contiguous.rank == 4);
  CHECK(contiguous.dims == std::vector<uint64_t>{64, 100, 3, 2});       // innermost first
  CHECK(contiguous.strides == std::vector<uint64_t>{128, 12800, 38400});   // bytes, above the innermost dim
  CHECK(contiguous.box == std::vector<uint32_t>{64, 64, 1, 1});
  // q of [B, S, H, D] storage: strides (S·H·D, D, H·D, 1) in [B, H, S, D] order.
  int64_t bshd[] = {100 * 3 * 64, 64, 3 * 64, 1};
  TjTensor q_bshd = tj_tensor(0x10000, DType::bf16, shape, bshd);
  mock::st().tmas.clear();
  REQUIRE_MESSAGE(launch(nullptr, &q_bshd, &k, &v, &o, 1.0f, 0) == kSuccess, e->last_error());
  REQUIRE(mock::st().tmas.size() == 1);
  CHECK(mock::st().tmas[0].dims == std::vector<uint64_t>{64, 100, 3, 2});
  CHECK(mock::st().tmas[0].strides == std::vector<uint64_t>{384, 128, 38400});
  // A stride TMA cannot take (not a multiple of 16 bytes) is an alignment error naming the tensor.
  int64_t odd[] = {100 * 3 * 64, 6404, 64, 1};
  TjTensor q_odd = tj_tensor(0x10000, DType::bf16, shape, odd);
  CHECK(launch(nullptr, &q_odd, &k, &v, &o, 1.0f, 0) == kAlignment);
  CHECK(std::string(e->last_error()).find("argument 'q'") != std::string::npos);
  // A static dim that does not match is a shape error, not a layout one.
  std::vector<int64_t> small{1, 1, 10, 60};
  TjTensor q2 = tj_tensor(0x10000, DType::bf16, small), k2 = tj_tensor(0x20000, DType::bf16, small),
           v2 = tj_tensor(0x30000, DType::bf16, small), o2 = tj_tensor(0x40000, DType::bf16, small);
  CHECK(launch(nullptr, &q2, &k2, &v2, &o2, 1.0f, 0) == kShape);   // D=64 is static
}

TEST_CASE("export: TMA traversal strides reach the tensor map, innermost first") {
  // K read as the fp8 attention lowering's attn_keys_by_parity does: every second row per load.
  export_attention_with_tma("estride", codegen::TmaOperand{1, {1, 1, 64, 64}, 128, {1, 1, 2, 1}});
  const mock::TmaCall& t = mock::st().tmas[0];
  CHECK(t.address == 0x20000);
  CHECK(t.dims == std::vector<uint64_t>{64, 100, 3, 2});   // [B, H, S, D] innermost first
  CHECK(t.box == std::vector<uint32_t>{64, 64, 1, 1});
  CHECK(t.element_strides == std::vector<uint32_t>{1, 2, 1, 1});
}

TEST_CASE("export: a TMA traversal stride outside [1, 8] is refused, with the tensor's name") {
  const std::vector<VariantSpec> vs{{attention_specs({-1, -1, -1, 64}, false, DType::bf16)}};
  CHECK_THROWS_WITH_AS(export_kernel(kernels::attention(), vs, "estride_zero",
                                     [](codegen::GeneratedKernel& g) {
                                       g.tma.push_back(codegen::TmaOperand{1, {1, 1, 64, 64}, 128, {0, 1, 1, 1}});
                                     }),
                       doctest::Contains("TMA traversal stride 0 of 'k' (dim 0) is outside [1, 8]"), Error);
  CHECK_THROWS_WITH_AS(export_kernel(kernels::attention(), vs, "estride_big",
                                     [](codegen::GeneratedKernel& g) {
                                       g.tma.push_back(codegen::TmaOperand{1, {1, 1, 64, 64}, 128, {1, 1, 9, 1}});
                                     }),
                       doctest::Contains("TMA traversal stride 9 of 'k' (dim 2)"), Error);
}

TEST_CASE("export: the header compiles as C and C++, the IR names the API") {
  auto e = export_kernel(kernels::softmax(), {{{tspec(DType::f16, {-1, -1}), tspec(DType::f16, {-1, -1})}}}, "header");
  const std::string header = codegen::emit_launcher_header(e->lk);
  CHECK(header.find("tj_status softmax_launch(CUstream stream, const tj_tensor* x, const tj_tensor* out);") !=
        std::string::npos);
  CHECK(header.find("tj_status softmax_launch_dlpack(CUstream stream, const tj_dltensor* x, const tj_dltensor* out);") !=
        std::string::npos);
  CHECK(header.find("x=f16[?,?] out=f16[?,?]") != std::string::npos);
  {
    std::ofstream(e->dir / "softmax.h") << header;
    std::ofstream(e->dir / "use.c") << "#include \"softmax.h\"\n"
                                       "int use(CUstream s, const tj_tensor* x, const tj_tensor* o) {\n"
                                       "  tj_status r = softmax_launch(s, x, o);\n"
                                       "  return r == TJ_SUCCESS ? 0 : (int)tj_status_message(r)[0];\n}\n";
  }
  const std::string inc = fmt::format("-I{} -I{}", e->dir.string(), TJ_CUDA_INCLUDE);
  CHECK(run(fmt::format("cc -std=c99 -Wall -Wextra -Werror {} -c {} -o {}", inc, (e->dir / "use.c").string(),
                        (e->dir / "use.o").string())) == 0);
  CHECK(run(fmt::format("c++ -std=c++17 -Wall -Wextra -Werror {} -x c++ -fsyntax-only {}", inc,
                        (e->dir / "use.c").string())) == 0);
  // The library's C API (api/tilejit_c.h) declares the same common types under the same guard:
  // a program includes both, in either order, and their declarations are the same text.
  {
    std::ofstream(e->dir / "both.c") << "#include \"softmax.h\"\n#include \"api/tilejit_c.h\"\n"
                                        "int f(const tj_tensor* x) { return x->rank + (int)TJ_ERROR_TOO_MANY_CONTEXTS; }\n";
    std::ofstream(e->dir / "both_reversed.c") << "#include \"api/tilejit_c.h\"\n#include \"softmax.h\"\n"
                                                 "int f(const tj_arg* a) { return a->kind; }\n";
    const std::string inc2 = fmt::format("{} -I{}", inc, TJ_SOURCE_DIR);
    for (const char* file : {"both.c", "both_reversed.c"})
      CHECK(run(fmt::format("cc -std=c99 -Wall -Wextra -Werror {} -fsyntax-only {}", inc2, (e->dir / file).string())) == 0);
    auto declarations = [](const std::string& text) {   // the guarded block without comments and spacing
      const size_t a = text.find("#ifndef TJ_EXPORT_COMMON_TYPES"), b = text.find("#endif /* TJ_EXPORT_COMMON_TYPES */");
      REQUIRE(a != std::string::npos);
      REQUIRE(b != std::string::npos);
      std::string block = text.substr(a, b - a), out;
      for (size_t i = 0; i < block.size(); ++i) {
        if (block.compare(i, 2, "/*") == 0) {
          i = block.find("*/", i) + 1;
          continue;
        }
        if (!std::isspace(static_cast<unsigned char>(block[i]))) out += block[i];
      }
      return out;
    };
    std::ifstream api(std::string(TJ_SOURCE_DIR) + "/api/tilejit_c.h");
    const std::string api_text((std::istreambuf_iterator<char>(api)), std::istreambuf_iterator<char>());
    CHECK(declarations(api_text) == declarations(header));
  }
  const std::string ir = codegen::emit_launcher_ir(e->lk);
  CHECK(ir.find("define i32 @softmax_launch(ptr") != std::string::npos);
  CHECK(ir.find("@tj.msg.buf = internal thread_local global") != std::string::npos);
  CHECK(ir.find("declare i32 @cuLaunchKernel(") != std::string::npos);
  CHECK(ir.find("cuLaunchKernelEx") == std::string::npos);   // only what the kernel needs
}

TEST_CASE("export: tilejit export writes headers, objects, a library and test data, and the C example links with libcuda "
          "alone") {
  const fs::path dir = scratch("cli");
  const fs::path out = dir / "export";
  std::string log;
  // `tilejit export` runs tilejit-export.
  REQUIRE(run(fmt::format("{} export vector_add attention --arch sm_90a --shapes vector_add:dynamic=1000 vector_add:4096 "
                          "attention:1,2,128,64 --both --test-data --emit-llvm -o {}",
                          TJ_CLI_EXE, out.string()),
              &log) == 0);
  INFO(log);
  for (const char* f : {"vector_add.h", "vector_add.o", "attention.h", "attention.o", "attention.ll", "libtilejit_exports.a",
                        "tilejit_exports.h", "README.md", "testdata/vector_add.0.tjtd", "testdata/attention.1.tjtd"})
    CHECK_MESSAGE(fs::exists(out / f), f);
  CHECK(read(out / "README.md").find("attention(q:in, k:in, v:in, o:out, scale:float, causal:flag)") != std::string::npos);
  CHECK(read(out / "vector_add.h").find("x=f32[?] y=f32[?] out=f32[?]") != std::string::npos);

  // The symbols: the C API defined, and nothing undefined but the driver and libc.
  std::string defined, undefined;
  REQUIRE(run(fmt::format("nm -g --defined-only {}", (out / "attention.o").string()), &defined) == 0);
  for (const char* s : {"attention_launch", "attention_launch_dlpack", "attention_launchv", "attention_load",
                        "attention_last_error", "attention_specializations", "tj_status_message"})
    CHECK_MESSAGE(defined.find(std::string(" ") + s + "\n") != std::string::npos, s);
  REQUIRE(run(fmt::format("nm -u {}", (out / "attention.o").string()), &undefined) == 0);
  std::istringstream lines(undefined);
  for (std::string line; std::getline(lines, line);) {
    std::string sym = line.substr(line.find_last_of(' ') + 1);
    const bool allowed = sym.rfind("cu", 0) == 0 || sym == "snprintf" || sym == "sched_yield" || sym == "__tls_get_addr" ||
                         sym == "memset";
    CHECK_MESSAGE(allowed, "unexpected undefined symbol ", sym);
  }

  // The C example, compiled with cc and linked with the stub libcuda only.
  const std::string exe = (dir / "embed_example").string();
  REQUIRE(run(fmt::format("cc -std=c11 -O2 -Wall -Wextra -Werror -pedantic -I{} -I{} {}/examples/embed/embed_example.c "
                          "{}/libtilejit_exports.a {} -lm -o {}",
                          out.string(), TJ_CUDA_INCLUDE, TJ_SOURCE_DIR, out.string(), TJ_CUDA_STUB, exe)) == 0);
  std::string needed;
  REQUIRE(run(fmt::format("readelf -d {}", exe), &needed) == 0);
  for (const char* bad : {"nvrtc", "tilejit", "LLVM", "stdc++", "cudart"}) CHECK_MESSAGE(needed.find(bad) == std::string::npos, bad);
  CHECK(needed.find("libcuda.so.1") != std::string::npos);
  CHECK(needed.find("stubs") == std::string::npos);
  // It starts without NVRTC or tilejit on the library path; with the stub driver it finds no GPU.
  fs::create_directories(dir / "driver");
  fs::copy_file(TJ_CUDA_STUB, dir / "driver" / "libcuda.so.1");
  std::string ldd;
  run(fmt::format("env LD_LIBRARY_PATH={} ldd {}", (dir / "driver").string(), exe), &ldd);
  for (const char* bad : {"nvrtc", "tilejit", "LLVM", "not found"}) CHECK_MESSAGE(ldd.find(bad) == std::string::npos, ldd);
  std::string ran;
  CHECK(run(fmt::format("env -i LD_LIBRARY_PATH={} {} {}", (dir / "driver").string(), exe, out.string()), &ran, 77) == 77);
  CHECK(ran.find("no CUDA GPU") != std::string::npos);

  // Running the example for real happens on the GPU (scripts/embed_gpu_check.sh): no stand-in
  // driver computes results here.

  // The example's CMake project builds against the same directory.
  if (run("cmake --version") == 0) {
    const fs::path build = dir / "cmake";
    CHECK(run(fmt::format("cmake -S {}/examples/embed -B {} -DTILEJIT_EXPORT_DIR={} && cmake --build {}", TJ_SOURCE_DIR,
                          build.string(), out.string(), build.string())) == 0);
    CHECK(fs::exists(build / "embed_example"));
    std::string rpath;
    run(fmt::format("readelf -d {}", (build / "embed_example").string()), &rpath);
    CHECK(rpath.find("stubs") == std::string::npos);
  }
  // Bad requests are reported, not crashed on.
  CHECK(run(fmt::format("{} export nosuchkernel -o {}", TJ_CLI_EXE, (dir / "bad").string()), &log, 1) == 1);
  CHECK(log.find("no kernel named 'nosuchkernel'") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("export: specializations take the tuned config for their architecture from the tuning cache") {
  const fs::path dir = scratch("tuned");
  const char* old = std::getenv("TILEJIT_CACHE_DIR");
  const std::string saved = old ? old : "";
  ::setenv("TILEJIT_CACHE_DIR", (dir / "cache").c_str(), 1);
  ::unsetenv("TILEJIT_TUNING");
  autotune::DeviceIdentity h100;
  h100.name = "NVIDIA H100 80GB HBM3";
  h100.cc_major = 9;
  h100.cc_minor = 0;
  h100.arch = "sm_90a";
  autotune::TuningEntry entry;
  entry.key = autotune::tuning_key(kernels::vector_add(), vector_add_specs(4000), false, h100);
  entry.config.blocks = {{"n", 256}};
  entry.config.num_warps = 2;
  autotune::TuningCache(autotune::TuningCache::default_path()).store(entry);

  tools::ExportOptions o;
  o.kernels = {"vector_add"};
  o.archs = "sm_90a,sm_80";
  o.shapes = {"vector_add:4000"};   // the bucket of 4000 is 4096: the entry applies
  o.out_dir = (dir / "out").string();
  o.quiet = true;
  CHECK(tools::export_kernels(o) == 0);
  const std::string readme = read(dir / "out" / "README.md");
  INFO(readme);
  CHECK(readme.find("sm_90a x=f32[4000] y=f32[4000] out=f32[4000]  config {\"blocks\":{\"n\":256},\"num_stages\":2,"
                    "\"num_warps\":2} (tuned on NVIDIA H100 80GB HBM3 (cc 9.0)") != std::string::npos);
  // (sm_80 has no entry: the untuned streaming config, codegen/simt_config.h)
  CHECK(readme.find("sm_80 x=f32[4000] y=f32[4000] out=f32[4000]  config {\"blocks\":{\"n\":1024},\"knobs\":{\"simt_vec\":4},\"num_stages\":2,\"num_warps\":4") !=
        std::string::npos);
  // --config's entries go over the cache's config: the block changes, its 2 warps stay.
  o.config = R"({"blocks":{"n":32}})";
  o.archs = "sm_90a";
  CHECK(tools::export_kernels(o) == 0);
  CHECK(read(dir / "out" / "README.md").find(R"(config {"blocks":{"n":32},"num_stages":2,"num_warps":2} (--config over the tuned)") !=
        std::string::npos);
  // Attention's mask variants are chosen as `bench attention` chooses them: one of three flags.
  o.causal = o.both = true;
  CHECK_THROWS_WITH_AS(tools::export_kernels(o),
                       "export: --causal, --non-causal and --both choose attention's mask variants: give at most one", Error);
  if (old) ::setenv("TILEJIT_CACHE_DIR", saved.c_str(), 1);
  else ::unsetenv("TILEJIT_CACHE_DIR");
  fs::remove_all(dir);
}
