#pragma once
// tj::kernel: a C++ callable whose parameters are tensors (In/Out/InOut), runtime scalars
// (Scalar) and host values (bool, integers, floating point) that specialize the trace.
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dsl/api.h"
#include "dsl/ir.h"

namespace tj {

// What a tensor argument looks like to the trace. A dimension of -1 stays dynamic
// (a runtime value); others are compiled in. `strides`, in elements: empty or -1 per dim
// leaves a stride a runtime value; others are compiled in, so the kernel only runs on tensors
// with that stride there (launch() compiles in each stride equal to 1, as Triton specializes
// arguments equal to 1: a row's elements then sit at immediate offsets from one address).
struct TensorSpec {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  TensorSpec() = default;
  TensorSpec(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides = {})
      : dtype(dtype), shape(std::move(shape)), strides(std::move(strides)) {}
};

// The strides a spec compiles in for a tensor with these strides: 1 where a stride is 1, -1
// (dynamic) elsewhere.
std::vector<int64_t> unit_strides(const std::vector<int64_t>& strides);
// `shape` laid out row-major, as launch() specs a contiguous tensor of it.
TensorSpec contiguous_spec(DType dtype, std::vector<int64_t> shape);

// One traced argument: a tensor, a runtime float scalar, or a host value.
struct RuntimeScalar {
  float value = 0;
};
using ArgSpec = std::variant<TensorSpec, RuntimeScalar, bool, int64_t, double>;

// A text that tells specializations apart: dtypes, static dims and strides, host values.
std::string spec_key(const std::vector<ArgSpec>& specs);

// How each parameter of the user's callable is passed.
enum class SlotKind : uint8_t { tensor_in, tensor_out, tensor_inout, scalar_f32, host_bool, host_int, host_float };
std::string_view name(SlotKind k);

struct Slot {
  std::string name;
  SlotKind kind;
  bool is_tensor() const { return kind <= SlotKind::tensor_inout; }
  bool is_host() const { return kind >= SlotKind::host_bool; }
};

namespace detail {
template <class T> struct CallableTraits : CallableTraits<decltype(&T::operator())> {};
template <class C, class R, class... A> struct CallableTraits<R (C::*)(A...) const> { using Args = std::tuple<A...>; };
template <class C, class R, class... A> struct CallableTraits<R (C::*)(A...)> { using Args = std::tuple<A...>; };
template <class R, class... A> struct CallableTraits<R (*)(A...)> { using Args = std::tuple<A...>; };

template <class T>
constexpr SlotKind slot_kind() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, In>) return SlotKind::tensor_in;
  else if constexpr (std::is_same_v<U, Out>) return SlotKind::tensor_out;
  else if constexpr (std::is_same_v<U, InOut>) return SlotKind::tensor_inout;
  else if constexpr (std::is_same_v<U, Scalar>) return SlotKind::scalar_f32;
  else if constexpr (std::is_same_v<U, bool>) return SlotKind::host_bool;
  else if constexpr (std::is_integral_v<U>) return SlotKind::host_int;
  else if constexpr (std::is_floating_point_v<U>) return SlotKind::host_float;
  else static_assert(sizeof(U) == 0, "tilejit kernel parameters are In, Out, InOut, Scalar, bool, integers or floats");
}

// The handle or host value passed to the user's callable for parameter `i`.
struct TraceArgs {
  std::vector<int> handles;            // tensor param index / scalar value id, per slot
  const std::vector<ArgSpec>* specs;
};
template <class T>
T make_arg(const TraceArgs& a, size_t i) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, In> || std::is_same_v<U, Out> || std::is_same_v<U, InOut>) return U(a.handles[i]);
  else if constexpr (std::is_same_v<U, Scalar>) return Scalar(a.handles[i]);
  else if constexpr (std::is_same_v<U, bool>) return std::get<bool>((*a.specs)[i]);
  else if constexpr (std::is_integral_v<U>) return static_cast<U>(std::get<int64_t>((*a.specs)[i]));
  else return static_cast<U>(std::get<double>((*a.specs)[i]));
}
}  // namespace detail

class Kernel {
 public:
  using Body = std::function<void(const detail::TraceArgs&)>;
  Kernel(std::string name, std::vector<Slot> slots, Body body, Loc loc);

  const std::string& name() const { return name_; }
  const std::vector<Slot>& slots() const { return slots_; }
  const ir::SourceLoc& defined_at() const { return loc_; }
  // Names this definition in the process: copies share it, no other construction ever gets it
  // (unlike the object's address, which a kernel made later at the same place would take). The
  // launch-plan cache keys on it (autotune/launch_plan.h).
  uint64_t id() const { return id_; }

  // Runs the body under a Builder and returns the verified IR. Throws DslError (pointing at
  // the user's line) for mistakes in the kernel and tj::Error for arguments that do not fit.
  ir::Function trace(const std::vector<ArgSpec>& args) const;

 private:
  std::string name_;
  std::vector<Slot> slots_;
  Body body_;
  ir::SourceLoc loc_;
  uint64_t id_ = 0;
};

// Declares a kernel. `param_names` (optional) name the parameters in errors and signatures.
template <class F>
Kernel kernel(std::string name, std::vector<std::string> param_names, F fn, Loc loc = Loc::current()) {
  using Args = typename detail::CallableTraits<std::decay_t<F>>::Args;
  constexpr size_t n = std::tuple_size_v<Args>;
  std::vector<Slot> slots;
  [&]<size_t... I>(std::index_sequence<I...>) {
    (slots.push_back(Slot{I < param_names.size() ? param_names[I] : "arg" + std::to_string(I),
                          detail::slot_kind<std::tuple_element_t<I, Args>>()}),
     ...);
  }(std::make_index_sequence<n>{});
  Kernel::Body body = [fn](const detail::TraceArgs& a) {
    [&]<size_t... I>(std::index_sequence<I...>) {
      fn(detail::make_arg<std::tuple_element_t<I, Args>>(a, I)...);
    }(std::make_index_sequence<n>{});
  };
  return Kernel(std::move(name), std::move(slots), std::move(body), loc);
}

template <class F>
Kernel kernel(std::string name, F fn, Loc loc = Loc::current()) {
  return kernel(std::move(name), {}, std::move(fn), loc);
}

}  // namespace tj
