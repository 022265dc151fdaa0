// The CPU backend against the naive reference on random inputs: output, aux/z losses, every
// gradient and the routing counts, over both router conventions, norm_topk_prob, top-K and token
// rounding (all modes, with a tile small enough that rounding moves counts), fp32 and bf16.
#include "reference_checks.h"

using namespace leanmoe;
using namespace leanmoe::testing;

namespace {

struct Variant {
  RouterConvention router;
  bool norm;
  Routing routing;
  RoundingMode mode;
  int64_t tile;
};

const Variant kVariants[] = {
    {RouterConvention::topk_then_softmax, false, Routing::topk, RoundingMode::nearest, 128},
    {RouterConvention::softmax_then_topk, false, Routing::topk, RoundingMode::nearest, 128},
    {RouterConvention::softmax_then_topk, true, Routing::topk, RoundingMode::nearest, 128},
    {RouterConvention::topk_then_softmax, false, Routing::token_rounding, RoundingMode::nearest, 8},
    {RouterConvention::softmax_then_topk, true, Routing::token_rounding, RoundingMode::up, 8},
    {RouterConvention::softmax_then_topk, false, Routing::token_rounding, RoundingMode::down, 16},
    {RouterConvention::topk_then_softmax, false, Routing::token_rounding, RoundingMode::up, 16},
};

MoEConfig variant_config(const Variant& v) {
  MoEConfig c = small_config(/*d=*/64, /*n=*/32, /*E=*/8, /*K=*/2);
  c.router = v.router;
  c.norm_topk_prob = v.norm;
  c.routing = v.routing;
  c.rounding_mode = v.mode;
  c.tile = v.tile;
  c.aux_loss_coef = 0.05f;
  c.z_loss_coef = 0.01f;
  return c;
}

void run_variants(DType dtype, uint64_t seed_base) {
  const int64_t T = 64;
  uint64_t seed = seed_base;
  for (const Variant& v : kVariants) {
    const MoEConfig c = variant_config(v);
    SCOPED_TRACE(describe_case(c, T, dtype) + " seed " + std::to_string(seed));
    const reference::HostLayerInputs in = reference::random_inputs(c, T, dtype, seed++);
    const reference::HostLayerOutputs want = check_cpu_against_naive(in);
    if (c.routing == Routing::token_rounding) {
      // The case only tests rounding if rounding moved some count; every count is a tile multiple or T.
      int64_t moved = 0;
      for (int64_t e = 0; e < c.E; ++e) {
        moved += std::abs(want.expert_counts[e] - want.topk_counts[e]);
        EXPECT_TRUE(want.expert_counts[e] % c.tile == 0 || want.expert_counts[e] == T) << "expert " << e;
      }
      EXPECT_GT(moved, 0) << "token rounding moved no count: pick another seed";
    }
  }
}

}  // namespace

TEST(Agreement, Fp32MatchesDoubleReference) { run_variants(DType::f32, 1001); }

TEST(Agreement, Bf16MatchesRoundedFloatReference) { run_variants(DType::bf16, 2001); }

// Loss weights given through d_losses (different from the config's coefficients) must be used.
TEST(Agreement, ExplicitLossWeightsOverrideConfig) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    MoEConfig c = variant_config(kVariants[4]);
    SCOPED_TRACE(describe_case(c, 48, dtype));
    reference::HostLayerInputs in = reference::random_inputs(c, 48, dtype, 3001);
    in.d_aux = 0.75f;  // != cfg.aux_loss_coef: run_backend passes d_losses
    in.d_z = -0.25f;
    check_cpu_against_naive(in);
  }
}

// The naive references in float and double must themselves agree on fp32 inputs (the float one is
// the bf16 tests' yardstick, so it must be right apart from rounding).
TEST(Agreement, NaiveFloatMatchesNaiveDouble) {
  const MoEConfig c = variant_config(kVariants[5]);
  const reference::HostLayerInputs in = reference::random_inputs(c, 64, DType::f32, 4001);
  expect_agree(reference::naive_forward_backward<float>(in), reference::naive_forward_backward<double>(in), kF32Tol);
}
