// MoEStack: in-backward expert updates against the standard path (docs/SPEC.md §6). Same seed, same data,
// 3 layers of different sizes, 20 steps: weights and optimizer state must be bitwise equal after
// every step, for AdamW with and without fp32 master weights, SGD, and fp32 storage.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "expect_error.h"
#include "leanmoe/optim.h"

using namespace leanmoe;
using namespace leanmoe::optim;

namespace {

constexpr int64_t kT = 24;

// Layers of different E, n, K (and one with token rounding) so the shared gradient workspace must
// be sized for the largest one: layer 1 has E*2n*d = 6*48*32. Layers 3 and 4 store their experts
// transposed (gpt-oss's [E, d, W] and [E, n, d]): gpt-oss's clamped SwiGLU over interleaved columns,
// and a plain ReLU² (W = n).
std::vector<MoEConfig> layer_configs() {
  MoEConfig a{.d = 32, .n = 16, .E = 4, .K = 2};
  MoEConfig b{.d = 32, .n = 24, .E = 6, .K = 2};
  b.router = RouterConvention::topk_then_softmax;
  MoEConfig c{.d = 32, .n = 8, .E = 8, .K = 3};
  c.routing = Routing::token_rounding;
  c.tile = 4;
  c.aux_loss_coef = 0.01f;
  MoEConfig g{.d = 32, .n = 16, .E = 4, .K = 2};
  g.activation = Activation::swiglu_clamped;
  g.interleaved = g.transposed = true;
  MoEConfig p{.d = 32, .n = 24, .E = 4, .K = 1};
  p.activation = Activation::relu2;
  p.transposed = true;
  return {a, b, c, g, p};
}

struct HostTensor {
  DType dtype;
  std::vector<char> bytes;
  int64_t numel;
  HostTensor(DType t, int64_t count) : dtype(t), bytes(size_t(count) * dtype_size(t)), numel(count) {}
  Tensor view(int64_t rows, int64_t cols) { return Tensor::contiguous(bytes.data(), dtype, Device::cpu, {rows, cols}); }
  float get(int64_t i) const {
    return dtype == DType::bf16 ? bf16_to_float(reinterpret_cast<const bf16*>(bytes.data())[i])
                                : reinterpret_cast<const float*>(bytes.data())[i];
  }
  void set(int64_t i, float v) {
    if (dtype == DType::bf16)
      reinterpret_cast<bf16*>(bytes.data())[i] = float_to_bf16(v);
    else
      reinterpret_cast<float*>(bytes.data())[i] = v;
  }
};

HostTensor random_activation(DType dtype, int64_t d, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  HostTensor t(dtype, kT * d);
  for (int64_t i = 0; i < t.numel; ++i) t.set(i, dist(rng));
  return t;
}

// Loss 0.5*||out - target||^2 scaled up so the deep layers' gradients are not tiny: d_out = 8*(out - target).
void loss_gradient(const Tensor& out, const HostTensor& target, HostTensor& d_out) {
  for (int64_t i = 0; i < d_out.numel; ++i) {
    const float o = out.dtype == DType::bf16 ? bf16_to_float(out.ptr<bf16>()[i]) : out.ptr<float>()[i];
    d_out.set(i, 8.f * (o - target.get(i)));
  }
}

std::string weights_bytes(const MoEStack& s) {
  std::string all;
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const MoEWeights& w = s.weights(l);
    for (const Tensor* t : {&w.router, &w.gate_up_proj, &w.down_proj})
      all.append(static_cast<const char*>(t->data), t->nbytes());
  }
  return all;
}

std::string optimizer_bytes(const ExpertOptimizer& o) {
  std::stringstream s;
  o.save(s);
  return s.str();
}

size_t expert_grad_bytes_of_layer(const MoEConfig& c, DType dtype) {
  return size_t(c.E * (up_width(c) + c.n) * c.d) * dtype_size(dtype);  // dW1 [E, W, d] + dW2 [E, d, n]
}

// One training step on a stack; the data depend only on `step`.
void train_step(MoEStack& s, int step, DType dtype) {
  std::mt19937_64 rng(1000 + step);
  const int64_t d = s.config(0).d;
  HostTensor x = random_activation(dtype, d, rng);
  HostTensor target = random_activation(dtype, d, rng);
  HostTensor d_out(dtype, kT * d);
  s.set_lr(1e-2f / float(1 + step % 5), 5e-3f);  // a schedule: lr set every step
  const Tensor out = s.forward(x.view(kT, d));
  loss_gradient(out, target, d_out);
  s.backward(d_out.view(kT, d));
  s.step();
}

