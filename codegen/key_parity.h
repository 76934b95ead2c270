#pragma once
// Keys by parity: an fp8 chained dot's register A operand without shuffles.
//
// An fp8 A operand from registers (wgmma's register A, mma.sync's A fragments) holds 4
// consecutive K positions per register (4q .. 4q + 3 of each 16, q the lane's place in its
// quad), while the accumulator layout gives a thread its columns in pairs 8 apart (2q, 2q + 1,
// 8 + 2q, ...). Converting P = f(S) of attention's S = Q.K^T into P.V's A fragments in that
// layout moves bytes across each quad (2 shuffles per 32 columns and row half). With K's rows
// staged even rows first, then odd ones, the accumulator's column c holds key
// keys_by_parity_col(c, N) (codegen/device/frag.cuh), and a thread's registers hold keys
// 16 j + 4q .. + 3: its own bytes are the fragments (FlashAttention-3's permutation, here in
// K's rows, applied by TMA as it loads them, instead of in V's bytes).
//
// The pass pairs a dot D2 whose a operand goes in from the accumulator layout as fp8 (and whose
// b is not already in P's fragment order, a transposed copy with permute_k) with the dot D1
// whose result that operand is computed from. It applies when every value tied to D1's result
// column for column -- through elementwise ops, variables, broadcasts and column slices (index
// tiles, reductions over the rows, loaded vectors) -- is a register tile in the accumulator
// layout with D2's k columns, none of them is stored, transposed or read by a dot other than as
// D2's a, D1 is the only dot among them, and D1's b operand is staged K-major (its rows are
// D1's columns) for D1 alone. Then those values' layouts hold their columns by parity
// (Layout::by_parity, device Mma<.., 1>) and D1's b operand is staged rows_by_parity (two TMA
// boxes with a traversal stride of 2 rows, in a tensor map of its own; mma.sync: the copy's row
// map). Nothing else changes: every tile function reads an element's coordinates through its
// layout (coord_c), so masks, index tiles, loads and reductions see each register's true key.
//
// Knob key_parity (default 1); 0 leaves the order alone.
#include "codegen/layout.h"
#include "codegen/mma_plan.h"
#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen {

// After finish_mma_plan (the fragment operands are known). Returns how many dots' scores it
// put in parity order.
int order_keys_by_parity(const ir::Function& f, const Config& cfg, MmaPlan& mma, LayoutPlan& layouts);

}  // namespace tj::codegen
