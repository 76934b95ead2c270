#include "runtime/memory.h"

#include <fmt/format.h>

#include <utility>

#include "runtime/device.h"
#include "runtime/driver.h"

namespace tj::runtime {
namespace {

// The driver, with the device's primary context current on this thread.
Driver& ctx() {
  current_device();
  return driver();
}

// For destructors: make the context current if we can, never throw.
Driver* ctx_noexcept() {
  try {
    return &ctx();
  } catch (...) {
    return nullptr;
  }
}

constexpr size_t kDefaultSharedLimit = 48 * 1024;

}  // namespace

// ---------------------------------------------------------------- DeviceBuffer

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemAlloc(&ptr_, bytes), fmt::format("cuMemAlloc({} bytes)", bytes).c_str());
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (ptr_) {
    if (Driver* d = ctx_noexcept()) d->cuMemFree(ptr_);  // errors (e.g. after a fault) ignored
  }
  ptr_ = 0;
  bytes_ = 0;
}

void DeviceBuffer::check_range(size_t offset, size_t bytes, const char* what) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    throw Error(fmt::format("{}: byte range [{}, {}) is outside the {}-byte device buffer", what,
                            offset, offset + bytes, bytes_));
  }
}

void DeviceBuffer::copy_from_host(const void* src, size_t bytes, size_t offset) {
  check_range(offset, bytes, "DeviceBuffer::copy_from_host");
  if (bytes == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemcpyHtoD(ptr_ + offset, src, bytes), "cuMemcpyHtoD");
}

void DeviceBuffer::copy_to_host(void* dst, size_t bytes, size_t offset) const {
  check_range(offset, bytes, "DeviceBuffer::copy_to_host");
  if (bytes == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemcpyDtoH(dst, ptr_ + offset, bytes), "cuMemcpyDtoH");
}

void DeviceBuffer::copy_from_host_async(const void* src, size_t bytes, CUstream stream,
                                        size_t offset) {
  check_range(offset, bytes, "DeviceBuffer::copy_from_host_async");
  if (bytes == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemcpyHtoDAsync(ptr_ + offset, src, bytes, stream), "cuMemcpyHtoDAsync");
}

void DeviceBuffer::copy_to_host_async(void* dst, size_t bytes, CUstream stream,
                                      size_t offset) const {
  check_range(offset, bytes, "DeviceBuffer::copy_to_host_async");
  if (bytes == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemcpyDtoHAsync(dst, ptr_ + offset, bytes, stream), "cuMemcpyDtoHAsync");
}

