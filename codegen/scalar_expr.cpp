#include "codegen/scalar_expr.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <set>
#include <limits>

#include "core/numerics.h"

namespace tj::codegen::scalar {

using ir::BinaryFn;
using ir::UnaryFn;

const char* reg_type(DType t) {
  switch (t) {
    case DType::i32: return "int";
    case DType::i64: return "long long";
    case DType::i1: return "bool";
    default: return "float";
  }
}

std::string dtag(DType t) { return fmt::format("tj::dev::{}", name(t)); }

std::string rounding(DType t, const std::string& e) {
  switch (t) {
    case DType::f16: return fmt::format("tj::dev::round_f16({})", e);
    case DType::bf16: return fmt::format("tj::dev::round_bf16({})", e);
    case DType::e4m3: return fmt::format("tj::dev::round_e4m3({})", e);
    case DType::e5m2: return fmt::format("tj::dev::round_e5m2({})", e);
    default: return e;
  }
}

float round_host(double v, DType t) { return static_cast<float>(numerics::round_double_to(t, v)); }

std::string float_literal(float x) {
  if (std::isnan(x)) return "tj::dev::nan()";
  if (std::isinf(x)) return x > 0 ? "tj::dev::inf()" : "(-tj::dev::inf())";
  std::string s = fmt::format("{}", x);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  s += "f";
  return x < 0 || (x == 0 && std::signbit(x)) ? "(" + s + ")" : s;
}

std::string int_literal(int64_t v, DType t) {
  if (t == DType::i1) return v ? "true" : "false";
  if (v == std::numeric_limits<int64_t>::min()) return "(-9223372036854775807LL - 1)";
  std::string s = t == DType::i64 ? fmt::format("{}LL", v) : fmt::format("{}", v);
  return v < 0 ? "(" + s + ")" : s;
}

std::string literal(double fval, int64_t ival, DType t) {
  if (is_float(t)) return float_literal(round_host(fval, t));
  return int_literal(ival, t);
}

std::string unary_expr(UnaryFn fn, DType t, const std::string& x, bool fm) {
  switch (fn) {
    case UnaryFn::neg: return fmt::format("-{}", x);
    case UnaryFn::abs: return is_float(t) ? fmt::format("fabsf({})", x) : fmt::format("tj::dev::iabs({})", x);
    case UnaryFn::exp2: return rounding(t, fmt::format("tj::dev::exp2({})", x));
    case UnaryFn::log2: return rounding(t, fmt::format(fmt::runtime(fm ? "tj::dev::fast_log2({})" : "log2f({})"), x));
    case UnaryFn::exp: return rounding(t, fmt::format(fmt::runtime(fm ? "__expf({})" : "expf({})"), x));
    case UnaryFn::log: return rounding(t, fmt::format(fmt::runtime(fm ? "__logf({})" : "logf({})"), x));
    case UnaryFn::sqrt: return rounding(t, fmt::format(fmt::runtime(fm ? "tj::dev::fast_sqrt({})" : "sqrtf({})"), x));
    case UnaryFn::rsqrt: return rounding(t, fmt::format("rsqrtf({})", x));
    case UnaryFn::tanh: return rounding(t, fmt::format(fmt::runtime(fm ? "tj::dev::fast_tanh({})" : "tanhf({})"), x));
    case UnaryFn::logical_not: return fmt::format("!{}", x);
  }
  return x;
}

std::string binary_expr(BinaryFn fn, DType od, DType rd, const std::string& a, const std::string& b) {
  const bool flt = is_float(od);
  switch (fn) {
    case BinaryFn::add: return rounding(rd, fmt::format("{} + {}", a, b));
    case BinaryFn::sub: return rounding(rd, fmt::format("{} - {}", a, b));
    case BinaryFn::mul: return rounding(rd, fmt::format("{} * {}", a, b));
    case BinaryFn::div: return rounding(rd, fmt::format("{} / {}", a, b));
    case BinaryFn::maximum: return flt ? fmt::format("fmaxf({}, {})", a, b) : fmt::format("tj::dev::imax({}, {})", a, b);
    case BinaryFn::minimum: return flt ? fmt::format("fminf({}, {})", a, b) : fmt::format("tj::dev::imin({}, {})", a, b);
    case BinaryFn::mod: return fmt::format("tj::dev::mod({}, {})", a, b);
    case BinaryFn::floordiv: return fmt::format("tj::dev::floordiv({}, {})", a, b);
    case BinaryFn::lt: return fmt::format("{} < {}", a, b);
    case BinaryFn::le: return fmt::format("{} <= {}", a, b);
    case BinaryFn::gt: return fmt::format("{} > {}", a, b);
    case BinaryFn::ge: return fmt::format("{} >= {}", a, b);
    case BinaryFn::eq: return fmt::format("{} == {}", a, b);
    case BinaryFn::ne: return fmt::format("{} != {}", a, b);
    case BinaryFn::logical_and: return fmt::format("{} && {}", a, b);
    case BinaryFn::logical_or: return fmt::format("{} || {}", a, b);
  }
  return a;
}

std::string cast_expr(DType from, DType to, const std::string& x) {
  if (from == to) return x;
  if (is_float(from)) {
    if (is_float(to)) return rounding(to, x);
    if (to == DType::i32) return fmt::format("__float2int_rz({})", x);
    if (to == DType::i64) return fmt::format("__float2ll_rz({})", x);
    return fmt::format("({} != 0.0f)", x);
  }
  if (from == DType::i1) {
    if (is_float(to)) return fmt::format("({} ? 1.0f : 0.0f)", x);
    return fmt::format("({})({})", reg_type(to), x);
  }
  // integers
  if (is_float(to)) return rounding(to, fmt::format("(float)({})", x));
  if (to == DType::i1) return fmt::format("({} != 0)", x);
  return fmt::format("({})({})", reg_type(to), x);
}

bool reserved_name(const std::string& s) {
  static const std::set<std::string> words = {
      "alignas", "alignof", "and", "asm", "auto", "bool", "break", "case", "catch", "char", "class", "const",
      "constexpr", "continue", "decltype", "default", "delete", "do", "double", "else", "enum", "explicit", "extern",
      "false", "float", "for", "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new",
      "noexcept", "not", "nullptr", "operator", "or", "private", "protected", "public", "register", "return", "short",
      "signed", "sizeof", "static", "struct", "switch", "template", "this", "throw", "true", "try", "typedef",
      "typeid", "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "while", "xor", "threadIdx",
      "blockIdx", "blockDim", "gridDim", "warpSize", "exp2f", "log2f", "expf", "logf", "sqrtf", "rsqrtf", "tanhf",
      "fabsf", "fmaxf", "fminf", "fmaf", "Arr1d", "Arr2d", "a", "b", "c", "main", "concept", "requires", "co_await",
      "co_return", "co_yield", "export", "import", "module", "char8_t", "char16_t", "char32_t", "wchar_t"};
  if (words.count(s)) return true;
  if (s.rfind("tj", 0) == 0 || s.rfind("__", 0) == 0) return true;
  // v12, v12_x3, var12, L64, L64x1: names the generated code uses
  for (const char* prefix : {"v", "var", "L"}) {
    std::string p(prefix);
    if (s.size() > p.size() && s.rfind(p, 0) == 0 && std::isdigit(static_cast<unsigned char>(s[p.size()]))) return true;
  }
  return false;
}

std::string identifier(const std::string& s) {
  std::string out;
  for (char ch : s) out += std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' ? ch : '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "_" + out;
  return out;
}

}  // namespace tj::codegen::scalar
