#pragma once
// tilejit device library: which (b·h, query tile) a program of the attention launch computes.
// Usable on the host too (tests check that every order is a bijection onto the tiles).
//
// The launch has one program per (bh, m_tile), bh in [0, B·H), m_tile in [0, m_tiles). SMs take
// programs in id order, so the order decides how the grid ends:
//   natural      : bh-major, query tiles ascending (every tile equally long: no mask, or a mask
//                  whose work does not grow with the query position);
//   longest first: causal-like masks give later query tiles more keys. Head by head (group = 1),
//                  bh-major with the tiles descending: the last heads' longest tiles then start
//                  near the end of the grid and run on while the other SMs idle. Over a group of
//                  heads (group > 1): the group's last tiles of every head first, then the tiles
//                  before them, heads fastest, so every SM takes a long tile before any takes a
//                  short one; the group is as many heads as keep their K and V in L2 together.

#include "fp8.cuh"   // TJ_HD

namespace tj {
namespace dev {

struct AttnTile {
  int bh;
  int m_tile;
};

// 32-bit arithmetic throughout (a launch has fewer than 2^31 programs): a 64-bit division is a
// slow-path call of some 70 instructions, and every CTA runs this before its first load (H100:
// four of them cost the short CTAs of fp8 block masks 4-5%).
TJ_HD AttnTile attn_tile_natural(unsigned pid, unsigned m_tiles) {
  const unsigned bh = pid / m_tiles;
  return AttnTile{(int)bh, (int)(pid - bh * m_tiles)};
}

// group: heads whose tiles interleave (clamped to [1, bh_count]); 1 is head by head.
TJ_HD AttnTile attn_tile_longest_first(unsigned pid, unsigned m_tiles, unsigned bh_count, unsigned group) {
  group = group < 1u ? 1u : group > bh_count ? bh_count : group;
  const unsigned first_bh = pid / (group * m_tiles) * group;
  const unsigned in_group = pid - first_bh * m_tiles;
  const unsigned size = bh_count - first_bh < group ? bh_count - first_bh : group;   // the last may be short
  const unsigned rank = in_group / size;   // 0: the group's longest tiles
  return AttnTile{(int)(first_bh + (in_group - rank * size)), (int)(m_tiles - 1u - rank)};
}

// Persistent blocks over the longest-first order: blocks 0 .. R-1 take the programs in rounds of R
// (pid = round * R + block), every other round backwards (attn_round_pid), so that a block that
// took a round's longest program takes the next round's shortest. That pairs long with short only
// where the rounds follow the order's period, the programs of a group of heads (group_programs):
// R is a multiple of it or a divisor of it, the largest such R up to the blocks launched, where
// that keeps at least 3/4 of them busy; else all of them (unpaired).
TJ_HD unsigned attn_rounds(unsigned group_programs, unsigned blocks) {
  if (group_programs == 0u || blocks == 0u) return blocks;
  unsigned r = 0u;
  if (group_programs <= blocks) {
    r = blocks / group_programs * group_programs;
  } else {
    for (unsigned d = blocks; d >= 1u; --d)
      if (group_programs % d == 0u) {
        r = d;
        break;
      }
  }
  return 4u * r >= 3u * blocks ? r : blocks;
}
// Program `pid` of block `block` in rounds of `rounds` programs (of `total`), every odd round
// reversed (the last one, short, within itself).
TJ_HD unsigned attn_round_pid(unsigned pid, unsigned block, unsigned rounds, unsigned total) {
  const unsigned first = pid - block;   // this round's first program
  if ((pid / rounds) % 2u == 0u) return pid;
  const unsigned n = total - first < rounds ? total - first : rounds;
  return first + n - 1u - block;
}

// The heads per group for an L2 budget (KB, at most 4096 MB; the K and V of one kv head in KB,
// rounded up): query heads that share a kv head (GQA) share its K and V. heads_per_kv is capped
// at 1023, so that the product stays within 32 bits.
TJ_HD unsigned attn_tile_group(unsigned budget_kb, unsigned kv_head_kb, unsigned heads_per_kv) {
  heads_per_kv = heads_per_kv < 1u ? 1u : heads_per_kv > 1023u ? 1023u : heads_per_kv;
  const unsigned g = budget_kb * heads_per_kv / (kv_head_kb > 0u ? kv_head_kb : 1u);
  return g < 1u ? 1u : g;
}

}  // namespace dev
}  // namespace tj
