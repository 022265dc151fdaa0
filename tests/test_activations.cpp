// Every expert activation, with and without biases, in every weight layout (concatenated or
// interleaved gate/up, HF or transposed), through the fused router and with routing given: the
// CPU backend against the naive reference (fp32 and bf16), finite differences for every
// activation's derivatives, and the activation functions at known values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "../src/activation.h"
#include "reference_checks.h"

using namespace leanmoe;
using namespace leanmoe::testing;
using reference::HostLayerInputs;

namespace {

using act::kAll;

// The clamp limit is small enough that many of the N(0, 1) pre-activations hit it (gpt-oss uses 7); as
// swiglu_softcapped's caps (gate 1.702, up 0.6) both soft caps bend them well away from linear.
MoEConfig act_config(Activation a, bool interleaved, bool transposed, Routing routing) {
  MoEConfig c = small_config(/*d=*/32, /*n=*/16, /*E=*/8, /*K=*/2);
  c.activation = a;
  c.act_limit = 0.6f;
  c.interleaved = interleaved && activation_is_gated(a);
  c.transposed = transposed;
  c.routing = routing;
  if (routing != Routing::given) {
    c.router = RouterConvention::topk_then_softmax;
    c.aux_loss_coef = 0.05f;
  }
  return c;
}

void check(const MoEConfig& c, bool biases, int64_t T, uint64_t seed) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(describe_case(c, T, dtype) + (biases ? " biases" : "") + " seed " + std::to_string(seed));
    HostLayerInputs in = reference::random_inputs(c, T, dtype, seed);
    if (biases) reference::add_random_biases(in, seed);
    check_cpu_against_naive(in);
  }
}

}  // namespace

TEST(Activations, EachActivationFusedRouterHfLayout) {
  uint64_t seed = 8001;
  for (Activation a : kAll) check(act_config(a, false, false, Routing::topk), false, 40, seed++);
}

TEST(Activations, EachActivationGivenRoutingBiasesEveryLayout) {
  uint64_t seed = 8101;
  for (Activation a : kAll)
    for (bool interleaved : {false, true})
      for (bool transposed : {false, true}) {
        if (interleaved && !activation_is_gated(a)) continue;
        check(act_config(a, interleaved, transposed, Routing::given), true, 30, seed++);
      }
}

// gpt-oss's experts: clamped SwiGLU, interleaved, transposed, both biases, under its own router.
TEST(Activations, GptOssExpertsUnderTheFusedRouter) {
  MoEConfig c = act_config(Activation::swiglu_clamped, true, true, Routing::topk);
  c.act_limit = 7.f;
  check(c, true, 48, 8201);
  c.act_limit = 0.5f;
  check(c, true, 48, 8202);
}

// DeepSeek-V4's experts (GLM-5-Next's, HY-V4's): silu(min(g, l)) clamp(u, -l, l), swiglu_clamped with
// alpha 1 and up offset 0, on their layout ([gate; up], HF, no bias) under the fused router, then
// every other layout with biases and routing given.
MoEConfig deepseek_v4_config(bool interleaved, bool transposed, Routing routing) {
  MoEConfig c = act_config(Activation::swiglu_clamped, interleaved, transposed, routing);
  c.act_alpha = 1.f;
  c.act_up_offset = 0.f;
  return c;
}

TEST(Activations, DeepSeekV4ClampedSwiGLU) {
  MoEConfig c = deepseek_v4_config(false, false, Routing::topk);
  check(c, false, 48, 8211);
  c.act_limit = 10.f;  // DeepSeek-V4's swiglu_limit: no clamp acts on these N(0, 1) values
  check(c, false, 48, 8212);
  uint64_t seed = 8213;
  for (bool interleaved : {false, true})
    for (bool transposed : {false, true})
      check(deepseek_v4_config(interleaved, transposed, Routing::given), true, 30, seed++);
}

