#pragma once
// CUDA C++ generation from the IR (the SIMT path; tensor-core layouts come later).
//
// The generated source is meant to be read: one statement per IR op, each a call into the
// device tile library (codegen/device/tile.cuh) ending with `// @ <file>:<line>`, the DSL line
// of the op (the runtime's compile-error formatter maps NVRTC errors back through it).
//
// Kernel ABI (what the runtime packs): the parameters of `f.params`, in order; a tensor of
// rank R is passed by value as tj::dev::TensorArg<R> { void* data; long long shape[R];
// long long stride[R]; } (strides in elements), a scalar_f32 as `float`, a scalar_i64 as
// `long long`. Launch: blockDim.x = threads, dynamic shared memory = dynamic_smem_bytes, and
// at least as many blocks as programs (the product of the launch-loop extents; see
// dsl/SEMANTICS.md), as gridDim.x or gridDim.x * gridDim.y: program id = blockIdx.x +
// blockIdx.y * gridDim.x, blocks past the last program return at once. Launch-loop indices
// are decoded from the program id with the innermost launch loop varying fastest.
#include <cstddef>
#include <string>
#include <vector>

#include "autotune/config.h"
#include "codegen/target.h"
#include "dsl/ir.h"

namespace tj::codegen {

struct GeneratedKernel {
  std::string name;                        // the IR function's name
  std::string entry;                       // the extern "C" __global__ function
  std::string source;                      // CUDA C++ for NVRTC
  int threads = 0;                         // threads per block = num_warps * 32
  size_t dynamic_smem_bytes = 0;           // dynamic shared memory per block
  std::vector<std::string> device_headers; // names of the device_library() files it includes
};

// Generates the CUDA source of `f` (launch loops marked) for `cfg` on `t`.
// Throws tj::DslError at the op for IR the backend does not support (tiles of rank > 2), and
// tj::Error naming the kernel and the sizes for configs that cannot work (a register tile of
// more than 256 elements per thread, shared memory beyond the target's limit).
GeneratedKernel generate_cuda(const ir::Function& f, const Config& cfg, const Target& t);

// The most elements of one register tile a thread may hold in the SIMT path.
inline constexpr int kMaxTileElementsPerThread = 256;

}  // namespace tj::codegen
