#include "dsl/config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dsl/static_extents.h"

namespace tj {

int64_t Config::block(const ir::Function& f, int block_id) const {
  const ir::BlockSymbol& b = f.blocks.at(block_id);
  if (b.fixed > 0) return b.fixed;
  auto it = blocks.find(b.name);
  return it != blocks.end() ? it->second : 64;
}

int64_t Config::knob(const std::string& name, int64_t fallback) const {
  auto it = knobs.find(name);
  return it != knobs.end() ? it->second : fallback;
}

std::string Config::to_json() const {
  nlohmann::json j;
  j["blocks"] = blocks;
  j["num_warps"] = num_warps;
  j["num_stages"] = num_stages;
  if (!knobs.empty()) j["knobs"] = knobs;
  return j.dump();
}

Config Config::from_json(const std::string& text) { return from_json(text, Config{}); }

Config Config::from_json(const std::string& text, const Config& base) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("config is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw Error("config must be a JSON object like {\"blocks\":{\"m\":64},\"num_warps\":4}");
  Config c = base;
  try {
    for (auto& [key, value] : j.items()) {
      if (key == "blocks") {
        for (const auto& [name, size] : value.get<std::map<std::string, int64_t>>()) c.blocks[name] = size;
      } else if (key == "num_warps") {
        c.num_warps = value.get<int>();
      } else if (key == "num_stages") {
        c.num_stages = value.get<int>();
      } else if (key == "knobs") {
        for (const auto& [name, v] : value.get<std::map<std::string, int64_t>>()) c.knobs[name] = v;
      }
      else throw Error(fmt::format("config has an unknown key '{}' (known: blocks, num_warps, num_stages, knobs)", key));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("config has a value of the wrong type: {}", e.what()));
  }
  if (c.num_warps < 1 || c.num_warps > 32) throw Error(fmt::format("num_warps must be in [1, 32], got {}", c.num_warps));
  if (c.num_stages < 1 || c.num_stages > 16) throw Error(fmt::format("num_stages must be in [1, 16], got {}", c.num_stages));
  return c;
}

Config default_config(const ir::Function& f) {
  Config c;
  for (const auto& b : f.blocks)
    if (b.fixed <= 0) c.blocks[b.name] = 64;
  return c;
}

void check_config(const ir::Function& f, const Config& c) {
  const std::vector<bool> in_2d = ir::blocks_in_2d_tiles(f);
  for (const auto& [name, size] : c.blocks) {
    int id = -1;
    for (size_t i = 0; i < f.blocks.size(); ++i)
      if (f.blocks[i].name == name) id = static_cast<int>(i);
    if (id < 0) {
      std::string names;
      for (const auto& b : f.blocks) names += (names.empty() ? "" : ", ") + b.name;
      throw Error(fmt::format("config sets block '{}', but kernel '{}' has blocks: {}", name, f.name, names));
    }
    // Powers of two for every path; multiples of 32 (96, 192, ...) for the tensor-core lowerings,
    // whose tiles are made of 16- and 32-wide pieces (the SIMT path refuses them itself). Up to
    // 1024 where a block sizes rank-2 tiles; a block of rank-1 tiles only may hold a whole row
    // (codegen/simt_config.h), up to 32768 (32 elements per thread of 1024).
    const bool power_of_two = size >= 1 && (size & (size - 1)) == 0;
    const int64_t limit = in_2d[id] ? 1024 : 32768;
    if (size < 1 || size > limit || (!power_of_two && size % 32 != 0))
      throw Error(fmt::format("block '{}' must be a power of two or a multiple of 32 in [1, {}]{}, got {}", name, limit,
                              limit == 1024 ? "" : " (a block of rank-1 tiles only)", size));
  }
}

}  // namespace tj
