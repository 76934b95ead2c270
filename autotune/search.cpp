#include "autotune/search.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

namespace tj::autotune {

std::string_view name(Strategy s) {
  switch (s) {
    case Strategy::automatic: return "automatic";
    case Strategy::exhaustive: return "exhaustive";
    case Strategy::pattern: return "pattern";
  }
  return "?";
}

std::vector<Point> all_points(const std::vector<int>& sizes) {
  std::vector<Point> out;
  for (int s : sizes)
    if (s <= 0) return out;
  Point p(sizes.size(), 0);
  while (true) {
    out.push_back(p);
    int d = static_cast<int>(sizes.size()) - 1;
    while (d >= 0 && ++p[d] == sizes[d]) p[d--] = 0;
    if (d < 0) break;
  }
  return out;
}

namespace {

struct Memo {
  explicit Memo(const BatchCost& f) : fn(f) {}
  const BatchCost& fn;
  std::map<Point, double> cost;
  int batches = 0;

  // Evaluates the points of `pts` not seen yet (at most `limit` of them, in order).
  void eval(const std::vector<Point>& pts, int limit) {
    std::vector<Point> todo;
    std::set<Point> in_batch;
    for (const Point& p : pts) {
      if (static_cast<int>(todo.size()) >= limit) break;
      if (cost.count(p) || !in_batch.insert(p).second) continue;
      todo.push_back(p);
    }
    if (todo.empty()) return;
    std::vector<double> c = fn(todo);
    ++batches;
    for (size_t i = 0; i < todo.size(); ++i) {
      double v = i < c.size() ? c[i] : kFailed;
      cost[todo[i]] = std::isnan(v) ? kFailed : v;
    }
  }
  int evaluations() const { return static_cast<int>(cost.size()); }
  double at(const Point& p) const {
    auto it = cost.find(p);
    return it == cost.end() ? kFailed : it->second;
  }
};

bool valid(const Point& p, const std::vector<int>& sizes) {
  if (p.size() != sizes.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] < 0 || p[i] >= sizes[i]) return false;
  return true;
}

int chebyshev(const Point& a, const Point& b) {
  int d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

std::vector<Point> latin_hypercube(const std::vector<int>& sizes, int n, uint64_t seed) {
  std::vector<Point> out;
  if (n <= 0) return out;
  // Column d of the sample: a random permutation of n strata of dimension d.
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<std::vector<int>> columns;
  for (size_t d = 0; d < sizes.size(); ++d) {
    std::vector<int> perm(static_cast<size_t>(n));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> column;
    for (int i = 0; i < n; ++i) {
      double x = (perm[static_cast<size_t>(i)] + u(rng)) / n;
      column.push_back(std::min(sizes[d] - 1, static_cast<int>(x * sizes[d])));
    }
    columns.push_back(std::move(column));
  }
  for (int i = 0; i < n; ++i) {
    Point p;
    for (const auto& column : columns) p.push_back(column[static_cast<size_t>(i)]);
    out.push_back(std::move(p));
  }
  return out;
}

struct Center {
  Point p;
  double cost = kFailed;
  int step = 2;
  bool pairs = false;   // trying two-axis moves
  bool done = false;
  std::vector<Point> neighbourhood;
};

std::vector<Point> single_axis_moves(const Point& p, const std::vector<int>& sizes, int step) {
  std::vector<Point> out;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] <= 1) continue;
    for (int dir : {+1, -1}) {
      Point q = p;
      q[d] = std::clamp(p[d] + dir * step, 0, sizes[d] - 1);
      if (q[d] != p[d]) out.push_back(std::move(q));
    }
  }
  return out;
}

std::vector<Point> two_axis_moves(const Point& p, const std::vector<int>& sizes) {
  std::vector<Point> out;
  for (size_t a = 0; a < sizes.size(); ++a) {
    for (size_t b = a + 1; b < sizes.size(); ++b) {
      for (int da : {+1, -1}) {
        for (int db : {+1, -1}) {
          Point q = p;
          q[a] += da;
          q[b] += db;
          if (valid(q, sizes)) out.push_back(std::move(q));
        }
      }
    }
  }
  return out;
}

SearchResult finish(const Memo& m, Strategy s, bool stopped) {
  SearchResult r;
  r.strategy = s;
  r.evaluations = m.evaluations();
  r.batches = m.batches;
  r.stopped = stopped;
  for (const auto& [p, c] : m.cost) {
    if (c < r.best_cost) {
      r.best_cost = c;
      r.best = p;
    }
  }
  return r;
}

