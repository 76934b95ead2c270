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
#include <optional>
#include <string>
#include <vector>

#include "codegen/generated_kernel.h"
#include "codegen/lowering.h"
#include "codegen/target.h"
#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen {

// The SIMT path alone (what generate_cuda falls back to). `start_early` (sm_90+): the kernel lets
// the next one on its stream start at once and waits for the previous one before its first write
// or read of a tensor it writes (GeneratedKernel::starts_early), for launches that ask for it
// (LaunchOptions::start_early). Off, the kernel has neither: both cost every block a few cycles,
// which kernels of many short blocks feel (vector_add of 2^26 floats in blocks of 64: 2x slower).
GeneratedKernel generate_simt(const ir::Function& f, const Config& cfg, const Target& t, bool start_early = false);

// Generates the CUDA source of `f` (launch loops marked) for `cfg` on `t`: the first pattern
// lowering that accepts it, else the SIMT path. Config knob "lowering" = 0 forces SIMT.
// Throws tj::DslError at the op for IR the backend does not support (tiles of rank > 2), and
// tj::Error naming the kernel and the sizes for configs that cannot work (a register tile of
// more than 256 elements per thread, shared memory beyond the target's limit).
// `start_early` as for generate_simt (the sm_90a attention lowering always starts early).
GeneratedKernel generate_cuda(const ir::Function& f, const Config& cfg, const Target& t, bool start_early = false);

// The most elements of one register tile a thread may hold in the SIMT path.
inline constexpr int kMaxTileElementsPerThread = 256;

}  // namespace tj::codegen
