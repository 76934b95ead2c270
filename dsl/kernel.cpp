#include "dsl/kernel.h"

#include <atomic>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "dsl/builder.h"
#include "dsl/passes.h"

namespace tj {

std::vector<int64_t> unit_strides(const std::vector<int64_t>& strides) {
  std::vector<int64_t> out(strides.size(), -1);
  for (size_t d = 0; d < strides.size(); ++d)
    if (strides[d] == 1) out[d] = 1;
  return out;
}

TensorSpec contiguous_spec(DType dtype, std::vector<int64_t> shape) {
  // -1 past a dynamic dim: a stride that depends on a runtime size is not compiled in
  std::vector<int64_t> row_major(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;)
    row_major[d - 1] = row_major[d] < 0 || shape[d] < 0 ? -1 : row_major[d] * shape[d];
  TensorSpec t{dtype, std::move(shape), unit_strides(row_major)};
  return t;
}

namespace {
void append_number(std::string& key, int64_t v) {
  char buf[24];
  key.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}
void append_list(std::string& key, const std::vector<int64_t>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) key += ',';
    append_number(key, v[i]);
  }
}
}  // namespace

// Built by appending, not formatting: every launch with a config computes it (runtime/jit.cpp).
std::string spec_key(const std::vector<ArgSpec>& specs) {
  std::string key;
  key.reserve(32 * specs.size());
  for (const auto& s : specs) {
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, TensorSpec>) {
            key += 'T';
            key += name(v.dtype);
            key += '[';
            append_list(key, v.shape);
            key += ']';
            if (std::any_of(v.strides.begin(), v.strides.end(), [](int64_t st) { return st >= 0; })) {
              key += "s[";
              append_list(key, v.strides);
              key += ']';
            }
          } else if constexpr (std::is_same_v<T, RuntimeScalar>) {
            key += 'S';
          } else if constexpr (std::is_same_v<T, bool>) {
            key += v ? "Htrue" : "Hfalse";
          } else if constexpr (std::is_same_v<T, int64_t>) {
            key += 'H';
            append_number(key, v);
          } else {
            key += fmt::format("H{}", v);
          }
        },
        s);
    key += ';';
  }
  return key;
}

std::string_view name(SlotKind k) {
  switch (k) {
    case SlotKind::tensor_in: return "tj::In";
    case SlotKind::tensor_out: return "tj::Out";
    case SlotKind::tensor_inout: return "tj::InOut";
    case SlotKind::scalar_f32: return "tj::Scalar";
    case SlotKind::host_bool: return "bool";
    case SlotKind::host_int: return "integer";
    case SlotKind::host_float: return "floating-point";
  }
  return "?";
}

Kernel::Kernel(std::string name, std::vector<Slot> slots, Body body, Loc loc)
    : name_(std::move(name)), slots_(std::move(slots)), body_(std::move(body)), loc_(dsl::to_loc(loc)) {
  static std::atomic<uint64_t> next{1};
  id_ = next.fetch_add(1, std::memory_order_relaxed);
}

namespace {
std::string spec_kind(const ArgSpec& a) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, TensorSpec>) return "a tensor";
        else if constexpr (std::is_same_v<T, RuntimeScalar>) return "a runtime scalar";
        else if constexpr (std::is_same_v<T, bool>) return "a bool";
        else if constexpr (std::is_same_v<T, int64_t>) return "an integer";
        else return "a floating-point number";
      },
      a);
}

bool fits(SlotKind k, const ArgSpec& a) {
  switch (k) {
    case SlotKind::tensor_in:
    case SlotKind::tensor_out:
    case SlotKind::tensor_inout: return std::holds_alternative<TensorSpec>(a);
    case SlotKind::scalar_f32: return std::holds_alternative<RuntimeScalar>(a);
    case SlotKind::host_bool: return std::holds_alternative<bool>(a);
    case SlotKind::host_int: return std::holds_alternative<int64_t>(a);
    case SlotKind::host_float: return std::holds_alternative<double>(a);
  }
  return false;
}
}  // namespace

ir::Function Kernel::trace(const std::vector<ArgSpec>& args) const {
  if (args.size() != slots_.size())
    throw Error(fmt::format("kernel '{}' takes {} arguments, {} were given", name_, slots_.size(), args.size()));
  ir::Function f;
  f.name = name_;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!fits(s.kind, args[i]))
      throw Error(fmt::format("kernel '{}': argument {} ('{}') must be {}, got {}", name_, i, s.name, tj::name(s.kind),
                              spec_kind(args[i])));
    if (s.is_tensor()) {
      const auto& t = std::get<TensorSpec>(args[i]);
      if (t.shape.empty()) throw Error(fmt::format("kernel '{}': tensor '{}' has rank 0", name_, s.name));
      auto kind = s.kind == SlotKind::tensor_in ? ir::ParamKind::tensor_in
                  : s.kind == SlotKind::tensor_out ? ir::ParamKind::tensor_out
                                                   : ir::ParamKind::tensor_inout;
      if (!t.strides.empty() && t.strides.size() != t.shape.size())
        throw Error(fmt::format("kernel '{}': tensor '{}' has {} strides in its spec for {} dims", name_, s.name,
                                t.strides.size(), t.shape.size()));
      for (size_t d = 0; d < t.strides.size(); ++d)
        if (t.strides[d] < -1)
          throw Error(fmt::format("kernel '{}': tensor '{}': stride {} in its spec is {} (a stride is -1, dynamic, or >= 0)",
                                  name_, s.name, d, t.strides[d]));
      f.params.push_back(ir::Param{s.name, kind, t.dtype, t.shape, t.strides});
    } else if (s.kind == SlotKind::scalar_f32) {
      f.params.push_back(ir::Param{s.name, ir::ParamKind::scalar_f32, DType::f32, {}, {}});
    }
  }

  dsl::Builder builder(f);
  detail::TraceArgs trace_args;
  trace_args.specs = &args;
  int param = 0;
  for (const Slot& s : slots_) {
    if (s.is_tensor()) {
      trace_args.handles.push_back(param++);
    } else if (s.kind == SlotKind::scalar_f32) {
      ir::Op op;
      op.kind = ir::OpKind::scalar_param;
      op.param = param++;
      op.loc = loc_;
      trace_args.handles.push_back(builder.emit(std::move(op), TileType{DType::f32, {}}));
    } else {
      trace_args.handles.push_back(-1);
    }
  }
  body_(trace_args);
  if (builder.open_loops() != 0)
    throw DslError(loc_, "a tile loop was left open (a break or return inside a tilejit loop?)");
  passes::mark_launch_loops(f);
  passes::verify(f);
  return f;
}

}  // namespace tj
