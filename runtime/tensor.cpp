#include "runtime/tensor.h"

#include <fmt/format.h>

namespace tj {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> TensorView::contiguous_strides() const {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = rank() - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

std::vector<int64_t> TensorView::effective_strides() const { return strides.empty() ? contiguous_strides() : strides; }

bool TensorView::is_contiguous() const { return strides.empty() || strides == contiguous_strides(); }

std::string TensorView::describe() const {
  return fmt::format("{}[{}] ({})", name(dtype), fmt::join(shape, ", "), device == Device::host ? "host" : "cuda");
}

TensorView slice_of(const TensorView& t, int dim, int64_t first, int64_t count) {
  TensorView s = t;
  s.strides = t.effective_strides();
  s.data = static_cast<char*>(t.data) + first * s.strides[dim] * size_bytes(t.dtype);
  s.shape[dim] = count;
  return s;
}

TensorView every_of(const TensorView& t, int dim, int64_t first, int64_t step) {
  TensorView s = slice_of(t, dim, first, (t.shape[dim] - first + step - 1) / step);
  s.strides[dim] *= step;
  return s;
}

}  // namespace tj
