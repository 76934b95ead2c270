// Tracing and its errors: every mistake a user can make in a kernel body is reported at the
// user's line with a message that says what to do.
#include <doctest/doctest.h>

#include <cmath>

#include "dsl/config.h"
#include "codegen/cuda_emitter.h"
#include "dsl/kernel.h"
#include "dsl/passes.h"

using namespace tj;

namespace {

TensorSpec t(DType d, std::vector<int64_t> shape) { return TensorSpec{d, std::move(shape)}; }

// Traces `k` expecting a DslError whose message contains `text` and which points at this file.
void expect_dsl_error(const Kernel& k, const std::vector<ArgSpec>& args, const std::string& text) {
  try {
    k.trace(args);
    FAIL("expected a DslError containing: " << text);
  } catch (const DslError& e) {
    INFO(e.what());
    CHECK(e.what_only().find(text) != std::string::npos);
    CHECK(e.where().file.find("test_dsl.cpp") != std::string::npos);
    CHECK(e.where().line > 0);
    // The message shows the offending source line.
    CHECK(std::string(e.what()).find(" | ") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("dsl: tracing records ops, source lines and launch loops") {
  Kernel k = kernel("add", {"x", "y", "out"}, [](In x, In y, Out out) {
    for (auto i : tile(x.dim(0), block("n"))) out.store(i, x.load(i) + y.load(i));
  });
  ir::Function f = k.trace({t(DType::f32, {1000}), t(DType::f32, {1000}), t(DType::f32, {1000})});
  REQUIRE(f.blocks.size() == 1);
  CHECK(f.blocks[0].name == "n");
  int loops = 0, launch = 0, stores = 0;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    loops += op.kind == ir::OpKind::loop;
    launch += op.kind == ir::OpKind::loop && op.launch;
    if (op.kind == ir::OpKind::store) {
      ++stores;
      CHECK(op.loc.file.find("test_dsl.cpp") != std::string::npos);
    }
  });
  CHECK(loops == 1);
  CHECK(launch == 1);
  CHECK(stores == 1);
  std::string text = ir::print(f);
  CHECK(text.find("store out[") != std::string::npos);
  CHECK(text.find("// launch") != std::string::npos);
}

TEST_CASE("dsl: store_where records the mask, broadcast to the slice, and prints it") {
  Kernel k = kernel("gated", {"x", "out", "alpha"}, [](In x, Out out, Scalar alpha) {
    for (auto i : tile(x.dim(0), block("n"))) out.store_where(alpha > 0.0, i, x.load(i));
  });
  ir::Function f = k.trace({t(DType::f32, {1000}), t(DType::f32, {1000}), RuntimeScalar{1.0f}});
  int masked = 0;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind != ir::OpKind::store) return;
    masked += op.ival == 1;
    REQUIRE(op.operands.size() == op.indices.size() + 2);
    const auto& m = f.type(op.operands.back());
    CHECK(m.dtype == DType::i1);
    CHECK(m.shape == f.type(op.operands.at(op.indices.size())).shape);   // the scalar mask, broadcast
  });
  CHECK(masked == 1);
  CHECK(ir::print(f).find(" where %") != std::string::npos);
}

TEST_CASE("dsl: host values specialize the trace, Scalar stays a runtime parameter") {
  Kernel k = kernel("scale", {"x", "out", "s", "negate"}, [](In x, Out out, Scalar s, bool negate) {
    for (auto i : tile(x.dim(0))) {
      auto v = x.load(i) * s;
      out.store(i, negate ? -v : v);
    }
  });
  auto specs = [](bool neg) {
    return std::vector<ArgSpec>{t(DType::f32, {64}), t(DType::f32, {64}), RuntimeScalar{2.0f}, neg};
  };
  std::string a = ir::print(k.trace(specs(false))), b = ir::print(k.trace(specs(true)));
  CHECK(a != b);
  CHECK(b.find("neg") != std::string::npos);
  CHECK(a.find("param s") != std::string::npos);
}

TEST_CASE("dsl: loop-carried state through tj::Var") {
  Kernel k = kernel("rowsum", {"x", "out"}, [](In x, Out out) {
    auto [rows, cols] = x.shape<2>();
    for (auto r : grid(rows)) {
      Var total = constant(0.0, DType::f32);
      for (auto c : tile(cols)) total = total + sum(x.load(r, c), 0);
      out.store(r, total);
    }
  });
  ir::Function f = k.trace({t(DType::f32, {4, 100}), t(DType::f32, {4})});
  int writes = 0;
  ir::walk(f.body, [&](const ir::Op& op, int) { writes += op.kind == ir::OpKind::var_write; });
  CHECK(writes == 1);
}

