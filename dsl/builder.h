#pragma once
// The trace builder: while a kernel body runs, DSL calls append ops to the innermost open
// region of the Function being built. One builder is active per thread at a time.
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "dsl/error.h"
#include "dsl/ir.h"

namespace tj::dsl {

ir::SourceLoc to_loc(const std::source_location& l);

class Builder {
 public:
  explicit Builder(ir::Function& f);
  ~Builder();
  Builder(const Builder&) = delete;
  Builder& operator=(const Builder&) = delete;

  // The active builder; throws a DslError at `loc` when no kernel is being traced.
  static Builder& current(const ir::SourceLoc& loc);
  static bool active();

  ir::Function& function() { return f_; }
  const TileType& type(int value) const { return f_.type(value); }

  // Appends `op` to the innermost open region. With a `result_type`, creates the result
  // value and returns its id; otherwise returns -1.
  int emit(ir::Op op, std::optional<TileType> result_type = std::nullopt, bool is_var = false);

  // Opens a loop op; its body stays the insertion point until close_loop().
  // Returns the id of the loop index value inside the body.
  int open_loop(ir::LoopKind kind, int begin, int end, int block_id, const ir::SourceLoc& loc);
  void close_loop();
  int open_loops() const { return static_cast<int>(regions_.size()) - 1; }

  // Checks that `value` may be used here: defined in this region or an enclosing one.
  void check_visible(int value, const ir::SourceLoc& loc) const;

  // Constant folding support: the value of a scalar constant, if it is one.
  std::optional<double> constant(int value) const;
  int constant_value(double v, DType t, const ir::SourceLoc& loc);

  int new_block(std::string name, int64_t fixed, const ir::SourceLoc& loc);
  // The loop begin/end values of the tile loop that owns `block_id`, while it is open.
  struct BlockScope { int begin = -1; int end = -1; bool open = false; };
  const BlockScope& block_scope(int block_id) const { return block_scopes_.at(block_id); }

  // Ops emitted while a tag is pushed carry it (ir::Op::tag); tags nest, the innermost wins.
  void push_tag(std::string tag) { tags_.push_back(std::move(tag)); }
  void pop_tag() { tags_.pop_back(); }

  const ir::SourceLoc& last_loc() const { return last_loc_; }
  // Where the op that defined `value` was traced (the last op's location if unknown).
  const ir::SourceLoc& loc_of(int value) const;

 private:
  ir::Function& f_;
  std::vector<ir::Region*> regions_;
  std::vector<int> region_ids_;
  std::vector<std::optional<double>> constants_;  // by value id
  std::vector<ir::SourceLoc> value_locs_;         // by value id
  std::vector<BlockScope> block_scopes_;
  std::vector<int> loop_blocks_;                  // block id per open loop (-1 for grid)
  ir::SourceLoc last_loc_;
  std::vector<std::string> tags_;
  Builder* previous_ = nullptr;
};

}  // namespace tj::dsl
