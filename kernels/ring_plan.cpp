#include "kernels/ring_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "kernels/attention_variants.h"
#include "kernels/library.h"

namespace tj::kernels {

RingPlan::RingPlan(int64_t ranks_, int64_t seq_, Sharding sharding_, bool causal_, int64_t window_)
    : ranks(ranks_), seq(seq_), sharding(sharding_), causal(causal_), window(window_) {
  if (ranks < 1) throw Error(fmt::format("ring attention: {} ranks (at least 1)", ranks));
  if (window < 0 || (window > 0 && !causal))
    throw Error(fmt::format("ring attention: a window of {} keys{}: the window is causal (0 <= i - j < window) and at least 1",
                            window, causal ? "" : " without causal"));
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
  const int64_t owner = kv_owner(rank, step), L = chunk_rows();
  // Per query chunk, its diagonal pair first (step 0): it covers every row of the chunk, so that
  // the launch that writes O and the LSE (the first of each chunk) leaves none unwritten.
  for (int qc = 0; qc < chunks_per_rank(); ++qc)
    for (int i = 0; i < chunks_per_rank(); ++i) {
      const int kc = chunks_per_rank() == 2 && step == 0 ? (qc + i) % 2 : i;
      const int64_t gq = chunk_of(rank, qc), gk = chunk_of(owner, kc);
      Launch whole{qc, kc, Mode::full, 0, L, 0, L, 0};
      if (window > 0) {
        // Distances i - j over the pair: from (gq - gk) L - (L - 1) to (gq - gk) L + (L - 1).
        const int64_t delta = (gq - gk) * L, nearest = delta - (L - 1), farthest = delta + (L - 1);
        if (farthest < 0 || nearest >= window) continue;                        // no key of the pair is visible
        if (nearest >= 0 && farthest < window) {
          out.push_back(whole);
          continue;
        }
        // Query row i sees keys (i + delta - window, i + delta] of the chunk: only rows
        // [-delta, L - 1 - delta + window - 1] see any, and only keys [delta - window + 1, L - 1 + delta].
        Launch w = whole;
        w.mode = Mode::window;
        w.q_begin = std::max<int64_t>(0, -delta);
        w.q_end = std::min(L, L - 1 - delta + window);
        w.kv_begin = std::max<int64_t>(0, delta - window + 1) / 16 * 16;
        w.kv_end = std::min(L, L + delta);
        w.delta = delta + w.q_begin - w.kv_begin;
        out.push_back(w);
        continue;
      }
      if (!causal) out.push_back(whole);
      else if (gk < gq) out.push_back(whole);
      else if (gk == gq) {   // equal chunks: the diagonal is the causal mask
        whole.mode = Mode::causal;
        out.push_back(whole);
      }
    }
  return out;
}

int64_t RingPlan::steps() const {
  int64_t last = 0;
  for (int64_t s = 0; s < ranks; ++s)
    for (int64_t r = 0; r < ranks; ++r)
      if (!launches(r, s).empty()) last = s;
  return last + 1;
}

namespace {

// Entries (i, j) of rows x keys with 0 <= i + delta - j < window.
int64_t window_entries(int64_t rows, int64_t keys, int64_t delta, int64_t window) {
  int64_t n = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t hi = std::min(keys - 1, i + delta), lo = std::max<int64_t>(0, i + delta - window + 1);
    n += std::max<int64_t>(0, hi - lo + 1);
  }
  return n;
}

}  // namespace

int64_t RingPlan::work(int64_t rank) const {
  const int64_t L = chunk_rows();
  int64_t w = 0;
  for (int64_t s = 0; s < ranks; ++s)
    for (const Launch& l : launches(rank, s))
      w += l.mode == Mode::full     ? L * L
           : l.mode == Mode::causal ? L * (L + 1) / 2
                                    : window_entries(l.q_end - l.q_begin, l.kv_end - l.kv_begin, l.delta, window);
  return w;
}

const Kernel& ring_launch_kernel(const RingPlan& plan, const RingPlan::Launch& launch, bool merging) {
  if (launch.mode != RingPlan::Mode::window) return merging ? attention_fp8_merging() : attention_fp8();
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, bool>, std::unique_ptr<Kernel>> kernels;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Kernel>& k = kernels[{plan.window, launch.delta, merging}];
  if (!k) {
    AttentionVariant v = shifted_window_variant(plan.window, launch.delta);
    v.merge_into_output = merging;
    if (merging) v.name += "_merging";
    k = std::make_unique<Kernel>(attention_variant(v));
  }
  return *k;
}

std::string RingPlan::describe() const {
  return fmt::format("ring attention over {} ranks, {} rows in {} chunks of {} ({}{}{})", ranks, seq, ranks * chunks_per_rank(),
                     chunk_rows(), sharding == Sharding::zigzag ? "zigzag" : "contiguous", causal ? ", causal" : "",
                     window > 0 ? fmt::format(", window {}", window) : "");
}

}  // namespace tj::kernels
