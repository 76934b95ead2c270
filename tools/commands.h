#pragma once
// Subcommands of the `tilejit` program. Each returns the process exit status.
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace tj::tools {

// What the user asked to run or show: a library kernel and its problem.
struct ProblemOptions {
  std::string kernel;
  std::string dtype = "f32";
  std::string out_dtype;          // empty: the kernel's default
  std::string shape;              // "2,4,1024,64"; empty: the kernel's default
  bool causal = false;
  std::string config;             // JSON; empty: the default config
  std::string arch;               // empty: the GPU's, or sm_90a without one
  // `tilejit run attention` only (tools/attention.h): the shape by its parts instead of --shape;
  // 0 = not given.
  int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  // `tilejit run attention --dtype e4m3`: the FP8 quantization recipes of kernels/attention_fp8.h.
  bool hadamard = false, q_residual = false;
  bool delayed_scaling = false;   // attention e4m3: the previous call's amaxes (kernels/attention_fp8.h)
  bool backward = false;          // attention bf16 / f16: the backward after the forward (kernels/attention_backward.h)
};

// `tilejit doctor`: what this machine can do (driver, GPU, NVRTC, features, cache).
int doctor();
// `tilejit show`: the IR, the generated CUDA, or the PTX of a kernel.
int show(const ProblemOptions& p, bool ir, bool ptx);
// `tilejit show KERNEL --knobs`: the knob tables (codegen/knob.h) of the lowering that takes the
// kernel for the problem and of the CUDA emitter: name, default, what it does.
int show_knobs(const ProblemOptions& p);
// `tilejit run`: run on the GPU and check against the CPU reference (CPU reference alone
// without a GPU).
enum class CheckMode { automatic, always, never };   // automatic: when the CPU can afford it
// The exit status of a `run` that ran nothing: no GPU, and the CPU reference executor skipped (too
// large, or --no-check). 0 is a run that passed, 1 an error or a failed check.
constexpr int kNothingRan = 3;
int run(const ProblemOptions& p, CheckMode check, int repeats);
// `tilejit run attention --dtype e4m3|bf16|f16` (run() sends it there): the FP8 pipeline or the
// 16-bit tensor-core path, checked against float64 of the unquantized inputs (tools/attention.h).
int run_attention(const ProblemOptions& p, CheckMode check, int repeats);

// `tilejit bench attention`: tilejit FP8 (kernel alone and whole pipeline) and bf16 over the
// issue's shape grid, then the peers (bench/attention/peers.py: PyTorch SDPA bf16 flash and
// cuDNN, a Triton FP8 flash attention) in a subprocess, merged into one markdown table.
struct BenchAttentionOptions {
  int64_t seq = 0;                // 0: every S of the grid (1024 .. 16384)
  int64_t head_dim = 0;           // 0: 64, 128 and 256
  bool causal = false, non_causal = false, both = false;   // at most one; none: both
  int reps = 20;                  // timed launches per implementation and shape (median)
  int warmup = 3;
  bool peers = true;
  bool quick = false;             // one shape (S 2048, D 128, unless --seq/--head-dim), causal and not: a smoke test
  std::string out;                // markdown file; empty: stdout only
  std::string python = "python3";
  std::string peers_script;       // empty: bench/attention/peers.py (from here or the source tree)
  uint64_t seed = 20261122;
  bool backward = false;          // the attention backward (bf16) against SDPA's backward instead of the forward
};
int bench_attention(const BenchAttentionOptions& o);
// `tilejit bench attention --backward` (bench_attention sends it there): kernels::attention_backward
// after the forward's LSE, gradients checked against float64, then SDPA's backward (flash, cuDNN)
// through peers.py --backward; one markdown table.
int bench_attention_backward(const BenchAttentionOptions& o);

// `tilejit bench variants` (issue #7): the attention variants of kernels/attention_variants.h
// (and GQA) in bf16 and fp8, with and without block skipping, against PyTorch's compiled
// flex_attention and SDPA with an explicit mask (bench/attention/peers.py --variants), one
// markdown table (tools/variants.h).
struct BenchVariantsOptions {
  int64_t seq = 0;                // 0: 2048 and 8192 (--quick: 8192)
  int64_t head_dim = 0;           // 0: 128
  std::vector<std::string> variants;   // empty: all (tools/variants.h: variant_names())
  int reps = 20;                  // timed launches per implementation (median); --quick: 10 unless given
  int warmup = 3;
  bool peers = true;
  bool quick = false;
  std::string out;
  std::string python = "python3";
  std::string peers_script;
  uint64_t seed = 20261122;
  // Config JSON replacing attention_fp8_default_config's for every case's bf16 / fp8 kernel
  // (empty: the default); e.g. '{"blocks":{"m":128,"n":128},"num_stages":2}'.
  std::string config_bf16, config_fp8;
};
// The variants' options from the `bench` command line they share with `bench attention`:
// `variant` is --variant (NAME or NAME,NAME,...; empty: all), `reps_given` whether --reps was on
// it. Throws tj::Error for the attention-only mask flags (--causal, --non-causal, --both).
BenchVariantsOptions variants_options(const BenchAttentionOptions& common, const std::string& variant, bool reps_given);
int bench_variants(const BenchVariantsOptions& o);
// `tilejit bench variants --backward` (tools/bench_variants_backward.cpp): each variant's backward
// (kernels::attention_variant_backward) after its forward's LSE, gradients checked against float64 of
// the variant's meaning, then flex_attention's compiled backward (peers.py --variants --backward);
// one markdown table. dilated is not timed there (its backward: kernels/dilated_attention.h).
int bench_variants_backward(const BenchVariantsOptions& o);

// `tilejit bench memory` (tools/bench_memory.cpp): softmax, RMSNorm, LayerNorm, an add and the
// e4m3 quantizer with its amax (and transposing) over bf16 [rows, cols], against a copy of the same
// bytes and bench/memory/peers.py (PyTorch eager and torch.compile), one markdown table.
struct BenchMemoryOptions {
  int64_t rows = 16384, cols = 4096;   // 128 MB of bf16: past the L2 cache
  int reps = 20;
  int warmup = 3;
  bool peers = true;
  std::string out;
  std::string python = "python3";
  std::string peers_script;            // empty: bench/memory/peers.py
  uint64_t seed = 20261122;
};
int bench_memory(const BenchMemoryOptions& o);

// `tilejit bench inputs` (issue #43): attention on grouped-query heads (4:1, 8:1) and on [B, S, H, D] /
// packed QKV views against the multi-head [B, H, S, D] case, bf16 and FP8 (tools/bench_inputs.cpp).
struct BenchInputsOptions {
  int64_t seq = 4096;             // B = 16384 / seq
  int64_t head_dim = 128;         // H = 2048 / head_dim
  bool causal = false, non_causal = false;   // neither: both
  int reps = 20;
  int warmup = 3;
  std::string out;
  uint64_t seed = 20261122;
};
int bench_inputs(const BenchInputsOptions& o);

// `tilejit demo`: trace, generate, compile and check kernels end to end, on any machine.
int demo();

// `tilejit export`: CUBINs + an LLVM-emitted launcher object + a C header per kernel, for
// applications that link only the CUDA driver (tools/export.cpp, codegen/host_launcher.h).
// It lives in the `tilejit-export` program, which links LLVM; `tilejit export ARGS` runs
// `tilejit-export ARGS` from the same directory (export_forward), so `tilejit` itself does
// not need LLVM.
struct ExportOptions {
  std::vector<std::string> kernels;
  std::string archs = "sm_90a";                // comma-separated
  std::vector<std::string> shapes;             // [KERNEL:]DIMS|dynamic[@DTYPE]
  std::string dtypes = "f32";                  // comma-separated
  std::string out_dtype;
  // Attention's mask variants, spelled as `bench attention` spells them: --causal (causal only),
  // --non-causal (the default), --both; at most one.
  bool causal = false, non_causal = false, both = false;
  std::string config;                          // JSON forced for every specialization
  std::string out_dir;
  std::string lib_name = "tilejit_exports";
  bool test_data = false;
  double test_data_max_flops = 2e8;
  bool emit_llvm = false;
  bool quiet = false;
};
void add_export_options(CLI::App* cmd, ExportOptions& o);
int export_kernels(const ExportOptions& o);
// Replaces this process with `tilejit-export` (next to the running program) and `args`;
// returns only on failure (with a message on stderr) and then returns 1.
int export_forward(const std::vector<std::string>& args);
// `tilejit bench ring ARGS` runs `tilejit-ring ARGS` (tools/ring_main.cpp: ring attention over NCCL).
int ring_forward(const std::vector<std::string>& args);
// `tilejit tune`: autotune a library kernel for one problem on this GPU and store the winner.
struct TuneCliOptions {
  std::string effort = "full";    // none, quick, full, exhaustive
  double budget_s = 0;            // 0: the effort's budget
  double timeout_s = 30;          // per candidate in the worker (hang detection)
  int threads = 0;                // NVRTC threads; 0: hardware threads - 1
  int repeats = 0;                // timed samples per candidate; 0: the effort's
  int top = 10;                   // rows of the final table
  bool force = false;             // tune even when the cache has a result
  bool no_store = false;          // do not write the tuning cache
  bool in_process = false;        // benchmark in this process (no fault isolation)
  uint64_t seed = 1;
  std::vector<std::string> only;  // "name=v1,v2": restrict a dimension of the space
};
int tune(const ProblemOptions& p, const TuneCliOptions& t);

}  // namespace tj::tools
