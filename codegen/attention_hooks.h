#pragma once
// Attention variants' hooks (kernels/attention_variant.h) inside a traced kernel: finding them
// (the ops tagged "score_mod" / "mask_mod") and writing them as the device struct the sm_90a
// attention main loop calls (NoHooks in codegen/device/hopper_attention.cuh documents it).
//
// Splitting: the tagged ops must sit together in one region and form a chain the rest of the
// kernel sees as one value: they read the score s (f32 [m, n]) plus scalars and positions, and
// the kernel reads only their final score. Removing them and using s in its place gives the
// skeleton, which a lowering compares with its library kernel. Extra tensor parameters (the
// variant's inputs) may be read only by tagged ops; the skeleton drops them.
//
// Writing: scalar ops (rank 0: loads of an input at scalar indices, dims, arithmetic on b and h)
// run once per CTA and become fields; tile gathers read the input per element (the tensor is a
// field) and, for block classification, over the box of indices a key block spans (a range
// query, interval.cuh iv_gather); other tile ops run per score element with the element's
// position (q, kv); the mask's ops also run once per key block as interval arithmetic
// (codegen/device/interval.cuh) to classify the block.
#include <optional>
#include <string>
#include <vector>

#include "dsl/ir.h"

namespace tj::codegen {

struct AttentionHooks {
  ir::Function skeleton;               // the kernel without its hooks (and their extra params)
  bool score_mod = false, mask_mod = false;
  int score_in = -1;                   // value ids in the hooked function: the score the hooks get,
  int score_out = -1;                  // score_mod's result (-1 without one),
  int keep = -1;                       // mask_mod's boolean (-1 without one),
  int result = -1;                     // and the score the kernel goes on with
  int assumed_true = -1;               // a mask value the lowering enforces itself (the causal
                                       // conjunct): the written hooks take it as true
  int causal_prefix = -1;              // a scalar the lowering's causal mask also keeps every key
                                       // below (causal_prefix()): the written hooks return it from
                                       // causal_prefix(), 0 without one
  std::vector<const ir::Op*> ops;      // the tagged ops, in trace order (point into the function)
};

// The hooks of `f`; nullopt when `f` has no tagged ops or (with *why set) when they do not have
// the shape above.
std::optional<AttentionHooks> split_attention_hooks(const ir::Function& f, std::string* why);

// Values of the skeleton the hook code may read besides the score (ids in the hooked function).
struct HookSymbols {
  int b = -1, h = -1;                  // batch and query head (i64 scalars)
  int m_start = -1, n_start = -1;      // starts of the query and key tiles (tile loop indices)
};

// The mask hook's causal conjunct: its comparison kv <= q (or q >= kv), the kernel's own top-left
// causal mask, when the hook keeps exactly that (the id is h.keep) or that and the rest (keep =
// rest && kv <= q, through ands and broadcasts); -1 otherwise. A lowering may then mask and skip
// as its built-in causal kernel does and keep only the rest as a hook (assumed_true = the id).
int causal_conjunct(const AttentionHooks& h, const HookSymbols& sym);

// The mask hook as a causal mask with a prefix every query sees (prefix-LM): keep is exactly
// kv <= q || kv < E (either order, E > kv too), E a scalar (the same over a CTA: a function of b,
// h, the kernel's inputs). Returns E's id (before broadcasts), -1 otherwise. A lowering may then
// drop the mask hook and bound every row by max(q, E - 1) as its causal kernel bounds it by q: one
// comparison per element on the diagonal blocks, no block table (AttentionHooks::causal_prefix).
int causal_prefix(const ir::Function& f, const AttentionHooks& h, const HookSymbols& sym);

struct HooksSource {
  std::string decl;                    // `struct <type> { ... };`
  std::string init;                    // statements setting up `<var>` in the kernel body, given
                                       // the variables tj_b and tj_h (long long)
};
// How hooks_source writes the hooks: skip_blocks (the mask classifies key blocks; false: keep()
// on every element), linear_score (a score hook that score_hook_is_linear accepts is also written
// as its four coefficients, kLinearScore, which the main loop then uses instead of score()),
// fast_math (per-element exp2 / log2 / exp / log / sqrt / tanh as the GPU's approximations, as the
// "fast_math" config knob does for the SIMT path; tanh.approx.f32 for a softcap's tanh).
struct HookOptions {
  bool skip_blocks = true;
  bool linear_score = true;
  bool fast_math = false;
};

// The device struct for `h`; nullopt (with *why) when an op cannot be written per element /
// per block. Kernel parameters are spelled p0, p1, ... (TensorArg<R> / float).
std::optional<HooksSource> hooks_source(const ir::Function& f, const AttentionHooks& h, const HookSymbols& sym,
                                        const std::string& type, const std::string& var, const HookOptions& options,
                                        std::string* why);

// Whether h's score hook is d * s + a * kv + b * q + g with d, a, b, g the same over a CTA (a
// function of b, h and the kernel's scalars): ALiBi's s + slope_h * (kv - q), a temperature, a
// linear position bias. Such a score costs one FFMA per element: the key term is formed once per
// key column and block, the query term once per row.
bool score_hook_is_linear(const ir::Function& f, const AttentionHooks& h, const HookSymbols& sym);

}  // namespace tj::codegen
