#pragma once
// Variable-length attention over packed sequences, FlashAttention's varlen layout: the batch's
// sequences one after another in q [T, H, D], k / v [T, Hkv, D] and o [T, H, D]; cu_seqlens
// [N + 1] (i32 or i64, on the GPU) says where each starts: sequence i is rows cu_seqlens[i] ..
// cu_seqlens[i + 1] - 1, cu_seqlens[0] = 0 and cu_seqlens[N] = T. A query sees the keys of its
// own sequence (causal: up to its own position, top-left). Queries and keys share one packing
// (self-attention). Runs attention_fp8_forward on the [1, H, T, D] views of the packed tensors
// (no copy) with document_variant(N, causal) (kernels/attention_variants.h): whole key blocks
// outside a query tile's sequences are skipped, so the work is that of the sequences alone; bf16 /
// f16 as given (opt.quantize = false) or the FP8 pipeline (descales per head over all sequences).
#include "kernels/attention_fp8.h"

namespace tj::kernels {

struct AttentionVarlenOptions {
  AttentionFp8Options attention;   // causal, softmax_scale, quantize, recipes, stream, ... (not kernel / inputs)
  // f32 [H, T] to fill with each row's logsumexp (natural log), as flash_attn_varlen_func's.
  std::optional<TensorView> lse;
  // Read cu_seqlens back (one small copy and a wait for the stream) and check it: starts at 0,
  // never decreases, ends at T. Off: a wrong cu_seqlens gives wrong rows, not an error.
  bool check_cu_seqlens = true;
  // The document mask's key block (document_variant): -1 picks it from the mean sequence length
  // T / N (varlen_key_block: 16-bit sequences of kLongSequence rows or more take the dense
  // default's, shorter ones and the FP8 pipeline 64); else 64, or 0 for none.
  int64_t key_block = -1;
};

// The document mask's key block attention_varlen_forward takes for `rows` packed rows of
// `sequences` sequences (AttentionVarlenOptions::key_block `requested`); throws tj::Error for a
// requested value other than -1, 0 or 64.
inline constexpr int64_t kLongSequence = 1024;   // 16-bit rows a sequence from which the dense key blocks win
int64_t varlen_key_block(int64_t rows, int64_t sequences, bool quantize, int64_t requested);

void attention_varlen_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cu_seqlens,
                              const TensorView& o, const AttentionVarlenOptions& opt, AttentionFp8Workspace& ws);

}  // namespace tj::kernels
