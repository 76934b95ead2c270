#pragma once
// The GPU tilejit runs on: device 0, or $TILEJIT_DEVICE.
#include <cuda.h>

#include <cstddef>
#include <string>

namespace tj::runtime {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t total_mem = 0;               // bytes
  int max_smem_per_block_optin = 0;   // bytes, with CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
  int max_smem_per_sm = 0;            // bytes
  int max_regs_per_block = 0;
  int max_threads_per_block = 0;
  int l2_bytes = 0;
  int driver_version = 0;             // cuDriverGetVersion, e.g. 13000

  // NVRTC target: "sm_90a" for compute capability 9.0 (wgmma/TMA/setmaxnreg need the 'a'
  // target), "sm_80", "sm_89", "sm_100", ... otherwise.
  std::string arch() const;
  bool supports_fp8() const { return cc_major * 10 + cc_minor >= 89; }
  bool supports_wgmma() const { return cc_major == 9 && cc_minor == 0; }
  // TMA (cp.async.bulk.tensor) is used only where wgmma is: sm_90a.
  bool supports_tma() const { return supports_wgmma(); }
};

// The ordinal tilejit uses: $TILEJIT_DEVICE if set (must be a valid integer), else 0.
int selected_device_ordinal();

// Initializes (once per process) the primary context of the selected device, makes it
// current on the calling thread, and returns the device's properties. Throws tj::Error
// when no driver/GPU is usable (the message says why) or the ordinal is out of range.
const DeviceInfo& current_device();

// The primary context current_device() retained (initializing it if needed).
CUcontext primary_context();

}  // namespace tj::runtime
