#include "cpu/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace leanmoe::cpu {

void softmax_rows(const float* z, int64_t T, int64_t E, float* p, float* lse) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* zt = z + t * E;
    float* pt = p + t * E;
    const float zmax = *std::max_element(zt, zt + E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += (pt[e] = std::exp(zt[e] - zmax));
    for (int64_t e = 0; e < E; ++e) pt[e] /= sum;
    lse[t] = zmax + std::log(sum);
  }
}

void topk_rows(const float* z, int64_t T, int64_t E, int64_t K, int32_t* topk_experts) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* zt = z + t * E;
    int32_t* best = topk_experts + t * K;  // kept sorted by descending z
    int64_t have = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (have == K && !(zt[e] > zt[best[K - 1]])) continue;  // a tie keeps the earlier (lower) expert
      int64_t pos = have < K ? have++ : K - 1;
      while (pos > 0 && zt[e] > zt[best[pos - 1]]) {
        best[pos] = best[pos - 1];
        --pos;
      }
      best[pos] = int32_t(e);
    }
  }
}

void chosen_prob_sums(const float* p, const int32_t* topk_experts, int64_t T, int64_t E, int64_t K,
                      float* sum_chosen) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float s = 0.f;
    for (int64_t k = 0; k < K; ++k) s += p[t * E + topk_experts[t * K + k]];
    sum_chosen[t] = s;
  }
}

void mark_topk_pairs(const int32_t* topk_experts, int64_t T, int64_t E, int64_t K, int32_t* code) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    std::fill(code + t * E, code + (t + 1) * E, kNotRouted);
    for (int64_t k = 0; k < K; ++k) code[t * E + topk_experts[t * K + k]] = kChosen;
  }
}

void count_routed(const int32_t* code, int64_t T, int64_t E, int32_t* counts) {
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < E; ++e) {
    int32_t c = 0;
    for (int64_t t = 0; t < T; ++t) c += code[t * E + e] != kNotRouted;
    counts[e] = c;
  }
}

void round_tokens(const float* p, const float* sum_chosen, int64_t T, int64_t E, int64_t tile, RoundingMode mode,
                  int32_t* code, int32_t* scratch) {
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < E; ++e) {
    int64_t f = 0;
    for (int64_t t = 0; t < T; ++t) f += code[t * E + e] == kChosen;
    const int64_t r = rounded_count(f, tile, mode, T);
    if (r == f) continue;
    // Priority order: chosen pairs first (q in (0, 1] beats p - 1 in [-1, 0)), then by q or p,
    // then by lower token. Comparing (chosen, value) avoids p - 1 losing tiny p to fp32 rounding.
    auto chosen = [&](int32_t t) { return code[t * E + e] == kChosen; };
    auto value = [&](int32_t t) { return chosen(t) ? p[t * E + e] / sum_chosen[t] : p[t * E + e]; };
    auto higher = [&](int32_t a, int32_t b) {
      if (chosen(a) != chosen(b)) return chosen(a);
      const float va = value(a), vb = value(b);
      return va != vb ? va > vb : a < b;
    };
    int32_t* order = scratch + e * T;
    std::iota(order, order + T, 0);
    std::nth_element(order, order + r, order + T, higher);  // order[0..r) = the r highest
    for (int64_t i = 0; i < T; ++i) {
      const int32_t t = order[i];
      int32_t& c = code[t * E + e];
      c = i >= r ? kNotRouted : c == kChosen ? kChosen : kAdded;
    }
  }
}

int64_t build_metadata(const int32_t* code, const float* p, const float* gate_denominator, int64_t T, int64_t E,
                       int32_t* row_of_pair, const RoutingMetadata& m) {
  count_routed(code, T, E, m.expert_offsets + 1);
  m.expert_offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) m.expert_offsets[e + 1] += m.expert_offsets[e];

#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < E; ++e) {
    int32_t row = m.expert_offsets[e];
    for (int64_t t = 0; t < T; ++t) {
      const int32_t c = code[t * E + e];
      if (c == kNotRouted) {
        row_of_pair[t * E + e] = -1;
        continue;
      }
      const float pe = p[t * E + e];
      m.row_token[row] = int32_t(t);
      m.row_gate[row] = c == kChosen ? pe / gate_denominator[t] : pe;
      row_of_pair[t * E + e] = row++;
    }
  }

#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    int32_t c = 0;
    for (int64_t e = 0; e < E; ++e) c += row_of_pair[t * E + e] >= 0;
    m.token_offsets[t + 1] = c;
  }
  m.token_offsets[0] = 0;
  for (int64_t t = 0; t < T; ++t) m.token_offsets[t + 1] += m.token_offsets[t];

#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    int32_t at = m.token_offsets[t];
    for (int64_t e = 0; e < E; ++e)
      if (row_of_pair[t * E + e] >= 0) m.token_rows[at++] = row_of_pair[t * E + e];
  }
  return m.expert_offsets[E];
}

