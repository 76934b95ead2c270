// Each variant below is the whole of its user code.
#include "kernels/attention_variants.h"

#include <fmt/format.h>

namespace tj::kernels {

AttentionVariant causal_variant() {
  AttentionVariant v{"attention_causal"};
  v.mask_mod = [](const ScoreIndex& at) { return at.kv <= at.q; };
  return v;
}

AttentionVariant sliding_window_variant(int64_t window) {
  AttentionVariant v{fmt::format("attention_sliding_{}", window)};
  v.key_block = 128;   // boundary blocks: less waste in smaller key blocks
  // fp8: rows of at most 1024 keys at any length run fastest in 64 x 64 tiles, three CTAs per SM
  // (H100, window 1024, S 2048 / 4096 / 8192 / 16384: 537 / 560 / 567 / 566 TFLOP/s vs
  // 518 / 544 / 544 / 562 at 64 x 128; bf16 keeps 128 x 128).
  if (window <= 1024) v.fp8_key_block = 64;
  v.mask_mod = [window](const ScoreIndex& at) { return at.kv <= at.q && at.q - at.kv < window; };
  return v;
}

AttentionVariant shifted_window_variant(int64_t window, int64_t delta) {
  AttentionVariant v = sliding_window_variant(window);
  v.name = fmt::format("attention_sliding_{}_shift_{}", window, delta);
  v.mask_mod = [window, delta](const ScoreIndex& at) {
    auto distance = at.q + delta - at.kv;
    return distance >= 0 && distance < window;
  };
  return v;
}

AttentionVariant alibi_variant(int64_t heads, bool causal) {
  AttentionVariant v{fmt::format("attention_alibi_{}{}", heads, causal ? "_causal" : "")};
  v.score_mod = [heads](const Tile& score, const ScoreIndex& at) {
    // slope of head h: 2^(-8 (h + 1) / heads), the geometric sequence of the ALiBi paper
    auto slope = exp2((at.h + 1).to(DType::f32) * (-8.0 / static_cast<double>(heads)));
    return score + slope * (at.kv - at.q).to(DType::f32);
  };
  v.score_grad = [](const Tile&, const Tile&, const ScoreIndex&) { return Tile(); };   // d/ds (s + bias) = 1
  if (causal) v.mask_mod = [](const ScoreIndex& at) { return at.kv <= at.q; };
  return v;
}

AttentionVariant learnable_alibi_variant(bool causal) {
  AttentionVariant v{fmt::format("attention_alibi_learnable{}", causal ? "_causal" : "")};
  v.inputs = {"slopes"};
  v.learnable = {"slopes"};
  v.score_mod = [](const Tile& score, const ScoreIndex& at) {
    return score + at.inputs[0].load(at.h) * (at.kv - at.q).to(DType::f32);
  };
  v.score_grad = [](const Tile&, const Tile&, const ScoreIndex&) { return Tile(); };   // d/ds (s + bias) = 1
  v.param_grad = [](const Tile&, const Tile&, const ScoreIndex& at) { return std::vector<Tile>{at.kv.to(DType::f32) - at.q.to(DType::f32)}; };
  if (causal) v.mask_mod = [](const ScoreIndex& at) { return at.kv <= at.q; };
  return v;
}

AttentionVariant softcap_variant(double cap, bool causal) {
  AttentionVariant v{fmt::format("attention_softcap_{}{}", cap, causal ? "_causal" : "")};
  v.score_mod = [cap](const Tile& score, const ScoreIndex&) { return tanh(score * (1.0 / cap)) * cap; };
  // d/ds cap tanh(s / cap) = 1 - tanh^2(s / cap), from the modded score: 1 - (modded / cap)^2.
  v.score_grad = [cap](const Tile&, const Tile& modded, const ScoreIndex&) {
    auto t = modded * (1.0 / cap);
    return 1.0 - t * t;
  };
  if (causal) v.mask_mod = [](const ScoreIndex& at) { return at.kv <= at.q; };
  v.fast_math = true;   // tanh.approx.f32, as FlashAttention's softcap
  return v;
}

AttentionVariant prefix_lm_variant() {
  AttentionVariant v{"attention_prefix_lm"};
  v.inputs = {"prefix_len"};
  v.mask_mod = [](const ScoreIndex& at) {
    auto prefix = at.inputs[0].load(at.b).to(DType::i32);
    return at.kv <= at.q || at.kv < prefix;
  };
  return v;
}

AttentionVariant document_variant(int64_t documents, bool causal, int64_t key_block) {
  AttentionVariant v{fmt::format("attention_documents_{}{}{}", documents, causal ? "_causal" : "",
                                 key_block == 64 ? "" : fmt::format("_kb{}", key_block))};
  v.key_block = key_block;   // 64: short rows, small tiles (less waste in boundary blocks, two CTAs per SM)
  v.inputs = {"cu_seqlens"};
  v.mask_mod = [documents, causal](const ScoreIndex& at) {
    // Non-causal: a condition interval arithmetic proves true on every key block (kv == kv is not:
    // the classifier then took each kept block for a per-element mask).
    Tile keep = causal ? at.kv <= at.q : at.kv >= 0;
    for (int64_t d = 1; d < documents; ++d) {   // same side of every inner boundary
      auto boundary = at.inputs[0].load(d).to(DType::i32);
      keep = keep && ((at.q < boundary) == (at.kv < boundary));
    }
    return keep;
  };
  return v;
}

AttentionVariant block_mask_variant(int64_t block_q, int64_t block_kv, bool causal) {
  AttentionVariant v{fmt::format("attention_block_mask_{}x{}{}", block_q, block_kv, causal ? "_causal" : "")};
  v.key_block = 64;   // short rows: small tiles, less waste in boundary blocks, two CTAs per SM
  // fp8 64 x 64 tiles past 4096 keys too (H200, the bench's BigBird-like mask, keys by
  // parity: S 8192 596-602 vs 566-569 TFLOP/s at 64 x 128, S 16384 668-669 vs 671-673)
  v.fp8_key_block = 64;
  v.inputs = {"block_mask"};
  v.mask_mod = [block_q, block_kv, causal](const ScoreIndex& at) {
    const In& mask = at.inputs[0];
    // b % dim: a mask of batch (or head) extent 1 serves every batch entry (head)
    Tile cell = mask.gather({at.b % mask.dim(0), at.h % mask.dim(1), floordiv(at.q, block_q), floordiv(at.kv, block_kv)});
    return causal ? cell != 0 && at.kv <= at.q : cell != 0;
  };
  return v;
}

AttentionVariant segment_variant(int64_t segment, bool causal) {
  AttentionVariant v{fmt::format("attention_segment_{}{}", segment, causal ? "_causal" : "")};
  v.key_block = 128;   // boundary blocks: less waste in smaller key blocks
  v.uniform_work = !causal;
  v.mask_mod = [segment, causal](const ScoreIndex& at) {
    auto same = floordiv(at.q, segment) == floordiv(at.kv, segment);
    return causal ? same && at.kv <= at.q : same;
  };
  return v;
}

}  // namespace tj::kernels
