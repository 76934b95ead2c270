#pragma once
// Search strategies over a ConfigSpace's index grid, independent of GPUs: the cost of a
// batch of points comes from a callback (the tuner compiles and benchmarks them; tests pass
// a synthetic function). Costs are "lower is better"; +inf marks a point that failed
// (pruned, wrong output, fault, skipped). Points are never evaluated twice.
//
// Strategies:
//   exhaustive — every point, in one batch (the tuner overlaps its compiles and benchmarks).
//   pattern    — pattern search from good seeds (the approach of Helion's default
//                PatternSearch). A first batch evaluates the seeds (the default config and
//                heuristics) and a Latin-hypercube sample; from the best `starts` distinct
//                points a compass search moves along each dimension by ±step (step 2, then
//                1) to the best improving neighbour; when no single-axis move improves, it
//                tries moves along two axes at once (block size and warps interact through
//                registers, block sizes through shared memory) before declaring a local
//                optimum; remaining budget restarts from the best evaluated points that are
//                not next to an optimum already found. Each round's neighbourhoods of all
//                centres form one batch, so compiles run in parallel.
//   Why not a model-guided search: kernel timing landscapes over power-of-two tile sizes
//   are piecewise smooth with cliffs (register spills, occupancy steps, wave quantization)
//   that a small model fitted on ~20 points mispredicts, while local search around good
//   points handles cliffs by measuring. tests/test_autotune.cpp checks the strategy against
//   synthetic landscapes with such cliffs (within 3% of the exhaustive optimum).
//   automatic  — exhaustive when the space has at most exhaustive_limit points, else pattern.
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autotune/space.h"

namespace tj::autotune {

inline constexpr double kFailed = std::numeric_limits<double>::infinity();

enum class Strategy : uint8_t { automatic, exhaustive, pattern };
std::string_view name(Strategy s);

// Evaluates a batch of distinct, not yet evaluated points; returns one cost per point.
using BatchCost = std::function<std::vector<double>(const std::vector<Point>&)>;

struct SearchOptions {
  Strategy strategy = Strategy::automatic;
  uint64_t exhaustive_limit = 128;   // automatic: exhaustive up to this many points
  std::vector<Point> seeds;          // evaluated in the first batch (default config, heuristics)
  int random_samples = 16;           // pattern: Latin-hypercube points in the first batch
  int starts = 3;                    // pattern: compass searches from the best distinct points
  int max_evaluations = 250;         // pattern: distinct points at most (seeds included)
  int initial_step = 2;              // pattern: first step, in indices (2 = x4 for powers of two)
  uint64_t seed = 1;                 // random sample
  std::function<bool()> stop;        // polled between batches; true ends the search
};

struct SearchResult {
  Point best;                        // empty when no point had a finite cost
  double best_cost = kFailed;
  int evaluations = 0;               // distinct points evaluated
  int batches = 0;
  Strategy strategy = Strategy::exhaustive;   // the one that ran
  bool stopped = false;              // stop() ended it
};

SearchResult search(const std::vector<int>& sizes, const BatchCost& cost, const SearchOptions& options);

// Every point of a grid of `sizes`, the first dimension varying slowest.
std::vector<Point> all_points(const std::vector<int>& sizes);

}  // namespace tj::autotune
