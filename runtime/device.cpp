#include "runtime/device.h"

#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <string_view>

#include "runtime/driver.h"

namespace tj::runtime {
namespace {

struct DeviceState {
  DeviceInfo info;
  CUcontext context = nullptr;
};

int attribute(Driver& d, CUdevice dev, CUdevice_attribute attr, const char* what) {
  int v = 0;
  d.check(d.cuDeviceGetAttribute(&v, attr, dev), what);
  return v;
}

DeviceState initialize() {
  Driver& d = driver();
  d.require_available();
  DeviceState s;
  DeviceInfo& info = s.info;
  info.ordinal = selected_device_ordinal();
  if (info.ordinal < 0 || info.ordinal >= d.device_count()) {
    throw Error(fmt::format("CUDA device {} does not exist ({} device(s) present{})", info.ordinal,
                            d.device_count(),
                            std::getenv("TILEJIT_DEVICE") ? "; check $TILEJIT_DEVICE" : ""));
  }
  CUdevice dev = 0;
  d.check(d.cuDeviceGet(&dev, info.ordinal), "cuDeviceGet");
  char name[256] = {};
  d.check(d.cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName");
  info.name = name;
  info.cc_major = attribute(d, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                            "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
  info.cc_minor = attribute(d, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                            "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)");
  info.sm_count = attribute(d, dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                            "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
  info.max_smem_per_block_optin =
      attribute(d, dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)");
  info.max_smem_per_sm = attribute(d, dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                                   "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)");
  info.max_regs_per_block = attribute(d, dev, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK,
                                      "cuDeviceGetAttribute(MAX_REGISTERS_PER_BLOCK)");
  info.max_threads_per_block = attribute(d, dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                         "cuDeviceGetAttribute(MAX_THREADS_PER_BLOCK)");
  info.l2_bytes =
      attribute(d, dev, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "cuDeviceGetAttribute(L2_CACHE_SIZE)");
  d.check(d.cuDeviceTotalMem(&info.total_mem, dev), "cuDeviceTotalMem");
  info.driver_version = d.version();
  d.check(d.cuDevicePrimaryCtxRetain(&s.context, dev), "cuDevicePrimaryCtxRetain");
  return s;
}

const DeviceState& state() {
  // A throwing initializer leaves the static uninitialized, so a later call retries.
  static const DeviceState s = initialize();
  return s;
}

}  // namespace

std::string DeviceInfo::arch() const {
  if (cc_major == 9 && cc_minor == 0) return "sm_90a";
  return fmt::format("sm_{}{}", cc_major, cc_minor);
}

int selected_device_ordinal() {
  const char* env = std::getenv("TILEJIT_DEVICE");
  if (!env || !*env) return 0;
  std::string_view text(env);
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9' || value > 100000) {
      throw Error(fmt::format("$TILEJIT_DEVICE='{}' is not a device ordinal (0, 1, ...)", text));
    }
    value = value * 10 + (c - '0');
  }
  return value;
}

const DeviceInfo& current_device() {
  const DeviceState& s = state();
  Driver& d = driver();
  CUcontext cur = nullptr;
  d.check(d.cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
  if (cur != s.context) d.check(d.cuCtxSetCurrent(s.context), "cuCtxSetCurrent");
  return s.info;
}

CUcontext primary_context() { return state().context; }

}  // namespace tj::runtime
