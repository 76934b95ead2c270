// The CPU reference executor (runtime/reference.h): kernels written in the DSL, run on host
// tensors and compared with plain float64 (or bit-exact float) computations written here.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dsl/config.h"
#include "dsl/kernel.h"
#include "core/error.h"
#include "core/numerics.h"
#include "runtime/reference.h"
#include "examples/kernels/user_kernels.h"

using namespace tj;
namespace num = tj::numerics;

namespace tj_codegen_test {   // tests/test_codegen.cpp
const tj::Kernel& k_running_columns();
const tj::Kernel& k_masked_store();
const tj::Kernel& k_int_reductions();
}  // namespace tj_codegen_test

namespace {

constexpr double kLog2e = 1.4426950408889634;
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// A host buffer and a view of it (contiguous unless strides are given).
struct RefTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;               // empty: contiguous
  std::vector<unsigned char> bytes;

  RefTensor(DType t, std::vector<int64_t> s, std::vector<int64_t> st = {}, int64_t storage_elems = -1)
      : dtype(t), shape(std::move(s)), strides(std::move(st)) {
    int64_t n = storage_elems;
    if (n < 0) {
      n = 1;
      for (int64_t d : shape) n *= d;
    }
    bytes.assign(static_cast<size_t>(n * size_bytes(t)), 0);
  }
  int64_t storage_elems() const { return static_cast<int64_t>(bytes.size()) / size_bytes(dtype); }
  TensorView view() { return TensorView{bytes.data(), dtype, shape, strides, Device::host}; }
  int64_t offset(const std::vector<int64_t>& idx) const {
    TensorView v{nullptr, dtype, shape, strides, Device::host};
    const std::vector<int64_t> st = v.effective_strides();
    int64_t o = 0;
    for (size_t d = 0; d < idx.size(); ++d) o += idx[d] * st[d];
    return o;
  }
  double get(const std::vector<int64_t>& idx) const { return num::load_element(bytes.data(), dtype, offset(idx)); }
  void set(const std::vector<int64_t>& idx, double v) { num::store_element(bytes.data(), dtype, offset(idx), v); }
  double raw(int64_t storage_index) const { return num::load_element(bytes.data(), dtype, storage_index); }
  void fill_storage(double v) {
    for (int64_t i = 0; i < storage_elems(); ++i) num::store_element(bytes.data(), dtype, i, v);
  }
};

// Random values away from zero: magnitude in [0.25, 1.25), random sign.
double nonzero(std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0.25, 1.25);
  return (rng() & 1u) ? u(rng) : -u(rng);
}

Config blocks(std::map<std::string, int64_t> b) {
  Config c;
  c.blocks = std::move(b);
  return c;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Kernel vector_add() {
  return kernel("vadd", {"a", "b", "c"}, [](In a, In b, Out c) {
    auto [N] = a.shape<1>();
    for (auto t : tile(N, block("b"))) c.store(t, a.load(t) + b.load(t));
  });
}

// Row softmax with an online max/sum in base 2, then a second pass that normalizes.
Kernel row_softmax() {
  return kernel("softmax", {"x", "y"}, [](In x, Out y) {
    auto [R, C] = x.shape<2>();
    for (auto r : tile(R, block("r"))) {
      Var m_i = full({r}, -INFINITY, DType::f32);
      Var l_i = zeros({r}, DType::f32);
      for (auto n : tile(C, block("n"))) {
        auto s = x.load(r, n) * kLog2e;
        auto m_new = maximum(m_i, amax(s, 1));
        l_i = l_i * exp2(m_i - m_new) + sum(exp2(s - m_new.col()), 1);
        m_i = m_new;
      }
      for (auto n : tile(C, block("n2"))) {
        auto s = x.load(r, n) * kLog2e;
        y.store(r, n, exp2(s - m_i.col()) / l_i.col());
      }
    }
  });
}

// The attention forward of /tmp/t1.cpp (DESIGN.md's sketch).
Kernel attention() {
  return kernel("attention", {"q", "k", "v", "o", "qk_scale", "causal"},
                [](In q, In k, In v, Out o, Scalar qk_scale, bool causal) {
                  auto [B, H, S, D] = q.shape<4>();
                  for (auto bh : grid(B * H)) {
                    Int b = floordiv(bh, H);
                    Int h = bh % H;
                    for (auto m : tile(S, block("m"))) {
                      Var m_i = full({m}, -INFINITY, DType::f32);
                      Var l_i = zeros({m}, DType::f32);
                      Var acc = zeros({m, D}, DType::f32);
                      auto qt = q.load(b, h, m, all);
                      for (auto n : tile(causal ? m.end() : S, block("n"))) {
                        auto s = dot(qt, k.load(b, h, n, all).T()) * qk_scale;
                        if (causal) s = where(m.index().col() >= n.index().row(), s, -INFINITY);
                        auto m_new = maximum(m_i, amax(s, 1));
                        auto p = exp2(s - m_new.col());
                        auto alpha = exp2(m_i - m_new);
                        l_i = l_i * alpha + sum(p, 1);
                        acc = dot(p.to(v.dtype()), v.load(b, h, n, all), acc * alpha.col());
                        m_i = m_new;
                      }
                      o.store(b, h, m, all, (acc / l_i.col()).to(o.dtype()));
                    }
                  }
                });
}

// float64 attention over the values held by q, k, v (contiguous, already rounded to their dtype).
std::vector<double> attention_f64(const RefTensor& q, const RefTensor& k, const RefTensor& v, double qk_scale,
                                  bool causal) {
  const int64_t B = q.shape[0], H = q.shape[1], S = q.shape[2], D = q.shape[3];
  auto values = [](const RefTensor& t) {
    std::vector<double> out(t.storage_elems());
    for (int64_t i = 0; i < t.storage_elems(); ++i) out[i] = t.raw(i);
    return out;
  };
  const std::vector<double> Q = values(q), K = values(k), V = values(v);
  std::vector<double> out(B * H * S * D);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < S; ++i) {
      const double* qi = &Q[(bh * S + i) * D];
      const int64_t nk = causal ? i + 1 : S;
      std::vector<double> s(nk);
      double mx = -INFINITY;
      for (int64_t j = 0; j < nk; ++j) {
        const double* kj = &K[(bh * S + j) * D];
        double dotp = 0;
        for (int64_t d = 0; d < D; ++d) dotp += qi[d] * kj[d];
        s[j] = dotp * qk_scale;
        mx = std::max(mx, s[j]);
      }
      double l = 0;
      for (int64_t j = 0; j < nk; ++j) l += s[j] = std::exp2(s[j] - mx);
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j < nk; ++j) o += s[j] * V[(bh * S + j) * D + d];
        out[(bh * S + i) * D + d] = o / l;
      }
    }
  return out;
}

}  // namespace

