// Routing given by the caller (forward_routed / backward_routed) on the CPU backend against the
// naive reference, whose dS is <dO, y> from its cached Y: random routings, ragged and empty
// experts, one expert taking every token, sentinel ids, an expert listed twice, T = 0 and 1,
// f32 weights over bf16 storage; finite differences for every input; the saved-state contract,
// the callback order, the argument rules and the aliasing rule.
#include <cstring>

#include "expect_error.h"
#include "reference_checks.h"

using namespace leanmoe;
using namespace leanmoe::testing;
using reference::HostLayerInputs;
using reference::HostLayerOutputs;

namespace {

MoEConfig given_config(int64_t d, int64_t n, int64_t E, int64_t K) {
  MoEConfig c = small_config(d, n, E, K);
  c.routing = Routing::given;
  return c;
}

void both_dtypes(const MoEConfig& c, int64_t T, uint64_t seed,
                 const std::function<void(HostLayerInputs&)>& shape_inputs = nullptr) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(describe_case(c, T, dtype) + " seed " + std::to_string(seed));
    HostLayerInputs in = reference::random_inputs(c, T, dtype, seed);
    if (shape_inputs) shape_inputs(in);
    check_cpu_against_naive(in);
  }
}

int64_t count_rows(const HostLayerOutputs& o) {
  int64_t r = 0;
  for (int32_t c : o.expert_counts) r += c;
  return r;
}

}  // namespace

TEST(RoutingGiven, RandomRoutingMatchesReference) {
  both_dtypes(given_config(64, 32, 8, 2), 64, 7001);
  both_dtypes(given_config(48, 16, 16, 4), 37, 7002);
  both_dtypes(given_config(32, 24, 4, 4), 20, 7003);  // K = E: every token to every expert
}

TEST(RoutingGiven, BiasesMatchReference) {
  both_dtypes(given_config(64, 32, 8, 2), 50, 7011, [](HostLayerInputs& in) { reference::add_random_biases(in, 1); });
}

// Experts 0..2 take everything, most tokens going to expert 1; experts 3..7 get no rows.
TEST(RoutingGiven, RaggedAndEmptyExperts) {
  const MoEConfig c = given_config(32, 16, 8, 2);
  both_dtypes(c, 48, 7021, [&](HostLayerInputs& in) {
    for (int64_t t = 0; t < in.T; ++t) {
      in.topk_experts[t * 2] = 1;
      in.topk_experts[t * 2 + 1] = t % 5 == 0 ? 2 : 0;
    }
  });
  HostLayerInputs in = reference::random_inputs(c, 48, DType::f32, 7021);
  for (int64_t t = 0; t < in.T; ++t) in.topk_experts[t * 2 + 1] = 1 - (t % 2);  // experts 0 and 1 only
  for (int64_t t = 0; t < in.T; ++t) in.topk_experts[t * 2] = 2 + (t % 2);
  const HostLayerOutputs got = reference::run_backend(in, Device::cpu);
  for (int64_t e = 4; e < c.E; ++e) {
    EXPECT_EQ(got.expert_counts[e], 0);
    for (int64_t i = 0; i < 2 * c.n * c.d; ++i) ASSERT_EQ(got.d_gate_up[e * 2 * c.n * c.d + i], 0.f) << "expert " << e;
  }
}

TEST(RoutingGiven, OneExpertTakesEveryToken) {
  const MoEConfig c = given_config(32, 16, 8, 1);
  both_dtypes(c, 33, 7031, [](HostLayerInputs& in) {
    for (int32_t& e : in.topk_experts) e = 5;
  });
}

