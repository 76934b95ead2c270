#pragma once
// The FP8 linear layer of the project's seed 001 (FP8Linear), built from the library's FP8
// parts: y = x wᵀ (+ bias) with x and w quantized to e4m3, one descale per tensor
// (kernels/quantize.cpp's chunked quantizers on the [1, 1, rows, cols] views), multiplied by
// fp8_gemm; and its backward with the output's gradient quantized to e5m2 (its range: gradients
// span more binades than activations): dx = dy w and dw = dyᵀ x, each an fp8_gemm of K-major
// operands, the transposes written by the transposing quantizer.
//
// Scaling: dynamic (each call's own amax: one more read of each input) or delayed
// (TransformerEngine's recipe with an amax history of one: this call's descale from the previous
// call's amax of the same operand, this call's amax written on the way for the next: one read;
// the first call of a state scales dynamically). Values past the previous amax saturate.
//
// FP8 wgmma reads K-major tiles of 16 elements: where M, N or K is not a multiple of 16 the
// products run in bf16 on the tensor cores instead (the generic lowering of the small DSL
// kernels in fp8_linear.cpp; a dim that is not a multiple of 8 leaves rows the copy engine cannot
// read: the SIMT path), and the reason is printed once per shape on stderr.
#include <cuda.h>

#include <optional>
#include <string>

#include "dsl/kernel.h"
#include "runtime/owned_tensor.h"

namespace tj::kernels {

enum class Fp8Scaling { dynamic, delayed };

struct Fp8LinearOptions {
  Fp8Scaling scaling = Fp8Scaling::dynamic;
  CUstream stream = nullptr;
};

// What one layer keeps between calls: the quantized copies (reused, grown as needed), the
// descales and, for delayed scaling, each operand's chunk amaxes from its previous call. One
// state per layer (its operands' amaxes are that layer's history).
struct Fp8LinearState {
  // Operands in the order of Fp8LinearState::Role.
  enum Role { x, w, dy, xt, wt, dyt, roles };
  std::optional<DeviceTensor> copy[roles];         // e4m3 (x, w and their transposes) or e5m2 (dy, dyᵀ)
  std::optional<DeviceTensor> descales;            // f32 [roles]
  std::optional<DeviceTensor> amax[roles][2];      // chunk amaxes: [turn] this call's, [1 - turn] the last call's
  int64_t chunks[roles] = {};                      // chunk amaxes the last call wrote
  int turn[roles] = {};
  bool primed[roles] = {};                         // delayed scaling: a previous call's amaxes exist
  std::optional<DeviceTensor> no_bias;             // a 0-element bias for fp8_gemm
};

// The fallback's products, written as user code (the generic lowering's tensor cores where rows
// are 16-byte aligned): linear_bf16 (x [M, K], w [N, K], bias [N] or [0], y [M, N]): y = x wᵀ +
// bias; linear_bf16_dx (dy [M, N], w [N, K], dx [M, K]): dx = dy w; linear_bf16_dw (dy, x [M, K],
// dw [N, K]): dw = dyᵀ x. Blocks "m", "n" (the result's rows and columns) and "k".
const Kernel& linear_bf16();
const Kernel& linear_bf16_dx();
const Kernel& linear_bf16_dw();

// The quantizers (one program per head and row chunk, a head's rows whole in registers) see a
// matrix [rows, cols] as [1, H, rows, D], D the widest of 128, 64, 32, 16 dividing cols and H =
// cols / D (strided: no copy); the transposing quantizer's yᵀ [1, H, D, rows] is then the matrix's
// transpose [cols, rows] row-major. One descale for the whole matrix: every head takes the max of
// all heads' chunk amaxes (fp8_linear_all_chunks: the [H · C] amaxes seen as [1, H, H · C], stride
// 0 along the heads). At most kMaxQuantizerHeads heads (cols <= 128 · that).
inline constexpr int64_t kMaxQuantizerHeads = 1024;
int64_t fp8_linear_quantizer_width(int64_t cols);
TensorView fp8_linear_quantizer_view(const TensorView& t, int64_t D);
TensorView fp8_linear_all_chunks(const TensorView& amaxes, int64_t heads, int64_t count);

// Where the FP8 products cannot take [M, K] x [N, K]: the reason ("M = 40 is not a multiple of
// 16 ..."), else nothing.
std::optional<std::string> fp8_linear_fallback_reason(int64_t M, int64_t N, int64_t K);

// y [M, N] = x [M, K] · w [N, K]ᵀ (+ bias [N]); x, w (and bias) bf16 or f16, y bf16, f16 or f32,
// contiguous rows (strides of 16-byte multiples); on opt.stream.
void fp8_linear_forward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& bias, const TensorView& y,
                        const Fp8LinearOptions& opt, Fp8LinearState& state);

// dx [M, K] = dy [M, N] · w and dw [N, K] = dyᵀ · x, from the forward's x and w; dy of x's dtype,
// dx and dw bf16, f16 or f32.
void fp8_linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w, const TensorView& dx,
                         const TensorView& dw, const Fp8LinearOptions& opt, Fp8LinearState& state);

}  // namespace tj::kernels
