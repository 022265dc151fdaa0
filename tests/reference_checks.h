// Helpers shared by the CPU tests that compare a backend with the naive reference.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "leanmoe/leanmoe.h"
#include "naive_moe.h"

namespace leanmoe::testing {

// Tolerances (relative, norm-wise over a whole tensor):
// - fp32 storage vs naive<double>: every value is a dot product of at most max(d, 2n, T) <= 128
//   terms accumulated in fp32 (unit roundoff 6e-8); random-walk error growth gives ~1e-6 per
//   stage, and a gradient passes through at most ~4 stages (dA', dH, dX_exp, sum), so 1e-5 leaves
//   a few-fold margin while any wrong term (a missing gate, a dropped row) is >1e-2.
// - bf16 storage vs naive<float> with the same rounding points: both round the same exact values
//   at the same places, so they differ only where an fp32 sum order difference (~1e-6) or the two
//   dS formulas (<dO, Y_bf16> vs <dA', a>, differing by Y's rounding, 2^-9 per element averaged
//   over d) push a value across a bf16 rounding boundary, costing one bf16 ulp (2^-8 = 4e-3) on a
//   few elements. The dS formulas differ by the rounding of Y vs that of A and H (2^-9 relative
//   per element, not averaging out in a d = 64 dot product), ~3e-3 relative on dS, and only the
//   router path (dz -> d_router, dx) sees dS: measured 2-5e-3 there and exactly 0 on out and the
//   expert weight gradients. 1e-2 holds that with 2x margin, while a logic error is O(1).
constexpr double kF32Tol = 1e-5;
constexpr double kBf16Tol = 1e-2;

// Two runs that must agree bit for bit (schedules, quantization placements): every output and gradient.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}
inline void expect_bitwise_equal(const reference::HostLayerOutputs& got, const reference::HostLayerOutputs& want) {
  EXPECT_TRUE(same_bits(got.out, want.out)) << "out";
  EXPECT_TRUE(same_bits(got.dx, want.dx)) << "dx";
  EXPECT_TRUE(same_bits(got.d_router, want.d_router)) << "d_router";
  EXPECT_TRUE(same_bits(got.d_gate_up, want.d_gate_up)) << "d_gate_up";
  EXPECT_TRUE(same_bits(got.d_down, want.d_down)) << "d_down";
  EXPECT_TRUE(same_bits(got.d_gate_up_bias, want.d_gate_up_bias)) << "d_gate_up_bias";
  EXPECT_TRUE(same_bits(got.d_down_bias, want.d_down_bias)) << "d_down_bias";
  EXPECT_TRUE(same_bits(got.d_topk_weights, want.d_topk_weights)) << "d_topk_weights";
}

inline double scalar_rel_error(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// Compares every output and gradient of `got` with `want`.
// `router_tol` (default: tol) is for d_router alone; see its one use for why it can differ.
inline void expect_agree(const reference::HostLayerOutputs& got, const reference::HostLayerOutputs& want, double tol,
                         double router_tol = -1) {
  if (router_tol < 0) router_tol = tol;
  using reference::rel_error;
  EXPECT_EQ(got.topk_counts, want.topk_counts) << "plain top-K choice per expert";
  EXPECT_EQ(got.expert_counts, want.expert_counts) << "rows per expert after routing";
  EXPECT_LT(rel_error(got.out, want.out), tol) << "out";
  EXPECT_LT(rel_error(got.dx, want.dx), tol) << "dx";
  EXPECT_LT(rel_error(got.d_router, want.d_router), router_tol) << "d_router";
  EXPECT_LT(rel_error(got.d_gate_up, want.d_gate_up), tol) << "d_gate_up_proj";
  EXPECT_LT(rel_error(got.d_down, want.d_down), tol) << "d_down_proj";
  EXPECT_LT(rel_error(got.d_gate_up_bias, want.d_gate_up_bias), tol) << "d_gate_up_bias";
  EXPECT_LT(rel_error(got.d_down_bias, want.d_down_bias), tol) << "d_down_bias";
  EXPECT_LT(rel_error(got.d_topk_weights, want.d_topk_weights), router_tol) << "d_topk_weights";
  EXPECT_LT(scalar_rel_error(got.aux_loss, want.aux_loss), tol) << "aux_loss " << got.aux_loss << " vs " << want.aux_loss;
  EXPECT_LT(scalar_rel_error(got.z_loss, want.z_loss), tol) << "z_loss " << got.z_loss << " vs " << want.z_loss;
}

// Runs the CPU backend on `in` and compares it with the matching naive reference: naive<double>
// for fp32 storage, naive<float> with bf16 rounding points for bf16 storage.
inline reference::HostLayerOutputs check_cpu_against_naive(const reference::HostLayerInputs& in,
                                                           double router_tol = -1) {
  const bool bf16 = in.dtype == DType::bf16;
  const reference::HostLayerOutputs want =
      bf16 ? reference::naive_forward_backward<float>(in) : reference::naive_forward_backward<double>(in);
  const reference::HostLayerOutputs got = reference::run_backend(in, Device::cpu);
  const double tol = bf16 ? kBf16Tol : kF32Tol;
  expect_agree(got, want, tol, router_tol < 0 ? tol : std::max(tol, router_tol));
  return want;
}

// Central differences of the naive reference's double-precision loss for every entry of `which`
// (step 1e-6: see test_gradcheck.cpp for the error budget).
inline std::vector<float> fd_gradient(const reference::HostLayerInputs& in, reference::Param which, size_t count) {
  std::vector<float> g(count);
  for (size_t i = 0; i < count; ++i)
    g[i] = float((reference::naive_loss(in, which, i, 1e-6) - reference::naive_loss(in, which, i, -1e-6)) / 2e-6);
  return g;
}

// Every gradient of routing given by the caller (x, both expert weights, both biases, the routing
// weights) against central differences of the naive reference's double-precision loss.
inline void expect_routed_gradients_match_fd(const reference::HostLayerInputs& in,
                                             const reference::HostLayerOutputs& an) {
  using reference::Param;
  auto fd = [&](Param p, size_t count) { return fd_gradient(in, p, count); };
  EXPECT_LT(reference::rel_error(fd(Param::x, in.x.size()), an.dx), 1e-6) << "dx";
  EXPECT_LT(reference::rel_error(fd(Param::gate_up, in.gate_up.size()), an.d_gate_up), 1e-6) << "d_gate_up";
  EXPECT_LT(reference::rel_error(fd(Param::down, in.down.size()), an.d_down), 1e-6) << "d_down";
  EXPECT_LT(reference::rel_error(fd(Param::gate_up_bias, in.gate_up_bias.size()), an.d_gate_up_bias), 1e-6)
      << "d_gate_up_bias";
  EXPECT_LT(reference::rel_error(fd(Param::down_bias, in.down_bias.size()), an.d_down_bias), 1e-6) << "d_down_bias";
  EXPECT_LT(reference::rel_error(fd(Param::topk_weights, in.topk_weights.size()), an.d_topk_weights), 1e-6)
      << "d_topk_weights";
}

inline MoEConfig small_config(int64_t d, int64_t n, int64_t E, int64_t K) {
  MoEConfig c;
  c.d = d;
  c.n = n;
  c.E = E;
  c.K = K;
  return c;
}

inline std::string describe_case(const MoEConfig& c, int64_t T, DType dtype) {
  return c.describe() + " T=" + std::to_string(T) + " " + dtype_name(dtype);
}

}  // namespace leanmoe::testing