TEST_CASE("reference: vector add with a length that is not a multiple of the block") {
  const Kernel k = vector_add();
  const int64_t N = 1000, pad = 37;
  std::mt19937 rng(1);
  for (int64_t spec_n : {N, int64_t(-1)}) {
    const ir::Function f = k.trace({TensorSpec{DType::f32, {spec_n}}, TensorSpec{DType::f32, {spec_n}},
                                    TensorSpec{DType::f32, {spec_n}}});
    RefTensor a(DType::f32, {N}), b(DType::f32, {N}), c(DType::f32, {N}, {}, N + pad);
    for (int64_t i = 0; i < N; ++i) {
      a.set({i}, nonzero(rng));
      b.set({i}, nonzero(rng));
    }
    for (int64_t blk : {1, 16, 64, 128, 256, 1024}) {
      c.fill_storage(kNaN);
      const Config cfg = blocks({{"b", blk}});
      run_reference(f, cfg, {a.view(), b.view(), c.view()});
      for (int64_t i = 0; i < N; ++i) {
        const float want = static_cast<float>(a.get({i}) + b.get({i}));   // exact f32 add
        REQUIRE(c.get({i}) == want);
      }
      for (int64_t i = N; i < N + pad; ++i) REQUIRE(std::isnan(c.raw(i)));   // nothing past the end
      const LaunchShape ls = launch_shape(f, cfg, {a.view(), b.view(), c.view()});
      CHECK(ls.extents == std::vector<int64_t>{(N + blk - 1) / blk});
      CHECK(ls.programs == (N + blk - 1) / blk);
    }
  }
}

TEST_CASE("reference: an input that shares memory with a tensor the kernel writes is refused, naming both") {
  const Kernel k = vector_add();
  const int64_t N = 64;
  const ir::Function f = k.trace({TensorSpec{DType::f32, {N}}, TensorSpec{DType::f32, {N}}, TensorSpec{DType::f32, {N}}});
  std::vector<float> buf(3 * N, 1.0f);
  auto view = [&](int64_t at, std::vector<int64_t> strides = {}) {
    TensorView t;
    t.data = buf.data() + at;
    t.dtype = DType::f32;
    t.shape = {N};
    t.strides = std::move(strides);
    return t;
  };
  const std::string refused = "kernel 'vadd': input 'b' shares memory with 'c', which the kernel writes: an input (tj::In) must not "
                              "change during a launch; pass separate buffers, or declare 'b' tj::InOut";
  // b and c the same buffer; c overlapping b's last element; c starting inside b
  CHECK_THROWS_WITH_AS(run_reference(f, blocks({{"b", 16}}), {view(0), view(N), view(N)}), refused.c_str(), Error);
  CHECK_THROWS_WITH_AS(run_reference(f, blocks({{"b", 16}}), {view(0), view(N), view(2 * N - 1)}), refused.c_str(), Error);
  CHECK_THROWS_WITH_AS(launch_shape(f, blocks({{"b", 16}}), {view(0), view(N), view(N + 1, {1})}), refused.c_str(), Error);
  // Inputs may share memory with each other; neighbours that do not overlap are fine.
  CHECK_NOTHROW(run_reference(f, blocks({{"b", 16}}), {view(0), view(0), view(N)}));
  CHECK_NOTHROW(run_reference(f, blocks({{"b", 16}}), {view(0), view(N), view(2 * N)}));
  // An input slot the kernel never reads may hold any tensor (a library kernel's unused operand).
  const Kernel ignores_b = kernel("copy_a", {"a", "b", "c"}, [](In a, In b, Out c) {
    for (auto t : tile(a.dim(0), block("b"))) c.store(t, a.load(t));
  });
  const ir::Function g = ignores_b.trace({TensorSpec{DType::f32, {N}}, TensorSpec{DType::f32, {N}}, TensorSpec{DType::f32, {N}}});
  CHECK_NOTHROW(run_reference(g, blocks({{"b", 16}}), {view(0), view(N), view(N)}));
}

TEST_CASE("reference: an inner grid whose bound reads the outer grid's index runs inside each program") {
  // The launch grid is computed on the host before any program runs (only the enclosing launch
  // loops' and the body's own ops are evaluated there): a grid whose extent depends on an outer
  // index is no launch loop.
  const Kernel k = kernel("triangle", {"x", "y"}, [](In x, Out y) {
    for (auto i : grid(x.dim(0)))
      for (auto j : grid(i + 1)) y.store(i, j, x.load(i, j));
  });
  const ir::Function f = k.trace({TensorSpec{DType::f32, {8, 8}}, TensorSpec{DType::f32, {8, 8}}});
  std::vector<float> xs(64, 1.0f), ys(64, 0.0f);
  TensorView x{xs.data(), DType::f32, {8, 8}, {}, Device::host}, y{ys.data(), DType::f32, {8, 8}, {}, Device::host};
  for (int64_t i = 0; i < 64; ++i) xs[i] = static_cast<float>(i + 1);
  CHECK(launch_shape(f, Config{}, {x, y}).extents == std::vector<int64_t>{8});
  run_reference(f, Config{}, {x, y});
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 8; ++j) CHECK(ys[i * 8 + j] == (j <= i ? xs[i * 8 + j] : 0.0f));
}

