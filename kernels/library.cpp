#include "kernels/library.h"

#include <fmt/format.h>

#include "runtime/error.h"

namespace tj::kernels {

const std::vector<LibraryEntry>& library() {
  static const std::vector<LibraryEntry> entries = {
      {"vector_add", &vector_add, "out = x + y (1-D)"},
      {"softmax", &softmax, "row softmax with online max/sum in exp2 (2-D)"},
      {"attention", &attention, "attention forward, online softmax, causal or not ([B, H, S, D])"},
  };
  return entries;
}

const Kernel& find(const std::string& name) {
  std::string names;
  for (const auto& e : library()) {
    if (e.name == name) return e.get();
    names += (names.empty() ? "" : ", ") + e.name;
  }
  throw Error(fmt::format("no kernel named '{}' (library kernels: {})", name, names));
}

}  // namespace tj::kernels
