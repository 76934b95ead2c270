// The CUDA code generator (codegen/): targets, layout assignment, and generated kernels
// compiled with NVRTC for sm_90a and sm_80 (no GPU needed): PTX contents, `// @ file:line`
// markers, masks, shared memory sizing, and the errors for unsupported IR and configs.
#include <doctest/doctest.h>

#include "nvrtc_testing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "dsl/config.h"
#include "codegen/cuda_emitter.h"
#include "codegen/device_library.h"
#include "codegen/knob.h"
#include "codegen/layout.h"
#include "codegen/target.h"
#include "dsl/error.h"
#include "dsl/kernel.h"
#include "kernels/attention_fp8.h"
#include "kernels/library.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/nvrtc.h"

using namespace tj;
using codegen::GeneratedKernel;
using codegen::Target;

namespace {

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

Config config(const char* json) { return Config::from_json(json); }

using tj_test::device_headers;

struct Compiled {
  GeneratedKernel gen;
  std::string ptx;
};

// Generates `f` for `arch` and compiles it with NVRTC; the generated source goes into the
// test log when anything fails.
Compiled compile(const ir::Function& f, const Config& cfg, const std::string& arch) {
  Compiled c;
  c.gen = codegen::generate_cuda(f, cfg, Target::parse(arch));
  INFO("generated source for ", arch, ":\n", c.gen.source);
  runtime::CompileOptions opts;
  opts.arch = arch;
  opts.want_cubin = false;   // PTX is what the checks read; ptxas runs in the sm_90a test below
  opts.headers = device_headers();
  try {
    c.ptx = runtime::compile_cuda(c.gen.source, c.gen.name + ".cu", opts).ptx;
  } catch (const CompileError& e) {
    FAIL_CHECK("NVRTC rejected the generated code: ", e.what());
  }
  return c;
}

// Compiles for sm_90a and sm_80 and checks what every kernel must satisfy.
// fp8_conversions: the PTX converts to e4m3 with the hardware's cvt, and (fp8_widening) back.
void compile_and_check(const ir::Function& f, const Config& cfg, bool fp8_conversions = false, bool fp8_widening = true) {
  for (const char* arch : {"sm_90a", "sm_80"}) {
    CAPTURE(arch);
    CAPTURE(cfg.to_json());
    Compiled c = compile(f, cfg, arch);
    INFO("generated source:\n", c.gen.source);
    // A producer warpgroup beside the tiles' warps where the tensor cores take the dots.
    CHECK(c.gen.threads == cfg.num_warps * 32 + (contains(c.gen.source, "the producer warpgroup") ? 128 : 0));
    CHECK(contains(c.gen.source, fmt::format("__launch_bounds__({}", c.gen.threads)));
    CHECK(contains(c.ptx, ".entry " + c.gen.entry));
    CHECK(contains(c.ptx, fmt::format(".target {}", arch)));
    if (fp8_conversions && std::string(arch) == "sm_90a") {
      CHECK(std::regex_search(c.ptx, std::regex(R"(cvt\.rn\.satfinite\.e4m3x2\.f32)")));
      if (fp8_widening) CHECK(std::regex_search(c.ptx, std::regex(R"(cvt\.rn\.f16x2\.e4m3x2)")));
    }
  }
}

TensorSpec T(DType t, std::vector<int64_t> shape) { return TensorSpec{t, std::move(shape)}; }

ir::Function trace_attention(DType in, DType out, std::vector<int64_t> shape, bool causal, float scale = 0.125f) {
  return kernels::attention().trace({T(in, shape), T(in, shape), T(in, shape), T(out, shape), RuntimeScalar{scale}, causal});
}

// `// @ file:line` markers of a generated source, in order.
struct Marker {
  std::string code;
  std::string file;
  int line = 0;
};
std::vector<Marker> markers(const std::string& source) {
  std::vector<Marker> out;
  std::istringstream in(source);
  std::string l;
  static const std::regex re(R"((.*)  // @ (.+):(\d+)$)");
  std::smatch m;
  while (std::getline(in, l))
    if (std::regex_match(l, m, re)) out.push_back({m[1], m[2], std::stoi(m[3])});
  return out;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  std::string l;
  while (std::getline(in, l)) lines.push_back(l);
  return lines;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// ---- kernels that use every op the IR has (rank <= 2, every dtype) ----------------------------
// (also run on the CPU by tests/test_codegen_emulated.cpp)
namespace tj_codegen_test {

const Kernel& k_elementwise2d() {
  static const Kernel k = kernel("ew2d", {"x", "y", "o", "o2", "alpha"}, [](In x, In y, Out o, Out o2, Scalar alpha) {
    auto [R, C] = x.shape<2>();
    for (auto r : tile(R, block("r")))
      for (auto c : tile(C, block("c"))) {
        auto a = x.load(r, c);
        auto b = y.load(c, r).T();   // a transpose that is not a dot operand: an exchange
        auto s = a * b + 1.5;
        auto f = s.to(DType::f32);
        auto u = exp2(f * 0.25) + log2(abs(f) + 1.0) + sqrt(abs(f)) + rsqrt(abs(f) + 1.0) + tanh(f) - exp(-abs(f)) +
                 log(abs(f) + 2.0);
        auto m = (r.index().col() % 3) == (c.index().row() % 2);
        // A mask that holds on whole tiles: ops on it run per arm, the failing arm's from scalars
        // alone computed once (exp2(-inf * 0.5)), not per element.
        auto lower = exp2(where(r.index().col() >= c.index().row(), f, -INFINITY) * 0.5);
        o.store(r, c, (where(m, u, -u) * alpha + lower).to(o.dtype()));
        o2.store(r, c, maximum(s, a).to(o2.dtype()));
      }
  });
  return k;
}

const Kernel& k_reductions() {
  static const Kernel k = kernel("reductions", {"x", "rs", "cm"}, [](In x, Out rs, Out cm) {
    auto [R, C] = x.shape<2>();
    for (auto r : tile(R, block("r"))) {
      Var acc = zeros({r}, DType::f32);
      Var mn = full({r}, INFINITY, DType::f32);
      for (auto c : tile(C, block("c"))) {
        auto t = x.load(r, c).to(DType::f32);
        acc = acc + sum(t, 1);
        mn = minimum(mn, amin(t, 1));
        cm.store(floordiv(r.begin(), r.block_size()), c, amax(t, 0) + sum(t * t, 0));
      }
      rs.store(r, (acc + mn).to(rs.dtype()));
    }
  });
  return k;
}

const Kernel& k_matmul() {
  static const Kernel k = kernel("matmul", {"a", "b", "a2", "o", "o2"}, [](In a, In b, In a2, Out o, Out o2) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(0);
    for (auto m : tile(M, block("m")))
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        Var acc2 = zeros({m, n}, DType::f32);
        for (auto k : tile(K, block("k"))) {
          acc = dot(a.load(m, k), b.load(n, k).T(), acc);
          acc2 = acc2 + dot(a2.load(k, m).T(), b.load(n, k).T());
        }
        o.store(m, n, acc.to(o.dtype()));
        o2.store(m, n, acc2.to(o2.dtype()));
      }
  });
  return k;
}

const Kernel& k_integers() {
  static const Kernel k = kernel("integers", {"xi", "yl", "bm", "oi", "ol", "ob", "of"},
                                 [](In xi, In yl, In bm, Out oi, Out ol, Out ob, Out of) {
    for (auto i : tile(xi.dim(0), block("n"))) {
      auto a = xi.load(i);
      auto b = yl.load(i);
      auto m = bm.load(i);
      auto q = floordiv(a, 3) + a % 5 - a / 2 + floordiv(a, -4) + a % -3;
      oi.store(i, where(m && (a > 0), q, -q));
      ol.store(i, b * 3 - maximum(b, a.to(DType::i64)) + minimum(b, 7) + abs(b));
      ob.store(i, (a >= 2) || !m);
      auto fl = a.to(DType::f32) * 0.37 + m.to(DType::f32) + b.to(DType::f32);
      of.store(i, fl + (fl * 1.7).to(DType::i32).to(DType::f32) + (fl > 0.5).to(DType::f32));
    }
  });
  return k;
}

const Kernel& k_mixed_ranks() {
  static const Kernel k = kernel("mixed_ranks", {"v", "w", "o", "o1", "s"}, [](In v, In w, Out o, Out o1, Out s) {
    for (auto g : grid(1)) {
      auto x = v.load(all);
      auto t = x.col() + x.row();          // one of the two expands needs an exchange
      auto t2 = w.load(all, all) + x;      // implicit broadcast [n] -> [n, n]
      o.store(all, all, (t * t2 - g.to(DType::f32)).to(o.dtype()));
      o1.store(all, v.load(all) * 2.0);
      auto tot = sum(x, 0);
      Var acc = constant(0.0, DType::f32);
      for (auto j : grid(3)) acc = acc + tot * j.to(DType::f32);
      s.store(0, acc.to(s.dtype()));
      s.store(1, (v.load(3) + tot).to(s.dtype()));
    }
  });
  return k;
}

// Per-column sums and max |x| over each batch entry's rows, kept tile by tile in Vars that hold
// one tile of the row loop (declared on its named range) and reduced once after it.
const Kernel& k_running_columns() {
  static const Kernel k = kernel("running_columns", {"x", "out"}, [](In x, Out out) {
    auto [B, R, C] = x.shape<3>();
    for (auto b : grid(B)) {
      auto rows = tile(R, block("r"));
      Var total = zeros({rows, C}, DType::f32);
      Var peak = zeros({rows, C}, DType::f32);
      for (auto r : rows) {
        auto v = x.load(b, r, all).to(DType::f32);
        total = total + v;
        peak = maximum(peak, abs(v));
      }
      out.store(b, 0, all, sum(total, 0));
      out.store(b, 1, all, amax(peak, 0));
    }
  });
  return k;
}

// Stores that write only where a mask holds: the lower triangle r >= c (a [r, c] mask), every other row of a second output (a [r, 1] mask broadcast along the columns) and a
// third output only when the runtime scalar is positive (a scalar mask).
const Kernel& k_masked_store() {
  static const Kernel k = kernel("masked_store", {"x", "lower", "even", "gated", "alpha"},
                                 [](In x, Out lower, Out even, Out gated, Scalar alpha) {
    auto [R, C] = x.shape<2>();
    for (auto r : tile(R, block("r")))
      for (auto c : tile(C, block("c"))) {
        auto v = x.load(r, c).to(DType::f32) * alpha;
        lower.store_where(r.index().col() >= c.index().row(), r, c, v.to(lower.dtype()));
        even.store_where(((r.index() % 2) == 0).col(), r, c, (v + 1.0).to(even.dtype()));
        gated.store_where(alpha > 0.0, r, c, (v * 2.0).to(gated.dtype()));
      }
  });
  return k;
}

// Atomic adds from every program into the same elements: S slices of x added into one [M, N]
// tile (a tile from each program), their column sums (rank 1), their positive elements (a
// mask), their total (a scalar) and, transposed, into one [N, M] (the transpose folded into the
// addressing); and each slice stored transposed (folded too).
const Kernel& k_atomic_add() {
  static const Kernel k = kernel("atomic_add", {"x", "acc", "cols", "pos", "total", "acc_t", "each_t"},
                                 [](In x, Out acc, Out cols, Out pos, Out total, Out acc_t, Out each_t) {
    auto [S, M, N] = x.shape<3>();
    for (auto s : grid(S))
      for (auto m : tile(M, block("r")))
        for (auto n : tile(N, block("c"))) {
          auto t = x.load(s, m, n);
          acc.atomic_add(m, n, t);
          cols.atomic_add(n, sum(t, 0));
          pos.atomic_add_where(t > 0, m, n, t);
          total.atomic_add(0, sum(sum(t, 1), 0));
          acc_t.atomic_add(n, m, t.T());
          each_t.store(s, n, m, t.T());
        }
  });
  return k;
}

// A scalar store under a scalar mask: each program writes its element only where it is positive.
const Kernel& k_masked_scalar() {
  static const Kernel k = kernel("masked_scalar", {"v", "o"}, [](In v, Out o) {
    for (auto g : grid(v.dim(0))) {
      auto e = v.load(g);
      o.store_where(e > 0.0, g, (e * 2.0).to(o.dtype()));
    }
  });
  return k;
}

// Integer reductions: row sums and maxima of i32 / i64 tiles (sums wrap: the values are scaled past
// 2^31 for i32), and per row tile column minima and sums along a ragged block axis, where rows past
// the tensor are left out (stored at row tile r.begin() / block).
const Kernel& k_int_reductions() {
  static const Kernel k = kernel("int_reductions", {"x", "rsum", "rmax", "tmin", "tsum"},
                                 [](In x, Out rsum, Out rmax, Out tmin, Out tsum) {
    auto [R, C] = x.shape<2>();
    for (auto r : tile(R, block("r"))) {
      auto t = x.load(r, all);
      rsum.store(r, sum(t * 300000007, 1));
      rmax.store(r, amax(t, 1));
      for (auto c : tile(C, block("c"))) {
        auto u = x.load(r, c);
        tmin.store(r.begin() / r.block_size(), c, amin(u, 0));
        tsum.store(r.begin() / r.block_size(), c, sum(u, 0));
      }
    }
  });
  return k;
}

}  // namespace tj_codegen_test