TEST_CASE("dsl: a Var declared on a named tile range holds the loop's tiles") {
  Kernel k = kernel("colsum", {"x", "out"}, [](In x, Out out) {
    auto rows = tile(x.dim(0), block("r"));
    Var total = zeros({rows, x.dim(1)}, DType::f32);
    for (auto r : rows) total = total + x.load(r, all);
    out.store(all, sum(total, 0));
  });
  ir::Function f = k.trace({t(DType::f32, {100, 8}), t(DType::f32, {8})});
  REQUIRE(f.blocks.size() == 1);
  int masked_reductions = 0, reductions = 0;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind != ir::OpKind::reduce) return;
    ++reductions;
    masked_reductions += op.operands.size() == 3;
  });
  CHECK(reductions == 1);
  CHECK(masked_reductions == 0);   // after the loop every row of the Var holds data
  CHECK(ir::print(f).find("[r, 8]") != std::string::npos);

  // Rows past a range's end inside the tensor are read: a kernel masks them as SEMANTICS.md says.
  Kernel masked = kernel("colsum_prefix", {"x", "out"}, [](In x, Out out) {
    auto end = x.dim(0) - 3;
    auto rows = tile(end, block("r"));
    Var total = zeros({rows, x.dim(1)}, DType::f32);
    for (auto r : rows) total = total + where(r.index().col() < end, x.load(r, all), 0.0);
    out.store(all, sum(total, 0));
  });
  CHECK(ir::print(masked.trace({t(DType::f32, {100, 8}), t(DType::f32, {8})})).find("where") != std::string::npos);
}

