// FP8 quantization pre-pass for attention (and any [B, H, S, D] tensor), in the DSL.
//
//   descale[b, h] = amax(|x[b, h, :, :]|) / fp8_max     (1 where the slice is all zero)
//   y[b, h, s, d] = fp8(x[b, h, s, d] * (1 / descale[b, h]))      (saturating, round to nearest)
//
// One program per (b, h): a first tile loop finds the amax, a second one quantizes (fused: the
// descale never leaves the program). quantize_transpose_fp8 writes yᵀ [B, H, D, S_pad] instead
// -- the layout FP8 wgmma needs for P·V (both operands K-major) -- so attention can take V in
// its natural layout. fp8_max is 448 for e4m3 outputs and 57344 for e5m2.
//
// The Q/K variants for attention (kernels/attention_fp8.h: options hadamard, q_residual):
//
//   quantize_hadamard_fp8   x is first rotated, x·R with R [D, D] orthonormal (the pipeline
//                           passes Sylvester's Hadamard, ±1/√D): (QR)(KR)ᵀ = QKᵀ, so softmax is
//                           unchanged, while an outlier spreads over the whole row and no longer
//                           sets the scale of everything else. The amax is of the rotated values.
//   quantize_residual_fp8   y [B, H, S, 2, D] (= [B, H, S, 2D] row-major): y[..., 0, :] = hi =
//                           fp8(x / descale), y[..., 1, :] = fp8(x / descale - hi): Q ≈ (hi + lo)
//                           · descale to ~6e-4 relative instead of hi's 2.6e-2 (e4m3: 3 bits).
//   quantize_duplicate_fp8  y [B, H, S, 2, D]: hi in both halves, so [Q_hi | Q_lo]·[K | K]ᵀ =
//                           (Q_hi + Q_lo)·Kᵀ: attention_fp8 with a QK head dim 2D and one
//                           descale per (b, h) for each operand, unchanged.
//   (both take `rotate`: rotate by R first, as quantize_hadamard_fp8.)
//
// The low part uses the same scale as the high part (no 2^p shift with K's copy scaled by
// 2^-p): e4m3 is floating point, so the residual (at most 2^-4 of its entry) keeps its 3
// mantissa bits down to e4m3's subnormals (2^-6); only entries below 2^-2 -- 1/1800 of the
// amax at 448 -- lose residual bits, and they weigh nothing in q·k. A 2^4 shift gave the same
// output error to 4 digits in a float64 emulation
// (bench/attention/accuracy_emulation.py) and would make K's copy inexact (its small entries
// fall into the subnormals: 1e-3 of them on N(0,1), 1e-2 with outliers). With the same scale
// K's copy is exact by construction.
//
// The rotation is a `dot` of the row tile [s, D] with column tiles [D, d] of R ("d"/"d2"
// blocks): both operands f32 (R's ±1/√D rounded once), and column tiles bound what the SIMT
// path stages in shared memory to s·(D+1) + D·d floats (R whole would be 256 KB at D = 256).
// It is computed in both passes rather than stored.
#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "kernels/library.h"
#include "core/error.h"

