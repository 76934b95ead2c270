// The `tilejit` command-line program.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "autotune/worker.h"
#include "kernels/library.h"
#include "core/error.h"
#include "tools/commands.h"

namespace {
void add_problem_options(CLI::App* cmd, tj::tools::ProblemOptions& p) {
  std::vector<std::string> names;
  for (const auto& e : tj::kernels::library()) names.push_back(e.name);
  cmd->add_option("kernel", p.kernel, fmt::format("library kernel: {}", fmt::join(names, ", ")))->required();
  cmd->add_option("--dtype", p.dtype,
                  "input element type: f32, f16, bf16, e4m3, e5m2 (`run attention`: e4m3 = the FP8 pipeline, bf16/f16 = "
                  "attention_fp8 on tensor cores, f32 = the SIMT kernel)")->capture_default_str();
  cmd->add_option("--out-dtype", p.out_dtype, "output element type (default: the input's; bf16 for fp8)");
  cmd->add_option("--shape", p.shape, "problem shape, e.g. 2,8,1024,64 for attention [B,H,S,D]");
  cmd->add_flag("--causal", p.causal, "causal mask (attention)");
  cmd->add_option("--config", p.config, R"(config JSON, e.g. '{"blocks":{"m":64,"n":64},"num_warps":4}')");
  cmd->add_option("--arch", p.arch, "target architecture, e.g. sm_90a or sm_80 (default: the GPU's, else sm_90a)");
}
}  // namespace

// Sizes: a whole number above 0 (CLI11's PositiveNumber names a range up to DBL_MAX).
const CLI::Validator positive(
    [](std::string& s) -> std::string {
      size_t used = 0;
      try {
        if (std::stoll(s, &used) > 0 && used == s.size()) return "";
      } catch (const std::exception&) {
      }
      return fmt::format("must be a whole number above 0, got {}", s);
    },
    "> 0");

