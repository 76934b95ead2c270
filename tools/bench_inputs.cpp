// `tilejit bench inputs`: attention on the inputs models hand it, against tilejit's own
// multi-head [B, H, S, D] case at the same useful FLOPs: grouped-query heads (4 and 8 query heads
// per kv head) and Q / K / V / O stored [B, S, H, D] or packed as one [B, S, 3, H, D] QKV tensor,
// passed as strided [B, H, S, D] views (no copy). bf16 through attention_fp8_forward's 16-bit
// path, FP8 through its pipeline from bf16 (quantizers + attention_fp8) and attention_fp8 alone on
// what the pipeline quantized. Then the same tokens as varlen packed sequences
// (attention_varlen_forward) against the dense rows. Two markdown tables.
//
// Method as `tilejit bench attention` (tools/bench_attention.cpp): outputs poisoned and checked
// against float64 on sampled rows before timing; median of --reps CUDA-event-timed launches after
// warm-ups, L2 flushed before each.
#include <fmt/format.h>

#include <cstring>
#include <future>

#include "autotune/launch.h"
#include "core/error.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_varlen.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "runtime/jit.h"
#include "tools/attention.h"

namespace tj::tools {

namespace {

constexpr double kAccuracyFlopBudget = 1e9;

enum class Layout { bhsd, bshd, packed_qkv };
const char* layout_name(Layout l) {
  return l == Layout::bhsd ? "[B, H, S, D]" : l == Layout::bshd ? "[B, S, H, D]" : "packed [B, S, 3, H, D]";
}

struct InputCase {
  int64_t group;   // query heads per kv head
  Layout layout;
};
const std::vector<InputCase> kCases = {{1, Layout::bhsd},  {4, Layout::bhsd}, {8, Layout::bhsd},
                                       {1, Layout::bshd},  {4, Layout::bshd}, {1, Layout::packed_qkv}};

// Rows of [B, H, S, D] (contiguous host bytes) moved to `to`'s order: [B, S, H, D] storage (with
// `slots` 3 and `slot`: the slot's part of a packed [B, S, 3, H, D]), or back (`inverse`).
void permute_rows(const HostTensor& from, HostTensor& to, int64_t slots, int64_t slot, bool inverse) {
  const auto& s = inverse ? to.shape() : from.shape();   // the logical [B, H, S, D]
  const int64_t B = s[0], H = s[1], S = s[2], D = s[3], row = D * static_cast<int64_t>(size_bytes(from.dtype()));
  const auto* src = static_cast<const char*>(from.data());
  auto* dst = static_cast<char*>(to.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < S; ++r) {
        const int64_t logical = (b * H + h) * S + r, stored = ((b * S + r) * slots + slot) * H + h;
        if (inverse) std::memcpy(dst + logical * row, src + stored * row, row);
        else std::memcpy(dst + stored * row, src + logical * row, row);
      }
}

// A [B, S, (3,) H, D] buffer's [B, H, S, D] view (slot of a packed QKV).
TensorView strided_view(const DeviceTensor& t, int64_t B, int64_t H, int64_t S, int64_t D, int64_t slots, int64_t slot) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + slot * H * D * static_cast<int64_t>(size_bytes(v.dtype));
  v.shape = {B, H, S, D};
  v.strides = {S * slots * H * D, D, slots * H * D, 1};
  return v;
}

struct Measured {
  BenchResult bf16, fp8, pipeline;
};

struct Row {
  InputCase c;
  bool causal;
  int64_t H, Hkv;
  std::optional<Measured> m;
  std::string error;
};

Measured run_case(const InputCase& c, bool causal, int64_t B, int64_t H, int64_t S, int64_t D, const BenchInputsOptions& o,
                  CUstream stream, L2Flusher& l2) {
  const int64_t Hkv = H / c.group;
  const HostTensor q = random_normal(DType::bf16, {B, H, S, D}, o.seed), k = random_normal(DType::bf16, {B, Hkv, S, D}, o.seed + 1),
                   v = random_normal(DType::bf16, {B, Hkv, S, D}, o.seed + 2);
  const RowSample sample = sample_rows(B * H, S, D, kAccuracyFlopBudget, false, 2);
  auto reference = std::async(std::launch::async, [&] {
    return attention_f64_rows(q.view(), k.view(), v.view(), causal ? causal_rule() : ScoreRule{}, sample);
  });
  std::vector<DeviceTensor> storage;
  TensorView qv, kv, vv, ov;
  std::optional<DeviceTensor> o_buf;
  if (c.layout == Layout::bhsd) {
    for (const HostTensor* x : {&q, &k, &v}) storage.push_back(DeviceTensor::from_host(*x));
    qv = storage[0].view(), kv = storage[1].view(), vv = storage[2].view();
    o_buf.emplace(DType::bf16, std::vector<int64_t>{B, H, S, D});
    ov = o_buf->view();
  } else if (c.layout == Layout::bshd) {
    for (const HostTensor* x : {&q, &k, &v}) {
      const auto& s = x->shape();
      HostTensor t(DType::bf16, {s[0], s[2], s[1], s[3]});
      permute_rows(*x, t, 1, 0, false);
      storage.push_back(DeviceTensor::from_host(t));
    }
    qv = strided_view(storage[0], B, H, S, D, 1, 0);
    kv = strided_view(storage[1], B, Hkv, S, D, 1, 0);
    vv = strided_view(storage[2], B, Hkv, S, D, 1, 0);
    o_buf.emplace(DType::bf16, std::vector<int64_t>{B, S, H, D});
    ov = strided_view(*o_buf, B, H, S, D, 1, 0);
  } else {
    if (Hkv != H) throw Error("packed QKV takes as many kv heads as query heads");
    HostTensor t(DType::bf16, {B, S, 3, H, D});
    permute_rows(q, t, 3, 0, false);
    permute_rows(k, t, 3, 1, false);
    permute_rows(v, t, 3, 2, false);
    storage.push_back(DeviceTensor::from_host(t));
    qv = strided_view(storage[0], B, H, S, D, 3, 0);
    kv = strided_view(storage[0], B, H, S, D, 3, 1);
    vv = strided_view(storage[0], B, H, S, D, 3, 2);
    o_buf.emplace(DType::bf16, std::vector<int64_t>{B, S, H, D});
    ov = strided_view(*o_buf, B, H, S, D, 1, 0);
  }
  const std::vector<int64_t> shape{B, H, S, D};
  const double flops = attention_flops(B, H, S, D, causal);
  std::string src;
  kernels::AttentionFp8Workspace ws;
  kernels::AttentionFp8Options opt8;
  opt8.causal = causal;
  opt8.attention_config = attention_config(DType::e4m3, DType::bf16, shape, causal, src);
  opt8.stream = stream;
  kernels::AttentionFp8Options opt16 = opt8;
  opt16.quantize = false;
  opt16.attention_config = attention_config(DType::bf16, DType::bf16, shape, causal, src);

  Measured m;
  std::optional<HostTensor> got16, got8;
  m.bf16 = measure([&] { kernels::attention_fp8_forward(qv, kv, vv, ov, opt16, ws); }, *o_buf, &got16, flops, stream, o.reps,
                   o.warmup, l2);
  m.pipeline = measure([&] { kernels::attention_fp8_forward(qv, kv, vv, ov, opt8, ws); }, *o_buf, &got8, flops, stream, o.reps,
                       o.warmup, l2);
  LaunchOptions lo;
  lo.config = opt8.attention_config;
  lo.stream = stream;
  DeviceTensor no_lse(DType::f32, {1});
  DeviceTensor o_contiguous(DType::bf16, shape);
  const std::vector<Arg> args = {ws.q8->view(), ws.k8->view(),      ws.vt8->view(), ws.qd->view(), ws.kd->view(), ws.vd->view(),
                                 o_contiguous.view(), no_lse.view(), scale_log2(D),  1.0,           causal,        false};
  m.fp8 = measure([&] { launch(kernels::attention_fp8(), args, lo); }, o_contiguous, nullptr, flops, stream, o.reps, o.warmup,
                  l2);

  const std::vector<double> ref = reference.get();
  auto check = [&](const HostTensor& got, AttentionPath path, BenchResult& r) {
    HostTensor logical(DType::bf16, shape);
    if (c.layout == Layout::bhsd) logical = got;
    else permute_rows(got, logical, 1, 0, true);
    const AttentionAccuracy a = check_output(logical.view(), sample, ref);
    r.rel_rmse = a.rel_rmse;
    r.ok = a.passes(attention_tolerance(path));
    return a;
  };
  const AttentionAccuracy a16 = check(*got16, AttentionPath::tensor_core_16bit, m.bf16);
  const AttentionAccuracy a8 = check(*got8, AttentionPath::fp8_pipeline, m.pipeline);
  m.fp8.rel_rmse = m.pipeline.rel_rmse;
  m.fp8.ok = m.pipeline.ok;
  fmt::print("  bf16 {:.4f} ms {:.1f} TFLOP/s, {} | fp8 {:.4f} ms {:.1f} | fp8 + quantize {:.4f} ms {:.1f}, {}\n", m.bf16.ms,
             m.bf16.tflops, a16.str(), m.fp8.ms, m.fp8.tflops, m.pipeline.ms, m.pipeline.tflops, a8.str());
  return m;
}

// Varlen: the same B·S tokens packed as sequences in [T, H, D] with cu_seqlens (equal lengths S:
// the dense row's work exactly; ragged: S/2 and 3S/2 alternating), through attention_varlen_forward
// (bf16 as given, FP8 pipeline). TFLOP/s of the sequences' own score entries. Accuracy: float64
// attention of each sampled row's own sequence.
struct VarlenRow {
  bool causal = false, ragged = false;
  std::vector<int64_t> cu;
  std::optional<Measured> m;
  std::string error;
};

Measured run_varlen(const std::vector<int64_t>& cu, bool causal, int64_t H, int64_t D, const BenchInputsOptions& o, L2Flusher& l2) {
  const int64_t T = cu.back();
  const HostTensor q = random_normal(DType::bf16, {T, H, D}, o.seed), k = random_normal(DType::bf16, {T, H, D}, o.seed + 1),
                   v = random_normal(DType::bf16, {T, H, D}, o.seed + 2);
  const DeviceTensor dq = DeviceTensor::from_host(q), dk = DeviceTensor::from_host(k), dv = DeviceTensor::from_host(v);
  std::vector<double> cu_d(cu.begin(), cu.end());
  const DeviceTensor dcu = DeviceTensor::from_host(HostTensor::from_values(cu_d, DType::i32, {static_cast<int64_t>(cu.size())}));
  DeviceTensor out(DType::bf16, {T, H, D});
  double flops = 0;
  for (size_t i = 0; i + 1 < cu.size(); ++i) flops += attention_flops(1, H, cu[i + 1] - cu[i], D, causal);
  kernels::AttentionFp8Workspace ws;
  kernels::AttentionVarlenOptions o16, o8;
  o16.attention.causal = o8.attention.causal = causal;
  o16.attention.quantize = false;
  o16.check_cu_seqlens = o8.check_cu_seqlens = false;   // checked once below, not in the timing
  {
    kernels::AttentionVarlenOptions checked = o16;
    checked.check_cu_seqlens = true;
    kernels::attention_varlen_forward(dq.view(), dk.view(), dv.view(), dcu.view(), out.view(), checked, ws);
  }
  Measured m;
  std::optional<HostTensor> got16, got8;
  m.bf16 = measure([&] { kernels::attention_varlen_forward(dq.view(), dk.view(), dv.view(), dcu.view(), out.view(), o16, ws); },
                   out, &got16, flops, nullptr, o.reps, o.warmup, l2);
  m.pipeline = measure([&] { kernels::attention_varlen_forward(dq.view(), dk.view(), dv.view(), dcu.view(), out.view(), o8, ws); },
                       out, &got8, flops, nullptr, o.reps, o.warmup, l2);
  // Sampled rows: a middle and the last row of every fourth sequence, heads 0 and H - 1 (a first
  // row sees one key: exact, it would only dilute the error).
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  auto rel = [&](const HostTensor& got) {
    double e = 0, r = 0;
    for (size_t s = 0; s + 1 < cu.size(); s += 4)
      for (int64_t row : {(cu[s] + cu[s + 1]) / 2, cu[s + 1] - 1})
        for (int64_t h : {int64_t{0}, H - 1}) {
          const int64_t last = causal ? row : cu[s + 1] - 1;
          std::vector<double> p;
          double mx = -INFINITY, sum = 0;
          for (int64_t j = cu[s]; j <= last; ++j) {
            double d = 0;
            for (int64_t x = 0; x < D; ++x) d += q.at((row * H + h) * D + x) * k.at((j * H + h) * D + x);
            p.push_back(d * scale);
            mx = std::max(mx, p.back());
          }
          for (double& x : p) sum += (x = std::exp(x - mx));
          for (int64_t x = 0; x < D; ++x) {
            double want = 0;
            for (int64_t j = cu[s]; j <= last; ++j) want += p[j - cu[s]] * v.at((j * H + h) * D + x);
            want /= sum;
            const double g = got.at((row * H + h) * D + x);
            e += (g - want) * (g - want);
            r += want * want;
          }
        }
    return std::sqrt(e / std::max(r, 1e-300));
  };
  m.bf16.rel_rmse = rel(*got16);
  m.bf16.ok = m.bf16.rel_rmse <= 1e-2;
  m.pipeline.rel_rmse = rel(*got8);
  m.pipeline.ok = m.pipeline.rel_rmse <= 6e-2;
  fmt::print("  bf16 {:.4f} ms {:.1f} TFLOP/s, rRMSE {:.2e} | fp8 + quantize {:.4f} ms {:.1f}, rRMSE {:.2e}\n", m.bf16.ms,
             m.bf16.tflops, m.bf16.rel_rmse, m.pipeline.ms, m.pipeline.tflops, m.pipeline.rel_rmse);
  return m;
}

std::string ratio(double x, double base) { return base > 0 && x > 0 ? fmt::format("{:.3f}", x / base) : "-"; }
std::string mark(const BenchResult& r) { return r.ok ? "" : " FAIL"; }

std::string inputs_markdown(const std::vector<Row>& rows, const std::vector<std::string>& header) {
  std::string md;
  for (const auto& h : header) md += h + "\n\n";
  md += "| causal | inputs | layout | heads q / kv | bf16 TFLOP/s | ×MHA | bf16 rRMSE | fp8 TFLOP/s | ×MHA | fp8 + quantize "
        "TFLOP/s | ×MHA | fp8 rRMSE | ×MHA |\n";
  md += "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const Row& r : rows) {
    // The baseline: the same causality's multi-head [B, H, S, D] row.
    const Row* base = nullptr;
    for (const Row& b : rows)
      if (b.causal == r.causal && b.c.group == 1 && b.c.layout == Layout::bhsd && b.m) base = &b;
    const std::string what = r.c.group == 1 ? "MHA" : fmt::format("GQA {}:1", r.c.group);
    if (!r.m) {
      md += fmt::format("| {} | {} | {} | {} / {} | error: {} |||||||||\n", r.causal ? "yes" : "no", what,
                        layout_name(r.c.layout), r.H, r.Hkv, r.error);
      continue;
    }
    const Measured& m = *r.m;
    const Measured* bm = base ? &*base->m : nullptr;
    md += fmt::format("| {} | {} | {} | {} / {} | {:.1f} | {} | {:.2e}{} | {:.1f} | {} | {:.1f} | {} | {:.2e}{} | {} |\n",
                      r.causal ? "yes" : "no", what, layout_name(r.c.layout), r.H, r.Hkv, m.bf16.tflops,
                      bm ? ratio(m.bf16.tflops, bm->bf16.tflops) : "-", m.bf16.rel_rmse, mark(m.bf16), m.fp8.tflops,
                      bm ? ratio(m.fp8.tflops, bm->fp8.tflops) : "-", m.pipeline.tflops,
                      bm ? ratio(m.pipeline.tflops, bm->pipeline.tflops) : "-", m.pipeline.rel_rmse, mark(m.pipeline),
                      bm ? ratio(m.pipeline.rel_rmse, bm->pipeline.rel_rmse) : "-");
  }
  return md;
}

}  // namespace

