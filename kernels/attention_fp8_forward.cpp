// The host pipeline of kernels/attention_fp8.h: quantize pre-passes, then attention_fp8.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention_fp8.h"
#include "kernels/attention_variant.h"
#include "kernels/library.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"

namespace tj::kernels {

Config attention_fp8_default_config(DType in, int64_t head_dim, bool causal, int64_t qk_head_dim, int64_t key_block,
                                    int64_t seq_kv, int64_t fp8_key_block) {
  Config c;
  // The fastest configs of bench/RESULTS.md's harness sweep (H200, S >= 2k): fp8 head dim 64
  // takes three consumer warpgroups (block m 192), head dim 128 key blocks of 192 (long rows:
  // 192 x 96, below).
  int64_t bm = 128, bn = 128;
  if (!is_fp8(in) && head_dim == 256) bn = 64;
  if (is_fp8(in) && head_dim == 64) bm = 192;
  if (is_fp8(in) && head_dim == 128) bn = 192;
  // q_residual (Dqk = 2 D <= 256) fits these blocks: at D 128, 181 KB of shared memory
  // A variant's mask favours smaller key blocks (a window, documents, block-mask cells): fp8 D 128
  // then takes 128 (bench/archive, 2026-11-22: sliding window, documents, block masks). fp8 takes
  // key blocks of 64 only for up to 4096 keys: with more, 128 run faster even where rows see few
  // keys (H100, 64 x 64 with a producer warp and no overlap (below) vs 64 x 128, TFLOP/s
  // at S 2048 / 4096 / 8192 / 16384: documents 274 / 380 / 467 / 525 vs 253 / 350 / 493 / 588, block
  // mask 430 / 485 / 545 / 598 vs 388 / 464 / 559 / 650).
  if (is_fp8(in) && key_block == 64 && seq_kv > 4096) key_block = 128;
  // A variant's fp8 key block holds at every length (a window: the keys per row do not grow);
  // measured at head dim 128 only, where it gives the 64 x 64 tiles below.
  if (is_fp8(in) && fp8_key_block > 0 && head_dim == 128 && qk_head_dim <= 128) key_block = fp8_key_block;
  // fp8 causal(-like) rows of up to 2048 keys: 64 x 64 tiles too (H200, keys by parity,
  // S 1024 / 2048 / 4096 vs 64 x 192: causal 540-545 / 666-671 / 748-754 vs 479-482 / 649-654 / 778-788
  // TFLOP/s, GQA 551-553 / 676 / 761-763 vs 493-496 / 660-665 / 793-794, prefix-LM 535 / 654 / 732-736
  // vs 446-449 / 620-624 / 757-760: past 2048 keys 64 x 192 stays ahead).
  // Causal rows of up to 4096 keys without a key block of their own (causal, GQA,
  // prefix-LM) take self-loading 64 x 128 tiles instead (short_causal, below).
  const bool short_causal =
      is_fp8(in) && head_dim == 128 && qk_head_dim <= 128 && causal && key_block <= 0 && seq_kv > 0 && seq_kv <= 4096;
  if (short_causal) key_block = 128;
  // fp8 D 128 dense rows of up to 2048 keys: 64 x 128 tiles with a producer warp (below) instead of
  // 64 x 192 (H200, row sums on the tensor cores, S 2048: 810.5 vs 782.8 TFLOP/s; 64 x 64
  // with a producer warp 805.4, 64 x 128 with a producer warpgroup 796.9).
  const bool short_dense =
      is_fp8(in) && head_dim == 128 && qk_head_dim <= 128 && !causal && key_block <= 0 && seq_kv > 0 && seq_kv <= 2048;
  if (short_dense) key_block = 128;
  if (key_block > 0 && key_block < bn && key_block % (is_fp8(in) ? 64 : 16) == 0 && key_block >= 64) bn = key_block;
  // fp8 D 128 with little work per query tile (keys up to 4096, or a sparse mask): query tiles of
  // 64 rows, one consumer warpgroup, two CTAs per SM, so one CTA's start and end overlap the
  // other's main loop (H100: S 2048 730 vs 688 TFLOP/s, causal 590 vs 525; block-
  // sparse variants up to 1.16x; at S 8192 and up 128 rows stay ahead, 851 vs 789).
  // (Non-causal S 4096 runs faster on the long rows' 192-row tiles, below: 870-877 vs 821, H100.)
  const int64_t short_keys = causal ? 4096 : 2048;
  const bool short_work = (seq_kv > 0 && seq_kv <= short_keys) || (key_block > 0 && key_block <= 128);
  if (is_fp8(in) && head_dim == 128 && short_work) bm = 64;
  // 16-bit with key blocks of 64 (a variant whose rows see few keys: documents, block masks): query
  // tiles of 64 rows too, two CTAs per SM (H100, bf16 S 2048 / 8192: documents 208 / 381
  // vs 164 / 365 TFLOP/s at m128 n128, block mask 229 / 322 vs 197 / 313; a window of 1024 is
  // faster at m128 n128: 416 / 442 vs 403 / 410).
  if (!is_fp8(in) && head_dim <= 128 && key_block == 64) bm = 64;   // bn is 64 then too
  int stages = 2;
  // fp8 D 128 with long rows and no mask preference: three consumer warpgroups of key blocks of 96,
  // 4 stages: more warps hide the softmax's latency (H100, vs 128 x 192: S 8192 876-913
  // vs 853-869 TFLOP/s, causal 840-845 vs 798; S 16384 909-924 vs 855-880).
  if (is_fp8(in) && head_dim == 128 && !short_work && key_block <= 0 && qk_head_dim <= 128) {
    bm = 192;
    bn = 96;
    stages = 4;
  }
  c.blocks = {{"m", bm}, {"n", bn}};
  c.num_stages = stages;
  // fp8 64 x 64 tiles (rows that see few keys, up to 4096 of them; and short_dense's 64 x 128, two
  // CTAs per SM there): a producer warp instead of a
  // producer warpgroup, so that three CTAs share an SM (their shared memory fits; 128 registers
  // each). Their main loops wait on one block's chain of wgmmas and softmax, and a third CTA hides
  // more of it (H100, S 2048: documents 236.9 -> 252.0-252.9 TFLOP/s, block mask
  // 353.8-354.6 -> 357.0-359.0). And without the softmax / P.V overlap: at 128 registers the
  // overlap's live S, P and O made ptxas serialize the wgmmas (C7512) and spill 48 bytes; the
  // simple schedule has neither, and the three CTAs overlap each other instead (H100, S 2048:
  // documents 252.7 -> 274.3, block mask 387.7 -> 429.7).
  if (is_fp8(in) && bm == 64 && (bn == 64 || short_dense || short_causal) && head_dim <= 128 && qk_head_dim <= 128) {
    c.knobs["attn_lean_producer"] = 1;
    c.knobs["attn_overlap"] = 0;
  }
  // short_dense's 64 x 128 tiles without the producer warp (knob attn_self_load: the consumers load
  // K and V themselves), so that three CTAs share an SM (H200, ms, two or three
  // alternations against the producer warp: S 2048 0.3143-0.3148 vs 0.3353-0.3371; against the
  // persistent producer-warp kernel, S 1024 / 2048 / 4096: 0.1752-0.1753 / 0.3164-0.3167 /
  // 0.6006-0.6007 vs 0.1892-0.1897 / 0.3349 / 0.6280-0.6459. Against the 192 x 96 tiles of longer
  // rows: S 4096 0.607-0.633 vs 0.625-0.628, within noise; S 8192 1.19-1.35 vs 1.20-1.21, S 16384
  // 2.64-2.66 vs 2.39-2.41: behind, so dense rows past 2048 keys keep them.)
  // Causal rows of up to 4096 keys too, on 64 x 128 tiles (H200, plain causal attention, ms,
  // two alternations against the 64 x 64 producer-warp tiles up to 2048 keys and 64 x 192 beyond:
  // S 1024 / 2048 / 4096 0.1219, 0.1221 / 0.1912, 0.1906 / 0.3313, 0.3317 vs 0.1234, 0.1231 /
  // 0.1989, 0.1984 / 0.3588, 0.3583; self-loading 64 x 64 tiles, four CTAs an SM: 0.1205, 0.1200 /
  // 0.1988, 0.1991 / 0.3592, 0.3599. The variants at S 2048, fp8 ms: causal 0.192, 0.191 vs 0.199,
  // 0.198, GQA 0.189, 0.188 vs 0.196, 0.196, prefix-LM 0.200, 0.201 vs 0.209, 0.209.)
  if ((short_dense || short_causal) && head_dim == 128) c.knobs["attn_self_load"] = 1;
  return c;
}

namespace {

void require_power_of_two(int64_t d) {
  if (d < 1 || (d & (d - 1)) != 0)
    throw Error(fmt::format("hadamard: the head dim must be a power of two (Sylvester's construction), got {}", d));
}

void ensure(std::optional<DeviceTensor>& t, DType dt, const std::vector<int64_t>& shape, bool zero = false) {
  if (t && t->dtype() == dt && t->shape() == shape) return;
  t.emplace(dt, shape);
  if (zero) t->fill_bytes(0);
}

// [B, H, S, 2D] seen as [B, H, S, 2, D]: the split quantizers write the two halves of each row.
TensorView as_halves(const TensorView& t) {
  TensorView v = t;
  v.shape = {t.shape[0], t.shape[1], t.shape[2], 2, t.shape[3] / 2};
  v.strides.clear();
  return v;
}

}  // namespace

// Rows per tile: whole tiles per chunk (chunk_rows). Eight warps; the quantizer with 16 lanes
// along a row (a warp's load covers 32 contiguous bf16 of two rows, not 8 of four), the
// transposing one with 8 adjacent columns per thread (16-byte loads). H200, bf16
// [8, 16, 2048, 128], medians of 20 in two runs, 4 warps of 8 lanes -> these: chunk_amax 55.0 ->
// 42.3 us, quantize_fp8_chunked 51.3 -> 40.8-41.2, quantize_transpose_fp8_chunked 85.8 -> 49.2-49.7
// (the vectors made the other two slower: 55.4 and 57.4-57.8; bit for bit the same output).
// chunk_amax in tiles of 32 rows, at most 64 registers (knob simt_min_blocks: four blocks per SM,
// not the two its 99 registers left): H100, same shape, ncu, two launches each, 41.1-42.4
// -> 33.9-34.1 us (tiles of 64 at 64 registers: 35.7-36.5; the quantizers did not gain from it:
// 43.7-44.6 -> 53.3-54.1 at 80 registers; measured before its loop kept a per-thread running max:
// 60 registers unbounded at 32 rows, 51 with the knob). H200 sweep with that loop at boost clock,
// ncu: this config 23.7-24.8 us, 64 rows / 16 warps 23.2-23.9, 64 rows / 8 warps 23.6-26.3, 16-byte
// vectors 23.2-25.6; the quantizers' defaults also stayed the fastest of six (32 rows / 4 warps 33
// against 34 us).
Config chunk_amax_config() {
  Config c;
  c.blocks = {{"s", 32}};
  c.num_warps = 8;
  c.knobs = {{"simt_min_blocks", 4}};
  return c;
}

Config chunked_quantize_config(bool transpose) {
  Config c;
  c.blocks = {{"s2", 64}};
  c.num_warps = 8;
  if (transpose) c.knobs = {{"simt_vec", 8}};
  else c.knobs = {{"simt_lanes_c", 16}};
  return c;
}

namespace {
// The [B, H, C] chunk amaxes of x in `partial`, grown as needed, never shrunk, and viewed at each
// call's shape: callers that quantize views of several shapes in turn (dilated attention's pairs)
// would otherwise free and allocate it at every one, and a free waits for the device.
TensorView chunk_view(const TensorView& x, std::optional<DeviceTensor>& partial) {
  const int64_t C = attention_fp8_quantize_chunks(x.shape[0] * x.shape[1], x.shape[2]);
  const int64_t need = x.shape[0] * x.shape[1] * C;
  if (!partial || partial->dtype() != DType::f32 || partial->view().numel() < need) partial.emplace(DType::f32, std::vector<int64_t>{need});
  TensorView chunks = partial->view();
  chunks.shape = {x.shape[0], x.shape[1], C};
  chunks.strides = {};
  return chunks;
}
}  // namespace

TensorView chunk_amaxes(const TensorView& x, std::optional<DeviceTensor>& partial, const LaunchOptions& lo) {
  const TensorView chunks = chunk_view(x, partial);
  LaunchOptions o = lo;
  o.config = chunk_amax_config();
  launch(chunk_amax(), {x, chunks}, o);
  return chunks;
}

void quantize_with_chunk_amaxes(const TensorView& x, const TensorView& chunks, const TensorView& y, const TensorView& descale,
                                bool transpose, const LaunchOptions& lo) {
  LaunchOptions o = lo;
  o.config = chunked_quantize_config(transpose);
  launch(transpose ? quantize_transpose_fp8_chunked() : quantize_fp8_chunked(), {x, chunks, y, descale}, o);
}

void quantize_both_with_chunk_amaxes(const TensorView& x, const TensorView& chunks, const TensorView& y, const TensorView& yt,
                                     const TensorView& descale, const LaunchOptions& lo) {
  LaunchOptions o = lo;
  o.config = chunked_quantize_config(true);
  launch(quantize_fp8_both_chunked(), {x, chunks, y, yt, descale}, o);
}

TensorView quantize_fp8_delayed(const TensorView& x, const TensorView& prev, const TensorView& y, const TensorView& descale,
                                std::optional<DeviceTensor>& next, bool transpose, const LaunchOptions& lo) {
  const TensorView chunks = chunk_view(x, next);
  LaunchOptions o = lo;
  o.config = chunked_quantize_config(transpose);
  launch(transpose ? quantize_transpose_fp8_delayed() : quantize_fp8_delayed(), {x, prev, y, descale, chunks}, o);
  return chunks;
}

void quantize_fp8_per_head(const TensorView& x, std::optional<DeviceTensor>& partial, const TensorView& y,
                           const TensorView& descale, bool transpose, const LaunchOptions& lo) {
  quantize_with_chunk_amaxes(x, chunk_amaxes(x, partial, lo), y, descale, transpose, lo);
}

namespace {

// Sizes ws.q8 / ws.k8 and their descales for the recipe, and fills them with the Hadamard and
// residual recipes' Q and K (the plain recipe's come from quantize_qkv_per_head).
void quantize_qk(const TensorView& q, const TensorView& k, const AttentionFp8Options& opt, AttentionFp8Workspace& ws,
                 const LaunchOptions& lo) {
  const int64_t B = q.shape[0], H = q.shape[1], Sq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k.shape[1], Skv = k.shape[2];
  const int64_t Dqk = opt.q_residual ? 2 * D : D;
  ensure(ws.q8, DType::e4m3, {B, H, Sq, Dqk});
  ensure(ws.k8, DType::e4m3, {B, Hkv, Skv, Dqk});
  ensure(ws.qd, DType::f32, {B, H});
  ensure(ws.kd, DType::f32, {B, Hkv});
  if (!opt.hadamard && !opt.q_residual) return;
  // In q's 16-bit dtype: the signs, whose product with Q and K runs on the tensor cores.
  if (opt.hadamard && (!ws.hadamard || ws.hadamard->shape() != std::vector<int64_t>{D, D} || ws.hadamard->dtype() != q.dtype))
    ws.hadamard.emplace(DeviceTensor::from_host(hadamard_matrix(D, q.dtype)));
  // Without a rotation the quantizers never read it; any tensor fills the slot.
  const TensorView rotation = opt.hadamard ? ws.hadamard->view() : ws.qd->view();
  LaunchOptions qo = lo;
  qo.config = attention_fp8_quantize_config(opt.hadamard, D);
  if (opt.q_residual) {
    launch(quantize_residual_fp8(), {q, rotation, as_halves(ws.q8->view()), ws.qd->view(), opt.hadamard}, qo);
    launch(quantize_duplicate_fp8(), {k, rotation, as_halves(ws.k8->view()), ws.kd->view(), opt.hadamard}, qo);
  } else {
    launch(quantize_hadamard_fp8(), {q, rotation, ws.q8->view(), ws.qd->view()}, qo);
    launch(quantize_hadamard_fp8(), {k, rotation, ws.k8->view(), ws.kd->view()}, qo);
  }
}

// The plain recipe's pre-passes: Q's, K's and V's chunk amaxes, then their three quantizers (Vᵀ
// for V). Each launch after the first of its kind reads only its own input and chunk amaxes that
// no running kernel writes, so it starts early (LaunchOptions::start_early) and runs beside the one
// before it, waiting for it only before its own writes. (Q's quantizer waits for V's amax pass to
// end, and that one, through the waits of the passes before it, for all three.) The first amax
// pass starts early where the caller allows it. H200, B·S 16384, H 16, D 128, the
// pipeline from bf16 in the old order without early starts -> this: S 2048 0.5340-0.5347 ->
// 0.5118-0.5122 ms, S 1024 0.387-0.388 -> 0.365, S 8192 1.354-1.355 -> 1.330-1.333 (at S 2048 this
// order alone: 0.527-0.528; without next_starts_early on the first of each kind: 0.517).
struct PrepassLaunches {
  LaunchOptions first, beside;   // the first pre-pass (starts early where the caller allows), the ones beside it
};
PrepassLaunches prepass_launches(const LaunchOptions& lo, bool first_starts_early) {
  PrepassLaunches p{lo, lo};
  p.first.start_early = first_starts_early;
  p.first.next_starts_early = true;
  p.beside.start_early = true;
  return p;
}

void quantize_qkv_per_head(const TensorView& q, const TensorView& k, const TensorView& v, bool first_starts_early,
                           AttentionFp8Workspace& ws, const LaunchOptions& lo) {
  const auto [first, beside] = prepass_launches(lo, first_starts_early);
  const TensorView q_chunks = chunk_amaxes(q, ws.q_amax, first);
  const TensorView k_chunks = chunk_amaxes(k, ws.k_amax, beside);
  const TensorView v_chunks = chunk_amaxes(v, ws.v_amax, beside);
  LaunchOptions after = lo;
  after.start_early = false;
  after.next_starts_early = true;
  quantize_with_chunk_amaxes(q, q_chunks, ws.q8->view(), ws.qd->view(), /*transpose=*/false, after);
  quantize_with_chunk_amaxes(k, k_chunks, ws.k8->view(), ws.kd->view(), /*transpose=*/false, beside);
  quantize_with_chunk_amaxes(v, v_chunks, ws.vt8->view(), ws.vd->view(), /*transpose=*/true, beside);
}

// Delayed scaling's pre-passes: one quantizer per tensor, each taking the descales from the chunk
// amaxes of the call before (ws.*_amax) and measuring its own into ws.*_amax_next, swapped after.
// Each reads only its own input and amaxes no running kernel writes, so each after the first
// starts early beside the one before it.
void quantize_qkv_delayed(const TensorView& q, const TensorView& k, const TensorView& v, bool first_starts_early,
                          AttentionFp8Workspace& ws, const LaunchOptions& lo) {
  const auto [first, beside] = prepass_launches(lo, first_starts_early);
  quantize_fp8_delayed(q, chunk_view(q, ws.q_amax), ws.q8->view(), ws.qd->view(), ws.q_amax_next, /*transpose=*/false, first);
  quantize_fp8_delayed(k, chunk_view(k, ws.k_amax), ws.k8->view(), ws.kd->view(), ws.k_amax_next, /*transpose=*/false, beside);
  quantize_fp8_delayed(v, chunk_view(v, ws.v_amax), ws.vt8->view(), ws.vd->view(), ws.v_amax_next, /*transpose=*/true, beside);
  std::swap(ws.q_amax, ws.q_amax_next);
  std::swap(ws.k_amax, ws.k_amax_next);
  std::swap(ws.v_amax, ws.v_amax_next);
}

}  // namespace

// Rows of 64 (a multiple of 16 keeps Vᵀ's pad zero); with a rotation, columns of x·H in tiles
// of 64, so the SIMT dot stages at most 64·(D+1) + D·64 floats in shared memory (131 KB at D = 256).
Config attention_fp8_quantize_config(bool rotate, int64_t head_dim) {
  Config c;
  c.blocks = {{"s", 64}, {"s2", 64}};
  if (rotate) {
    c.blocks["d"] = 64;
    c.blocks["d2"] = 64;
    // On the tensor cores each pass stages its row tile [64, D] and R's column tile [D, 64]:
    // 2 stages of both passes at D 256 need 257 KB, one stage 129 KB (of the 227 a block has).
    if (head_dim > 128) c.num_stages = 1;
  }
  return c;
}

// About 4 programs per SM of a big GPU in all (B·H alone can be a few dozen), at most one
// chunk per 64-row tile.
int64_t attention_fp8_quantize_chunks(int64_t heads_total, int64_t S) {
  const int64_t target_programs = 512;
  return std::max<int64_t>(1, std::min((S + 63) / 64, (target_programs + heads_total - 1) / heads_total));
}

HostTensor hadamard_matrix(int64_t d, DType dtype) {
  require_power_of_two(d);
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    throw Error(fmt::format("hadamard_matrix: f32 (normalized) or bf16 / f16 (signs), not {}", name(dtype)));
  HostTensor h(dtype, {d, d});
  const double entry = dtype == DType::f32 ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0;
  // H[i][j] = (-1)^popcount(i & j) / √d: Sylvester's [[H, H], [H, -H]] unrolled.
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) h.set(i * d + j, __builtin_popcountll(static_cast<uint64_t>(i & j)) % 2 ? -entry : entry);
  return h;
}

