// ExpertOptimizer alone: AdamW and SGD against hand-computed steps in double, per-tensor step
// counts, bf16 parameters with and without an fp32 master copy, bit-exact save/load, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "expect_error.h"
#include "leanmoe/optim.h"

using namespace leanmoe;
using namespace leanmoe::optim;

namespace {

std::vector<float> randn(size_t count, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}

Tensor view(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(v.data(), DType::f32, Device::cpu, shape);
}
Tensor view(std::vector<bf16>& v, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(v.data(), DType::bf16, Device::cpu, shape);
}

std::vector<float> state_values(const ExpertOptimizer& opt, const std::string& name, StateKind kind) {
  const Tensor t = opt.state(name, kind);
  return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel());
}

// AdamW in double (PyTorch's formulation), the reference for the float kernel.
struct AdamWRef {
  std::vector<double> p, m, v;
  int64_t t = 0;
  void step(const AdamW& a, const std::vector<float>& g, double scale = 1.0) {
    ++t;
    const double bc1 = 1 - std::pow(double(a.beta1), double(t)), bc2 = 1 - std::pow(double(a.beta2), double(t));
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = g[i] * scale;
      p[i] *= 1 - double(a.lr) * a.weight_decay;
      m[i] = a.beta1 * m[i] + (1 - double(a.beta1)) * gi;
      v[i] = a.beta2 * v[i] + (1 - double(a.beta2)) * gi * gi;
      p[i] -= a.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + a.eps);
    }
  }
};

// Float rounding of ~10 operations per step over 4 steps: relative error ~1e-6; 1e-5 leaves margin
// while a wrong formula (missing bias correction, coupled decay) is off by >= 1e-3.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * std::max(1e-3, std::abs(want[i]))) << "element " << i;
}

}  // namespace

TEST(Optim, AdamWMatchesDoubleReference) {
  const int64_t E = 3, r = 4, c = 5;
  const size_t N = E * r * c;
  std::vector<float> p = randn(N, 1);
  AdamWRef ref{std::vector<double>(p.begin(), p.end()), std::vector<double>(N), std::vector<double>(N)};
  AdamW rule{1e-2f, 0.9f, 0.99f, 1e-8f, 0.1f};
  ExpertOptimizer opt(rule);
  opt.register_tensor("w", view(p, {E, r, c}));
  const float lrs[] = {1e-2f, 5e-3f, 2e-2f, 1e-3f};  // a schedule: lr set every step
  for (int s = 0; s < 4; ++s) {
    std::vector<float> g = randn(N, 100 + s);
    opt.set_lr(lrs[s]);
    rule.lr = lrs[s];
    const float scale = s == 2 ? 0.5f : 1.f;
    opt.step("w", view(g, {E, r, c}), scale);
    ref.step(rule, g, scale);
    EXPECT_EQ(opt.step_count("w"), s + 1);
    expect_close(p, ref.p, 1e-5);
    expect_close(state_values(opt, "w", StateKind::exp_avg), ref.m, 1e-5);
    expect_close(state_values(opt, "w", StateKind::exp_avg_sq), ref.v, 1e-5);
  }
}

TEST(Optim, AdamWFirstStepIsSignStep) {
  // Bias correction makes the first step lr * g / (|g| + eps): exactly -lr * sign(g) up to eps.
  std::vector<float> p = {1.f, -2.f, 0.5f, 3.f};
  std::vector<float> g = {0.3f, -7.f, 1e-3f, -0.02f};
  ExpertOptimizer opt(AdamW{0.1f, 0.9f, 0.999f, 1e-8f, 0.f});
  opt.register_tensor("w", view(p, {4}));
  opt.step("w", view(g, {4}));
  const float want[] = {0.9f, -1.9f, 0.4f, 3.1f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p[i], want[i], 1e-5f) << i;  // eps/|g| <= 1e-5
}

