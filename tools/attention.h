#pragma once
// `tilejit run attention --dtype e4m3|bf16|f16` and `tilejit bench attention`: the FP8 attention
// pipeline (kernels/attention_fp8.h) and its 16-bit twin, checked against float64 and timed.
//
// Pieces shared by the two commands (tools/attention_run.cpp, tools/bench_attention.cpp) and
// tested on their own (tests/test_cli_attention.cpp): resolving the options into a problem (with
// the errors a user sees), random inputs, the float64 reference on sampled rows, the accuracy
// metrics and their tolerances, and event timing with the L2 flushed between launches.
#include <cuda.h>

#include <algorithm>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dsl/config.h"
#include "dsl/kernel.h"
#include "runtime/jit.h"
#include "runtime/memory.h"
#include "runtime/owned_tensor.h"
#include "tools/commands.h"

namespace tj::tools {

// The shape grid: B·S = 16384 tokens and H·D = 2048 model width for every S and D.
constexpr int64_t kGridTokens = 16384;
constexpr int64_t kGridWidth = 2048;
const std::vector<int64_t>& grid_seqs();        // 1024 .. 16384
const std::vector<int64_t>& grid_head_dims();   // 64, 128, 256

// TFLOP/s convention of the issue: 4·B·H·S²·D per forward, half of it when causal.
double attention_flops(int64_t B, int64_t H, int64_t S, int64_t D, bool causal);

// Runs fn(i) for i in [0, n) on every core, in contiguous chunks (the float64 references and the
// host-side counting of the benches are the slow CPU parts).
template <class Fn>
void parallel_for(int64_t n, Fn fn) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), n));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int64_t i = t * chunk; i < std::min(n, (t + 1) * chunk); ++i) fn(i);
    });
  for (auto& th : pool) th.join();
}

// log2(e) / sqrt(D): attention_fp8's `scale` argument for the default softmax scale.
double scale_log2(int64_t D);
// `t` with another shape of the same contiguous memory (one flat buffer serves every shape of a
// bench grid).
TensorView reshaped(const TensorView& t, std::vector<int64_t> shape);

// ---- `tilejit run attention`: which path, which problem -------------------------------------

// What `tilejit run attention` runs for a --dtype.
enum class AttentionPath {
  library_simt,        // f32: the `attention` library kernel (SIMT), like any `tilejit run KERNEL`
  fp8_pipeline,        // e4m3: quantize_fp8 (q, k) + quantize_transpose_fp8 (v), then attention_fp8
  tensor_core_16bit,   // bf16 / f16: attention_fp8 on the 16-bit inputs as given (descales 1)
};
// One line for the user, e.g. "FP8 pipeline (quantize_fp8 + quantize_transpose_fp8 + attention_fp8)".
std::string describe(AttentionPath p);

// True when `tilejit run` takes the attention path below: kernel `attention` with a --dtype
// other than f32 (f32 keeps the SIMT library kernel; unknown dtypes get the attention path's
// error, which lists what each dtype runs).
bool runs_attention_pipeline(const ProblemOptions& o);
// `o` with kernel `attention` and such a --dtype turned into attention_fp8, the kernel `tilejit run`
// launches on the tensor cores, for the commands that look at one kernel (show, tune: `doing`
// says what they do with it, on stderr); `o` itself otherwise.
ProblemOptions as_run_takes_it(const ProblemOptions& o, const char* doing);

struct AttentionProblem {
  AttentionPath path = AttentionPath::fp8_pipeline;
  DType in = DType::e4m3;        // what the attention kernel reads
  DType source = DType::bf16;    // the random inputs (bf16 for e4m3: the pipeline quantizes them)
  DType out = DType::bf16;
  int64_t B = 1, H = 2, S = 256, D = 64;
  bool causal = false;
  bool hadamard = false, q_residual = false;   // FP8 recipes (kernels/attention_fp8.h)
  bool delayed_scaling = false;                // e4m3: descales from the previous call's amaxes (one pass)
  bool backward = false;                       // bf16 / f16: the backward after the forward
  std::optional<Config> config;  // --config (the attention_fp8 kernel's); else tuned / default
  std::vector<int64_t> shape() const { return {B, H, S, D}; }
  double flops() const { return attention_flops(B, H, S, D, causal); }
};

