#pragma once
// A Config holds every tunable of one compiled kernel: a block size per tile loop, warps,
// pipeline stages and knobs that a lowering registers. It prints and parses as JSON and
// can be passed by hand to force a configuration.
#include <cstdint>
#include <map>
#include <string>

#include "dsl/ir.h"

namespace tj {

struct Config {
  std::map<std::string, int64_t> blocks;   // tile-loop block name -> size
  int num_warps = 4;
  int num_stages = 2;
  std::map<std::string, int64_t> knobs;    // lowering-specific (e.g. "warp_specialize")

  // The block size of `block_id`: fixed by the kernel, set here, or the default.
  int64_t block(const ir::Function& f, int block_id) const;
  int64_t knob(const std::string& name, int64_t fallback) const;

  std::string to_json() const;             // {"blocks":{"m":64},"num_warps":4,...}
  static Config from_json(const std::string& text);   // throws tj::Error on bad input
  // The entries of `text` over `base`: blocks and knobs name by name, num_warps and num_stages
  // where given (`tilejit --config` over a kernel's default).
  static Config from_json(const std::string& text, const Config& base);
  bool operator==(const Config&) const = default;
};

// The config used when nothing was tuned: blocks of 64 (or the fixed size), 4 warps.
Config default_config(const ir::Function& f);

// Checks that `c` sets only blocks the kernel has, with powers of two in [1, 1024];
// throws tj::Error naming the offending entry.
void check_config(const ir::Function& f, const Config& c);

}  // namespace tj
