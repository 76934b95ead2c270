#pragma once
// What a lowering produces: CUDA source and how to launch it (the kernel ABI is described in
// codegen/cuda_emitter.h).
#include <cstddef>
#include <string>
#include <vector>

namespace tj::codegen {

// A TMA tensor map the launcher builds (cuTensorMapEncodeTiled) for one tensor parameter and
// passes, after all of f.params, as `const __grid_constant__ tj::dev::TmaDescriptor`, in the
// order of GeneratedKernel::tma. Dims are listed outermost first, like the tensor's own.
struct TmaOperand {
  int param = -1;                          // index into f.params (a tensor)
  std::vector<int> box;                    // elements per tensor dim copied at once (1 = one index)
  int swizzle_bytes = 128;                 // 0 (none), 32, 64 or 128
  // Traversal stride per tensor dim (outermost first, like box; empty: all 1): a box of n along a
  // dim of stride k copies elements 0, k, 2k, ... (ceil(n / k) of them) next to each other in
  // shared memory.
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
  // the program count is passed after the descriptors as `long long tj_programs`. blocks_per_sm
  // 0: as many as the occupancy calculator fits on an SM (cuOccupancyMaxActiveBlocksPerMultiprocessor
  // with `threads` and the dynamic shared memory), asked where the kernel is loaded.
  bool persistent = false;
  int blocks_per_sm = 1;
  int64_t max_blocks = 0;                  // persistent: at most this many blocks (0: no cap)
  // Programs a block runs at once, each on threads of its own (knob wg_programs): the grid has
  // ceil(programs / programs_per_block) blocks before the persistent cap.
  int programs_per_block = 1;
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
  // "dot at file:line: reason" for each dot left on the SIMT path of a target with tensor cores.
  std::vector<std::string> notes;
};

}  // namespace tj::codegen