using namespace tj_codegen_test;

// ---- targets -------------------------------------------------------------------------------

TEST_CASE("codegen: targets parse the supported architectures and reject others") {
  CHECK(Target::parse("sm_90a").sm() == 90);
  CHECK(Target::parse("sm_90a").has_wgmma());
  CHECK(Target::parse("sm_90a").has_fp8());
  CHECK_FALSE(Target::parse("sm_90").has_wgmma());
  CHECK(Target::parse("sm_89").sm() == 89);
  CHECK(Target::parse("sm_89").has_fp8());
  CHECK(Target::parse("sm_80").sm() == 80);
  CHECK_FALSE(Target::parse("sm_80").has_fp8());
  CHECK(Target{}.arch == "sm_90a");
  CHECK(Target::parse("sm_90a").max_smem_per_block() == 227 * 1024);
  for (const char* bad : {"sm_75", "sm_100a", "compute_90a", "", "90"}) {
    CAPTURE(bad);
    try {
      Target::parse(bad);
      FAIL("accepted an unsupported arch");
    } catch (const Error& e) {
      CHECK(contains(e.what(), "unsupported target architecture"));
      CHECK(contains(e.what(), "sm_80, sm_89, sm_90, sm_90a"));
    }
  }
  CHECK_THROWS_AS(Target{"sm_61"}.sm(), Error);
}

// ---- layouts -------------------------------------------------------------------------------

