#pragma once
// The GPU architecture a kernel is generated for.
#include <string>
#include <string_view>
#include <vector>

namespace tj::codegen {

struct Target {
  std::string arch = "sm_90a";   // "sm_80", "sm_89", "sm_90" or "sm_90a"

  // Throws tj::Error naming the supported architectures when `arch` is not one of them.
  static Target parse(std::string_view arch);
  void validate() const;

  int sm() const;                  // 80, 89, 90 (throws like validate() for an unknown arch)
  bool has_wgmma() const;          // sm_90a: wgmma and the other arch-specific Hopper features
  bool has_fp8() const;            // sm_89+: cvt to/from e4m3 / e5m2 in hardware
  int64_t max_smem_per_block() const;   // opt-in dynamic shared memory per block, in bytes
  int64_t smem_per_sm() const { return max_smem_per_block() + 1024; }   // each block also reserves 1 KB
  int64_t max_threads_per_sm() const;   // resident threads per SM: 2048 (sm_80, sm_90), 1536 (sm_89)
  bool operator==(const Target&) const = default;
};

// The architectures the code generator accepts, e.g. {"sm_80", "sm_89", "sm_90", "sm_90a"}.
const std::vector<std::string>& supported_archs();

}  // namespace tj::codegen
