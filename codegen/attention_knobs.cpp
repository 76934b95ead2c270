#include "codegen/attention_knobs.h"

#include "codegen/emitter_knobs.h"

namespace tj::codegen::knobs {

const KnobSpec attn_overlap{"attn_overlap", 1, "1", "FA3's intra-warpgroup overlap of the softmax and P.V"};
const KnobSpec attn_wgsync{"attn_wgsync", 0, "0", "1: FA3's inter-warpgroup schedule, 2 or 3 consumers taking turns"};
const KnobSpec attn_block_skip{"attn_block_skip", 1, "1",
                               "0 masks every element of every key block instead of skipping the blocks a mask rules out"};
const KnobSpec attn_vperm{"attn_vperm", 0, "1 with 2+ consumers where K is not loaded by parity (fp8), else 0",
                          "the producer's spare warps permute V's keys in shared memory (fp8)"};
const KnobSpec attn_linear_score{"attn_linear_score", 1, "1",
                                 "a score hook linear in the score and the positions is formed per key column and per row"};
const KnobSpec attn_keys_by_parity{"attn_keys_by_parity", 1,
                                   "1 for fp8; 0 with attn_vperm or a linear score hook on three consumers",
                                   "K's stages hold a block's even keys, then its odd keys, so P packs without shuffles (fp8)"};
const KnobSpec attn_exp2_fma{"attn_exp2_fma", 0, "0", "of every 8 score exp2s, how many run on the FMA pipes (0 to 8)"};
const KnobSpec attn_exp2_f16{"attn_exp2_f16", 1, "1",
                             "those exp2s two at a time in f16x2 where P goes to e4m3 straight (fp8, keys by parity, no LSE)"};
const KnobSpec attn_lse_e4m3_sums{"attn_lse_e4m3_sums", 0, "0", "1: the LSE from the sums of the e4m3 P that O is divided by"};
const KnobSpec attn_rescale_vote{"attn_rescale_vote", 1, "1", "a warp skips O's rescale where all its alphas are 1"};
const KnobSpec attn_self_load{"attn_self_load", 0, "0",
                              "1: no producer warp; the consumer warpgroup issues its own K / V loads (one consumer)"};
const KnobSpec attn_lean_producer{"attn_lean_producer", 0, "0", "1: a producer warp instead of a producer warpgroup"};
const KnobSpec attn_persistent{"attn_persistent", 0, "0", "1: CTAs loop over query tiles (kernels without hooks)"};
const KnobSpec attn_causal_hook{"attn_causal_hook", 0, "0; 1 for 16-bit inputs that also have a score hook",
                                "1 keeps a mask hook of exactly kv <= q a hook instead of the built-in causal mask"};
const KnobSpec attn_reverse_tiles{"attn_reverse_tiles", 1, "1", "with a mask hook: the query tiles run last to first"};
const KnobSpec attn_group_mb{"attn_group_mb", 16, "16 for fp8, 8 for 16-bit",
                            "causal-like masks: the L2 budget in MB for the K and V of heads whose tiles run longest first "
                            "together (0: head by head)"};

namespace {
const bool registered = register_knob_table(
    "sm90_attention", {&attn_overlap, &attn_wgsync, &attn_block_skip, &attn_vperm, &attn_linear_score, &attn_keys_by_parity,
                       &attn_exp2_fma, &attn_exp2_f16, &attn_lse_e4m3_sums, &attn_rescale_vote, &attn_self_load,
                       &attn_lean_producer, &attn_persistent, &attn_causal_hook, &attn_reverse_tiles, &attn_group_mb,
                       &fast_math});
}  // namespace

}  // namespace tj::codegen::knobs
