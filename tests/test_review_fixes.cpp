// Regression tests of the correctness review: each one failed before its fix.
//   - row indices are i32 (SavedState, kernels): a T whose R_max passes 2^31 - 1 must be refused,
//     not silently wrap every offset past row 2^31 - 1;
//   - max_routed_rows must not overflow int64 for a huge token-rounding tile;
//   - MoEStack and the EP layer must reject bad arguments with leanmoe::Error before touching memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ep_thread_communicator.h"
#include "leanmoe/ep.h"
#include "expect_error.h"
#include "leanmoe/leanmoe.h"
#include "leanmoe/optim.h"
#include "reference_checks.h"

using namespace leanmoe;

namespace {


MoEConfig small_config() { return leanmoe::testing::small_config(/*d=*/16, /*n=*/8, /*E=*/4, /*K=*/2); }

// T = 2^28 + 1 tokens with K = 8: R_max = 2^31 + 8 rows, one past what i32 offsets can hold.
constexpr int64_t kTooManyTokens = (int64_t(1) << 28) + 1;

MoEConfig k8_config() {
  MoEConfig c = small_config();
  c.E = 8;
  c.K = 8;
  return c;
}

}  // namespace

TEST(ReviewFixes, MaxRoutedRowsHugeTileDoesNotOverflow) {
  MoEConfig c = small_config();
  c.routing = Routing::token_rounding;
  c.rounding_mode = RoundingMode::up;
  // Any tile larger than T can add at most T rows per expert: the bound is T*E (= 32 here).
  // Before the fix E * (tile - 1) overflowed int64 and the bound came out below T*K.
  c.tile = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(max_routed_rows(c, 8), 8 * c.E);
  // Ordinary tiles keep the documented bound min(T*K + E*(tile-1), T*E).
  c.tile = 3;
  EXPECT_EQ(max_routed_rows(c, 8), 8 * c.K + c.E * 2);
}

TEST(ReviewFixes, PlanLayerRefusesRowsBeyondInt32) {
  const MoEConfig c = k8_config();
  expect_error([&] { plan_layer(c, kTooManyTokens, DType::f32, Device::cpu); },
               {"plan_layer", "argument 'T'", "2^31 - 1"});
  // The largest T that fits is accepted (only sizes are computed, nothing is allocated).
  EXPECT_NO_THROW(plan_layer(c, (int64_t(1) << 28) - 1, DType::f32, Device::cpu));
}

TEST(ReviewFixes, MakeSavedStateChecksTokens) {
  const MoEConfig c = small_config();
  std::vector<char> buffer(1 << 16);
  expect_error([&] { make_saved_state(c, -1, DType::f32, Device::cpu, buffer.data(), buffer.size()); },
               {"make_saved_state", "argument 'T'", "must be >= 0"});
  EXPECT_NO_THROW(make_saved_state(c, 0, DType::f32, Device::cpu, buffer.data(), buffer.size()));  // no tokens
  expect_error([&] { make_saved_state(k8_config(), kTooManyTokens, DType::f32, Device::cpu, buffer.data(),
                                      buffer.size()); },
               {"make_saved_state", "argument 'T'", "2^31 - 1"});
}

TEST(ReviewFixes, ForwardRefusesRowsBeyondInt32) {
  // Validation never reads the data, so one float stands behind every tensor of the huge shape.
  const MoEConfig c = k8_config();
  float dummy[4] = {};
  const Tensor x = Tensor::contiguous(dummy, DType::f32, Device::cpu, {kTooManyTokens, c.d});
  const MoEWeights w{Tensor::contiguous(dummy, DType::f32, Device::cpu, {c.E, c.d}),
                     Tensor::contiguous(dummy, DType::f32, Device::cpu, {c.E, 2 * c.n, c.d}),
                     Tensor::contiguous(dummy, DType::f32, Device::cpu, {c.E, c.d, c.n})};
  SavedState saved;
  expect_error([&] { forward(c, x, w, x, Tensor(), saved, Workspace{}); },
               {"leanmoe::forward", "argument 'T'", "2^31 - 1"});
}

TEST(ReviewFixes, ExpertCountMustFitInt32) {
  MoEConfig c = small_config();
  c.E = int64_t(1) << 31;  // expert ids are stored in i32 topk_experts
  c.K = 1;
  expect_error([&] { plan_layer(c, 8, DType::f32, Device::cpu); }, {"plan_layer", "argument 'cfg'", "cfg.E"});
}

TEST(ReviewFixes, MoEStackValidatesConfigBeforeAllocating) {
  MoEConfig c = small_config();
  c.E = -1;  // used to size the router buffer (E*d) first: std::length_error, not leanmoe::Error
  expect_error([&] { optim::MoEStack({c}, 8, DType::f32, Device::cpu, optim::StackOptions{}, 1); },
               {"MoEStack", "argument 'cfg'", "cfg.E must be > 0"});
  expect_error([&] { optim::MoEStack({small_config()}, -1, DType::f32, Device::cpu, optim::StackOptions{}, 1); },
               {"MoEStack", "argument 'T'"});
}

TEST(ReviewFixes, EpLayerRefusesNullData) {
  const MoEConfig c = small_config();
  leanmoe::testing::run_ranks(1, [&](leanmoe::testing::ThreadCommunicator& comm) {
    ep::ExpertParallelLayer layer(c, comm);
    std::vector<float> xv(size_t(8 * c.d), 0.5f), rv(size_t(c.E * c.d), 0.1f), w1(size_t(c.E * 2 * c.n * c.d), 0.1f),
        w2(size_t(c.E * c.d * c.n), 0.1f), ov(size_t(8 * c.d));
    const MoEWeights w{Tensor::contiguous(rv.data(), DType::f32, Device::cpu, {c.E, c.d}),
                       Tensor::contiguous(w1.data(), DType::f32, Device::cpu, {c.E, 2 * c.n, c.d}),
                       Tensor::contiguous(w2.data(), DType::f32, Device::cpu, {c.E, c.d, c.n})};
    const Tensor x = Tensor::contiguous(xv.data(), DType::f32, Device::cpu, {8, c.d});
    const Tensor null_out = Tensor::contiguous(nullptr, DType::f32, Device::cpu, {8, c.d});
    expect_error([&] { layer.forward(x, w, null_out); }, {"ep forward", "argument 'out'", "null data pointer"});
  });
}

TEST(ReviewFixes, DescribeOfInvalidNdimStaysInBounds) {
  // A hand-built view with ndim past kMaxDims: the error message must not read shape[4..].
  float dummy = 0.f;
  Tensor bad;
  bad.data = &dummy;
  bad.ndim = 100;
  EXPECT_EQ(bad.describe(), "a tensor with invalid ndim = 100");
  EXPECT_EQ(bad.numel(), 0);
  EXPECT_FALSE(bad.is_contiguous());
  const MoEConfig c = small_config();
  LayerMemory mem(c, 8, DType::f32, Device::cpu);
  const MoEWeights w{};
  expect_error([&] { forward(c, bad, w, bad, Tensor(), mem.saved(), mem.forward_workspace()); },
               {"leanmoe::forward", "argument 'x'", "invalid ndim = 100"});
}
