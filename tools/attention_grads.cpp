#include "tools/attention_grads.h"

#include <algorithm>
#include <cmath>

#include "runtime/device.h"

namespace tj::tools {

namespace {

// One head's q, k, v, dout as float64 [S, D] rows.
struct Head {
  std::vector<double> q, k, v, dout;
};
Head head_of(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& dout, int64_t S, int64_t D,
             int64_t bh) {
  const int64_t base = bh * S * D;
  Head h{std::vector<double>(S * D), std::vector<double>(S * D), std::vector<double>(S * D), std::vector<double>(S * D)};
  for (int64_t i = 0; i < S * D; ++i) {
    h.q[i] = q.at(base + i);
    h.k[i] = k.at(base + i);
    h.v[i] = v.at(base + i);
    h.dout[i] = dout.at(base + i);
  }
  return h;
}

// Row i of the softmax (P[j], zero past the causal edge) and delta_i = dout_i . o_i.
double softmax_row(const Head& h, int64_t S, int64_t D, double scale, bool causal, int64_t i, double* P) {
  const int64_t keys = causal ? i + 1 : S;
  double mx = -INFINITY;
  for (int64_t j = 0; j < keys; ++j) {
    double d = 0;
    for (int64_t x = 0; x < D; ++x) d += h.q[i * D + x] * h.k[j * D + x];
    P[j] = d * scale;
    mx = std::max(mx, P[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < keys; ++j) sum += (P[j] = std::exp(P[j] - mx));
  for (int64_t j = 0; j < S; ++j) P[j] = j < keys ? P[j] / sum : 0.0;
  double delta = 0;
  for (int64_t x = 0; x < D; ++x) {
    double o = 0;
    for (int64_t j = 0; j < keys; ++j) o += P[j] * h.v[j * D + x];
    delta += h.dout[i * D + x] * o;
  }
  return delta;
}

double dp(const Head& h, int64_t D, int64_t i, int64_t j) {
  double d = 0;
  for (int64_t x = 0; x < D; ++x) d += h.dout[i * D + x] * h.v[j * D + x];
  return d;
}

}  // namespace

SampledGrads attention_grads_f64(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& dout, int64_t S,
                                 int64_t D, bool causal, const std::vector<int64_t>& heads, const std::vector<int64_t>& rows,
                                 bool dq_only) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  SampledGrads g;
  for (int64_t bh : heads) {
    const Head h = head_of(q, k, v, dout, S, D, bh);
    // P and delta of the rows needed: the sampled ones (dq), or all of them (dk / dv).
    std::vector<int64_t> need = rows;
    if (!dq_only) {
      need.resize(S);
      for (int64_t i = 0; i < S; ++i) need[i] = i;
    }
    std::vector<double> P(need.size() * S), delta(S, 0.0);
    std::vector<int64_t> slot(S, -1);
    for (size_t n = 0; n < need.size(); ++n) {
      slot[need[n]] = static_cast<int64_t>(n);
      delta[need[n]] = softmax_row(h, S, D, scale, causal, need[n], &P[n * S]);
    }
    auto p = [&](int64_t i, int64_t j) { return P[slot[i] * S + j]; };
    for (int64_t i : rows) {   // dq_i = scale sum_j dS_ij k_j
      std::vector<double> acc(D, 0.0);
      for (int64_t j = 0; j < S; ++j)
        if (p(i, j) != 0.0) {
          const double ds = p(i, j) * (dp(h, D, i, j) - delta[i]);
          for (int64_t x = 0; x < D; ++x) acc[x] += ds * h.k[j * D + x] * scale;
        }
      g.dq.insert(g.dq.end(), acc.begin(), acc.end());
    }
    if (dq_only) continue;
    for (int64_t j : rows) {   // dv_j = sum_i P_ij do_i, dk_j = scale sum_i dS_ij q_i
      std::vector<double> dk(D, 0.0), dv(D, 0.0);
      for (int64_t i = 0; i < S; ++i)
        if (p(i, j) != 0.0) {
          const double ds = p(i, j) * (dp(h, D, i, j) - delta[i]);
          for (int64_t x = 0; x < D; ++x) {
            dv[x] += p(i, j) * h.dout[i * D + x];
            dk[x] += ds * h.q[i * D + x] * scale;
          }
        }
      g.dk.insert(g.dk.end(), dk.begin(), dk.end());
      g.dv.insert(g.dv.end(), dv.begin(), dv.end());
    }
  }
  return g;
}

std::vector<double> gather_rows(const HostTensor& t, int64_t S, int64_t D, const std::vector<int64_t>& heads,
                                const std::vector<int64_t>& rows) {
  std::vector<double> out;
  for (int64_t bh : heads)
    for (int64_t i : rows)
      for (int64_t x = 0; x < D; ++x) out.push_back(t.at((bh * S + i) * D + x));
  return out;
}

double relative_rmse(const std::vector<double>& got, const std::vector<double>& want) {
  double e = 0, r = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    e += (got[i] - want[i]) * (got[i] - want[i]);
    r += want[i] * want[i];
  }
  return std::sqrt(e / std::max(r, 1e-300));
}

MeasuredBackward measure_backward(const std::function<void()>& backward, DeviceTensor& gq, DeviceTensor& gk, DeviceTensor& gv,
                                  CUstream stream, int reps, int warmup, L2Flusher& l2) {
  for (DeviceTensor* t : {&gq, &gk, &gv}) t->fill_bytes(0xFF);
  backward();
  runtime::synchronize();
  MeasuredBackward m{gq.to_host(), gk.to_host(), gv.to_host(), {}};
  m.timing = time_launches(backward, stream, reps, warmup, l2);
  return m;
}

double GradErrors::worst() const { return std::max({dq, dk, dv}); }

GradErrors grad_errors(const HostTensor& dq, const HostTensor& dk, const HostTensor& dv, const SampledGrads& want, int64_t S,
                       int64_t D, const std::vector<int64_t>& heads, const std::vector<int64_t>& rows, bool with_kv) {
  GradErrors e;
  e.dq = relative_rmse(gather_rows(dq, S, D, heads, rows), want.dq);
  if (with_kv && !want.dk.empty()) {
    e.dk = relative_rmse(gather_rows(dk, S, D, heads, rows), want.dk);
    e.dv = relative_rmse(gather_rows(dv, S, D, heads, rows), want.dv);
  }
  return e;
}

}  // namespace tj::tools