struct Case {
  const char* name;
  DType dtype;
  Rule rule;
  bool master;
};

void run_bitwise_case(const Case& c) {
  SCOPED_TRACE(c.name);
  StackOptions opt;
  opt.expert_rule = c.rule;
  opt.fp32_master = c.master;
  opt.dense_max_grad_norm = 0.5f;  // exercises dense clipping in both modes
  opt.mode = ExpertUpdateMode::standard;
  MoEStack standard(layer_configs(), kT, c.dtype, Device::cpu, opt, 7);
  opt.mode = ExpertUpdateMode::in_backward;
  MoEStack in_backward(layer_configs(), kT, c.dtype, Device::cpu, opt, 7);
  const std::string initial = weights_bytes(standard);
  ASSERT_EQ(initial, weights_bytes(in_backward));
  for (int step = 0; step < 20; ++step) {
    train_step(standard, step, c.dtype);
    train_step(in_backward, step, c.dtype);
    ASSERT_EQ(weights_bytes(standard), weights_bytes(in_backward)) << "weights differ after step " << step;
    ASSERT_EQ(optimizer_bytes(standard.expert_optimizer()), optimizer_bytes(in_backward.expert_optimizer()))
        << "expert optimizer state differs after step " << step;
    ASSERT_EQ(optimizer_bytes(standard.dense_optimizer()), optimizer_bytes(in_backward.dense_optimizer()))
        << "dense optimizer state differs after step " << step;
  }
  // The comparison means something only if training moved every expert tensor.
  for (int64_t l = 0; l < in_backward.num_layers(); ++l)
    for (const char* w : {"gate_up_proj", "down_proj"})
      EXPECT_EQ(in_backward.expert_optimizer().step_count("layers." + std::to_string(l) + "." + w), 20);
  const std::string final_weights = weights_bytes(in_backward);
  size_t off = 0;
  for (int64_t l = 0; l < in_backward.num_layers(); ++l) {
    const MoEWeights& w = in_backward.weights(l);
    for (const Tensor* t : {&w.router, &w.gate_up_proj, &w.down_proj}) {
      EXPECT_NE(initial.compare(off, t->nbytes(), final_weights, off, t->nbytes()), 0)
          << "layer " << l << " tensor unchanged by training";
      off += t->nbytes();
    }
  }
}

}  // namespace

TEST(OptimStack, InBackwardBitwiseEqualsStandardAdamW) {
  run_bitwise_case({"adamw bf16", DType::bf16, AdamW{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}, false});
}
TEST(OptimStack, InBackwardBitwiseEqualsStandardAdamWMaster) {
  run_bitwise_case({"adamw bf16 + fp32 master", DType::bf16, AdamW{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}, true});
}
TEST(OptimStack, InBackwardBitwiseEqualsStandardSgd) {
  run_bitwise_case({"sgd bf16", DType::bf16, SGD{0.05f, 0.9f, 1e-4f, false}, false});
}
TEST(OptimStack, InBackwardBitwiseEqualsStandardFp32) {
  run_bitwise_case({"adamw f32", DType::f32, AdamW{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}, false});
  run_bitwise_case({"sgd nesterov f32", DType::f32, SGD{0.05f, 0.9f, 0.f, true}, false});
}

TEST(OptimStack, GradientWorkspaceHoldsOneLayer) {
  const auto cfgs = layer_configs();
  size_t all_layers = 0, largest_layer = 0, largest_dw1 = 0;
  for (const MoEConfig& c : cfgs) {
    all_layers += expert_grad_bytes_of_layer(c, DType::bf16);
    largest_layer = std::max(largest_layer, expert_grad_bytes_of_layer(c, DType::bf16));
    largest_dw1 = std::max(largest_dw1, size_t(c.E * up_width(c) * c.d) * 2);
  }
  StackOptions opt;
  opt.mode = ExpertUpdateMode::in_backward;
  MoEStack in_backward(cfgs, kT, DType::bf16, Device::cpu, opt, 3);
  opt.mode = ExpertUpdateMode::standard;
  MoEStack standard(cfgs, kT, DType::bf16, Device::cpu, opt, 3);
  for (int step = 0; step < 3; ++step) {
    train_step(in_backward, step, DType::bf16);
    train_step(standard, step, DType::bf16);
  }
  // In-backward: dW2 and dW1 share one buffer sized for the largest layer's dW1 (E*2n*d), which is
  // within one layer's expert gradients; standard: every layer's dW1 and dW2 at once.
  EXPECT_EQ(in_backward.expert_grad_high_water_bytes(), largest_dw1);
  EXPECT_LE(in_backward.expert_grad_high_water_bytes(), largest_layer);
  EXPECT_EQ(standard.expert_grad_high_water_bytes(), all_layers);
}