TEST_CASE("reference: strided (non-contiguous) views are read and written through their strides") {
  const Kernel k = vector_add();
  const ir::Function f = k.trace({TensorSpec{DType::f32, {-1}}, TensorSpec{DType::f32, {-1}}, TensorSpec{DType::f32, {-1}}});
  const int64_t N = 203;
  std::mt19937 rng(2);
  RefTensor a(DType::f32, {N}, {3}, 3 * N), b(DType::f32, {N}, {-1}, N), c(DType::f32, {N}, {2}, 2 * N);
  a.fill_storage(kNaN);   // the gaps must never be read
  for (int64_t i = 0; i < N; ++i) a.set({i}, nonzero(rng));
  // b: a reversed view (negative stride), its data pointer at the last element.
  std::vector<double> bvals(N);
  for (int64_t i = 0; i < N; ++i) bvals[i] = static_cast<float>(nonzero(rng));
  for (int64_t i = 0; i < N; ++i) num::store_element(b.bytes.data(), DType::f32, N - 1 - i, bvals[i]);
  TensorView bv = b.view();
  bv.data = b.bytes.data() + (N - 1) * 4;
  c.fill_storage(kNaN);
  run_reference(f, blocks({{"b", 32}}), {a.view(), bv, c.view()});
  for (int64_t i = 0; i < N; ++i) {
    REQUIRE(c.raw(2 * i) == static_cast<float>(a.raw(3 * i) + bvals[i]));
    REQUIRE(std::isnan(c.raw(2 * i + 1)));   // between the strided elements: untouched
  }

  // A transposed 2-D input (strides {1, R}) through the row softmax.
  const Kernel sm = row_softmax();
  const ir::Function g = sm.trace({TensorSpec{DType::f32, {-1, -1}}, TensorSpec{DType::f32, {-1, -1}}});
  const int64_t R = 19, C = 45;
  RefTensor xt(DType::f32, {R, C}, {1, R}, R * C), y(DType::f32, {R, C});
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) xt.set({i, j}, 3 * nonzero(rng));
  y.fill_storage(kNaN);
  run_reference(g, blocks({{"r", 8}, {"n", 16}, {"n2", 32}}), {xt.view(), y.view()});
  for (int64_t i = 0; i < R; ++i) {
    double mx = -INFINITY, l = 0;
    for (int64_t j = 0; j < C; ++j) mx = std::max(mx, xt.get({i, j}));
    for (int64_t j = 0; j < C; ++j) l += std::exp(xt.get({i, j}) - mx);
    for (int64_t j = 0; j < C; ++j) REQUIRE(y.get({i, j}) == doctest::Approx(std::exp(xt.get({i, j}) - mx) / l).epsilon(2e-6));
  }
}

TEST_CASE("reference: a kernel with strides compiled in runs on tensors with those strides and names any other") {
  const Kernel k = vector_add();
  const int64_t N = 203;
  // contiguous_spec compiles in the unit stride, as launch() does for a contiguous tensor.
  const TensorSpec unit = contiguous_spec(DType::f32, {-1});
  CHECK(unit.strides == std::vector<int64_t>{1});
  const ir::Function f = k.trace({unit, unit, unit});
  CHECK(f.params[0].static_stride(0) == 1);
  std::mt19937 rng(3);
  RefTensor a(DType::f32, {N}), b(DType::f32, {N}), c(DType::f32, {N}), wide(DType::f32, {N}, {2}, 2 * N);
  for (int64_t i = 0; i < N; ++i) {
    a.set({i}, nonzero(rng));
    b.set({i}, nonzero(rng));
    wide.set({i}, nonzero(rng));
  }
  c.fill_storage(kNaN);
  run_reference(f, blocks({{"b", 64}}), {a.view(), b.view(), c.view()});
  for (int64_t i = 0; i < N; ++i) REQUIRE(c.get({i}) == static_cast<float>(a.get({i}) + b.get({i})));
  CHECK_THROWS_WITH_AS(run_reference(f, blocks({{"b", 64}}), {a.view(), wide.view(), c.view()}),
                       "kernel 'vadd': argument 'b': stride 0 is 2 but the kernel was compiled for stride 1 there "
                       "(f32[203] (host))",
                       Error);
  CHECK_THROWS_WITH_AS(launch_shape(f, blocks({{"b", 64}}), {a.view(), b.view(), wide.view()}),
                       doctest::Contains("argument 'c': stride 0 is 2 but the kernel was compiled for stride 1"), Error);

  // What a spec may say about strides.
  CHECK_THROWS_WITH_AS(k.trace({TensorSpec{DType::f32, {N}, {1, 1}}, unit, unit}),
                       "kernel 'vadd': tensor 'a' has 2 strides in its spec for 1 dims", Error);
  CHECK_THROWS_WITH_AS(k.trace({unit, TensorSpec{DType::f32, {N}, {-2}}, unit}),
                       "kernel 'vadd': tensor 'b': stride 0 in its spec is -2 (a stride is -1, dynamic, or >= 0)", Error);
  // Row-major strides past a dynamic dim depend on its size: not compiled in.
  CHECK(contiguous_spec(DType::f32, {4, -1, 3}).strides == std::vector<int64_t>{-1, -1, 1});
  CHECK(contiguous_spec(DType::f32, {4, 1}).strides == std::vector<int64_t>{1, 1});
  CHECK(contiguous_spec(DType::f32, {4, 5}).strides == std::vector<int64_t>{-1, 1});
  CHECK(spec_key({unit}) != spec_key({TensorSpec{DType::f32, {-1}}}));
}

TEST_CASE("reference: row softmax with an online max/sum, static and dynamic shapes") {
  const Kernel k = row_softmax();
  std::mt19937 rng(3);
  struct Shape2 { int64_t R, C; };
  for (bool dynamic : {false, true}) {
    for (Shape2 s : {Shape2{37, 100}, Shape2{5, 3}, Shape2{64, 64}, Shape2{1, 1}, Shape2{33, 257}}) {
      const std::vector<int64_t> spec = dynamic ? std::vector<int64_t>{-1, -1} : std::vector<int64_t>{s.R, s.C};
      const ir::Function f = k.trace({TensorSpec{DType::f32, spec}, TensorSpec{DType::f32, spec}});
      RefTensor x(DType::f32, {s.R, s.C}), y(DType::f32, {s.R, s.C});
      for (int64_t i = 0; i < s.R; ++i)
        for (int64_t j = 0; j < s.C; ++j) x.set({i, j}, 4 * nonzero(rng));
      std::vector<double> want(s.R * s.C);
      for (int64_t i = 0; i < s.R; ++i) {
        double mx = -INFINITY, l = 0;
        for (int64_t j = 0; j < s.C; ++j) mx = std::max(mx, x.get({i, j}));
        for (int64_t j = 0; j < s.C; ++j) l += std::exp(x.get({i, j}) - mx);
        for (int64_t j = 0; j < s.C; ++j) want[i * s.C + j] = std::exp(x.get({i, j}) - mx) / l;
      }
      for (auto cfg : {blocks({{"r", 1}, {"n", 1}, {"n2", 1}}), blocks({{"r", 16}, {"n", 32}, {"n2", 64}}),
                       blocks({{"r", 64}, {"n", 128}, {"n2", 16}}), blocks({{"r", 4}, {"n", 512}, {"n2", 512}})}) {
        y.fill_storage(kNaN);
        run_reference(f, cfg, {x.view(), y.view()});
        double worst = 0;
        for (int64_t i = 0; i < s.R * s.C; ++i) {
          const double got = y.raw(i);
          REQUIRE(!std::isnan(got));
          worst = std::max(worst, std::fabs(got - want[i]) / want[i]);
        }
        CHECK(worst < 3e-6);
        const LaunchShape ls = launch_shape(f, cfg, {x.view(), y.view()});
        CHECK(ls.extents == std::vector<int64_t>{(s.R + cfg.blocks.at("r") - 1) / cfg.blocks.at("r")});
      }
    }
  }
}

