#include "codegen/lowering.h"

#include "codegen/mma_config.h"
#include "codegen/simt_config.h"
#include "core/error.h"

#include <mutex>
#include <set>
#include <utility>

namespace tj::codegen {

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::pair<std::string, KnobProvider>> knobs;
  std::vector<std::pair<std::string, DefaultConfigProvider>> defaults;
};
Registry& registry() {
  static Registry r;
  return r;
}

template <class P>
void put(std::vector<std::pair<std::string, P>>& list, const std::string& name, P provider) {
  for (auto& [n, p] : list) {
    if (n == name) {
      p = std::move(provider);
      return;
    }
  }
  list.emplace_back(name, std::move(provider));
}

template <class P>
std::vector<std::pair<std::string, P>> copy_of(std::vector<std::pair<std::string, P>> Registry::*list) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.*list;
}

std::vector<PatternLowering>& lowering_registry() {
  static std::vector<PatternLowering> registry;
  return registry;
}

}  // namespace

void register_knob_provider(const std::string& name, KnobProvider provider) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  put(r.knobs, name, std::move(provider));
}

void unregister_knob_provider(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::erase_if(r.knobs, [&](const auto& e) { return e.first == name; });
}

std::vector<Knob> registered_knobs(const ir::Function& f, const std::string& arch) {
  std::vector<Knob> out;
  std::set<std::string> seen;
  for (const auto& [name, provider] : copy_of(&Registry::knobs)) {
    if (!provider) continue;
    for (Knob& k : provider(f, arch)) {
      if (k.name.empty() || k.values.empty() || !seen.insert(k.name).second) continue;
      out.push_back(std::move(k));
    }
  }
  return out;
}

void register_default_config_provider(const std::string& name, DefaultConfigProvider provider) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  put(r.defaults, name, std::move(provider));
}

Config untuned_config(const ir::Function& f, const std::string& arch) {
  for (const auto& [name, provider] : copy_of(&Registry::defaults))
    if (provider)
      if (std::optional<Config> c = provider(f, arch)) return *c;
  // Kernels nobody configures: the generic tensor-core lowering's choice for their dots, the SIMT
  // path's for streaming kernels, else blocks of 64.
  try {
    if (std::optional<Config> c = mma_default_config(f, Target::parse(arch))) return *c;
  } catch (const Error&) {
  }
  if (std::optional<Config> c = simt_streaming_config(f)) return *c;
  return tj::default_config(f);
}

bool register_lowering(PatternLowering l) {
  lowering_registry().push_back(std::move(l));
  return true;
}

const std::vector<PatternLowering>& lowerings() { return lowering_registry(); }

}  // namespace tj::codegen
