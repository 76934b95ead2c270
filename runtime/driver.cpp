#include "runtime/driver.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include <cstring>

namespace tj::runtime {
namespace {

#define TJ_STRINGIFY_EXPANDED(x) TJ_STRINGIFY(x)
#define TJ_STRINGIFY(x) #x

// Versioned symbols that old drivers only export under the unversioned name with the same
// signature (cuEventElapsedTime_v2 appeared in 12.8 and only changed semantics).
const char* unversioned_fallback(const char* symbol) {
  if (std::strcmp(symbol, "cuEventElapsedTime_v2") == 0) return "cuEventElapsedTime";
  return nullptr;
}

void* lookup(void* handle, const char* symbol) {
  void* p = dlsym(handle, symbol);
  if (!p) {
    if (const char* alt = unversioned_fallback(symbol)) p = dlsym(handle, alt);
  }
  return p;
}

}  // namespace

Driver::Driver() {
  dlerror();
  handle_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* why = dlerror();
    reason_ = fmt::format("libcuda.so.1 not found ({})", why ? why : "dlopen failed");
    return;
  }
  std::string missing;
#define TJ_DRIVER_LOAD_REQUIRED(name)                                                   \
  name = reinterpret_cast<decltype(name)>(lookup(handle_, TJ_STRINGIFY_EXPANDED(name))); \
  if (!name) missing += (missing.empty() ? "" : ", ") + std::string(TJ_STRINGIFY_EXPANDED(name));
#define TJ_DRIVER_LOAD_OPTIONAL(name) \
  name = reinterpret_cast<decltype(name)>(lookup(handle_, TJ_STRINGIFY_EXPANDED(name)));
  TJ_DRIVER_REQUIRED_FUNCTIONS(TJ_DRIVER_LOAD_REQUIRED)
  TJ_DRIVER_OPTIONAL_FUNCTIONS(TJ_DRIVER_LOAD_OPTIONAL)
#undef TJ_DRIVER_LOAD_REQUIRED
#undef TJ_DRIVER_LOAD_OPTIONAL
  if (cuDriverGetVersion) {
    int v = 0;
    if (cuDriverGetVersion(&v) == CUDA_SUCCESS) version_ = v;
  }
  if (!missing.empty()) {
    reason_ = fmt::format("libcuda.so.1 (driver version {}) is too old: it lacks {}", version_,
                          missing);
    return;
  }
  CUresult r = cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) {
    reason_ = "no CUDA device (cuInit: " + error_text(r) + ")";
    return;
  }
  if (r != CUDA_SUCCESS) {
    reason_ = "cuInit failed: " + error_text(r);
    return;
  }
  r = cuDeviceGetCount(&device_count_);
  if (r != CUDA_SUCCESS) {
    reason_ = "cuDeviceGetCount failed: " + error_text(r);
    return;
  }
  if (device_count_ <= 0) {
    reason_ = "no CUDA device (the driver reports 0 devices)";
    return;
  }
  available_ = true;
}

// The library stays loaded until the process exits: objects with static storage duration
// may still release driver resources during exit.
Driver::~Driver() = default;

std::string Driver::error_text(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName) cuGetErrorName(result, &name);
  if (cuGetErrorString) cuGetErrorString(result, &text);
  if (!name) return fmt::format("CUresult {}", static_cast<int>(result));
  return text ? fmt::format("{} ({})", name, text) : std::string(name);
}

void Driver::check(CUresult result, const char* what) const {
  if (result == CUDA_SUCCESS) return;
  throw CudaError(result, fmt::format("{}: {}", what, error_text(result)));
}

void Driver::require_available() const {
  if (!available_) throw Error("CUDA driver unavailable: " + reason_);
}

void Driver::throw_missing(const char* name) const {
  throw Error(fmt::format("the installed CUDA driver (version {}) lacks {}; a CUDA 12.0 or newer "
                          "driver is needed",
                          version_, name));
}

Driver& driver() {
  static Driver* instance = new Driver();  // never destroyed, see ~Driver
  return *instance;
}

void check(CUresult result, const char* what) { driver().check(result, what); }

}  // namespace tj::runtime
