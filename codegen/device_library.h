#pragma once
// The device tile library (codegen/device/*.cuh), embedded into the binary at build time.
#include <string>
#include <vector>

namespace tj::codegen {
struct EmbeddedFile {
  std::string name;      // e.g. "tile.cuh", the name generated code #includes
  std::string contents;
};
const std::vector<EmbeddedFile>& device_library();
}  // namespace tj::codegen
