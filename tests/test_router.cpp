// Unit tests of the CPU routing functions (src/cpu/router.h), each on a hand-checkable case or a
// property that must hold for every input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "../src/cpu/router.h"  // internal header: tests reach it by path

namespace leanmoe::cpu {
namespace {

using std::vector;

// Everything routing produces for one set of logits, as host vectors.
struct Routed {
  int64_t T, E, K, R = 0;
  vector<float> p, lse, sum_chosen, gate_denominator;
  vector<int32_t> topk, code, row_token, expert_offsets, token_offsets, token_rows;
  vector<float> row_gate;
};

Routed route(const vector<float>& z, int64_t T, int64_t E, int64_t K, const MoEConfig& cfg) {
  Routed r{T, E, K};
  r.p.resize(T * E);
  r.lse.resize(T);
  r.sum_chosen.resize(T);
  r.gate_denominator.resize(T);
  r.topk.resize(T * K);
  r.code.resize(T * E);
  softmax_rows(z.data(), T, E, r.p.data(), r.lse.data());
  topk_rows(z.data(), T, E, K, r.topk.data());
  chosen_prob_sums(r.p.data(), r.topk.data(), T, E, K, r.sum_chosen.data());
  for (int64_t t = 0; t < T; ++t) r.gate_denominator[t] = gates_renormalised(cfg) ? r.sum_chosen[t] : 1.f;
  mark_topk_pairs(r.topk.data(), T, E, K, r.code.data());
  vector<int32_t> scratch(T * E);
  if (cfg.routing == Routing::token_rounding)
    round_tokens(r.p.data(), r.sum_chosen.data(), T, E, cfg.tile, cfg.rounding_mode, r.code.data(), scratch.data());
  const int64_t R_max = T * E;
  r.row_token.assign(R_max, -7);
  r.row_gate.assign(R_max, NAN);
  r.token_rows.assign(R_max, -7);
  r.expert_offsets.assign(E + 1, -7);
  r.token_offsets.assign(T + 1, -7);
  r.R = build_metadata(r.code.data(), r.p.data(), r.gate_denominator.data(), T, E, scratch.data(),
                       {r.row_token.data(), r.row_gate.data(), r.expert_offsets.data(), r.token_offsets.data(),
                        r.token_rows.data()});
  return r;
}

vector<float> random_logits(int64_t T, int64_t E, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, 1.5f);
  vector<float> z(T * E);
  for (float& v : z) v = dist(gen);
  return z;
}

MoEConfig config(int64_t E, int64_t K) {
  MoEConfig c;
  c.d = 8;
  c.n = 4;
  c.E = E;
  c.K = K;
  return c;
}

bool in_topk(const Routed& r, int64_t t, int64_t e) {
  const int32_t* S = r.topk.data() + t * r.K;
  return std::find(S, S + r.K, int32_t(e)) != S + r.K;
}

// Rows: sorted by expert and strictly by token inside an expert; the reverse map lists each row
// exactly once, under its own token, in ascending expert order; gates follow the pair codes.
void expect_consistent_metadata(const Routed& r) {
  ASSERT_EQ(r.expert_offsets[0], 0);
  ASSERT_EQ(r.expert_offsets[r.E], r.R);
  ASSERT_EQ(r.token_offsets[0], 0);
  ASSERT_EQ(r.token_offsets[r.T], r.R);
  vector<int32_t> expert_of_row(r.R), seen(r.R, 0);
  for (int64_t e = 0; e < r.E; ++e) {
    ASSERT_LE(r.expert_offsets[e], r.expert_offsets[e + 1]);
    for (int32_t row = r.expert_offsets[e]; row < r.expert_offsets[e + 1]; ++row) {
      expert_of_row[row] = int32_t(e);
      if (row > r.expert_offsets[e]) EXPECT_LT(r.row_token[row - 1], r.row_token[row]);
      const int32_t t = r.row_token[row];
      const int32_t c = r.code[t * r.E + e];
      ASSERT_NE(c, kNotRouted);
      const float p = r.p[t * r.E + e];
      EXPECT_FLOAT_EQ(r.row_gate[row], c == kChosen ? p / r.gate_denominator[t] : p);
    }
  }
  for (int64_t t = 0; t < r.T; ++t) {
    ASSERT_LE(r.token_offsets[t], r.token_offsets[t + 1]);
    int routed = 0;
    for (int64_t e = 0; e < r.E; ++e) routed += r.code[t * r.E + e] != kNotRouted;
    EXPECT_EQ(r.token_offsets[t + 1] - r.token_offsets[t], routed);
    for (int32_t i = r.token_offsets[t]; i < r.token_offsets[t + 1]; ++i) {
      const int32_t row = r.token_rows[i];
      ASSERT_GE(row, 0);
      ASSERT_LT(row, r.R);
      ++seen[row];
      EXPECT_EQ(r.row_token[row], t);
      if (i > r.token_offsets[t]) EXPECT_LT(expert_of_row[r.token_rows[i - 1]], expert_of_row[row]);
    }
  }
  for (int64_t row = 0; row < r.R; ++row) EXPECT_EQ(seen[row], 1) << "row " << row;
}

TEST(Router, SoftmaxAndLogsumexp) {
  const vector<float> z = {std::log(1.f), std::log(2.f), std::log(3.f), std::log(4.f)};
  vector<float> p(4), lse(1);
  softmax_rows(z.data(), 1, 4, p.data(), lse.data());
  // fp32 exp/log: a few ulps.
  for (int e = 0; e < 4; ++e) EXPECT_NEAR(p[e], 0.1f * (e + 1), 1e-6f);
  EXPECT_NEAR(lse[0], std::log(10.f), 1e-6f);
}

TEST(Router, TopKTiesGoToLowerExpert) {
  const vector<float> z = {1.f, 3.f, 3.f, 2.f, 3.f, /* token 1: all equal */ 0.f, 0.f, 0.f, 0.f, 0.f};
  vector<int32_t> top2(4), top3(6);
  topk_rows(z.data(), 2, 5, 2, top2.data());
  EXPECT_EQ(top2, (vector<int32_t>{1, 2, 0, 1}));
  topk_rows(z.data(), 2, 5, 3, top3.data());
  EXPECT_EQ(top3, (vector<int32_t>{1, 2, 4, 0, 1, 2}));
}

TEST(Router, TopKIsByDescendingScore) {
  const vector<float> z = {0.5f, -1.f, 4.f, 2.f, 3.f};
  vector<int32_t> top(5);
  topk_rows(z.data(), 1, 5, 5, top.data());
  EXPECT_EQ(top, (vector<int32_t>{2, 4, 3, 0, 1}));
}

// p = [0.1, 0.2, 0.3, 0.4]; K = 2 chooses experts 3 and 2.
TEST(Router, ConventionsOnAHandCheckableCase) {
  const vector<float> z = {std::log(1.f), std::log(2.f), std::log(3.f), std::log(4.f)};
  MoEConfig c = config(4, 2);
  auto gates = [&](const MoEConfig& cfg) {
    const Routed r = route(z, 1, 4, 2, cfg);
    EXPECT_EQ(r.R, 2);
    EXPECT_EQ(r.topk, (vector<int32_t>{3, 2}));
    expect_consistent_metadata(r);
    return vector<float>{r.row_gate[0], r.row_gate[1]};  // rows of experts 2, 3
  };
  // Tolerances: fp32 exp/log/divide, a few ulps.
  c.router = RouterConvention::topk_then_softmax;  // softmax over the 2 logits: 3/7, 4/7
  vector<float> g = gates(c);
  EXPECT_NEAR(g[0], 3.f / 7.f, 1e-6f);
  EXPECT_NEAR(g[1], 4.f / 7.f, 1e-6f);
  c.router = RouterConvention::softmax_then_topk;  // raw probabilities
  c.norm_topk_prob = false;
  g = gates(c);
  EXPECT_NEAR(g[0], 0.3f, 1e-6f);
  EXPECT_NEAR(g[1], 0.4f, 1e-6f);
  c.norm_topk_prob = true;  // renormalised to sum to 1
  g = gates(c);
  EXPECT_NEAR(g[0], 3.f / 7.f, 1e-6f);
  EXPECT_NEAR(g[1], 4.f / 7.f, 1e-6f);
}

TEST(Router, NormTopkProbGatesSumToOne) {
  const int64_t T = 50, E = 8, K = 3;
  MoEConfig c = config(E, K);
  c.norm_topk_prob = true;
  const Routed r = route(random_logits(T, E, 1), T, E, K, c);
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.f;
    for (int32_t i = r.token_offsets[t]; i < r.token_offsets[t + 1]; ++i) sum += r.row_gate[r.token_rows[i]];
    EXPECT_NEAR(sum, 1.f, 1e-6f);  // three fp32 ratios
  }
}