TEST_CASE("codegen: layout assignment puts row statistics on the rows and needs no exchange in attention") {
  // S 100: the causal key loop's end, min(m.end(), S), is not a multiple of the key block, so its
  // last tile may be partial (at S 128 every tile is whole: below).
  ir::Function f = trace_attention(DType::bf16, DType::bf16, {1, 2, 100, 64}, true);
  Config cfg = config(R"({"blocks":{"m":64,"n":32},"num_warps":4,"knobs":{"mma":0}})");   // the SIMT path
  codegen::LayoutPlan plan = codegen::assign_layouts(f, cfg, Target{});
  REQUIRE(plan.has_2d);
  CHECK(plan.threads == 128);
  CHECK(plan.arr2.threads() == 128);
  CHECK(plan.arr2.lanes_r * plan.arr2.lanes_c == 32);
  int rank1_rows = 0, rank1_cols = 0, scalars = 0;
  for (size_t v = 0; v < f.values.size(); ++v) {
    const codegen::Layout& l = plan.of(static_cast<int>(v));
    const TileType& t = f.values[v].type;
    CAPTURE(v);
    if (t.rank() == 0) {
      CHECK(l.is_scalar());
      ++scalars;
    } else if (t.rank() == 2) {
      CHECK(l.is_distributed());
      CHECK(l.arr == plan.arr2);
      CHECK(l.slots() <= codegen::kMaxTileElementsPerThread);
    } else {
      // m_i, l_i, alpha, the row maxima and sums: the row slice; arange(n): the column slice.
      (l.dim0_on_cols ? rank1_cols : rank1_rows)++;
    }
  }
  CHECK(scalars > 0);
  CHECK(rank1_rows > 0);
  CHECK(rank1_cols == 1);   // n.index() only
  GeneratedKernel g = codegen::generate_cuda(f, cfg, Target{});
  INFO(g.source);
  CHECK_FALSE(contains(g.source, "tj::dev::exchange"));   // broadcasts of row statistics are free
  CHECK_FALSE(contains(g.source, "tj::dev::transpose"));  // k.T() is folded into the dot's staging
  CHECK(count(g.source, "tj::dev::dot<") == 2);
  // One row sum, in an unmasked form and the last tile's masked one. The row max of the scaled
  // scores: the scale times the scores' max (or min, for a negative scale) on whole tiles, the
  // masked product's max on the last one, and that of the product itself for a zero scale.
  CHECK(count(g.source, "tj::dev::reduce<tj::dev::op_sum, 1, tj::dev::f32, false>") == 1);
  CHECK(count(g.source, "tj::dev::reduce<tj::dev::op_sum, 1, tj::dev::f32, true>") == 1);
  CHECK(count(g.source, "tj::dev::reduce<tj::dev::op_max, 1, tj::dev::f32, false>") == 2);
  CHECK(count(g.source, "tj::dev::reduce<tj::dev::op_min, 1, tj::dev::f32, false>") == 1);
  CHECK(count(g.source, "tj::dev::reduce<tj::dev::op_max, 1, tj::dev::f32, true>") == 1);
  // S 128: the key loop's index and its end, min(m.end(), S), are multiples of the key block (the
  // emitter's divisor analysis), so no tile is partial: no range-masked reduction (the mask's own
  // masked product reduces unmasked on the diagonal tiles).
  const ir::Function whole = trace_attention(DType::bf16, DType::bf16, {1, 2, 128, 64}, true);
  const GeneratedKernel w = codegen::generate_cuda(whole, cfg, Target{});
  INFO(w.source);
  CHECK(count(w.source, "tj::dev::reduce<tj::dev::op_sum, 1, tj::dev::f32, true>") == 0);
  CHECK(count(w.source, "tj::dev::reduce<tj::dev::op_max, 1, tj::dev::f32, true>") == 0);
  CHECK(count(w.source, "tj::dev::reduce<tj::dev::op_sum, 1, tj::dev::f32, false>") == 1);
  CHECK(contains(w.source, "the mask holds on the whole tile"));
}

TEST_CASE("codegen: 1-D kernels use the flat arrangement (thread t holds t, t + T, ...)") {
  ir::Function f = kernels::vector_add().trace({T(DType::f32, {-1}), T(DType::f32, {-1}), T(DType::f32, {-1})});
  Config cfg = config(R"({"blocks":{"n":1024},"num_warps":8})");
  codegen::LayoutPlan plan = codegen::assign_layouts(f, cfg, Target{});
  CHECK_FALSE(plan.has_2d);
  for (size_t v = 0; v < f.values.size(); ++v) {
    if (f.values[v].type.rank() != 1) continue;
    const codegen::Layout& l = plan.of(static_cast<int>(v));
    CHECK(l.arr == codegen::Arrangement{1, 32, 1, 8});
    CHECK(l.dim0_on_cols);
    CHECK(l.slots() == 4);   // 1024 elements over 256 threads
  }
}

TEST_CASE("codegen: layout conversions are explicit steps") {
  using codegen::Conversion;
  using codegen::Layout;
  codegen::Arrangement a{4, 8, 4, 1};
  Layout tile = Layout::blocked2(a, 64, 32), rows = Layout::row_slice(a, 64), cols = Layout::col_slice(a, 32);
  CHECK(codegen::plan_conversion(rows, Layout::blocked2(a, 64, 1), 4).kind == Conversion::Kind::none);   // expand_dims(1)
  CHECK(codegen::plan_conversion(Layout::blocked2(a, 64, 1), tile, 4).kind == Conversion::Kind::broadcast);
  CHECK(codegen::plan_conversion(cols, tile, 4).kind == Conversion::Kind::broadcast);
  CHECK(codegen::plan_conversion(Layout::scalar(), tile, 4).kind == Conversion::Kind::from_scalar);
  Conversion x = codegen::plan_conversion(Layout::row_slice(a, 32), cols, 4);
  CHECK(x.kind == Conversion::Kind::exchange);
  CHECK(x.smem_bytes == 32 * 4);
  CHECK(contains(x.expr("v7", "L1x32"), "tj::dev::exchange<L1x32"));
  Layout flat = Layout::col_slice(codegen::Arrangement{1, 32, 1, 4}, 64);
  CHECK(codegen::plan_conversion(flat, rows, 4).kind == Conversion::Kind::exchange);
  CHECK(Layout::row_slice(a, 1).replicated());
  CHECK(codegen::plan_conversion(Layout::row_slice(a, 1), Layout::scalar(), 4).kind == Conversion::Kind::to_scalar);
}

// ---- the library kernels, compiled with NVRTC ------------------------------------------------

TEST_CASE("codegen: vector_add compiles for sm_90a and sm_80 (f32, bf16)") {
  for (DType t : {DType::f32, DType::bf16}) {
    CAPTURE(name(t));
    ir::Function f = kernels::vector_add().trace({T(t, {-1}), T(t, {-1}), T(t, {-1})});
    compile_and_check(f, config(R"({"blocks":{"n":64},"num_warps":4})"));
    compile_and_check(f, config(R"({"blocks":{"n":1024},"num_warps":8})"));
  }
}

TEST_CASE("codegen: softmax compiles for sm_90a and sm_80 (f32, f16, bf16)") {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(name(t));
    ir::Function f = kernels::softmax().trace({T(t, {7, 300}), T(t, {7, 300})});
    compile_and_check(f, config(R"({"blocks":{"c":64,"c2":64},"num_warps":4})"));
    compile_and_check(f, config(R"({"blocks":{"c":256,"c2":32},"num_warps":2})"));
  }
  ir::Function dyn = kernels::softmax().trace({T(DType::bf16, {-1, -1}), T(DType::f32, {-1, -1})});
  compile_and_check(dyn, config(R"({"blocks":{"c":128,"c2":128},"num_warps":4})"));
}