int bench_inputs(const BenchInputsOptions& o) {
  check_out_path(o.out);
  if (o.head_dim != 64 && o.head_dim != 128 && o.head_dim != 256)
    throw Error(fmt::format("tilejit bench inputs: --head-dim {} (the tensor-core attention takes 64, 128 or 256)", o.head_dim));
  if (o.seq < 1 || kGridTokens % o.seq != 0)
    throw Error(fmt::format("tilejit bench inputs: --seq {} must divide {} (B·S is kept at {})", o.seq, kGridTokens, kGridTokens));
  if (!runtime::driver().available())
    throw Error(fmt::format("tilejit bench inputs times kernels on a CUDA GPU; none here ({})", runtime::driver().unavailable_reason()));
  const auto& dev = runtime::current_device();
  if (!dev.supports_fp8())
    throw Error(fmt::format("tilejit bench inputs needs FP8 (compute capability 8.9 or newer); {} is {}.{}", dev.name, dev.cc_major,
                            dev.cc_minor));
  const int64_t S = o.seq, D = o.head_dim, B = kGridTokens / S, H = kGridWidth / D;
  std::vector<std::string> header = {
      fmt::format("Attention forward on grouped-query heads and strided layouts, B {} × S {}, H {}, D {}; TFLOP/s = 4·B·H·S²·D / "
                  "time (half for causal), the same useful FLOPs for every row; ×MHA: over the multi-head [B, H, S, D] row of the "
                  "same causality. {} ({}, {} SMs, driver {})",
                  B, S, H, D, dev.name, dev.arch(), dev.sm_count, dev.driver_version)};
  L2Flusher l2;
  header.push_back(fmt::format(
      "tilejit: median of {} CUDA-event-timed launches after {} warm-ups, L2 flushed ({} MiB memset) before each, random N(0,1) "
      "bf16 inputs. bf16 = kernels::attention_fp8_forward(quantize = false) on the views as given; fp8 + quantize = "
      "attention_fp8_forward from bf16 (quantizers read the strided views; Q's descales per query head, K's and V's per kv "
      "head); fp8 = attention_fp8 alone on what the pipeline quantized. O is stored in the inputs' layout ([B, S, H, D] for "
      "packed QKV). rRMSE: vs float64 attention of the bf16 inputs on sampled rows of 2 heads (FAIL above 1e-2 for bf16, "
      "6e-2 or below cosine 0.998 for fp8). Default configs.",
      o.reps, o.warmup, l2.bytes() >> 20));
  std::vector<bool> causal_list;
  if (o.causal || (!o.causal && !o.non_causal)) causal_list.push_back(true);
  if (o.non_causal || (!o.causal && !o.non_causal)) causal_list.insert(causal_list.begin(), false);
  std::vector<Row> rows;
  bool all_ok = true;
  for (bool causal : causal_list)
    for (const InputCase& c : kCases) {
      Row r{c, causal, H, H / c.group, std::nullopt, ""};
      fmt::print("{} {} {} heads {} / {}\n", causal ? "causal" : "non-causal", c.group == 1 ? "MHA" : "GQA", layout_name(c.layout),
                 r.H, r.Hkv);
      std::fflush(stdout);
      try {
        r.m = run_case(c, causal, B, H, S, D, o, nullptr, l2);
        all_ok = all_ok && r.m->bf16.ok && r.m->pipeline.ok;
      } catch (const std::exception& e) {
        all_ok = false;
        r.error = e.what();
        fmt::print("  error: {}\n", e.what());
      }
      rows.push_back(std::move(r));
    }
  // Varlen over the same tokens, against the multi-head [B, H, S, D] rows above.
  std::vector<VarlenRow> varlen;
  for (bool causal : causal_list)
    for (bool ragged : {false, true}) {
      VarlenRow r;
      r.causal = causal;
      r.ragged = ragged;
      r.cu = {0};
      for (int64_t b = 0; b < B; ++b) r.cu.push_back(r.cu.back() + (ragged && B % 2 == 0 ? (b % 2 ? 3 * S / 2 : S / 2) : S));
      fmt::print("{} varlen, {} sequences ({})\n", causal ? "causal" : "non-causal", B, ragged ? "lengths S/2 and 3S/2" : "length S");
      std::fflush(stdout);
      try {
        r.m = run_varlen(r.cu, causal, H, D, o, l2);
        all_ok = all_ok && r.m->bf16.ok && r.m->pipeline.ok;
      } catch (const std::exception& e) {
        all_ok = false;
        r.error = e.what();
        fmt::print("  error: {}\n", e.what());
      }
      varlen.push_back(std::move(r));
    }
  std::string md = inputs_markdown(rows, header);
  md += fmt::format("\nVarlen (kernels::attention_varlen_forward): the same {} tokens packed as [T, H, D] with cu_seqlens, {} "
                    "sequences of length {} (or S/2 and 3S/2 alternating); TFLOP/s of the sequences' own score entries; "
                    "×dense: over the multi-head [B, H, S, D] row of the same causality above.\n\n",
                    B * S, B, S);
  md += "| causal | sequences | bf16 TFLOP/s | ×dense | bf16 rRMSE | fp8 + quantize TFLOP/s | ×dense | fp8 rRMSE |\n";
  md += "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const VarlenRow& r : varlen) {
    const Row* base = nullptr;
    for (const Row& b : rows)
      if (b.causal == r.causal && b.c.group == 1 && b.c.layout == Layout::bhsd && b.m) base = &b;
    const std::string what = r.ragged ? fmt::format("{} x S/2, 3S/2", B) : fmt::format("{} x {}", B, S);
    if (!r.m) {
      md += fmt::format("| {} | {} | error: {} ||||||\n", r.causal ? "yes" : "no", what, r.error);
      continue;
    }
    md += fmt::format("| {} | {} | {:.1f} | {} | {:.2e}{} | {:.1f} | {} | {:.2e}{} |\n", r.causal ? "yes" : "no", what,
                      r.m->bf16.tflops, base ? ratio(r.m->bf16.tflops, base->m->bf16.tflops) : "-", r.m->bf16.rel_rmse,
                      mark(r.m->bf16), r.m->pipeline.tflops, base ? ratio(r.m->pipeline.tflops, base->m->pipeline.tflops) : "-",
                      r.m->pipeline.rel_rmse, mark(r.m->pipeline));
  }
  emit_markdown(md, o.out);
  return all_ok ? 0 : 1;
}

}  // namespace tj::tools
