// Scaled FP8 flash attention forward, in the DSL (FlashAttention-3's FP8 recipe). The same
// source serves e4m3 and bf16/f16 inputs (host `if`s specialize the trace).
//
//   q [B, H, Sq, D], k [B, Hkv, Skv, D]; fp8: v given TRANSPOSED, vt [B, Hkv, D, Skv_pad]
//   (quantize_transpose_fp8 writes it; FP8 wgmma needs both P·V operands K-major), 16-bit:
//   v [B, Hkv, Skv, D] natural. Hkv divides H (grouped-query attention: head h reads kv head
//   h / (H / Hkv)).
//   q_descale, k_descale, v_descale [B, Hkv] f32: x_true = x_fp8 * descale (per-tensor
//   scaling is the broadcast case: every entry equal, or a view with strides 0). 16-bit inputs
//   pass ones.
//   o [B, H, Sq, D] (bf16, f16, or e4m3 -- then o = e4m3(O * o_scale)); lse [B, H, Sq] f32,
//   written when `with_lse` (natural-log logsumexp of the scaled scores; else any tensor).
//   scale: softmax scale * log2(e) (e.g. log2(e)/sqrt(D)), a runtime scalar.
//
// Numerics: the q·k descales and the scale fold into one constant per (b, h); scores and the
// online softmax are f32 in exp2; P = exp2(s - (m - 8)) lies in [0, 256] -- e4m3's full
// relative precision -- and is quantized to the input type for the second dot; l accumulates
// the same f32 P, so the offset cancels in acc / l; the V descale folds into that final
// normalization. Causal masking is top-left aligned (key j <= query i).
//
// On sm_90a, codegen/lower_attention_sm90.cpp recognizes this kernel and lowers it to the
// warp-specialized TMA + wgmma main loop of codegen/device/hopper_attention.cuh (block "n" is
// the key block BN, block "m" the query tile: 128 = 2 consumer warpgroups, 192 = 3); other
// targets (and config knob lowering = 0) take the SIMT path, the CPU reference executor runs it
// as written.
#include "kernels/attention_fp8.h"

#include <fmt/format.h>

#include <cmath>

#include "kernels/library.h"
#include "runtime/error.h"
#include "runtime/jit.h"

namespace tj::kernels {

const Kernel& attention_fp8() {
  static const Kernel k = kernel(
      "attention_fp8",
      {"q", "k", "v", "q_descale", "k_descale", "v_descale", "o", "lse", "scale", "o_scale", "causal", "with_lse"},
      [](In q, In k, In v, In q_descale, In k_descale, In v_descale, Out o, Out lse, Scalar scale, Scalar o_scale,
         bool causal, bool with_lse) {
        const bool fp8 = is_fp8(q.dtype());
        const double p_offset = fp8 ? 8.0 : 0.0;   // P in [0, 2^8]: e4m3's range, full precision
        auto [B, H, S, D] = q.shape<4>();
        auto Hkv = k.dim(1);
        auto S_kv = k.dim(2);
        for (auto bh : grid(B * H)) {
          auto b = floordiv(bh, H);
          auto h = bh % H;
          auto hk = floordiv(h, floordiv(H, Hkv));
          auto qk_scale = scale * q_descale.load(b, hk) * k_descale.load(b, hk);   // one constant
          auto v_scale = v_descale.load(b, hk);
          for (auto m : tile(S, block("m"))) {
            Var m_i = full({m}, -INFINITY, DType::f32);
            Var l_i = zeros({m}, DType::f32);
            Var acc = zeros({m, D}, DType::f32);
            auto qt = q.load(b, h, m, all);
            for (auto n : tile(causal ? minimum(m.end(), S_kv) : S_kv, block("n"))) {
              auto s = dot(qt, k.load(b, hk, n, all).T()) * qk_scale;
              if (causal) s = where(m.index().col() >= n.index().row(), s, -INFINITY);
              auto m_new = maximum(m_i, amax(s, 1));
              auto p = exp2(s - (m_new - p_offset).col());
              auto alpha = exp2(m_i - m_new);
              l_i = l_i * alpha + sum(p, 1);
              auto vn = fp8 ? v.load(b, hk, all, n).T() : v.load(b, hk, n, all);
              acc = dot(p.to(q.dtype()), vn, acc * alpha.col());
              m_i = m_new;
            }
            auto out = acc * (v_scale / l_i).col();
            if (is_fp8(o.dtype())) out = out * o_scale;
            o.store(b, h, m, all, out.to(o.dtype()));
            if (with_lse) lse.store(b, h, m, (m_i - p_offset + log2(l_i)) * 0.6931471805599453);
          }
        }
      });
  return k;
}

}  // namespace tj::kernels