TEST_CASE("codegen: a tile loop of one trip runs in its scope, and a row a second pass reads again is the first pass's tile") {
  // softmax reads x[r, :] in its max/sum pass and again in its normalizing pass; with blocks of the
  // whole row both loops run once and the row is loaded once.
  ir::Function f = kernels::softmax().trace({contiguous_spec(DType::bf16, {64, 4096}), contiguous_spec(DType::bf16, {64, 4096})});
  const Config whole = config(R"({"blocks":{"c":4096,"c2":4096},"num_warps":4,"knobs":{"simt_vec":8}})");
  const codegen::GeneratedKernel g = codegen::generate_cuda(f, whole, codegen::Target::parse("sm_90a"));
  CHECK(count(g.source, "tj::dev::load<") == 1);
  CHECK(count(g.source, "for (long long") == 0);
  CHECK(contains(g.source, "// one trip of the tile loop (0LL to 4096LL in a block of 4096): its body in this scope"));
  CHECK(contains(g.source, "// the same tile of 'x' as v"));
  compile_and_check(f, whole);
  // The untuned streaming config: rows of 1000 in one block of 1024 (the tail masked) on 2 warps,
  // one load; rows of 4096 whole on 4 warps (32 elements a thread), loaded once; rows of 10000 in
  // three trips of 4096 a pass, each pass loading its tiles.
  ir::Function ragged = kernels::softmax().trace({contiguous_spec(DType::f32, {4, 1000}), contiguous_spec(DType::f32, {4, 1000})});
  const Config cr = codegen::untuned_config(ragged, "sm_90a");
  CHECK(cr.blocks.at("c") == 1024);
  CHECK(cr.num_warps == 2);
  CHECK(count(codegen::generate_cuda(ragged, cr, codegen::Target::parse("sm_90a")).source, "tj::dev::load<") == 1);
  const Config cw = codegen::untuned_config(f, "sm_90a");
  CHECK(cw.blocks.at("c") == 4096);
  CHECK(cw.num_warps == 4);
  CHECK(count(codegen::generate_cuda(f, cw, codegen::Target::parse("sm_90a")).source, "tj::dev::load<") == 1);
  // LayerNorm's and RMSNorm's normalizing pass brings w (and b) in: trips of 1024 there, on 4 warps.
  for (const Kernel* k : {&kernels::layernorm(), &kernels::rmsnorm()}) {
    const bool layer = k == &kernels::layernorm();
    std::vector<ArgSpec> specs = {contiguous_spec(DType::bf16, {64, 4096}), contiguous_spec(DType::bf16, {4096})};
    if (layer) specs.push_back(contiguous_spec(DType::bf16, {4096}));
    specs.push_back(contiguous_spec(DType::bf16, {64, 4096}));
    specs.push_back(RuntimeScalar{1e-5f});
    const Config cn = codegen::untuned_config(k->trace(specs), "sm_90a");
    CAPTURE(cn.to_json());
    CHECK(cn.blocks.at("c") == 4096);
    CHECK(cn.blocks.at("c2") == 1024);
    CHECK(cn.num_warps == 4);
  }
  CHECK(cw.blocks.at("c2") == 4096);   // softmax's passes read x alone
  ir::Function wide = kernels::softmax().trace({contiguous_spec(DType::bf16, {4, 10000}), contiguous_spec(DType::bf16, {4, 10000})});
  const Config cl = codegen::untuned_config(wide, "sm_90a");
  CHECK(cl.blocks.at("c") == 4096);
  const std::string src = codegen::generate_cuda(wide, cl, codegen::Target::parse("sm_90a")).source;
  CHECK(count(src, "tj::dev::load<") == 2);
  CHECK(count(src, "for (long long") == 2);
}

TEST_CASE("codegen: attention compiles for sm_90a and sm_80 (f32, f16, bf16, causal and not)") {
  const Config cfgs[] = {config(R"({"blocks":{"m":64,"n":64},"num_warps":4})"),
                         config(R"({"blocks":{"m":32,"n":16},"num_warps":2})")};
  struct Variant {
    DType t;
    bool causal;
    const Config& cfg;
  };
  for (const Variant& v : {Variant{DType::f32, false, cfgs[0]}, Variant{DType::f32, true, cfgs[1]},
                           Variant{DType::f16, false, cfgs[1]}, Variant{DType::f16, true, cfgs[0]},
                           Variant{DType::bf16, true, cfgs[0]}, Variant{DType::bf16, false, cfgs[1]}}) {
    CAPTURE(name(v.t));
    CAPTURE(v.causal);
    compile_and_check(trace_attention(v.t, v.t, {2, 4, 100, 64}, v.causal), v.cfg);
  }
}

TEST_CASE("codegen: e4m3 attention with bf16 output converts with cvt e4m3x2 on sm_90a") {
  // The SIMT path decodes every element it loads (the tensor cores take e4m3 tiles as they are).
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    ir::Function f = trace_attention(DType::e4m3, DType::bf16, {1, 2, 128, 64}, causal);
    compile_and_check(f, config(R"({"blocks":{"m":64,"n":32},"num_warps":4,"knobs":{"mma":0}})"), /*fp8_conversions=*/true);
  }
  // sm_80 has no fp8 cvt: the device library decodes in software there.
  Compiled c = compile(trace_attention(DType::e4m3, DType::bf16, {1, 2, 128, 64}, false),
                       config(R"({"blocks":{"m":64,"n":32}})"), "sm_80");
  CHECK_FALSE(contains(c.ptx, "e4m3x2"));
}

TEST_CASE("codegen: the sm_90a attention kernel assembles to a CUBIN without spills") {
  ir::Function f = trace_attention(DType::bf16, DType::bf16, {1, 2, 128, 64}, true);
  GeneratedKernel g = codegen::generate_cuda(f, config(R"({"blocks":{"m":64,"n":64},"num_warps":4})"), Target{});
  INFO(g.source);
  runtime::CompileOptions opts;
  opts.headers = device_headers();
  opts.extra_options = {"--ptxas-options=-v"};
  runtime::CompileResult r = runtime::compile_cuda(g.source, "attention.cu", opts);
  INFO(r.log);
  CHECK(r.cubin.size() > 4);
  CHECK(contains(r.log, "0 bytes spill stores"));
}

// ---- every op, all dtypes --------------------------------------------------------------------

TEST_CASE("codegen: kernels using every op compile for sm_90a and sm_80") {
  const DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16, e4m3 = DType::e4m3, e5m2 = DType::e5m2;
  SUBCASE("elementwise, transpose, where, integer tiles") {
    const ir::Function ew = k_elementwise2d().trace({T(f32, {37, 45}), T(f32, {45, 37}), T(f32, {37, 45}), T(f32, {37, 45}),
                                                     RuntimeScalar{0.5f}});
    compile_and_check(ew, config(R"({"blocks":{"r":16,"c":32}})"));
    // The ops after a whole-tile mask run per arm; the failing arm of scalars alone is one value.
    const GeneratedKernel g = codegen::generate_cuda(ew, config(R"({"blocks":{"r":16,"c":32}})"), Target{});
    INFO(g.source);
    CHECK(std::regex_search(g.source, std::regex(R"(float v\d+_b = \{\};)")));
    CHECK(std::regex_search(g.source, std::regex(R"(v\d+_b = \[\]\(float a\) \{ return tj::dev::exp2\(a\); \}\(v\d+_b\);)")));
    compile_and_check(k_elementwise2d().trace({T(bf16, {-1, -1}), T(bf16, {-1, -1}), T(f16, {-1, -1}),
                                               T(bf16, {-1, -1}), RuntimeScalar{0.5f}}),
                      config(R"({"blocks":{"r":8,"c":64},"num_warps":2})"));
    compile_and_check(k_elementwise2d().trace({T(f16, {32, 32}), T(f16, {32, 32}), T(e4m3, {32, 32}),
                                               T(e5m2, {32, 32}), RuntimeScalar{0.5f}}),
                      config(R"({"blocks":{"r":32,"c":32},"num_warps":4,"knobs":{"fast_math":1}})"), true,
                      /*fp8_widening=*/false);   // the e4m3 / e5m2 stores convert their f32 values once
  }
  SUBCASE("reductions along both axes, warps across the reduced axis") {
    compile_and_check(k_reductions().trace({T(f32, {50, 70}), T(f32, {50}), T(f32, {4, 70})}),
                      config(R"({"blocks":{"r":16,"c":32},"num_warps":8})"));
    compile_and_check(k_reductions().trace({T(bf16, {50, 70}), T(bf16, {50}), T(f32, {2, 70})}),
                      config(R"({"blocks":{"r":32,"c":64},"num_warps":4,"knobs":{"simt_warps_c":2}})"));
    compile_and_check(k_reductions().trace({T(f16, {-1, -1}), T(f16, {-1}), T(f32, {-1, -1})}),
                      config(R"({"blocks":{"r":4,"c":128},"num_warps":4})"));
  }
  SUBCASE("dot with k ranges and transposed operands") {
    compile_and_check(k_matmul().trace({T(bf16, {40, 70}), T(bf16, {24, 70}), T(bf16, {70, 40}), T(f32, {40, 24}),
                                        T(bf16, {40, 24})}),
                      config(R"({"blocks":{"m":32,"n":16,"k":32}})"));
    compile_and_check(k_matmul().trace({T(e4m3, {-1, -1}), T(e4m3, {-1, -1}), T(e4m3, {-1, -1}), T(f32, {-1, -1}),
                                        T(e4m3, {-1, -1})}),
                      config(R"({"blocks":{"m":64,"n":64,"k":32},"num_warps":8})"), true);
    compile_and_check(k_matmul().trace({T(e5m2, {64, 64}), T(e5m2, {64, 64}), T(e5m2, {64, 64}), T(f16, {64, 64}),
                                        T(f32, {64, 64})}),
                      config(R"({"blocks":{"m":16,"n":64,"k":16},"num_warps":1})"));
  }
  SUBCASE("i32, i64 and i1 tiles") {
    compile_and_check(k_integers().trace({T(DType::i32, {-1}), T(DType::i64, {-1}), T(DType::i1, {-1}),
                                          T(DType::i32, {-1}), T(DType::i64, {-1}), T(DType::i1, {-1}),
                                          T(f32, {-1})}),
                      config(R"({"blocks":{"n":256},"num_warps":4})"));
  }
  SUBCASE("rank-1 and rank-2 tiles together, scalar loads and stores, a sequential grid loop") {
    compile_and_check(k_mixed_ranks().trace({T(f32, {24}), T(f32, {24, 24}), T(f32, {24, 24}), T(f32, {24}),
                                             T(f32, {2})}),
                      config(R"({"num_warps":4})"));
    compile_and_check(k_mixed_ranks().trace({T(bf16, {40}), T(bf16, {40, 40}), T(bf16, {40, 40}), T(bf16, {40}),
                                             T(bf16, {2})}),
                      config(R"({"num_warps":1})"));
  }
  SUBCASE("integer reductions (i32, i64) along both axes, warps across the reduced axis") {
    compile_and_check(k_int_reductions().trace({T(DType::i32, {70, 48}), T(DType::i32, {70}), T(DType::i32, {70}),
                                                T(DType::i32, {3, 48}), T(DType::i32, {3, 48})}),
                      config(R"({"blocks":{"r":32,"c":16},"num_warps":4})"));
    compile_and_check(k_int_reductions().trace({T(DType::i64, {70, 48}), T(DType::i64, {70}), T(DType::i64, {70}),
                                                T(DType::i64, {3, 48}), T(DType::i64, {3, 48})}),
                      config(R"({"blocks":{"r":32,"c":16},"num_warps":8})"));
  }
  SUBCASE("masked stores: a tile mask, a broadcast row mask, a scalar mask, a masked scalar store") {
    compile_and_check(k_masked_store().trace({T(bf16, {70, 45}), T(bf16, {70, 45}), T(f32, {70, 45}), T(f16, {70, 45}),
                                              RuntimeScalar{0.5f}}),
                      config(R"({"blocks":{"r":32,"c":32},"num_warps":4})"));
    compile_and_check(k_masked_scalar().trace({T(f32, {-1}), T(f32, {-1})}), config(R"({"num_warps":1})"));
  }
  SUBCASE("atomic adds: tiles, rank-1 slices, masked, a scalar; f32, i32 and i64") {
    for (DType t : {f32, DType::i32, DType::i64}) {
      const ir::Function f =
          k_atomic_add().trace({T(t, {3, 70, 45}), T(t, {70, 45}), T(t, {45}), T(t, {70, 45}), T(t, {1}), T(t, {45, 70}), T(t, {3, 45, 70})});
      compile_and_check(f, config(R"({"blocks":{"r":32,"c":16},"num_warps":4})"));
      const Compiled c = compile(f, config(R"({"blocks":{"r":32,"c":16},"num_warps":4})"), "sm_90a");
      CHECK(std::regex_search(c.ptx, std::regex(t == f32 ? R"(red\.global\.add\.f32)" : t == DType::i32 ? R"(red\.global\.add\.[su]32)"
                                                                                               : R"(red\.global\.add\.u64)")));
    }
  }
}

