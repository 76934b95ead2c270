#pragma once
// A library of attention variants, each a few lines of user code on kernels/attention_variant.h
// (what a user of tilejit writes for their own variant). Launch the kernel that
// attention_variant(v) returns with attention_fp8's arguments (+ the variant's inputs).
// Masks are top-left aligned: query i and key j are positions in their own sequences.
// Grouped-query / multi-query attention needs no variant: k and v with fewer heads than q
// (Hkv dividing H) work with every kernel here.
#include <cstdint>

#include "kernels/attention_variant.h"

namespace tj::kernels {

AttentionVariant causal_variant();                                  // key j <= query i
AttentionVariant sliding_window_variant(int64_t window);            // causal, i - j < window
// The same window between a query chunk and a key chunk `delta` positions before it (query i, key
// j of their chunks: 0 <= i + delta - j < window): a chunk pair of ring attention's sliding window
// (kernels/ring_plan.h). delta 0 is sliding_window_variant.
AttentionVariant shifted_window_variant(int64_t window, int64_t delta);
AttentionVariant alibi_variant(int64_t heads, bool causal);         // + slope_h * (j - i)
AttentionVariant softcap_variant(double cap, bool causal);          // cap * tanh(score / cap)
// ALiBi with learnable slopes: input slopes f32 [H] (per query head, natural-log units per
// position), score + slopes[h] * (j - i); its backward also gives the slopes' gradient
// (AttentionVariant::learnable: AttentionBackwardOptions::variant_param_grads).
AttentionVariant learnable_alibi_variant(bool causal);
// Prefix-LM: bidirectional inside each sequence's prefix, causal after it. Input prefix_len
// [B] (i32 or i64): the prefix length of each batch entry.
AttentionVariant prefix_lm_variant();
// Document masking for packed sequences (varlen): input cu_seqlens [documents + 1] (i32 or i64,
// ascending, from 0 to the packed length, as FlashAttention's varlen API takes it); a query sees
// the keys of its own document (and only earlier ones with `causal`). The number of documents is
// compiled in (one kernel per count), their lengths are not. Whole blocks between documents are
// skipped: each boundary test is exact in interval arithmetic. key_block: the variant's key block
// (AttentionVariant::key_block): 64 for short documents, 0 (the default configs' own) for long ones.
AttentionVariant document_variant(int64_t documents, bool causal, int64_t key_block = 64);
// Block-diagonal (segments of `segment` keys see only their own segment; `causal`: and only
// earlier keys) -- the building block of dilated attention (kernels/dilated_attention.h) on a
// strided view of the sequence. Without `causal` every query tile sees as many keys
// (AttentionVariant::uniform_work: tiles in their natural order, fp8 64 x 128 with a producer warp).
AttentionVariant segment_variant(int64_t segment, bool causal = false);
// A precomputed block mask (FlexAttention's BlockMask, BigBird-style patterns): input block_mask
// i32 [B or 1, H or 1, ceil(Sq / block_q), ceil(Skv / block_kv)]; query i sees key j when
// block_mask[b, h, i / block_q, j / block_kv] != 0 (and j <= i with `causal`). Blocks past the
// mask's extent are masked. The kernel reads the mask with a gather, so the sm_90a lowering
// skips every key block whose cells are all 0 and drops the per-element mask where all are 1
// (interval arithmetic on a gather is a range query over the cells a key block covers).
AttentionVariant block_mask_variant(int64_t block_q, int64_t block_kv, bool causal = false);

}  // namespace tj::kernels