TEST(Router, TopKMetadata) {
  const int64_t T = 61, E = 7, K = 3;
  const Routed r = route(random_logits(T, E, 2), T, E, K, config(E, K));
  EXPECT_EQ(r.R, T * K);
  expect_consistent_metadata(r);
}

TEST(Router, RoundedCount) {
  using M = RoundingMode;
  EXPECT_EQ(rounded_count(5, 4, M::nearest, 100), 4);
  EXPECT_EQ(rounded_count(6, 4, M::nearest, 100), 8);  // a half rounds up
  EXPECT_EQ(rounded_count(7, 4, M::nearest, 100), 8);
  EXPECT_EQ(rounded_count(8, 4, M::nearest, 100), 8);
  EXPECT_EQ(rounded_count(5, 4, M::up, 100), 8);
  EXPECT_EQ(rounded_count(7, 4, M::down, 100), 4);
  EXPECT_EQ(rounded_count(4, 3, M::nearest, 100), 3);  // odd tile: 1 < 1.5 rounds down
  EXPECT_EQ(rounded_count(5, 3, M::nearest, 100), 6);  // 2 > 1.5 rounds up
  for (M m : {M::nearest, M::up, M::down}) EXPECT_EQ(rounded_count(0, 4, m, 100), 0);
  // The cap at T is a target itself: 'up' never lowers a count, an expert taking all T tokens keeps them.
  EXPECT_EQ(rounded_count(9, 4, M::up, 10), 10);  // 12 > T = 10: T
  EXPECT_EQ(rounded_count(10, 4, M::nearest, 10), 10);
  EXPECT_EQ(rounded_count(10, 4, M::down, 10), 8);
  EXPECT_EQ(rounded_count(9, 4, M::nearest, 10), 10);  // 10 is 1 away, 8 is 1 away: a tie goes up
  EXPECT_EQ(rounded_count(3, 4, M::up, 3), 3);
  // T < tile (T = 100, tile 128): the targets are 0 and T.
  EXPECT_EQ(rounded_count(5, 128, M::up, 100), 100);
  EXPECT_EQ(rounded_count(100, 128, M::up, 100), 100);
  EXPECT_EQ(rounded_count(60, 128, M::nearest, 100), 100);  // 40 from T, 60 from 0
  EXPECT_EQ(rounded_count(50, 128, M::nearest, 100), 100);  // a tie goes up
  EXPECT_EQ(rounded_count(49, 128, M::nearest, 100), 0);
  EXPECT_EQ(rounded_count(100, 128, M::nearest, 100), 100);
  EXPECT_EQ(rounded_count(99, 128, M::down, 100), 0);
  // Every mode, every count: moves by less than a tile, lands on a multiple or on T, never above T,
  // up never lowers and down never raises.
  for (int64_t T : {1, 7, 100, 128, 300})
    for (int64_t tile : {1, 4, 128})
      for (M m : {M::nearest, M::up, M::down})
        for (int64_t f = 0; f <= T; ++f) {
          const int64_t r = rounded_count(f, tile, m, T);
          ASSERT_TRUE(r % tile == 0 || r == T) << f << " " << tile << " " << T;
          ASSERT_LE(r, T);
          ASSERT_LT(std::abs(r - f), tile);
          if (m == M::up) ASSERT_GE(r, f);
          if (m == M::down) ASSERT_LE(r, f);
        }
}

