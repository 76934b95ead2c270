#pragma once
// The sm_90a attention lowering: recognizes the flash-attention forward of
// kernels/attention_fp8.cpp (online softmax in exp2, two dots, loop-carried m/l/acc, scaled FP8
// or 16-bit inputs) and emits an instantiation of the warp-specialized TMA + wgmma main loop
// in codegen/device/hopper_attention.cuh. Registered with the pattern-lowering registry at
// static initialization (name "sm90_attention"); these entry points are for tests and tools.
//
// Recognition is exact: the function must be, op for op, the IR that tracing
// tj::kernels::attention_fp8() gives for the same parameter types and shapes (names, block
// names and source locations aside) for one of its host specializations (causal, with_lse).
// A lowering that substitutes a hand-scheduled main loop for the traced ops must be sure they
// mean the same thing; IR identity guarantees it (and yields causal / with_lse), where a
// looser structural match could lower a kernel that differs in a constant or an operand.
// Attention variants (kernels/attention_variant.h) match when removing their hooks (the ops
// tagged "score_mod" / "mask_mod", see codegen/attention_hooks.h) leaves exactly that IR; the
// hooks are then written into the main loop per score element, and the mask hook also per key
// block as interval arithmetic: blocks it rules out are skipped (not loaded, not computed),
// blocks it keeps whole are not masked (knob "attn_block_skip", default 1; 0 masks every
// element of every block, for comparison); with a mask hook the query tiles run last to first,
// longest first for causal-like masks (knob "attn_reverse_tiles", default 1). Hooks the writer
// cannot express (tile loads, dots, reductions) leave the kernel to the SIMT path.
// Everything else -- other kernels, e5m2 / f32 inputs, f32 / e5m2 outputs, dynamic head dims,
// head dims other than 64/128/256 -- is left to the next lowering (SIMT).
//
// Config: block "m" (the query tile: 64, 128 or 192 rows = 1, 2 or 3 consumer warpgroups),
// block "n" (the key block BN: 64, 96, 128, 192, 224 or 256 within the register budget of the
// head dim; fp8: a multiple of 32), num_stages (K/V pipeline depth, 1..4); knobs "attn_overlap"
// (default 1: FA3's intra-warpgroup overlap of softmax and P.V), "attn_wgsync" (default 0; 1:
// FA3's inter-warpgroup schedule, 2 or 3 consumers taking turns) and "attn_keys_by_parity" (fp8;
// default 1: each K stage holds the block's even keys, then its odd keys -- a TMA map stepping 2
// keys -- so that S's columns come in the order P's A fragment needs and P is packed without
// shuffles) and "attn_vperm" (fp8 with attn_keys_by_parity = 0; default 1 with 2+ consumers: the
// producer's spare warps permute V's keys in shared memory instead; 0: shuffles) and
// "attn_exp2_fma" (0-8, default 0: of every 8 score exp2s, how many are computed on the FMA pipes
// by exp2_fma.cuh instead of the MUFU's ex2.approx) and "attn_exp2_f16" (default 1: where P goes to
// e4m3 straight -- fp8, keys by parity, no LSE -- those exp2s run two at a time in f16x2,
// exp2_f16x2; 0: exp2_fma in f32) and "attn_lse_e4m3_sums" (fp8 with an LSE, default 0: the LSE
// from f32 sums of the scores' exp2s; 1: from the sums of the e4m3 P that O is divided by, as a
// merging variant's -- AttentionVariant::merge_into_output --, for the first part of a result
// that merging launches add to; the main loop is then the one without an LSE) and
// "attn_causal_hook" (0: a mask hook that keeps exactly kv <= q is lowered as the built-in causal
// mask; 1 keeps it a hook; default 0, except 1 for 16-bit inputs that also have a score hook) and
// "attn_group_mb" (causal-like masks: the L2 budget in MB for the K and V of the heads whose
// query tiles run longest first together, default 16 for fp8 and 8 for 16-bit inputs; 0: head by
// head) and "attn_linear_score" (default 1: a score hook linear in the score and the positions, such as
// ALiBi's, is formed from a term per key column and one per row, one FFMA per score element; 0
// calls the hook per element) and "attn_persistent" (kernels without hooks; default 0; 1: at most
// SMs x CTAs-per-SM CTAs, each looping over query tiles in the natural order, the program count a
// kernel parameter -- GeneratedKernel::persistent) and "attn_self_load" (block m 64 with attn_overlap =
// 0, a CTA per tile; default 0; 1: no producer warp, the consumer warpgroup issues its own K / V
// loads: 128 threads, three or four CTAs per SM where they fit); "fast_math" (default 0) as for the SIMT
// path: the hooks' per-element transcendentals as the GPU's approximations. Configs that match but cannot work throw tj::Error
// naming the limit.
//
// Launch: one CTA per program (persistent: one per resident CTA slot of every SM) of the DSL's
// launch nest [B*H][ceil(Sq/BM)] (program id =
// bh * m_tiles + m_tile, or for causal-like masks longest first over groups of heads:
// codegen/device/attn_tile_order.cuh), 128*(1 + consumers) threads (a producer warp: 128*consumers
// + 32; self-loading: 128), TMA maps for q, k and v (dims [B,H] folded into one so sequence tails zero-fill per
// head). Preconditions beyond the DSL's (documented in hopper_attention.cuh): 16-byte aligned
// rows (TMA; encode_tma reports violations), and for fp8 a finite pad in vt's columns
// [Skv, Skv_pad) (quantize_transpose_fp8 writes zeros).
#include <optional>

#include "codegen/cuda_emitter.h"
#include "dsl/kernel.h"

namespace tj::codegen {

// The host specialization `f` was traced with, when it is the attention_fp8 kernel.
struct AttentionMatch {
  bool causal = false;
  bool with_lse = false;
  bool score_mod = false;   // an attention variant's hooks (kernels/attention_variant.h)
  bool mask_mod = false;
  // AttentionVariant::merge_into_output: o and lse are read and merged into (with_lse too); fp8 row
  // sums are the e4m3 P's, as without an LSE.
  bool merging = false;
};
std::optional<AttentionMatch> match_attention_fp8(const ir::Function& f);

// The library kernels whose traced IR this lowering recognizes (attention_fp8 and its merging
// form): kernels/attention_fp8.cpp registers them at static initialization, so that the
// compiler does not depend on the library written in its language. Until then nothing matches.
void register_attention_reference(const Kernel& (*plain)(), const Kernel& (*merging)());

// The lowering itself (what the registry calls): empty when `f`, `cfg` or `t` do not fit.
std::optional<GeneratedKernel> lower_attention_sm90(const ir::Function& f, const Config& cfg, const Target& t);

}  // namespace tj::codegen
