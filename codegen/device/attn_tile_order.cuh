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

TJ_HD AttnTile attn_tile_natural(long long pid, long long m_tiles) {
  const long long bh = pid / m_tiles;
  return AttnTile{(int)bh, (int)(pid - bh * m_tiles)};
}

// group: heads whose tiles interleave (clamped to [1, bh_count]); 1 is head by head.
TJ_HD AttnTile attn_tile_longest_first(long long pid, long long m_tiles, long long bh_count,
                                              long long group) {
  group = group < 1 ? 1 : group > bh_count ? bh_count : group;
  const long long first_bh = pid / (group * m_tiles) * group;
  const long long in_group = pid - first_bh * m_tiles;
  const long long size = bh_count - first_bh < group ? bh_count - first_bh : group;   // the last may be short
  const long long rank = in_group / size;   // 0: the group's longest tiles
  return AttnTile{(int)(first_bh + (in_group - rank * size)), (int)(m_tiles - 1 - rank)};
}

// The heads per group for an L2 budget: query heads that share a kv head (GQA) share its K and V.
TJ_HD long long attn_tile_group(long long budget_bytes, long long kv_head_bytes, long long heads_per_kv) {
  const long long g = budget_bytes * (heads_per_kv > 0 ? heads_per_kv : 1) / (kv_head_bytes > 0 ? kv_head_bytes : 1);
  return g < 1 ? 1 : g;
}

}  // namespace dev
}  // namespace tj