// Ids outside [0, E) are "no expert": they take no row, add nothing and get d_weight = 0; the
// layer equals the same routing with those slots' weights set to 0 and ids moved to a real expert.
TEST(RoutingGiven, SentinelsContributeNothing) {
  const MoEConfig c = given_config(32, 16, 8, 3);
  const int32_t sentinels[] = {-1, 8, 1000, std::numeric_limits<int32_t>::min()};
  auto with_sentinels = [&](HostLayerInputs& in) {
    for (int64_t t = 0; t < in.T; ++t)
      if (t % 3 != 1) in.topk_experts[t * 3 + (t % 3)] = sentinels[t % 4];
    for (int64_t k = 0; k < 3; ++k) in.topk_experts[5 * 3 + k] = -1;  // token 5 has no expert at all
  };
  both_dtypes(c, 40, 7041, with_sentinels);

  HostLayerInputs in = reference::random_inputs(c, 40, DType::f32, 7041);
  with_sentinels(in);
  const HostLayerOutputs got = reference::run_backend(in, Device::cpu);
  HostLayerInputs zeroed = in;
  int64_t sentinel_slots = 0;
  for (size_t i = 0; i < zeroed.topk_experts.size(); ++i) {
    if (zeroed.topk_experts[i] >= 0 && zeroed.topk_experts[i] < c.E) continue;
    EXPECT_EQ(got.d_topk_weights[i], 0.f) << "slot " << i;
    zeroed.topk_experts[i] = 0;
    zeroed.topk_weights[i] = 0.f;
    ++sentinel_slots;
  }
  EXPECT_GT(sentinel_slots, 10);
  EXPECT_EQ(count_rows(got), 40 * 3 - sentinel_slots);
  const HostLayerOutputs same = reference::run_backend(zeroed, Device::cpu);
  EXPECT_LT(reference::rel_error(got.out, same.out), 1e-6);
  EXPECT_LT(reference::rel_error(got.dx, same.dx), 1e-6);
  for (int64_t i = 5 * c.d; i < 6 * c.d; ++i) {
    EXPECT_EQ(got.out[i], 0.f) << "token 5 (no expert) must give 0";
    EXPECT_EQ(got.dx[i], 0.f);
  }
}

// A token may list an expert twice: two rows, each with its own weight and dS.
TEST(RoutingGiven, ExpertListedTwice) {
  const MoEConfig c = given_config(32, 16, 8, 2);
  both_dtypes(c, 24, 7051, [](HostLayerInputs& in) {
    for (int64_t t = 0; t < in.T; t += 2) in.topk_experts[t * 2 + 1] = in.topk_experts[t * 2];
  });
}

TEST(RoutingGiven, SingleTokenAndOddT) {
  both_dtypes(given_config(32, 16, 8, 2), 1, 7061);
  both_dtypes(given_config(40, 8, 6, 3), 37, 7062);
}

// f32 weights (a router computed in fp32) with bf16 storage: d_topk_weights comes back in f32.
TEST(RoutingGiven, Fp32WeightsOverBf16Storage) {
  const MoEConfig c = given_config(64, 32, 8, 2);
  HostLayerInputs in = reference::random_inputs(c, 48, DType::bf16, 7071);
  in.weights_dtype = DType::f32;
  for (float& w : in.topk_weights) w *= 1.0001f;  // no longer bf16-representable
  check_cpu_against_naive(in);
}

// T = 0 (an expert-parallel rank without tokens): empty outputs, zero expert gradients.
TEST(RoutingGiven, NoTokens) {
  const MoEConfig c = given_config(32, 16, 8, 2);
  for (DType dtype : {DType::f32, DType::bf16}) {
    HostLayerInputs in = reference::random_inputs(c, 0, dtype, 7081);
    reference::add_random_biases(in, 2);
    const HostLayerOutputs got = reference::run_backend(in, Device::cpu);
    EXPECT_TRUE(got.out.empty() && got.dx.empty() && got.d_topk_weights.empty());
    for (const std::vector<float>* g : {&got.d_gate_up, &got.d_down, &got.d_gate_up_bias, &got.d_down_bias}) {
      ASSERT_FALSE(g->empty());
      for (float v : *g) ASSERT_EQ(v, 0.f);
    }
  }
}

// Finite differences of the naive reference (double) for every input, then the backend against it.
TEST(RoutingGiven, GradCheck) {
  MoEConfig c = given_config(12, 6, 4, 2);
  HostLayerInputs in = reference::random_inputs(c, 9, DType::f32, 7091);
  reference::add_random_biases(in, 3);
  in.topk_experts[3] = -1;  // a sentinel
  const HostLayerOutputs an = reference::naive_forward_backward<double>(in);
  expect_routed_gradients_match_fd(in, an);
  EXPECT_EQ(an.d_topk_weights[3], 0.f);
  expect_agree(reference::run_backend(in, Device::cpu), an, kF32Tol);
}

// docs/SPEC.md §3 holds with routing given: the saved state is the fused router's (nothing of size R*d).
TEST(RoutingGiven, SavedStateIsTheFusedRoutersContract) {
  MoEConfig c = given_config(256, 64, 16, 4);
  MoEConfig fused = c;
  fused.routing = Routing::topk;
  const int64_t T = 512;
  EXPECT_EQ(plan_layer(c, T, DType::bf16, Device::cpu).saved_bytes,
            plan_layer(fused, T, DType::bf16, Device::cpu).saved_bytes);
  LayerMemory mem(c, T, DType::bf16, Device::cpu);
  const size_t per_row_d = size_t(T * c.K * c.d) * 2;
  EXPECT_LT(mem.saved().bytes_excluding_x(), per_row_d) << "a T*K*d buffer would not fit";
}