// The [B, H, S, D] that --shape or --batch/--heads/--seq/--head-dim give (exclusive). Without
// either: [1, 2, 256, 64]. With some of the second group: S 4096 and D 128 unless given, B
// = max(1, 16384 / S) and H = max(1, 2048 / D) unless given (the grid).
std::vector<int64_t> attention_shape(const ProblemOptions& o);

// Validates everything `tilejit run attention --dtype e4m3|bf16|f16` takes; throws tj::Error
// with a message that names the option and the path (tests/test_cli_attention.cpp checks each).
// Runs `k` with `args` (host tensors, numbers, host flags) on the CPU reference executor, with
// `cfg` or the kernel's default config.
void run_on_cpu(const Kernel& k, const std::vector<Arg>& args, const std::optional<Config>& cfg = std::nullopt);

AttentionProblem resolve_attention(const ProblemOptions& o);
// `tilejit run attention --dtype bf16|f16 --backward` (tools/attention_backward_run.cpp): the forward
// with its LSE, the backward for a random dO, checked against float64 gradients and timed.
int run_attention_backward(const AttentionProblem& p, CheckMode check, int repeats);

// The attention_fp8 config for a problem on this GPU: the one `tilejit tune attention_fp8 --dtype
// IN --shape B,H,S,D [--causal]` stored (looked up with that command's arguments), else the
// pipeline's default (kernels::attention_fp8_default_config). `source`: "tuned" or "default".
Config attention_config(DType in, DType out, const std::vector<int64_t>& shape, bool causal, std::string& source);

// Tolerances against float64 of the unquantized inputs (README, "tilejit run attention").
struct AttentionTolerance {
  double max_rel_rmse = 0;
  double min_cosine = 0;
};
AttentionTolerance attention_tolerance(AttentionPath p);   // e4m3: 6e-2 / 0.998; 16-bit: 1e-2 / 0.9999

// ---- inputs, float64 reference, metrics ----------------------------------------------------

// N(0, 1) samples rounded to `dtype`, generated on every core, the same for the same seed.
HostTensor random_normal(DType dtype, std::vector<int64_t> shape, uint64_t seed);

// Which outputs the float64 check looks at: query `rows` of the flattened (b, h) `heads`.
struct RowSample {
  std::vector<int64_t> heads;
  std::vector<int64_t> rows;
  int64_t count() const { return static_cast<int64_t>(heads.size() * rows.size()); }
};
// Every row of every head when `all`; else up to max_heads heads (first, last, evenly between) and as many
// evenly spaced rows (always the first and the last, which causal makes the longest) as
// `flop_budget` of float64 work allows, at least min(S, 16).
RowSample sample_rows(int64_t BH, int64_t S, int64_t D, double flop_budget, bool all, int64_t max_heads = 4);

// The float64 meaning of an attention variant (kernels/attention_variant.h), written on the host:
// which keys a query sees and what happens to its score. b: batch, h: query head, i: query, j:
// key (positions, top-left aligned); the score is the scaled q·k / sqrt(D) in natural-log units,
// as a variant's score_mod sees it. Empty members: every key / the score as is.
struct ScoreRule {
  std::function<bool(int64_t b, int64_t h, int64_t i, int64_t j)> keep;
  std::function<double(double score, int64_t b, int64_t h, int64_t i, int64_t j)> score;
};
ScoreRule causal_rule();   // j <= i

// float64 softmax(rule(q kᵀ / sqrt(D))) v of the sampled rows, on every core: [heads][rows][D]
// row-major; a row that sees no key is 0 (what the kernels write). q: contiguous host view
// [B, H, S, D]; k, v: [B, Hkv, S, D] with Hkv dividing H (query head h reads kv head h / (H /
// Hkv)). Views, so that one buffer serves every shape of a bench grid.
std::vector<double> attention_f64_rows(const TensorView& q, const TensorView& k, const TensorView& v, const ScoreRule& rule,
                                       const RowSample& s);
