#include "runtime/owned_tensor.h"

#include <cstring>

#include "core/error.h"
#include "core/numerics.h"

namespace tj {

namespace {
int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
}  // namespace

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)), bytes_(static_cast<size_t>(count(shape_)) * tj::size_bytes(dtype)) {}

HostTensor HostTensor::from_values(const std::vector<double>& values, DType dtype, std::vector<int64_t> shape) {
  HostTensor t(dtype, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel()) throw Error("HostTensor::from_values: value count does not match the shape");
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

int64_t HostTensor::numel() const { return count(shape_); }

TensorView HostTensor::view() const {
  return TensorView{const_cast<std::byte*>(bytes_.data()), dtype_, shape_, {}, Device::host};
}

std::vector<double> HostTensor::values() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = at(static_cast<int64_t>(i));
  return out;
}

double HostTensor::at(int64_t i) const { return numerics::load_element(bytes_.data(), dtype_, i); }
void HostTensor::set(int64_t i, double v) { numerics::store_element(bytes_.data(), dtype_, i, v); }
void HostTensor::fill_bytes(uint8_t byte) { std::memset(bytes_.data(), byte, bytes_.size()); }

DeviceTensor::DeviceTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)), buffer_(std::max<size_t>(1, static_cast<size_t>(count(shape_)) * tj::size_bytes(dtype))) {}

DeviceTensor DeviceTensor::from_host(const HostTensor& h) {
  DeviceTensor d(h.dtype(), h.shape());
  if (h.size_bytes()) d.buffer_.copy_from_host(h.data(), h.size_bytes());
  return d;
}

TensorView DeviceTensor::view() const {
  return TensorView{reinterpret_cast<void*>(buffer_.ptr()), dtype_, shape_, {}, Device::cuda};
}

HostTensor DeviceTensor::to_host() const {
  HostTensor h(dtype_, shape_);
  if (h.size_bytes()) buffer_.copy_to_host(h.data(), h.size_bytes());
  return h;
}

void DeviceTensor::fill_bytes(uint8_t byte) { buffer_.memset(byte); }
void DeviceTensor::fill_bytes_async(uint8_t byte, CUstream stream) { buffer_.memset_async(byte, stream); }

}  // namespace tj
