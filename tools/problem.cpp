#include "tools/problem.h"

#include "autotune/cache.h"
#include "autotune/space.h"
#include "codegen/knob.h"
#include "runtime/device.h"
#include "runtime/driver.h"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <cmath>

namespace tj::tools {

namespace {
DType parse_dtype(const std::string& s, const char* what) {
  auto t = dtype_from_name(s);
  if (!t) throw Error(fmt::format("unknown {} '{}' (use f32, f16, bf16, e4m3 or e5m2)", what, s));
  return *t;
}

}  // namespace

std::vector<int64_t> parse_shape(const std::string& s) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find_first_of(",x", pos);
    std::string part = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int64_t v = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || v <= 0)
      throw Error(fmt::format("bad --shape '{}': expected positive integers separated by commas, e.g. 2,4,1024,64", s));
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::string default_arch(const std::string& requested) {
  if (!requested.empty()) return requested;
  if (runtime::driver().available()) return runtime::current_device().arch();
  return "sm_90a";
}

ResolvedProblem resolve(const ProblemOptions& o) {
  ResolvedProblem r;
  r.entry = &kernels::find(o.kernel);
  r.problem.dtype = parse_dtype(o.dtype, "--dtype");
  if (!o.out_dtype.empty()) r.problem.out_dtype = parse_dtype(o.out_dtype, "--out-dtype");
  r.problem.shape = o.shape.empty() ? r.entry->default_shape : parse_shape(o.shape);
  r.problem.causal = o.causal;
  r.specs = r.entry->arguments(r.problem);
  r.ir = r.entry->get().trace(r.specs);
  // The tuned config for this GPU and shape bucket when `tilejit tune` stored one, else the
  // untuned one; --config's entries over it.
  std::optional<Config> tuned;
  if (runtime::driver().available()) tuned = autotune::tuned_config(r.entry->get(), r.specs, false);
  r.config = tuned ? *tuned : autotune::untuned_config(r.ir, default_arch(o.arch));
  if (!o.config.empty()) r.config = Config::from_json(o.config, r.config);
  check_config(r.ir, r.config);
  // Knob names too, before anything runs: without a GPU only the CPU reference runs, which reads
  // no knob, so a misspelt one would pass unseen.
  codegen::check_knob_names(r.ir.name, r.config);
  return r;
}

HostArguments make_host_arguments(const ResolvedProblem& r, std::mt19937& rng) {
  HostArguments a;
  std::normal_distribution<double> normal(0.0, 1.0);
  const auto& slots = r.entry->get().slots();
  for (size_t i = 0; i < r.specs.size(); ++i) {
    const auto* spec = std::get_if<TensorSpec>(&r.specs[i]);
    if (!spec) continue;
    HostTensor t(spec->dtype, spec->shape);
    if (slots[i].kind == SlotKind::tensor_out) {
      t.fill_bytes(0xFF);
    } else {
      for (int64_t j = 0; j < t.numel(); ++j) t.set(j, normal(rng));
    }
    a.tensors.push_back(std::move(t));
    a.tensor_slot.push_back(static_cast<int>(i));
  }
  return a;
}

std::vector<Arg> launch_arguments(const ResolvedProblem& r, const std::vector<TensorView>& views) {
  std::vector<Arg> args;
  size_t next = 0;
  for (const ArgSpec& s : r.specs) {
    if (std::holds_alternative<TensorSpec>(s)) args.emplace_back(views.at(next++));
    else if (const auto* f = std::get_if<RuntimeScalar>(&s)) args.emplace_back(static_cast<double>(f->value));
    else if (const auto* b = std::get_if<bool>(&s)) args.emplace_back(*b);
    else if (const auto* n = std::get_if<int64_t>(&s)) args.emplace_back(*n);
    else args.emplace_back(std::get<double>(s));
  }
  return args;
}

}  // namespace tj::tools

namespace tj::tools {

std::vector<ArgValue> reference_arguments(const ResolvedProblem& r, const std::vector<TensorView>& views) {
  std::vector<ArgValue> args;
  size_t next = 0;
  for (const ArgSpec& s : r.specs) {
    if (std::holds_alternative<TensorSpec>(s)) args.emplace_back(views.at(next++));
    else if (const auto* f = std::get_if<RuntimeScalar>(&s)) args.emplace_back(f->value);
  }
  return args;
}

bool Comparison::within(double tol) const {
  return nan_count == 0 && max_abs_error <= tol * std::max(1.0, max_abs_reference);
}

Comparison compare(const HostTensor& out, const HostTensor& reference) {
  Comparison c;
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    double o = out.at(i), r = reference.at(i);
    if (std::isnan(r)) continue;
    if (std::isnan(o)) {
      ++c.nan_count;
      continue;
    }
    c.max_abs_error = std::max(c.max_abs_error, std::abs(o - r));
    c.max_abs_reference = std::max(c.max_abs_reference, std::abs(r));
    err2 += (o - r) * (o - r);
    ref2 += r * r;
  }
  c.relative_rmse = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return c;
}

double default_tolerance(DType out) {
  switch (out) {
    case DType::f32: return 1e-4;
    case DType::f16: return 4e-3;
    case DType::bf16: return 2e-2;
    default: return 0.13;
  }
}

void check_host_memory(double bytes, const std::string& what) {
  const double phys = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (phys > 0 && bytes > 0.75 * phys)
    throw Error(fmt::format("{} needs {:.1f} GiB of host memory for its tensors; this machine has {:.1f} GiB: use a smaller "
                            "shape",
                            what, bytes / (1ull << 30), phys / (1ull << 30)));
}

double tensor_bytes(const std::vector<ArgSpec>& specs) {
  double bytes = 0;
  for (const ArgSpec& s : specs)
    if (const auto* t = std::get_if<TensorSpec>(&s)) {
      double n = size_bytes(t->dtype);
      for (int64_t d : t->shape) n *= static_cast<double>(std::max<int64_t>(d, 1));
      bytes += n;
    }
  return bytes;
}

}  // namespace tj::tools
