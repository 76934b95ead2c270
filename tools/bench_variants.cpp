// `tilejit bench variants` (tools/variants.h): issue #7's attention variants in bf16 and fp8 (and
// causal / sliding window with block skipping off), timed in this process like `tilejit bench
// attention` times plain attention (tools/attention.h: compile ahead, poison + check against
// float64 on sampled rows, then the median of CUDA-event-timed launches with the L2 flushed),
// then PyTorch's compiled flex_attention and masked SDPA through bench/attention/peers.py
// --variants; one markdown table with the targets.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <istream>
#include <numeric>
#include <set>
#include <tuple>

#include "kernels/attention_fp8.h"
#include "kernels/attention_variants.h"
#include "kernels/dilated_attention.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/nvrtc.h"
#include "tools/variants.h"

namespace tj::tools {

// ---- the variants ---------------------------------------------------------------------------

const std::vector<int64_t>& variant_seqs() {
  static const std::vector<int64_t> v = {2048, 8192};
  return v;
}

const std::vector<std::string>& variant_names() {
  static const std::vector<std::string> v = {"causal", "sliding_window", "alibi", "softcap", "prefix_lm",
                                              "gqa",    "segment",        "documents", "block_mask", "dilated"};
  return v;
}

bool variant_block_kept(int64_t bi, int64_t bj) { return bj == bi || bj + 1 == bi || bj == 0 || (131 * bi + 71 * bj) % 7 == 0; }

const std::vector<kernels::DilatedPair>& variant_dilated_pairs() {
  static const std::vector<kernels::DilatedPair> v = {{2048, 1}, {4096, 2}, {8192, 4}};
  return v;
}

int64_t dilated_multiplicity(const std::vector<kernels::DilatedPair>& pairs, int64_t h, int64_t i, int64_t j) {
  int64_t m = 0;
  for (const auto& [w, r] : pairs) m += i / w == j / w && i % r == h % r && j % r == h % r;
  return m;
}

std::vector<int64_t> variant_cu_seqlens(int64_t S) {
  std::vector<int64_t> cu = {0};
  for (int64_t d = 0; d < kVariantDocuments; ++d) {
    const int64_t length = d + 1 < kVariantDocuments ? S * kVariantDocEighths[d] / 8 + kVariantDocShifts[d] : S - cu.back();
    if (length < 1)
      throw Error(fmt::format("documents: document {} of {} would have length {} at S = {} (lengths S·eighths/8 + shift, "
                              "eighths {}, shifts {})",
                              d, kVariantDocuments, length, S, fmt::join(kVariantDocEighths, ","),
                              fmt::join(kVariantDocShifts, ",")));
    cu.push_back(cu.back() + length);
  }
  return cu;
}

namespace {

bool causal_keep(int64_t, int64_t, int64_t i, int64_t j) { return j <= i; }

std::string names_list() { return fmt::format("{}", fmt::join(variant_names(), ", ")); }

}  // namespace

VariantCase variant_case(const std::string& name, int64_t S, int64_t D) {
  VariantCase c;
  c.name = name;
  c.S = S;
  c.D = D;
  c.B = std::max<int64_t>(1, kGridTokens / S);
  c.H = std::max<int64_t>(1, kGridWidth / D);
  c.Hkv = c.H;
  if (name == "causal") {
    c.label = "causal";
    c.variant = kernels::causal_variant();
    c.rule.keep = causal_keep;
    c.skip_speedup = c.sdpa_peer = true;
  } else if (name == "sliding_window") {
    c.label = fmt::format("sliding window {}", kVariantWindow);
    c.variant = kernels::sliding_window_variant(kVariantWindow);
    c.rule.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i && i - j < kVariantWindow; };
    c.skip_speedup = c.sdpa_peer = true;
  } else if (name == "alibi") {
    c.label = "ALiBi (causal)";
    c.variant = kernels::alibi_variant(c.H, /*causal=*/true);
    const double heads = static_cast<double>(c.H);
    c.rule.keep = causal_keep;
    c.rule.score = [heads](double s, int64_t, int64_t h, int64_t i, int64_t j) {
      return s + std::exp2(-8.0 * static_cast<double>(h + 1) / heads) * static_cast<double>(j - i);
    };
  } else if (name == "softcap") {
    c.label = fmt::format("softcap {:g} (causal)", kVariantSoftcap);
    c.variant = kernels::softcap_variant(kVariantSoftcap, /*causal=*/true);
    c.rule.keep = causal_keep;
    c.rule.score = [](double s, int64_t, int64_t, int64_t, int64_t) { return kVariantSoftcap * std::tanh(s / kVariantSoftcap); };
  } else if (name == "prefix_lm") {
    c.label = "prefix-LM (S/4)";
    c.variant = kernels::prefix_lm_variant();
    c.prefix = S / kVariantPrefixDivisor;
    const int64_t prefix = c.prefix;
    c.rule.keep = [prefix](int64_t, int64_t, int64_t i, int64_t j) { return j <= i || j < prefix; };
    c.sdpa_peer = true;
  } else if (name == "gqa") {
    c.label = fmt::format("GQA causal (Hkv = H/{})", kVariantGqaGroup);
    c.Hkv = std::max<int64_t>(1, c.H / kVariantGqaGroup);
    c.causal_flag = true;   // attention_fp8's own causal mask: no variant needed for fewer kv heads
    c.rule.keep = causal_keep;
    c.sdpa_peer = true;
  } else if (name == "segment") {
    c.label = fmt::format("segment {}", kVariantSegment);
    c.variant = kernels::segment_variant(kVariantSegment);
    c.rule.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return i / kVariantSegment == j / kVariantSegment; };
    c.sdpa_peer = true;
  } else if (name == "documents") {
    c.label = fmt::format("documents ×{} (causal)", kVariantDocuments);
    c.variant = kernels::document_variant(kVariantDocuments, /*causal=*/true);
    c.cu_seqlens = variant_cu_seqlens(S);
    // The kernel's meaning: i and j on the same side of every inner boundary cu_seqlens[1 .. n-1].
    const std::vector<int64_t> bounds(c.cu_seqlens.begin() + 1, c.cu_seqlens.end() - 1);
    c.rule.keep = [bounds](int64_t, int64_t, int64_t i, int64_t j) {
      if (j > i) return false;
      for (int64_t x : bounds)
        if ((i < x) != (j < x)) return false;
      return true;
    };
    c.sdpa_peer = true;
  } else if (name == "block_mask") {
    c.label = fmt::format("block mask {0}×{0} (causal)", kVariantBlockCell);
    c.variant = kernels::block_mask_variant(kVariantBlockCell, kVariantBlockCell, /*causal=*/true);
    c.block_mask = true;
    c.rule.keep = [](int64_t, int64_t, int64_t i, int64_t j) {
      return j <= i && variant_block_kept(i / kVariantBlockCell, j / kVariantBlockCell);
    };
    c.sdpa_peer = true;
  } else if (name == "dilated") {
    c.dilated = variant_dilated_pairs();
    std::vector<std::string> pairs;
    for (const auto& [w, r] : c.dilated) pairs.push_back(fmt::format("{}/{}", w, r));
    c.label = fmt::format("dilated {}", fmt::join(pairs, ", "));
    // The LSE-weighted mix of the pairs = softmax over the keys, each counted once per pair that has it.
    const auto dilated = c.dilated;
    c.rule.keep = [dilated](int64_t, int64_t h, int64_t i, int64_t j) { return dilated_multiplicity(dilated, h, i, j) > 0; };
    c.rule.score = [dilated](double s, int64_t, int64_t h, int64_t i, int64_t j) {
      return s + std::log(static_cast<double>(dilated_multiplicity(dilated, h, i, j)));
    };
    c.sdpa_peer = true;
  } else {
    throw Error(fmt::format("--variant {}: no such variant (variants: {})", name, names_list()));
  }
  return c;
}