namespace tj::kernels {

namespace {

double fp8_max(DType t) { return t == DType::e5m2 ? 57344.0 : 448.0; }

// amax of |x[b, h, rows, :]| over rows [begin, end) in tiles of block `name` (an f32 scalar).
// Each thread keeps the running max of its own elements and one block-wide reduction follows
// the loop: a reduction per tile would stall every tile on its loads. The last tile is not
// masked at `end`: rows past S load 0, which no |x| is below, but rows in [end, S) -- where a
// chunk's last tile reaches into the next chunk (a block that does not divide 64) -- count
// too. They are rows of the same head, so the head's amax (the max over its chunks) is exact.
Tile slice_amax(const In& x, const Tile& b, const Tile& h, const Tile& begin, const Tile& end, const char* name) {
  auto rows = tile(begin, end, block(name));
  Var peak = zeros({rows, x.dim(3)}, DType::f32);
  for (auto s : rows) peak = maximum(peak, abs(x.load(b, h, s, all).to(DType::f32)));
  return amax(amax(peak, 1), 0);
}

// x's head dim D when the trace compiles it in (rotations need it: R is [D, D], loaded whole
// along its rows).
int64_t static_head_dim(const In& x, const char* kernel) {
  auto d = x.static_dim(3);
  if (!d) throw Error(fmt::format("{}: x's head dim (dim 3) must be static (a rotation loads R [D, D] whole)", kernel));
  return *d;
}

// R must be [D, D] for x's head dim D: f32 (orthonormal), or x's 16-bit dtype holding a ±1 matrix
// (unnormalized: exact in 16 bits; the product is scaled by 1/√D), which the tensor cores multiply.
void check_rotation(const In& x, const In& rotation, const char* kernel) {
  const int64_t D = static_head_dim(x, kernel);
  if (rotation.rank() != 2 || rotation.static_dim(0) != D || rotation.static_dim(1) != D)
    throw Error(fmt::format("{}: the rotation must be [{}, {}] (x's head dim), got a rank-{} tensor{}", kernel, D, D,
                            rotation.rank(), rotation.rank() == 2 ? fmt::format(" [{}, {}]", rotation.static_dim(0).value_or(-1),
                                                                                 rotation.static_dim(1).value_or(-1))
                                                                  : std::string()));
  if (rotation.dtype() != DType::f32 && rotation.dtype() != x.dtype())
    throw Error(fmt::format("{}: the rotation must be f32 (orthonormal: ±1/√D, exact to f32) or x's dtype {} (±1, scaled by 1/√D "
                            "after the product), got {}",
                            kernel, name(x.dtype()), name(rotation.dtype())));
}

// Whether the rotation is a 16-bit ±1 matrix (the product on the tensor cores, scaled after).
bool unnormalized(const In& rotation) { return rotation.dtype() != DType::f32; }

// y [B, H, S, 2, D] for x [B, H, S, D]: two halves of a [B, H, S, 2D] row.
void check_halves(const In& x, const Out& y, const char* kernel) {
  const int64_t D = static_head_dim(x, kernel);
  if (y.rank() != 5 || y.static_dim(3) != 2 || y.static_dim(4) != D)
    throw Error(fmt::format("{}: y must be [B, H, S, 2, {}] (the [B, H, S, {}] output seen as two halves of each row), "
                            "got a rank-{} tensor",
                            kernel, D, 2 * D, y.rank()));
}

// Calls `use(columns, values)` with the rows s of x[b, h] as f32: once with all columns, or
// (rotate) once per tile of block `column_block` of the columns of x·R.
template <class Use>
void for_each_column_tile(const In& x, const In& rotation, const Tile& b, const Tile& h, const TileIndex& s, bool rotate,
                          const char* column_block, Use use) {
  auto raw = x.load(b, h, s, all);
  if (!rotate) {
    use(IndexArg(all), raw.to(DType::f32));
    return;
  }
  if (unnormalized(rotation)) {   // 16-bit x · (±1): f32 accumulation, then 1/√D
    const double norm = 1.0 / std::sqrt(static_cast<double>(*x.static_dim(3)));
    for (auto c : tile(x.dim(3), block(column_block))) use(IndexArg(c), dot(raw, rotation.load(all, c)) * norm);
    return;
  }
  auto rows = raw.to(DType::f32);
  for (auto c : tile(x.dim(3), block(column_block))) use(IndexArg(c), dot(rows, rotation.load(all, c)));
}

// amax of |x[b, h]| (rotate: of |x[b, h]·R|) over rows in tiles of block "s" (columns "d").
Tile rows_amax(const In& x, const In& rotation, const Tile& b, const Tile& h, bool rotate) {
  Var mx = constant(0.0, DType::f32);
  for (auto s : tile(x.dim(2), block("s")))
    for_each_column_tile(x, rotation, b, h, s, rotate, "d",
                         [&](const IndexArg&, const Tile& t) { mx = maximum(mx, amax(amax(abs(t), 1), 0)); });
  return mx;
}

// What the second pass writes for each scaled tile x / descale.
enum class Written { rows, hi_and_residual, hi_twice };

// The body shared by the rotating / splitting quantizers: descale[b, h] from the amax, then y.
void quantize_rows(const In& x, const In& rotation, const Out& y, const Out& descale, bool rotate, Written written) {
  auto B = x.dim(0), H = x.dim(1), S = x.dim(2);
  for (auto bh : grid(B * H)) {
    auto b = floordiv(bh, H);
    auto h = bh % H;
    auto mx = rows_amax(x, rotation, b, h, rotate);
    auto ds = where(mx > 0.0, mx * (1.0 / fp8_max(y.dtype())), 1.0);
    descale.store(b, h, ds);
    auto inv = 1.0 / ds;
    for (auto s : tile(S, block("s2")))
      for_each_column_tile(x, rotation, b, h, s, rotate, "d2", [&](const IndexArg& c, const Tile& t) {
        auto scaled = t * inv;
        auto hi = scaled.to(y.dtype());
        switch (written) {
          case Written::rows: y.store(b, h, s, c, hi); break;
          case Written::hi_and_residual:
            y.store(b, h, s, 0, c, hi);
            y.store(b, h, s, 1, c, (scaled - hi.to(DType::f32)).to(y.dtype()));
            break;
          case Written::hi_twice:
            y.store(b, h, s, 0, c, hi);
            y.store(b, h, s, 1, c, hi);
            break;
        }
      });
  }
}

}  // namespace

namespace {
// Rows [begin, end) of chunk c when S rows are cut into partial.dim(2) chunks of whole 64-row
// tiles (so no tile crosses into the next chunk).
std::pair<Tile, Tile> chunk_rows(const Tile& S, const Tile& chunks, const Tile& c) {
  auto size = cdiv(cdiv(S, chunks), 64) * 64;
  return {c * size, minimum(c * size + size, S)};
}
// The per-(b, h) descale from the chunks' partial amaxes (every chunk's program computes it).
Tile chunked_descale(const In& partial, const Tile& b, const Tile& h, DType fp8) {
  auto mx = amax(partial.load(b, h, all), 0);
  return where(mx > 0.0, mx * (1.0 / fp8_max(fp8)), 1.0);
}
}  // namespace

const Kernel& chunk_amax() {
  static const Kernel k = kernel("chunk_amax", {"x", "partial"}, [](In x, Out partial) {
    auto [B, H, S, D] = x.shape<4>();
    auto C = partial.dim(2);
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H);
      auto h = bh % H;
      for (auto c : grid(C)) {
        auto [begin, end] = chunk_rows(S, C, c);
        partial.store(b, h, c, slice_amax(x, b, h, begin, end, "s"));
      }
    }
  });
  return k;
}

