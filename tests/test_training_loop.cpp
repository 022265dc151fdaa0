// The C++ API under what a training loop sends it (issue 14): T = 0 tokens (an expert-parallel rank
// or a packed batch with none) works on every config, and an output that aliases an input, another
// output or the workspace is refused naming both arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "expect_error.h"
#include "leanmoe/leanmoe.h"
#include "reference_checks.h"

using namespace leanmoe;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<MoEConfig> zero_token_configs() {
  MoEConfig c = leanmoe::testing::small_config(/*d=*/16, /*n=*/8, /*E=*/4, /*K=*/2);
  c.aux_loss_coef = 0.1f;
  c.z_loss_coef = 0.01f;
  std::vector<MoEConfig> all;
  for (Routing routing : {Routing::topk, Routing::token_rounding})
    for (RouterConvention router : {RouterConvention::softmax_then_topk, RouterConvention::topk_then_softmax}) {
      c.routing = routing;
      c.router = router;
      all.push_back(c);
    }
  return all;
}

// Storage for `count` elements of either dtype, filled with NaN bits (an unwritten element shows).
std::vector<uint32_t> nan_storage(int64_t count) { return std::vector<uint32_t>(size_t(count), 0x7fc07fc0u); }

}  // namespace

// T = 0: forward writes no rows (expert_offsets all 0) and losses {0, 0}; backward writes every
// weight gradient as exact zeros and hands both expert gradients to the callback in docs/SPEC.md §6
// order; x, out, d_out and dx are empty tensors without memory (data = null, as torch's).
TEST(TrainingLoop, ZeroTokensForwardAndBackward) {
  for (const MoEConfig& c : zero_token_configs())
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(leanmoe::testing::describe_case(c, 0, dt));
      const int64_t d = c.d, n = c.n, E = c.E;
      LayerMemory mem(c, 0, dt, Device::cpu);
      std::vector<uint32_t> wr = nan_storage(E * d), w1 = nan_storage(E * 2 * n * d), w2 = nan_storage(E * d * n);
      for (auto* v : {&wr, &w1, &w2}) std::fill(v->begin(), v->end(), 0x3f803f80u);  // 1.0 in bf16 pairs, ~1 in f32
      const MoEWeights w{Tensor::contiguous(wr.data(), dt, Device::cpu, {E, d}),
                         Tensor::contiguous(w1.data(), dt, Device::cpu, {E, 2 * n, d}),
                         Tensor::contiguous(w2.data(), dt, Device::cpu, {E, d, n})};
      const Tensor empty = Tensor::contiguous(nullptr, dt, Device::cpu, {0, d});
      float losses[2] = {kNaN, kNaN};
      const Tensor loss_t = Tensor::contiguous(losses, DType::f32, Device::cpu, {2});
      std::fill(mem.saved().expert_offsets.ptr<int32_t>(), mem.saved().expert_offsets.ptr<int32_t>() + E + 1, -7);
      forward(c, empty, w, empty, loss_t, mem.saved(), mem.forward_workspace());
      EXPECT_EQ(losses[0], 0.f);
      EXPECT_EQ(losses[1], 0.f);
      for (int64_t e = 0; e <= E; ++e) EXPECT_EQ(mem.saved().expert_offsets.ptr<int32_t>()[e], 0);
      EXPECT_EQ(mem.saved().token_offsets.ptr<int32_t>()[0], 0);

      std::vector<uint32_t> dr = nan_storage(E * d), dw1 = nan_storage(E * 2 * n * d), dw2 = nan_storage(E * d * n);
      const MoEGrads g{empty, Tensor::contiguous(dr.data(), dt, Device::cpu, {E, d}),
                       Tensor::contiguous(dw1.data(), dt, Device::cpu, {E, 2 * n, d}),
                       Tensor::contiguous(dw2.data(), dt, Device::cpu, {E, d, n})};
      std::vector<ExpertWeight> order;
      backward(c, empty, Tensor{}, w, mem.saved(), g, mem.backward_workspace(),
               [&](ExpertWeight which, const Tensor&) { order.push_back(which); });
      EXPECT_EQ(order, (std::vector<ExpertWeight>{ExpertWeight::down_proj, ExpertWeight::gate_up_proj}));
      for (const Tensor* t : {&g.d_router, &g.d_gate_up_proj, &g.d_down_proj}) {
        const auto* bytes = static_cast<const unsigned char*>(t->data);
        for (size_t i = 0; i < t->nbytes(); ++i) ASSERT_EQ(bytes[i], 0) << "a weight gradient is not exactly zero";
      }
    }
}