// The same for plain attention, causal (top-left aligned) or not; q, k and v all [B, H, S, D].
std::vector<double> attention_f64_rows(const TensorView& q, const TensorView& k, const TensorView& v, bool causal,
                                       const RowSample& s);
// The same rows of an output [B, H, S, D] (a contiguous host view).
std::vector<double> gather_rows(const TensorView& o, const RowSample& s);

struct AttentionAccuracy {
  double rel_rmse = 0;          // ||out - ref|| / ||ref||
  double cosine = 0;            // <out, ref> / (||out|| ||ref||)
  double max_abs_error = 0;
  double max_abs_reference = 0;
  int64_t compared = 0;         // elements compared
  int64_t nan = 0;              // NaN / inf among them
  int64_t unwritten = 0;        // NaN anywhere in the output (poisoned before the run)
  bool passes(const AttentionTolerance& t) const;
  std::string str() const;      // "rel RMSE 5.1e-02, cosine 0.998612, max abs error 3.0e-02, ..."
};
AttentionAccuracy compare_rows(const std::vector<double>& got, const std::vector<double>& ref);
int64_t count_nonfinite(const TensorView& host);
// A whole output (a host view [B, H, S, D]) against the float64 rows of `s`: compare_rows of the
// sampled rows, and `unwritten` counted over every element (the output was poisoned before).
AttentionAccuracy check_output(const TensorView& got, const RowSample& s, const std::vector<double>& ref);

// ---- timing -----------------------------------------------------------------------------

// Writes a buffer larger than the L2 cache (4x, at least 256 MiB) so that the next launch
// starts from cold caches, as a new input would (bench/attention/README.md, method).
class L2Flusher {
 public:
  L2Flusher();
  void flush(CUstream stream);
  size_t bytes() const { return buffer_.size(); }

 private:
  runtime::DeviceBuffer buffer_;
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int reps = 0;
};
// `warmup` untimed calls of fn, then `reps` calls, each between two events on `stream` with the
// L2 flushed before it (outside the events); the median (and spread) of the event times.
Timing time_launches(const std::function<void()>& fn, CUstream stream, int reps, int warmup, L2Flusher& l2);
double tflops(double flops, double ms);

// ---- `tilejit bench attention`: shapes, peers' CSV, the merged table -------------------------

struct BenchShape {
  int64_t B = 0, H = 0, S = 0, D = 0;
  bool causal = false;
  bool operator<(const BenchShape& o) const;
};
// The shapes `o` selects (D outer, S, non-causal then causal); throws tj::Error on bad options.
std::vector<BenchShape> bench_shapes(const BenchAttentionOptions& o);
// "2048x128x0,2048x128x1": the --shapes argument of bench/attention/peers.py.
std::string peers_shape_list(const std::vector<BenchShape>& shapes);

// One measured implementation on one shape (tilejit's or a peer's).
struct BenchResult {
  double ms = 0;
  double tflops = 0;
  double rel_rmse = -1;     // < 0: not measured
  bool ok = true;           // accuracy within its tolerance (tilejit) / the script's check (peers)
  std::string note;         // e.g. the Triton config
};
using BenchRow = std::map<std::string, BenchResult>;   // by implementation name (below)

// ---- bench plumbing shared by `tilejit bench attention` and `tilejit bench variants` ----------

// A kernel the timing loop will launch, to compile ahead.
struct CompileJob {
  const Kernel* kernel;
  std::vector<ArgSpec> specs;
  Config config;
};
// Compiles (NVRTC, or the disk cache) every job on every core, so that no compile lands in a
// measurement and the compiles overlap. A job whose specs guess wrong costs only time: the
// launch compiles what it needs. Failures are one printed note, never an error (the timing loop
// reports them where they happen).
void precompile(const std::vector<CompileJob>& jobs, const std::string& arch);

// A config in a few characters for notes: "m128 n128 s2 attn_block_skip=0".
std::string config_brief(const Config& c);