// Token rounding with a plain activation and biases (rows added by rounding carry the biases too).
TEST(Activations, PlainActivationWithTokenRounding) {
  MoEConfig c = act_config(Activation::relu2, false, true, Routing::token_rounding);
  c.tile = 8;
  c.rounding_mode = RoundingMode::up;
  check(c, true, 40, 8301);
}

// Finite differences of the double reference for the weights, biases and x, per activation, then
// the backend's fp32 gradients against them.
TEST(Activations, GradCheckEachActivation) {
  uint64_t seed = 8401;
  for (Activation a : kAll) {
    MoEConfig c = small_config(/*d=*/8, /*n=*/4, /*E=*/4, /*K=*/2);
    c.activation = a;
    c.act_limit = 0.6f;
    c.routing = Routing::given;
    c.interleaved = activation_is_gated(a) && seed % 2 == 0;
    c.transposed = seed % 3 == 0;
    SCOPED_TRACE(describe_case(c, 7, DType::f32));
    HostLayerInputs in = reference::random_inputs(c, 7, DType::f32, seed++);
    reference::add_random_biases(in, seed);
    const reference::HostLayerOutputs an = reference::naive_forward_backward<double>(in);
    // A kink (relu at 0, a clamp at its limit) within 1e-6 of a value would show as an O(1) error:
    // the seeded inputs have none.
    expect_routed_gradients_match_fd(in, an);
    expect_agree(reference::run_backend(in, Device::cpu), an, kF32Tol);
  }
}

// The same for DeepSeek-V4's clamped SwiGLU (up offset 0), in each layout.
TEST(Activations, GradCheckDeepSeekV4ClampedSwiGLU) {
  uint64_t seed = 8501;
  for (bool interleaved : {false, true})
    for (bool transposed : {false, true}) {
      MoEConfig c = small_config(/*d=*/8, /*n=*/4, /*E=*/4, /*K=*/2);
      c.activation = Activation::swiglu_clamped;
      c.act_alpha = 1.f;
      c.act_limit = 0.6f;
      c.act_up_offset = 0.f;
      c.routing = Routing::given;
      c.interleaved = interleaved;
      c.transposed = transposed;
      SCOPED_TRACE(describe_case(c, 7, DType::f32));
      HostLayerInputs in = reference::random_inputs(c, 7, DType::f32, seed++);
      reference::add_random_biases(in, seed++);
      const reference::HostLayerOutputs an = reference::naive_forward_backward<double>(in);
      expect_routed_gradients_match_fd(in, an);
      expect_agree(reference::run_backend(in, Device::cpu), an, kF32Tol);
    }
}