TEST(Optim, AdamWBf16WithAndWithoutMaster) {
  const size_t N = 64;
  const std::vector<float> init = randn(N, 2);
  std::vector<bf16> plain = to_bf16(init), mastered = to_bf16(init);
  AdamW rule{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  ExpertOptimizer opt(rule);
  opt.register_tensor("plain", view(plain, {8, 8}));
  opt.register_tensor("mastered", view(mastered, {8, 8}), /*fp32_master=*/true);
  EXPECT_FALSE(opt.state("plain", StateKind::master).defined());
  std::vector<double> start(N);
  for (size_t i = 0; i < N; ++i) start[i] = bf16_to_float(mastered[i]);
  AdamWRef ref{start, std::vector<double>(N), std::vector<double>(N)};
  for (int s = 0; s < 5; ++s) {
    std::vector<bf16> g = to_bf16(randn(N, 200 + s));
    std::vector<float> gf(N);
    for (size_t i = 0; i < N; ++i) gf[i] = bf16_to_float(g[i]);
    opt.step("plain", view(g, {8, 8}));
    opt.step("mastered", view(g, {8, 8}));
    ref.step(rule, gf);
    // The moments of "plain" equal those of the double reference (same gradients).
    expect_close(state_values(opt, "plain", StateKind::exp_avg), ref.m, 1e-5);
    const std::vector<float> master = state_values(opt, "mastered", StateKind::master);
    expect_close(master, ref.p, 1e-5);
    for (size_t i = 0; i < N; ++i) ASSERT_EQ(mastered[i].bits, float_to_bf16(master[i]).bits) << i;
  }
  // lr 1e-3 for 5 steps moves each weight by ~5e-3, far below most weights' bf16 ulp: the master
  // copy keeps the small steps that bf16 storage alone rounds away.
  int differ = 0;
  for (size_t i = 0; i < N; ++i) differ += plain[i].bits != mastered[i].bits;
  EXPECT_GT(differ, 0);
}

TEST(Optim, AdamWWithoutMasterRoundsEachStep) {
  std::vector<bf16> p = to_bf16({1.f, -0.5f, 0.25f, 4.f});
  std::vector<bf16> g = to_bf16({0.1f, 0.2f, -0.3f, 0.4f});
  const AdamW rule{0.05f, 0.9f, 0.999f, 1e-8f, 0.1f};
  AdamWRef ref{{}, std::vector<double>(4), std::vector<double>(4)};
  for (bf16 v : p) ref.p.push_back(bf16_to_float(v));
  ExpertOptimizer opt(rule);
  opt.register_tensor("w", view(p, {4}));
  opt.step("w", view(g, {4}));
  std::vector<float> gf;
  for (bf16 v : g) gf.push_back(bf16_to_float(v));
  ref.step(rule, gf);
  // Float update then one bf16 rounding: within one bf16 ulp of the exact value.
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(bf16_to_float(p[i]), ref.p[i], std::abs(ref.p[i]) * 0x1p-8) << i;
}

TEST(Optim, SgdMomentumHandComputed) {
  for (bool nesterov : {false, true}) {
    std::vector<float> p = {1.f, -2.f};
    ExpertOptimizer opt(SGD{0.1f, 0.5f, 0.01f, nesterov});
    opt.register_tensor("w", view(p, {2}));
    std::vector<double> pd = {1, -2}, buf = {0, 0};
    const std::vector<std::vector<float>> grads = {{0.5f, 1.f}, {-1.f, 2.f}, {0.25f, 0.f}};
    for (const auto& gs : grads) {
      std::vector<float> g = gs;
      opt.step("w", view(g, {2}));
      for (int i = 0; i < 2; ++i) {
        const double gi = g[i] + 0.01 * pd[i];
        buf[i] = 0.5 * buf[i] + gi;
        pd[i] -= 0.1 * (nesterov ? gi + 0.5 * buf[i] : buf[i]);
      }
      for (int i = 0; i < 2; ++i) EXPECT_NEAR(p[i], pd[i], 1e-6) << "nesterov " << nesterov;
      const std::vector<float> b = state_values(opt, "w", StateKind::momentum);
      for (int i = 0; i < 2; ++i) EXPECT_NEAR(b[i], buf[i], 1e-6);
    }
    EXPECT_EQ(opt.step_count("w"), 3);
  }
}

TEST(Optim, SgdWithoutMomentumKeepsNoState) {
  std::vector<float> p = {1.f, 2.f}, g = {1.f, -1.f};
  ExpertOptimizer opt(SGD{0.5f, 0.f, 0.f, false});
  opt.register_tensor("w", view(p, {2}));
  EXPECT_EQ(opt.state_bytes(), 0u);
  opt.step("w", view(g, {2}));
  EXPECT_EQ(p[0], 0.5f);
  EXPECT_EQ(p[1], 2.5f);
}

TEST(Optim, StepCountsArePerTensor) {
  std::vector<float> a(6, 1.f), b(4, 1.f), ga(6, 0.1f), gb(4, 0.1f);
  ExpertOptimizer opt(AdamW{});
  opt.register_tensor("a", view(a, {2, 3}));
  opt.register_tensor("b", view(b, {4}));
  for (int i = 0; i < 3; ++i) opt.step("a", view(ga, {2, 3}));
  opt.step("b", view(gb, {4}));
  EXPECT_EQ(opt.step_count("a"), 3);
  EXPECT_EQ(opt.step_count("b"), 1);
  // "b" at its first step takes the bias-corrected sign step even though "a" is at step 3.
  EXPECT_NEAR(b[0], 1.f * (1 - 1e-3f * 0.01f) - 1e-3f, 1e-6f);
}

TEST(Optim, ThreadedUpdateEqualsElementByElement) {
  // Above the parallel threshold the update runs on all threads; each element must still be
  // exactly what a one-element (single-threaded) update of the same inputs gives.
  const size_t N = (size_t(1) << 16) + 7;
  std::vector<bf16> p = to_bf16(randn(N, 3)), g = to_bf16(randn(N, 4));
  const std::vector<bf16> p0 = p;
  const AdamW rule{1e-2f, 0.9f, 0.95f, 1e-6f, 0.1f};
  ExpertOptimizer big(rule);
  big.register_tensor("w", view(p, {int64_t(N)}), true);
  big.step("w", view(g, {int64_t(N)}));
  for (size_t i = 0; i < N; i += 997) {
    std::vector<bf16> pi = {p0[i]}, gi = {g[i]};
    ExpertOptimizer one(rule);
    one.register_tensor("w", view(pi, {1}), true);
    one.step("w", view(gi, {1}));
    ASSERT_EQ(pi[0].bits, p[i].bits) << i;
    ASSERT_EQ(state_values(one, "w", StateKind::master)[0], state_values(big, "w", StateKind::master)[i]);
  }
}

TEST(Optim, SaveLoadRoundTripsBitForBit) {
  for (int which = 0; which < 2; ++which) {
    const Rule rule = which == 0 ? Rule(AdamW{3e-3f, 0.9f, 0.98f, 1e-7f, 0.05f}) : Rule(SGD{0.1f, 0.9f, 1e-3f, true});
    std::vector<bf16> wa = to_bf16(randn(24, 5)), wb = wa;
    std::vector<float> va = randn(10, 6), vb = va;
    ExpertOptimizer a(rule);
    a.register_tensor("experts.w1", view(wa, {2, 3, 4}), true);
    a.register_tensor("experts.w2", view(va, {2, 5}));
    auto train = [](ExpertOptimizer& o, int steps, uint64_t seed) {
      for (int s = 0; s < steps; ++s) {
        std::vector<bf16> g1 = to_bf16(randn(24, seed + s));
        std::vector<float> g2 = randn(10, seed + 50 + s);
        o.set_lr(1e-3f * float(s + 1));
        o.step("experts.w1", view(g1, {2, 3, 4}));
        if (s % 2 == 0) o.step("experts.w2", view(g2, {2, 5}));  // different step counts per tensor
      }
    };
    train(a, 5, 10);
    std::stringstream saved;
    a.save(saved);
    wb = wa;
    vb = va;
    ExpertOptimizer b(which == 0 ? Rule(AdamW{}) : Rule(SGD{}));  // hyper-parameters come from the file
    b.register_tensor("experts.w1", view(wb, {2, 3, 4}), true);
    b.register_tensor("experts.w2", view(vb, {2, 5}));
    b.load(saved);
    EXPECT_EQ(b.step_count("experts.w1"), 5);
    EXPECT_EQ(b.step_count("experts.w2"), 3);
    EXPECT_EQ(b.lr(), a.lr());
    std::stringstream again;
    b.save(again);
    EXPECT_EQ(again.str(), saved.str());
    train(a, 4, 99);
    train(b, 4, 99);
    ASSERT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(bf16)), 0);
    ASSERT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0);
    std::stringstream sa, sb;
    a.save(sa);
    b.save(sb);
    EXPECT_EQ(sa.str(), sb.str());
  }
}