namespace {
// attention_fp8 (or opt.kernel, with opt.inputs after the library kernel's arguments).
void launch_attention(const AttentionFp8Options& opt, std::vector<Arg> args, const LaunchOptions& lo) {
  const TensorView o = std::get<TensorView>(args[6]);
  for (const TensorView& t : opt.inputs) args.push_back(t);
  launch(opt.kernel ? *opt.kernel : attention_fp8(), args, lo);
  if (opt.o_amax) {
    LaunchOptions ao;
    ao.stream = lo.stream;
    ao.config = Config();
    ao.config->blocks = {{"s", 64}};
    launch(head_amax(), {o, *opt.o_amax, 1.0 / static_cast<double>(opt.o_scale)}, ao);
  }
}
}  // namespace

void attention_fp8_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                           const AttentionFp8Options& opt, AttentionFp8Workspace& ws) {
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4 || o.rank() != 4)
    throw Error("attention_fp8_forward: q, k, v and o must be rank 4 ([B, H, S, D])");
  const int64_t B = q.shape[0], H = q.shape[1], D = q.shape[3];
  const int64_t Hkv = k.shape[1], Skv = k.shape[2];
  if (k.shape[0] != B || v.shape != k.shape || k.shape[3] != D || o.shape != q.shape)
    throw Error(fmt::format("attention_fp8_forward: shapes q {} k {} v {} o {} do not fit", q.describe(), k.describe(),
                            v.describe(), o.describe()));
  if (Hkv < 1 || H % Hkv != 0)
    throw Error(fmt::format("attention_fp8_forward: q's {} heads are not a multiple of k's and v's {} (grouped-query "
                            "attention: query head h reads kv head h / (H / Hkv))",
                            H, Hkv));
  if (!opt.quantize && (opt.hadamard || opt.q_residual))
    throw Error("attention_fp8_forward: hadamard and q_residual are quantization recipes; with quantize = false the "
                "16-bit inputs run as given");
  if (opt.hadamard) require_power_of_two(D);   // before anything runs
  if (opt.delayed_scaling && (!opt.quantize || opt.hadamard || opt.q_residual))
    throw Error("attention_fp8_forward: delayed_scaling is a scaling of the plain recipe: it needs quantize, and no hadamard or "
                "q_residual");
  if (opt.o_amax && (opt.o_amax->dtype != DType::f32 || opt.o_amax->shape != std::vector<int64_t>{B, H}))
    throw Error(fmt::format("attention_fp8_forward: o_amax must be f32 [B, H] = [{}, {}], got {}", B, H,
                            opt.o_amax->describe()));
  if (opt.quantize && opt.q_residual && D > 128)
    throw Error(fmt::format("attention_fp8_forward: q_residual doubles the QK head dim; {} would be {}, above the 256 the "
                            "tensor-core attention takes (use head dims up to 128)",
                            D, 2 * D));
  LaunchOptions lo;
  lo.stream = opt.stream;
  // D is the original head dim (also v's): q_residual doubles only the QK operands' width.
  const double scale = opt.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(D))) * 1.4426950408889634;
  const int64_t Dqk = opt.quantize && opt.q_residual ? 2 * D : D;
  Config cfg = opt.attention_config.value_or(
      attention_variant_default_config(opt.kernel ? opt.kernel->name() : std::string(),
                                       opt.quantize ? DType::e4m3 : q.dtype, D, opt.causal, Dqk, Skv, opt.lse.has_value()));
  ensure(ws.no_lse, DType::f32, {1});
  TensorView lse = opt.lse.value_or(ws.no_lse->view());
  const bool with_lse = opt.lse.has_value();
  LaunchOptions ao = lo;
  ao.config = cfg;
  if (!opt.quantize) {
    // Grown, never shrunk: a new buffer costs a copy from the host and the old one's free, which
    // waits for the device. Callers whose views change shape within a call (dilated attention's
    // pairs, kernels/dilated_attention.cpp) would pay that at every launch.
    if (!ws.ones || ws.ones->view().numel() < B * H) {
      HostTensor h(DType::f32, {B * H});
      for (int64_t i = 0; i < h.numel(); ++i) h.set(i, 1.0);
      ws.ones.emplace(DeviceTensor::from_host(h));
    }
    // Their first B·H (Q's, per query head) or B·Hkv (K's and V's) ones, row-major.
    TensorView q_one = ws.ones->view(), kv_one = ws.ones->view();
    q_one.shape = {B, H};
    kv_one.shape = {B, Hkv};
    ao.start_early = opt.start_early;
    launch_attention(opt, {q, k, v, q_one, kv_one, kv_one, o, lse, scale, static_cast<double>(opt.o_scale), opt.causal, with_lse},
                     ao);
    return;
  }
  // Q's descales are per query head, K's and V's per kv head, as attention_fp8 reads them: grouped-query
  // inputs (H a multiple of Hkv) quantize like any other.
  const int64_t S_pad = (Skv + 15) / 16 * 16;
  ensure(ws.vt8, DType::e4m3, {B, Hkv, D, S_pad}, /*zero=*/true);   // the pad past Skv must be finite
  ensure(ws.vd, DType::f32, {B, Hkv});
  quantize_qk(q, k, opt, ws, lo);
  if (opt.hadamard || opt.q_residual) quantize_fp8_per_head(v, ws.v_amax, ws.vt8->view(), ws.vd->view(), /*transpose=*/true, lo);
  else if (opt.delayed_scaling && ws.delayed_q_shape == q.shape && ws.delayed_k_shape == k.shape)
    quantize_qkv_delayed(q, k, v, opt.start_early, ws, lo);
  else quantize_qkv_per_head(q, k, v, opt.start_early, ws, lo);   // delayed scaling's first call measures first
  if (opt.delayed_scaling) {
    ws.delayed_q_shape = q.shape;
    ws.delayed_k_shape = k.shape;
  } else {
    ws.delayed_q_shape.clear();   // the recipes' calls leave no Q / K amaxes a delayed call could take
  }
  launch_attention(opt,
                   {ws.q8->view(), ws.k8->view(), ws.vt8->view(), ws.qd->view(), ws.kd->view(), ws.vd->view(), o, lse,
                    scale, static_cast<double>(opt.o_scale), opt.causal, with_lse},
                   ao);
}

}  // namespace tj::kernels
