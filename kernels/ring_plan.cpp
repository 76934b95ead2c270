#include "kernels/ring_plan.h"

#include <fmt/format.h>

#include "core/error.h"

namespace tj::kernels {

RingPlan::RingPlan(int64_t ranks_, int64_t seq_, Sharding sharding_, bool causal_)
    : ranks(ranks_), seq(seq_), sharding(sharding_), causal(causal_) {
  if (ranks < 1) throw Error(fmt::format("ring attention: {} ranks (at least 1)", ranks));
  const int64_t chunks = ranks * chunks_per_rank();
  if (seq < chunks || seq % chunks != 0)
    throw Error(fmt::format("ring attention: a sequence of {} rows does not split into {} equal chunks ({} ranks{}): pad it "
                            "to a multiple of {}",
                            seq, chunks, ranks, sharding == Sharding::zigzag ? ", zigzag: two chunks each" : "", chunks));
}

int64_t RingPlan::chunk_of(int64_t rank, int c) const {
  return sharding == Sharding::zigzag ? (c == 0 ? rank : 2 * ranks - 1 - rank) : rank;
}

int64_t RingPlan::global_row(int64_t rank, int64_t i) const {
  const int64_t L = chunk_rows();
  return chunk_of(rank, static_cast<int>(i / L)) * L + i % L;
}

int64_t RingPlan::kv_owner(int64_t rank, int64_t step) const { return ((rank - step) % ranks + ranks) % ranks; }

std::vector<RingPlan::Launch> RingPlan::launches(int64_t rank, int64_t step) const {
  std::vector<Launch> out;
  const int64_t owner = kv_owner(rank, step);
  for (int qc = 0; qc < chunks_per_rank(); ++qc)
    for (int kc = 0; kc < chunks_per_rank(); ++kc) {
      const int64_t gq = chunk_of(rank, qc), gk = chunk_of(owner, kc);
      if (!causal) out.push_back({qc, kc, Mode::full});
      else if (gk < gq) out.push_back({qc, kc, Mode::full});
      else if (gk == gq) out.push_back({qc, kc, Mode::causal});   // equal chunks: the diagonal is the causal mask
    }
  return out;
}

int64_t RingPlan::work(int64_t rank) const {
  const int64_t L = chunk_rows();
  int64_t w = 0;
  for (int64_t s = 0; s < ranks; ++s)
    for (const Launch& l : launches(rank, s)) w += l.mode == Mode::full ? L * L : L * (L + 1) / 2;
  return w;
}

std::string RingPlan::describe() const {
  return fmt::format("ring attention over {} ranks, {} rows in {} chunks of {} ({}{})", ranks, seq, ranks * chunks_per_rank(),
                     chunk_rows(), sharding == Sharding::zigzag ? "zigzag" : "contiguous", causal ? ", causal" : "");
}

}  // namespace tj::kernels