// The functions themselves at known values (double): GELU(1) = Phi(1), tanh-GELU(1), SiLU(1) =
// sigmoid(1); and gpt-oss's clamped SwiGLU (transformers' GptOssExperts._apply_gate) written out.
TEST(Activations, KnownValues) {
  auto f = [](Activation k, double g, double u = 0.0) { return act::forward<double>({k, 1.702f, 7.f}, g, u); };
  EXPECT_NEAR(f(Activation::gelu, 1.0), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(f(Activation::gelu_tanh, 1.0), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(f(Activation::silu, 1.0), 0.7310585786300049, 1e-15);
  EXPECT_EQ(f(Activation::relu, -0.5), 0.0);
  EXPECT_EQ(f(Activation::relu2, 3.0), 9.0);
  EXPECT_NEAR(f(Activation::geglu, 1.0, 2.0), 2 * 0.8413447460685429, 1e-15);
  EXPECT_NEAR(f(Activation::reglu, 2.0, -3.0), -6.0, 0);
  auto oss = [](double g, double u) {
    const double gc = std::min(g, double(7.f)), uc = std::clamp(u, double(-7.f), double(7.f));
    return (uc + 1) * gc / (1 + std::exp(-double(1.702f) * gc));
  };
  for (double g : {-9.0, -1.0, 0.3, 6.9, 7.0, 12.0})
    for (double u : {-8.0, -7.0, -0.5, 0.0, 2.0, 9.0})
      EXPECT_NEAR(f(Activation::swiglu_clamped, g, u), oss(g, u), 1e-12) << g << ", " << u;
  // The clamp passes the gradient on its closed interval, as torch.clamp's backward does.
  double dg, du;
  act::backward<double>({Activation::swiglu_clamped, 1.702f, 7.f}, 7.0, 7.0, dg, du);
  EXPECT_NE(dg, 0.0);
  EXPECT_NE(du, 0.0);
  act::backward<double>({Activation::swiglu_clamped, 1.702f, 7.f}, 7.5, -7.5, dg, du);
  EXPECT_EQ(dg, 0.0);
  EXPECT_EQ(du, 0.0);
  // DeepSeek-V4's (transformers' DeepseekV4Experts._apply_gate): silu(min(g, 10)) clamp(u, -10, 10),
  // and its partial derivatives against central differences away from the kinks.
  const act::Params v4{Activation::swiglu_clamped, 1.f, 10.f, 0.f};
  auto v4_ref = [](double g, double u) {
    const double gc = std::min(g, 10.0), uc = std::clamp(u, -10.0, 10.0);
    return uc * gc / (1 + std::exp(-gc));
  };
  for (double g : {-12.0, -1.0, 0.3, 9.9, 10.0, 14.0})
    for (double u : {-11.0, -10.0, -0.5, 0.0, 2.0, 13.0}) {
      EXPECT_NEAR(act::forward<double>(v4, g, u), v4_ref(g, u), 1e-12) << g << ", " << u;
      if (std::abs(std::abs(g) - 10.0) < 1e-3 || std::abs(std::abs(u) - 10.0) < 1e-3) continue;
      act::backward<double>(v4, g, u, dg, du);
      const double h = 1e-6;
      EXPECT_NEAR(dg, (v4_ref(g + h, u) - v4_ref(g - h, u)) / (2 * h), 1e-6) << g << ", " << u;
      EXPECT_NEAR(du, (v4_ref(g, u + h) - v4_ref(g, u - h)) / (2 * h), 1e-6) << g << ", " << u;
    }
  // Inkling2's (transformers' Inkling2SoftcappedSwiGLU): 4 tanh(g / 4) sigmoid(g) 25 tanh(u / 25), and
  // its partial derivatives against central differences (smooth everywhere).
  const act::Params ink{Activation::swiglu_softcapped, 4.f, 25.f};
  auto ink_ref = [](double g, double u) { return 4 * std::tanh(g / 4) / (1 + std::exp(-g)) * 25 * std::tanh(u / 25); };
  for (double g : {-30.0, -5.0, -1.0, 0.0, 0.3, 4.0, 12.0, 40.0})
    for (double u : {-90.0, -25.0, -0.5, 0.0, 2.0, 30.0}) {
      EXPECT_NEAR(act::forward<double>(ink, g, u), ink_ref(g, u), 1e-12) << g << ", " << u;
      act::backward<double>(ink, g, u, dg, du);
      const double h = 1e-6;
      EXPECT_NEAR(dg, (ink_ref(g + h, u) - ink_ref(g - h, u)) / (2 * h), 1e-6) << g << ", " << u;
      EXPECT_NEAR(du, (ink_ref(g, u + h) - ink_ref(g, u - h)) / (2 * h), 1e-6) << g << ", " << u;
    }
  // Offset 0 makes no other change: a(g, u) = a_gpt-oss(g, u) - glu(g').
  const act::Params oss_alpha1{Activation::swiglu_clamped, 1.f, 10.f, 1.f};
  EXPECT_NEAR(act::forward<double>(oss_alpha1, 2.0, 3.0) - act::forward<double>(v4, 2.0, 3.0),
              2.0 / (1 + std::exp(-2.0)), 1e-12);
}

// The argument rules of the expert function.
// backward() returns a = f(g, u) from its own terms, which dH's epilogue takes instead of calling
// forward(): it must be forward()'s value bit for bit, for every activation, in float and double,
// across the clamps' and caps' ranges (both up offsets; caps below and above 1).
template <class Real>
void expect_backward_a_is_forward(const act::Params& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> wide(-40.0, 40.0), near(-3.0, 3.0);
  for (int i = 0; i < 2000; ++i) {
    const Real g = Real(i % 2 ? wide(rng) : near(rng)), u = Real(i % 3 ? near(rng) : wide(rng));
    Real dg, du;
    const Real a = act::backward<Real>(p, g, u, dg, du);
    const Real f = act::forward<Real>(p, g, u);
    ASSERT_EQ(std::memcmp(&a, &f, sizeof(Real)), 0) << activation_name(p.kind) << " g=" << g << " u=" << u
                                                    << ": backward's a " << a << ", forward " << f;
  }
}
TEST(Activations, BackwardReturnsForwardsValueBitwise) {
  uint64_t seed = 31;
  for (Activation k : act::kAll)
    for (const act::Params& p : {act::Params{k, 1.702f, 7.f, 1.f}, act::Params{k, 1.f, 10.f, 0.f},
                                 act::Params{k, 0.5f, 1.5f, 1.f}, act::Params{k, 4.f, 25.f, 0.f}}) {
      expect_backward_a_is_forward<float>(p, seed++);
      expect_backward_a_is_forward<double>(p, seed++);
    }
}

TEST(Activations, ConfigRules) {
  MoEConfig c = small_config(16, 8, 4, 2);
  c.activation = Activation::relu;
  c.interleaved = true;
  EXPECT_THROW(plan_layer(c, 4, DType::f32, Device::cpu), Error);
  try {
    plan_layer(c, 4, DType::f32, Device::cpu);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.interleaved needs a gated activation"), std::string::npos) << e.what();
  }
  c.interleaved = false;
  c.activation = Activation::swiglu_clamped;
  c.act_limit = 0.f;
  EXPECT_THROW(plan_layer(c, 4, DType::f32, Device::cpu), Error);
  // The up offset: 1 (gpt-oss) or 0 (DeepSeek-V4), named with its rule; NaN and others refused.
  c.act_limit = 7.f;
  for (float bad : {std::nanf(""), 0.5f, -1.f, 2.f}) {
    c.act_up_offset = bad;
    try {
      plan_layer(c, 4, DType::f32, Device::cpu);
      ADD_FAILURE() << "act_up_offset " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cfg.act_up_offset 0 (DeepSeek-V4) or 1 (gpt-oss)"), std::string::npos)
          << e.what();
    }
  }
  c.act_up_offset = 0.f;
  EXPECT_NO_THROW(plan_layer(c, 4, DType::f32, Device::cpu));
  c.act_up_offset = 1.f;
  // The soft caps: finite and > 0, both named.
  c.activation = Activation::swiglu_softcapped;
  for (auto [gate_cap, up_cap] : {std::pair{0.f, 25.f}, {4.f, -1.f}, {std::nanf(""), 25.f}, {4.f, INFINITY}}) {
    c.act_alpha = gate_cap;
    c.act_limit = up_cap;
    try {
      plan_layer(c, 4, DType::f32, Device::cpu);
      ADD_FAILURE() << "caps " << gate_cap << ", " << up_cap << " were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("swiglu_softcapped needs finite caps cfg.act_alpha (gate) > 0 and "
                                           "cfg.act_limit (up) > 0"),
                std::string::npos)
          << e.what();
    }
  }
  c.act_alpha = 4.f;
  c.act_limit = 25.f;
  EXPECT_NO_THROW(plan_layer(c, 4, DType::f32, Device::cpu));
  // A plain activation's up-projection has n rows, so its saved H is [R, n].
  c.activation = Activation::gelu;
  LayerMemory mem(c, 4, DType::f32, Device::cpu);
  EXPECT_EQ(mem.saved().h.shape[1], c.n);
}