namespace {
// The synchronous device-side copies and fills (cuMemcpyDtoD, cuMemsetD8 / D32) run on the legacy
// default stream and may return before they are done; the streams tilejit launches on are
// non-blocking (they do not wait for that stream), so a kernel launched next could run before a
// fill lands and have its results overwritten (a poisoned output read back as NaN). They wait.
void wait_default_stream(Driver& d) { d.check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize"); }
}  // namespace

void DeviceBuffer::copy_from(const DeviceBuffer& src, size_t bytes) {
  check_range(0, bytes, "DeviceBuffer::copy_from (destination)");
  src.check_range(0, bytes, "DeviceBuffer::copy_from (source)");
  if (bytes == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemcpyDtoD(ptr_, src.ptr_, bytes), "cuMemcpyDtoD");
  wait_default_stream(d);
}

void DeviceBuffer::copy_from_async(const DeviceBuffer& src, size_t bytes, CUstream stream) {
  check_range(0, bytes, "DeviceBuffer::copy_from_async (destination)");
  src.check_range(0, bytes, "DeviceBuffer::copy_from_async (source)");
  if (bytes == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemcpyDtoDAsync(ptr_, src.ptr_, bytes, stream), "cuMemcpyDtoDAsync");
}

void DeviceBuffer::memset(uint8_t value) {
  if (bytes_ == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemsetD8(ptr_, value, bytes_), "cuMemsetD8");
  wait_default_stream(d);
}

void DeviceBuffer::memset_async(uint8_t value, CUstream stream) {
  if (bytes_ == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemsetD8Async(ptr_, value, bytes_, stream), "cuMemsetD8Async");
}

void DeviceBuffer::fill32(uint32_t value) {
  if (bytes_ % 4 != 0) throw Error(fmt::format("DeviceBuffer::fill32: size {} is not a multiple of 4", bytes_));
  if (bytes_ == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemsetD32(ptr_, value, bytes_ / 4), "cuMemsetD32");
  wait_default_stream(d);
}

void DeviceBuffer::fill32_async(uint32_t value, CUstream stream) {
  if (bytes_ % 4 != 0) throw Error(fmt::format("DeviceBuffer::fill32_async: size {} is not a multiple of 4", bytes_));
  if (bytes_ == 0) return;
  Driver& d = ctx();
  d.check(d.cuMemsetD32Async(ptr_, value, bytes_ / 4, stream), "cuMemsetD32Async");
}

// ---------------------------------------------------------------- Stream

Stream::Stream() {
  Driver& d = ctx();
  d.check(d.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

Stream::Stream(int priority) {
  Driver& d = ctx();
  d.check(d.cuStreamCreateWithPriority(&stream_, CU_STREAM_NON_BLOCKING, priority), "cuStreamCreateWithPriority");
}

int Stream::greatest_priority() {
  Driver& d = ctx();
  int least = 0, greatest = 0;
  d.check(d.cuCtxGetStreamPriorityRange(&least, &greatest), "cuCtxGetStreamPriorityRange");
  return greatest;
}

Stream::~Stream() {
  if (stream_) {
    if (Driver* d = ctx_noexcept()) d->cuStreamDestroy(stream_);
  }
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_) {
      if (Driver* d = ctx_noexcept()) d->cuStreamDestroy(stream_);
    }
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void Stream::synchronize() const {
  Driver& d = ctx();
  d.check(d.cuStreamSynchronize(stream_), "cuStreamSynchronize");
}

// ---------------------------------------------------------------- Event

Event::Event(unsigned flags) {
  Driver& d = ctx();
  d.check(d.cuEventCreate(&event_, flags), "cuEventCreate");
}

Event::~Event() {
  if (event_) {
    if (Driver* d = ctx_noexcept()) d->cuEventDestroy(event_);
  }
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_) {
      if (Driver* d = ctx_noexcept()) d->cuEventDestroy(event_);
    }
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(CUstream stream) {
  Driver& d = ctx();
  d.check(d.cuEventRecord(event_, stream), "cuEventRecord");
}

void Event::synchronize() const {
  Driver& d = ctx();
  d.check(d.cuEventSynchronize(event_), "cuEventSynchronize");
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  Driver& d = ctx();
  float ms = 0.f;
  d.check(d.cuEventElapsedTime(&ms, start.event_, end.event_), "cuEventElapsedTime");
  return ms;
}

// ---------------------------------------------------------------- Module

Module::Module(std::string_view image) {
  if (image.empty()) throw Error("Module: empty CUBIN image");
  Driver& d = ctx();
  CUresult r = d.cuModuleLoadData(&module_, image.data());
  if (r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_INVALID_IMAGE ||
      r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION) {
    throw CudaError(r, fmt::format("cuModuleLoadData: {} (was the CUBIN compiled for {}, this "
                                   "GPU's architecture, by a toolkit this driver supports?)",
                                   d.error_text(r), current_device().arch()));
  }
  d.check(r, "cuModuleLoadData");
}

Module::~Module() {
  if (module_) {
    if (Driver* d = ctx_noexcept()) d->cuModuleUnload(module_);
  }
}

Module::Module(Module&& other) noexcept : module_(std::exchange(other.module_, nullptr)) {}

Module& Module::operator=(Module&& other) noexcept {
  if (this != &other) {
    if (module_) {
      if (Driver* d = ctx_noexcept()) d->cuModuleUnload(module_);
    }
    module_ = std::exchange(other.module_, nullptr);
  }
  return *this;
}

CUfunction Module::function(const std::string& name) const {
  if (!module_) throw Error("Module::function(" + name + "): no module loaded");
  Driver& d = ctx();
  CUfunction f = nullptr;
  d.check(d.cuModuleGetFunction(&f, module_, name.c_str()),
          fmt::format("cuModuleGetFunction(\"{}\")", name).c_str());
  return f;
}

FunctionAttributes Module::attributes(CUfunction f) {
  Driver& d = ctx();
  FunctionAttributes a;
  auto get = [&](int* out, CUfunction_attribute attr, const char* what) {
    d.check(d.cuFuncGetAttribute(out, attr, f), what);
  };
  get(&a.num_regs, CU_FUNC_ATTRIBUTE_NUM_REGS, "cuFuncGetAttribute(NUM_REGS)");
  get(&a.shared_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
      "cuFuncGetAttribute(SHARED_SIZE_BYTES)");
  get(&a.local_bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "cuFuncGetAttribute(LOCAL_SIZE_BYTES)");
  get(&a.const_bytes, CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, "cuFuncGetAttribute(CONST_SIZE_BYTES)");
  get(&a.max_threads_per_block, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
      "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)");
  get(&a.max_dynamic_shared_bytes, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
      "cuFuncGetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  return a;
}

void Module::set_max_dynamic_shared_bytes(CUfunction f, size_t bytes) {
  Driver& d = ctx();
  d.check(d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                               static_cast<int>(bytes)),
          fmt::format("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {})", bytes).c_str());
}

// ---------------------------------------------------------------- launch

void Module::opt_in_shared_bytes(CUfunction f, size_t dynamic_smem) {
  if (dynamic_smem == 0) return;
  const size_t static_bytes = dynamic_smem > kDefaultSharedLimit ? 0 : static_cast<size_t>(attributes(f).shared_bytes);
  if (dynamic_smem + static_bytes > kDefaultSharedLimit) set_max_dynamic_shared_bytes(f, dynamic_smem);
}

namespace {
std::string launch_what(const char* api, Dim3 grid, Dim3 block, size_t smem) {
  // The opt-in is the loader's (once per function), not the launch's: say so where it may be missing.
  return fmt::format("{}(grid=({},{},{}), block=({},{},{}), dynamic smem={} bytes{})", api, grid.x, grid.y, grid.z,
                     block.x, block.y, block.z, smem,
                     smem > kDefaultSharedLimit ? "; above 48 KiB the function must be opted in when it is loaded: "
                                                  "Module::opt_in_shared_bytes"
                                                : "");
}
}  // namespace

void launch(CUfunction f, Dim3 grid, Dim3 block, size_t dynamic_smem, CUstream stream,
            void** args) {
  Driver& d = ctx();
  CUresult r = d.cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                static_cast<unsigned>(dynamic_smem), stream, args, nullptr);
  if (r != CUDA_SUCCESS) d.check(r, launch_what("cuLaunchKernel", grid, block, dynamic_smem).c_str());
}

void launch(CUfunction f, Dim3 grid, Dim3 block, size_t dynamic_smem, CUstream stream,
            void** args, Dim3 cluster, bool start_early) {
  if (cluster.count() == 1 && !start_early) return launch(f, grid, block, dynamic_smem, stream, args);
  Driver& d = ctx();
  auto launch_ex = d.require(d.cuLaunchKernelEx, "cuLaunchKernelEx");
  CUlaunchAttribute attrs[2]{};
  unsigned n_attrs = 0;
  if (cluster.count() != 1) {
    CUlaunchAttribute& a = attrs[n_attrs++];
    a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.clusterDim.x = cluster.x;
    a.value.clusterDim.y = cluster.y;
    a.value.clusterDim.z = cluster.z;
  }
  if (start_early) {
    CUlaunchAttribute& a = attrs[n_attrs++];
    a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    a.value.programmaticStreamSerializationAllowed = 1;
  }
  CUlaunchConfig config{};
  config.gridDimX = grid.x;
  config.gridDimY = grid.y;
  config.gridDimZ = grid.z;
  config.blockDimX = block.x;
  config.blockDimY = block.y;
  config.blockDimZ = block.z;
  config.sharedMemBytes = static_cast<unsigned>(dynamic_smem);
  config.hStream = stream;
  config.attrs = attrs;
  config.numAttrs = n_attrs;
  CUresult r = launch_ex(&config, f, args, nullptr);
  if (r != CUDA_SUCCESS) {
    d.check(r, fmt::format("{} with cluster ({},{},{}){}",
                           launch_what("cuLaunchKernelEx", grid, block, dynamic_smem), cluster.x,
                           cluster.y, cluster.z, start_early ? ", starting early" : "")
                   .c_str());
  }
}

int max_active_blocks_per_sm(CUfunction f, int block_threads, size_t dynamic_smem) {
  Driver& d = ctx();
  int blocks = 0;
  d.check(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, block_threads, dynamic_smem),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

MemoryInfo memory_info() {
  Driver& d = ctx();
  MemoryInfo m;
  d.check(d.cuMemGetInfo(&m.free_bytes, &m.total_bytes), "cuMemGetInfo");
  return m;
}

void synchronize() {
  Driver& d = ctx();
  d.check(d.cuCtxSynchronize(), "cuCtxSynchronize");
}

}  // namespace tj::runtime
