#include "dsl/static_extents.h"

#include <algorithm>
#include <map>
#include <optional>

namespace tj::ir {

std::optional<int64_t> fold_binary(BinaryFn fn, int64_t a, int64_t b) {
  switch (fn) {
    case BinaryFn::add: return a + b;
    case BinaryFn::sub: return a - b;
    case BinaryFn::mul: return a * b;
    case BinaryFn::div: return b == 0 ? std::nullopt : std::optional<int64_t>(a / b);
    case BinaryFn::floordiv: {
      if (b == 0) return std::nullopt;
      int64_t q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
      return q;
    }
    case BinaryFn::mod: {
      if (b == 0) return std::nullopt;
      int64_t r = a % b;
      if (r != 0 && ((r < 0) != (b < 0))) r += b;
      return r;
    }
    case BinaryFn::maximum: return std::max(a, b);
    case BinaryFn::minimum: return std::min(a, b);
    default: return std::nullopt;
  }
}

std::vector<int64_t> constant_block_extents(const Function& f) {
  std::vector<int64_t> extents(f.blocks.size(), -1);
  std::map<int, int64_t> known;
  walk(f.body, [&](const Op& op, int) {
    auto get = [&](int v) -> std::optional<int64_t> {
      auto it = known.find(v);
      if (it == known.end()) return std::nullopt;
      return it->second;
    };
    switch (op.kind) {
      case OpKind::const_value:
        if (op.result >= 0 && is_int(f.type(op.result).dtype)) known[op.result] = op.ival;
        break;
      case OpKind::tensor_dim: {
        const auto& p = f.params.at(op.param);
        if (op.axis >= 0 && op.axis < p.rank() && p.static_shape[op.axis] >= 0) known[op.result] = p.static_shape[op.axis];
        break;
      }
      case OpKind::block_size:
        if (f.blocks.at(op.block_id).fixed > 0) known[op.result] = f.blocks[op.block_id].fixed;
        break;
      case OpKind::binary:
        if (op.result >= 0 && op.operands.size() == 2 && is_int(f.type(op.result).dtype)) {
          auto a = get(op.operands[0]), b = get(op.operands[1]);
          if (a && b)
            if (auto r = fold_binary(op.binary, *a, *b)) known[op.result] = *r;
        }
        break;
      case OpKind::loop:
        if (op.loop_kind == LoopKind::tile && op.block_id >= 0 && op.operands.size() >= 2) {
          auto b = get(op.operands[0]), e = get(op.operands[1]);
          int64_t& slot = extents.at(op.block_id);
          if (b && e) {
            if (slot != -2) slot = std::max(slot, *e - *b);
          } else {
            slot = -2;   // some loop over this block has a run-time extent
          }
        }
        break;
      default: break;
    }
  });
  for (auto& e : extents)
    if (e < 0) e = -1;
  return extents;
}


std::vector<bool> blocks_in_2d_tiles(const Function& f) {
  std::vector<bool> out(f.blocks.size(), false);
  for (const auto& v : f.values) {
    if (v.type.rank() < 2) continue;
    for (const Dim& d : v.type.shape)
      if (d.is_block() && d.value >= 0 && static_cast<size_t>(d.value) < out.size()) out[d.value] = true;
  }
  return out;
}

}  // namespace tj::ir