std::vector<VariantCase> variant_plan(const BenchVariantsOptions& o) {
  auto in = [](const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  if (o.seq != 0 && !in(grid_seqs(), o.seq))
    throw Error(fmt::format("--seq {} is not in the benchmark's grid ({}; B = 16384 / S)", o.seq,
                            fmt::join(grid_seqs(), ", ")));
  if (o.head_dim != 0 && !in(grid_head_dims(), o.head_dim))
    throw Error(fmt::format("--head-dim {} is not in the benchmark's grid ({}): the tensor-core lowering takes those",
                            o.head_dim, fmt::join(grid_head_dims(), ", ")));
  if (o.reps < 1) throw Error(fmt::format("--reps must be at least 1, got {}", o.reps));
  if (o.warmup < 0) throw Error(fmt::format("--warmup must be 0 or more, got {}", o.warmup));
  for (const auto& [flag, json] : {std::pair{"--config-bf16", &o.config_bf16}, std::pair{"--config-fp8", &o.config_fp8}}) {
    if (json->empty()) continue;
    try {
      Config::from_json(*json);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", flag, e.what()));
    }
  }
  std::vector<std::string> names;
  for (const auto& n : o.variants) {
    if (n.empty()) throw Error(fmt::format("--variant: an empty name (variants: {})", names_list()));
    if (std::find(variant_names().begin(), variant_names().end(), n) == variant_names().end())
      throw Error(fmt::format("--variant {}: no such variant (variants: {})", n, names_list()));
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  // The table's order, whatever the order on the command line.
  std::vector<std::string> chosen;
  for (const auto& n : variant_names())
    if (names.empty() || std::find(names.begin(), names.end(), n) != names.end()) chosen.push_back(n);
  std::vector<int64_t> seqs = o.quick ? std::vector<int64_t>{8192} : variant_seqs();
  if (o.seq) seqs = {o.seq};
  const int64_t D = o.head_dim ? o.head_dim : kVariantHeadDim;
  std::vector<VariantCase> out;
  for (const auto& n : chosen)
    for (int64_t S : seqs) out.push_back(variant_case(n, S, D));
  return out;
}

BenchVariantsOptions variants_options(const BenchAttentionOptions& common, const std::string& variant, bool reps_given) {
  if (common.causal || common.non_causal || common.both)
    throw Error("--causal, --non-causal and --both choose the mask of `tilejit bench attention`; each variant has its own "
                "(choose variants with --variant)");
  BenchVariantsOptions o;
  o.seq = common.seq;
  o.head_dim = common.head_dim;
  o.reps = common.quick && !reps_given ? 10 : common.reps;
  o.warmup = common.warmup;
  o.peers = common.peers;
  o.quick = common.quick;
  o.out = common.out;
  o.python = common.python;
  o.peers_script = common.peers_script;
  o.seed = common.seed;
  if (!variant.empty()) {
    size_t start = 0;
    while (true) {
      const size_t comma = variant.find(',', start);
      o.variants.push_back(variant.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return o;
}

// ---- counting, peers, table -------------------------------------------------------------

namespace {

// Each pair's entries, summed: head class h mod r sees, in every segment of w, the n positions at
// that offset, n × n entries.
int64_t dilated_entries(const VariantCase& c) {
  int64_t total = 0;
  for (const auto& [w, r] : c.dilated)
    for (int64_t offset = 0; offset < r; ++offset)
      for (int64_t start = 0; start < c.S; start += w) {
        const int64_t end = std::min(start + w, c.S);
        const int64_t first = start + (offset - start % r + r) % r;   // the first position >= start at this offset
        const int64_t n = first < end ? (end - 1 - first) / r + 1 : 0;
        total += n * n * (c.H / r);
      }
  return total * c.B;
}

}  // namespace

int64_t visible_entries(const VariantCase& c) {
  if (!c.dilated.empty()) return dilated_entries(c);
  if (!c.rule.keep) return c.B * c.H * c.S * c.S;
  std::vector<int64_t> per_row(static_cast<size_t>(c.B * c.S), 0);
  parallel_for(c.B * c.S, [&](int64_t r) {
    const int64_t b = r / c.S, i = r % c.S;
    int64_t n = 0;
    for (int64_t j = 0; j < c.S; ++j) n += c.rule.keep(b, 0, i, j);
    per_row[r] = n;
  });
  int64_t total = 0;
  for (int64_t n : per_row) total += n;
  return total * c.H;
}

double variant_flops(const VariantCase& c) {
  const int64_t visible = c.visible ? c.visible : visible_entries(c);
  return 4.0 * static_cast<double>(c.D) * static_cast<double>(visible);
}

namespace {

std::string dilated_pairs_arg() {
  std::vector<std::string> pairs;
  for (const auto& [w, r] : variant_dilated_pairs()) pairs.push_back(fmt::format("{}:{}", w, r));
  return fmt::format("{}", fmt::join(pairs, ","));
}

}  // namespace

std::vector<std::string> peers_variant_args(const std::vector<VariantCase>& cases) {
  std::vector<std::string> names, seqs;
  for (const auto& c : cases) {
    if (std::find(names.begin(), names.end(), c.name) == names.end()) names.push_back(c.name);
    const std::string s = std::to_string(c.S);
    if (std::find(seqs.begin(), seqs.end(), s) == seqs.end()) seqs.push_back(s);
  }
  const int64_t D = cases.empty() ? kVariantHeadDim : cases.front().D;
  return {"--variants",   fmt::format("{}", fmt::join(names, ",")),
          "--seqs",       fmt::format("{}", fmt::join(seqs, ",")),
          "--head-dim",   std::to_string(D),
          "--window",     std::to_string(kVariantWindow),
          "--segment",    std::to_string(kVariantSegment),
          "--softcap",    fmt::format("{:g}", kVariantSoftcap),
          "--gqa-group",  std::to_string(kVariantGqaGroup),
          "--prefix-div", std::to_string(kVariantPrefixDivisor),
          "--doc-eighths", fmt::format("{}", fmt::join(kVariantDocEighths, ",")),
          "--doc-shifts", fmt::format("{}", fmt::join(kVariantDocShifts, ",")),
          "--block-cell", std::to_string(kVariantBlockCell),
          "--dilated",    dilated_pairs_arg()};
}

bool VariantKey::operator<(const VariantKey& o) const { return std::tie(variant, S, D) < std::tie(o.variant, o.S, o.D); }

VariantKey key_of(const VariantCase& c) { return VariantKey{c.name, c.S, c.D}; }

void read_variant_peer_csv(std::istream& in, const std::vector<VariantCase>& cases, VariantTable& table,
                           std::vector<std::string>& notes) {
  const std::vector<std::string> columns = {"variant", "S", "D", "B", "H", "Hkv", "peer", "ms", "tflops", "rrmse", "ok", "note"};
  read_csv(in, columns, notes, [&](const CsvRecord& f) {
    const VariantKey key{f.at("variant"), std::stoll(f.at("S")), std::stoll(f.at("D"))};
    const int64_t B = std::stoll(f.at("B")), H = std::stoll(f.at("H")), Hkv = std::stoll(f.at("Hkv"));
    auto c = std::find_if(cases.begin(), cases.end(), [&](const VariantCase& x) { return !(key_of(x) < key) && !(key < key_of(x)); });
    if (c == cases.end()) return;   // not asked for (peers.py run by hand with more)
    if (c->B != B || c->H != H || c->Hkv != Hkv) {
      notes.push_back(fmt::format("peers.py ran {} S={} with B={} H={} Hkv={}, tilejit with B={} H={} Hkv={}: its {} row is left out",
                                  key.variant, key.S, B, H, Hkv, c->B, c->H, c->Hkv, f.at("peer")));
      return;
    }
    table[key][f.at("peer")] = peer_result(f);
  });
}

namespace {

const BenchResult* find_result(const VariantTable& table, const VariantCase& c, const char* impl) {
  auto it = table.find(key_of(c));
  if (it == table.end()) return nullptr;
  auto jt = it->second.find(impl);
  return jt == it->second.end() || jt->second.ms <= 0 ? nullptr : &jt->second;
}

// Speedup of `fast` over `slow` (same work: a ratio of times), or nothing.
std::optional<double> speedup(const BenchResult* fast, const BenchResult* slow) {
  if (!fast || !slow) return std::nullopt;
  return slow->ms / fast->ms;
}

std::string speedup_cell(const BenchResult* fast, const BenchResult* slow) {
  auto s = speedup(fast, slow);
  return s ? fmt::format("{:.2f}", *s) : "n/a";
}

// "512.3 (1.234)": TFLOP/s and the median ms; "—" where the column does not apply.
std::string time_cell(const BenchResult* r, bool applies) {
  if (!applies) return "—";
  if (!r) return "n/a";
  return fmt::format("{:.1f} ({:.3f}){}", r->tflops, r->ms, r->ok ? "" : " FAIL");
}

// One target over the rows it applies to: "met in 9 of 14 (below: alibi S=8192 1.12×, ...)".
struct TargetTally {
  int met = 0, measured = 0, missing = 0;
  std::vector<std::string> below;
  void add(const VariantCase& c, const std::string& what, std::optional<double> ratio, double target) {
    if (!ratio) {
      ++missing;
      return;
    }
    ++measured;
    if (*ratio >= target) ++met;
    else below.push_back(fmt::format("{} S={}{} {:.2f}×", c.name, c.S, what, *ratio));
  }
  std::string str() const {
    std::string s = fmt::format("met in {} of {}", met, measured);
    if (!below.empty()) s += fmt::format(" (below: {})", fmt::join(below, ", "));
    if (missing) s += fmt::format("; {} not measured", missing);
    return s;
  }
};

}  // namespace

std::vector<std::string> variant_targets(const std::vector<VariantCase>& cases, const VariantTable& table) {
  TargetTally flex, fp8, skip;
  for (const auto& c : cases) {
    const BenchResult *bf = find_result(table, c, "tilejit_bf16"), *f8 = find_result(table, c, "tilejit_fp8"),
                      *fl = find_result(table, c, "flex_bf16");
    flex.add(c, "", speedup(bf, fl), 1.3);
    fp8.add(c, "", speedup(f8, bf), 1.3);
    if (c.skip_speedup && c.S == 8192) {
      skip.add(c, " bf16", speedup(bf, find_result(table, c, "tilejit_bf16_noskip")), 1.8);
      skip.add(c, " fp8", speedup(f8, find_result(table, c, "tilejit_fp8_noskip")), 1.8);
    }
  }
  std::vector<std::string> out = {
      "tilejit bf16 ≥ 1.3× flex_attention bf16: " + flex.str(),
      "tilejit fp8 ≥ 1.3× tilejit bf16: " + fp8.str(),
  };
  if (skip.measured + skip.missing > 0)
    out.push_back(fmt::format("block skipping ≥ 1.8× over attn_block_skip = 0 at S = 8192, window {} (causal, sliding window): {}",
                              kVariantWindow, skip.str()));
  else out.push_back("block skipping ≥ 1.8× at S = 8192: not in this run (needs causal or sliding_window at --seq 8192)");
  return out;
}

std::string variants_markdown(const std::vector<VariantCase>& cases, const VariantTable& table,
                              const std::vector<std::string>& header, const std::vector<std::string>& notes) {
  std::string md;
  md += "| variant | S | B×H (Hkv) | visible | tilejit bf16 | tilejit fp8 | no-skip bf16 | no-skip fp8 | flex bf16 | SDPA mask "
        "bf16 | bf16 / flex | fp8 / bf16 | skip speedup bf16 | skip speedup fp8 | rRMSE bf16 | rRMSE fp8 |\n";
  md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& c : cases) {
    const BenchResult *bf = find_result(table, c, "tilejit_bf16"), *f8 = find_result(table, c, "tilejit_fp8"),
                      *bfn = find_result(table, c, "tilejit_bf16_noskip"), *f8n = find_result(table, c, "tilejit_fp8_noskip"),
                      *fl = find_result(table, c, "flex_bf16"), *sd = find_result(table, c, "sdpa_mask_bf16");
    const std::string visible =
        c.visible > 0 ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(c.visible) / static_cast<double>(c.B * c.H * c.S * c.S))
                      : "n/a";
    const std::string heads = c.Hkv == c.H ? fmt::format("{}×{}", c.B, c.H) : fmt::format("{}×{} ({})", c.B, c.H, c.Hkv);
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", c.label, c.S, heads,
                      visible, time_cell(bf, true), time_cell(f8, true), time_cell(bfn, c.skip_speedup),
                      time_cell(f8n, c.skip_speedup), time_cell(fl, true), time_cell(sd, c.sdpa_peer), speedup_cell(bf, fl),
                      speedup_cell(f8, bf), c.skip_speedup ? speedup_cell(bf, bfn) : "—",
                      c.skip_speedup ? speedup_cell(f8, f8n) : "—", rmse_cell(bf), rmse_cell(f8));
  }
  md += "\nTargets (issue #7):\n";
  for (const auto& t : variant_targets(cases, table)) md += "- " + t + "\n";
  return markdown_document(header, md, notes);
}

// ---- running tilejit's rows -------------------------------------------------------------

namespace {

// float64 work per case for the accuracy check (2 heads, evenly spaced rows; at least 16 rows).
constexpr double kAccuracyFlopBudget = 1e9;

// Flat buffers that every case views with its own shape (B·H·S·D is the same across the grid).
struct Buffers {
  HostTensor q, k, v;                           // bf16 N(0, 1)
  DeviceTensor dq, dk, dv, o;                   // bf16
  DeviceTensor q8, k8, vt8, qd, kd, vd;         // e4m3 copies, V transposed, descales per (b, h) of each
  DeviceTensor no_lse;                          // the LSE dummy (with_lse false)
};

// One case's views of the buffers and the argument lists of its launches.
struct CaseLaunch {
  const VariantCase* c = nullptr;
  const Kernel* kernel = nullptr;
  std::optional<DeviceTensor> prefix;           // prefix_lm's prefix_len [B] (i64)
  std::optional<DeviceTensor> cu_seqlens;       // documents' cu_seqlens [documents + 1] (i32), one for all b
  std::optional<DeviceTensor> block_mask;       // block_mask's cells [1, 1, nQ, nK] (i32), one for all b and h
  TensorView q, k, v, o;                        // bf16 [B, H|Hkv, S, D]
  TensorView q8, k8, vt8, qd, kd, vd;
  Config cfg16, cfg8;

  std::vector<TensorView> extra_inputs() const {
    std::vector<TensorView> in;
    if (prefix) in.push_back(prefix->view());
    if (cu_seqlens) in.push_back(cu_seqlens->view());
    if (block_mask) in.push_back(block_mask->view());
    return in;
  }
  // A launch's arguments: attention_fp8's, then the variant's inputs. The bf16 path passes f32
  // [B, Hkv] unit descales (any such tensor compiles the same kernel ahead).
  std::vector<Arg> args(const TensorView& q_, const TensorView& k_, const TensorView& v_, const TensorView& qd_,
                        const TensorView& kd_, const TensorView& vd_, const TensorView& lse) const {
    std::vector<Arg> a = {q_, k_, v_, qd_, kd_, vd_, o, lse, scale_log2(c->D), 1.0, c->causal_flag, false};
    for (const auto& t : extra_inputs()) a.push_back(t);
    return a;
  }
};

Config without_skipping(Config c) {
  c.knobs["attn_block_skip"] = 0;
  return c;
}

CaseLaunch prepare(const VariantCase& c, const Kernel* kernel, Buffers& buf, const BenchVariantsOptions& o) {
  CaseLaunch l;
  l.c = &c;
  l.kernel = kernel;
  const int64_t S_pad = (c.S + 15) / 16 * 16;
  l.q = reshaped(buf.dq.view(), {c.B, c.H, c.S, c.D});
  l.k = reshaped(buf.dk.view(), {c.B, c.Hkv, c.S, c.D});
  l.v = reshaped(buf.dv.view(), {c.B, c.Hkv, c.S, c.D});
  l.o = reshaped(buf.o.view(), {c.B, c.H, c.S, c.D});
  l.q8 = reshaped(buf.q8.view(), {c.B, c.H, c.S, c.D});
  l.k8 = reshaped(buf.k8.view(), {c.B, c.Hkv, c.S, c.D});
  l.vt8 = reshaped(buf.vt8.view(), {c.B, c.Hkv, c.D, S_pad});
  l.qd = reshaped(buf.qd.view(), {c.B, c.H});
  l.kd = reshaped(buf.kd.view(), {c.B, c.Hkv});
  l.vd = reshaped(buf.vd.view(), {c.B, c.Hkv});
  if (c.prefix > 0) {
    HostTensor p(DType::i64, {c.B});
    for (int64_t b = 0; b < c.B; ++b) p.set(b, static_cast<double>(c.prefix));
    l.prefix.emplace(DeviceTensor::from_host(p));
  }
  if (!c.cu_seqlens.empty()) {
    HostTensor cu(DType::i32, {static_cast<int64_t>(c.cu_seqlens.size())});
    for (size_t i = 0; i < c.cu_seqlens.size(); ++i) cu.set(static_cast<int64_t>(i), static_cast<double>(c.cu_seqlens[i]));
    l.cu_seqlens.emplace(DeviceTensor::from_host(cu));
  }
  if (c.block_mask) {
    const int64_t n = (c.S + kVariantBlockCell - 1) / kVariantBlockCell;
    HostTensor cells(DType::i32, {1, 1, n, n});
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) cells.set(i * n + j, variant_block_kept(i, j) ? 1.0 : 0.0);
    l.block_mask.emplace(DeviceTensor::from_host(cells));
  }
  const bool masked = c.causal_flag || c.variant.has_value();
  const std::string variant_name = c.variant ? kernel->name() : std::string();
  // --config-bf16 / --config-fp8: their entries over the default.
  l.cfg16 = kernels::attention_variant_default_config(variant_name, DType::bf16, c.D, masked, 0, c.S);
  if (!o.config_bf16.empty()) l.cfg16 = Config::from_json(o.config_bf16, l.cfg16);
  l.cfg8 = kernels::attention_variant_default_config(variant_name, DType::e4m3, c.D, masked, 0, c.S);
  if (!o.config_fp8.empty()) l.cfg8 = Config::from_json(o.config_fp8, l.cfg8);
  return l;
}

// e4m3 copies of the case's bf16 inputs (amax per (b, h): Q's per query head, K's and V's per kv
// head, as attention_fp8 reads them), V transposed; on `stream`.
void quantize(const CaseLaunch& l, CUstream stream) {
  LaunchOptions qo;
  qo.stream = stream;
  qo.config = kernels::attention_fp8_quantize_config(/*rotate=*/false);
  launch(kernels::quantize_fp8(), {l.q, l.q8, l.qd}, qo);
  launch(kernels::quantize_fp8(), {l.k, l.k8, l.kd}, qo);
  launch(kernels::quantize_transpose_fp8(), {l.v, l.vt8, l.vd}, qo);
}

// Everything the timing loop will launch, compiled ahead.
std::vector<CompileJob> compile_jobs(const std::vector<CaseLaunch>& launches, Buffers& buf) {
  std::vector<CompileJob> jobs;
  const Config qcfg = kernels::attention_fp8_quantize_config(false);
  auto add = [&](const Kernel& k, const std::vector<Arg>& args, const Config& cfg) {
    jobs.push_back({&k, specs_for(k, args, false), cfg});
  };
  std::set<std::pair<const Kernel*, std::vector<int64_t>>> quantizers;   // one job per (quantizer, input shape)
  auto add_quantizer = [&](const Kernel& k, const std::vector<Arg>& args) {
    if (quantizers.insert({&k, std::get<TensorView>(args[0]).shape}).second) add(k, args, qcfg);
  };
  for (const auto& l : launches) {
    if (!l.c->dilated.empty()) continue;   // dilated_attention_forward compiles its kernels at its first (warm-up) call
    const TensorView lse = buf.no_lse.view();
    const auto a16 = l.args(l.q, l.k, l.v, l.qd, l.kd, l.vd, lse);
    const auto a8 = l.args(l.q8, l.k8, l.vt8, l.qd, l.kd, l.vd, lse);
    add(*l.kernel, a16, l.cfg16);
    add(*l.kernel, a8, l.cfg8);
    if (l.c->skip_speedup) {
      add(*l.kernel, a16, without_skipping(l.cfg16));
      add(*l.kernel, a8, without_skipping(l.cfg8));
    }
    add_quantizer(kernels::quantize_fp8(), {l.q, l.q8, l.qd});
    add_quantizer(kernels::quantize_fp8(), {l.k, l.k8, l.kd});
    add_quantizer(kernels::quantize_transpose_fp8(), {l.v, l.vt8, l.vd});
  }
  return jobs;
}

using TimedFn = std::function<void(const std::string& impl, const std::function<void()>& launch)>;

// A variant kernel: bf16 through the pipeline's 16-bit path, as a user calls it; fp8 the kernel
// alone on inputs quantized beforehand (outside the timing); without block skipping where asked.
void time_variant_kernel(const CaseLaunch& l, Buffers& buf, CUstream stream, const TimedFn& timed) {
  const VariantCase& c = *l.c;
  kernels::AttentionFp8Workspace ws;
  kernels::AttentionFp8Options opt;
  opt.causal = c.causal_flag;
  opt.quantize = false;
  opt.kernel = c.variant ? l.kernel : nullptr;
  opt.inputs = l.extra_inputs();
  opt.stream = stream;
  opt.attention_config = l.cfg16;
  timed("tilejit_bf16", [&] { kernels::attention_fp8_forward(l.q, l.k, l.v, l.o, opt, ws); });
  if (c.skip_speedup) {
    opt.attention_config = without_skipping(l.cfg16);
    timed("tilejit_bf16_noskip", [&] { kernels::attention_fp8_forward(l.q, l.k, l.v, l.o, opt, ws); });
  }
  quantize(l, stream);
  runtime::synchronize();
  const std::vector<Arg> a8 = l.args(l.q8, l.k8, l.vt8, l.qd, l.kd, l.vd, buf.no_lse.view());
  LaunchOptions lo;
  lo.stream = stream;
  lo.config = l.cfg8;
  timed("tilejit_fp8", [&] { launch(*l.kernel, a8, lo); });
  if (c.skip_speedup) {
    LaunchOptions ln = lo;
    ln.config = without_skipping(l.cfg8);
    timed("tilejit_fp8_noskip", [&] { launch(*l.kernel, a8, ln); });
  }
}

// dilated: kernels::dilated_attention_forward in bf16 (one attention per (pair, offset) on strided
// views, then the mix); fp8 like the other rows: the attentions and the mix on inputs quantized
// beforehand (dilated_quantize, outside the timing).
// --config-bf16 / --config-fp8 replace the attentions' per-pair defaults.
void time_dilated(const CaseLaunch& l, CUstream stream, const TimedFn& timed, const BenchVariantsOptions& o) {
  kernels::DilatedWorkspace ws;
  kernels::DilatedOptions opt;
  opt.pairs = l.c->dilated;
  opt.stream = stream;
  if (!o.config_bf16.empty()) opt.attention_config = l.cfg16;
  timed("tilejit_bf16", [&] { kernels::dilated_attention_forward(l.q, l.k, l.v, l.o, opt, ws); });
  opt.attention_config.reset();
  if (!o.config_fp8.empty()) opt.attention_config = l.cfg8;
  opt.fp8 = true;
  kernels::DilatedFp8Inputs in;
  kernels::dilated_quantize(l.q, l.k, l.v, opt.pairs, in, stream);
  runtime::synchronize();
  timed("tilejit_fp8", [&] { kernels::dilated_attention_fp8(in, l.o, opt, ws); });
}

// Times one case's tilejit implementations and checks their outputs against float64; fills `row`.
bool bench_case(const CaseLaunch& l, Buffers& buf, CUstream stream, L2Flusher& l2, const BenchVariantsOptions& o, BenchRow& row) {
  const VariantCase& c = *l.c;
  const double flops = variant_flops(c);
  const RowSample sample = sample_rows(c.B * c.H, c.S, c.D, kAccuracyFlopBudget, false, 2);
  auto reference = std::async(std::launch::async, [&] {
    return attention_f64_rows(reshaped(buf.q.view(), {c.B, c.H, c.S, c.D}), reshaped(buf.k.view(), {c.B, c.Hkv, c.S, c.D}),
                              reshaped(buf.v.view(), {c.B, c.Hkv, c.S, c.D}), c.rule, sample);
  });
  std::map<std::string, std::optional<HostTensor>> outputs;
  auto timed = [&](const std::string& impl, const std::function<void()>& fn) {
    row[impl] = measure(fn, buf.o, &outputs[impl], flops, stream, o.reps, o.warmup, l2);
  };

  if (c.dilated.empty()) time_variant_kernel(l, buf, stream, timed);
  else time_dilated(l, stream, timed, o);

  const std::vector<double> ref = reference.get();
  bool ok = true;
  std::string line;
  for (auto& [impl, got] : outputs) {
    const bool fp8 = impl.find("fp8") != std::string::npos;
    const AttentionAccuracy a = check_output(reshaped(got->view(), {c.B, c.H, c.S, c.D}), sample, ref);
    BenchResult& r = row[impl];
    r.rel_rmse = a.rel_rmse;
    r.ok = a.passes(attention_tolerance(fp8 ? AttentionPath::fp8_pipeline : AttentionPath::tensor_core_16bit));
    ok = ok && r.ok;
    line += fmt::format("\n    {:<20} {:8.4f} ms {:7.1f} TFLOP/s  {} {}", impl, r.ms, r.tflops, a.str(), r.ok ? "PASS" : "FAIL");
  }
  auto ratio = [&](const char* fast, const char* slow) {
    return row.count(fast) && row.count(slow) && row[fast].ms > 0 ? fmt::format("{:.2f}×", row[slow].ms / row[fast].ms) : "n/a";
  };
  fmt::print("{}\n    fp8 / bf16 {}{}\n", line, ratio("tilejit_fp8", "tilejit_bf16"),
             c.skip_speedup ? fmt::format(", block skipping bf16 {} fp8 {}", ratio("tilejit_bf16", "tilejit_bf16_noskip"),
                                          ratio("tilejit_fp8", "tilejit_fp8_noskip"))
                            : "");
  return ok;
}

// The documents variant in words, with the cu_seqlens of the S that `cases` run it at.
std::string documents_text(const std::vector<VariantCase>& cases) {
  std::vector<std::string> lengths, at;
  for (int64_t d = 0; d < kVariantDocuments; ++d) {
    const int64_t e = kVariantDocEighths[d], g = std::gcd<int64_t>(e, 8);
    const std::string frac = e == 8 ? "S" : fmt::format("{}S/{}", e / g == 1 ? "" : std::to_string(e / g), 8 / g);
    const int64_t shift = kVariantDocShifts[d];
    lengths.push_back(shift == 0 ? frac : fmt::format("{} {} {}", frac, shift < 0 ? "−" : "+", std::abs(shift)));
  }
  for (const auto& c : cases)
    if (!c.cu_seqlens.empty()) at.push_back(fmt::format("S = {}: {}", c.S, fmt::join(c.cu_seqlens, ", ")));
  return fmt::format("document_variant({}, causal), {} documents of lengths {} in every batch entry, a query seeing the keys "
                     "of its own document up to its own position; the kernel reads one cu_seqlens [{}] (i32) for all batch "
                     "entries{}",
                     kVariantDocuments, kVariantDocuments, fmt::join(lengths, ", "), kVariantDocuments + 1,
                     at.empty() ? "" : fmt::format(" ({})", fmt::join(at, "; ")));
}

// "bf16 m128 n128 s2 (all); fp8 m192 n96 s4 (causal, alibi, ...), fp8 m64 n128 s2 (sliding_window, ...)".
std::string configs_text(const std::vector<CaseLaunch>& launches) {
  auto group = [&](const char* what, Config CaseLaunch::*cfg) {
    std::vector<std::pair<std::string, std::vector<std::string>>> by;   // config -> variants, first-seen order
    for (const auto& l : launches) {
      if (!l.c->dilated.empty()) continue;   // dilated_attention_forward picks its own
      const std::string brief = config_brief(l.*cfg);
      auto it = std::find_if(by.begin(), by.end(), [&](const auto& e) { return e.first == brief; });
      if (it == by.end()) by.push_back({brief, {}}), it = by.end() - 1;
      if (std::find(it->second.begin(), it->second.end(), l.c->name) == it->second.end()) it->second.push_back(l.c->name);
    }
    std::vector<std::string> parts;
    for (const auto& [brief, names] : by)
      parts.push_back(by.size() == 1 ? fmt::format("{} {}", what, brief) : fmt::format("{} {} ({})", what, brief, fmt::join(names, ", ")));
    return fmt::format("{}", fmt::join(parts, ", "));
  };
  return group("bf16", &CaseLaunch::cfg16) + "; " + group("fp8", &CaseLaunch::cfg8);
}

}  // namespace

int bench_variants(const BenchVariantsOptions& o) {
  std::vector<VariantCase> cases = variant_plan(o);
  check_out_path(o.out);
  if (!o.peers_script.empty()) find_peers_script(o.peers_script);   // a wrong path fails now, not after the timing
  if (!runtime::driver().available())
    throw Error(fmt::format("tilejit bench variants times kernels on a CUDA GPU; none here ({})",
                            runtime::driver().unavailable_reason()));
  const auto& dev = runtime::current_device();
  if (!dev.supports_fp8())
    throw Error(fmt::format("tilejit bench variants needs FP8 (compute capability 8.9 or newer); {} is {}.{}", dev.name,
                            dev.cc_major, dev.cc_minor));

  const int64_t D = cases.front().D, H = cases.front().H;
  std::vector<std::string> header = {
      fmt::format("Attention variants (issue #7), forward: B·S = {}, H = {}, D = {} (GQA: Hkv = H/{}); {} ({}, {} SMs, driver {}, "
                  "NVRTC {})",
                  kGridTokens, H, D, kVariantGqaGroup, dev.name, dev.arch(), dev.sm_count, dev.driver_version,
                  runtime::nvrtc_version()),
      "TFLOP/s = 4·D·(visible score entries) / time, the visible entries (column 'visible': their share of the B·H S×S "
      "score matrices) counted exactly from each variant's mask on the host, as FlexAttention's benchmarks count; each "
      "cell is TFLOP/s (median ms); ratios are ratios of times.",
      fmt::format("Variants: causal; sliding window {} (causal); ALiBi (causal, slope 2^(-8(h+1)/H)); softcap {:g} (causal, "
                  "as Gemma 2 runs it; tilejit: tanh.approx.f32, the variant's fast_math, as FlashAttention-3 computes softcap; flex: torch.tanh); prefix-LM (bidirectional over a prefix of S/{} in every batch entry, causal after); GQA "
                  "(attention_fp8's built-in causal mask, Hkv = H/{}); segment {} (block-diagonal; at S ≤ {} one segment, i.e. "
                  "full attention); documents (document masking of packed sequences, varlen: {}); block mask (block_mask_variant "
                  "with a precomputed BigBird-like mask of {}×{} cells, causal: query block i keeps key blocks i − 1, i, 0 and "
                  "those with (131·i + 71·j) mod 7 = 0); dilated (LongNet, dilated_attention_forward: pairs (segment, rate) "
                  "{}, not causal, mixed by their logsumexps; plain attention where a view's rows are whole segments (the "
                  "segments as heads), else the segment variant; fp8: the attentions and the mix on inputs quantized beforehand by "
                  "dilated_quantize (Q, K once, V once per pair); 'visible' counts each pair's entries). All but GQA and dilated are "
                  "kernels/attention_variants.h's hooks, inlined by the sm_90a lowering, which skips the key blocks the mask "
                  "rules out.",
                  kVariantWindow, kVariantSoftcap, kVariantPrefixDivisor, kVariantGqaGroup, kVariantSegment, kVariantSegment,
                  documents_text(cases), kVariantBlockCell, kVariantBlockCell, dilated_pairs_arg()),
  };
  std::vector<std::string> notes;
  VariantTable table;
  bool all_ok = true;
  fmt::print("{}\n{} cases; {} timed launches each (median), {} warm-ups\n", header[0], cases.size(), o.reps, o.warmup);
  if (!dev.supports_wgmma())
    notes.push_back(fmt::format("{} has no wgmma: the kernels ran on the generic tensor-core lowering's mma.sync path where their dots fit, else SIMT (the hand-tuned Hopper kernels need sm_90a)", dev.name));
  {
    auto t0 = std::chrono::steady_clock::now();
    int64_t n = 0, heads = 0;
    for (auto& c : cases) {
      n = std::max(n, c.B * c.H * c.S * c.D);
      heads = std::max(heads, c.B * c.H);
      c.visible = visible_entries(c);
    }
    const int64_t S_pad_extra = 16 * heads * D;   // V transposed pads S to a multiple of 16
    Buffers buf{random_normal(DType::bf16, {n}, o.seed),        random_normal(DType::bf16, {n}, o.seed + 1),
                random_normal(DType::bf16, {n}, o.seed + 2),    DeviceTensor(DType::bf16, {1}),
                DeviceTensor(DType::bf16, {1}),                 DeviceTensor(DType::bf16, {1}),
                DeviceTensor(DType::bf16, {n}),                 DeviceTensor(DType::e4m3, {n}),
                DeviceTensor(DType::e4m3, {n}),                 DeviceTensor(DType::e4m3, {n + S_pad_extra}),
                DeviceTensor(DType::f32, {heads}),              DeviceTensor(DType::f32, {heads}),
                DeviceTensor(DType::f32, {heads}),              DeviceTensor(DType::f32, {1})};
    buf.dq = DeviceTensor::from_host(buf.q);
    buf.dk = DeviceTensor::from_host(buf.k);
    buf.dv = DeviceTensor::from_host(buf.v);
    buf.vt8.fill_bytes(0);   // the pad past S (none on the grid) must be finite

    // The kernels: one per case (a variant's depends on its parameters, e.g. ALiBi on H).
    std::vector<std::optional<Kernel>> kernels_(cases.size());
    std::vector<CaseLaunch> launches;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].variant) kernels_[i].emplace(kernels::attention_variant(*cases[i].variant));
      launches.push_back(prepare(cases[i], kernels_[i] ? &*kernels_[i] : &kernels::attention_fp8(), buf, o));
    }
    const std::vector<CompileJob> jobs = compile_jobs(launches, buf);
    const uint64_t compiles_before = nvrtc_compile_count();
    precompile(jobs, dev.arch());
    fmt::print("inputs and {} kernels ready in {:.1f} s ({} NVRTC compiles, the rest from the disk cache)\n", jobs.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               nvrtc_compile_count() - compiles_before);

    // The legacy default stream, as `bench attention` uses: DeviceTensor's poisoning is a
    // synchronous memset there.
    const CUstream stream = nullptr;
    L2Flusher l2;
    header.push_back(fmt::format(
        "tilejit: median of {} CUDA-event-timed launches after {} warm-ups, L2 flushed ({} MiB memset) before each, random "
        "N(0,1) bf16 inputs. bf16 = kernels::attention_fp8_forward(quantize = false) with the variant kernel; fp8 = the "
        "variant kernel alone on e4m3 inputs quantized beforehand (amax per (b, h): Q per query head, K and V per kv "
        "head, V transposed); no-skip = the same with config knob attn_block_skip = 0 (every key block visited, the mask applied to each). Configs{}: {}.",
        o.reps, o.warmup, l2.bytes() >> 20,
        o.config_bf16.empty() && o.config_fp8.empty() ? " (attention_variant_default_config: attention_fp8_default_config with the variant's key_block, 128 for a score_mod (fp8: up to 4096 keys); fp8: its fp8_key_block where it has one; knob fast_math where the variant asks for it: softcap; fp8 without an LSE: attn_exp2_fma exp2s of every 8 in f16x2 pairs where the defaults move them off the MUFU)" : "",
        configs_text(launches)));
    header.push_back(
        "Peers (bench/attention/peers.py --variants), bf16, timed the same way: flex = torch.compile(flex_attention) with the "
        "same score_mod / mask_mod and a BlockMask from create_block_mask (built once, outside the timing, so flex skips "
        "blocks too; documents: a mask_mod on a document-id tensor; block mask: a mask_mod on the cell tensor; dilated: one "
        "call, mask_mod 'some pair has the key', score_mod + log(pairs that have it), which is the mix); SDPA mask = "
        "scaled_dot_product_attention with a boolean attn_mask (sliding window, prefix-LM, segment, documents, block mask; "
        "dilated: an additive bf16 mask [1, H, S, S] of log(pairs) or −inf) "
        "or is_causal=True (causal; GQA with enable_gqa), backend chosen by PyTorch. — = does not apply.");
    header.push_back(
        "rRMSE: tilejit's output vs float64 attention with the variant's meaning of the bf16 inputs, sampled rows of 2 heads; "
        "FAIL above 1e-2 (bf16) or 6e-2 / cosine below 0.998 (fp8). Peers are checked vs float32 on 2 heads (FAIL above 1e-2).");
    for (size_t i = 0; i < launches.size(); ++i) {
      const VariantCase& c = cases[i];
      fmt::print("[{}/{}] {} S={} B×H={}×{} Hkv={} visible {:.1f}%", i + 1, cases.size(), c.label, c.S, c.B, c.H, c.Hkv,
                 100.0 * static_cast<double>(c.visible) / static_cast<double>(c.B * c.H * c.S * c.S));
      std::fflush(stdout);
      try {
        all_ok = bench_case(launches[i], buf, stream, l2, o, table[key_of(c)]) && all_ok;
      } catch (const std::exception& e) {
        all_ok = false;
        notes.push_back(fmt::format("tilejit {} S={}: {}", c.name, c.S, e.what()));
        fmt::print("\n  error: {}\n", e.what());
      }
    }
  }   // device memory freed before the peers start

  if (o.peers) {
    std::vector<std::string> args = peers_variant_args(cases);
    args.insert(args.end(), {"--reps", std::to_string(o.reps), "--warmup", std::to_string(o.warmup), "--seed", std::to_string(o.seed)});
    run_peers_script(o.python, o.peers_script, args, "PyTorch flex_attention compiled, SDPA with a mask",
                     [&](std::istream& in) { read_variant_peer_csv(in, cases, table, notes); }, notes);
  } else {
    notes.push_back("peers: not run (--no-peers)");
  }
  // One FLOP count for every column: the peers' TFLOP/s restated from their times.
  for (const auto& c : cases) {
    const double flops = variant_flops(c);
    for (auto& [impl, r] : table[key_of(c)])
      if (r.ms > 0) r.tflops = tflops(flops, r.ms);
  }
  emit_markdown(variants_markdown(cases, table, header, notes), o.out);
  return all_ok ? 0 : 1;
}

}  // namespace tj::tools