// ---- readability, markers, masks -------------------------------------------------------------

TEST_CASE("codegen: generated attention is readable and every op statement points at kernels/attention.cpp") {
  ir::Function f = trace_attention(DType::bf16, DType::bf16, {2, 4, 100, 64}, true);
  GeneratedKernel g = codegen::generate_cuda(f, config(R"({"blocks":{"m":64,"n":64},"num_warps":4,"knobs":{"mma":0}})"), Target{});
  INFO("generated source:\n", g.source);
  CHECK(g.name == "attention");
  CHECK(g.entry == "attention");
  CHECK(g.threads == 128);
  CHECK(g.dynamic_smem_bytes == (64 * 65 + 64 * 64) * 4);   // one dot's staging, reused
  for (const auto& h : g.device_headers) {
    CAPTURE(h);
    CHECK(std::any_of(codegen::device_library().begin(), codegen::device_library().end(),
                      [&](const auto& e) { return e.name == h; }));
    CHECK(contains(g.source, "#include \"" + h + "\"") == (h == "tile.cuh"));
  }
  CHECK(contains(g.source, "extern \"C\" __global__ void __launch_bounds__(128) attention(tj::dev::TensorArg<4> q, "
                           "tj::dev::TensorArg<4> k, tj::dev::TensorArg<4> v, tj::dev::TensorArg<4> o, float scale)"));
  // Short: about one line per op (the causal mask's where: 5, each op pushed through it: 7, its
  // failing arm in a block of its own).
  const size_t lines = count(g.source, "\n");
  CHECK(lines < 110);
  CHECK(lines > 40);
  // Every statement that calls into the device library carries a marker into the DSL source.
  std::vector<Marker> ms = markers(g.source);
  REQUIRE(ms.size() > 30);
  std::istringstream in(g.source);
  for (std::string l; std::getline(in, l);)
    if (contains(l, "tj::dev::") && l.rfind("//", 0) != 0 && !contains(l, "using ") && !contains(l, "TensorArg<4> q")) {
      CAPTURE(l);
      CHECK(contains(l, "  // @ "));
    }
  std::vector<std::string> src;
  for (const Marker& m : ms) {
    CAPTURE(m.code);
    CHECK(ends_with(m.file, "kernels/attention.cpp"));
    if (src.empty()) src = read_lines(m.file);
    if (src.empty()) continue;   // the source tree is not where the library was built
    REQUIRE(m.line >= 1);
    REQUIRE(m.line <= static_cast<int>(src.size()));
    const std::string& dsl = src[m.line - 1];
    CAPTURE(dsl);
    if (contains(m.code, "tj::dev::dot<")) CHECK(contains(dsl, "dot("));
    if (contains(m.code, "tj::dev::load<")) CHECK(contains(dsl, ".load("));
    if (contains(m.code, "tj::dev::store<")) CHECK(contains(dsl, ".store("));
    if (contains(m.code, "op_max")) CHECK(contains(dsl, "amax("));
    if (contains(m.code, "tj::dev::exp2(")) CHECK(contains(dsl, "exp2("));
    if (contains(m.code, "for (")) CHECK(contains(dsl, "tile("));
  }
}

TEST_CASE("codegen: an NVRTC error in generated code is reported at the DSL line") {
  ir::Function f = trace_attention(DType::f16, DType::f16, {1, 2, 64, 64}, false);
  GeneratedKernel g = codegen::generate_cuda(f, config(R"({"blocks":{"m":64,"n":64},"knobs":{"mma":0}})"), Target{});
  // Break the first dot statement (as a device-library bug would) and compile.
  size_t dot = g.source.find("tj::dev::dot<");
  REQUIRE(dot != std::string::npos);
  std::string broken = g.source;
  broken.replace(dot, std::string("tj::dev::dot<").size(), "tj::dev::no_such_dot<");
  size_t eol = broken.find('\n', dot);
  std::vector<Marker> ms = markers(broken.substr(broken.rfind('\n', dot) + 1, eol - broken.rfind('\n', dot)));
  REQUIRE(ms.size() == 1);
  runtime::CompileOptions opts;
  opts.headers = device_headers();
  try {
    runtime::compile_cuda(broken, "attention.cu", opts);
    FAIL("NVRTC accepted a broken kernel");
  } catch (const CompileError& e) {
    CHECK(contains(e.what(), fmt::format("{}:{}", ms[0].file, ms[0].line)));
  }
}

