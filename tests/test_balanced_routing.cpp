// The balanced routing of `leanmoe bench --routing balanced` (tools/balanced_routing.h): K distinct
// experts per token, exactly T*K/E rows per expert, deterministic in the seed, random sets of tokens
// per expert; the rule it needs, named when a shape breaks it. (The CLI's refusal and a CPU run of
// the layer under it are ctest's leanmoe_bench_balanced_* tests.)
// Also the contiguous routing of `leanmoe_bench_gemms --routing contiguous`.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "../tools/balanced_routing.h"  // a tool's header: tests reach it by path
#include "expect_error.h"

using namespace leanmoe;

namespace {

void expect_balanced(int64_t T, int64_t E, int64_t K, uint64_t seed) {
  SCOPED_TRACE("T " + std::to_string(T) + " E " + std::to_string(E) + " K " + std::to_string(K));
  const std::vector<int32_t> ids = tools::balanced_routing(T, E, K, seed);
  ASSERT_EQ(int64_t(ids.size()), T * K);
  std::vector<int64_t> rows(size_t(E), 0);
  for (int64_t t = 0; t < T; ++t) {
    std::set<int32_t> experts;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = ids[size_t(t * K + k)];
      ASSERT_GE(e, 0);
      ASSERT_LT(e, E);
      experts.insert(e);
      ++rows[size_t(e)];
    }
    ASSERT_EQ(int64_t(experts.size()), K) << "token " << t << " lists an expert twice";
  }
  for (int64_t e = 0; e < E; ++e) EXPECT_EQ(rows[size_t(e)], T * K / E) << "expert " << e;
}

}  // namespace

TEST(BalancedRouting, DistinctExpertsAndEqualRows) {
  expect_balanced(8192, 256, 8, 40);  // sparse-T8k: 256 rows per expert
  expect_balanced(1024, 64, 8, 1);
  expect_balanced(96, 12, 3, 2);  // E/K = 4, T*K/E = 24
  expect_balanced(5, 5, 5, 3);    // K = E: every token takes every expert
  expect_balanced(7, 1, 1, 4);
}

TEST(BalancedRouting, DeterministicInSeedAndNotAStride) {
  const int64_t T = 4096, E = 64, K = 4;
  EXPECT_EQ(tools::balanced_routing(T, E, K, 7), tools::balanced_routing(T, E, K, 7));
  EXPECT_NE(tools::balanced_routing(T, E, K, 7), tools::balanced_routing(T, E, K, 8));
  // Each expert's tokens are a shuffled set, not every (E/K)-th token: the gaps between an expert's
  // consecutive tokens vary.
  const std::vector<int32_t> ids = tools::balanced_routing(T, E, K, 7);
  std::set<int64_t> gaps;
  int64_t last = -1;
  for (int64_t t = 0; t < T; ++t)
    if (std::find(ids.begin() + t * K, ids.begin() + (t + 1) * K, 0) != ids.begin() + (t + 1) * K)
      gaps.insert(t - last), last = t;
  EXPECT_GT(gaps.size(), 5u);
}

TEST(BalancedRouting, RuleNamesWhatTheShapeBreaks) {
  EXPECT_EQ(tools::balanced_routing_rule(8192, 256, 8, 128), "");
  EXPECT_EQ(tools::balanced_routing_rule(32768, 512, 8, 128), "");
  const std::string tiles = tools::balanced_routing_rule(8000, 256, 8, 128);  // 250 rows per expert
  EXPECT_NE(tiles.find("T*K = 64000 must be a multiple of E*tile = 32768"), std::string::npos) << tiles;
  const std::string classes = tools::balanced_routing_rule(4096, 64, 6, 128);
  EXPECT_NE(classes.find("E = 64 must be a multiple of K = 6"), std::string::npos) << classes;
  EXPECT_NE(tools::balanced_routing_rule(4096, 4, 8, 1), "");  // K > E
  expect_error([] { tools::balanced_routing(100, 64, 6, 0); }, {"E = 64", "multiple of K = 6"});
  expect_error([] { tools::balanced_routing(10, 64, 8, 0); }, {"T*K = 80", "a multiple of E"});
}

// leanmoe_bench_gemms --routing contiguous: K distinct experts per token, every token routed K times,
// each expert's tokens ascending in K runs of consecutive tokens (T*K/E rows where E divides T; T not
// a multiple of E leaves the runs one token longer or shorter); E not a multiple of K is named.
TEST(ContiguousRouting, RunsOfConsecutiveTokens) {
  for (const auto& [T, E, K] : {std::tuple<int64_t, int64_t, int64_t>{1024, 64, 8}, {32768, 64, 4}, {100, 8, 2}}) {
    SCOPED_TRACE("T " + std::to_string(T) + " E " + std::to_string(E) + " K " + std::to_string(K));
    const auto tokens_of = tools::contiguous_topk_tokens(T, E, K);
    ASSERT_EQ(int64_t(tokens_of.size()), E);
    std::vector<std::set<int32_t>> experts_of(static_cast<size_t>(T));
    for (int64_t e = 0; e < E; ++e) {
      const auto& rows = tokens_of[size_t(e)];
      if (T % E == 0) EXPECT_EQ(int64_t(rows.size()), T * K / E) << "expert " << e;
      EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end())) << "expert " << e;
      int64_t runs = 0;
      for (size_t i = 0; i < rows.size(); ++i) {
        runs += i == 0 || rows[i] != rows[i - 1] + 1;
        experts_of[size_t(rows[i])].insert(int32_t(e));
      }
      EXPECT_LE(runs, K) << "expert " << e;
    }
    for (int64_t t = 0; t < T; ++t) ASSERT_EQ(int64_t(experts_of[size_t(t)].size()), K) << "token " << t;
  }
  expect_error([] { tools::contiguous_topk_tokens(64, 6, 4); }, {"contiguous routing", "E = 6", "multiple of K = 4"});
}
