#pragma once
// The sm_90a attention lowering's knobs (codegen/lower_attention_sm90.h says what each changes in
// the main loop): one table, read by the lowering and by the library's default configs.
#include "codegen/knob.h"

namespace tj::codegen::knobs {

extern const KnobSpec attn_overlap;
extern const KnobSpec attn_wgsync;
extern const KnobSpec attn_block_skip;
extern const KnobSpec attn_vperm;
extern const KnobSpec attn_linear_score;
extern const KnobSpec attn_keys_by_parity;
extern const KnobSpec attn_exp2_fma;
extern const KnobSpec attn_exp2_f16;
extern const KnobSpec attn_lse_e4m3_sums;
extern const KnobSpec attn_rescale_vote;
extern const KnobSpec attn_self_load;
extern const KnobSpec attn_lean_producer;
extern const KnobSpec attn_persistent;
extern const KnobSpec attn_causal_hook;
extern const KnobSpec attn_reverse_tiles;
extern const KnobSpec attn_group_mb;

}  // namespace tj::codegen::knobs