void row_experts(const int32_t* expert_offsets, int64_t E, int32_t* row_expert) {
  for (int64_t e = 0; e < E; ++e)
    std::fill(row_expert + expert_offsets[e], row_expert + expert_offsets[e + 1], int32_t(e));
}

void topk_counts(const int32_t* topk_experts, int64_t T, int64_t E, int64_t K, int32_t* counts) {
  std::fill(counts, counts + E, 0);
  for (int64_t i = 0; i < T * K; ++i) ++counts[topk_experts[i]];
}

void router_losses(const float* p, const float* lse, const int32_t* counts, int64_t T, int64_t E, int64_t K,
                   float* aux, float* zloss) {
  if (T == 0) {  // no tokens: nothing to balance, no logits (0, where a mean over no tokens is NaN)
    *aux = *zloss = 0.f;
    return;
  }
  double aux_sum = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : aux_sum)
  for (int64_t e = 0; e < E; ++e) {
    double P = 0.0;
    for (int64_t t = 0; t < T; ++t) P += p[t * E + e];
    aux_sum += double(counts[e]) / double(T * K) * (P / double(T));
  }
  double z_sum = 0.0;
  for (int64_t t = 0; t < T; ++t) z_sum += double(lse[t]) * lse[t];
  *aux = float(double(E) * aux_sum);
  *zloss = float(z_sum / double(T));
}

void router_backward(const RouterBackwardInputs& in, int64_t T, int64_t E, int64_t K, float* dz) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* pt = in.p + t * E;
    const int32_t* S = in.topk_experts + t * K;
    float* dp = dz + t * E;  // dp first, then turned into dz in place
    for (int64_t e = 0; e < E; ++e)
      dp[e] = in.c_aux * float(E) * (float(in.counts[e]) / float(T * K)) / float(T);

    // Gates: chosen p_e / D_t (D_t = sum over S_t of p when renormalised), added p_e.
    const float D = in.renormalised ? in.sum_chosen[t] : 1.f;
    float chosen_weighted = 0.f;  // sum over the token's kept chosen rows of dS * p_e
    for (int32_t i = in.token_offsets[t]; i < in.token_offsets[t + 1]; ++i) {
      const int32_t row = in.token_rows[i], e = in.row_expert[row];
      const bool chosen = std::find(S, S + K, e) != S + K;
      if (chosen) {
        dp[e] += in.dS[row] / D;
        chosen_weighted += in.dS[row] * pt[e];
      } else {
        dp[e] += in.dS[row];
      }
    }
    if (in.renormalised)
      for (int64_t k = 0; k < K; ++k) dp[S[k]] -= chosen_weighted / (D * D);

    float p_dot_dp = 0.f;
    for (int64_t e = 0; e < E; ++e) p_dot_dp += pt[e] * dp[e];
    const float z_scale = in.c_z * 2.f * in.lse[t] / float(T);
    for (int64_t e = 0; e < E; ++e) dp[e] = pt[e] * (dp[e] - p_dot_dp) + z_scale * pt[e];
  }
}

int64_t build_given_metadata(const int32_t* topk_experts, const float* weights, int64_t T, int64_t E, int64_t K,
                             int32_t* cursor, const RoutingMetadata& m, const int32_t* x_rows) {
  auto valid = [E](int32_t e) { return e >= 0 && e < E; };
  std::fill(cursor, cursor + E, 0);
  for (int64_t i = 0; i < T * K; ++i)
    if (valid(topk_experts[i])) ++cursor[topk_experts[i]];
  m.expert_offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    m.expert_offsets[e + 1] = m.expert_offsets[e] + cursor[e];
    cursor[e] = m.expert_offsets[e];
  }
  // One pass in (token, slot) order hands each expert its rows in that order.
  m.token_offsets[0] = 0;
  for (int64_t t = 0; t < T; ++t) {
    int32_t at = m.token_offsets[t];
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = topk_experts[t * K + k];
      if (!valid(e)) continue;
      const int32_t row = cursor[e]++;
      m.row_token[row] = x_rows ? x_rows[t] : int32_t(t);
      m.row_gate[row] = weights[t * K + k];
      m.token_rows[at++] = row;
    }
    m.token_offsets[t + 1] = at;
  }
  return m.expert_offsets[E];
}

void scatter_given_ds(const int32_t* topk_experts, int64_t T, int64_t E, int64_t K, const int32_t* token_offsets,
                      const int32_t* token_rows, const float* dS, DType dtype, void* d_weights) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    int32_t at = token_offsets[t];
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = topk_experts[t * K + k];
      const float v = (e >= 0 && e < E) ? dS[token_rows[at++]] : 0.f;
      if (dtype == DType::f32)
        static_cast<float*>(d_weights)[t * K + k] = v;
      else
        static_cast<bf16*>(d_weights)[t * K + k] = float_to_bf16(v);
    }
  }
}

}  // namespace leanmoe::cpu