TEST(Optim, LoadRejectsMismatches) {
  std::vector<float> w(12, 1.f);
  ExpertOptimizer a(AdamW{});
  a.register_tensor("layers.0.down_proj", view(w, {2, 3, 2}));
  std::stringstream saved;
  a.save(saved);
  const std::string bytes = saved.str();
  auto load_into = [&](ExpertOptimizer& o, const std::string& data) {
    std::stringstream in(data);
    o.load(in);
  };
  auto expect_error = [&](ExpertOptimizer& o, const std::string& data, const std::string& needle) {
    try {
      load_into(o, data);
      ADD_FAILURE() << "expected an Error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    std::vector<float> other(12, 0.f);
    ExpertOptimizer b(AdamW{});
    b.register_tensor("layers.0.down_proj", view(other, {2, 2, 3}));
    expect_error(b, bytes, "layers.0.down_proj");
    expect_error(b, bytes, "[2, 3, 2]");
    EXPECT_EQ(b.step_count("layers.0.down_proj"), 0);
  }
  {
    std::vector<float> other(12, 0.f);
    ExpertOptimizer b(AdamW{});
    b.register_tensor("layers.1.down_proj", view(other, {2, 3, 2}));
    expect_error(b, bytes, "layers.0.down_proj");
  }
  {  // the rule's hyper-parameters are checked as the constructor checks them: a NaN lr in the file
    std::string bad = bytes;
    const size_t lr_at = 8 + 4;  // after the 8-byte magic and the rule's uint32 kind (save()'s layout)
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(bad.data() + lr_at, &nan, sizeof(nan));
    std::vector<float> other(12, 0.f);
    ExpertOptimizer b(AdamW{});
    b.register_tensor("layers.0.down_proj", view(other, {2, 3, 2}));
    expect_error(b, bad, "argument 'rule.lr': must be >= 0");
    EXPECT_EQ(b.step_count("layers.0.down_proj"), 0);
  }
  {
    std::vector<float> other(12, 0.f);
    ExpertOptimizer b(SGD{});
    b.register_tensor("layers.0.down_proj", view(other, {2, 3, 2}));
    expect_error(b, bytes, "AdamW");
  }
  {
    std::vector<float> other(12, 0.f);
    ExpertOptimizer b(AdamW{});
    b.register_tensor("layers.0.down_proj", view(other, {2, 3, 2}));
    expect_error(b, bytes.substr(0, bytes.size() - 5), "truncated");
    expect_error(b, "garbage", "not a leanmoe optimizer state");
  }
}

TEST(Optim, StepAndRegisterErrorsNameTheTensor) {
  std::vector<float> w(12, 1.f), g(12, 0.f);
  ExpertOptimizer opt(AdamW{});
  opt.register_tensor("layers.2.gate_up_proj", view(w, {2, 2, 3}));
  try {
    opt.step("layers.2.gate_up_proj", view(g, {2, 3, 2}));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.2.gate_up_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
  EXPECT_EQ(opt.step_count("layers.2.gate_up_proj"), 0);
  EXPECT_THROW(opt.step("nope", view(g, {2, 2, 3})), Error);
  EXPECT_THROW(opt.register_tensor("layers.2.gate_up_proj", view(w, {2, 2, 3})), Error);
  std::vector<float> f(4);
  EXPECT_THROW(opt.register_tensor("f32_master", view(f, {4}), true), Error);
  EXPECT_THROW(opt.set_lr(-1.f), Error);
  std::vector<bf16> gb(12);
  Tensor strided = view(gb, {2, 2, 3});
  strided.stride[0] = 7;
  EXPECT_THROW(opt.step("layers.2.gate_up_proj", strided), Error);
}

// ---- bf16 moments (register_tensor's `moments`): fp32 math, the moments rounded to bf16 on store ----
namespace {

std::vector<float> state_as_float(const ExpertOptimizer& opt, const std::string& name, StateKind kind) {
  const Tensor t = opt.state(name, kind);
  if (t.dtype == DType::f32) return state_values(opt, name, kind);
  std::vector<float> out(size_t(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(t.ptr<bf16>()[i]);
  return out;
}

double round_bf16(double x) { return bf16_to_float(float_to_bf16(float(x))); }

// |got - want| <= rel * max(|want|, floor): a bf16 value rounded the other way once (one ulp, 2^-8
// relative) keeps that absolute error while the value later shrinks, so the bound is relative to
// the larger of the value and the scale the trajectory passed through (`floor`).
void expect_close_floor(const std::vector<float>& got, const std::vector<double>& want, double rel, double floor) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * std::max(floor, std::abs(want[i]))) << "element " << i;
}

double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / double(v.size()));
}

}  // namespace

