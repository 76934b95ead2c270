#pragma once
// The project's exception type. Subsystems derive their own (tj::CompileError in
// runtime/nvrtc.h, tj::CudaError in runtime/driver.h, ...), so `catch (const tj::Error&)`
// catches everything tilejit throws on purpose.
#include <stdexcept>
#include <string>

namespace tj {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tj
