#pragma once
// Tensors that own their memory, on the host or the GPU: what tests, examples and the CLI
// use to feed kernels. Values cross in double and are rounded to the element type exactly
// as a cast would round them.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/memory.h"
#include "runtime/tensor.h"

namespace tj {

class HostTensor {
 public:
  HostTensor(DType dtype, std::vector<int64_t> shape);
  static HostTensor from_values(const std::vector<double>& values, DType dtype, std::vector<int64_t> shape);

  TensorView view() const;                 // contiguous host view
  std::vector<double> values() const;      // decoded, row-major
  double at(int64_t linear_index) const;
  void set(int64_t linear_index, double v);
  void fill_bytes(uint8_t byte);           // poison (0xFF is NaN for every float type)
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  size_t size_bytes() const { return bytes_.size(); }

 private:
  DType dtype_;
  std::vector<int64_t> shape_;
  std::vector<std::byte> bytes_;
};

class DeviceTensor {
 public:
  DeviceTensor(DType dtype, std::vector<int64_t> shape);
  static DeviceTensor from_host(const HostTensor& h);

  TensorView view() const;                 // contiguous device view
  HostTensor to_host() const;
  void fill_bytes(uint8_t byte);
  void fill_bytes_async(uint8_t byte, CUstream stream);   // in stream order (zeroing what atomic adds sum into)
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }

 private:
  DType dtype_;
  std::vector<int64_t> shape_;
  runtime::DeviceBuffer buffer_;
};

}  // namespace tj
