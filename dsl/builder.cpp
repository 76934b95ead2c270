#include "dsl/builder.h"

#include <fmt/format.h>

#include "core/numerics.h"

namespace tj::dsl {

namespace {
thread_local Builder* g_current = nullptr;
}

ir::SourceLoc to_loc(const std::source_location& l) {
  return ir::SourceLoc{l.file_name(), static_cast<int>(l.line()), static_cast<int>(l.column()), l.function_name()};
}

Builder::Builder(ir::Function& f) : f_(f), previous_(g_current) {
  regions_.push_back(&f_.body);
  region_ids_.push_back(0);
  f_.body.id = 0;
  g_current = this;
}

Builder::~Builder() { g_current = previous_; }

Builder& Builder::current(const ir::SourceLoc& loc) {
  if (!g_current)
    throw DslError(loc, "tilejit operations can only be used inside a kernel body while it is traced");
  return *g_current;
}

bool Builder::active() { return g_current != nullptr; }

int Builder::emit(ir::Op op, std::optional<TileType> result_type, bool is_var) {
  if (op.loc.known()) last_loc_ = op.loc;
  if (!tags_.empty() && op.tag.empty()) op.tag = tags_.back();
  for (int v : op.operands) check_visible(v, op.loc);
  if (result_type) {
    op.result = static_cast<int>(f_.values.size());
    f_.values.push_back(ir::ValueInfo{*result_type, is_var, region_ids_.back()});
    value_locs_.push_back(op.loc);
    constants_.push_back(op.kind == ir::OpKind::const_value
                             ? std::optional<double>(is_int(result_type->dtype) ? double(op.ival) : op.fval)
                             : std::nullopt);
  }
  int result = op.result;
  regions_.back()->ops.push_back(std::move(op));
  return result;
}

int Builder::open_loop(ir::LoopKind kind, int begin, int end, int block_id, const ir::SourceLoc& loc) {
  ir::Op op;
  op.kind = ir::OpKind::loop;
  op.loop_kind = kind;
  op.operands = {begin, end};
  op.block_id = block_id;
  op.loc = loc;
  op.body = std::make_unique<ir::Region>();
  op.body->id = f_.num_regions++;
  ir::Region* body = op.body.get();
  emit(std::move(op));
  ir::Op& placed = regions_.back()->ops.back();
  regions_.push_back(body);
  region_ids_.push_back(body->id);
  // The loop index is a value of the body region (grid: the index; tile: the tile start).
  placed.body_index = static_cast<int>(f_.values.size());
  f_.values.push_back(ir::ValueInfo{TileType{DType::i64, {}}, false, body->id});
  constants_.push_back(std::nullopt);
  value_locs_.push_back(loc);
  loop_blocks_.push_back(block_id);
  if (block_id >= 0) block_scopes_.at(block_id) = BlockScope{placed.body_index, end, true};
  return placed.body_index;
}

void Builder::close_loop() {
  if (regions_.size() <= 1) return;
  int block_id = loop_blocks_.back();
  if (block_id >= 0) block_scopes_.at(block_id).open = false;
  loop_blocks_.pop_back();
  regions_.pop_back();
  region_ids_.pop_back();
}

void Builder::check_visible(int value, const ir::SourceLoc& loc) const {
  if (value < 0 || value >= static_cast<int>(f_.values.size()))
    throw DslError(loc, "use of a tile handle that holds no value (was it default-constructed?)");
  int region = f_.values[value].defining_region;
  for (int id : region_ids_)
    if (id == region) return;
  throw DslError(loc,
                 "this value was computed inside a loop that has ended; state that a loop updates must be a "
                 "tj::Var declared before the loop");
}

std::optional<double> Builder::constant(int value) const {
  if (value < 0 || value >= static_cast<int>(constants_.size())) return std::nullopt;
  return constants_[value];
}

int Builder::constant_value(double v, DType t, const ir::SourceLoc& loc) {
  // Constants hold exactly what the element type can: folded arithmetic rounds like the op.
  if (t == DType::i1) v = v != 0;
  else if (t == DType::i32) v = static_cast<double>(static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(v))));
  else if (t == DType::i64) v = static_cast<double>(static_cast<int64_t>(v));
  else v = numerics::round_double_to(t, v);
  ir::Op op;
  op.kind = ir::OpKind::const_value;
  op.loc = loc;
  op.ival = is_float(t) ? 0 : static_cast<int64_t>(v);
  op.fval = v;
  return emit(std::move(op), TileType{t, {}});
}

const ir::SourceLoc& Builder::loc_of(int value) const {
  if (value >= 0 && value < static_cast<int>(value_locs_.size()) && value_locs_[value].known()) return value_locs_[value];
  return last_loc_;
}

int Builder::new_block(std::string name, int64_t fixed, const ir::SourceLoc& loc) {
  int id = static_cast<int>(f_.blocks.size());
  if (name.empty()) name = fmt::format("block_{}", id);
  for (const auto& b : f_.blocks)
    if (b.name == name) throw DslError(loc, fmt::format("two tile loops are named '{}'", name));
  f_.blocks.push_back(ir::BlockSymbol{std::move(name), fixed, loc});
  block_scopes_.push_back({});
  return id;
}

}  // namespace tj::dsl