TEST(OptimStack, RefusesAccumulationAndReadAfterUpdate) {
  StackOptions opt;
  opt.mode = ExpertUpdateMode::in_backward;
  opt.accumulate_gradients = true;
  try {
    MoEStack s(layer_configs(), kT, DType::bf16, Device::cpu, opt, 1);
    ADD_FAILURE() << "accumulation with in-backward updates must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("accumulat"), std::string::npos) << e.what();
  }
  opt.accumulate_gradients = false;
  MoEStack s(layer_configs(), kT, DType::bf16, Device::cpu, opt, 1);
  std::mt19937_64 rng(5);
  HostTensor x = random_activation(DType::bf16, 32, rng), d_out = random_activation(DType::bf16, 32, rng);
  s.forward(x.view(kT, 32));
  s.backward(d_out.view(kT, 32));
  // A second backward before step() is a micro-batch accumulation: the experts are already updated.
  try {
    s.backward(d_out.view(kT, 32));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("accumulation"), std::string::npos) << e.what();
  }
  // A forward (e.g. a recomputation) before step() would read weights already updated in place.
  try {
    s.forward(x.view(kT, 32));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.down_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("read after update"), std::string::npos) << e.what();
  }
  s.step();
  EXPECT_NO_THROW(s.forward(x.view(kT, 32)));
  EXPECT_THROW(s.step(), Error);  // no backward yet
}

TEST(OptimStack, SaveLoadResumesBitForBit) {
  for (bool master : {false, true}) {
    StackOptions opt;
    opt.mode = ExpertUpdateMode::in_backward;
    opt.fp32_master = master;
    MoEStack a(layer_configs(), kT, DType::bf16, Device::cpu, opt, 11);
    for (int step = 0; step < 4; ++step) train_step(a, step, DType::bf16);
    std::stringstream ckpt;
    a.save(ckpt);
    // Other seed (load must overwrite everything); with master weights also the other mode: a
    // checkpoint is mode-independent.
    if (master) opt.mode = ExpertUpdateMode::standard;
    MoEStack b(layer_configs(), kT, DType::bf16, Device::cpu, opt, 12);
    b.load(ckpt);
    for (int step = 4; step < 8; ++step) {
      train_step(a, step, DType::bf16);
      train_step(b, step, DType::bf16);
    }
    EXPECT_EQ(weights_bytes(a), weights_bytes(b));
    EXPECT_EQ(optimizer_bytes(a.expert_optimizer()), optimizer_bytes(b.expert_optimizer()));
    EXPECT_EQ(optimizer_bytes(a.dense_optimizer()), optimizer_bytes(b.dense_optimizer()));
  }
}

TEST(OptimStack, LoadRejectsOtherShapes) {
  StackOptions opt;
  MoEStack a(layer_configs(), kT, DType::bf16, Device::cpu, opt, 1);
  std::stringstream ckpt;
  a.save(ckpt);
  auto cfgs = layer_configs();
  cfgs[1].n = 32;
  MoEStack b(cfgs, kT, DType::bf16, Device::cpu, opt, 1);
  try {
    b.load(ckpt);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1"), std::string::npos) << e.what();
  }
}

// A stack runs each layer's own router, so a layer with routing given is refused when the stack is
// made (it failed at the first forward, pointing to forward_routed, which a stack user cannot call);
// so is a negative or NaN router clipping norm (a negative one silently turned clipping off).
TEST(OptimStack, RefusesRoutingGivenAndNegativeClipNorm) {
  MoEConfig c;
  c.d = 8, c.n = 4, c.E = 3, c.K = 2;
  MoEConfig given = c;
  given.routing = Routing::given;
  expect_error([&] { MoEStack({c, given}, 4, DType::f32, Device::cpu, StackOptions{}, 1); },
               {"MoEStack", "argument 'layers'", "layer 1", "routing given"});
  for (float norm : {-1.f, NAN}) {
    StackOptions o;
    o.dense_max_grad_norm = norm;
    expect_error([&] { MoEStack({c}, 4, DType::f32, Device::cpu, o, 1); },
                 {"MoEStack", "argument 'opt.dense_max_grad_norm'", ">= 0"});
  }
}
