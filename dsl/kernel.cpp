#include "dsl/kernel.h"

#include <fmt/format.h>

#include "dsl/builder.h"
#include "dsl/passes.h"

namespace tj {

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
    : name_(std::move(name)), slots_(std::move(slots)), body_(std::move(body)), loc_(dsl::to_loc(loc)) {}

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
      f.params.push_back(ir::Param{s.name, kind, t.dtype, t.shape});
    } else if (s.kind == SlotKind::scalar_f32) {
      f.params.push_back(ir::Param{s.name, ir::ParamKind::scalar_f32, DType::f32, {}});
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