TEST_CASE("codegen: masks that are provably always true are omitted") {
  Config cfg = config(R"({"blocks":{"m":64,"n":64},"num_warps":4})");
  SUBCASE("S a multiple of the blocks: no masks on loads, stores and reductions") {
    GeneratedKernel g = codegen::generate_cuda(trace_attention(DType::f32, DType::f32, {1, 2, 128, 64}, false), cfg, Target{});
    INFO(g.source);
    CHECK(count(g.source, "tj::dev::load<tj::dev::f32, L64x64, false, false>") == 3);
    CHECK(count(g.source, "tj::dev::store<tj::dev::f32, L64x64, false, false>") == 1);
    CHECK(contains(g.source, "tj::dev::reduce<tj::dev::op_max, 1, tj::dev::f32, false>"));
    CHECK(count(g.source, "tj::dev::dot<L64x64, false, true, false>") == 1);
    CHECK(count(g.source, "tj::dev::dot<L64x64, false, false, false>") == 1);
    CHECK_FALSE(contains(g.source, "in_range"));   // b = bh / H, h = bh % H are provably in range
  }
  SUBCASE("S not a multiple: rows are masked, the static head dim is not") {
    GeneratedKernel g = codegen::generate_cuda(trace_attention(DType::f32, DType::f32, {1, 2, 100, 64}, false), cfg, Target{});
    INFO(g.source);
    CHECK(count(g.source, "tj::dev::load<tj::dev::f32, L64x64, true, false>") == 3);
    CHECK(contains(g.source, "tj::dev::reduce<tj::dev::op_max, 1, tj::dev::f32, true>"));
    CHECK(count(g.source, "tj::dev::dot<L64x64, false, false, true>") == 1);
  }
  SUBCASE("dynamic sizes are always checked") {
    ir::Function f = kernels::vector_add().trace({T(DType::f32, {-1}), T(DType::f32, {-1}), T(DType::f32, {-1})});
    GeneratedKernel g = codegen::generate_cuda(f, config(R"({"blocks":{"n":256}})"), Target{});
    INFO(g.source);
    CHECK(count(g.source, "L256, false, true>") == 3);
    CHECK(contains(g.source, "x.shape[0]"));
  }
}

TEST_CASE("codegen: exp2 is the MUFU's ex2.approx.ftz, log2 is accurate unless the fast_math knob is set") {
  // exp2: one ex2.approx.ftz per element on every path (results below 2^-126 are 0, as in the CPU
  // reference); exp2f's denormal fix-up would add three instructions around each.
  ir::Function sm = kernels::softmax().trace({T(DType::f32, {4, 256}), T(DType::f32, {4, 256})});
  Compiled e = compile(sm, config(R"({"blocks":{"c":128,"c2":128}})"), "sm_90a");
  CHECK(contains(e.gen.source, "tj::dev::exp2("));
  CHECK_FALSE(contains(e.gen.source, "exp2f("));
  CHECK(contains(e.ptx, "ex2.approx.ftz.f32"));
  const Kernel lg = kernel("log2_of", {"x", "o"}, [](In x, Out o) {
    for (auto i : tile(x.dim(0), block("b"))) o.store(i, log2(x.load(i)));
  });
  ir::Function f = lg.trace({T(DType::f32, {256}), T(DType::f32, {256})});
  GeneratedKernel accurate = codegen::generate_cuda(f, config(R"({"blocks":{"b":128}})"), Target{});
  CHECK(contains(accurate.source, "log2f("));
  CHECK_FALSE(contains(accurate.source, "fast_log2"));
  Compiled c = compile(f, config(R"({"blocks":{"b":128},"knobs":{"fast_math":1}})"), "sm_90a");
  CHECK(contains(c.gen.source, "tj::dev::fast_log2("));
  CHECK_FALSE(contains(c.gen.source, "log2f("));
  CHECK(contains(c.ptx, "lg2.approx.ftz.f32"));
}

// ---- errors ------------------------------------------------------------------------------------

TEST_CASE("codegen: a rank-3 tile is reported at its op") {
  int load_line = 0;
  const Kernel k = kernel("rank3", {"x", "o"}, [&](In x, Out o) {
    for (auto i : tile(x.dim(0), block("b"))) {
      load_line = __LINE__ + 1;
      auto t = x.load(i, all, all);
      o.store(i, all, all, t);
    }
  });
  ir::Function f = k.trace({T(DType::f32, {8, 4, 16}), T(DType::f32, {8, 4, 16})});
  try {
    codegen::generate_cuda(f, default_config(f), Target{});
    FAIL("a rank-3 tile was accepted");
  } catch (const DslError& e) {
    CHECK(e.what_only() == "tiles of rank 3 are not supported by the CUDA backend yet");
    CHECK(e.where().line == load_line);
    CHECK(ends_with(e.where().file, "test_codegen.cpp"));
  }
}

TEST_CASE("codegen: configs whose register tiles cannot fit are rejected with the sizes") {
  ir::Function f = trace_attention(DType::bf16, DType::bf16, {1, 2, 512, 64}, false);
  try {
    codegen::generate_cuda(f, config(R"({"blocks":{"m":256,"n":256},"num_warps":4})"), Target{});
    FAIL("an oversize config was accepted");
  } catch (const DslError&) {
    FAIL("expected a config error, not a DSL error");
  } catch (const Error& e) {
    std::string msg = e.what();
    CAPTURE(msg);
    CHECK(contains(msg, "kernel 'attention'"));
    CHECK(contains(msg, R"("m":256)"));
    CHECK(contains(msg, "512 elements per thread with 128 threads"));
    CHECK(contains(msg, "more than the 256"));
    CHECK(contains(msg, "f32[m, n]"));
  }
  // Smaller blocks fit: 128 x 128 over 128 threads is 128 elements per thread.
  CHECK_NOTHROW(codegen::generate_cuda(f, config(R"({"blocks":{"m":128,"n":128},"num_warps":4})"), Target{}));
}

TEST_CASE("codegen: configs that need more shared memory than the target has are rejected") {
  ir::Function f = trace_attention(DType::bf16, DType::bf16, {1, 1, 512, 256}, false);
  Config cfg = config(R"({"blocks":{"m":128,"n":128},"num_warps":8,"knobs":{"mma":0}})");
  try {
    codegen::generate_cuda(f, cfg, Target{});
    FAIL("a config needing more than 227 KB of shared memory was accepted");
  } catch (const Error& e) {
    std::string msg = e.what();
    CAPTURE(msg);
    CHECK(contains(msg, "kernel 'attention'"));
    CHECK(contains(msg, "bytes of shared memory"));
    CHECK(contains(msg, "232448 bytes (227 KB)"));
    CHECK(contains(msg, "the dot at"));
  }
  // The same kernel with smaller blocks fits, and sm_80's smaller limit is applied.
  CHECK(codegen::generate_cuda(f, config(R"({"blocks":{"m":64,"n":64},"num_warps":4})"), Target{}).dynamic_smem_bytes <=
        227 * 1024);
  Config mid = config(R"({"blocks":{"m":128,"n":64},"num_warps":8,"knobs":{"mma":0}})");   // the SIMT dots' staging
  GeneratedKernel g = codegen::generate_cuda(f, mid, Target{});
  CHECK(g.dynamic_smem_bytes > 163 * 1024);
  CHECK_THROWS_AS(codegen::generate_cuda(f, mid, Target::parse("sm_80")), Error);
}

TEST_CASE("codegen: parameter names that clash with generated names are renamed") {
  const Kernel k = kernel("clash", {"v1", "int", "tj_smem"}, [](In a, In b, Out c) {
    for (auto i : tile(a.dim(0), block("n"))) c.store(i, a.load(i) + b.load(i));
  });
  ir::Function f = k.trace({T(DType::f32, {-1}), T(DType::f32, {-1}), T(DType::f32, {-1})});
  Compiled c = compile(f, default_config(f), "sm_90a");
  CHECK(contains(c.gen.source, "tj::dev::TensorArg<1> p0_v1, tj::dev::TensorArg<1> p1_int, tj::dev::TensorArg<1> p2_tj_smem"));
  CHECK(contains(c.ptx, ".entry clash"));
}