// One implementation timed: `out` poisoned (NaN), fn run once and `out` copied to *output (when
// given, for the accuracy check), then time_launches; ms = the median, tflops from `flops`, the
// spread in the note.
BenchResult measure(const std::function<void()>& fn, DeviceTensor& out, std::optional<HostTensor>* output, double flops,
                    CUstream stream, int reps, int warmup, L2Flusher& l2);

// A peers' script: `given` (throws tj::Error when it does not exist), else `default_script` (a path
// in the repository) from the current directory, the source tree, or beside the program; "" when
// none is found.
std::string find_peers_script(const std::string& given, const std::string& default_script = "bench/attention/peers.py");
// Runs argv (PATH lookup) with this process's stdout/stderr and PYTHONUNBUFFERED=1; its exit
// status (128 + signal when killed). Throws tj::Error when it cannot start (e.g. no python3).
int run_subprocess(const std::vector<std::string>& argv);
// Runs peers.py with `args` (after the script, before --csv FILE) and hands each line of the CSV
// it wrote to `read`; what went wrong (no script, no python, a non-zero exit) becomes a note.
// `what` names the peers in the progress line.
void run_peers_script(const std::string& python, const std::string& script_option, const std::vector<std::string>& args,
                      const std::string& what, const std::function<void(std::istream&)>& read,
                      std::vector<std::string>& notes, const std::string& default_script = "bench/attention/peers.py");

// --out FILE.md: throws tj::Error now (before any timing) when its directory does not exist.
void check_out_path(const std::string& out);
// A benchmark's markdown: each header line, a blank line, the table, then the notes as a list.
std::string markdown_document(const std::vector<std::string>& header, const std::string& table,
                              const std::vector<std::string>& notes);
// Prints the markdown and writes it to `out` (when not empty).
void emit_markdown(const std::string& md, const std::string& out);

// A peers.py CSV line by column name; the last column (`note`) keeps its commas.
using CsvRecord = std::map<std::string, std::string>;
// Reads a peers.py CSV: the first line names the columns, and each of `required` must be among
// them (else one note and nothing read); '#' lines are notes; each other line goes to `row`. A
// line with too few fields, or one `row` throws on, becomes a note, never an error.
void read_csv(std::istream& in, const std::vector<std::string>& required, std::vector<std::string>& notes,
              const std::function<void(const CsvRecord&)>& row);
// One peer row's result (columns ms, tflops, rrmse (empty: not checked), ok, note); throws on
// unreadable numbers (read_csv turns that into a note).
BenchResult peer_result(const CsvRecord& f);

// Table cells: TFLOP/s ("611.1", " (FAIL)" when its check failed), a ratio of two results'
// TFLOP/s ("1.11"), a relative RMSE ("5.0e-02"); "n/a" for what was not measured.
std::string tflops_cell(const BenchResult* r);
std::string ratio_cell(const BenchResult* a, const BenchResult* b);
std::string rmse_cell(const BenchResult* r);
using BenchTable = std::map<BenchShape, BenchRow>;
// Implementation names. tilejit: "tilejit_fp8" (attention_fp8 on pre-quantized inputs),
// "tilejit_fp8_pipeline" (quantize pre-passes + attention_fp8), "tilejit_bf16"; peers.py:
// "sdpa_flash_bf16", "sdpa_cudnn_bf16", "triton_fp8".

// Reads peers.py's CSV (header S,D,B,H,causal,peer,ms,tflops,rrmse,ok,note; '#' lines are
// notes, collected into `notes`) into `table`. Malformed lines become notes, never errors.
void read_peer_csv(std::istream& in, BenchTable& table, std::vector<std::string>& notes);

// The result of implementation `impl` at shape `s`, or null where it has none (or no time).
const BenchResult* bench_result(const BenchTable& table, const BenchShape& s, const std::string& impl);

// The merged markdown table (with a header line per entry of `header`), as RESULTS.md takes it.
std::string bench_markdown(const std::vector<BenchShape>& shapes, const BenchTable& table,
                           const std::vector<std::string>& header, const std::vector<std::string>& notes);

}  // namespace tj::tools
