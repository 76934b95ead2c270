// kernels/ring_plan.h: the host arithmetic of ring attention (sharding, the ring's steps, each
// step's launches), and the plan run on the CPU reference executor with the library's merging
// attention kernel (every rank's launches over the ring, merged by their logsumexp) against
// float64 attention over the whole sequence.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attention_accuracy.h"
#include "backward_testing.h"
#include "core/error.h"
#include "kernels/attention_backward.h"
#include "kernels/library.h"
#include "kernels/ring_plan.h"
#include "runtime/owned_tensor.h"

using namespace tj;
using kernels::RingPlan;

namespace {

std::string error_of(int64_t ranks, int64_t seq, RingPlan::Sharding s) {
  try {
    RingPlan p(ranks, seq, s, true);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Rows [row0, row0 + rows) of a [1, H, S, D] (or [1, H, S]) host tensor, as a view (no copy).
TensorView rows_of(const HostTensor& t, int64_t row0, int64_t rows) { return slice_of(t.view(), 2, row0, rows); }

// float64 attention of [H, S, D] inputs over the whole sequence (causal by global positions).
std::vector<double> full_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v, bool causal, int64_t window = 0) {
  const int64_t H = q.shape()[1], S = q.shape()[2], D = q.shape()[3];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> o(H * S * D, 0.0);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < S; ++i) {
      std::vector<double> p(S, 0.0);
      double mx = -INFINITY, sum = 0;
      const int64_t last = causal ? i : S - 1, first = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
      for (int64_t j = 0; j < first; ++j) p[j] = -INFINITY;
      for (int64_t j = first; j <= last; ++j) {
        double d = 0;
        for (int64_t x = 0; x < D; ++x) d += q.at((h * S + i) * D + x) * k.at((h * S + j) * D + x);
        p[j] = d * scale;
        mx = std::max(mx, p[j]);
      }
      for (int64_t j = 0; j <= last; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (int64_t x = 0; x < D; ++x) {
        double acc = 0;
        for (int64_t j = 0; j <= last; ++j) acc += p[j] * v.at((h * S + j) * D + x);
        o[(h * S + i) * D + x] = acc / sum;
      }
    }
  return o;
}

}  // namespace

TEST_CASE("ring plan: a sequence that does not split into equal chunks is an error that says how to pad it") {
  CHECK(error_of(3, 100, RingPlan::Sharding::zigzag) ==
        "ring attention: a sequence of 100 rows does not split into 6 equal chunks (3 ranks, zigzag: two chunks each): pad it to a "
        "multiple of 6");
  CHECK(error_of(4, 2, RingPlan::Sharding::contiguous).find("does not split into 4 equal chunks") != std::string::npos);
  CHECK(error_of(0, 64, RingPlan::Sharding::contiguous) == "ring attention: 0 ranks (at least 1)");
}

TEST_CASE("ring plan: every row on one rank, every shard at every rank once, zigzag balances causal work") {
  for (auto sharding : {RingPlan::Sharding::contiguous, RingPlan::Sharding::zigzag})
    for (int64_t P : {1, 2, 3, 4, 8}) {
      CAPTURE(P);
      CAPTURE(sharding == RingPlan::Sharding::zigzag);
      const RingPlan plan(P, 48 * P, sharding, true);
      const int64_t per_rank = plan.seq / P;
      std::set<int64_t> rows;
      for (int64_t r = 0; r < P; ++r) {
        for (int64_t i = 0; i < per_rank; ++i) rows.insert(plan.global_row(r, i));
        std::set<int64_t> owners;
        for (int64_t s = 0; s < P; ++s) owners.insert(plan.kv_owner(r, s));
        CHECK(owners.size() == static_cast<size_t>(P));
        CHECK(plan.kv_owner(r, 0) == r);
        // the shard rank r holds at step s + 1 is the one rank r - 1 held at step s (passed on)
        for (int64_t s = 0; s + 1 < P; ++s) CHECK(plan.kv_owner(r, s + 1) == plan.kv_owner((r + P - 1) % P, s));
      }
      CHECK(rows.size() == static_cast<size_t>(plan.seq));
      CHECK(*rows.rbegin() == plan.seq - 1);
      // The causal work: S (S + 1) / 2 entries over all ranks; zigzag gives each rank as much.
      int64_t total = 0, lo = INT64_MAX, hi = 0;
      for (int64_t r = 0; r < P; ++r) {
        total += plan.work(r);
        lo = std::min(lo, plan.work(r));
        hi = std::max(hi, plan.work(r));
      }
      const int64_t L = plan.chunk_rows(), C = plan.seq / L;
      CHECK(total == C * (C - 1) / 2 * L * L + C * L * (L + 1) / 2);
      if (sharding == RingPlan::Sharding::zigzag) CHECK(lo == hi);
      else if (P > 1) CHECK(hi > lo);
    }
}

TEST_CASE("ring plan: a sliding window skips the chunk pairs it rules out, and the ring stops after its last step") {
  CHECK(error_of(2, 64, RingPlan::Sharding::contiguous).empty());
  try {
    RingPlan p(2, 64, RingPlan::Sharding::contiguous, false, 16);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "ring attention: a window of 16 keys without causal: the window is causal (0 <= i - j < window) and at least 1");
  }
  CHECK_THROWS_AS(RingPlan(2, 64, RingPlan::Sharding::contiguous, true, -1), Error);
  // 8 ranks of 1024 rows: a window of 1024 (or 1025) reaches one chunk back (2 steps), 1026 two (3 steps).
  const RingPlan one(8, 8192, RingPlan::Sharding::contiguous, true, 1024), two(8, 8192, RingPlan::Sharding::contiguous, true, 1026);
  CHECK(one.steps() == 2);
  CHECK(two.steps() == 3);
  CHECK(RingPlan(8, 8192, RingPlan::Sharding::contiguous, true).steps() == 8);
  for (int64_t r = 1; r < 8; ++r) {
    const auto step0 = one.launches(r, 0), step1 = one.launches(r, 1);
    REQUIRE(step0.size() == 1);
    CHECK(step0[0].mode == RingPlan::Mode::window);
    CHECK(step0[0].delta == 0);
    REQUIRE(step1.size() == 1);
    CHECK(step1[0].mode == RingPlan::Mode::window);
    // rows [0, 1023) of the chunk reach keys [1, 1024) of the one before (from key 0: rounded down to 16)
    CHECK(step1[0].q_begin == 0);
    CHECK(step1[0].q_end == 1023);
    CHECK(step1[0].kv_begin == 0);   // key 1 rounded down to 16
    CHECK(step1[0].kv_end == 1024);
    CHECK(step1[0].delta == 1024);
    CHECK(one.launches(r, 2).empty());
    // Every row sees min(i + 1, 1024) keys.
    CHECK(one.work(r) == 1024 * 1024);
  }
  CHECK(one.work(0) == 1024 * 1025 / 2);
  CHECK(one.launches(0, 1).empty());   // rank 0's left neighbour is the sequence's end
  // A window wider than two chunks: the pair one chunk back is wholly inside (full).
  const RingPlan wide(4, 256, RingPlan::Sharding::contiguous, true, 200);
  CHECK(wide.launches(2, 1).at(0).mode == RingPlan::Mode::full);
  CHECK(wide.launches(3, 3).at(0).mode == RingPlan::Mode::window);
  // zigzag: each query chunk's diagonal comes first at step 0 (it writes O for all the chunk's rows)
  const RingPlan zz(2, 256, RingPlan::Sharding::zigzag, true, 40);
  for (int64_t r = 0; r < 2; ++r) {
    std::set<int> seen;
    for (const RingPlan::Launch& l : zz.launches(r, 0))
      if (seen.insert(l.q_chunk).second) {
        CHECK(l.kv_chunk == l.q_chunk);
        CHECK(l.q_end - l.q_begin == zz.chunk_rows());
      }
  }
  CHECK(wide.describe() == "ring attention over 4 ranks, 256 rows in 4 chunks of 64 (contiguous, causal, window 200)");
}