SearchResult exhaustive(const std::vector<int>& sizes, const BatchCost& cost) {
  Memo m(cost);
  std::vector<Point> pts = all_points(sizes);
  m.eval(pts, static_cast<int>(std::min<size_t>(pts.size(), 1u << 30)));
  return finish(m, Strategy::exhaustive, false);
}

SearchResult pattern(const std::vector<int>& sizes, const BatchCost& cost, const SearchOptions& o) {
  Memo m(cost);
  auto stop = [&] { return o.stop && o.stop(); };
  auto left = [&] { return o.max_evaluations - m.evaluations(); };

  std::vector<Point> first;
  for (const Point& p : o.seeds)
    if (valid(p, sizes)) first.push_back(p);
  for (Point& p : latin_hypercube(sizes, o.random_samples, o.seed)) first.push_back(std::move(p));
  m.eval(first, std::max(left(), 1));
  if (stop()) return finish(m, Strategy::pattern, true);

  std::vector<Point> optima;        // converged centres
  std::set<Point> used;             // points that have been centres
  auto pick = [&](int k) {
    std::vector<std::pair<double, Point>> ranked;
    for (const auto& [p, c] : m.cost)
      if (std::isfinite(c)) ranked.emplace_back(c, p);
    std::sort(ranked.begin(), ranked.end());
    std::vector<Center> out;
    for (const auto& [c, p] : ranked) {
      if (static_cast<int>(out.size()) >= k) break;
      if (used.count(p)) continue;
      bool near_optimum = false;
      for (const Point& q : optima) near_optimum |= chebyshev(p, q) <= 1;
      if (near_optimum) continue;
      bool near_pick = false;
      for (const Center& q : out) near_pick |= chebyshev(p, q.p) <= 1;
      if (near_pick) continue;
      used.insert(p);
      Center centre;
      centre.p = p;
      centre.cost = c;
      centre.step = std::max(1, o.initial_step);
      out.push_back(std::move(centre));
    }
    return out;
  };

  std::vector<Center> centres = pick(std::max(1, o.starts));
  int restarts = 0;
  while (!centres.empty() && left() > 0) {
    std::vector<Point> proposals;
    for (Center& c : centres) {
      c.neighbourhood = c.pairs ? two_axis_moves(c.p, sizes) : single_axis_moves(c.p, sizes, c.step);
      for (const Point& q : c.neighbourhood)
        if (!m.cost.count(q)) proposals.push_back(q);
    }
    m.eval(proposals, left());
    if (stop()) return finish(m, Strategy::pattern, true);

    for (Center& c : centres) {
      const Point* best = nullptr;
      double best_cost = c.cost;
      for (const Point& q : c.neighbourhood) {
        double v = m.at(q);
        if (v < best_cost) {
          best_cost = v;
          best = &q;
        }
      }
      if (best) {
        c.p = *best;
        c.cost = best_cost;
        used.insert(c.p);
        if (c.pairs) {
          c.pairs = false;
          c.step = 1;
        }
      } else if (!c.pairs && c.step > 1) {
        c.step /= 2;
      } else if (!c.pairs) {
        c.pairs = true;
      } else {
        c.done = true;
        optima.push_back(c.p);
      }
    }
    // Centres that met continue as one.
    std::vector<Center> next;
    for (Center& c : centres) {
      if (c.done) continue;
      bool dup = false;
      for (const Center& n : next) dup |= n.p == c.p;
      if (!dup) next.push_back(std::move(c));
    }
    centres = std::move(next);
    if (centres.empty() && left() > 0 && restarts < 2) {
      ++restarts;
      centres = pick(std::max(1, o.starts));
    }
  }
  return finish(m, Strategy::pattern, false);
}

}  // namespace

SearchResult search(const std::vector<int>& sizes, const BatchCost& cost, const SearchOptions& o) {
  uint64_t total = 1;
  for (int s : sizes) {
    if (s <= 0) return SearchResult{};
    total = total > (uint64_t(1) << 40) / static_cast<uint64_t>(s) ? (uint64_t(1) << 40) : total * static_cast<uint64_t>(s);
  }
  Strategy s = o.strategy;
  if (s == Strategy::automatic) s = total <= o.exhaustive_limit ? Strategy::exhaustive : Strategy::pattern;
  if (s == Strategy::exhaustive && total > (uint64_t(1) << 20)) s = Strategy::pattern;   // not enumerable
  return s == Strategy::exhaustive ? exhaustive(sizes, cost) : pattern(sizes, cost, o);
}

}  // namespace tj::autotune
