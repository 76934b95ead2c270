#pragma once
// The host launcher of exported kernels, generated with LLVM (`tilejit export`).
//
// For one kernel and its compiled specializations this emits, through LLVM's C++ API (IR
// built with IRBuilder, optimized, emitted as an ELF object for the host), an object file
// that holds the CUBINs as constants and defines plain C functions:
//
//   tj_status NAME_launch(CUstream, const tj_tensor* q, ..., float scale, int causal);
//   tj_status NAME_launch_dlpack(CUstream, const DLTensor* q, ..., float scale, int causal);
//   tj_status NAME_launchv(CUstream, const tj_arg* args, int32_t nargs);   // generic, by slot
//   tj_status NAME_load(void);                  // load the modules for the current context now
//   const char* NAME_last_error(void);          // what the calling thread's last failure was
//   const char* NAME_specializations(void);     // what was exported
//   const char* tj_status_message(tj_status);   // weak: shared by every exported object
//
// and the C header that declares them (emit_launcher_header). The object references only
// CUDA driver functions (cuCtxGetCurrent, cuCtxGetDevice, cuDeviceGetAttribute,
// cuModuleLoadData, cuModuleGetFunction, cuFuncSetAttribute, cuLaunchKernel and, when a
// specialization needs them, cuLaunchKernelEx and cuTensorMapEncodeTiled, cuGetErrorName,
// cuGetErrorString) and libc (snprintf, sched_yield): an application links it with libcuda
// alone: no NVRTC, no tilejit library, no C++ runtime.
//
// What NAME_launch does, in order (the same contract the JIT path follows, see
// codegen/cuda_emitter.h for the kernel ABI and runtime/jit.cpp for the C++ launcher):
//  1. Checks that no tensor pointer is NULL.
//  2. Finds the current context (cuCtxGetCurrent) in a small table of contexts (lock-free
//     lookup; new contexts are added under a spin lock), with its compute capability and
//     multiprocessor count, read once per context.
//  3. Dispatches: the first specialization whose tensor ranks, dtypes and static dims,
//     host values (e.g. `causal`) and architecture (sm_90a needs cc 9.0 exactly; sm_80 runs
//     on 8.x) match. Static shapes are part of a specialization, so a static entry serves
//     exactly its shape; an entry traced with dynamic shapes serves any. Specializations are
//     tried static before dynamic, the most specific architecture first. No match returns
//     TJ_ERROR_DTYPE, TJ_ERROR_SHAPE or TJ_ERROR_UNSUPPORTED_DEVICE, and last_error() lists
//     the arguments given and what was exported.
//  4. Checks dims (non-negative), data pointers (non-NULL unless empty, aligned to the
//     element size) and, for tensors the kernel reads through TMA, the layout TMA needs
//     (16-byte base and strides, contiguous last dim), as runtime/jit.cpp's encode_tma; the
//     same for tensors read in 16-byte cp.async pieces (check_aligned16).
//  5. Loads the CUBIN once per context (cuModuleLoadData, cuModuleGetFunction, and the
//     dynamic shared memory opt-in above 48 KiB); thread-safe: the CUfunction slot is read
//     with acquire ordering and written under the lock.
//  6. Evaluates the launch-loop extents from the IR's host-computable scalar ops (the
//     ops runtime/reference.h's launch_shape evaluates, with the same integer semantics),
//     emitted as LLVM IR; programs = their product (0: nothing is launched).
//  7. Packs the arguments exactly like runtime/jit.cpp: each tensor as TensorArg<R>
//     {data, shape[R], stride[R]} (strides in elements; NULL strides mean row-major), each
//     Scalar as float, then the TMA descriptors (cuTensorMapEncodeTiled) and, for persistent
//     kernels, `long long tj_programs`.
//  8. Launches: grid = ceil(programs / programs_per_block) (persistent: at most SMs *
//     blocks_per_sm), rounded up
//     to a multiple of the cluster size; cuLaunchKernelEx with the cluster attribute when
//     cluster_x > 1, else cuLaunchKernel.
// Errors are returned as tj_status codes, never by exiting; the calling thread's
// NAME_last_error() says what failed ("attention_launch: argument 'q': ...").
//
// Why the JIT path (tj::launch) keeps its C++ launcher instead of JIT-compiling this one
// with LLVM ORC: libtilejit stays free of LLVM (libLLVM is ~115 MB; embedders of the JIT,
// the GPU test machines and installs would all have to carry it, and every build would
// link it), and the JIT path dispatches on arbitrary shapes with compile-on-miss and the
// tuning cache, which a static dispatch table cannot express. Both launchers implement
// the one ABI that codegen/cuda_emitter.h documents; tests/test_export.cpp checks the
// exported launcher's argument packing and grid against tj::launch_shape and that ABI
// with a mock driver, and tests/test_export_gpu.cpp runs both on a GPU and compares
// outputs and launch overhead.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/config.h"
#include "codegen/launch_status.h"
#include "codegen/cuda_emitter.h"
#include "dsl/ir.h"
#include "dsl/kernel.h"

namespace tj::codegen {

// One compiled specialization. The pointers must stay valid while emitting.
struct LauncherVariant {
  const ir::Function* ir = nullptr;          // traced for `specs`, launch loops marked
  const Config* config = nullptr;
  const GeneratedKernel* kernel = nullptr;
  std::string arch;                          // "sm_90a", "sm_80", ...
  std::string_view cubin;                    // the CUBIN's bytes
  std::vector<ArgSpec> specs;                // per slot: tensor dtypes/shapes (-1: dynamic), host values
  std::string note;                          // for the listing, e.g. "tuned" or "default config"
};

// A kernel to export: its C name, its parameters (the DSL kernel's slots) and the
// specializations to dispatch between.
struct LauncherKernel {
  std::string name;                          // C identifier: NAME_launch, ...
  std::vector<Slot> slots;
  std::vector<LauncherVariant> variants;
};

struct HostLauncherOptions {
  std::string triple;                        // empty: the host's (x86_64-pc-linux-gnu here)
  std::string tilejit_version = "0.1.0";     // recorded in the header and object
};

// The C identifier for a kernel or parameter name ("my-kernel" -> "my_kernel").
std::string c_identifier(std::string_view name);

// The LLVM IR module (text, for tests and `--emit-llvm`), before optimization. Throws
// tj::Error when a specialization cannot be exported (explaining why, e.g. a launch bound
// the host cannot evaluate without libm).
std::string emit_launcher_ir(const LauncherKernel& k, const HostLauncherOptions& options = {});

// The relocatable object file (position-independent, so it links into executables and
// shared libraries alike).
std::string emit_launcher_object(const LauncherKernel& k, const HostLauncherOptions& options = {});

// The C header declaring the functions above (self-contained C99, usable from
// C++; several exported headers can be included together).
std::string emit_launcher_header(const LauncherKernel& k, const HostLauncherOptions& options = {});

// One line per specialization ("0: sm_90a q=f32[1,2,128,64] ... causal=0 (default config)").
std::string describe_variants(const LauncherKernel& k);

// A static library (GNU ar format with a symbol table) of (member name, object bytes).
std::string write_static_library(const std::vector<std::pair<std::string, std::string>>& objects);

inline constexpr int kMaxLauncherContexts = 64;
}  // namespace tj::codegen