TEST_CASE("reference: attention forward, causal and not, several block configs agree") {
  const Kernel k = attention();
  const int64_t B = 2, H = 3, S = 77, D = 32;
  std::mt19937 rng(4);
  RefTensor q(DType::f32, {B, H, S, D}), kk(DType::f32, {B, H, S, D}), v(DType::f32, {B, H, S, D}),
      o(DType::f32, {B, H, S, D});
  for (int64_t i = 0; i < q.storage_elems(); ++i) {
    num::store_element(q.bytes.data(), DType::f32, i, nonzero(rng));
    num::store_element(kk.bytes.data(), DType::f32, i, nonzero(rng));
    num::store_element(v.bytes.data(), DType::f32, i, nonzero(rng));
  }
  const float qk_scale = static_cast<float>(kLog2e / std::sqrt(double(D)));
  for (bool causal : {false, true}) {
    for (bool dynamic_s : {false, true}) {
      const TensorSpec spec{DType::f32, {B, H, dynamic_s ? -1 : S, D}};
      const ir::Function f = k.trace({spec, spec, spec, spec, RuntimeScalar{qk_scale}, causal});
      const std::vector<double> want = attention_f64(q, kk, v, qk_scale, causal);
      std::vector<double> first;
      for (auto cfg : {blocks({{"m", 16}, {"n", 16}}), blocks({{"m", 32}, {"n", 16}}), blocks({{"m", 16}, {"n", 64}}),
                       blocks({{"m", 64}, {"n", 32}}), blocks({{"m", 128}, {"n", 128}}), blocks({{"m", 8}, {"n", 1}})}) {
        o.fill_storage(kNaN);
        const std::vector<ArgValue> args{q.view(), kk.view(), v.view(), o.view(), qk_scale};
        run_reference(f, cfg, args);
        double worst = 0;
        std::vector<double> got(want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          got[i] = o.raw(static_cast<int64_t>(i));
          REQUIRE(!std::isnan(got[i]));
          worst = std::max(worst, std::fabs(got[i] - want[i]));
        }
        CHECK(worst < 2e-5);
        if (first.empty()) first = got;
        for (size_t i = 0; i < got.size(); ++i) REQUIRE(std::fabs(got[i] - first[i]) < 2e-5);
        const LaunchShape ls = launch_shape(f, cfg, args);
        const int64_t bm = cfg.blocks.at("m");
        CHECK(ls.extents == std::vector<int64_t>{B * H, (S + bm - 1) / bm});
        CHECK(ls.programs == B * H * ((S + bm - 1) / bm));
      }
    }
  }
}

TEST_CASE("reference: bf16 attention (P cast to bf16) stays close to float64") {
  const Kernel k = attention();
  const int64_t B = 1, H = 2, S = 50, D = 16;
  std::mt19937 rng(5);
  RefTensor q(DType::bf16, {B, H, S, D}), kk(DType::bf16, {B, H, S, D}), v(DType::bf16, {B, H, S, D}),
      o(DType::bf16, {B, H, S, D});
  for (int64_t i = 0; i < q.storage_elems(); ++i) {
    num::store_element(q.bytes.data(), DType::bf16, i, nonzero(rng));
    num::store_element(kk.bytes.data(), DType::bf16, i, nonzero(rng));
    num::store_element(v.bytes.data(), DType::bf16, i, nonzero(rng));
  }
  const float qk_scale = static_cast<float>(kLog2e / std::sqrt(double(D)));
  const TensorSpec spec{DType::bf16, {B, H, S, D}};
  const ir::Function f = k.trace({spec, spec, spec, spec, RuntimeScalar{qk_scale}, true});
  const std::vector<double> want = attention_f64(q, kk, v, qk_scale, true);
  for (auto cfg : {blocks({{"m", 16}, {"n", 16}}), blocks({{"m", 64}, {"n", 32}})}) {
    o.fill_storage(kNaN);
    run_reference(f, cfg, {q.view(), kk.view(), v.view(), o.view(), qk_scale});
    for (size_t i = 0; i < want.size(); ++i) {
      const double got = o.raw(static_cast<int64_t>(i));
      REQUIRE(std::fabs(got - want[i]) < 1e-2);
      REQUIRE(got == num::round_double_to(DType::bf16, got));   // stored as bf16
    }
  }
}

TEST_CASE("reference: the README attention's lazy running max (moved only by more than 8) matches float64 where the scores climb across key blocks") {
  // Keys whose scores grow along the sequence (about 5.6 log2 units per 32 keys against every
  // query): the running max moves in some blocks and stays in others, so p reaches up to 2^8 and
  // alpha is exactly 1 in the blocks where it stays.
  const Kernel& k = examples::readme_attention();
  const int64_t B = 1, H = 2, S = 192, D = 16;
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0.0, 1.0);
  RefTensor q(DType::f32, {B, H, S, D}), kk(DType::f32, {B, H, S, D}), v(DType::f32, {B, H, S, D}),
      o(DType::f32, {B, H, S, D});
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t j = 0; j < S; ++j)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t i = (bh * S + j) * D + d;
        num::store_element(q.bytes.data(), DType::f32, i, d == 0 ? 1.0 + 0.1 * nd(rng) : 0.3 * nd(rng));
        num::store_element(kk.bytes.data(), DType::f32, i, d == 0 ? 0.5 * double(j) : 0.3 * nd(rng));
        num::store_element(v.bytes.data(), DType::f32, i, nd(rng));
      }
  const float qk_scale = static_cast<float>(kLog2e / std::sqrt(double(D)));
  const TensorSpec spec{DType::f32, {B, H, S, D}};
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const ir::Function f = k.trace({spec, spec, spec, spec, RuntimeScalar{qk_scale}, causal});
    const std::vector<double> want = attention_f64(q, kk, v, qk_scale, causal);
    for (auto cfg : {blocks({{"m", 32}, {"n", 32}}), blocks({{"m", 64}, {"n", 64}})}) {
      CAPTURE(cfg.to_json());
      o.fill_storage(kNaN);
      run_reference(f, cfg, {q.view(), kk.view(), v.view(), o.view(), qk_scale});
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const double d = std::fabs(o.raw(static_cast<int64_t>(i)) - want[i]);
        if (!(d <= worst)) worst = d;   // a NaN sticks
      }
      CHECK(worst < 1e-4);
    }
  }
}