// Priority of a pair as docs/SPEC.md §5 defines it: q computed in fp32 as routing does, p - 1 in double
// so that small p stay distinct.
double priority(const Routed& r, int64_t t, int64_t e) {
  const float p = r.p[t * r.E + e];
  return in_topk(r, t, e) ? double(p / r.sum_chosen[t]) : double(p) - 1.0;
}

void check_token_rounding(int64_t T, int64_t E, int64_t K, int64_t tile, RoundingMode mode, uint32_t seed) {
  SCOPED_TRACE(std::string(rounding_mode_name(mode)) + " T=" + std::to_string(T) + " tile=" + std::to_string(tile));
  MoEConfig c = config(E, K);
  c.router = RouterConvention::softmax_then_topk;
  c.norm_topk_prob = seed % 2 == 0;
  c.routing = Routing::token_rounding;
  c.tile = tile;
  c.rounding_mode = mode;
  const Routed r = route(random_logits(T, E, seed), T, E, K, c);
  expect_consistent_metadata(r);
  vector<int32_t> f(E);
  topk_counts(r.topk.data(), T, E, K, f.data());
  for (int64_t e = 0; e < E; ++e) {
    SCOPED_TRACE("expert " + std::to_string(e));
    const int64_t count = r.expert_offsets[e + 1] - r.expert_offsets[e];
    EXPECT_TRUE(count % tile == 0 || count == T) << count;
    EXPECT_LT(std::abs(count - f[e]), tile);
    EXPECT_LE(count, T);
    if (mode == RoundingMode::up) EXPECT_GE(count, f[e]);
    if (mode == RoundingMode::down) EXPECT_LE(count, f[e]);
    EXPECT_EQ(count, rounded_count(f[e], tile, mode, T));
    // Kept pairs outrank every pair left out; codes say chosen exactly for pairs of S_t.
    double weakest_kept = INFINITY, strongest_left = -INFINITY;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t code = r.code[t * E + e];
      if (code == kChosen) EXPECT_TRUE(in_topk(r, t, e));
      if (code == kAdded) EXPECT_FALSE(in_topk(r, t, e));
      if (code != kNotRouted)
        weakest_kept = std::min(weakest_kept, priority(r, t, e));
      else
        strongest_left = std::max(strongest_left, priority(r, t, e));
    }
    EXPECT_GE(weakest_kept, strongest_left);
  }
}

