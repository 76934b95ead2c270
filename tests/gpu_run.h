#pragma once
// GPU tests' common step: a kernel run on the CPU reference executor and on the GPU with the same
// inputs and config, the output poisoned before each (tests/test_gpu_kernels.cpp,
// tests/test_mma_gpu.cpp).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dsl/config.h"
#include "dsl/kernel.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"

namespace tj_test {

// A tensor of N(0, scale) values rounded to `dt`.
tj::HostTensor random_tensor(tj::DType dt, std::vector<int64_t> shape, std::mt19937& rng, double scale = 1.0);

// A view that claims to be on the GPU at a made-up address, for argument checks that throw before
// any launch (never dereferenced).
inline tj::TensorView fake_device_view(tj::DType t, std::vector<int64_t> shape) {
  tj::TensorView v;
  v.data = reinterpret_cast<void*>(uintptr_t{0x1000});
  v.dtype = t;
  v.shape = std::move(shape);
  v.device = tj::Device::cuda;
  return v;
}

struct BothRuns {
  tj::HostTensor reference;   // tensors[out] after the CPU reference executor
  tj::HostTensor gpu;         // the same tensor from the GPU
  std::string lowering;       // GeneratedKernel::lowering of the kernel that ran
};

// Runs `k` on `tensors` (host copies; `out` is the output) and `tail` (scalars and host values) with
// `config` (default: default_config of the trace) on the CPU reference and through tj::launch, generated
// for `arch` ("": the GPU's own; an older architecture's kernel loads as PTX). The output is
// poisoned (NaN) first, unless `keep_out`: a kernel that adds into it (atomic_add) starts from its
// given contents on both sides.
BothRuns run_reference_and_gpu(const tj::Kernel& k, std::vector<tj::HostTensor>& tensors, const std::vector<tj::Arg>& tail,
                               size_t out, const std::optional<tj::Config>& config = std::nullopt,
                               const std::string& arch = "", bool keep_out = false);

}  // namespace tj_test