TEST_CASE("reference: bf16 and e4m3 cast paths are bit-exact with tj::numerics") {
  std::mt19937 rng(6);
  // f32 -> (scaled) -> bf16 / e4m3 / e5m2 / f16, the scale a runtime scalar.
  const Kernel quant = kernel("quant", {"x", "yb", "y8", "y5", "yh", "scale"},
                              [](In x, Out yb, Out y8, Out y5, Out yh, Scalar scale) {
                                auto [N] = x.shape<1>();
                                for (auto t : tile(N, block("b"))) {
                                  auto s = x.load(t) * scale;
                                  yb.store(t, s.to(DType::bf16));
                                  y8.store(t, s.to(DType::e4m3));
                                  y5.store(t, s.to(DType::e5m2));
                                  yh.store(t, s.to(DType::f16));
                                }
                              });
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, 1.0625f, 1.1875f, 464.0f, 465.0f, 1e6f, -1e6f, 57344.0f, 61440.0f,
                           70000.0f, INFINITY, -INFINITY, NAN, -NAN, std::ldexp(1.0f, -10), std::ldexp(1.5f, -9),
                           std::ldexp(1.0f, -17), 1.00390625f, 1.01171875f, 65519.0f, 65520.0f, 3.4e38f};
  while (xs.size() < 3000) {
    std::uniform_real_distribution<double> e(-20, 20);
    xs.push_back(static_cast<float>(nonzero(rng) * std::exp2(e(rng))));
  }
  const int64_t N = static_cast<int64_t>(xs.size());
  const ir::Function f = quant.trace({TensorSpec{DType::f32, {-1}}, TensorSpec{DType::bf16, {-1}},
                                      TensorSpec{DType::e4m3, {-1}}, TensorSpec{DType::e5m2, {-1}},
                                      TensorSpec{DType::f16, {-1}}, RuntimeScalar{1.0f}});
  RefTensor x(DType::f32, {N}), yb(DType::bf16, {N}), y8(DType::e4m3, {N}), y5(DType::e5m2, {N}), yh(DType::f16, {N});
  for (int64_t i = 0; i < N; ++i) x.set({i}, xs[i]);
  for (float scale : {1.0f, 0.37f, -3.0f}) {
    run_reference(f, blocks({{"b", 128}}), {x.view(), yb.view(), y8.view(), y5.view(), yh.view(), scale});
    for (int64_t i = 0; i < N; ++i) {
      const float s = xs[i] * scale;   // the kernel's f32 multiply
      uint16_t b16, h16;
      std::memcpy(&b16, &yb.bytes[2 * i], 2);
      std::memcpy(&h16, &yh.bytes[2 * i], 2);
      REQUIRE(b16 == num::f32_to_bf16(s));
      REQUIRE(y8.bytes[i] == num::f32_to_e4m3(s));
      REQUIRE(y5.bytes[i] == num::f32_to_e5m2(s));
      REQUIRE(h16 == num::f32_to_f16(s));
    }
  }

  // bf16 arithmetic computes in f32 and rounds to bf16; fp8 inputs convert exactly.
  const Kernel arith = kernel("arith", {"a", "b", "c", "e", "ef", "eb"}, [](In a, In b, Out c, In e, Out ef, Out eb) {
    auto [N] = a.shape<1>();
    for (auto t : tile(N, block("b"))) {
      c.store(t, a.load(t) * b.load(t) + a.load(t));
      ef.store(t, e.load(t).to(DType::f32));
      eb.store(t, e.load(t).to(DType::bf16));
    }
  });
  const int64_t M = 256;
  const ir::Function g = arith.trace({TensorSpec{DType::bf16, {M}}, TensorSpec{DType::bf16, {M}},
                                      TensorSpec{DType::bf16, {M}}, TensorSpec{DType::e4m3, {M}},
                                      TensorSpec{DType::f32, {M}}, TensorSpec{DType::bf16, {M}}});
  RefTensor a(DType::bf16, {M}), b(DType::bf16, {M}), c(DType::bf16, {M}), e(DType::e4m3, {M}), ef(DType::f32, {M}),
      eb(DType::bf16, {M});
  for (int64_t i = 0; i < M; ++i) {
    a.set({i}, 10 * nonzero(rng));
    b.set({i}, 10 * nonzero(rng));
    e.bytes[i] = static_cast<unsigned char>(i);   // all 256 codes
  }
  run_reference(g, blocks({{"b", 64}}), {a.view(), b.view(), c.view(), e.view(), ef.view(), eb.view()});
  for (int64_t i = 0; i < M; ++i) {
    const float av = static_cast<float>(a.get({i})), bv = static_cast<float>(b.get({i}));
    const float prod = num::bf16_to_f32(num::f32_to_bf16(av * bv));          // mul: f32, then bf16
    const uint16_t want = num::f32_to_bf16(prod + av);                       // add: f32, then bf16
    uint16_t got;
    std::memcpy(&got, &c.bytes[2 * i], 2);
    REQUIRE(got == want);
    const float ev = num::e4m3_to_f32(static_cast<uint8_t>(i));
    const double efv = ef.get({i});
    REQUIRE(((std::isnan(ev) && std::isnan(efv)) || efv == ev));
    const double ebv = eb.get({i});
    REQUIRE(((std::isnan(ev) && std::isnan(ebv)) || ebv == ev));           // fp8 values are exact in bf16
  }
}

