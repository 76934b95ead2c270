#include "tests/gpu.h"

#include <exception>

#include "runtime/device.h"
#include "runtime/driver.h"

namespace tj_test {
namespace {
struct GpuState {
  bool available = false;
  std::string reason;
};

const GpuState& state() {
  static const GpuState s = [] {
    GpuState g;
    auto& d = tj::runtime::driver();
    if (!d.available()) {
      g.reason = d.unavailable_reason();
      return g;
    }
    try {
      tj::runtime::current_device();
      g.available = true;
    } catch (const std::exception& e) {
      g.reason = e.what();
    }
    return g;
  }();
  return s;
}
}  // namespace

bool gpu_available() { return state().available; }
const std::string& gpu_unavailable_reason() { return state().reason; }
std::string gpu_arch() { return tj::runtime::current_device().arch(); }
}  // namespace tj_test
