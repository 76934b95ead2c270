#include "codegen/simt_config.h"

#include <algorithm>
#include <map>
#include <set>

#include "codegen/emitter_knobs.h"
#include "dsl/static_extents.h"

namespace tj::codegen {

namespace {

// Kernels that reduce take whole rows of up to 4096 elements (kReduceBlock) in one trip: the row
// stays in registers between its passes (Emitter::single_trip). Their warps: enough that a thread
// holds at most kPerThread elements of all the row tiles the kernel loads (softmax: x; RMSNorm:
// x and w; LayerNorm: x, w and b), 2 to 8: registers per row decide how many rows an SM keeps in
// flight. H200, bf16 [16384, 4096], same run, ms (blocks c, warps w): softmax c1024 w2 0.0934,
// c2048 w4 0.0908, c4096 w4 0.0722, c4096 w8 0.0809; RMSNorm 0.0810, 0.0781, 0.0789, 0.0775;
// LayerNorm 0.1040, 0.0951, 0.1008, 0.0961. Kernels that only map (an add) take blocks of 1024
// on 4 warps: a copy's speed.
// Later passes with tensors of their own: LayerNorm's normalizing pass with its w and b in trips of 1024 (x read again, from
// L2) instead of the whole row held from the sums' pass: H200, bf16 [16384, 4096], the tuner's
// full search (same run): c4096 c2 1024 w4 0.0773-0.0798 ms, the whole row on 8 warps 0.0907.
constexpr int64_t kBlock = 1024;
constexpr int64_t kReduceBlock = 4096;
constexpr int64_t kPerThread = 32;

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

std::optional<Config> simt_streaming_config(const ir::Function& f) {
  for (const auto& v : f.values)
    if (v.type.rank() >= 2) return std::nullopt;
  int widest = 0;   // bytes of the widest element a load or store moves
  bool has_dot = false, reduces = false;
  std::map<int, std::set<int>> row_tiles;   // block id -> the In tensors loaded as tiles of it
  std::set<int> seen;                       // In tensors loaded as tiles so far (program order)
  std::set<int> late;                       // later blocks whose tiles load an In tensor no earlier one loaded
  int first_block = -1;                     // the block of the first tile load
  ir::walk(f.body, [&](const ir::Op& op, int) {
    has_dot |= op.kind == ir::OpKind::dot;
    reduces |= op.kind == ir::OpKind::reduce;
    if ((op.kind == ir::OpKind::load || ir::is_store(op.kind)) && op.param >= 0)
      widest = std::max(widest, size_bytes(f.params.at(op.param).dtype));
    if (op.kind != ir::OpKind::load || f.params.at(op.param).kind != ir::ParamKind::tensor_in) return;
    for (const ir::Index& i : op.indices) {
      if (i.kind != ir::Index::Kind::block) continue;
      if (first_block < 0) first_block = i.block_id;
      if (!seen.count(op.param) && i.block_id != first_block) late.insert(i.block_id);
      row_tiles[i.block_id].insert(op.param);
      seen.insert(op.param);
      break;
    }
  });
  if (has_dot) return std::nullopt;

  Config c = default_config(f);
  if (c.blocks.empty()) return std::nullopt;
  const std::vector<int64_t> extents = ir::constant_block_extents(f);
  const int64_t cap = reduces ? kReduceBlock : kBlock;
  int64_t narrowest = cap, held = 1;   // held: elements of the row tiles one trip of a loop loads
  for (size_t i = 0; i < f.blocks.size(); ++i) {
    if (f.blocks[i].fixed > 0) continue;
    // A later pass that brings in tensors of its own (LayerNorm's w and b) walks the row in trips
    // of kBlock: holding them with the row costs more rows in flight than reading the row again
    // from L2 costs (measured above).
    const int64_t limit = late.count(static_cast<int>(i)) ? kBlock : cap;
    const int64_t size = extents[i] > 0 ? std::min(limit, pow2_ceil(extents[i])) : kBlock;
    c.blocks[f.blocks[i].name] = size;
    narrowest = std::min(narrowest, size);
    auto it = row_tiles.find(static_cast<int>(i));
    const int64_t tiles = it == row_tiles.end() ? 1 : static_cast<int64_t>(it->second.size());
    held = std::max(held, size * pow2_ceil(tiles));
  }
  c.num_warps = reduces ? static_cast<int>(std::clamp<int64_t>(held / (32 * kPerThread), 2, 8)) : 4;
  while (c.num_warps > 1 && c.num_warps * 32 > narrowest) c.num_warps /= 2;
  const int64_t per_thread = std::max<int64_t>(1, narrowest / (c.num_warps * 32));
  const int64_t vec = std::min<int64_t>(widest > 0 ? std::max(1, 16 / widest) : 1, per_thread);
  if (vec > 1) c.knobs[knobs::simt_vec.name] = vec;
  return c;
}

}  // namespace tj::codegen
