#include "codegen/knob.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "core/error.h"

namespace tj::codegen {

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<KnobTable> tables;
};
Registry& registry() {
  static Registry r;
  return r;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

bool register_knob_table(const std::string& lowering, std::vector<const KnobSpec*> table) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.tables.push_back(KnobTable{lowering, std::move(table)});
  return true;
}

std::vector<KnobTable> knob_tables() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.tables;
}

std::optional<KnobTable> knob_table(const std::string& lowering) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const KnobTable& t : r.tables)
    if (t.lowering == lowering) return t;
  return std::nullopt;
}

void check_knob_names(const std::string& kernel, const Config& cfg) {
  if (cfg.knobs.empty()) return;
  const std::vector<KnobTable> tables = knob_tables();
  for (const auto& [name, value] : cfg.knobs) {
    std::string closest;
    size_t best = SIZE_MAX;
    bool known = false;
    for (const KnobTable& t : tables)
      for (const KnobSpec* k : t.knobs) {
        if (name == k->name) known = true;
        const size_t d = edit_distance(name, k->name);
        if (d < best) best = d, closest = k->name;
      }
    if (known) continue;
    throw Error(fmt::format("kernel '{}': the config sets knob '{}', which no lowering reads{}; `tilejit show {} --knobs` lists "
                            "the knobs",
                            kernel, name, best <= 3 ? fmt::format(" (did you mean '{}'?)", closest) : std::string(), kernel));
  }
}

}  // namespace tj::codegen