TEST_CASE("ring plan on the CPU reference: each rank's launches over the ring, merged by their LSE, are attention over the "
          "whole sequence (bf16, causal and not, sliding windows, zigzag and contiguous)") {
  std::mt19937 rng(44);
  const int64_t H = 2, D = 64, S = 96;
  const HostTensor q = tj_test::randn(DType::bf16, {1, H, S, D}, rng), k = tj_test::randn(DType::bf16, {1, H, S, D}, rng),
                   v = tj_test::randn(DType::bf16, {1, H, S, D}, rng);
  const HostTensor ones = HostTensor::from_values({1.0, 1.0}, DType::f32, {1, H});
  Config cfg;
  cfg.blocks = {{"m", 64}, {"n", 64}};
  const std::pair<bool, int64_t> masks[] = {{false, 0}, {true, 0}, {true, 20}, {true, 40}};
  for (auto [causal, window] : masks) {
    const std::vector<double> want = full_attention(q, k, v, causal, window);
    for (auto sharding : {RingPlan::Sharding::contiguous, RingPlan::Sharding::zigzag})
      for (int64_t P : {2, 3, 4}) {
        const RingPlan plan(P, S, sharding, causal, window);
        CAPTURE(plan.describe());
        const int64_t L = plan.chunk_rows(), rows = S / P;
        // Each rank's q / k / v shards (its chunks' rows, one after another), its o and LSE (-inf:
        // nothing merged yet).
        auto shard = [&](const HostTensor& t, int64_t r) {
          HostTensor s(DType::bf16, {1, H, rows, D});
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < rows; ++i)
              for (int64_t x = 0; x < D; ++x) s.set((h * rows + i) * D + x, t.at((h * S + plan.global_row(r, i)) * D + x));
          return s;
        };
        std::vector<HostTensor> qs, ks, vs, os, lses;
        for (int64_t r = 0; r < P; ++r) {
          qs.push_back(shard(q, r));
          ks.push_back(shard(k, r));
          vs.push_back(shard(v, r));
          os.emplace_back(DType::bf16, std::vector<int64_t>{1, H, rows, D});
          os.back().fill_bytes(0xFF);
          lses.push_back(HostTensor::from_values(std::vector<double>(H * rows, -INFINITY), DType::f32, {1, H, rows}));
        }
        for (int64_t s = 0; s < plan.steps(); ++s)
          for (int64_t r = 0; r < P; ++r) {
            const int64_t owner = plan.kv_owner(r, s);
            for (const RingPlan::Launch& l : plan.launches(r, s))
              tj_test::run_ref(kernels::ring_launch_kernel(plan, l, /*merging=*/true),
                               {rows_of(qs[r], l.q_chunk * L + l.q_begin, l.q_end - l.q_begin),
                                rows_of(ks[owner], l.kv_chunk * L + l.kv_begin, l.kv_end - l.kv_begin),
                                rows_of(vs[owner], l.kv_chunk * L + l.kv_begin, l.kv_end - l.kv_begin), ones.view(), ones.view(),
                                ones.view(), rows_of(os[r], l.q_chunk * L + l.q_begin, l.q_end - l.q_begin),
                                rows_of(lses[r], l.q_chunk * L + l.q_begin, l.q_end - l.q_begin),
                                1.4426950408889634 / std::sqrt(static_cast<double>(D)), 1.0, l.mode == RingPlan::Mode::causal,
                                true},
                               cfg);
          }
        std::vector<double> got(H * S * D);
        for (int64_t r = 0; r < P; ++r)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < rows; ++i)
              for (int64_t x = 0; x < D; ++x) got[(h * S + plan.global_row(r, i)) * D + x] = os[r].at((h * rows + i) * D + x);
        const tj_test::Metrics m = tj_test::compare(got, want);
        MESSAGE(plan.describe(), ": merged ring vs float64: ", tj_test::str(m));
        CHECK(m.nan == 0);
        CHECK(m.rel_rmse <= 1e-2);
      }
  }
}

