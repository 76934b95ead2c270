#pragma once
// The JIT path: trace a kernel for the arguments' types and shapes, generate CUDA, compile
// it with NVRTC for the GPU's exact architecture, load it and launch it. Traces and
// modules are cached in memory (a repeated launch costs a lookup) and CUBINs on disk
// (a second process does not compile again).
#include <cuda.h>

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dsl/config.h"
#include "codegen/cuda_emitter.h"
#include "dsl/kernel.h"
#include "runtime/driver.h"
#include "runtime/memory.h"
#include "runtime/reference.h"
#include "runtime/tensor.h"

namespace tj {

// A launch argument: a tensor, or a number for a Scalar or host parameter.
using Arg = std::variant<TensorView, double, bool, int64_t>;

struct LaunchOptions {
  std::optional<Config> config;     // default: the tuned config if cached, else the default
                                    // ($TILEJIT_TUNING=off: always the default)
  CUstream stream = nullptr;
  bool dynamic_shapes = false;      // trace with runtime sizes (one compile for all shapes)
  // Generate for this architecture instead of the GPU's own ("sm_80", "sm_89", "sm_90",
  // "sm_90a"; empty: the GPU's), e.g. to run the sm_80 / sm_89 code paths on an H100. An older
  // architecture's kernel loads as PTX, which the driver compiles for the GPU (see compile()).
  // Without `config` it uses the default config (tuned configs belong to the GPU's own arch).
  std::string arch;
  // Let the kernel start before the previous kernel on `stream` has finished, where it can (sm_90
  // / sm_90a: SIMT kernels, compiled for it apart, and the attention kernels): it computes from its
  // In tensors at once and waits for the previous kernel before it reads or writes its outputs, so
  // one launch's start overlaps the other's end. Only where no kernel that may still be running
  // writes this one's In tensors: the previous kernel, and, if that one started early too, the
  // kernels it started beside. Ignored for kernels that cannot (they run after the previous one,
  // as without it).
  bool start_early = false;
  // Let the next kernel on `stream`, if launched with start_early, start once every block of this
  // one has started, not only once this one has finished (start_early implies it). A SIMT kernel
  // is compiled apart for either (sm_90+); its blocks then cost a few cycles more each.
  bool next_starts_early = false;
};

// The specialization a set of arguments selects: tensors give dtype and shape (shape
// dims become -1 with dynamic_shapes), Scalar slots take a float, host slots their value.
std::vector<ArgSpec> specs_for(const Kernel& k, const std::vector<Arg>& args, bool dynamic_shapes);

// Code generated and compiled for one (kernel, specialization, config, arch).
struct CompiledKernel {
  ir::Function ir;
  Config config;
  codegen::GeneratedKernel generated;
  std::string arch;
  std::string ptx;                  // when asked for
  std::vector<char> cubin;
  double compile_ms = 0;            // NVRTC time (0 when the CUBIN came from disk)
  bool from_disk_cache = false;
  // Loaded state (only with a GPU).
  std::unique_ptr<runtime::Module> module;
  CUfunction function = nullptr;
  int resident_blocks = 0;          // blocks an SM runs at once (the occupancy calculator, at load)
};

struct CompileRequest {
  std::string arch;                 // empty: the current GPU's
  bool want_ptx = false;
  bool load = true;                 // load the module (needs a GPU)
  bool start_early = false;         // a SIMT kernel for launches that start early (codegen::generate_simt)
};

// Traces, generates and compiles (memory and disk caches), optionally loads. Loading takes the
// CUBIN where the GPU runs it (the arch's major version, a minor not above the GPU's; sm_90a
// only on compute capability 9.0). For an older architecture than the GPU's (sm_80 or sm_89 on
// Hopper) the CUBIN cannot load, so the PTX is compiled too (CompiledKernel::ptx) and loaded
// instead: the driver JIT-compiles it for the GPU. A newer architecture than the GPU's throws.
const CompiledKernel& compile(const Kernel& k, const std::vector<ArgSpec>& specs, const Config& config,
                              const CompileRequest& request);

// NVRTC compilations compile() has run in this process (CUBINs found in the memory or disk
// cache do not count): a second process that finds everything on disk reports 0.
uint64_t nvrtc_compile_count();

// How a compiled kernel is launched (the one place tj::launch, the tuner's benchmarks and the
// exported launchers agree on): one block per program (per programs_per_block programs: knob
// wg_programs) on gridDim.x (persistent kernels: at most
// sm_count * blocks_per_sm blocks, and the program count is passed as a last `long long`
// argument), rounded up to a multiple of the cluster size; the generated kernel's threads,
// dynamic shared memory and cluster shape.
struct LaunchGeometry {
  runtime::Dim3 grid;
  runtime::Dim3 block;
  runtime::Dim3 cluster;
  size_t dynamic_smem = 0;
  int64_t programs = 0;
  bool persistent = false;                  // pass `programs` after the TMA descriptors
};
// Throws tj::Error when `programs` does not fit one launch.
LaunchGeometry launch_geometry(const CompiledKernel& ck, int64_t programs, int sm_count);

// The kernel's parameters among `args` (tensors and runtime scalars; host values dropped), as the
// CPU reference executor and the launch shape take them.
std::vector<ArgValue> param_values(const Kernel& k, const std::vector<Arg>& args);

// The number of programs `ck` runs for `args` (the product of its launch-loop extents).
int64_t count_programs(const Kernel& k, const CompiledKernel& ck, const std::vector<Arg>& args);

// Packs `args` (and the TMA descriptors `ck` asks for), checks the operands it reads in 16-byte
// pieces and launches `ck` with geometry `g` on options.stream. tj::launch (autotune/launch.h)
// chooses the kernel and the geometry. A kernel whose dots the generic lowering left on the SIMT
// path (GeneratedKernel::notes) is reported on its first launch (simt_dot_reports).
void launch_compiled(const Kernel& k, const CompiledKernel& ck, const std::vector<Arg>& args, const LaunchGeometry& g,
                     const LaunchOptions& options);

// What launches reported so far, in order: "tilejit: kernel 'k': dot at file:line stays on the SIMT
// path (no tensor cores): <reason>", once per kernel and dot. Each is also written to stderr unless
// $TILEJIT_QUIET is set.
std::vector<std::string> simt_dot_reports();

// The tensor map a lowering's TmaOperand describes, for `t`; throws tj::Error naming the
// kernel and parameter when the layout forbids TMA (alignment, strides, contiguity).
CUtensorMap encode_tma(const std::string& kernel, const std::string& param, const TensorView& t,
                       const codegen::TmaOperand& op);

// Throws tj::Error naming the kernel and parameter unless `t` can be read in 16-byte pieces:
// base address 16-byte aligned, last dim contiguous, every other stride a multiple of 16 bytes
// (dims of extent 1 excepted). tj::launch checks GeneratedKernel::aligned16_params with it.
void check_aligned16(const std::string& kernel, const std::string& param, const TensorView& t);

// The key that identifies a compiled kernel: IR + config + arch + toolkit + device library.
std::string compile_key(const std::string& cuda_source, const std::string& arch);

}  // namespace tj
