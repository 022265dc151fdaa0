// Finite differences in double precision: the naive reference's analytic gradients against central
// differences of L = <out, d_out> + d_aux * aux + d_z * z, for the input and every weight; then the
// backend's fp32 gradients against those analytic gradients.
#include <cmath>

#include "reference_checks.h"

using namespace leanmoe;
using namespace leanmoe::testing;
using reference::Param;

namespace {

// Central differences with step h = 1e-6 in double: truncation error ~h^2 * |L'''| ~ 1e-12,
// cancellation error ~ 1e-16 * |L| / h ~ 1e-10 * |L| (|L| ~ 10 here). Routing is piecewise
// constant: a 1e-6 step moves a logit by < 1e-5, far below the top-K and rounding gaps of these
// seeded inputs (a flip would show as an O(1) error, not a small one).
constexpr double kStep = 1e-6;
// Norm-wise relative error of FD vs analytic; the combined errors above give < 1e-7.
constexpr double kFdTol = 1e-6;

std::vector<float> finite_differences(const reference::HostLayerInputs& in, Param which, size_t count) {
  std::vector<float> g(count);
  for (size_t i = 0; i < count; ++i)
    g[i] = float((reference::naive_loss(in, which, i, kStep) - reference::naive_loss(in, which, i, -kStep)) /
                 (2 * kStep));
  return g;
}

void check_gradients(const MoEConfig& c, int64_t T, uint64_t seed) {
  SCOPED_TRACE(describe_case(c, T, DType::f32) + " seed " + std::to_string(seed));
  reference::HostLayerInputs in = reference::random_inputs(c, T, DType::f32, seed);
  in.d_aux = 0.5f;  // large enough that the loss paths carry real weight in the gradient
  in.d_z = 0.2f;
  const reference::HostLayerOutputs an = reference::naive_forward_backward<double>(in);
  EXPECT_LT(reference::rel_error(finite_differences(in, Param::x, in.x.size()), an.dx), kFdTol) << "dx";
  EXPECT_LT(reference::rel_error(finite_differences(in, Param::router, in.router.size()), an.d_router), kFdTol)
      << "d_router";
  EXPECT_LT(reference::rel_error(finite_differences(in, Param::gate_up, in.gate_up.size()), an.d_gate_up), kFdTol)
      << "d_gate_up_proj";
  EXPECT_LT(reference::rel_error(finite_differences(in, Param::down, in.down.size()), an.d_down), kFdTol)
      << "d_down_proj";

  // The backend's fp32 gradients against the double analytic ones (tolerance: reference_checks.h).
  const reference::HostLayerOutputs got = reference::run_backend(in, Device::cpu);
  expect_agree(got, an, kF32Tol);
}

MoEConfig tiny(RouterConvention router, bool norm, Routing routing, RoundingMode mode) {
  MoEConfig c = small_config(/*d=*/12, /*n=*/6, /*E=*/4, /*K=*/2);
  c.router = router;
  c.norm_topk_prob = norm;
  c.routing = routing;
  c.rounding_mode = mode;
  c.tile = 4;  // T = 10, K = 2: about 5 rows per expert, so every mode moves counts
  return c;
}

}  // namespace

TEST(GradCheck, TopkThenSoftmax) {
  check_gradients(tiny(RouterConvention::topk_then_softmax, false, Routing::topk, RoundingMode::nearest), 10, 11);
}

TEST(GradCheck, SoftmaxThenTopk) {
  check_gradients(tiny(RouterConvention::softmax_then_topk, false, Routing::topk, RoundingMode::nearest), 10, 12);
}

TEST(GradCheck, SoftmaxThenTopkNormalised) {
  check_gradients(tiny(RouterConvention::softmax_then_topk, true, Routing::topk, RoundingMode::nearest), 10, 13);
}

// Rounding up adds pairs (gate = raw p); rounding down drops pairs that still sit in D_t.
TEST(GradCheck, TokenRoundingUpAddsPairs) {
  check_gradients(tiny(RouterConvention::softmax_then_topk, true, Routing::token_rounding, RoundingMode::up), 10, 14);
}

TEST(GradCheck, TokenRoundingDownDropsPairs) {
  check_gradients(tiny(RouterConvention::topk_then_softmax, false, Routing::token_rounding, RoundingMode::down), 10,
                  15);
}

TEST(GradCheck, TokenRoundingNearestNoNorm) {
  check_gradients(tiny(RouterConvention::softmax_then_topk, false, Routing::token_rounding, RoundingMode::nearest), 10,
                  16);
}
