#pragma once
// `tilejit bench variants` (tools/bench_variants.cpp), issue #7's variants benchmark: each
// attention variant of kernels/attention_variants.h (and grouped-query attention) in bf16 and
// fp8, causal and sliding window also with block skipping off, against PyTorch's compiled
// flex_attention and SDPA with an explicit mask (bench/attention/peers.py --variants), in one
// markdown table with the targets under it.
//
// The pieces below are what the command is made of and what tests/test_cli_variants.cpp checks
// on its own: the variants and their float64 meaning, the options' errors, the visible-entry
// count behind the TFLOP/s, the peers' CSV and the table.
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention_variant.h"
#include "kernels/dilated_attention.h"
#include "tools/attention.h"
#include "tools/commands.h"

namespace tj::tools {

// The parameters (peers.py gets them on its command line, so both sides agree).
constexpr int64_t kVariantWindow = 1024;        // sliding_window: causal, i - j < 1024
constexpr int64_t kVariantSegment = 2048;       // segment: block-diagonal, segments of 2048
constexpr double kVariantSoftcap = 30.0;        // softcap: 30·tanh(score / 30), causal (as Gemma 2 runs it)
constexpr int64_t kVariantGqaGroup = 4;         // gqa: Hkv = H / 4, causal
constexpr int64_t kVariantPrefixDivisor = 4;    // prefix_lm: a prefix of S / 4 in every batch entry
// documents: causal document masking over packed sequences (varlen), 4 documents of unequal
// lengths S·eighths/8 + shift = S/8 + 37, 3S/8 − 90, S/4 + 70, S/4 − 17 (the shifts sum to 0, so
// they sum to S; the boundaries S/8 + 37, S/2 − 53, 3S/4 + 17 are odd: on no block edge).
constexpr int64_t kVariantDocuments = 4;
constexpr int64_t kVariantDocEighths[kVariantDocuments] = {1, 3, 2, 2};
constexpr int64_t kVariantDocShifts[kVariantDocuments] = {37, -90, 70, -17};
// The documents' cu_seqlens [kVariantDocuments + 1] at sequence length S: 0, the boundaries, S
// (lengths S·eighths/8 + shift rounded down, the last one what is left of S). Throws tj::Error if a
// document would be empty (S below 243).
std::vector<int64_t> variant_cu_seqlens(int64_t S);
// block_mask: a precomputed BigBird-like block mask (block_mask_variant, causal) of 128 x 128
// cells, one for every batch entry and head: query block bi keeps key blocks bi - 1 and bi
// (local), 0 (global) and those with (131·bi + 71·bj) mod 7 = 0 (random); j <= i inside.
constexpr int64_t kVariantBlockCell = 128;
bool variant_block_kept(int64_t bi, int64_t bj);
// dilated: LongNet's pairs (segment w, rate r) = (2048, 1), (4096, 2), (8192, 4) mixed, not
// causal (kernels/dilated_attention.h; dilated-attention-pytorch's example).
const std::vector<kernels::DilatedPair>& variant_dilated_pairs();
// How many of `pairs` let query i of head h see key j (same segment of w, i and j both at
// offset h mod r): the dilated mix is softmax over the keys weighted by this count.
int64_t dilated_multiplicity(const std::vector<kernels::DilatedPair>& pairs, int64_t h, int64_t i, int64_t j);
constexpr int64_t kVariantHeadDim = 128;        // the default D (H = 2048 / D = 16)
const std::vector<int64_t>& variant_seqs();     // the default S: 2048, 8192 (--quick: 8192)

// causal, sliding_window, alibi, softcap, prefix_lm, gqa, segment, documents, block_mask, dilated:
// the order of the table.
const std::vector<std::string>& variant_names();

// One variant at one shape: the kernel tilejit runs, what it means, what it is compared with.
struct VariantCase {
  std::string name;                // variant_names(): --variant, peers.py --variants, the CSV
  std::string label;               // the table's, e.g. "sliding window 1024"
  int64_t B = 0, H = 0, Hkv = 0, S = 0, D = 0;
  // A variant of kernels/attention_variants.h (its hooks do the masking; attention_fp8's causal
  // argument stays false), or none: attention_fp8 itself with causal = causal_flag (gqa: the
  // standard kernel with fewer kv heads).
  std::optional<kernels::AttentionVariant> variant;
  bool causal_flag = false;
  int64_t prefix = 0;              // prefix_lm: every batch entry's prefix, the kernel's input prefix_len [B]
  // documents: the kernel's input cu_seqlens [documents + 1] (i32 on the device). The kernel reads
  // one cu_seqlens for all batch entries: every batch entry is the same packing of documents.
  std::vector<int64_t> cu_seqlens;
  bool block_mask = false;         // block_mask: the kernel's input block_mask [1, 1, nQ, nK] (i32)
  // dilated: kernels::dilated_attention_forward with these pairs instead of one variant kernel
  // (bf16 and the FP8 pipeline, its quantizers included); rule: the mix's meaning.
  std::vector<kernels::DilatedPair> dilated;
  bool skip_speedup = false;       // also timed with attn_block_skip = 0 (causal, sliding window)
  bool sdpa_peer = false;          // SDPA can run it (a boolean mask or is_causal)
  ScoreRule rule;                  // the float64 meaning: the accuracy check and the visible count
  int64_t visible = 0;             // visible score entries (visible_entries), 0 until counted
};

// The case of `name` at sequence length S and head dim D: B = 16384 / S, H = 2048 / D (the
// issue's grid). Throws tj::Error for an unknown name.
VariantCase variant_case(const std::string& name, int64_t S, int64_t D);

// The cases `o` selects, variant-major and S ascending (the table's order); throws tj::Error
// with a message naming the option for bad options (tests/test_cli_variants.cpp checks each).
std::vector<VariantCase> variant_plan(const BenchVariantsOptions& o);

// Entries of the B·H score matrices [S, S] that the mask keeps, counted from c.rule on the host
// (every batch entry; the masks here do not depend on the head); FlexAttention's benchmarks count
// FLOPs the same way. dilated: the sum over the pairs of each pair's entries (LongNet's count:
// each pair is its own attention), in closed form.
int64_t visible_entries(const VariantCase& c);
// 4·D FLOPs per visible entry (q·k and p·v).
double variant_flops(const VariantCase& c);

// peers.py's arguments for the cases (after the script; --reps, --warmup, --seed and --csv
// are added by the caller): --variants, --seqs, --head-dim and the variants' parameters.
std::vector<std::string> peers_variant_args(const std::vector<VariantCase>& cases);

// Results by (variant, S, D). Implementation names: "tilejit_bf16", "tilejit_fp8",
// "tilejit_bf16_noskip", "tilejit_fp8_noskip" (attn_block_skip = 0); peers.py: "flex_bf16",
// "sdpa_mask_bf16".
struct VariantKey {
  std::string variant;
  int64_t S = 0, D = 0;
  bool operator<(const VariantKey& o) const;
};
VariantKey key_of(const VariantCase& c);
using VariantTable = std::map<VariantKey, BenchRow>;

// Reads peers.py --variants' CSV (header variant,S,D,B,H,Hkv,peer,ms,tflops,rrmse,ok,note) into
// `table`, for the rows of `cases` only; a row whose B, H or Hkv differ from the case's, and
// malformed lines, become notes.
void read_variant_peer_csv(std::istream& in, const std::vector<VariantCase>& cases, VariantTable& table,
                           std::vector<std::string>& notes);

// The targets, one line each, from the table: tilejit bf16 ≥ 1.3× flex bf16 per row,
// fp8 ≥ 1.3× bf16 per row, block skipping ≥ 1.8× at S = 8192 (causal, sliding window).
std::vector<std::string> variant_targets(const std::vector<VariantCase>& cases, const VariantTable& table);

// The markdown table (header lines first, then the targets and the notes), as RESULTS.md takes it.
std::string variants_markdown(const std::vector<VariantCase>& cases, const VariantTable& table,
                              const std::vector<std::string>& header, const std::vector<std::string>& notes);

}  // namespace tj::tools