int main(int argc, char** argv) {
  // The tuner's benchmark worker (autotune/worker.h): `tilejit __tune-worker --fd N`, started
  // by the tuner, not by people.
  if (argc >= 2 && std::strcmp(argv[1], "__tune-worker") == 0) {
    int fd = argc >= 4 && std::strcmp(argv[2], "--fd") == 0 ? std::atoi(argv[3]) : 3;
    try {
      return tj::autotune::worker_main(fd);
    } catch (const std::exception& e) {
      std::cerr << "tilejit __tune-worker: " << e.what() << "\n";
      return 2;
    }
  }

  // `tilejit export ...` runs the tilejit-export program, which links LLVM (tools/export.cpp).
  if (argc >= 2 && std::strcmp(argv[1], "export") == 0)
    return tj::tools::export_forward(std::vector<std::string>(argv + 2, argv + argc));
  // `tilejit bench ring ...` runs the tilejit-ring program, which links NCCL (tools/ring_main.cpp).
  if (argc >= 3 && std::strcmp(argv[1], "bench") == 0 && std::strcmp(argv[2], "ring") == 0)
    return tj::tools::ring_forward(std::vector<std::string>(argv + 3, argv + argc));

  CLI::App app{"tilejit: a tile-level kernel language for C++ (trace -> CUDA C++ -> NVRTC -> GPU)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tilejit " TILEJIT_VERSION);
  app.add_subcommand("export", "Write CUBINs + an LLVM-emitted launcher object + a C header for applications that "
                               "link only the CUDA driver (tilejit export --help)");

  auto* doctor = app.add_subcommand("doctor", "Check the CUDA driver, GPU, NVRTC and cache, and say what works here");
  auto* demo = app.add_subcommand("demo", "Trace, generate, compile and check a kernel end to end (works without a GPU)");

  tj::tools::ProblemOptions show_opts;
  bool show_ir = false, show_ptx = false, show_knobs = false;
  auto* show = app.add_subcommand("show", "Print a kernel's IR, generated CUDA C++ (default) or PTX");
  add_problem_options(show, show_opts);
  show->add_flag("--ir", show_ir, "print the traced IR");
  show->add_flag("--ptx", show_ptx, "print the PTX NVRTC produces");
  show->add_flag("--knobs", show_knobs, "print the config knobs of the lowering that takes the kernel, and the emitter's");

  tj::tools::ProblemOptions run_opts;
  bool force_check = false, no_check = false;
  int repeats = 50;
  auto* run = app.add_subcommand("run", "Run a kernel on the GPU and check it against the CPU reference");
  add_problem_options(run, run_opts);
  run->add_flag("--check", force_check, "always run the CPU reference check, even for large problems");
  run->add_flag("--no-check", no_check, "skip the CPU reference check");
  run->add_option("--repeats", repeats, "timed launches (median reported)")->capture_default_str();
  // `tilejit run attention`: the shape by its parts (the issue's grid fills in B = 16384 / S, H = 2048 / D).
  run->add_option("--batch", run_opts.batch, "attention: batch B (default 16384 / S with --seq)")->check(positive);
  run->add_option("--heads", run_opts.heads, "attention: heads H (default 2048 / D with --head-dim)")->check(positive);
  run->add_option("--seq", run_opts.seq, "attention: sequence length S (default 4096 when another of these is given)")
      ->check(positive);
  run->add_option("--head-dim", run_opts.head_dim, "attention: head dim D, 64/128/256 for e4m3/bf16/f16 (default 128)")
      ->check(positive);
  run->add_flag("--hadamard", run_opts.hadamard, "attention e4m3: rotate Q and K by a Hadamard before quantizing");
  run->add_flag("--backward", run_opts.backward,
                "attention bf16 / f16: the backward (dq, dk, dv from a random dO) after the forward, checked against float64 "
                "gradients and timed");
  run->add_flag("--delayed-scaling", run_opts.delayed_scaling,
                "attention e4m3: descales from the previous call's amaxes, measured in the same pass (one read of q, k, v; "
                "the first call measures first; timed and checked from the second call on)");
  run->add_flag("--q-residual", run_opts.q_residual,
                "attention e4m3: Q as e4m3 high + low parts (QK head dim 2D: more accurate, slower)");

  tj::tools::BenchAttentionOptions bench_opts;
  std::string bench_what, bench_variant;
  auto* bench =
      app.add_subcommand("bench", "Benchmark a kernel family against its peers on this GPU (attention, variants, inputs, memory)");
  bench->add_option("what", bench_what,
                    "what to benchmark: attention (FP8 / bf16 vs SDPA and Triton), variants (issue #7's attention variants "
                    "vs flex_attention and masked SDPA), inputs (grouped-query heads and [B, S, H, D] / packed QKV views vs the "
                    "multi-head [B, H, S, D] case), memory (softmax, norms, quantizers, add vs a copy and torch) or ring (ring "
                    "attention over NCCL on every GPU: `tilejit bench ring --help`)")
      ->required();
  tj::tools::BenchMemoryOptions memory_opts;
  auto* memory_rows = bench->add_option("--rows", memory_opts.rows, "memory: rows of the bf16 [rows, cols] inputs (default 16384)");
  auto* memory_cols = bench->add_option("--cols", memory_opts.cols, "memory: columns (default 4096)");
  bench->add_option("--seq", bench_opts.seq,
                    "one sequence length of the grid (1024 .. 16384; default: attention all, variants 2048 and 8192)");
  bench->add_option("--head-dim", bench_opts.head_dim, "one head dim of the grid (64, 128, 256; default: attention all, variants 128)");
  bench->add_flag("--causal", bench_opts.causal, "attention: causal shapes only");
  bench->add_flag("--non-causal", bench_opts.non_causal, "attention: non-causal shapes only");
  bench->add_flag("--both", bench_opts.both, "attention: causal and non-causal shapes (the default)");
  bench->add_flag("--backward", bench_opts.backward,
                  "attention: the backward (bf16 and FP8 dq, dk, dv after the forward's LSE, kernels/attention_backward.h) against "
                  "SDPA's backward (flash, cuDNN) instead of the forward; variants: each variant's backward against flex_attention's");
  bench->add_option("--variant", bench_variant,
                    "variants: NAME[,NAME...] of causal, sliding_window, alibi, softcap, prefix_lm, gqa, segment, documents, "
                    "block_mask, dilated (default all)");
  std::string bench_config_bf16, bench_config_fp8;
  bench->add_option("--config-bf16", bench_config_bf16,
                    "variants: config JSON for every bf16 variant kernel (dilated: every attention) instead of the defaults");
  bench->add_option("--config-fp8", bench_config_fp8,
                    "variants: config JSON for every fp8 variant kernel (dilated: every attention) instead of the defaults");
  auto* bench_reps =
      bench->add_option("--reps", bench_opts.reps, "timed launches per implementation and shape (median; variants --quick: 10)")
          ->capture_default_str();
  bench->add_option("--warmup", bench_opts.warmup, "untimed launches before them")->capture_default_str();
  bench->add_flag("--peers,!--no-peers", bench_opts.peers,
                  "run the peers (bench/attention/peers.py: PyTorch SDPA, Triton fp8 / flex_attention) after tilejit (default: yes)");
  bench->add_flag("--quick", bench_opts.quick,
                  "smoke test: attention S 2048, D 128, causal and not; variants S 8192 (unless --seq/--head-dim)");
  bench->add_option("--out", bench_opts.out, "also write the markdown table to this file");
  bench->add_option("--python", bench_opts.python, "the Python that runs the peers")->capture_default_str();
  bench->add_option("--peers-script", bench_opts.peers_script, "the peers' script (default: bench/attention/peers.py)");
  bench->add_option("--seed", bench_opts.seed, "seed of the random inputs")->capture_default_str();

  tj::tools::ProblemOptions tune_opts;
  tj::tools::TuneCliOptions tune_cli;
  auto* tune = app.add_subcommand("tune", "Autotune a kernel for a problem on this GPU and remember the winner");
  add_problem_options(tune, tune_opts);
  tune->get_option("--arch")->group("");   // not in its help: tune times this machine's GPU (an --arch is an error)
  tune->add_option("--effort", tune_cli.effort, "none (default config), quick, full, or exhaustive (every point, no budget)")
      ->capture_default_str();
  tune->add_option("--budget", tune_cli.budget_s, "time budget in seconds (default: quick 20, full 50, exhaustive none)");
  tune->add_option("--timeout", tune_cli.timeout_s, "seconds a candidate may take before it counts as a hang")
      ->capture_default_str();
  tune->add_option("--threads", tune_cli.threads, "NVRTC compile threads (default: hardware threads - 1)");
  tune->add_option("--repeats", tune_cli.repeats, "timed samples per candidate (default: quick 5, full 10)");
  tune->add_option("--top", tune_cli.top, "rows in the table of the best configs")->capture_default_str();
  tune->add_option("--seed", tune_cli.seed, "seed of the search's random sample and the inputs")->capture_default_str();
  tune->add_flag("--force", tune_cli.force, "tune even when the tuning cache has a result");
  tune->add_flag("--no-store", tune_cli.no_store, "do not store the winner in the tuning cache");
  tune->add_flag("--in-process", tune_cli.in_process, "benchmark in this process (no fault isolation; for debugging)");
  tune->add_option("--only", tune_cli.only,
                   "restrict a dimension of the space, e.g. --only num_warps=4 --only m=64,128 (repeatable)");

  // A first word that names no command: say which ones there are (CLI11 would say that a
  // subcommand is required).
  if (argc >= 2 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      std::cerr << fmt::format("tilejit: unknown command '{}' (commands: {}; tilejit --help)\n", argv[1], fmt::join(names, ", "));
      return 2;
    }
  }
  CLI11_PARSE(app, argc, argv);

  try {
    if (*doctor) return tj::tools::doctor();
    if (*demo) return tj::tools::demo();
    if (*show) return show_knobs ? tj::tools::show_knobs(show_opts) : tj::tools::show(show_opts, show_ir, show_ptx);
    if (*tune) return tj::tools::tune(tune_opts, tune_cli);
    if (*bench) {
      if (bench_opts.backward && bench_what != "attention" && bench_what != "variants")
        throw tj::Error(fmt::format("--backward applies to `tilejit bench attention` and `tilejit bench variants` (their backward), "
                                    "not to `tilejit bench {}`",
                                    bench_what));
      if (bench_what == "variants") {
        auto o = tj::tools::variants_options(bench_opts, bench_variant, bench_reps->count() > 0);
        o.config_bf16 = bench_config_bf16;
        o.config_fp8 = bench_config_fp8;
        if (bench_opts.backward) {
          if (!o.config_bf16.empty() || !o.config_fp8.empty())
            throw tj::Error("--config-bf16 and --config-fp8 apply to the variants' forward, not to `tilejit bench variants --backward`");
          return tj::tools::bench_variants_backward(o);
        }
        return tj::tools::bench_variants(o);
      }
      if (!bench_config_bf16.empty() || !bench_config_fp8.empty())
        throw tj::Error("--config-bf16 and --config-fp8 apply to `tilejit bench variants`");
      if (bench_what == "memory") {
        if (bench_opts.seq || bench_opts.head_dim || bench_opts.causal || bench_opts.non_causal || bench_opts.both ||
            !bench_variant.empty() || bench_opts.quick)
          throw tj::Error("`tilejit bench memory` takes --rows, --cols, --reps, --warmup, --peers/--no-peers, --out, --python, "
                          "--peers-script and --seed (not the attention shape options)");
        memory_opts.reps = bench_opts.reps;
        memory_opts.warmup = bench_opts.warmup;
        memory_opts.peers = bench_opts.peers;
        memory_opts.out = bench_opts.out;
        memory_opts.python = bench_opts.python;
        memory_opts.peers_script = bench_opts.peers_script;
        memory_opts.seed = bench_opts.seed;
        return tj::tools::bench_memory(memory_opts);
      }
      if (memory_rows->count() || memory_cols->count()) throw tj::Error("--rows and --cols apply to `tilejit bench memory`");
      if (bench_what == "inputs") {
        if (bench_opts.both || !bench_variant.empty() || bench_opts.quick || !bench_opts.peers_script.empty())
          throw tj::Error("`tilejit bench inputs` takes --seq, --head-dim, --causal / --non-causal, --reps, --warmup, --out "
                          "and --seed");
        tj::tools::BenchInputsOptions io;
        if (bench_opts.seq) io.seq = bench_opts.seq;
        if (bench_opts.head_dim) io.head_dim = bench_opts.head_dim;
        io.causal = bench_opts.causal;
        io.non_causal = bench_opts.non_causal;
        io.reps = bench_opts.reps;
        io.warmup = bench_opts.warmup;
        io.out = bench_opts.out;
        io.seed = bench_opts.seed;
        return tj::tools::bench_inputs(io);
      }
      if (bench_what != "attention")
        throw tj::Error(fmt::format("no benchmark named '{}' (benchmarks: attention, variants, inputs, memory)", bench_what));
      if (!bench_variant.empty())
        throw tj::Error("--variant applies to `tilejit bench variants`; `tilejit bench attention` times plain attention");
      return tj::tools::bench_attention(bench_opts);
    }
    if (*run) {
      if (no_check && force_check) throw tj::Error("--check and --no-check contradict each other");
      using tj::tools::CheckMode;
      return tj::tools::run(run_opts, force_check ? CheckMode::always : no_check ? CheckMode::never : CheckMode::automatic,
                            repeats);
    }
  } catch (const std::exception& e) {
    std::cerr << "tilejit: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
