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

#include "autotune/config.h"
#include "codegen/target.h"
#include "dsl/ir.h"

namespace tj::codegen {

// A TMA tensor map the launcher builds (cuTensorMapEncodeTiled) for one tensor parameter and
// passes, after all of f.params, as `const __grid_constant__ tj::dev::TmaDescriptor`, in the
// order of GeneratedKernel::tma. Dims are listed outermost first, like the tensor's own.
struct TmaOperand {
  int param = -1;                          // index into f.params (a tensor)
  std::vector<int> box;                    // elements per tensor dim copied at once (1 = one index)
  int swizzle_bytes = 128;                 // 0 (none), 32, 64 or 128
  // Dims to view as one (e.g. {0, 1, 2} folds [B, H, S] of a contiguous [B, H, S, D] into a
  // single dim), so the map has fewer than 6 dims; empty: keep every dim.
  std::vector<int> fold_outer_dims;
  // Traversal stride per tensor dim (outermost first, like box; empty: all 1): a box of n along a
  // dim of stride k copies elements 0, k, 2k, ... (ceil(n / k) of them) next to each other in
  // shared memory. Folded dims must have stride 1.
  std::vector<int> element_strides;
};

struct GeneratedKernel {
  std::string name;                        // the IR function's name
  std::string entry;                       // the extern "C" __global__ function
  std::string source;                      // CUDA C++ for NVRTC
  int threads = 0;                         // threads per block = num_warps * 32
  size_t dynamic_smem_bytes = 0;           // dynamic shared memory per block
  std::vector<std::string> device_headers; // names of the device_library() files it includes
  // Launch shape beyond the SIMT defaults (set by tensor-core lowerings):
  std::vector<TmaOperand> tma;             // extra descriptor parameters, in order
  int cluster_x = 1;                       // thread-block cluster size along x
  // Persistent kernels: at most sm_count * blocks_per_sm blocks, each looping over programs;
  // the program count is passed after the descriptors as `long long tj_programs`.
  bool persistent = false;
  int blocks_per_sm = 1;
  // Tensor parameters the kernel reads in 16-byte pieces (cp.async): each needs a 16-byte
  // aligned base address, a contiguous last dim and every other stride a multiple of 16 bytes;
  // the launcher checks (tj::check_aligned16) and names the tensor otherwise.
  std::vector<int> aligned16_params;
  // The kernel may start before the previous kernel on its stream has finished (programmatic
  // dependent launch, sm_90; LaunchOptions::start_early asks for it): it reads its In tensors at
  // once and waits for the previous kernel before it reads or writes anything else. (SIMT kernels
  // generated with start_early; the sm_90a attention kernels.)
  bool starts_early = false;
  std::string lowering = "simt";           // which lowering produced it (for `tilejit show`)
};

// A lowering that recognizes whole kernels (e.g. a K-loop of dots on sm_90a) and emits
// tensor-core code for them. Lowerings are tried in registration order before the SIMT
// path; one that returns nothing leaves the kernel to the next.
struct PatternLowering {
  std::string name;
  // Empty when the kernel, config or target does not fit; throws tj::Error when it fits the
  // pattern but the config cannot work (explaining why).
  std::optional<GeneratedKernel> (*try_lower)(const ir::Function& f, const Config& cfg, const Target& t);
};
// Registers a lowering at static-initialization time; returns a dummy for `static const bool`.
bool register_lowering(PatternLowering l);
const std::vector<PatternLowering>& lowerings();

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
