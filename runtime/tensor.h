#pragma once
// A view of a tensor's memory: where it lives, its element type, shape and strides (in
// elements). Views never own memory.
#include <cstdint>
#include <string>
#include <vector>

#include "core/types.h"

namespace tj {

enum class Device : uint8_t { host, cuda };

struct TensorView {
  void* data = nullptr;              // host pointer, or a CUdeviceptr cast to void*
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;      // elements; empty means contiguous row-major
  Device device = Device::host;

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numel() const;
  std::vector<int64_t> contiguous_strides() const;
  std::vector<int64_t> effective_strides() const;          // strides, or contiguous ones
  bool is_contiguous() const;
  std::string describe() const;                         // "bf16[2, 4, 128, 64] (cuda)"
};

// Views of a view's memory (explicit strides): indices [first, first + count) of dimension
// `dim`, and every `step`-th index of `dim` from `first` on.
TensorView slice_of(const TensorView& t, int dim, int64_t first, int64_t count);
TensorView every_of(const TensorView& t, int dim, int64_t first, int64_t step);

}  // namespace tj
