#pragma once
// RAII wrappers over driver objects, and kernel launch. Every driver call is checked and
// throws tj::CudaError on failure; every constructor makes the primary context of
// current_device() current on the calling thread first. Destructors never throw.
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tj::runtime {

// Launch dimensions (the driver's gridDim/blockDim/cluster dims).
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr Dim3() = default;
  constexpr Dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr unsigned long long count() const {
    return static_cast<unsigned long long>(x) * y * z;
  }
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Uninitialized device memory (cuMemAlloc). A zero-byte buffer holds no allocation.
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr ptr() const { return ptr_; }
  size_t size() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }

  // Byte ranges [offset, offset + bytes) are bounds-checked against size() (tj::Error).
  void copy_from_host(const void* src, size_t bytes, size_t offset = 0);
  void copy_to_host(void* dst, size_t bytes, size_t offset = 0) const;
  void copy_from_host_async(const void* src, size_t bytes, CUstream stream, size_t offset = 0);
  void copy_to_host_async(void* dst, size_t bytes, CUstream stream, size_t offset = 0) const;
  // Device-to-device copy of `bytes` from the start of `src` to the start of this buffer. The
  // synchronous copy and fills return when done (work on other streams may overtake them else).
  void copy_from(const DeviceBuffer& src, size_t bytes);
  void copy_from_async(const DeviceBuffer& src, size_t bytes, CUstream stream);
  // Sets every byte (cuMemsetD8) / every 32-bit word (cuMemsetD32; size() % 4 == 0).
  void memset(uint8_t value);
  void memset_async(uint8_t value, CUstream stream);
  void fill32(uint32_t value);
  void fill32_async(uint32_t value, CUstream stream);
  // Frees the allocation now (also done by the destructor).
  void reset();

  template <class T>
  static DeviceBuffer from_host(const std::vector<T>& values) {
    DeviceBuffer b(values.size() * sizeof(T));
    if (!values.empty()) b.copy_from_host(values.data(), b.size());
    return b;
  }
  template <class T>
  std::vector<T> to_host() const {
    std::vector<T> out(bytes_ / sizeof(T));
    if (!out.empty()) copy_to_host(out.data(), out.size() * sizeof(T));
    return out;
  }

 private:
  void check_range(size_t offset, size_t bytes, const char* what) const;
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

class Stream {
 public:
  // A non-blocking stream (CU_STREAM_NON_BLOCKING).
  Stream();
  // The same with a scheduling priority: lower numbers run first where blocks of several kernels
  // wait for an SM (cuCtxGetStreamPriorityRange; greatest_priority() is the most urgent).
  explicit Stream(int priority);
  static int greatest_priority();
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream get() const { return stream_; }
  operator CUstream() const { return stream_; }
  void synchronize() const;

 private:
  CUstream stream_ = nullptr;
};

class Event {
 public:
  // flags: CU_EVENT_DEFAULT records timing; CU_EVENT_DISABLE_TIMING does not.
  explicit Event(unsigned flags = CU_EVENT_DEFAULT);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  CUevent get() const { return event_; }
  operator CUevent() const { return event_; }
  void record(CUstream stream = nullptr);
  void synchronize() const;
  // Milliseconds between two recorded (and completed) events.
  static float elapsed_ms(const Event& start, const Event& end);
  // Milliseconds from `start` to this event.
  float elapsed_ms_since(const Event& start) const { return elapsed_ms(start, *this); }

 private:
  CUevent event_ = nullptr;
};

struct FunctionAttributes {
  int num_regs = 0;                  // registers per thread
  int shared_bytes = 0;              // static shared memory
  int local_bytes = 0;               // local memory (spills) per thread
  int const_bytes = 0;
  int max_threads_per_block = 0;     // for this function
  int max_dynamic_shared_bytes = 0;  // current CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
};

class Module {
 public:
  Module() = default;
  // Loads a CUBIN (cuModuleLoadData). Throws tj::Error for an empty image, tj::CudaError
  // (with a hint when the cubin targets another GPU) when the driver rejects it.
  explicit Module(std::string_view image);
  explicit Module(const std::vector<char>& image)
      : Module(std::string_view(image.data(), image.size())) {}
  ~Module();
  Module(Module&& other) noexcept;
  Module& operator=(Module&& other) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  CUmodule get() const { return module_; }
  bool loaded() const { return module_ != nullptr; }
  // cuModuleGetFunction; throws tj::CudaError naming the kernel when absent.
  CUfunction function(const std::string& name) const;

  static FunctionAttributes attributes(CUfunction f);
  // Opts the function in to `bytes` of dynamic shared memory (needed above 48 KiB).
  static void set_max_dynamic_shared_bytes(CUfunction f, size_t bytes);
  // The same where `dynamic_smem` and the function's static shared memory together pass 48 KiB
  // (the sm_90a attention kernels keep some arrays static); once, when the function is loaded.
  static void opt_in_shared_bytes(CUfunction f, size_t dynamic_smem);

 private:
  CUmodule module_ = nullptr;
};

// Launches f (cuLaunchKernel). `args` is the usual array of pointers to each argument.
// A function that takes more than 48 KiB of shared memory (dynamic and static) must have been
// opted in when it was loaded (Module::opt_in_shared_bytes, as tj::compile and the tuner do): not
// at every launch, which would add a driver call to each. Checks the launch result (asynchronous
// faults surface at the next synchronizing call).
void launch(CUfunction f, Dim3 grid, Dim3 block, size_t dynamic_smem, CUstream stream,
            void** args);
// Same through cuLaunchKernelEx with a thread-block cluster shape (sm_90+; a cluster of {1,1,1}
// launches without the cluster attribute) and, with start_early, programmatic stream
// serialization: f may start before the previous kernel on the stream has finished, and must
// wait for it (griddepcontrol.wait) before it touches anything that kernel may touch.
void launch(CUfunction f, Dim3 grid, Dim3 block, size_t dynamic_smem, CUstream stream,
            void** args, Dim3 cluster, bool start_early = false);

// How many blocks of f fit on one SM (cuOccupancyMaxActiveBlocksPerMultiprocessor).
int max_active_blocks_per_sm(CUfunction f, int block_threads, size_t dynamic_smem);

struct MemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
MemoryInfo memory_info();

// cuCtxSynchronize on the current device's context.
void synchronize();

}  // namespace tj::runtime
