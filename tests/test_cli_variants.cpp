// `tilejit bench variants` (tools/variants.h): the variants and shapes it runs, the errors a user
// sees for bad options (each message checked), the visible-entry count behind its TFLOP/s, the
// float64 meaning it checks against, the peers' CSV and the merged table with the issue's
// targets. The program's wiring (subprocess) is checked in test_cli_attention.cpp with the other
// `bench` commands.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>

#include "gpu.h"
#include "core/error.h"
#include "tools/variants.h"

using namespace tj;
using namespace tj::tools;

namespace {

std::string plan_error(const BenchVariantsOptions& o) {
  try {
    variant_plan(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const VariantCase& find_case(const std::vector<VariantCase>& cases, const std::string& name, int64_t S) {
  for (const auto& c : cases)
    if (c.name == name && c.S == S) return c;
  throw Error("no case " + name);
}

}  // namespace

TEST_CASE("cli bench variants: the plan (variants, shapes, peers) and its option errors") {
  std::vector<VariantCase> all = variant_plan(BenchVariantsOptions{});
  REQUIRE(all.size() == 20);
  CHECK(all[0].name == "causal");
  CHECK(all[0].S == 2048);
  CHECK(all[1].S == 8192);
  CHECK(all[2].name == "sliding_window");
  CHECK(all[12].name == "segment");
  CHECK(all[14].name == "documents");
  CHECK(all[16].name == "block_mask");
  CHECK(all.back().name == "dilated");
  for (const auto& c : all) {
    INFO(c.name << " S=" << c.S);
    CHECK(c.B * c.S == 16384);
    CHECK(c.H == 16);
    CHECK(c.D == 128);
    CHECK(c.Hkv == (c.name == "gqa" ? 4 : 16));
    CHECK(c.skip_speedup == (c.name == "causal" || c.name == "sliding_window"));
    CHECK(c.sdpa_peer == (c.name != "alibi" && c.name != "softcap"));
    // GQA is the standard kernel (its causal flag), dilated dilated_attention_forward; every other
    // case is a variant with hooks.
    CHECK(c.variant.has_value() == (c.name != "gqa" && c.name != "dilated"));
    CHECK(c.dilated.empty() == (c.name != "dilated"));
    CHECK(c.block_mask == (c.name == "block_mask"));
    CHECK(c.causal_flag == (c.name == "gqa"));
    CHECK(static_cast<bool>(c.rule.keep));
    CHECK(c.cu_seqlens.empty() == (c.name != "documents"));
  }
  CHECK(find_case(all, "prefix_lm", 8192).prefix == 2048);
  CHECK(find_case(all, "prefix_lm", 2048).prefix == 512);
  CHECK(find_case(all, "sliding_window", 2048).variant->name == "attention_sliding_1024");
  CHECK(find_case(all, "alibi", 8192).variant->name == "attention_alibi_16_causal");
  CHECK(find_case(all, "softcap", 8192).variant->name == "attention_softcap_30_causal");
  CHECK(find_case(all, "segment", 8192).variant->name == "attention_segment_2048");
  // documents: 4 packed documents of unequal lengths S/8 + 37, 3S/8 − 90, S/4 + 70, S/4 − 17, one
  // cu_seqlens for every batch entry, boundaries on no block edge.
  const VariantCase& docs = find_case(all, "documents", 8192);
  CHECK(docs.variant->name == "attention_documents_4_causal");
  CHECK(docs.variant->inputs == std::vector<std::string>{"cu_seqlens"});
  CHECK(docs.label == "documents ×4 (causal)");
  CHECK(docs.cu_seqlens == std::vector<int64_t>{0, 1061, 4043, 6161, 8192});
  CHECK(find_case(all, "documents", 2048).cu_seqlens == std::vector<int64_t>{0, 293, 971, 1553, 2048});
  CHECK(docs.prefix == 0);
  for (int64_t S : grid_seqs()) {
    INFO("S=" << S);
    const std::vector<int64_t> cu = variant_cu_seqlens(S);
    REQUIRE(cu.size() == 5);
    CHECK(cu.front() == 0);
    CHECK(cu.back() == S);
    for (size_t d = 1; d < cu.size(); ++d) CHECK(cu[d] > cu[d - 1]);
    for (size_t d = 1; d + 1 < cu.size(); ++d) CHECK(cu[d] % 16 != 0);   // no boundary on a block edge
    CHECK(cu[1] - cu[0] != cu[2] - cu[1]);
  }
  CHECK_THROWS_WITH_AS(variant_cu_seqlens(128), doctest::Contains("documents: document 1 of 4 would have length -42 at S = 128"),
                       Error);
  CHECK(find_case(all, "alibi", 8192).rule.score);
  CHECK_FALSE(find_case(all, "causal", 8192).rule.score);

  BenchVariantsOptions o;
  o.quick = true;
  std::vector<VariantCase> quick = variant_plan(o);
  REQUIRE(quick.size() == 10);
  for (const auto& c : quick) CHECK(c.S == 8192);
  o = BenchVariantsOptions{};
  o.variants = {"gqa", "causal", "gqa"};   // the table's order, once each
  o.seq = 4096;
  o.head_dim = 64;
  std::vector<VariantCase> two = variant_plan(o);
  REQUIRE(two.size() == 2);
  CHECK(two[0].name == "causal");
  CHECK(two[1].name == "gqa");
  CHECK(two[1].H == 32);
  CHECK(two[1].Hkv == 8);
  CHECK(two[1].B == 4);

  o = BenchVariantsOptions{};
  o.variants = {"causal", "flash"};
  CHECK(plan_error(o) ==
        "--variant flash: no such variant (variants: causal, sliding_window, alibi, softcap, prefix_lm, gqa, segment, "
        "documents, block_mask, dilated)");
  o.variants = {"causal", ""};
  CHECK(plan_error(o) ==
        "--variant: an empty name (variants: causal, sliding_window, alibi, softcap, prefix_lm, gqa, segment, documents, "
        "block_mask, dilated)");
  o = BenchVariantsOptions{};
  o.seq = 3000;
  CHECK(plan_error(o) == "--seq 3000 is not in the benchmark's grid (1024, 2048, 4096, 8192, 16384; B = 16384 / S)");
  o = BenchVariantsOptions{};
  o.head_dim = 96;
  CHECK(plan_error(o) == "--head-dim 96 is not in the benchmark's grid (64, 128, 256): the tensor-core lowering takes those");
  o = BenchVariantsOptions{};
  o.reps = 0;
  CHECK(plan_error(o) == "--reps must be at least 1, got 0");
  o = BenchVariantsOptions{};
  o.warmup = -1;
  CHECK(plan_error(o) == "--warmup must be 0 or more, got -1");
  o = BenchVariantsOptions{};
  o.config_fp8 = R"({"blocks":{"m":128,"n":128},"num_stages":2})";
  CHECK(variant_plan(o).size() == 20);
  o.config_bf16 = "{\"blocks\":";
  CHECK(plan_error(o).rfind("--config-bf16: ", 0) == 0);
  CHECK_THROWS_WITH_AS(variant_case("longnet", 2048, 128), doctest::Contains("--variant longnet: no such variant"), Error);
  CHECK(find_case(all, "block_mask", 8192).variant->name == "attention_block_mask_128x128_causal");
  CHECK(find_case(all, "block_mask", 8192).variant->inputs == std::vector<std::string>{"block_mask"});
  CHECK(find_case(all, "dilated", 8192).label == "dilated 2048/1, 4096/2, 8192/4");
}

TEST_CASE("cli bench variants: options shared with `bench attention` (mask flags, --variant lists, --quick reps)") {
  BenchAttentionOptions common;
  BenchVariantsOptions o = variants_options(common, "", false);
  CHECK(o.variants.empty());
  CHECK(o.reps == 20);
  o = variants_options(common, "causal,sliding_window", false);
  CHECK(o.variants == std::vector<std::string>{"causal", "sliding_window"});
  o = variants_options(common, "causal,", false);
  CHECK(o.variants == std::vector<std::string>{"causal", ""});   // the plan names the empty one
  common.quick = true;
  CHECK(variants_options(common, "", false).reps == 10);   // --quick: fewer reps unless --reps was given
  common.reps = 30;
  CHECK(variants_options(common, "", true).reps == 30);
  common.seq = 8192;
  common.head_dim = 256;
  common.peers = false;
  common.out = "x.md";
  o = variants_options(common, "gqa", true);
  CHECK(o.seq == 8192);
  CHECK(o.head_dim == 256);
  CHECK_FALSE(o.peers);
  CHECK(o.quick);
  CHECK(o.out == "x.md");
  for (int flag = 0; flag < 3; ++flag) {
    BenchAttentionOptions m;
    (flag == 0 ? m.causal : flag == 1 ? m.non_causal : m.both) = true;
    CHECK_THROWS_WITH_AS(variants_options(m, "", false),
                         "--causal, --non-causal and --both choose the mask of `tilejit bench attention`; each variant has its "
                         "own (choose variants with --variant)",
                         Error);
  }
}

TEST_CASE("cli bench variants: visible score entries, counted from each mask, and the FLOPs") {
  const int64_t S = 2048, B = 8, H = 16, D = 128;
  auto visible = [&](const std::string& name) { return visible_entries(variant_case(name, S, D)); };
  const int64_t causal = S * (S + 1) / 2;
  CHECK(visible("causal") == B * H * causal);
  CHECK(visible("alibi") == B * H * causal);
  CHECK(visible("softcap") == B * H * causal);
  CHECK(visible("gqa") == B * H * causal);   // H query heads: the work is per query head
  CHECK(visible("sliding_window") == B * H * (1024 * 1025 / 2 + (S - 1024) * 1024));
  CHECK(visible("prefix_lm") == B * H * (512 * 512 + (causal - 512 * 513 / 2)));
  CHECK(visible("segment") == B * H * S * S);   // one segment of 2048: full attention
  // documents: causal inside each of the 4 documents (lengths 293, 678, 582, 495 at S = 2048),
  // the same packing in every batch entry.
  int64_t docs = 0;
  for (int64_t L : {293, 678, 582, 495}) docs += L * (L + 1) / 2;
  CHECK(visible("documents") == B * H * docs);
  CHECK(visible_entries(variant_case("documents", 8192, 128)) ==
        2 * 16 * (1061 * 1062 / 2 + 2982 * 2983 / 2 + 2118 * 2119 / 2 + 2031 * 2032 / 2));
  // ... and at S = 1024 the rule's count, entry by entry, against the closed form of its cu_seqlens.
  const VariantCase d1024 = variant_case("documents", 1024, 128);
  int64_t counted = 0;
  for (int64_t i = 0; i < 1024; ++i)
    for (int64_t j = 0; j < 1024; ++j) counted += d1024.rule.keep(0, 0, i, j);
  int64_t closed = 0;
  for (size_t d = 1; d < d1024.cu_seqlens.size(); ++d) {
    const int64_t L = d1024.cu_seqlens[d] - d1024.cu_seqlens[d - 1];
    closed += L * (L + 1) / 2;
  }
  CHECK(counted == closed);
  CHECK(visible_entries(d1024) == d1024.B * d1024.H * closed);

  // The count follows the rule, whatever it is: block-diagonal segments of 2048 at S = 8192 seen
  // through a smaller example with the same shape of mask.
  VariantCase c = variant_case("segment", 2048, 128);
  c.B = 2;
  c.H = 3;
  c.S = 10;
  c.rule.keep = [](int64_t b, int64_t, int64_t i, int64_t j) { return i / 4 == j / 4 && b == 1; };
  CHECK(visible_entries(c) == 3 * (16 + 16 + 4));   // only batch entry 1; segments of 4, 4 and 2
  c.visible = visible_entries(c);
  CHECK(variant_flops(c) == doctest::Approx(4.0 * 128 * 3 * 36));
  c.rule.keep = nullptr;   // no mask: the whole matrix
  CHECK(visible_entries(c) == 2 * 3 * 100);

  // block_mask: the causal entries of the kept cells (local, global, random), counted entry by entry.
  const VariantCase bm = variant_case("block_mask", 2048, 128);
  int64_t kept = 0;
  for (int64_t i = 0; i < 2048; ++i)
    for (int64_t j = 0; j <= i; ++j) kept += variant_block_kept(i / 128, j / 128);
  CHECK(visible_entries(bm) == B * H * kept);
  CHECK(variant_block_kept(5, 5));    // local
  CHECK(variant_block_kept(5, 4));
  CHECK(variant_block_kept(5, 0));    // global
  CHECK(variant_block_kept(5, 3));    // random: 131·5 + 71·3 = 868 = 7·124
  CHECK_FALSE(variant_block_kept(5, 2));
  CHECK_FALSE(variant_block_kept(6, 3));
}

TEST_CASE("cli bench variants: dilated attention's count and meaning (LongNet pairs)") {
  // Each pair's entries summed, in closed form, against a count pair by pair and entry by entry
  // on a small case with a short last segment.
  VariantCase c = variant_case("dilated", 2048, 128);
  c.B = 2;
  c.H = 4;
  c.S = 37;
  c.dilated = {{8, 1}, {12, 2}, {16, 4}};
  int64_t brute = 0;
  for (const auto& [w, r] : c.dilated)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.S; ++i)
        for (int64_t j = 0; j < c.S; ++j) brute += i / w == j / w && i % r == h % r && j % r == h % r;
  CHECK(visible_entries(c) == c.B * brute);
  // The mix's meaning: keys weighted by how many pairs have them.
  const auto& pairs = variant_dilated_pairs();
  CHECK(dilated_multiplicity(pairs, 0, 0, 4) == 3);        // all three pairs: offset 0, same segments
  CHECK(dilated_multiplicity(pairs, 1, 1, 2047) == 2);     // (2048, 1) and (4096, 2)
  CHECK(dilated_multiplicity(pairs, 1, 1, 2051) == 1);     // (4096, 2) only
  CHECK(dilated_multiplicity(pairs, 1, 2, 2) == 1);        // row 2 of head 1: only the rate-1 pair
  CHECK(dilated_multiplicity(pairs, 0, 0, 2048) == 2);     // (4096, 2) and (8192, 4)
  const VariantCase d = variant_case("dilated", 8192, 128);
  CHECK(d.rule.keep(0, 3, 3, 7));
  CHECK_FALSE(d.rule.keep(0, 3, 3, 2048 + 6));
  CHECK(d.rule.score(1.0, 0, 0, 0, 4) == doctest::Approx(1.0 + std::log(3.0)));
  // At S = 8192: pair (2048, 1): 4 segments of 2048² per head; (4096, 2): 2 segments of 2048²
  // per head; (8192, 4): one of 2048² per head.
  CHECK(visible_entries(d) == 2 * 16 * (4 + 2 + 1) * 2048LL * 2048);
}

TEST_CASE("cli bench variants: the float64 meaning (masks, score mods, GQA heads, rows with no key)") {
  const VariantCase sliding = variant_case("sliding_window", 8192, 128);
  CHECK(sliding.rule.keep(0, 0, 1500, 477));
  CHECK_FALSE(sliding.rule.keep(0, 0, 1500, 476));   // i - j = 1024
  CHECK_FALSE(sliding.rule.keep(0, 0, 1500, 1501));
  const VariantCase prefix = variant_case("prefix_lm", 8192, 128);
  CHECK(prefix.rule.keep(1, 0, 5, 2047));   // inside the prefix: bidirectional
  CHECK_FALSE(prefix.rule.keep(1, 0, 5, 2048));
  CHECK(prefix.rule.keep(1, 0, 4000, 3999));
  const VariantCase segment = variant_case("segment", 8192, 128);
  CHECK(segment.rule.keep(0, 0, 2048, 4095));
  CHECK_FALSE(segment.rule.keep(0, 0, 2048, 2047));
  const VariantCase documents = variant_case("documents", 8192, 128);   // cu_seqlens 0, 1061, 4043, 6161, 8192
  CHECK(documents.rule.keep(1, 7, 1060, 0));             // the first document, causal
  CHECK_FALSE(documents.rule.keep(1, 7, 1060, 1061));    // a later key
  CHECK_FALSE(documents.rule.keep(0, 0, 1061, 1060));    // the previous document
  CHECK(documents.rule.keep(0, 0, 1061, 1061));
  CHECK(documents.rule.keep(0, 0, 4042, 1061));
  CHECK_FALSE(documents.rule.keep(0, 0, 4043, 4042));
  CHECK(documents.rule.keep(0, 0, 8191, 6161));          // the last document
  CHECK_FALSE(documents.rule.keep(0, 0, 8191, 6160));
  CHECK_FALSE(documents.rule.score);
  const VariantCase alibi = variant_case("alibi", 8192, 128);
  CHECK(alibi.rule.score(1.0, 0, 0, 10, 7) == doctest::Approx(1.0 - 3.0 * std::exp2(-0.5)));
  CHECK(alibi.rule.score(1.0, 0, 15, 10, 7) == doctest::Approx(1.0 - 3.0 * std::exp2(-8.0)));
  const VariantCase softcap = variant_case("softcap", 8192, 128);
  CHECK(softcap.rule.score(60.0, 0, 0, 0, 0) == doctest::Approx(30.0 * std::tanh(2.0)));

  // The rule-based reference: causal as the plain one computes it; GQA reads kv head h / (H / Hkv).
  HostTensor q = random_normal(DType::bf16, {2, 4, 24, 64}, 11), k = random_normal(DType::bf16, {2, 2, 24, 64}, 12),
             v = random_normal(DType::bf16, {2, 2, 24, 64}, 13);
  // k and v with each kv head repeated for its 2 query heads: plain attention on those is GQA.
  HostTensor k4(DType::bf16, {2, 4, 24, 64}), v4(DType::bf16, {2, 4, 24, 64});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t x = 0; x < 24 * 64; ++x) {
        k4.set((b * 4 + h) * 24 * 64 + x, k.at((b * 2 + h / 2) * 24 * 64 + x));
        v4.set((b * 4 + h) * 24 * 64 + x, v.at((b * 2 + h / 2) * 24 * 64 + x));
      }
  const RowSample all = sample_rows(8, 24, 64, 0, true);
  const std::vector<double> gqa = attention_f64_rows(q.view(), k.view(), v.view(), causal_rule(), all);
  const std::vector<double> plain = attention_f64_rows(q.view(), k4.view(), v4.view(), true, all);
  REQUIRE(gqa.size() == plain.size());
  for (size_t i = 0; i < gqa.size(); ++i) CHECK(gqa[i] == plain[i]);
  // A score mod changes the result; a row that sees no key is 0, as the kernels write it.
  ScoreRule shifted{nullptr, [](double s, int64_t, int64_t, int64_t i, int64_t j) { return s + 0.5 * double(j - i); }};
  const std::vector<double> mod = attention_f64_rows(q.view(), k4.view(), v4.view(), shifted, all);
  CHECK(compare_rows(mod, attention_f64_rows(q.view(), k4.view(), v4.view(), false, all)).rel_rmse > 1e-2);
  ScoreRule none{[](int64_t, int64_t, int64_t i, int64_t) { return i >= 3; }, nullptr};
  RowSample first;
  first.heads = {5};
  first.rows = {0, 3};
  const std::vector<double> empty = attention_f64_rows(q.view(), k4.view(), v4.view(), none, first);
  for (int64_t d = 0; d < 64; ++d) CHECK(empty[d] == 0.0);
  CHECK(empty[64] != 0.0);
  CHECK_THROWS_WITH_AS(attention_f64_rows(q.view(), reshaped(k.view(), {2, 2, 24, 64}), reshaped(v.view(), {1, 4, 24, 64}),
                                          causal_rule(), all),
                       doctest::Contains("must be q [B, H, S, D] and k, v [B, Hkv, S, D]"), Error);
}

TEST_CASE("cli bench variants: peers.py's arguments, its CSV and the merged table with the targets") {
  BenchVariantsOptions o;
  o.variants = {"causal", "alibi", "gqa"};
  std::vector<VariantCase> cases = variant_plan(o);
  CHECK(peers_variant_args(cases) ==
        std::vector<std::string>{"--variants", "causal,alibi,gqa", "--seqs", "2048,8192", "--head-dim", "128", "--window", "1024",
                                 "--segment", "2048", "--softcap", "30", "--gqa-group", "4", "--prefix-div", "4",
                                 "--doc-eighths", "1,3,2,2", "--doc-shifts", "37,-90,70,-17", "--block-cell", "128",
                                 "--dilated", "2048:1,4096:2,8192:4"});

  std::istringstream csv(
      "variant,S,D,B,H,Hkv,peer,ms,tflops,rrmse,ok,note\n"
      "# peers: torch 2.11.0, NVIDIA H100\n"
      "causal,8192,128,2,16,16,flex_bf16,2.000000,300.000,3.0000e-03,1,first call (compile) 12.0 s, blocks skipped 49.2%\n"
      "causal,8192,128,2,16,16,sdpa_mask_bf16,1.500000,400.000,2.0000e-03,1,is_causal=True\n"
      "gqa,8192,128,2,16,16,flex_bf16,1.000000,1.000,,1,\n"         // Hkv differs from tilejit's 4
      "segment,8192,128,2,16,16,flex_bf16,1.000000,1.000,,1,\n"     // not asked for: ignored
      "alibi,8192,128,2,16,16,flex_bf16,nope,1.000,,0,\n"
      "causal,8192\n");
  VariantTable table;
  std::vector<std::string> notes;
  read_variant_peer_csv(csv, cases, table, notes);
  const VariantKey causal8{"causal", 8192, 128};
  REQUIRE(table.count(causal8));
  CHECK(table[causal8]["flex_bf16"].ms == 2.0);
  CHECK(table[causal8]["flex_bf16"].note == "first call (compile) 12.0 s, blocks skipped 49.2%");   // commas kept
  CHECK(table[causal8]["sdpa_mask_bf16"].rel_rmse == doctest::Approx(2e-3));
  CHECK_FALSE(table.count(VariantKey{"gqa", 8192, 128}));
  CHECK_FALSE(table.count(VariantKey{"segment", 8192, 128}));
  REQUIRE(notes.size() == 4);
  CHECK(notes[0] == "peers: torch 2.11.0, NVIDIA H100");
  CHECK(notes[1] == "peers.py ran gqa S=8192 with B=2 H=16 Hkv=16, tilejit with B=2 H=16 Hkv=4: its flex_bf16 row is left out");
  CHECK(notes[2] == "peers.py CSV: unreadable line 'alibi,8192,128,2,16,16,flex_bf16,nope,1.000,,0,'");
  CHECK(notes[3] == "peers.py CSV: unreadable line 'causal,8192'");
  std::istringstream bad("variant,S,peer\n");
  VariantTable t2;
  std::vector<std::string> n2;
  read_variant_peer_csv(bad, cases, t2, n2);
  REQUIRE(n2.size() == 1);
  CHECK(n2[0].find("no 'D' column") != std::string::npos);

  // tilejit's rows (times; the driver restates every TFLOP/s from one FLOP count).
  table[causal8]["tilejit_bf16"] = BenchResult{1.0, 600.0, 3e-3, true, ""};
  table[causal8]["tilejit_fp8"] = BenchResult{0.625, 960.0, 5.1e-2, true, ""};
  table[causal8]["tilejit_bf16_noskip"] = BenchResult{2.0, 300.0, 3e-3, true, ""};
  table[causal8]["tilejit_fp8_noskip"] = BenchResult{1.0, 600.0, 7e-2, false, ""};
  const VariantKey alibi8{"alibi", 8192, 128};
  table[alibi8]["tilejit_bf16"] = BenchResult{1.0, 600.0, 4e-3, true, ""};
  table[alibi8]["flex_bf16"] = BenchResult{1.1, 545.5, 4e-3, true, ""};
  for (auto& c : cases) c.visible = c.S == 8192 && c.name == "causal" ? 2 * 16 * (8192LL * 8193 / 2) : 0;
  const std::string md = variants_markdown(cases, table, {"header"}, {"a note"});
  CHECK(md.find("header\n\n| variant | S | B×H (Hkv) | visible | tilejit bf16 | tilejit fp8 | no-skip bf16 | no-skip fp8 | flex "
                "bf16 | SDPA mask bf16 | bf16 / flex | fp8 / bf16 | skip speedup bf16 | skip speedup fp8 | rRMSE bf16 | rRMSE fp8 |") ==
        0);
  CHECK(md.find("| causal | 8192 | 2×16 | 50.0% | 600.0 (1.000) | 960.0 (0.625) | 300.0 (2.000) | 600.0 (1.000) FAIL | 300.0 "
                "(2.000) | 400.0 (1.500) | 2.00 | 1.60 | 2.00 | 1.60 | 3.0e-03 | 5.1e-02 |") != std::string::npos);
  CHECK(md.find("| causal | 2048 | 8×16 | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |") !=
        std::string::npos);
  CHECK(md.find("| ALiBi (causal) | 8192 | 2×16 | n/a | 600.0 (1.000) | n/a | — | — | 545.5 (1.100) | — | 1.10 | n/a | — | — | "
                "4.0e-03 | n/a |") != std::string::npos);
  CHECK(md.find("| GQA causal (Hkv = H/4) | 8192 | 2×16 (4) |") != std::string::npos);
  CHECK(md.find("- tilejit bf16 ≥ 1.3× flex_attention bf16: met in 1 of 2 (below: alibi S=8192 1.10×); 4 not measured\n") !=
        std::string::npos);
  CHECK(md.find("- tilejit fp8 ≥ 1.3× tilejit bf16: met in 1 of 1; 5 not measured\n") != std::string::npos);
  CHECK(md.find("- block skipping ≥ 1.8× over attn_block_skip = 0 at S = 8192, window 1024 (causal, sliding window): met in 1 of "
                "2 (below: causal S=8192 fp8 1.60×)\n") != std::string::npos);
  CHECK(md.find("\n- a note\n") != std::string::npos);
}

TEST_CASE("cli bench variants: without a GPU it says so, bad paths fail before any timing") {
  BenchVariantsOptions o;
  o.quick = true;
  o.variants = {"causal"};
  o.out = "/nonexistent-dir/x.md";
  CHECK_THROWS_WITH_AS(bench_variants(o), "--out /nonexistent-dir/x.md: no directory '/nonexistent-dir'", Error);
  o.out.clear();
  o.peers_script = "/nonexistent/peers.py";
  CHECK_THROWS_WITH_AS(bench_variants(o), "--peers-script /nonexistent/peers.py: no such file", Error);
  o.peers_script.clear();
  o.variants = {"nope"};
  CHECK_THROWS_WITH_AS(bench_variants(o), doctest::Contains("--variant nope: no such variant"), Error);
  if (tj_test::gpu_available()) {
    MESSAGE("a GPU is here: the no-GPU message is not reachable");
    return;
  }
  o.variants = {"causal"};
  try {
    bench_variants(o);
    FAIL("bench_variants ran without a GPU");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("tilejit bench variants times kernels on a CUDA GPU; none here (") == 0);
  }
}