// The callback sees down_proj, down_bias, gate_up_proj, gate_up_bias in that order, each complete.
TEST(RoutingGiven, CallbackOrderWithBiases) {
  const MoEConfig c = given_config(16, 8, 4, 2);
  const int64_t T = 10;
  HostLayerInputs in = reference::random_inputs(c, T, DType::f32, 7101);
  reference::add_random_biases(in, 4);
  const HostLayerOutputs want = reference::naive_forward_backward<double>(in);
  LayerMemory mem(c, T, DType::f32, Device::cpu);
  auto t = [](std::vector<float>& v, std::initializer_list<int64_t> shape) {
    return Tensor::contiguous(v.data(), DType::f32, Device::cpu, shape);
  };
  std::vector<float> out(T * c.d), dx(T * c.d), dw1(in.gate_up.size()), dw2(in.down.size()),
      db1(in.gate_up_bias.size()), db2(in.down_bias.size()), dwts(T * c.K);
  std::vector<int32_t> ids = in.topk_experts;
  const Tensor ids_t = Tensor::contiguous(ids.data(), DType::i32, Device::cpu, {T, c.K});
  const MoEWeights w{Tensor{}, t(in.gate_up, {c.E, 2 * c.n, c.d}), t(in.down, {c.E, c.d, c.n}),
                     t(in.gate_up_bias, {c.E, 2 * c.n}), t(in.down_bias, {c.E, c.d})};
  forward_routed(c, t(in.x, {T, c.d}), ids_t, t(in.topk_weights, {T, c.K}), w, t(out, {T, c.d}), mem.saved(),
                 mem.forward_workspace());
  const MoEGrads g{t(dx, {T, c.d}), Tensor{}, t(dw1, {c.E, 2 * c.n, c.d}), t(dw2, {c.E, c.d, c.n}),
                   t(db1, {c.E, 2 * c.n}), t(db2, {c.E, c.d}), t(dwts, {T, c.K})};
  std::vector<ExpertWeight> order;
  backward_routed(c, t(in.d_out, {T, c.d}), w, mem.saved(), g, mem.backward_workspace(),
                  [&](ExpertWeight which, const Tensor& grad) {
                    order.push_back(which);
                    const std::vector<float>& expect = which == ExpertWeight::down_proj      ? want.d_down
                                                       : which == ExpertWeight::down_bias    ? want.d_down_bias
                                                       : which == ExpertWeight::gate_up_proj ? want.d_gate_up
                                                                                             : want.d_gate_up_bias;
                    std::vector<float> got(grad.ptr<float>(), grad.ptr<float>() + grad.numel());
                    EXPECT_LT(reference::rel_error(got, expect), kF32Tol) << expert_weight_name(which);
                  });
  const std::vector<ExpertWeight> expected{ExpertWeight::down_proj, ExpertWeight::down_bias,
                                           ExpertWeight::gate_up_proj, ExpertWeight::gate_up_bias};
  EXPECT_EQ(order, expected);
}

// ----------------------------------------------------------------------------- argument rules
namespace {
struct GivenArgs {
  MoEConfig cfg = given_config(16, 8, 4, 2);
  int64_t T = 6;
  std::vector<float> x = std::vector<float>(6 * 16, 0.5f), w1 = std::vector<float>(4 * 16 * 16, 0.1f),
                     w2 = std::vector<float>(4 * 16 * 8, 0.1f), out = std::vector<float>(6 * 16),
                     wts = std::vector<float>(12, 0.5f), dx = std::vector<float>(6 * 16),
                     dwts = std::vector<float>(12), dr = std::vector<float>(4 * 16);
  std::vector<int32_t> ids = std::vector<int32_t>(12, 1);
  LayerMemory mem{cfg, T, DType::f32, Device::cpu};
  Tensor f32(std::vector<float>& v, std::initializer_list<int64_t> shape) {
    return Tensor::contiguous(v.data(), DType::f32, Device::cpu, shape);
  }
  Tensor ids_t() { return Tensor::contiguous(ids.data(), DType::i32, Device::cpu, {T, cfg.K}); }
  MoEWeights weights() { return {Tensor{}, f32(w1, {4, 16, 16}), f32(w2, {4, 16, 8})}; }
  void fwd(const Tensor& topk, const Tensor& weights_t) {
    forward_routed(cfg, f32(x, {T, 16}), topk, weights_t, weights(), f32(out, {T, 16}), mem.saved(),
                   mem.forward_workspace());
  }
};
}  // namespace

