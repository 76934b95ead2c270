#pragma once
// `tilejit run attention --dtype e4m3|bf16|f16` and `tilejit bench attention`: the FP8 attention
// pipeline (kernels/attention_fp8.h) and its 16-bit twin, checked against float64 and timed.
//
// Pieces shared by the two commands (tools/attention_run.cpp, tools/bench_attention.cpp) and
// tested on their own (tests/test_cli_attention.cpp): resolving the options into a problem (with
// the errors a user sees), random inputs, the float64 reference on sampled rows, the accuracy
// metrics and their tolerances, and event timing with the L2 flushed between launches.
#include <cuda.h>

#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autotune/config.h"
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

struct AttentionProblem {
  AttentionPath path = AttentionPath::fp8_pipeline;
  DType in = DType::e4m3;        // what the attention kernel reads
  DType source = DType::bf16;    // the random inputs (bf16 for e4m3: the pipeline quantizes them)
  DType out = DType::bf16;
  int64_t B = 1, H = 2, S = 256, D = 64;
  bool causal = false;
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
AttentionProblem resolve_attention(const ProblemOptions& o);

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

// float64 softmax(q kᵀ / sqrt(D)) v of the sampled rows, on every core: [heads][rows][D]
// row-major. q, k, v: contiguous host views [B, H, S, D] (views, so that one buffer serves every
// shape of the bench grid); causal is top-left aligned.
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
using BenchTable = std::map<BenchShape, BenchRow>;
// Implementation names. tilejit: "tilejit_fp8" (attention_fp8 on pre-quantized inputs),
// "tilejit_fp8_pipeline" (quantize pre-passes + attention_fp8), "tilejit_bf16"; peers.py:
// "sdpa_flash_bf16", "sdpa_cudnn_bf16", "triton_fp8".

// Reads peers.py's CSV (header S,D,B,H,causal,peer,ms,tflops,rrmse,ok,note; '#' lines are
// notes, collected into `notes`) into `table`. Malformed lines become notes, never errors.
void read_peer_csv(std::istream& in, BenchTable& table, std::vector<std::string>& notes);

// The merged markdown table (with a header line per entry of `header`), as RESULTS.md takes it.
std::string bench_markdown(const std::vector<BenchShape>& shapes, const BenchTable& table,
                           const std::vector<std::string>& header, const std::vector<std::string>& notes);

}  // namespace tj::tools