TEST_CASE("ring backward on the CPU reference: each rank's steps (dQ summed in place, dK / dV travelling with their shard "
          "back to its owner) give float64 gradients (bf16, causal and not, a sliding window, zigzag and contiguous, grouped-query "
          "heads)") {
  std::mt19937 rng(45);
  const int64_t H = 2, D = 32, S = 96;
  const double scale_nat = 1.0 / std::sqrt(static_cast<double>(D));
  const std::vector<int64_t> shape = {1, H, S, D};
  for (int64_t Hkv : {H, int64_t{1}})
  for (int64_t window : {int64_t{-1}, int64_t{0}, int64_t{40}}) {   // -1: not causal; 0: causal
    const bool causal = window >= 0;
    const std::vector<int64_t> kv_shape = {1, Hkv, S, D};
    const HostTensor q = tj_test::randn(DType::bf16, shape, rng), k = tj_test::randn(DType::bf16, kv_shape, rng),
                     v = tj_test::randn(DType::bf16, kv_shape, rng), dout = tj_test::randn(DType::bf16, shape, rng);
    CAPTURE(Hkv);
    tj_test::ScoreMeaning meaning;
    if (causal) meaning.keep = [window](int64_t i, int64_t j) { return j <= i && (window == 0 || i - j < window); };
    std::vector<double> o64, lse_nat;
    tj_test::Grads want;
    tj_test::reference_attention(q, k, v, dout, meaning, scale_nat, o64, lse_nat, want);
    const HostTensor o = HostTensor::from_values(o64, DType::bf16, shape);
    const HostTensor lse = HostTensor::from_values(lse_nat, DType::f32, {1, H, S});
    for (auto sharding : {RingPlan::Sharding::contiguous, RingPlan::Sharding::zigzag})
      for (int64_t P : {2, 3}) {
        const RingPlan plan(P, S, sharding, causal, std::max<int64_t>(window, 0));
        CAPTURE(plan.describe());
        const int64_t n = S / P, L = plan.chunk_rows();
        // A rank's rows of a [1, heads, S, X] tensor (X = D, or none for the LSE), one after another.
        auto shard = [&](const HostTensor& t, int64_t r) {
          const bool rows_only = t.shape().size() == 3;
          const int64_t X = rows_only ? 1 : D, heads = t.shape()[1];
          HostTensor s(t.dtype(), rows_only ? std::vector<int64_t>{1, heads, n} : std::vector<int64_t>{1, heads, n, D});
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < n; ++i)
              for (int64_t x = 0; x < X; ++x) s.set((h * n + i) * X + x, t.at((h * S + plan.global_row(r, i)) * X + x));
          return s;
        };
        auto zeros = [&](std::vector<int64_t> sh) {
          HostTensor z(DType::f32, sh);
          for (int64_t i = 0; i < z.numel(); ++i) z.set(i, 0.0);
          return z;
        };
        struct Held {
          HostTensor k, v, dk, dv;
        };
        std::vector<HostTensor> qs, dos, delta, lse2, dq;
        std::vector<Held> held;
        for (int64_t r = 0; r < P; ++r) {
          qs.push_back(shard(q, r));
          dos.push_back(shard(dout, r));
          delta.emplace_back(DType::f32, std::vector<int64_t>{1, H, n});
          lse2.emplace_back(DType::f32, std::vector<int64_t>{1, H, n});
          const HostTensor os = shard(o, r), ls = shard(lse, r);
          tj_test::run_launches({{&kernels::attention_bwd_prepare(), {os.view(), dos[r].view(), ls.view(), delta[r].view(), lse2[r].view()}}});
          dq.push_back(zeros({1, H, n, D}));
          held.push_back({shard(k, r), shard(v, r), zeros({1, Hkv, n, D}), zeros({1, Hkv, n, D})});
        }
        HostTensor dk_part(DType::f32, {1, H, L, D}), dv_part(DType::f32, {1, H, L, D}), dq_part(DType::f32, {1, H, L, D});
        for (int64_t s = 0; s < P; ++s) {
          for (int64_t r = 0; r < P; ++r) {
            kernels::RingBackwardViews views{qs[r].view(),     dos[r].view(),     lse2[r].view(),   delta[r].view(),
                                             dq[r].view(),     held[r].k.view(),  held[r].v.view(), held[r].dk.view(),
                                             held[r].dv.view(), dk_part.view(),   dv_part.view(),
                                             scale_nat / std::log(2.0), dq_part.view()};
            tj_test::run_launches(kernels::ring_backward_step_launches(plan, r, s, views));
          }
          // Each shard with its gradients moves on to the next rank (after the last step: home).
          std::rotate(held.rbegin(), held.rbegin() + 1, held.rend());
        }
        std::vector<double> got_dq(H * S * D), got_dk(Hkv * S * D), got_dv(Hkv * S * D);
        for (int64_t r = 0; r < P; ++r)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < n; ++i)
              for (int64_t x = 0; x < D; ++x) {
                const int64_t at = (h * S + plan.global_row(r, i)) * D + x, mine = (h * n + i) * D + x;
                got_dq[at] = dq[r].at(mine);
                if (h >= Hkv) continue;
                got_dk[at] = held[r].dk.at(mine);
                got_dv[at] = held[r].dv.at(mine);
              }
        const tj_test::Metrics mq = tj_test::compare(got_dq, want.dq), mk = tj_test::compare(got_dk, want.dk),
                               mv = tj_test::compare(got_dv, want.dv);
        MESSAGE(plan.describe(), ": dq ", tj_test::str(mq), "; dk ", tj_test::str(mk), "; dv ", tj_test::str(mv));
        CHECK(mq.rel_rmse < 2e-2);
        CHECK(mk.rel_rmse < 2e-2);
        CHECK(mv.rel_rmse < 2e-2);
      }
  }
  HostTensor part(DType::f32, {1, 2, 32, 32});
  kernels::RingBackwardViews no_dq_part;
  no_dq_part.dk_part = part.view();
  CHECK_THROWS_WITH_AS(kernels::ring_backward_step_launches(RingPlan(2, 64, RingPlan::Sharding::contiguous, true, 16), 0, 0, no_dq_part),
                       "ring attention backward: a sliding window needs the dq_part scratch, f32 like dk_part (f32[1, 2, 32, 32] "
                       "(host)), got none (ring attention over 2 ranks, 64 rows in 2 chunks of 32 (contiguous, causal, window 16))",
                       Error);
}