TEST(Router, TokenRoundingCountsAndPriorities) {
  uint32_t seed = 10;
  for (RoundingMode mode : {RoundingMode::nearest, RoundingMode::up, RoundingMode::down})
    for (int64_t tile : {1, 4, 8, 16}) {
      check_token_rounding(37, 6, 2, tile, mode, seed++);
      check_token_rounding(200, 16, 4, tile, mode, seed++);
    }
  // Fewer tokens than the tile: every target is 0 or T.
  for (RoundingMode mode : {RoundingMode::nearest, RoundingMode::up, RoundingMode::down}) {
    check_token_rounding(100, 8, 2, 128, mode, seed++);
    check_token_rounding(5, 4, 3, 128, mode, seed++);
  }
}

// Two experts, four tokens, K = 1, tile 2: expert 0 is chosen by 3 tokens, expert 1 by 1.
// nearest rounds 3 up to 4 and 1 up to 2, so each expert gains the unchosen token of highest p.
TEST(Router, TokenRoundingAddsTheMostProbableWithRawP) {
  const vector<float> z = {2.f, 0.f, 1.f, 0.f, 0.f, 1.f, 1.5f, 0.f};  // tokens 0, 1, 3 pick 0; token 2 picks 1
  MoEConfig c = config(2, 1);
  c.routing = Routing::token_rounding;  // softmax_then_topk without renormalisation: chosen gate = p
  c.tile = 2;
  const Routed r = route(z, 4, 2, 1, c);
  expect_consistent_metadata(r);
  ASSERT_EQ(r.expert_offsets, (vector<int32_t>{0, 4, 6}));
  // Expert 0 takes the only token left, token 2, with its raw p.
  EXPECT_EQ(r.code[2 * 2 + 0], kAdded);
  EXPECT_FLOAT_EQ(r.row_gate[2], r.p[2 * 2 + 0]);
  // Expert 1: of the unchosen tokens 0, 1, 3 (logit gaps -2, -1, -1.5), token 1 is the most probable.
  EXPECT_EQ(r.row_token[4], 1);
  EXPECT_EQ(r.row_token[5], 2);
  EXPECT_EQ(r.code[1 * 2 + 1], kAdded);
  EXPECT_FLOAT_EQ(r.row_gate[4], r.p[1 * 2 + 1]);
  EXPECT_FLOAT_EQ(r.row_gate[5], r.p[2 * 2 + 1]);
}