TEST_CASE("dsl: errors point at the user's line") {
  auto f32 = [](std::vector<int64_t> s) { return t(DType::f32, s); };

  SUBCASE("storing the wrong dtype") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto i : tile(x.dim(0))) o.store(i, x.load(i));
    });
    expect_dsl_error(k, {f32({8}), t(DType::bf16, {8})}, "storing a f32 tile into 'o', which holds bf16");
  }
  SUBCASE("a store_where mask that does not broadcast to the slice") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto i : tile(x.dim(0), block("r")))
        for (auto j : tile(x.dim(1), block("c"))) o.store_where(i.index() > 3, i, j, x.load(i, j));
    });
    expect_dsl_error(k, {f32({8, 16}), f32({8, 16})}, "store_where into 'o': a mask of shape");
  }
  SUBCASE("a reduction of a boolean tile") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto i : tile(x.dim(0), block("r"))) o.store(i, sum(x.load(i, all) > 0.0, 1));
    });
    expect_dsl_error(k, {f32({8, 16}), t(DType::i32, {8})},
                     "reductions need an f32, f16, bf16, i32 or i64 tile, got i1: convert with .to(tj::DType::i32)");
  }
  SUBCASE("storing into an input") {
    Kernel k = kernel("k", {"x"}, [](In x) {
      for (auto i : tile(x.dim(0))) x.store(i, x.load(i));
    });
    expect_dsl_error(k, {f32({8})}, "'x' is an input (tj::In)");
  }
  SUBCASE("loading an output") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto i : tile(x.dim(0))) o.store(i, o.load(i));
    });
    expect_dsl_error(k, {f32({8}), f32({8})}, "'o' is an output (tj::Out)");
  }
  SUBCASE("wrong number of indices") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto i : tile(x.dim(0))) o.store(i, x.load(i));
    });
    expect_dsl_error(k, {f32({8, 8}), f32({8})}, "'x' has rank 2 but 1 indices were given");
  }
  SUBCASE("tj::all on a dynamic dimension") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto i : tile(x.dim(0))) o.store(i, all, x.load(i, all));
    });
    expect_dsl_error(k, {f32({8, -1}), f32({8, -1})}, "tj::all needs a static size, but dimension 1 of 'x' is dynamic");
  }
  SUBCASE("a tile range's loop run twice") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      auto rows = tile(x.dim(0), block("r"));
      for (auto r : rows) o.store(r, x.load(r));
      for (auto r : rows) o.store(r, x.load(r) * 2.0);
    });
    expect_dsl_error(k, {f32({8}), f32({8})}, "this tile range has already run its loop: call tile() again for a second loop");
  }
  SUBCASE("a Var over a tile range declared outside the loop that runs the range") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      auto rows = tile(x.dim(1), block("r"));
      Var acc = zeros({rows}, DType::f32);
      for (auto b : grid(x.dim(0))) {
        for (auto r : rows) acc = acc + x.load(b, r);
        o.store(b, sum(acc, 0));
      }
    });
    expect_dsl_error(k, {f32({4, 8}), f32({4})},
                     "a tile with block dim r is used outside the scope that runs its tile loop (declare a Var that holds "
                     "its tiles where the loop runs, not in an enclosing loop or after it)");
  }
  SUBCASE("a Var over one range updated with another loop's tiles") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      auto rows = tile(x.dim(0), block("r"));
      Var acc = zeros({rows}, DType::f32);
      for (auto r : tile(x.dim(0), block("r2"))) acc = acc + x.load(r);
      o.store(0, sum(acc, 0));
    });
    expect_dsl_error(k, {f32({8}), f32({1})},
                     "add: shapes [r] and [r2] do not broadcast (a tile loop's block dimension matches only tiles of "
                     "that same loop, not a constant or another loop's block of the same size)");
  }
  SUBCASE("shapes that do not broadcast") {
    Kernel k = kernel("k", {"x", "y", "o"}, [](In x, In y, Out o) {
      for (auto i : tile(x.dim(0), block("a")))
        for (auto j : tile(y.dim(0), block("b"))) o.store(i, x.load(i) + y.load(j));
    });
    expect_dsl_error(k, {f32({8}), f32({8}), f32({8})},
                     "add: shapes [a] and [b] do not broadcast (a tile loop's block dimension matches only tiles of "
                     "that same loop, not a constant or another loop's block of the same size)");
  }
  SUBCASE("a fixed-size block against a constant of the same size") {
    // The rows' running maximum outside the loop is [64]; the loop's tiles are [block(64)].
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      Var row_max = zeros({64}, DType::f32);
      for (auto s : tile(x.dim(0), block(64))) row_max = maximum(row_max, amax(x.load(s, all), 1));
      o.store(all, row_max);
    });
    expect_dsl_error(k, {f32({128, 32}), f32({64})},
                     "maximum: shapes [64] and [block(64)] do not broadcast (a tile loop's block dimension matches "
                     "only tiles of that same loop");
  }
  SUBCASE("constants of different sizes get no block hint") {
    Kernel k = kernel("k", {"x", "y", "o"}, [](In x, In y, Out o) { o.store(all, x.load(all) + y.load(all)); });
    expect_dsl_error(k, {f32({8}), f32({4}), f32({8})}, "add: shapes [8] and [4] do not broadcast");
    try {
      k.trace({f32({8}), f32({4}), f32({8})});
    } catch (const DslError& e) {
      CHECK(e.what_only().find("tile loop") == std::string::npos);
    }
  }
  SUBCASE("dot with mismatched inner dimensions") {
    Kernel k = kernel("k", {"a", "b", "o"}, [](In a, In b, Out o) {
      for (auto m : tile(a.dim(0))) o.store(m, all, dot(a.load(m, all), b.load(all, all)));
    });
    expect_dsl_error(k, {f32({8, 16}), f32({32, 8}), f32({8, 8})}, "dot: inner dimensions differ: [block_0, 16] · [32, 8]");
  }
  SUBCASE("dot with mixed dtypes") {
    Kernel k = kernel("k", {"a", "b", "o"}, [](In a, In b, Out o) {
      for (auto m : tile(a.dim(0))) o.store(m, all, dot(a.load(m, all), b.load(all, all)));
    });
    expect_dsl_error(k, {t(DType::bf16, {8, 16}), f32({16, 8}), f32({8, 8})}, "dot operands must have the same dtype");
  }
  SUBCASE("arithmetic on fp8") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto i : tile(x.dim(0))) o.store(i, (x.load(i) * 2.0).to(DType::f32));
    });
    expect_dsl_error(k, {t(DType::e4m3, {8}), f32({8})}, "arithmetic on e4m3 tiles is not supported");
  }
  SUBCASE("a value used after the loop that computed it") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto r : grid(x.dim(0))) {
        Tile last = constant(0.0, DType::f32);
        for (auto c : tile(x.dim(1))) last = sum(x.load(r, c), 0);
        o.store(r, last);
      }
    });
    expect_dsl_error(k, {f32({4, 8}), f32({4})}, "must be a tj::Var declared before the loop");
  }
  SUBCASE("assigning the wrong dtype to a Var") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto r : grid(x.dim(0))) {
        Var acc = constant(0.0, DType::f32);
        for (auto c : tile(x.dim(1))) acc = sum(x.load(r, c), 0);
        o.store(r, acc.to(DType::f32));
      }
    });
    expect_dsl_error(k, {t(DType::bf16, {4, 8}), f32({4})}, "assigning a bf16 tile to a tj::Var of f32");
  }
  SUBCASE("reduction axis out of range") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto r : grid(x.dim(0))) o.store(r, amax(x.load(r, all), 1));
    });
    expect_dsl_error(k, {f32({4, 8}), f32({4})}, "reduction axis 1 is out of range for a rank-1 tile");
  }
  SUBCASE("where with a non-boolean condition") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto i : tile(x.dim(0))) o.store(i, where(x.load(i), 1.0, x.load(i)));
    });
    expect_dsl_error(k, {f32({8}), f32({8})}, "where: the condition must be a boolean tile");
  }
  SUBCASE("two tile loops with the same name") {
    Kernel k = kernel("k", {"x", "o"}, [](In x, Out o) {
      for (auto i : tile(x.dim(0), block("m")))
        for (auto j : tile(x.dim(1), block("m"))) o.store(i, j, x.load(i, j));
    });
    expect_dsl_error(k, {f32({8, 8}), f32({8, 8})}, "two tile loops are named 'm'");
  }
}