TEST_CASE("reference: fp8 GEMM accumulates in float, k ascending, one rounding per add") {
  const Kernel gemm = kernel("gemm", {"a", "b", "c"}, [](In a, In b, Out c) {
    auto [M, K] = a.shape<2>();
    auto [K2, N] = b.shape<2>();
    (void)K2;
    for (auto m : tile(M, block("m")))
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        for (auto k : tile(K, block("k"))) acc = dot(a.load(m, k), b.load(k, n), acc);
        c.store(m, n, acc);
      }
  });
  const int64_t M = 37, K = 83, N = 29;
  std::mt19937 rng(8);
  RefTensor a(DType::e4m3, {M, K}), b(DType::e5m2, {K, N}), c(DType::f32, {M, N});
  for (int64_t i = 0; i < M * K; ++i) num::store_element(a.bytes.data(), DType::e4m3, i, 20 * nonzero(rng));
  for (int64_t i = 0; i < K * N; ++i) num::store_element(b.bytes.data(), DType::e5m2, i, 20 * nonzero(rng));
  const ir::Function f = gemm.trace({TensorSpec{DType::e4m3, {-1, -1}}, TensorSpec{DType::e5m2, {-1, -1}},
                                     TensorSpec{DType::f32, {-1, -1}}});
  for (auto cfg : {blocks({{"m", 16}, {"n", 16}, {"k", 16}}), blocks({{"m", 64}, {"n", 8}, {"k", 128}}),
                   blocks({{"m", 1}, {"n", 32}, {"k", 1}})}) {
    c.fill_storage(kNaN);
    run_reference(f, cfg, {a.view(), b.view(), c.view()});
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float acc = 0;
        for (int64_t kk = 0; kk < K; ++kk)
          acc += static_cast<float>(a.get({i, kk})) * static_cast<float>(b.get({kk, j}));   // products exact
        REQUIRE(c.get({i, j}) == acc);
      }
    const LaunchShape ls = launch_shape(f, cfg, {a.view(), b.view(), c.view()});
    const int64_t bm = cfg.blocks.at("m"), bn = cfg.blocks.at("n");
    CHECK(ls.extents == std::vector<int64_t>{(M + bm - 1) / bm, (N + bn - 1) / bn});
  }
}

TEST_CASE("reference: masked loads and stores at scalar indices with dynamic shapes") {
  // y has more elements than x: the loads past x's end give 0. z has fewer: stores past its
  // end are skipped.
  const Kernel k = kernel("pad", {"x", "y", "z"}, [](In x, Out y, Out z) {
    auto [M] = y.shape<1>();
    for (auto i : grid(M)) {
      auto v = x.load(i) + 1.0;
      y.store(i, v);
      z.store(i, v * 2.0);
    }
  });
  const ir::Function f = k.trace({TensorSpec{DType::f32, {-1}}, TensorSpec{DType::f32, {-1}}, TensorSpec{DType::f32, {-1}}});
  RefTensor x(DType::f32, {5}), y(DType::f32, {8}), z(DType::f32, {3}, {}, 8);
  for (int64_t i = 0; i < 5; ++i) x.set({i}, 0.5 * (i + 1));
  y.fill_storage(kNaN);
  z.fill_storage(kNaN);
  run_reference(f, Config{}, {x.view(), y.view(), z.view()});
  for (int64_t i = 0; i < 8; ++i) CHECK(y.get({i}) == (i < 5 ? 0.5 * (i + 1) + 1 : 1.0));
  for (int64_t i = 0; i < 3; ++i) CHECK(z.get({i}) == 2 * (0.5 * (i + 1) + 1));
  for (int64_t i = 3; i < 8; ++i) CHECK(std::isnan(z.raw(i)));
  CHECK(launch_shape(f, Config{}, {x.view(), y.view(), z.view()}).extents == std::vector<int64_t>{8});

  // A scalar stored into a block slice (tracing keeps the value rank 0): every in-bounds
  // element gets it, nothing past the end.
  const Kernel fill = kernel("fill", {"y"}, [](Out y) {
    auto [N] = y.shape<1>();
    for (auto t : tile(N, block("b"))) y.store(t, 0.5);
  });
  const ir::Function ff = fill.trace({TensorSpec{DType::bf16, {-1}}});
  RefTensor yb(DType::bf16, {10}, {}, 12);
  yb.fill_storage(kNaN);
  run_reference(ff, blocks({{"b", 4}}), {yb.view()});
  for (int64_t i = 0; i < 12; ++i) CHECK((i < 10 ? yb.raw(i) == 0.5 : std::isnan(yb.raw(i))));

  // A 2-D block load at the corner of a dynamic tensor: rows and columns past the end read 0.
  const Kernel corner = kernel("corner", {"x", "y"}, [](In x, Out y) {
    auto [R, C] = x.shape<2>();
    for (auto r : tile(R, block("r")))
      for (auto c : tile(C, block("c"))) y.store(r, c, x.load(r, c) + sum(x.load(r, c), 1).col());
  });
  const ir::Function g = corner.trace({TensorSpec{DType::f32, {-1, -1}}, TensorSpec{DType::f32, {-1, -1}}});
  std::mt19937 rng(9);
  RefTensor x2(DType::f32, {13, 7}), y2(DType::f32, {13, 7});
  for (int64_t i = 0; i < 13 * 7; ++i) num::store_element(x2.bytes.data(), DType::f32, i, nonzero(rng));
  y2.fill_storage(kNaN);
  run_reference(g, blocks({{"r", 8}, {"c", 4}}), {x2.view(), y2.view()});
  for (int64_t i = 0; i < 13; ++i)
    for (int64_t j = 0; j < 7; ++j) {
      const int64_t c0 = j / 4 * 4;
      float s = 0;
      for (int64_t jj = c0; jj < std::min<int64_t>(c0 + 4, 7); ++jj) s += static_cast<float>(x2.get({i, jj}));
      REQUIRE(y2.get({i, j}) == static_cast<float>(x2.get({i, j}) + s));
    }
}

TEST_CASE("reference: integer ops (floordiv, mod, div, cdiv) and scalar stores") {
  const Kernel k = kernel("ints", {"out"}, [](Out out) {
    auto [N, W] = out.shape<2>();
    (void)W;
    for (auto i : grid(N)) {
      Int v = i - 10;
      out.store(i, 0, floordiv(v, 3));
      out.store(i, 1, v % 3);
      out.store(i, 2, v / 3);
      out.store(i, 3, cdiv(v, 4));
      out.store(i, 4, v % -4);
    }
  });
  const ir::Function f = k.trace({TensorSpec{DType::i64, {21, 5}}});
  RefTensor out(DType::i64, {21, 5});
  run_reference(f, Config{}, {out.view()});
  for (int64_t i = 0; i < 21; ++i) {
    const int64_t v = i - 10;
    auto fdiv = [](int64_t a, int64_t b) { return static_cast<int64_t>(std::floor(double(a) / double(b))); };
    CHECK(out.get({i, 0}) == fdiv(v, 3));
    CHECK(out.get({i, 1}) == v - 3 * fdiv(v, 3));
    CHECK(out.get({i, 2}) == v / 3);                      // C++ truncates, as the IR's div
    CHECK(out.get({i, 3}) == fdiv(v + 3, 4));
    CHECK(out.get({i, 4}) == v - (-4) * fdiv(v, -4));     // sign of the divisor
  }
}