TEST_CASE("codegen: knob simt_vec gives a thread column adjacent columns, 16-byte loads, and room for its reductions") {
  const std::vector<ArgSpec> specs = {TensorSpec{DType::bf16, {8, 16, 2048, 128}}, TensorSpec{DType::f32, {8, 16, 4}}};
  ir::Function f = kernels::chunk_amax().trace(specs);
  GeneratedKernel plain = codegen::generate_cuda(f, config(R"({"blocks":{"s":64},"num_warps":8})"), Target{});
  GeneratedKernel vec = codegen::generate_cuda(f, config(R"({"blocks":{"s":64},"num_warps":8,"knobs":{"simt_vec":8}})"), Target{});
  CHECK(contains(plain.source, "tj::dev::Arr<4, 8, 8, 1>;"));
  CHECK(contains(vec.source, "tj::dev::Arr<4, 8, 8, 1, 8>;"));
  // The amax over the rows crosses 8 warp rows through shared memory: a float per column
  // position (8 thread columns of 8) per warp row.
  CHECK(plain.dynamic_smem_bytes >= 8 * 8 * 4);
  CHECK(vec.dynamic_smem_bytes >= 64 * 8 * 4);
  for (const char* arch : {"sm_90a", "sm_80"}) {
    CAPTURE(arch);
    const std::string ptx = tj_test::nvrtc(vec, arch, false).ptx;
    CHECK(std::regex_search(ptx, std::regex(R"(ld\.global(\.nc)?(\.L2::256B)?\.v4\.u32)")));
  }
  for (int bad : {0, 3, 32}) {
    CAPTURE(bad);
    const std::string json = fmt::format(R"({{"blocks":{{"s":64}},"knobs":{{"simt_vec":{}}}}})", bad);
    const std::string want = fmt::format("kernel 'chunk_amax': knob simt_vec must be a power of two in [1, 16], got {}", bad);
    CHECK_THROWS_WITH(codegen::generate_cuda(f, config(json.c_str()), Target{}), doctest::Contains(want.c_str()));
  }
}

TEST_CASE("codegen: SIMT loads ask L2 for 256-byte blocks only where a tile row covers them contiguously") {
  const int64_t B = 2, H = 3, S = 256, D = 128;
  const std::vector<ArgSpec> wide = {contiguous_spec(DType::bf16, {B, H, S, D}), contiguous_spec(DType::f32, {B, H, 2}),
                                     contiguous_spec(DType::e4m3, {B, H, S, D}), contiguous_spec(DType::f32, {B, H})};
  const GeneratedKernel quantizer =
      codegen::generate_cuda(kernels::quantize_fp8_chunked().trace(wide), kernels::chunked_quantize_config(false), Target{});
  // Rows of 32 f32 (128 bytes): half of each block would be fetched for nothing.
  const GeneratedKernel narrow = codegen::generate_cuda(
      k_elementwise2d().trace({T(DType::f32, {64, 64}), T(DType::f32, {64, 64}), T(DType::f32, {64, 64}), T(DType::f32, {64, 64}),
                               RuntimeScalar{1.0f}}),
      config(R"({"blocks":{"r":16,"c":32},"num_warps":4})"), Target{});
  for (const char* arch : {"sm_90a", "sm_80"}) {
    CAPTURE(arch);
    const std::string ptx = tj_test::nvrtc(quantizer, arch, false).ptx;
    CHECK(std::regex_search(ptx, std::regex(R"(ld\.global\.L2::256B\.u16)")));
    CHECK(!contains(tj_test::nvrtc(narrow, arch, false).ptx, "L2::256B"));
  }
}

TEST_CASE("codegen: SIMT kernels generated to start early read their In tensors, then wait for the previous kernel") {
  // vector_add: both loads, then the wait, then the store.
  const ir::Function add = kernels::vector_add().trace({T(DType::f32, {-1}), T(DType::f32, {-1}), T(DType::f32, {-1})});
  const Config cfg = config(R"({"blocks":{"n":256},"num_warps":4})");
  for (const char* arch : {"sm_90a", "sm_90"}) {
    CAPTURE(arch);
    const GeneratedKernel g = codegen::generate_cuda(add, cfg, Target::parse(arch), /*start_early=*/true);
    const std::string& src = g.source;
    INFO(src);
    CHECK(g.starts_early);
    const size_t trigger = src.find("tj::dev::griddep_launch_dependents();");
    const size_t wait = src.find("tj::dev::griddep_wait();  //");
    REQUIRE(trigger != std::string::npos);
    REQUIRE(wait != std::string::npos);
    CHECK(trigger < src.find("const long long tj_pid"));
    CHECK(src.rfind("(x.data", wait) != std::string::npos);
    CHECK(src.rfind("(y.data", wait) != std::string::npos);
    CHECK(wait < src.find("tj::dev::store<"));
    CHECK(count(src, "tj::dev::griddep_wait();") == 2);   // and in the blocks past the last program
    CHECK(contains(src, "{ tj::dev::griddep_wait(); return; }"));
    const std::string ptx = tj_test::nvrtc(g, arch, false).ptx;
    CHECK(contains(ptx, "griddepcontrol.wait"));
    CHECK(contains(ptx, "griddepcontrol.launch_dependents"));
    // Not asked for: neither (each costs every block a few cycles).
    const GeneratedKernel plain = codegen::generate_cuda(add, cfg, Target::parse(arch));
    CHECK_FALSE(plain.starts_early);
    CHECK_FALSE(contains(plain.source, "griddep"));
  }
  const GeneratedKernel old = codegen::generate_cuda(add, cfg, Target::parse("sm_80"), /*start_early=*/true);
  CHECK_FALSE(old.starts_early);
  CHECK_FALSE(contains(old.source, "griddep"));

  // chunk_amax: its whole loop over x, then the wait before the store of the chunk's amax.
  const std::vector<ArgSpec> specs = {contiguous_spec(DType::bf16, {2, 3, 256, 128}), contiguous_spec(DType::f32, {2, 3, 2})};
  const GeneratedKernel amax =
      codegen::generate_cuda(kernels::chunk_amax().trace(specs), kernels::chunk_amax_config(), Target{}, true);
  INFO(amax.source);
  const size_t loop = amax.source.find("for (long long");
  const size_t wait = amax.source.find("tj::dev::griddep_wait();  //");
  REQUIRE(loop != std::string::npos);
  REQUIRE(wait != std::string::npos);
  CHECK(loop < wait);
  CHECK(wait < amax.source.find("store_scalar<"));

  // A tensor the kernel writes is read only after the wait, even when that read comes first.
  static const Kernel accumulate = kernel("accumulate", {"x", "acc"}, [](In x, InOut acc) {
    for (auto i : tile(x.dim(0), block("n"))) acc.store(i, acc.load(i) + x.load(i));
  });
  const GeneratedKernel acc =
      codegen::generate_cuda(accumulate.trace({T(DType::f32, {-1}), T(DType::f32, {-1})}), cfg, Target{}, true);
  INFO(acc.source);
  const size_t acc_wait = acc.source.find("tj::dev::griddep_wait();  //");
  REQUIRE(acc_wait != std::string::npos);
  CHECK(acc_wait < acc.source.find("(acc.data"));
}