TEST_CASE("dsl: DSL calls outside a trace are an error, not a crash") {
  CHECK_THROWS_WITH_AS(constant(1.0, DType::f32), doctest::Contains("only be used inside a kernel body"), DslError);
}

TEST_CASE("dsl: arguments that do not fit the kernel's parameters") {
  Kernel k = kernel("k", {"x", "s", "flag"}, [](In x, Scalar s, bool flag) {});
  CHECK_THROWS_WITH_AS(k.trace({t(DType::f32, {4})}), doctest::Contains("takes 3 arguments, 1 were given"), Error);
  CHECK_THROWS_WITH_AS(k.trace({t(DType::f32, {4}), true, true}),
                       doctest::Contains("argument 1 ('s') must be tj::Scalar, got a bool"), Error);
  CHECK_THROWS_WITH_AS(k.trace({RuntimeScalar{1}, RuntimeScalar{1}, true}),
                       doctest::Contains("argument 0 ('x') must be tj::In, got a runtime scalar"), Error);
}

TEST_CASE("dsl: the verifier rejects IR that breaks the rules") {
  Kernel k = kernel("add", {"x", "out"}, [](In x, Out out) {
    for (auto i : tile(x.dim(0))) out.store(i, x.load(i) + x.load(i));
  });
  ir::Function f = k.trace({t(DType::f32, {64}), t(DType::f32, {64})});
  ir::Region& body = *f.body.ops.back().body;
  SUBCASE("result type differs from the inferred one") {
    for (ir::Op& op : body.ops)
      if (op.kind == ir::OpKind::binary) f.values[op.result].type.dtype = DType::bf16;
    CHECK_THROWS_WITH_AS(passes::verify(f), doctest::Contains("differs from the inferred"), DslError);
  }
  SUBCASE("an operand defined in a scope that has ended") {
    int inner = body.ops.front().result;
    ir::Op use;
    use.kind = ir::OpKind::unary;
    use.unary = ir::UnaryFn::neg;
    use.operands = {inner};
    use.result = static_cast<int>(f.values.size());
    f.values.push_back(f.values[inner]);
    f.body.ops.push_back(std::move(use));
    CHECK_THROWS_WITH_AS(passes::verify(f), doctest::Contains("is not defined in an enclosing scope"), DslError);
  }
  SUBCASE("a store's mask that is not boolean") {
    for (ir::Op& op : body.ops)
      if (op.kind == ir::OpKind::store) {
        op.ival = 1;
        op.operands.push_back(op.operands.back());   // the f32 value as its own mask
      }
    CHECK_THROWS_WITH_AS(passes::verify(f), doctest::Contains("a store's mask is an i1 tile"), DslError);
  }
  SUBCASE("a store into an input") {
    f.params[1].kind = ir::ParamKind::tensor_in;
    CHECK_THROWS_WITH_AS(passes::verify(f), doctest::Contains("store to input 'out'"), DslError);
  }
}