TEST_CASE("reference: Vars that hold a tile loop's tiles (per-column sums and max |x|) match float64 at ragged row counts") {
  std::mt19937 rng(29);
  std::normal_distribution<double> n(0.0, 2.0);
  for (int64_t R : {70, 64, 5}) {
    for (int64_t block : {16, 32, 128}) {
      CAPTURE(R);
      CAPTURE(block);
      const int64_t B = 3, C = 45;
      RefTensor x(DType::f32, {B, R, C}), out(DType::f32, {B, 2, C});
      for (int64_t i = 0; i < x.storage_elems(); ++i) num::store_element(x.bytes.data(), x.dtype, i, n(rng));
      out.fill_storage(kNaN);
      const ir::Function f = tj_codegen_test::k_running_columns().trace({TensorSpec{DType::f32, {B, R, C}}, TensorSpec{DType::f32, {B, 2, C}}});
      run_reference(f, blocks({{"r", block}}), {x.view(), out.view()});
      for (int64_t b = 0; b < B; ++b)
        for (int64_t c = 0; c < C; ++c) {
          double total = 0, peak = 0;
          for (int64_t r = 0; r < R; ++r) {
            total += x.get({b, r, c});
            peak = std::max(peak, std::abs(x.get({b, r, c})));
          }
          CHECK(out.get({b, 0, c}) == doctest::Approx(total).epsilon(1e-5).scale(10.0));
          CHECK(out.get({b, 1, c}) == peak);
        }
    }
  }
}

TEST_CASE("reference: store_where writes exactly the elements where its mask holds") {
  std::mt19937 rng(31);
  for (float alpha : {0.5f, -0.5f}) {
    CAPTURE(alpha);
    const int64_t R = 70, C = 45;
    RefTensor x(DType::f32, {R, C}), lower(DType::f32, {R, C}), even(DType::f32, {R, C}), gated(DType::f32, {R, C});
    for (int64_t i = 0; i < x.storage_elems(); ++i) num::store_element(x.bytes.data(), x.dtype, i, nonzero(rng));
    for (RefTensor* o : {&lower, &even, &gated}) o->fill_storage(kNaN);
    const TensorSpec spec{DType::f32, {R, C}};
    const ir::Function f = tj_codegen_test::k_masked_store().trace({spec, spec, spec, spec, RuntimeScalar{alpha}});
    run_reference(f, blocks({{"r", 32}, {"c", 16}}), {x.view(), lower.view(), even.view(), gated.view(), alpha});
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        CAPTURE(r);
        CAPTURE(c);
        const double v = x.get({r, c}) * double(alpha);
        if (r >= c) CHECK(lower.get({r, c}) == doctest::Approx(v));
        else CHECK(std::isnan(lower.get({r, c})));
        if (r % 2 == 0) CHECK(even.get({r, c}) == doctest::Approx(v + 1.0));
        else CHECK(std::isnan(even.get({r, c})));
        if (alpha > 0) CHECK(gated.get({r, c}) == doctest::Approx(2.0 * v));
        else CHECK(std::isnan(gated.get({r, c})));
      }
  }
}

TEST_CASE("reference: integer reductions accumulate in their dtype, i32 sums wrapping") {
  std::mt19937 rng(37);
  for (DType t : {DType::i32, DType::i64}) {
    CAPTURE(name(t));
    // i32: sums far past 2^31; i64: within the reference's +-2^53 (runtime/reference.h).
    const int64_t span = t == DType::i32 ? 2000000000 : 200000;
    std::uniform_int_distribution<int64_t> u(-span, span);
    const int64_t R = 70, C = 48, BR = 32, BC = 16, tiles = 3;
    RefTensor x(t, {R, C}), rsum(t, {R}), rmax(t, {R}), tmin(t, {tiles, C}), tsum(t, {tiles, C});
    for (int64_t i = 0; i < x.storage_elems(); ++i) num::store_element(x.bytes.data(), t, i, double(u(rng)));
    for (RefTensor* o : {&rsum, &rmax, &tmin, &tsum}) o->fill_storage(-777);
    const ir::Function f = tj_codegen_test::k_int_reductions().trace(
        {TensorSpec{t, {R, C}}, TensorSpec{t, {R}}, TensorSpec{t, {R}}, TensorSpec{t, {tiles, C}}, TensorSpec{t, {tiles, C}}});
    run_reference(f, blocks({{"r", BR}, {"c", BC}}), {x.view(), rsum.view(), rmax.view(), tmin.view(), tsum.view()});
    // The dtype's arithmetic, written here in 64-bit unsigned and narrowed.
    auto narrow = [&](uint64_t v) { return t == DType::i32 ? int64_t(int32_t(uint32_t(v))) : int64_t(v); };
    for (int64_t r = 0; r < R; ++r) {
      uint64_t s = 0;
      int64_t m = std::numeric_limits<int64_t>::min();
      for (int64_t c = 0; c < C; ++c) {
        const int64_t e = int64_t(x.get({r, c}));
        s += uint64_t(narrow(uint64_t(e) * 300000007u));
        m = std::max(m, e);
      }
      CHECK(int64_t(rsum.get({r})) == narrow(s));
      CHECK(int64_t(rmax.get({r})) == m);
    }
    for (int64_t i = 0; i < tiles; ++i)
      for (int64_t c = 0; c < C; ++c) {
        uint64_t s = 0;
        int64_t m = std::numeric_limits<int64_t>::max();
        for (int64_t r = i * BR; r < std::min(R, (i + 1) * BR); ++r) {   // rows past R are left out
          s += uint64_t(int64_t(x.get({r, c})));
          m = std::min(m, int64_t(x.get({r, c})));
        }
        CHECK(int64_t(tsum.get({i, c})) == narrow(s));
        CHECK(int64_t(tmin.get({i, c})) == m);
      }
  }
}

TEST_CASE("reference: launch shape without launch loops, and sequential loops") {
  // Two top-level loops: nothing is a launch loop, one program runs both in order.
  const Kernel k = kernel("two", {"x", "y"}, [](In x, Out y) {
    auto [N] = x.shape<1>();
    for (auto t : tile(N, block("a"))) y.store(t, x.load(t));
    for (auto t : tile(N, block("b"))) y.store(t, x.load(t) * 2.0);
  });
  const ir::Function f = k.trace({TensorSpec{DType::f32, {-1}}, TensorSpec{DType::f32, {-1}}});
  RefTensor x(DType::f32, {100}), y(DType::f32, {100});
  for (int64_t i = 0; i < 100; ++i) x.set({i}, i + 0.5);
  const LaunchShape ls = launch_shape(f, Config{}, {x.view(), y.view()});
  CHECK(ls.extents.empty());
  CHECK(ls.programs == 1);
  run_reference(f, blocks({{"a", 16}, {"b", 32}}), {x.view(), y.view()});
  for (int64_t i = 0; i < 100; ++i) CHECK(y.get({i}) == 2 * (i + 0.5));

  // An empty launch (N = 0): no program runs, nothing is touched.
  RefTensor x0(DType::f32, {0}), y0(DType::f32, {0});
  const Kernel add = vector_add();
  const ir::Function g = add.trace({TensorSpec{DType::f32, {-1}}, TensorSpec{DType::f32, {-1}}, TensorSpec{DType::f32, {-1}}});
  CHECK(launch_shape(g, Config{}, {x0.view(), x0.view(), y0.view()}).programs == 0);
  run_reference(g, Config{}, {x0.view(), x0.view(), y0.view()});
}

