#pragma once
// How generated CUDA spells scalar expressions: f32 registers for every float dtype, rounded to
// the dtype after each op (as the CPU reference executor rounds), literals that round-trip.
// Shared by the SIMT emitter and the tensor-core lowerings' epilogues.
#include <cstdint>
#include <string>

#include "dsl/ir.h"

namespace tj::codegen::scalar {

const char* reg_type(DType t);                       // "float", "int", "long long", "bool"
std::string dtag(DType t);                           // "tj::dev::bf16"
std::string rounding(DType t, const std::string& e); // e rounded to t (no-op for f32/ints)
float round_host(double v, DType t);                 // a constant rounded once from the double
std::string float_literal(float x);
std::string int_literal(int64_t v, DType t);
std::string literal(double fval, int64_t ival, DType t);
std::string unary_expr(ir::UnaryFn fn, DType t, const std::string& x, bool fast_math);
std::string binary_expr(ir::BinaryFn fn, DType operand, DType result, const std::string& a, const std::string& b);
std::string cast_expr(DType from, DType to, const std::string& x);

// Names in generated code: a user's name made a C++ identifier, and whether it would clash with
// C++, CUDA builtins or the names the generators use themselves (v12, var3, L64x1, tj_*).
std::string identifier(const std::string& s);
bool reserved_name(const std::string& s);

}  // namespace tj::codegen::scalar