// Four tokens all choose expert 0 (K = 1), tile 3, mode down: expert 0 drops its weakest token.
TEST(Router, TokenRoundingDropsTheWeakest) {
  const vector<float> z = {3.f, 0.f, 1.f, 0.f, 2.f, 0.f, 0.5f, 0.f};
  MoEConfig c = config(2, 1);
  c.router = RouterConvention::softmax_then_topk;
  c.routing = Routing::token_rounding;
  c.tile = 3;
  c.rounding_mode = RoundingMode::down;
  const Routed r = route(z, 4, 2, 1, c);
  expect_consistent_metadata(r);
  ASSERT_EQ(r.expert_offsets, (vector<int32_t>{0, 3, 3}));
  // K = 1: every chosen q is 1, so the tie goes to the lower tokens and token 3 is dropped.
  EXPECT_EQ(r.row_token[0], 0);
  EXPECT_EQ(r.row_token[1], 1);
  EXPECT_EQ(r.row_token[2], 2);
  EXPECT_EQ(r.token_offsets, (vector<int32_t>{0, 1, 2, 3, 3}));  // token 3 ends with no expert
}

TEST(Router, SingleToken) {
  const vector<float> z = {0.3f, -0.2f, 0.9f, 0.1f};
  MoEConfig c = config(4, 2);
  Routed r = route(z, 1, 4, 2, c);
  EXPECT_EQ(r.R, 2);
  EXPECT_EQ(r.topk, (vector<int32_t>{2, 0}));
  expect_consistent_metadata(r);
  // Token rounding with T = 1 < tile: the targets are 0 and T = 1. up and nearest (an expert
  // chosen by the only token already holds T rows) keep the top-K pairs, down drops them.
  c.routing = Routing::token_rounding;
  c.tile = 4;
  for (RoundingMode m : {RoundingMode::nearest, RoundingMode::up, RoundingMode::down}) {
    c.rounding_mode = m;
    r = route(z, 1, 4, 2, c);
    EXPECT_EQ(r.R, m == RoundingMode::down ? 0 : 2) << rounding_mode_name(m);
    if (m != RoundingMode::down) EXPECT_EQ(r.topk, (vector<int32_t>{2, 0}));
    expect_consistent_metadata(r);
  }
  // tile 1 keeps exactly the top-K.
  c.tile = 1;
  r = route(z, 1, 4, 2, c);
  EXPECT_EQ(r.R, 2);
}