TEST(Optim, Bf16MomentsFirstStepIsTheRoundedFp32Step) {
  // From zero state both optimizers compute the same fp32 moments and parameter: the parameter step
  // uses the moments before their rounding, so it is bit for bit the fp32-moment step, and the stored
  // moments are bf16 of the fp32 ones.
  const size_t N = 256;
  const std::vector<float> init = randn(N, 3);
  std::vector<bf16> a = to_bf16(init), b = a;
  const AdamW rule{5e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  ExpertOptimizer f32m(rule), b16m(rule);
  f32m.register_tensor("w", view(a, {16, 16}));
  b16m.register_tensor("w", view(b, {16, 16}), false, DType::bf16);
  EXPECT_EQ(b16m.state("w", StateKind::exp_avg).dtype, DType::bf16);
  EXPECT_EQ(b16m.state_bytes() * 2, f32m.state_bytes());
  std::vector<bf16> g = to_bf16(randn(N, 300));
  f32m.step("w", view(g, {16, 16}));
  b16m.step("w", view(g, {16, 16}));
  ASSERT_EQ(std::memcmp(a.data(), b.data(), N * sizeof(bf16)), 0);
  for (StateKind k : {StateKind::exp_avg, StateKind::exp_avg_sq}) {
    const std::vector<float> m32 = state_values(f32m, "w", k);
    const Tensor m16 = b16m.state("w", k);
    for (size_t i = 0; i < N; ++i) ASSERT_EQ(m16.ptr<bf16>()[i].bits, float_to_bf16(m32[i]).bits) << i;
  }
  // Later steps read the rounded moments: the two runs part (the rounding is real).
  int differ = 0;
  for (int s = 1; s < 8; ++s) {
    g = to_bf16(randn(N, 300 + s));
    f32m.step("w", view(g, {16, 16}));
    b16m.step("w", view(g, {16, 16}));
  }
  for (size_t i = 0; i < N; ++i) differ += a[i].bits != b[i].bits;
  EXPECT_GT(differ, 0);
}

TEST(Optim, Bf16MomentsMatchRoundedDoubleReference) {
  // The same formula in double, the moments and the parameter rounded to bf16 after every step: the
  // float kernel may round a value the other way where double and float straddle a bf16 rounding
  // boundary (one bf16 ulp, 2^-8 relative), so 2^-7 leaves margin (expect_close_floor: parameters
  // move by <= ~0.12 over the 6 steps, so a value now small was at most ~0.25 when it flipped; the
  // moments' scale is their RMS). A wrong formula (bias correction, decay) is off by >= 1e-2.
  const size_t N = 512;
  std::vector<bf16> p = to_bf16(randn(N, 4));
  const AdamW rule{2e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  ExpertOptimizer opt(rule);
  opt.register_tensor("w", view(p, {N}), false, DType::bf16);
  AdamWRef ref{{}, std::vector<double>(N), std::vector<double>(N)};
  for (bf16 x : p) ref.p.push_back(bf16_to_float(x));
  for (int s = 0; s < 6; ++s) {
    std::vector<bf16> g = to_bf16(randn(N, 400 + s));
    std::vector<float> gf(N);
    for (size_t i = 0; i < N; ++i) gf[i] = bf16_to_float(g[i]);
    opt.step("w", view(g, {N}));
    ref.step(rule, gf);
    for (size_t i = 0; i < N; ++i) {
      ref.p[i] = round_bf16(ref.p[i]);
      ref.m[i] = round_bf16(ref.m[i]);
      ref.v[i] = round_bf16(ref.v[i]);
    }
    std::vector<float> pf(N);
    for (size_t i = 0; i < N; ++i) pf[i] = bf16_to_float(p[i]);
    expect_close_floor(pf, ref.p, 0x1p-7, 0.25);
    expect_close_floor(state_as_float(opt, "w", StateKind::exp_avg), ref.m, 0x1p-7, rms(ref.m));
    expect_close_floor(state_as_float(opt, "w", StateKind::exp_avg_sq), ref.v, 0x1p-7, rms(ref.v));
  }
}

TEST(Optim, Bf16MomentumSgdMatchesRoundedDoubleReference) {
  const size_t N = 256;
  std::vector<bf16> p = to_bf16(randn(N, 5));
  const SGD rule{5e-2f, 0.9f, 1e-3f, true};
  ExpertOptimizer opt(rule);
  opt.register_tensor("w", view(p, {N}), false, DType::bf16);
  EXPECT_EQ(opt.state("w", StateKind::momentum).dtype, DType::bf16);
  std::vector<double> rp(N), rb(N);
  for (size_t i = 0; i < N; ++i) rp[i] = bf16_to_float(p[i]);
  for (int s = 0; s < 5; ++s) {
    std::vector<bf16> g = to_bf16(randn(N, 500 + s));
    opt.step("w", view(g, {N}));
    for (size_t i = 0; i < N; ++i) {
      const double gi = double(bf16_to_float(g[i])) + double(rule.weight_decay) * rp[i];
      const double b = double(rule.momentum) * rb[i] + gi;
      rp[i] = round_bf16(rp[i] - double(rule.lr) * (gi + double(rule.momentum) * b));
      rb[i] = round_bf16(b);
    }
    std::vector<float> pf(N);
    for (size_t i = 0; i < N; ++i) pf[i] = bf16_to_float(p[i]);
    expect_close_floor(pf, rp, 0x1p-7, 0.5);
    expect_close_floor(state_as_float(opt, "w", StateKind::momentum), rb, 0x1p-7, rms(rb));
  }
}

TEST(Optim, Bf16MomentsSaveLoadAndRules) {
  std::vector<bf16> wa = to_bf16(randn(32, 6)), wb = wa;
  const AdamW rule{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  ExpertOptimizer a(rule);
  a.register_tensor("w", view(wa, {4, 8}), false, DType::bf16);
  auto train = [](ExpertOptimizer& o, int steps, uint64_t seed) {
    for (int s = 0; s < steps; ++s) {
      std::vector<bf16> g = to_bf16(randn(32, seed + s));
      o.step("w", view(g, {4, 8}));
    }
  };
  train(a, 3, 20);
  std::stringstream saved;
  a.save(saved);
  wb = wa;
  ExpertOptimizer b(rule);
  b.register_tensor("w", view(wb, {4, 8}), false, DType::bf16);
  b.load(saved);
  train(a, 3, 40);
  train(b, 3, 40);
  ASSERT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(bf16)), 0);
  std::stringstream sa, sb;
  a.save(sa);
  b.save(sb);
  EXPECT_EQ(sa.str(), sb.str());
  {  // a bf16-moment state does not load where f32 moments are kept (and the other way round)
    std::vector<bf16> wc = wa;
    ExpertOptimizer c(rule);
    c.register_tensor("w", view(wc, {4, 8}));
    std::stringstream in(sa.str());
    try {
      c.load(in);
      ADD_FAILURE() << "loaded bf16 moments into f32 ones";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("moment dtype differs"), std::string::npos) << e.what();
    }
    std::stringstream f32_state;
    c.save(f32_state);
    try {
      b.load(f32_state);
      ADD_FAILURE() << "loaded f32 moments into bf16 ones";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("saved as f32, kept here as bf16"), std::string::npos) << e.what();
    }
  }
  // Unsupported combinations name the argument.
  std::vector<float> f(8);
  ExpertOptimizer o(rule);
  auto expect_moments_error = [&](auto call, const char* needle) {
    try {
      call();
      ADD_FAILURE() << "expected an Error containing '" << needle << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("argument 'moments'"), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  };
  expect_moments_error([&] { o.register_tensor("f", view(f, {8}), false, DType::bf16); }, "bf16 parameters only");
  expect_moments_error([&] { o.register_tensor("m", view(wa, {4, 8}), true, DType::bf16); }, "master");
  expect_moments_error([&] { o.register_tensor("i", view(wa, {4, 8}), false, DType::i32); }, "f32 or bf16");
  EXPECT_FALSE(o.has_tensor("m"));
}

