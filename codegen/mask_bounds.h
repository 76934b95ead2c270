#pragma once
// Loop bounds from masks (one pass): a tile loop inside a program that masks a tile with
// `where(mask, s, -inf)` and whose iteration changes nothing where that mask fails on the whole
// tile runs only over the tiles the mask may keep.
//
//   for m in tile(begin, end, B):        // the dK / dV kernel of a sliding window's backward
//     s = where(kv <= q && q - kv < W, dot(k, q^T) * scale, -inf)
//     p = exp2(s - lse)                   // 0 where masked
//     dv += dot(p, do); dk += dot(p * (dot(v, do^T) - delta), q)
//
// becomes the same loop over [begin', end'): the first and the last tile that the mask does not
// rule out entirely, from interval arithmetic on the mask's index comparisons (q over the tile's
// rows [m, m + B - 1]), solved for the loop index in closed form. Each kept tile is one of the
// original tiles (begin' = begin + k B; end' the end of a kept tile, or end), so every row is
// computed as before, and the emitter's pipelines, producer warp and range analysis see an
// ordinary loop with other bounds. The masks it can read: comparisons (<, <=, >, >=, ==, !=) of
// integer tiles built from tile positions (`m.index()`), the loop index, scalars defined outside
// the loop (or inputs it loads at such indices: a prefix length, a document boundary) and
// constants by +, -, * by a constant and floordiv by a positive constant (segments: q / 2048 ==
// kv / 2048; floordiv(P, c) < y is P < c y), combined by &&, ||, ! and == / != of booleans
// (documents: (q < boundary) == (kv < boundary)); a mask that gathers per element (a block mask)
// bounds nothing here. Tiles between the bounds that the mask rules out are still computed.
//
// "Changes nothing" is proven on the loop body, with the masked tile all -inf: exp2 / exp of it
// is 0; 0 times, plus, or as a dot operand leaves the other side; max(x, -inf) = x; x - x = 0 and
// exp2(0) = 1 for a variable's value (an online softmax's running max); every loop-carried
// variable must be written back its own value, and the only writes to memory atomic adds of 0.
// Like FlashAttention's block skipping this treats the values the mask does not touch as finite
// (0 * x = 0): an iteration that would only turn them into NaN (an infinite dP, a running max of
// -inf minus itself) is skipped as if they were finite.
#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen {

// A copy of `f` with such loops bounded (block sizes from `c`); `bounded`, when given, counts the
// loops whose bounds changed. The CUDA emitter applies it first (knob mask_bounds).
ir::Function bound_masked_loops(const ir::Function& f, const Config& c, int* bounded = nullptr);

}  // namespace tj::codegen