TEST(Router, Losses) {
  // Two tokens, E = 2, K = 1, p = [0.25, 0.75] for both: f = [0, 1], P = [0.25, 0.75].
  const float l = std::log(3.f);
  const vector<float> z = {0.f, l, 0.f, l};
  vector<float> p(4), lse(2);
  softmax_rows(z.data(), 2, 2, p.data(), lse.data());
  const vector<int32_t> counts = {0, 2};
  float aux = 0.f, zl = 0.f;
  router_losses(p.data(), lse.data(), counts.data(), 2, 2, 1, &aux, &zl);
  EXPECT_NEAR(aux, 2.f * 0.75f, 1e-6f);  // fp32 softmax, a few ulps
  EXPECT_NEAR(zl, std::log(4.f) * std::log(4.f), 1e-5f);
}

// Router backward against central differences of L(z) = sum_rows w_row * gate_row(z)
// + c_aux * aux(z) + c_z * zloss(z), with the routing (pair codes) held fixed.
TEST(Router, BackwardMatchesFiniteDifferences) {
  const int64_t T = 6, E = 5, K = 2;
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    MoEConfig c = config(E, K);
    c.router = variant == 0 ? RouterConvention::topk_then_softmax : RouterConvention::softmax_then_topk;
    c.norm_topk_prob = variant == 2;
    if (variant == 3) {  // token rounding adds and drops pairs
      c.routing = Routing::token_rounding;
      c.tile = 4;
    }
    const vector<float> z0 = random_logits(T, E, 100 + variant);
    const Routed r = route(z0, T, E, K, c);
    std::mt19937 gen(7);
    std::normal_distribution<float> dist;
    vector<float> dS(r.R);
    for (float& v : dS) v = dist(gen);
    vector<int32_t> counts(E), row_expert(r.R);
    topk_counts(r.topk.data(), T, E, K, counts.data());
    row_experts(r.expert_offsets.data(), E, row_expert.data());
    const float c_aux = 0.3f, c_z = 0.2f;

    // Loss in double from z, gates recomputed with the fixed codes.
    auto loss = [&](const vector<double>& z) {
      double L = 0.0, zsum = 0.0;
      vector<double> P(E, 0.0);
      for (int64_t t = 0; t < T; ++t) {
        double m = -INFINITY, s = 0.0;
        for (int64_t e = 0; e < E; ++e) m = std::max(m, z[t * E + e]);
        for (int64_t e = 0; e < E; ++e) s += std::exp(z[t * E + e] - m);
        auto p = [&](int64_t e) { return std::exp(z[t * E + e] - m) / s; };
        double D = 1.0;
        if (gates_renormalised(c)) {
          D = 0.0;
          for (int64_t k = 0; k < K; ++k) D += p(r.topk[t * K + k]);
        }
        for (int32_t i = r.token_offsets[t]; i < r.token_offsets[t + 1]; ++i) {
          const int32_t row = r.token_rows[i], e = row_expert[row];
          L += dS[row] * (in_topk(r, t, e) ? p(e) / D : p(e));
        }
        for (int64_t e = 0; e < E; ++e) P[e] += p(e) / T;
        const double lse = m + std::log(s);
        zsum += lse * lse / T;
      }
      double aux = 0.0;
      for (int64_t e = 0; e < E; ++e) aux += E * (double(counts[e]) / (T * K)) * P[e];
      return L + c_aux * aux + c_z * zsum;
    };

    vector<float> dz(T * E);
    const RouterBackwardInputs in{r.p.data(),         r.lse.data(),         r.sum_chosen.data(),
                                  gates_renormalised(c), r.topk.data(),      counts.data(),
                                  r.token_offsets.data(), r.token_rows.data(), row_expert.data(),
                                  dS.data(),          c_aux,                c_z};
    router_backward(in, T, E, K, dz.data());
    vector<double> z(z0.begin(), z0.end());
    for (int64_t i = 0; i < T * E; ++i) {
      const double h = 1e-5, keep = z[i];
      z[i] = keep + h;
      const double up = loss(z);
      z[i] = keep - h;
      const double down = loss(z);
      z[i] = keep;
      // fp32 backward vs double central difference: ~1e-6 absolute on O(1) gradients.
      EXPECT_NEAR(dz[i], (up - down) / (2 * h), 2e-5) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace leanmoe::cpu
