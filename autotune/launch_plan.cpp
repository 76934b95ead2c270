#include "autotune/launch_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "autotune/cache.h"
#include "autotune/space.h"
#include "runtime/device.h"
#include "runtime/reference.h"

namespace tj::autotune {

namespace {

struct Plans {
  std::mutex mutex;
  std::unordered_map<std::string, LaunchPlan> map;
  uint64_t generation = 0;
};
Plans& plans() {
  static Plans p;
  return p;
}
std::atomic<uint64_t> g_misses{0};

void append(std::string& key, const void* p, size_t n) { key.append(static_cast<const char*>(p), n); }

// Which dims have stride 1 (specs_for compiles those in), without building the strides; rank <= 64.
void append_unit_strides(std::string& key, const TensorView& t) {
  uint64_t bits = 0;
  int64_t row_major = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    const int64_t stride = t.strides.empty() ? row_major : t.strides[d];
    if (stride == 1) bits |= uint64_t{1} << d;
    row_major *= t.shape[d];
  }
  append(key, &bits, sizeof bits);
}

// The compact key of a launch: everything that selects the specialization and the grid.
// False when the argument count is wrong (the slow path reports it).
bool fast_key(const Kernel& k, const std::vector<Arg>& args, bool dynamic_shapes, std::string& key) {
  const auto& slots = k.slots();
  if (args.size() != slots.size()) return false;
  const uint64_t id = k.id();   // not the address: a kernel made later at the same place has another id
  append(key, &id, sizeof id);
  key.push_back(dynamic_shapes ? 1 : 0);
  for (size_t i = 0; i < args.size(); ++i) {
    const Arg& a = args[i];
    key.push_back(static_cast<char>(a.index()));
    switch (a.index()) {
      case 0: {
        const TensorView& t = *std::get_if<TensorView>(&a);
        key.push_back(static_cast<char>(t.dtype));
        key.push_back(static_cast<char>(t.shape.size()));
        append(key, t.shape.data(), t.shape.size() * sizeof(int64_t));
        if ((!t.strides.empty() && t.strides.size() != t.shape.size()) || t.shape.size() > 64) return false;
        append_unit_strides(key, t);
        break;
      }
      case 1:
        if (slots[i].is_host()) append(key, std::get_if<double>(&a), sizeof(double));
        break;
      case 2: key.push_back(*std::get_if<bool>(&a) ? 1 : 0); break;
      case 3:
        if (slots[i].is_host()) append(key, std::get_if<int64_t>(&a), sizeof(int64_t));
        break;
      default: break;
    }
  }
  return true;
}

void warn_once(const std::string& message) {
  static std::mutex m;
  static std::set<std::string> said;
  std::lock_guard lock(m);
  if (!said.insert(message).second) return;
  std::string line = "tilejit: " + message + "\n";
  std::fputs(line.c_str(), stderr);
}


LaunchPlan build(const Kernel& k, const std::vector<Arg>& args, bool dynamic_shapes, bool start_early) {
  std::vector<ArgSpec> specs = specs_for(k, args, dynamic_shapes);
  CompileRequest request;
  request.start_early = start_early;
  std::optional<Config> tuned;
  try {
    tuned = tuned_config(k, dynamic_shapes ? specs_for(k, args, false) : specs, dynamic_shapes);
  } catch (const std::exception& e) {
    warn_once(fmt::format("cannot read tuned configs for kernel '{}' ({}); using the default config", k.name(), e.what()));
  }
  LaunchPlan plan;
  if (tuned) {
    try {
      plan.kernel = &compile(k, specs, *tuned, request);
      plan.tuned = true;
    } catch (const Error& e) {
      warn_once(fmt::format("the tuned config {} of kernel '{}' does not compile or load any more ({}); using the default "
                            "config (run `tilejit tune` again)",
                            tuned->to_json(), k.name(), e.what()));
    }
  }
  if (!plan.kernel) plan.kernel = &compile(k, specs, untuned_config(k.trace(specs), runtime::current_device().arch()), request);
  plan.programs = launch_shape(plan.kernel->ir, plan.kernel->config, param_values(k, args)).programs;
  if (plan.programs > 0) plan.geometry = launch_geometry(*plan.kernel, plan.programs, runtime::current_device().sm_count);
  return plan;
}

}  // namespace

LaunchPlan plan_launch(const Kernel& k, const std::vector<Arg>& args, bool dynamic_shapes, bool start_early) {
  std::string key;
  key.reserve(96);
  if (!fast_key(k, args, dynamic_shapes, key)) return build(k, args, dynamic_shapes, start_early);   // throws the argument error
  key.push_back(start_early ? 'e' : 'l');
  Plans& p = plans();
  const uint64_t generation = tuning_generation();
  {
    std::lock_guard lock(p.mutex);
    if (p.generation != generation) {
      p.map.clear();
      p.generation = generation;
    }
    auto it = p.map.find(key);
    if (it != p.map.end()) return it->second;
  }
  g_misses.fetch_add(1, std::memory_order_relaxed);
  LaunchPlan plan = build(k, args, dynamic_shapes, start_early);
  std::lock_guard lock(p.mutex);
  if (p.generation == generation) p.map.emplace(std::move(key), plan);
  return plan;
}

void clear_launch_plans() {
  Plans& p = plans();
  std::lock_guard lock(p.mutex);
  p.map.clear();
}

uint64_t launch_plan_misses() { return g_misses.load(); }

}  // namespace tj::autotune