namespace {
// Chunk c of x[b, h] quantized with the descale from chunk amaxes `amaxes` ([B, H, C'], every
// chunk's program takes their max); `transpose` writes yᵀ [B, H, D, S_pad] (the last chunk's last
// tile reaches past S and loads zeros there, so yᵀ's pad columns [S, S_pad) get zeros). The C
// chunks are amaxes' own, or with `measured` (delayed scaling: `amaxes` are an earlier call's)
// measured's, whose [b, h, c] the same pass fills with the chunk's amax for the next call: x is
// read once, and values past the earlier amax saturate (to +-448 for e4m3). With `yt_too`, y as
// it is and yt_too transposed, both from the same read of x.
void quantize_chunks(const In& x, const In& amaxes, const Out& y, const Out& descale, bool transpose, const Out* measured = nullptr,
                     const Out* yt_too = nullptr) {
  auto [B, H, S, D] = x.shape<4>();
  auto C = measured ? measured->dim(2) : amaxes.dim(2);
  for (auto bh : grid(B * H)) {
    auto b = floordiv(bh, H);
    auto h = bh % H;
    for (auto c : grid(C)) {
      auto ds = chunked_descale(amaxes, b, h, y.dtype());
      descale.store(b, h, ds);   // the same value from every chunk
      auto inv = 1.0 / ds;
      auto [begin, end] = chunk_rows(S, C, c);
      auto rows = tile(begin, end, block("s2"));
      std::optional<Var> peak;
      if (measured) peak.emplace(zeros({rows, D}, DType::f32));
      for (auto s : rows) {
        auto t = x.load(b, h, s, all).to(DType::f32);
        if (peak) *peak = maximum(*peak, abs(t));
        auto q = (t * inv).to(y.dtype());
        if (transpose) y.store(b, h, all, s, q.T());
        else y.store(b, h, s, all, q);
        if (yt_too) yt_too->store(b, h, all, s, q.T());
      }
      if (measured) measured->store(b, h, c, amax(amax(*peak, 1), 0));
    }
  }
}
}  // namespace

const Kernel& quantize_fp8_chunked() {
  static const Kernel k = kernel("quantize_fp8_chunked", {"x", "partial", "y", "descale"},
                                 [](In x, In partial, Out y, Out descale) { quantize_chunks(x, partial, y, descale, false); });
  return k;
}

const Kernel& quantize_transpose_fp8_chunked() {
  static const Kernel k = kernel("quantize_transpose_fp8_chunked", {"x", "partial", "yt", "descale"},
                                 [](In x, In partial, Out yt, Out descale) { quantize_chunks(x, partial, yt, descale, true); });
  return k;
}

const Kernel& quantize_fp8_both_chunked() {
  static const Kernel k = kernel("quantize_fp8_both_chunked", {"x", "partial", "y", "yt", "descale"},
                                 [](In x, In partial, Out y, Out yt, Out descale) {
                                   quantize_chunks(x, partial, y, descale, false, nullptr, &yt);
                                 });
  return k;
}

