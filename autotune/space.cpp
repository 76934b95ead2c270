#include "autotune/space.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>

namespace tj::autotune {

namespace {

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v && p < (int64_t(1) << 40)) p <<= 1;
  return p;
}


// Whether some loop that runs inside a program (not a launch loop) loads from memory: the
// loop a pipeline would overlap.
bool has_pipelinable_loop(const ir::Function& f) {
  bool found = false;
  std::function<void(const ir::Region&, bool)> visit = [&](const ir::Region& r, bool inside) {
    for (const ir::Op& op : r.ops) {
      if (inside && op.kind == ir::OpKind::load) found = true;
      if (op.body) visit(*op.body, inside || (op.kind == ir::OpKind::loop && !op.launch));
    }
  };
  visit(f.body, false);
  return found;
}

size_t nearest_index(const std::vector<int64_t>& values, int64_t v) {
  size_t best = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] == v) return i;
    auto dist = [&](int64_t x) { return x > v ? x - v : v - x; };
    if (dist(values[i]) < dist(values[best])) best = i;
  }
  return best;
}

std::string values_str(const std::vector<int64_t>& v) {
  if (v.size() > 3) {
    bool pow2_run = true;
    for (size_t i = 1; i < v.size(); ++i) pow2_run &= v[i] == 2 * v[i - 1];
    if (pow2_run) return fmt::format("{{{}..{}}}", v.front(), v.back());
  }
  return fmt::format("{{{}}}", fmt::join(v, ","));
}

}  // namespace

std::vector<int> ConfigSpace::sizes() const {
  std::vector<int> s;
  for (const auto& d : dims_) s.push_back(static_cast<int>(d.values.size()));
  return s;
}

uint64_t ConfigSpace::size() const {
  uint64_t n = 1;
  for (const auto& d : dims_) {
    uint64_t k = d.values.size();
    if (k == 0) return 0;
    if (n > std::numeric_limits<uint64_t>::max() / k) return std::numeric_limits<uint64_t>::max();
    n *= k;
  }
  return n;
}

Config ConfigSpace::config_at(const Point& p) const {
  Config c = base_;
  for (size_t i = 0; i < dims_.size(); ++i) {
    const Dimension& d = dims_[i];
    int64_t v = d.values.at(static_cast<size_t>(p.at(i)));
    switch (d.kind) {
      case Dimension::Kind::block: c.blocks[d.name] = v; break;
      case Dimension::Kind::num_warps: c.num_warps = static_cast<int>(v); break;
      case Dimension::Kind::num_stages: c.num_stages = static_cast<int>(v); break;
      case Dimension::Kind::knob:
        if (v == d.fallback) c.knobs.erase(d.name);
        else c.knobs[d.name] = v;
        break;
    }
  }
  return c;
}

Point ConfigSpace::point_of(const Config& c) const {
  Point p;
  for (const Dimension& d : dims_) {
    int64_t v = 0;
    switch (d.kind) {
      case Dimension::Kind::block: {
        auto it = c.blocks.find(d.name);
        v = it != c.blocks.end() ? it->second : base_.blocks.count(d.name) ? base_.blocks.at(d.name) : 64;
        break;
      }
      case Dimension::Kind::num_warps: v = c.num_warps; break;
      case Dimension::Kind::num_stages: v = c.num_stages; break;
      case Dimension::Kind::knob: v = c.knob(d.name, d.fallback); break;
    }
    p.push_back(static_cast<int>(nearest_index(d.values, v)));
  }
  return p;
}

bool ConfigSpace::contains(const Config& c) const { return config_at(point_of(c)) == c; }

std::string ConfigSpace::describe() const {
  if (dims_.empty()) return "1 point (nothing to tune)";
  std::vector<std::string> parts;
  for (const Dimension& d : dims_) {
    std::string what = d.kind == Dimension::Kind::block ? "block " + d.name : d.name;
    parts.push_back(what + " " + values_str(d.values));
  }
  return fmt::format("{} = {} points", fmt::join(parts, " x "), size());
}

