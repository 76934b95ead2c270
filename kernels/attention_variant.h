#pragma once
// Attention variants in a few lines: FlexAttention-style hooks spliced into the FP8/16-bit flash
// attention kernel (kernels/attention_fp8.cpp).
//
//   AttentionVariant sliding{"sliding_window_1024"};
//   sliding.mask_mod = [](const ScoreIndex& at) { return at.kv <= at.q && at.q - at.kv < 1024; };
//   Kernel k = attention_variant(sliding);   // launch with attention_fp8's arguments
//
// The hooks are DSL code, traced inside the key loop of the kernel (tagged "score_mod" and
// "mask_mod" in the IR): the CPU reference executor and the SIMT path run them as written, and
// the sm_90a lowering inlines them into the tensor-core main loop, evaluating the mask on whole
// key blocks by interval arithmetic to skip blocks it rules out entirely (block sparsity derived
// from the mask: see codegen/lower_attention_sm90.h).
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dsl/config.h"
#include "dsl/kernel.h"

namespace tj::kernels {

// Where a score sits. q and kv are absolute positions (i32 tiles [m, 1] and [1, n]: combine them
// with operators and they broadcast to the score tile [m, n]); b and h are the batch and the
// query head (i64 scalars); inputs are the variant's extra input tensors, in declaration order.
struct ScoreIndex {
  Int b, h;
  Tile q, kv;
  std::vector<In> inputs;
};

// score_mod(score, at) -> the new score: f32 [m, n], on the scaled score q.k * softmax_scale in
// natural-log units (like torch's flex_attention). mask_mod(at) -> i1 tile broadcastable to
// [m, n]: true where the key stays visible. Either may be empty. Fully masked rows give O = 0 and
// lse = -inf. On sm_90a a score_mod's f32 cast of position sums (ALiBi's kv - q) is computed as
// the same sums of the positions in f32: exact for positions below 2^24, like the cast itself. A
// score_mod linear in the score and the positions, d * score + a * kv + b * q + c with d, a, b, c
// functions of b, h and the kernel's scalars (ALiBi, a temperature, a linear position bias), costs
// one FFMA per score element on sm_90a: the key term is formed once per key column and block, the
// query term once per row, in log2 units relative to the query tile's first row (config knob
// attn_linear_score = 0 evaluates the hook per element).
using ScoreMod = std::function<Tile(const Tile& score, const ScoreIndex& at)>;
using MaskMod = std::function<Tile(const ScoreIndex& at)>;
// score_grad(score, modded, at) -> d modded / d score at each score element (f32 [m, n]), given the
// score and score_mod's result on it: the backward (attention_variant_backward) multiplies the
// gradient of the modded score by it. An invalid Tile() means 1 everywhere (a score plus a term
// that does not depend on it: ALiBi, a bias), which costs nothing.
using ScoreGrad = std::function<Tile(const Tile& score, const Tile& modded, const ScoreIndex& at)>;
// param_grad(score, modded, at) -> per entry of AttentionVariant::learnable, d modded / d
// input[h] at each score element (f32, broadcastable to [m, n]): ALiBi with learnable slopes,
// modded = score + slope[h] (kv - q), returns {kv - q}. The backward sums the gradient of the modded
// score times it over every score of head h into that input's gradient.
using ParamGrad = std::function<std::vector<Tile>(const Tile& score, const Tile& modded, const ScoreIndex& at)>;

struct AttentionVariant {
  std::string name;                    // the kernel's name (caches, generated code, errors)
  ScoreMod score_mod = {};
  MaskMod mask_mod = {};
  // The derivative of score_mod, for the backward; a variant with a score_mod and without it has
  // no backward (attention_variant_backward says so).
  ScoreGrad score_grad = {};
  // Names of extra input tensors, passed after attention_fp8's arguments; hooks may read them with
  // scalar indices (load) or per score element (gather, e.g. a block mask:
  // kernels/attention_variants.h).
  std::vector<std::string> inputs = {};
  // Inputs among `inputs` that are learnable parameters per query head (f32 [H], read by score_mod
  // as at.inputs[i].load(at.h)), whose gradient the backward computes from param_grad.
  std::vector<std::string> learnable = {};
  ParamGrad param_grad = {};
  // A key-block size the mask's structure favours (0: none): a window, documents or block-mask
  // cells waste less of each partly visible block in smaller ones. The default configs
  // (attention_fp8_default_config) take key blocks no larger than this; 64 also says that rows
  // see few keys (documents, block masks), and 16-bit inputs then take query tiles of 64 as well.
  int64_t key_block = 0;
  // A key block for fp8 inputs of head dim 128 that the default configs take at every sequence
  // length (0: none, key_block's rules apply). A window bounds the keys each row sees however long the sequence:
  // fp8 then runs 64 x 64 tiles, three CTAs per SM, where 16-bit inputs stay faster at 128 x 128.
  int64_t fp8_key_block = 0;
  // The default configs take config knob fast_math = 1: the hooks' exp2 / log2 / exp / log / sqrt /
  // tanh per score element run as the GPU's approximations on sm_90a (tanh.approx.f32: relative
  // error about 2^-11, as FlashAttention-3's softcap computes it; the accurate tanhf costs some 20
  // instructions per score). softcap_variant sets it.
  bool fast_math = false;
  // The mask gives every query tile about as many keys to compute (block-diagonal segments without
  // causality; a causal-like mask gives later rows more). The default configs then launch the query
  // tiles in their natural order (config knob attn_reverse_tiles = 0) instead of longest first, and
  // fp8 64 x 128 tiles take a producer warp without the softmax / P.V overlap, as dense rows of up
  // to 2048 keys do (H200, segments of 2048 at S 2048 / 8192: fp8 750-754 / 751-755 ->
  // 778-784 / 776-783 TFLOP/s, bf16 609-611 / 606-612 -> 614-616 / 612-615). segment_variant sets it
  // for non-causal segments.
  bool uniform_work = false;
  // o and lse hold a running result, the attention of the same rows over other keys (lse = -inf
  // where there is none yet), and the kernel merges its own into them by the two logsumexps: partial
  // attentions over disjoint key sets, launched one after another, add up to the attention over all
  // of them with no merge pass (dilated attention: kernels/dilated_attention.h). Launch it with
  // with_lse = true and a 16-bit o (o and lse are read too: tj::InOut). In fp8 the LSE is then the
  // log of the sums that divide O, the e4m3 P's (on sm_90a from the tensor cores, as in kernels
  // without an LSE), so that each part weighs its keys as its O does; it is up to 3% off the f32
  // P's sums in rows dominated by a few keys (the FP8 tensor cores' adds are not exact).
  bool merge_into_output = false;
};

// v's hooks on the scores s (f32, log2 units), as the attention kernels trace them, forward and
// backward: score_mod on the natural-log score (its result back in log2 units), then the mask
// (-inf where it fails), tagged "score_mod" / "mask_mod" in the IR. at() makes the score index
// (at.q and at.kv broadcasting to s's shape) inside each hook's tag, so that the positions a hook
// reads are its own ops (the sm_90a attention lowering lifts tagged ops as a whole). With `grad`:
// *grad = score_grad's d modded / d score (f32), left empty where score_grad says 1 (or there is
// no score_mod). With `values`: score_mod's argument and result (natural-log units; invalid
// without a score_mod), from which a backward derives more where it needs it (param_grad). Throws
// tj::Error for a hook that returns the wrong kind of tile.
struct ScoreModValues {
  Tile score, modded;
};
Tile apply_variant_hooks(const AttentionVariant& v, Tile s, const std::function<ScoreIndex()>& at,
                         std::optional<Tile>* grad = nullptr, ScoreModValues* values = nullptr);

// The attention kernel with `v`'s hooks. Its arguments are attention_fp8's (q, k, v, q_descale,
// k_descale, v_descale, o, lse, scale, o_scale, causal, with_lse) followed by one tensor per
// v.inputs. Throws tj::Error for an empty name.
Kernel attention_variant(const AttentionVariant& v);

// The key block the default configs (attention_fp8_default_config) take for the variant that
// attention_variant() made a kernel named `kernel_name`: its key_block, or 128 where it has none
// and has a score_mod; 0 for other kernels. A score_mod adds work per score (ALiBi's bias, a
// softcap's tanh on the MUFU beside exp2), and fp8 runs such softmaxes faster in 64 x 128 tiles
// than in the long rows' 192 x 96 up to 4096 keys; attention_variant_default_config takes 192 x 96
// beyond (H100, S 8192 with causal tiles longest first over groups of heads: ALiBi
// 763 vs 746 TFLOP/s, softcap 637-642 vs 606-613; S 2048: ALiBi 560-562 vs 579-582).
int64_t attention_variant_key_block(const std::string& kernel_name);
// Its fp8_key_block (0 for other kernels).
int64_t attention_variant_fp8_key_block(const std::string& kernel_name);
// attention_fp8_default_config (kernels/attention_fp8.h) with both key blocks of the variant kernel
// `kernel_name`, and knob fast_math = 1 where the variant sets fast_math (none of it for other
// kernels, e.g. attention_fp8 or an empty name). with_lse: whether the kernel writes the LSE (an fp8
// kernel without one takes its P to e4m3 straight, and its exp2s off the MUFU cost less: knob
// attn_exp2_f16; a variant that merges into its output does so with one too).
Config attention_variant_default_config(const std::string& kernel_name, DType in, int64_t head_dim, bool causal,
                                        int64_t qk_head_dim, int64_t seq_kv, bool with_lse = false);

}  // namespace tj::kernels