// ---------------------------------------------------------------------------------------- aliasing
namespace {

// A valid f32 call on the CPU (T = 8); each test points one output at memory it must not share.
struct Call {
  MoEConfig cfg = leanmoe::testing::small_config(/*d=*/16, /*n=*/8, /*E=*/4, /*K=*/2);
  int64_t T = 8;
  std::vector<float> x_v, r_v, w1_v, w2_v, out_v, dout_v, dx_v, dr_v, grad_v, loss_v = {0, 0};
  Tensor x, out, losses, d_out;
  MoEWeights w;
  MoEGrads g;
  LayerMemory mem{cfg, 8, DType::f32, Device::cpu};

  Tensor make(std::vector<float>& v, std::initializer_list<int64_t> shape) {
    int64_t count = 1;
    for (int64_t s : shape) count *= s;
    v.assign(size_t(count), 0.25f);
    return Tensor::contiguous(v.data(), DType::f32, Device::cpu, shape);
  }
  Call() {
    const int64_t d = cfg.d, n = cfg.n, E = cfg.E;
    x = make(x_v, {T, d});
    w = {make(r_v, {E, d}), make(w1_v, {E, 2 * n, d}), make(w2_v, {E, d, n})};
    out = make(out_v, {T, d});
    losses = Tensor::contiguous(loss_v.data(), DType::f32, Device::cpu, {2});
    d_out = make(dout_v, {T, d});
    // One buffer holds dW1 [E, 2n, d]; dW2 [E, d, n] gets its own unless a test shares it.
    grad_v.assign(size_t(E * 2 * n * d + E * d * n), 0.f);
    g = {make(dx_v, {T, d}), make(dr_v, {E, d}),
         Tensor::contiguous(grad_v.data(), DType::f32, Device::cpu, {E, 2 * n, d}),
         Tensor::contiguous(grad_v.data() + E * 2 * n * d, DType::f32, Device::cpu, {E, d, n})};
  }
  void fwd() { forward(cfg, x, w, out, losses, mem.saved(), mem.forward_workspace()); }
  void bwd(const ExpertGradCallback& cb = nullptr) {
    fwd();
    backward(cfg, d_out, Tensor{}, w, mem.saved(), g, mem.backward_workspace(), cb);
  }
};

Tensor alias(const Tensor& t, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(t.data, t.dtype, t.device, shape, t.device_index);
}

}  // namespace

TEST(TrainingLoop, ForwardOutputsMustNotAliasInputs) {
  {
    Call c;
    c.out = c.x;  // in place: saved.x references x, so backward would read the output
    expect_error([&] { c.fwd(); }, {"leanmoe::forward", "argument 'out'", "must not overlap x"});
  }
  {
    Call c;
    c.out = alias(c.w.gate_up_proj, {c.T, c.cfg.d});
    expect_error([&] { c.fwd(); }, {"argument 'out'", "must not overlap w.gate_up_proj"});
  }
  {
    Call c;
    c.losses = alias(c.out, {2});
    expect_error([&] { c.fwd(); }, {"must not overlap", "both are written"});
  }
  {
    Call c;
    c.out = alias(Tensor::contiguous(c.mem.saved().h.data, DType::f32, Device::cpu, {1}), {c.T, c.cfg.d});
    expect_error([&] { c.fwd(); }, {"argument 'saved.h'", "must not overlap out"});
  }
  {
    Call c;
    Workspace ws = c.mem.forward_workspace();
    c.out = Tensor::contiguous(ws.data, DType::f32, Device::cpu, {c.T, c.cfg.d});
    expect_error([&] { c.fwd(); }, {"argument 'out'", "must not overlap ws"});
  }
}

TEST(TrainingLoop, BackwardGradientsMustNotAliasInputs) {
  {
    Call c;
    c.g.dx = c.d_out;
    expect_error([&] { c.bwd(); }, {"leanmoe::backward", "argument 'grads.dx'", "must not overlap d_out"});
  }
  {
    Call c;
    c.g.dx = c.x;  // saved.x is x
    expect_error([&] { c.bwd(); }, {"argument 'grads.dx'", "must not overlap saved.x"});
  }
  {
    Call c;
    c.g.d_router = c.w.router;
    expect_error([&] { c.bwd(); }, {"argument 'grads.d_router'", "must not overlap w.router"});
  }
  {
    Call c;
    c.g.d_down_proj = alias(c.g.d_gate_up_proj, {c.cfg.E, c.cfg.d, c.cfg.n});  // dW2 in the front of dW1
    // Without a callback both gradients are returned, so they may not share memory...
    expect_error([&] { c.bwd(); }, {"grads.d_gate_up_proj", "must not overlap grads.d_down_proj"});
    // ...with one, dW2 is consumed before dW1 is written (how in-backward updates save memory).
    int calls = 0;
    EXPECT_NO_THROW(c.bwd([&](ExpertWeight, const Tensor&) { ++calls; }));
    EXPECT_EQ(calls, 2);
  }
}
