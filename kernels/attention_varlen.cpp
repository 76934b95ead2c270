#include "kernels/attention_varlen.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"
#include "kernels/attention_variants.h"
#include "runtime/driver.h"

namespace tj::kernels {
namespace {

// [T, heads, D] (any strides) as [1, heads, T, D].
TensorView as_bhsd(const TensorView& t) {
  const std::vector<int64_t> s = t.effective_strides();
  TensorView v = t;
  v.shape = {1, t.shape[1], t.shape[0], t.shape[2]};
  v.strides = {t.shape[0] * s[0], s[1], s[0], s[2]};
  return v;
}

// One document_variant kernel per (sequences, causal, key block): the count is compiled in.
const Kernel& document_kernel(int64_t sequences, bool causal, int64_t key_block) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, bool, int64_t>, Kernel> kernels;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(sequences, causal, key_block);
  auto it = kernels.find(key);
  if (it == kernels.end()) it = kernels.emplace(key, attention_variant(document_variant(sequences, causal, key_block))).first;
  return it->second;
}

void check_cu_seqlens(const TensorView& cu, int64_t T, CUstream stream) {
  const int64_t n = cu.shape[0];
  const int64_t stride = cu.effective_strides()[0], elem = static_cast<int64_t>(size_bytes(cu.dtype));
  std::vector<int64_t> values(n);
  std::vector<unsigned char> raw(static_cast<size_t>(n * elem));
  auto& d = runtime::driver();
  runtime::check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");   // cu_seqlens may come from work on the stream
  const auto base = reinterpret_cast<CUdeviceptr>(cu.data);
  if (stride == 1) {   // one copy (the usual, contiguous case), else one per element
    runtime::check(d.cuMemcpyDtoH(raw.data(), base, raw.size()), "cuMemcpyDtoH");
  } else {
    for (int64_t i = 0; i < n; ++i)
      runtime::check(d.cuMemcpyDtoH(raw.data() + i * elem, base + i * stride * elem, static_cast<size_t>(elem)), "cuMemcpyDtoH");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (cu.dtype == DType::i32) {
      int32_t x;
      std::memcpy(&x, raw.data() + i * elem, 4);
      values[i] = x;
    } else {
      std::memcpy(&values[i], raw.data() + i * elem, 8);
    }
  }
  if (values.front() != 0)
    throw Error(fmt::format("attention_varlen_forward: cu_seqlens[0] is {}; the first sequence starts at row 0", values.front()));
  for (int64_t i = 1; i < n; ++i)
    if (values[i] < values[i - 1])
      throw Error(fmt::format("attention_varlen_forward: cu_seqlens decreases at {} ({} after {}): it holds where each "
                              "sequence starts, in order",
                              i, values[i], values[i - 1]));
  if (values.back() != T)
    throw Error(fmt::format("attention_varlen_forward: cu_seqlens ends at {}, but q, k and v hold {} rows (T): the last "
                            "sequence must end at T",
                            values.back(), T));
}

}  // namespace

int64_t varlen_key_block(int64_t rows, int64_t sequences, bool quantize, int64_t requested) {
  if (requested == 0 || requested == 64) return requested;
  if (requested != -1)
    throw Error(fmt::format("attention_varlen_forward: key_block is -1 (from the sequence lengths), 0 (the default "
                            "configs') or 64; got {}",
                            requested));
  // 16-bit sequences of 1024 rows or more on average: the dense default's key blocks (H200, 16384
  // tokens, H 16, D 128, bf16 TFLOP/s with them vs key blocks of 64: 4 x 4096 664.9 vs 571.5,
  // causal 576.4 vs 509.3; 16 x 1024 490.6 vs 462.6, causal 345.3 vs 347.9). The FP8 pipeline keeps
  // 64 (4 x 4096: 653.3 vs 520.5; 16 x 1024: 347.5 vs 138.7).
  return !quantize && rows >= kLongSequence * sequences ? 0 : 64;
}

void attention_varlen_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cu_seqlens,
                              const TensorView& o, const AttentionVarlenOptions& opt, AttentionFp8Workspace& ws) {
  if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3 || o.rank() != 3)
    throw Error(fmt::format("attention_varlen_forward: q, k, v and o are packed [T, heads, D]; got q {} k {} v {} o {}",
                            q.describe(), k.describe(), v.describe(), o.describe()));
  const int64_t T = q.shape[0], H = q.shape[1];
  if (k.shape[0] != T || v.shape != k.shape || o.shape != q.shape || k.shape[2] != q.shape[2])
    throw Error(fmt::format("attention_varlen_forward: shapes q {} k {} v {} o {} do not fit (queries and keys share one "
                            "packing: k and v hold the same T rows as q)",
                            q.describe(), k.describe(), v.describe(), o.describe()));
  if (cu_seqlens.rank() != 1 || cu_seqlens.shape[0] < 2 || (cu_seqlens.dtype != DType::i32 && cu_seqlens.dtype != DType::i64))
    throw Error(fmt::format("attention_varlen_forward: cu_seqlens is i32 or i64 [N + 1] (N >= 1 sequences), got {}",
                            cu_seqlens.describe()));
  for (const TensorView* t : {&q, &k, &v, &cu_seqlens, &o})
    if (t->device != Device::cuda)
      throw Error(fmt::format("attention_varlen_forward: every tensor must be on the GPU; got {}", t->describe()));
  if (opt.attention.kernel || !opt.attention.inputs.empty())
    throw Error("attention_varlen_forward: the options' kernel and inputs are its own (the document mask over cu_seqlens)");
  if (opt.attention.lse)
    throw Error("attention_varlen_forward: give the LSE as AttentionVarlenOptions::lse (f32 [H, T])");
  if (opt.lse && (opt.lse->dtype != DType::f32 || opt.lse->shape != std::vector<int64_t>{H, T}))
    throw Error(fmt::format("attention_varlen_forward: lse must be f32 [H, T] = [{}, {}], got {}", H, T, opt.lse->describe()));
  if (opt.check_cu_seqlens) check_cu_seqlens(cu_seqlens, T, opt.attention.stream);

  const int64_t sequences = cu_seqlens.shape[0] - 1;
  AttentionFp8Options a = opt.attention;
  a.kernel = &document_kernel(sequences, a.causal, varlen_key_block(T, sequences, a.quantize, opt.key_block));
  a.inputs = {cu_seqlens};
  // The document mask holds causality itself; the kernel's own causal flag would mask by the
  // packed rows' positions too (the same keys: a key before a query's row is before it in its
  // sequence), so it stays on for the causal tiles' skipping and order.
  if (opt.lse) {
    TensorView l = *opt.lse;
    const std::vector<int64_t> s = l.effective_strides();
    l.shape = {1, H, T};
    l.strides = {H * s[0], s[0], s[1]};
    a.lse = l;
  }
  attention_fp8_forward(as_bhsd(q), as_bhsd(k), as_bhsd(v), as_bhsd(o), a, ws);
}

}  // namespace tj::kernels