const Kernel& quantize_fp8_delayed() {
  static const Kernel k = kernel("quantize_fp8_delayed", {"x", "prev", "y", "descale", "amax_out"},
                                 [](In x, In prev, Out y, Out descale, Out amax_out) {
                                   quantize_chunks(x, prev, y, descale, false, &amax_out);
                                 });
  return k;
}

const Kernel& quantize_transpose_fp8_delayed() {
  static const Kernel k = kernel("quantize_transpose_fp8_delayed", {"x", "prev", "yt", "descale", "amax_out"},
                                 [](In x, In prev, Out yt, Out descale, Out amax_out) {
                                   quantize_chunks(x, prev, yt, descale, true, &amax_out);
                                 });
  return k;
}


const Kernel& head_amax() {
  static const Kernel k = kernel("head_amax", {"x", "amax", "scale"}, [](In x, Out amax_out, Scalar scale) {
    auto [B, H, S, D] = x.shape<4>();
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H);
      auto h = bh % H;
      amax_out.store(b, h, slice_amax(x, b, h, constant(0, DType::i64), S, "s") * scale);
    }
  });
  return k;
}

const Kernel& quantize_fp8() {
  static const Kernel k = kernel(
      "quantize_fp8", {"x", "y", "descale"}, [](In x, Out y, Out descale) {
        auto [B, H, S, D] = x.shape<4>();
        for (auto bh : grid(B * H)) {
          auto b = floordiv(bh, H);
          auto h = bh % H;
          auto mx = slice_amax(x, b, h, constant(0, DType::i64), S, "s");
          auto ds = where(mx > 0.0, mx * (1.0 / fp8_max(y.dtype())), 1.0);
          descale.store(b, h, ds);
          auto inv = 1.0 / ds;
          for (auto s : tile(S, block("s2"))) {
            y.store(b, h, s, all, (x.load(b, h, s, all).to(DType::f32) * inv).to(y.dtype()));
          }
        }
      });
  return k;
}

const Kernel& quantize_transpose_fp8() {
  static const Kernel k = kernel(
      "quantize_transpose_fp8", {"x", "yt", "descale"}, [](In x, Out yt, Out descale) {
        auto [B, H, S, D] = x.shape<4>();
        for (auto bh : grid(B * H)) {
          auto b = floordiv(bh, H);
          auto h = bh % H;
          auto mx = slice_amax(x, b, h, constant(0, DType::i64), S, "s");
          auto ds = where(mx > 0.0, mx * (1.0 / fp8_max(yt.dtype())), 1.0);
          descale.store(b, h, ds);
          auto inv = 1.0 / ds;
          // Tiles past S load zeros, so the pad columns [S, S_pad) of the last tile get zeros.
          for (auto s : tile(S, block("s2"))) {
            auto q = (x.load(b, h, s, all).to(DType::f32) * inv).to(yt.dtype());
            yt.store(b, h, all, s, q.T());
          }
        }
      });
  return k;
}

const Kernel& quantize_hadamard_fp8() {
  static const Kernel k = kernel("quantize_hadamard_fp8", {"x", "rotation", "y", "descale"},
                                 [](In x, In rotation, Out y, Out descale) {
                                   check_rotation(x, rotation, "quantize_hadamard_fp8");
                                   quantize_rows(x, rotation, y, descale, /*rotate=*/true, Written::rows);
                                 });
  return k;
}

const Kernel& quantize_residual_fp8() {
  static const Kernel k = kernel("quantize_residual_fp8", {"x", "rotation", "y", "descale", "rotate"},
                                 [](In x, In rotation, Out y, Out descale, bool rotate) {
                                   if (rotate) check_rotation(x, rotation, "quantize_residual_fp8");
                                   check_halves(x, y, "quantize_residual_fp8");
                                   quantize_rows(x, rotation, y, descale, rotate, Written::hi_and_residual);
                                 });
  return k;
}

const Kernel& quantize_duplicate_fp8() {
  static const Kernel k = kernel("quantize_duplicate_fp8", {"x", "rotation", "y", "descale", "rotate"},
                                 [](In x, In rotation, Out y, Out descale, bool rotate) {
                                   if (rotate) check_rotation(x, rotation, "quantize_duplicate_fp8");
                                   check_halves(x, y, "quantize_duplicate_fp8");
                                   quantize_rows(x, rotation, y, descale, rotate, Written::hi_twice);
                                 });
  return k;
}

}  // namespace tj::kernels