// The rule's hyper-parameters follow torch's rules, refused by name when the optimizer is made (and by
// update_tensor): lr, eps, weight decay and momentum >= 0, betas in [0, 1), Nesterov with momentum.
// Before, AdamW{.lr = -1} was taken by the constructor although set_lr(-1) is refused, and a beta1 of
// 1.5 made the bias correction negative.
TEST(Optim, RuleHyperParametersRefusedByName) {
  struct Bad {
    Rule rule;
    const char* name;
  };
  const Bad bad[] = {{AdamW{.lr = -1.f}, "lr"},         {AdamW{.beta1 = 1.5f}, "beta1"},
                     {AdamW{.beta2 = 1.f}, "beta2"},     {AdamW{.eps = -1e-8f}, "eps"},
                     {AdamW{.weight_decay = -0.1f}, "weight_decay"}, {AdamW{.lr = NAN}, "lr"},
                     {SGD{.momentum = -0.9f}, "momentum"}, {SGD{.lr = 1e-2f, .momentum = 0.f, .nesterov = true}, "nesterov"},
                     {SGD{.weight_decay = -1.f}, "weight_decay"}};
  std::vector<float> p(8, 0.5f), g(8, 0.1f);
  const Tensor param = Tensor::contiguous(p.data(), DType::f32, Device::cpu, {2, 4});
  const Tensor grad = Tensor::contiguous(g.data(), DType::f32, Device::cpu, {2, 4});
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.name);
    const std::string arg = std::string("argument 'rule.") + b.name + "'";
    expect_error([&] { ExpertOptimizer{b.rule}; }, {"ExpertOptimizer", arg.c_str()});
    expect_error([&] { update_tensor(b.rule, 1, param, grad, UpdateState{}); }, {"update_tensor", arg.c_str()});
  }
  ExpertOptimizer ok{SGD{.lr = 0.f, .momentum = 0.f}};  // lr 0 and momentum 0 are valid
}
