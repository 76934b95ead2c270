// A scalar index that can leave a tensor's dim (the README attention with q of 4 heads and k, v of 2:
// the head index of q used on k) is an error at the line of a load that does it (either of the two
// k loads: the compiler may issue them in either order), not zeros read there.
// EXPECT: kernel 'gqa_by_mistake': the load at .*scalar_index_past_dim.cpp:1[78]:[0-9]+ indexes dim 1 of 'k' \(size 2\) with a scalar that ranges over \[0, 3\]
#include "error_program.h"

using namespace tj;

int main() {
  return run_expecting_error([] {
    Kernel kern = kernel("gqa_by_mistake", {"q", "k", "o"}, [](In q, In k, Out o) {
      auto [B, H, S, D] = q.shape<4>();
      for (auto bh : grid(B * H)) {
        auto b = floordiv(bh, H), h = bh % H;
        for (auto m : tile(S, block("m"))) {
          Var acc = zeros({m, D}, DType::f32);
          for (auto n : tile(S, block("n")))
            acc = acc + dot(dot(q.load(b, h, m, all), k.load(b, h, n, all).T()).to(DType::bf16),
                            k.load(b, h, n, all));
          o.store(b, h, m, all, Tile(acc).to(o.dtype()));
        }
      }
    });
    const ir::Function f = kern.trace({TensorSpec{DType::bf16, {1, 4, 128, 64}}, TensorSpec{DType::bf16, {1, 2, 128, 64}},
                                       TensorSpec{DType::bf16, {1, 4, 128, 64}}});
    codegen::generate_cuda(f, Config::from_json(R"({"blocks":{"m":64,"n":64}})"), codegen::Target{});
  });
}