TEST_CASE("reference: argument validation names the parameter") {
  const Kernel k = attention();
  const TensorSpec spec{DType::bf16, {2, 4, 128, 64}};
  const ir::Function f = k.trace({spec, spec, spec, spec, RuntimeScalar{0.1f}, false});
  RefTensor t(DType::bf16, {2, 4, 128, 64});
  const Config cfg = blocks({{"m", 64}, {"n", 64}});
  auto run = [&](std::vector<ArgValue> args) { return error_of([&] { run_reference(f, cfg, args); }); };
  const TensorView good = t.view();
  std::string e;

  e = run({good, good, good, good});
  CHECK(contains(e, "kernel 'attention' takes 5 arguments (q, k, v, o, qk_scale), 4 were given"));

  RefTensor f32(DType::f32, {2, 4, 128, 64});
  e = run({f32.view(), good, good, good, 0.1f});
  CHECK(contains(e, "argument 'q': expected bf16, got f32"));

  RefTensor r3(DType::bf16, {2, 4, 128});
  e = run({good, r3.view(), good, good, 0.1f});
  CHECK(contains(e, "argument 'k': expected rank 4"));
  CHECK(contains(e, "got rank 3"));

  RefTensor d100(DType::bf16, {2, 4, 100, 64});
  e = run({d100.view(), good, good, good, 0.1f});
  CHECK(contains(e, "argument 'q': dimension 2 is 100 but the kernel was traced for 128"));

  e = run({good, good, 1.0f, good, 0.1f});
  CHECK(contains(e, "argument 'v': expected a tensor"));

  e = run({good, good, good, good, good});
  CHECK(contains(e, "argument 'qk_scale': expected a runtime scalar"));

  TensorView dev = good;
  dev.device = Device::cuda;
  e = run({good, good, dev, good, 0.1f});
  CHECK(contains(e, "argument 'v': the CPU reference executor needs host memory"));

  TensorView null = good;
  null.data = nullptr;
  e = run({good, good, good, null, 0.1f});
  CHECK(contains(e, "argument 'o': data is null"));

  TensorView bad_strides = good;
  bad_strides.strides = {1, 2, 3};
  e = run({bad_strides, good, good, good, 0.1f});
  CHECK(contains(e, "argument 'q': 3 strides given for a rank-4 tensor"));

  RefTensor o(DType::bf16, {2, 4, 128, 64});   // the output apart from the inputs (check_arguments)
  e = error_of([&] { run_reference(f, blocks({{"m", 0}}), {good, good, good, o.view(), 0.1f}); });
  CHECK(contains(e, "block 'm' must be positive"));

  // launch_shape reads only shapes: device tensors (no host data) are fine.
  TensorView d = good;
  d.device = Device::cuda;
  d.data = nullptr;
  const LaunchShape ls = launch_shape(f, cfg, {d, d, d, d, 0.1f});
  CHECK(ls.extents == std::vector<int64_t>{8, 2});
  CHECK(ls.programs == 16);
  // ...but it still checks dtypes and shapes.
  e = error_of([&] { launch_shape(f, cfg, {d100.view(), d, d, d, 0.1f}); });
  CHECK(contains(e, "argument 'q': dimension 2 is 100 but the kernel was traced for 128"));
}

TEST_CASE("reference: integer division by zero names the source line") {
  const Kernel k = kernel("divzero", {"out"}, [](Out out) {
    auto [N] = out.shape<1>();
    for (auto i : grid(N)) out.store(i, floordiv(Int(i) + 1, i - 3));
  });
  const ir::Function f = k.trace({TensorSpec{DType::i64, {5}}});
  RefTensor out(DType::i64, {5});
  const std::string e = error_of([&] { run_reference(f, Config{}, {out.view()}); });
  CHECK(contains(e, "floordiv by zero"));
  CHECK(contains(e, "test_reference.cpp"));
}

TEST_CASE("reference: trace prints each op's result summary") {
  const Kernel k = kernel("traced", {"x", "y"}, [](In x, Out y) {
    auto [N] = x.shape<1>();
    for (auto t : tile(N, block("b"))) y.store(t, log2(x.load(t)));
  });
  const ir::Function f = k.trace({TensorSpec{DType::f32, {-1}}, TensorSpec{DType::f32, {-1}}});
  RefTensor x(DType::f32, {20}), y(DType::f32, {20});
  for (int64_t i = 0; i < 20; ++i) x.set({i}, i % 2 ? -1.0 * (i + 1) : 1.0 * (i + 1));   // negatives -> NaN
  std::ostringstream captured;
  std::streambuf* old = std::cerr.rdbuf(captured.rdbuf());
  ReferenceOptions opt;
  opt.trace = true;
  run_reference(f, blocks({{"b", 16}}), {x.view(), y.view()}, opt);
  run_reference(f, blocks({{"b", 16}}), {x.view(), y.view()}, ReferenceOptions{.trace = true, .trace_program = -1});
  std::cerr.rdbuf(old);
  const std::string out = captured.str();
  CHECK(contains(out, "kernel 'traced' program 0 of 2"));
  CHECK(contains(out, "load x : f32[16]"));
  CHECK(contains(out, "log2 : f32[16]"));
  CHECK(contains(out, "NaN 8"));
  CHECK(contains(out, "store y[0]: 16 written, 0 masked"));
  CHECK(contains(out, "store y[16]: 4 written, 12 masked"));   // program 1 of the second run
  CHECK(contains(out, "test_reference.cpp"));
  size_t n_program1 = 0;
  for (size_t p = out.find("program 1 of 2"); p != std::string::npos; p = out.find("program 1 of 2", p + 1)) ++n_program1;
  CHECK(n_program1 == 1);   // the first run traced program 0 only
}
