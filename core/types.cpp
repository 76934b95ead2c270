#include "core/types.h"

namespace tj {

std::string_view name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::i1: return "i1";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view s) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2, DType::i32, DType::i64, DType::i1})
    if (name(t) == s) return t;
  if (s == "float32" || s == "float") return DType::f32;
  if (s == "float16" || s == "half") return DType::f16;
  if (s == "bfloat16") return DType::bf16;
  if (s == "fp8" || s == "float8_e4m3fn" || s == "fp8e4m3") return DType::e4m3;
  if (s == "float8_e5m2" || s == "fp8e5m2") return DType::e5m2;
  return std::nullopt;
}

int size_bytes(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::e4m3: case DType::e5m2: case DType::i1: return 1;
    case DType::i64: return 8;
  }
  return 0;
}

bool is_float(DType t) { return t <= DType::e5m2; }
bool is_fp8(DType t) { return t == DType::e4m3 || t == DType::e5m2; }
bool is_int(DType t) { return t == DType::i32 || t == DType::i64; }

}  // namespace tj