ConfigSpace derive_space(const ir::Function& f, const SpaceOptions& o) {
  Config base = default_config(f);
  // The lowering's own default may use block sizes that are not powers of two (attention: 96, 192):
  // they join their dimensions, so the search starts at that point and steps to its neighbours.
  const Config untuned = o.arch.empty() ? base : untuned_config(f, o.arch);
  std::vector<Dimension> dims;
  const auto extents = constant_block_extents(f);
  const auto in_2d = ir::blocks_in_2d_tiles(f);
  for (size_t i = 0; i < f.blocks.size(); ++i) {
    const ir::BlockSymbol& b = f.blocks[i];
    if (b.fixed > 0) continue;
    int64_t hi = in_2d[i] ? o.max_block_2d : o.max_block_1d;
    int64_t lo = o.min_block;
    if (extents[i] > 0) {
      int64_t cap = next_pow2(extents[i]);
      hi = std::min(hi, std::max(cap, int64_t(1)));
      lo = std::min(lo, hi);
    }
    Dimension d;
    d.kind = Dimension::Kind::block;
    d.name = b.name;
    for (int64_t v = next_pow2(std::max<int64_t>(lo, 1)); v <= hi; v *= 2) d.values.push_back(v);
    if (d.values.empty()) d.values.push_back(hi);
    // (The untuned value joins even above the cap: a streaming kernel's whole row, codegen/simt_config.h.)
    if (auto u = untuned.blocks.find(b.name); u != untuned.blocks.end() && u->second >= lo &&
                                              std::find(d.values.begin(), d.values.end(), u->second) == d.values.end()) {
      d.values.push_back(u->second);
      std::sort(d.values.begin(), d.values.end());
    }
    d.fallback = base.blocks.count(b.name) ? base.blocks[b.name] : 64;
    dims.push_back(std::move(d));
  }
  if (!o.num_warps.empty()) {
    Dimension d{Dimension::Kind::num_warps, "num_warps", o.num_warps, base.num_warps};
    std::sort(d.values.begin(), d.values.end());
    dims.push_back(std::move(d));
  }
  if (!o.num_stages.empty() && has_pipelinable_loop(f)) {
    Dimension d{Dimension::Kind::num_stages, "num_stages", o.num_stages, base.num_stages};
    std::sort(d.values.begin(), d.values.end());
    dims.push_back(std::move(d));
  }
  // Asked once: a provider may generate code to decide (the SIMT path's asks every pattern lowering).
  const std::vector<Knob> knobs =
      o.include_registered_knobs || !o.only.empty() ? registered_knobs(f, o.arch) : std::vector<Knob>{};
  if (o.include_registered_knobs) {
    for (const Knob& k : knobs) dims.push_back(Dimension{Dimension::Kind::knob, k.name, k.values, k.fallback});
  }
  // Restrictions from the caller.
  for (const auto& [name, values] : o.only) {
    if (values.empty()) throw Error(fmt::format("space restriction '{}' has no values", name));
    auto it = std::find_if(dims.begin(), dims.end(), [&](const Dimension& d) { return d.name == name; });
    if (it != dims.end()) {
      it->values = values;
      continue;
    }
    Dimension d;
    d.name = name;
    d.values = values;
    bool block = false;
    for (const auto& b : f.blocks) block |= b.name == name;
    if (block) {
      bool fixed = false;
      for (const auto& b : f.blocks) fixed |= b.name == name && b.fixed > 0;
      if (fixed) throw Error(fmt::format("block '{}' of kernel '{}' is fixed by the kernel; it cannot be tuned", name, f.name));
      d.kind = Dimension::Kind::block;
      d.fallback = 64;
    } else if (name == "num_warps") {
      d.kind = Dimension::Kind::num_warps;
      d.fallback = base.num_warps;
    } else if (name == "num_stages") {
      d.kind = Dimension::Kind::num_stages;
      d.fallback = base.num_stages;
    } else {
      bool knob = false;
      for (const Knob& k : knobs) knob |= k.name == name;
      if (!knob && name.rfind("__", 0) != 0) {
        std::vector<std::string> names;
        for (const auto& b : f.blocks) names.push_back(b.name);
        for (const Knob& k : knobs) names.push_back(k.name);
        throw Error(fmt::format("'{}' is not a block or knob of kernel '{}' on {} (blocks and knobs: {}; also num_warps, "
                                "num_stages)",
                                name, f.name, o.arch, fmt::join(names, ", ")));
      }
      d.kind = Dimension::Kind::knob;
      d.fallback = 0;
      for (const Knob& k : knobs)
        if (k.name == name) d.fallback = k.fallback;
    }
    dims.push_back(std::move(d));
  }
  // A dimension with one value is not a dimension: apply it to the base and drop it.
  std::vector<Dimension> kept;
  for (Dimension& d : dims) {
    if (d.values.size() > 1) {
      kept.push_back(std::move(d));
      continue;
    }
    ConfigSpace one(base, {d});
    base = one.config_at({0});
  }
  return ConfigSpace(std::move(base), std::move(kept));
}

}  // namespace tj::autotune

namespace tj::autotune {

void parse_only(const std::string& text, SpaceOptions& o) {
  auto bad = [&] {
    return Error(fmt::format("bad space restriction '{}': expected name=value[,value...], e.g. num_warps=4 or m=64,128", text));
  };
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 >= text.size()) throw bad();
  std::string name = text.substr(0, eq);
  std::vector<int64_t> values;
  size_t pos = eq + 1;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string part = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || !end || *end != '\0') throw bad();
    values.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  o.only[name] = std::move(values);
}

}  // namespace tj::autotune