TEST_CASE("codegen: knob simt_min_blocks has ptxas keep the registers for that many blocks per SM") {
  const std::vector<ArgSpec> specs = {TensorSpec{DType::bf16, {8, 16, 2048, 128}}, TensorSpec{DType::f32, {8, 16, 4}}};
  ir::Function f = kernels::chunk_amax().trace(specs);
  // The quantizer with runtime strides: an address per element.
  ir::Function q = kernels::quantize_fp8_chunked().trace({TensorSpec{DType::bf16, {8, 16, 2048, 128}}, TensorSpec{DType::f32, {8, 16, 4}},
                                                          TensorSpec{DType::e4m3, {8, 16, 2048, 128}}, TensorSpec{DType::f32, {8, 16}}});
  GeneratedKernel plain = codegen::generate_cuda(q, config(R"({"blocks":{"s2":64},"num_warps":8,"knobs":{"simt_lanes_c":16}})"), Target{});
  GeneratedKernel bounded = codegen::generate_cuda(
      q, config(R"({"blocks":{"s2":64},"num_warps":8,"knobs":{"simt_lanes_c":16,"simt_min_blocks":4}})"), Target{});
  CHECK(contains(plain.source, "__launch_bounds__(256) quantize_fp8_chunked("));
  CHECK(contains(bounded.source, "__launch_bounds__(256, 4) quantize_fp8_chunked("));
  // 4 blocks of 256 threads in 65536 registers: at most 64 each, without spilling this loop. Unbounded,
  // ptxas takes more (127 with CUDA 13.0), so only two blocks fit an SM.
  const tj_test::PtxasInfo p = tj_test::ptxas_info(tj_test::nvrtc(plain, "sm_90a", true, true).log);
  const tj_test::PtxasInfo b = tj_test::ptxas_info(tj_test::nvrtc(bounded, "sm_90a", true, true).log);
  CHECK(p.registers > 64);
  CHECK(b.registers > 0);
  CHECK(b.registers <= 64);
  CHECK(b.spill_stores == 0);
  CHECK(contains(tj_test::nvrtc(bounded, "sm_80", false).ptx, ".minnctapersm 4"));
  for (int bad : {-1, 9}) {
    CAPTURE(bad);
    const std::string json = fmt::format(R"({{"blocks":{{"s":64}},"num_warps":8,"knobs":{{"simt_min_blocks":{}}}}})", bad);
    const std::string want = fmt::format(
        "kernel 'chunk_amax': knob simt_min_blocks must be in [0, 8] (256 threads per block, 2048 per SM on sm_90a), "
        "got {}",
        bad);
    CHECK_THROWS_WITH(codegen::generate_cuda(f, config(json.c_str()), Target{}), doctest::Contains(want.c_str()));
  }
  // Ada holds 1536 threads per SM: six blocks of 256, not eight.
  const Config seven = config(R"({"blocks":{"s":64},"num_warps":8,"knobs":{"simt_min_blocks":7}})");
  CHECK(contains(codegen::generate_cuda(f, seven, Target{}).source, "__launch_bounds__(256, 7)"));
  CHECK_THROWS_WITH(codegen::generate_cuda(f, seven, Target::parse("sm_89")),
                    doctest::Contains("knob simt_min_blocks must be in [0, 6] (256 threads per block, 1536 per SM on "
                                      "sm_89), got 7"));
}

TEST_CASE("codegen: unit strides a spec compiles in are literals, so ptxas keeps one address per row, not per element") {
  const int64_t B = 8, H = 16, S = 2048, D = 128;
  const TensorView x{nullptr, DType::bf16, {B, H, S, D}, {}, Device::cuda};
  const TensorView partial{nullptr, DType::f32, {B, H, 4}, {}, Device::cuda};
  const TensorView y{nullptr, DType::e4m3, {B, H, S, D}, {}, Device::cuda};
  const TensorView descale{nullptr, DType::f32, {B, H}, {}, Device::cuda};
  // launch()'s specs: each stride of 1 compiled in (contiguous: the last); others stay runtime values.
  const std::vector<ArgSpec> unit = specs_for(kernels::quantize_fp8_chunked(), {x, partial, y, descale}, false);
  CHECK(std::get<TensorSpec>(unit[0]).strides == std::vector<int64_t>{-1, -1, -1, 1});
  TensorView every_other = x;
  every_other.strides = {H * S * 2 * D, S * 2 * D, 2 * D, 2};
  TensorView transposed = partial;   // [B, H, 4] laid out as [4, H, B]
  transposed.strides = {1, B, H * B};
  const std::vector<ArgSpec> strided =
      specs_for(kernels::quantize_fp8_chunked(), {every_other, transposed, y, descale}, false);
  CHECK(std::get<TensorSpec>(strided[0]).strides == std::vector<int64_t>{-1, -1, -1, -1});
  CHECK(std::get<TensorSpec>(strided[1]).strides == std::vector<int64_t>{1, -1, -1});
  CHECK(spec_key(unit) != spec_key(strided));

  const Config cfg = kernels::chunked_quantize_config(false);
  ir::Function fu = kernels::quantize_fp8_chunked().trace(unit);
  ir::Function fs = kernels::quantize_fp8_chunked().trace(strided);
  CHECK(contains(ir::print(fu), "x: in tensor<bf16, [8, 16, 2048, 128], strides {3: 1}>"));
  GeneratedKernel gu = codegen::generate_cuda(fu, cfg, Target{});
  GeneratedKernel gs = codegen::generate_cuda(fs, cfg, Target{});
  CHECK(contains(gu.source, "{0LL, 1LL, 128LL}"));
  CHECK_FALSE(contains(gu.source, "x.stride[3]"));
  CHECK(contains(gs.source, "{0LL, x.stride[3], 128LL}"));
  // CUDA 13.0's ptxas: 127 registers with the runtime stride, 64 with the literal (so four
  // blocks of 256 threads fit an SM, not two).
  const tj_test::PtxasInfo pu = tj_test::ptxas_info(tj_test::nvrtc(gu, "sm_90a", true, true).log);
  const tj_test::PtxasInfo ps = tj_test::ptxas_info(tj_test::nvrtc(gs, "sm_90a", true, true).log);
  MESSAGE("quantize_fp8_chunked registers: unit stride " << pu.registers << ", runtime stride " << ps.registers);
  CHECK(pu.registers > 0);
  CHECK(pu.registers <= 64);
  CHECK(ps.registers > pu.registers);
  CHECK(pu.spill_stores == 0);
}

TEST_CASE("codegen: every knob a lowering reads is in its table and in docs/knobs.md, and a config that sets another one is an error") {
  for (const char* lowering : {"emitter", "sm90_gemm", "sm80_gemm", "sm90_attention", "tuner"}) {
    CAPTURE(std::string(lowering));
    const auto table = codegen::knob_table(lowering);
    REQUIRE(table.has_value());
    CHECK_FALSE(table->knobs.empty());
    for (const codegen::KnobSpec* k : table->knobs) {
      CHECK(std::string(k->name).size() > 0);
      CHECK(std::string(k->doc).size() > 10);
    }
  }
  auto names = [](const char* lowering) {
    std::vector<std::string> out;
    const auto table = codegen::knob_table(lowering);
    for (const codegen::KnobSpec* k : table->knobs) out.push_back(k->name);
    return out;
  };
  const auto emitter = names("emitter");
  for (const char* k : {"lowering", "mma", "warp_specialize", "persistent", "persistent_blocks", "raster_group", "longest_first",
                        "fast_math", "simt_vec", "simt_min_blocks"})
    CHECK(std::find(emitter.begin(), emitter.end(), k) != emitter.end());
  const auto attention = names("sm90_attention");
  CHECK(std::find(attention.begin(), attention.end(), "attn_self_load") != attention.end());
  // docs/knobs.md documents every knob (but the tuner's test hooks, named __*).
  const std::vector<std::string> doc = read_lines(std::string(TJ_TESTS_DIR) + "/../docs/knobs.md");
  REQUIRE_FALSE(doc.empty());
  for (const auto& t : codegen::knob_tables())
    for (const codegen::KnobSpec* k : t.knobs) {
      const std::string quoted = fmt::format("`{}`", k->name);
      if (std::string(k->name).rfind("__", 0) == 0) continue;
      CAPTURE(quoted);
      CHECK(std::any_of(doc.begin(), doc.end(), [&](const std::string& l) { return contains(l, quoted); }));
    }
  // Declared knobs pass; a misspelt one names the closest, an unrelated one only that it is unknown.
  CHECK_NOTHROW(codegen::check_knob_names("k", config(R"({"knobs":{"persistent":1,"attn_overlap":0,"promote":0}})")));
  CHECK_THROWS_WITH_AS(codegen::check_knob_names("k", config(R"({"knobs":{"attn_overlapp":1}})")),
                       doctest::Contains("knob 'attn_overlapp', which no lowering reads (did you mean 'attn_overlap'?)"), Error);
  try {
    codegen::check_knob_names("k", config(R"({"knobs":{"zzzzzzzzzzzz":1}})"));
    FAIL("an unknown knob passed");
  } catch (const Error& e) {
    CHECK_FALSE(contains(e.what(), "did you mean"));
    CHECK(contains(e.what(), "`tilejit show k --knobs` lists the knobs"));
  }
}
