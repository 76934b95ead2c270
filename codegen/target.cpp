#include "codegen/target.h"

#include <fmt/format.h>

#include <cstdint>

#include "core/error.h"

namespace tj::codegen {

const std::vector<std::string>& supported_archs() {
  static const std::vector<std::string> archs = {"sm_80", "sm_89", "sm_90", "sm_90a"};
  return archs;
}

void Target::validate() const {
  for (const auto& a : supported_archs())
    if (a == arch) return;
  throw Error(fmt::format("unsupported target architecture '{}' (supported: {})", arch,
                          fmt::join(supported_archs(), ", ")));
}

Target Target::parse(std::string_view arch) {
  Target t{std::string(arch)};
  t.validate();
  return t;
}

int Target::sm() const {
  validate();
  if (arch == "sm_80") return 80;
  if (arch == "sm_89") return 89;
  return 90;
}

bool Target::has_wgmma() const { return sm() == 90 && arch == "sm_90a"; }
bool Target::has_fp8() const { return sm() >= 89; }

int64_t Target::max_smem_per_block() const {
  switch (sm()) {
    case 80: return 163 * 1024;   // A100: 164 KB per SM, 163 KB per block (opt-in)
    case 89: return 99 * 1024;    // Ada: 100 KB per SM, 99 KB per block
    default: return 227 * 1024;   // Hopper: 228 KB per SM, 227 KB per block
  }
}

int64_t Target::max_threads_per_sm() const { return sm() == 89 ? 1536 : 2048; }

}  // namespace tj::codegen
