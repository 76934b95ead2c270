#pragma once
// The configuration space of one traced kernel: which Config fields the tuner varies and
// the legal values of each.
//
// Derived from the IR (derive_space):
//   - one dimension per tunable tile-loop block (blocks fixed with tile(n, size) are left
//     out): powers of two from 16 up to the loop's extent rounded up to a power of two
//     (when the extent is a compile-time constant), at most 256 when the block sizes a
//     rank-2 tile and 1024 when it only ever sizes rank-1 tiles (elementwise kernels), and
//     the value of the lowering's untuned config (untuned_config) where it is none of those (even
//     above the cap: a streaming kernel's whole row);
//   - num_warps: {2, 4, 8};
//   - num_stages: {1, 2, 3, 4} when the kernel has a loop inside a program that loads from
//     memory (something to pipeline), else fixed at the default;
//   - every knob a lowering declares (codegen/lowering.h) for the kernel and target (a lowering
//     registers e.g. "warp_specialize" {0, 1}, "cluster" {1, 2}, "raster_group" {1, 4, 8}).
// Config stays the single carrier: knobs land in Config::knobs, and a knob at its fallback
// value is left out of the Config, so the default point prints as the default config.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "codegen/lowering.h"
#include "dsl/config.h"
#include "dsl/ir.h"
#include "dsl/static_extents.h"

namespace tj::autotune {

// Knobs and untuned configs come from the lowerings (codegen/lowering.h).
using codegen::Knob;
using codegen::registered_knobs;
using codegen::untuned_config;
namespace knob_names = codegen::knob_names;

// One axis of the space.
struct Dimension {
  enum class Kind : uint8_t { block, num_warps, num_stages, knob };
  Kind kind = Kind::knob;
  std::string name;                // block name, "num_warps", "num_stages" or the knob's name
  std::vector<int64_t> values;     // legal values, in search order (ascending for sizes)
  int64_t fallback = 0;            // knobs: the value that is left out of Config::knobs
};

// A point of the space: an index into Dimension::values per dimension.
using Point = std::vector<int>;

class ConfigSpace {
 public:
  ConfigSpace() = default;
  ConfigSpace(Config base, std::vector<Dimension> dims) : base_(std::move(base)), dims_(std::move(dims)) {}

  const std::vector<Dimension>& dims() const { return dims_; }
  const Config& base() const { return base_; }
  // Number of values per dimension, and the number of points (saturates at UINT64_MAX).
  std::vector<int> sizes() const;
  uint64_t size() const;

  // The config at `p`: base() with each dimension's value applied.
  Config config_at(const Point& p) const;
  // The point nearest to `c` (per dimension, the closest value; knobs not set count as
  // their fallback).
  Point point_of(const Config& c) const;
  // Whether `c` is exactly a point of the space.
  bool contains(const Config& c) const;
  // "block m {16..256} x num_warps {2,4,8} x ... = 300 points"
  std::string describe() const;

 private:
  Config base_;
  std::vector<Dimension> dims_;
};

struct SpaceOptions {
  std::string arch = "sm_90a";                 // for knob providers
  int64_t min_block = 16;
  int64_t max_block_2d = 256;                  // blocks that size a rank-2 tile
  int64_t max_block_1d = 1024;                 // blocks that only size rank-1 tiles
  std::vector<int64_t> num_warps = {2, 4, 8};
  std::vector<int64_t> num_stages = {1, 2, 3, 4};
  bool include_registered_knobs = true;
  // Replaces the values of a dimension (a block name, "num_warps", "num_stages" or a knob),
  // adding the dimension when the derivation left it out; one value pins it. E.g.
  // {"num_warps", {4}}, {"m", {128, 256}}. Names that are none of these throw tj::Error.
  std::map<std::string, std::vector<int64_t>> only;
};

// Parses "name=v1,v2,..." (the CLI's --only) into `o.only`; throws tj::Error on bad syntax.
void parse_only(const std::string& text, SpaceOptions& o);

// The space of `f` (a traced kernel, launch loops marked). The base config is
// default_config(f).
ConfigSpace derive_space(const ir::Function& f, const SpaceOptions& options = {});

using ir::constant_block_extents;   // dsl/static_extents.h

}  // namespace tj::autotune