TEST(RoutingGiven, BadArguments) {
  GivenArgs a;
  expect_error([&] { a.fwd(a.f32(a.wts, {a.T, 2}), a.f32(a.wts, {a.T, 2})); },
               {"leanmoe::forward_routed", "argument 'topk_experts'", "dtype i32"});
  expect_error([&] { a.fwd(a.ids_t(), a.f32(a.wts, {2, a.T})); },
               {"argument 'topk_weights'", "[T, K] = [6, 2]"});
  std::vector<int32_t> not_weights(12);
  expect_error([&] { a.fwd(a.ids_t(), Tensor::contiguous(not_weights.data(), DType::i32, Device::cpu, {a.T, 2})); },
               {"argument 'topk_weights'", "dtype f32 or the storage dtype"});
  expect_error([&] { a.fwd(a.ids_t(), Tensor{}); }, {"argument 'topk_weights'", "must be given"});

  // The fused entry points refuse cfg.routing = given, and the routed ones any other routing.
  MoEConfig fused = a.cfg;
  fused.routing = Routing::topk;
  expect_error([&] {
    forward_routed(fused, a.f32(a.x, {a.T, 16}), a.ids_t(), a.f32(a.wts, {a.T, 2}), a.weights(),
                   a.f32(a.out, {a.T, 16}), a.mem.saved(), a.mem.forward_workspace());
  }, {"leanmoe::forward_routed", "argument 'cfg'", "must be given"});
  expect_error([&] {
    forward(a.cfg, a.f32(a.x, {a.T, 16}), a.weights(), a.f32(a.out, {a.T, 16}), Tensor{}, a.mem.saved(),
            a.mem.forward_workspace());
  }, {"leanmoe::forward", "call forward_routed"});

  a.fwd(a.ids_t(), a.f32(a.wts, {a.T, 2}));
  MoEGrads g{a.f32(a.dx, {a.T, 16}), a.f32(a.dr, {4, 16})};
  expect_error([&] { backward_routed(a.cfg, a.f32(a.x, {a.T, 16}), a.weights(), a.mem.saved(), g,
                                     a.mem.backward_workspace()); },
               {"leanmoe::backward_routed", "argument 'grads.d_router'", "must be undefined"});
  g.d_router = Tensor{};
  g.d_topk_weights = a.f32(a.dwts, {a.T, 3});
  expect_error([&] { backward_routed(a.cfg, a.f32(a.x, {a.T, 16}), a.weights(), a.mem.saved(), g,
                                     a.mem.backward_workspace()); },
               {"argument 'grads.d_topk_weights'", "[T, K] = [6, 2]"});
  g.d_topk_weights = Tensor{};
  g.d_gate_up_bias = a.f32(a.dwts, {4, 3});
  expect_error([&] { backward_routed(a.cfg, a.f32(a.x, {a.T, 16}), a.weights(), a.mem.saved(), g,
                                     a.mem.backward_workspace()); },
               {"argument 'grads.d_gate_up_bias'", "must be undefined when w.gate_up_bias is not given"});
}

// The aliasing rule of forward/backward covers the routing-given tensors: the caller's ids and
// weights are read by forward_routed, d_topk_weights is written by backward_routed.
TEST(RoutingGiven, OutputsMustNotAliasInputs) {
  GivenArgs a;
  expect_error([&] { a.fwd(a.ids_t(), a.f32(a.out, {a.T, 2})); },
               {"leanmoe::forward_routed", "argument 'out'", "must not overlap topk_weights"});
  const Tensor ids_in_out = Tensor::contiguous(a.out.data(), DType::i32, Device::cpu, {a.T, 2});
  expect_error([&] { a.fwd(ids_in_out, a.f32(a.wts, {a.T, 2})); }, {"argument 'out'", "must not overlap topk_experts"});

  a.fwd(a.ids_t(), a.f32(a.wts, {a.T, 2}));
  std::vector<float> d_out(size_t(a.T * 16), 1.f);
  auto bwd = [&](const MoEGrads& g) {
    backward_routed(a.cfg, a.f32(d_out, {a.T, 16}), a.weights(), a.mem.saved(), g, a.mem.backward_workspace());
  };
  MoEGrads g;
  g.d_topk_weights = a.f32(d_out, {a.T, 2});
  expect_error([&] { bwd(g); },
               {"leanmoe::backward_routed", "argument 'grads.d_topk_weights'", "must not overlap d_out"});
  g.dx = a.f32(a.dx, {a.T, 16});
  g.d_topk_weights = a.f32(a.dx, {a.T, 2});
  expect_error([&] { bwd(g); }, {"argument 'grads.dx'", "must not overlap grads.d_topk_weights", "both are written"});
  g.d_topk_weights = a.f32(a.dwts, {a.T, 2});
  EXPECT_NO_THROW(bwd(g));
}