TEST_CASE("config: JSON round trip, entries over a base, and errors") {
  Config c;
  c.blocks = {{"m", 128}, {"n", 64}};
  c.num_warps = 8;
  c.knobs["cluster"] = 2;
  CHECK(Config::from_json(c.to_json()) == c);
  CHECK_THROWS_WITH_AS(Config::from_json("{"), doctest::Contains("not valid JSON"), Error);
  CHECK_THROWS_WITH_AS(Config::from_json(R"({"warps": 4})"), doctest::Contains("unknown key 'warps'"), Error);
  CHECK_THROWS_WITH_AS(Config::from_json(R"({"num_warps": 64})"), doctest::Contains("num_warps must be in [1, 32]"), Error);
  // Over a base: the given entries replace theirs, name by name; the rest stays.
  const Config over = Config::from_json(R"({"blocks":{"n":32},"knobs":{"promote":1}})", c);
  CHECK(over.blocks == std::map<std::string, int64_t>{{"m", 128}, {"n", 32}});
  CHECK(over.knobs == std::map<std::string, int64_t>{{"cluster", 2}, {"promote", 1}});
  CHECK(over.num_warps == 8);
  CHECK(Config::from_json(R"({"num_stages":3})", c).num_stages == 3);
  CHECK(Config::from_json("{}", c) == c);
  CHECK_THROWS_WITH_AS(Config::from_json(R"({"num_warps": 0})", c), doctest::Contains("num_warps must be in [1, 32]"), Error);
  Kernel k = kernel("add", {"x", "out"}, [](In x, Out out) {
    for (auto i : tile(x.dim(0), block("n"))) out.store(i, x.load(i));
  });
  ir::Function f = k.trace({t(DType::f32, {64}), t(DType::f32, {64})});
  Config bad;
  bad.blocks = {{"m", 64}};
  CHECK_THROWS_WITH_AS(check_config(f, bad), doctest::Contains("config sets block 'm', but kernel 'add' has blocks: n"), Error);
  bad.blocks = {{"n", 48}};
  CHECK_THROWS_WITH_AS(check_config(f, bad), doctest::Contains("must be a power of two or a multiple of 32"), Error);
  // A block of rank-1 tiles only may hold a whole row: up to 32768; one of rank-2 tiles up to 1024.
  Config row;
  row.blocks = {{"n", 32768}};
  CHECK_NOTHROW(check_config(f, row));
  row.blocks = {{"n", 65536}};
  CHECK_THROWS_WITH_AS(check_config(f, row),
                       "block 'n' must be a power of two or a multiple of 32 in [1, 32768] (a block of rank-1 tiles only), got 65536",
                       Error);
  Kernel k2 = kernel("copy2d", {"x", "out"}, [](In x, Out out) {
    for (auto r : tile(x.dim(0), block("r"))) out.store(r, all, x.load(r, all));
  });
  ir::Function f2 = k2.trace({t(DType::f32, {64, 8}), t(DType::f32, {64, 8})});
  Config wide;
  wide.blocks = {{"r", 2048}};
  CHECK_THROWS_WITH_AS(check_config(f2, wide), "block 'r' must be a power of two or a multiple of 32 in [1, 1024], got 2048", Error);
  Config tensor_core_only;
  tensor_core_only.blocks = {{"n", 96}};
  CHECK_NOTHROW(check_config(f, tensor_core_only));
  CHECK_THROWS_WITH_AS(codegen::generate_cuda(f, tensor_core_only, codegen::Target{"sm_90a"}),
                       doctest::Contains("block 'n' = 96 sizes a tile the SIMT path holds, which takes powers of two"), Error);
}

TEST_CASE("dsl: each kernel definition has its own id, shared by its copies (the launch plans key on it)") {
  auto body = [](In x, Out y) {
    for (auto t : tile(x.dim(0), block("n"))) y.store(t, x.load(t));
  };
  std::optional<Kernel> k;
  k.emplace(kernel("copy_a", body));
  const uint64_t first = k->id();
  const Kernel copy = *k;
  CHECK(copy.id() == first);
  k.emplace(kernel("copy_a", body));   // the same name and body, made again at the same address
  CHECK(k->id() != first);
  CHECK(kernel("copy_b", body).id() != k->id());
}
