#pragma once
// The CUDA Driver API, loaded at run time with dlopen("libcuda.so.1").
//
// tilejit never links libcuda: everything CPU-side (tracing, codegen, NVRTC, the caches)
// works on machines with no GPU and no driver, and driver().available() says whether the
// GPU side can run. <cuda.h> from the toolkit is used for types and prototypes only.
//
// Member function pointers carry the names of the driver functions. cuda.h #defines many
// of those names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2, cuEventElapsedTime ->
// cuEventElapsedTime_v2, ...); the same macros rename our members consistently, and the
// loader dlsym()s exactly the versioned symbol cuda.h would have linked. So
// `driver().cuMemAlloc(&p, n)` calls the ABI the prototype describes.
#include <cuda.h>

#include <string>

#include "core/error.h"

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "tilejit's driver table assumes the legacy default stream ABI; do not define CUDA_API_PER_THREAD_DEFAULT_STREAM before including runtime/driver.h"
#endif

namespace tj {

// A failed driver call: "cuMemAlloc(1073741824 bytes): CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
class CudaError : public Error {
 public:
  CudaError(CUresult code, const std::string& message) : Error(message), code_(code) {}
  CUresult code() const { return code_; }

 private:
  CUresult code_;
};

}  // namespace tj

namespace tj::runtime {

// X-macro over every driver entry point tilejit uses. Required ones must exist in
// libcuda.so.1 for the driver to count as available; optional ones are null when the
// installed driver is too old (calling through Driver::require() then throws).
#define TJ_DRIVER_REQUIRED_FUNCTIONS(X)                                                      \
  X(cuGetErrorName)                                                                          \
  X(cuGetErrorString)                                                                        \
  X(cuInit)                                                                                  \
  X(cuDriverGetVersion)                                                                      \
  X(cuDeviceGet)                                                                             \
  X(cuDeviceGetCount)                                                                        \
  X(cuDeviceGetName)                                                                         \
  X(cuDeviceGetAttribute)                                                                    \
  X(cuDeviceTotalMem)                                                                        \
  X(cuDevicePrimaryCtxRetain)                                                                \
  X(cuDevicePrimaryCtxRelease)                                                               \
  X(cuCtxSetCurrent)                                                                         \
  X(cuCtxGetCurrent)                                                                         \
  X(cuCtxSynchronize)                                                                        \
  X(cuModuleLoadData)                                                                        \
  X(cuModuleUnload)                                                                          \
  X(cuModuleGetFunction)                                                                     \
  X(cuFuncGetAttribute)                                                                      \
  X(cuFuncSetAttribute)                                                                      \
  X(cuLaunchKernel)                                                                          \
  X(cuMemAlloc)                                                                              \
  X(cuMemFree)                                                                               \
  X(cuMemGetInfo)                                                                            \
  X(cuMemcpyHtoD)                                                                            \
  X(cuMemcpyDtoH)                                                                            \
  X(cuMemcpyDtoD)                                                                            \
  X(cuMemcpyHtoDAsync)                                                                       \
  X(cuMemcpyDtoHAsync)                                                                       \
  X(cuMemcpyDtoDAsync)                                                                       \
  X(cuMemsetD8)                                                                              \
  X(cuMemsetD32)                                                                             \
  X(cuMemsetD8Async)                                                                         \
  X(cuMemsetD32Async)                                                                        \
  X(cuStreamCreate)                                                                          \
  X(cuStreamCreateWithPriority)                                                              \
  X(cuCtxGetStreamPriorityRange)                                                             \
  X(cuStreamDestroy)                                                                         \
  X(cuStreamSynchronize)                                                                     \
  X(cuStreamWaitEvent)                                                                       \
  X(cuEventCreate)                                                                           \
  X(cuEventRecord)                                                                           \
  X(cuEventSynchronize)                                                                      \
  X(cuEventElapsedTime)                                                                      \
  X(cuEventDestroy)                                                                          \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor)

// Present since CUDA 12.0 drivers.
#define TJ_DRIVER_OPTIONAL_FUNCTIONS(X)                                                      \
  X(cuLaunchKernelEx)                                                                        \
  X(cuTensorMapEncodeTiled)

class Driver {
 public:
  Driver();
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // True when libcuda.so.1 loaded, every required symbol resolved, cuInit(0) succeeded and
  // at least one device exists.
  bool available() const { return available_; }
  // Why not: "libcuda.so.1 not found (<dlerror>)", "no CUDA device (cuInit:
  // CUDA_ERROR_NO_DEVICE ...)", "libcuda.so.1 lacks cuMemAlloc_v2", ... Empty if available.
  const std::string& unavailable_reason() const { return reason_; }
  // Whether the library itself loaded (the driver may still report no device).
  bool library_loaded() const { return handle_ != nullptr; }
  // cuDriverGetVersion (e.g. 13000), or 0 when the library did not load.
  int version() const { return version_; }
  int device_count() const { return device_count_; }

  // Throws tj::CudaError ("<what>: CUDA_ERROR_X (description)") unless result == CUDA_SUCCESS.
  void check(CUresult result, const char* what) const;
  // "CUDA_ERROR_X (description)" for any code, also without a loaded driver.
  std::string error_text(CUresult result) const;
  // Throws tj::Error naming the reason when !available(). Every wrapper calls this first.
  void require_available() const;
  // Throws tj::Error when an optional entry point is missing from this driver.
  template <class F>
  F require(F fn, const char* name) const {
    require_available();
    if (!fn) throw_missing(name);
    return fn;
  }

#define TJ_DRIVER_DECLARE(name) decltype(&::name) name = nullptr;
  TJ_DRIVER_REQUIRED_FUNCTIONS(TJ_DRIVER_DECLARE)
  TJ_DRIVER_OPTIONAL_FUNCTIONS(TJ_DRIVER_DECLARE)
#undef TJ_DRIVER_DECLARE

 private:
  [[noreturn]] void throw_missing(const char* name) const;
  void* handle_ = nullptr;
  bool available_ = false;
  std::string reason_;
  int version_ = 0;
  int device_count_ = 0;
};

// The process-wide driver, loaded on first use (thread-safe).
Driver& driver();

// Shorthand for driver().check(result, what).
void check(CUresult result, const char* what);

}  // namespace tj::runtime
