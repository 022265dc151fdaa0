// One test per argument rule of forward/backward: each must throw leanmoe::Error whose message
// names the function, the argument and the rule. None of these calls reaches a backend's compute.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../src/validate.h"
#include "expect_error.h"
#include "leanmoe/leanmoe.h"
#include "reference_checks.h"

using namespace leanmoe;

namespace {


// A valid f32 call on the CPU (T = 8, d = 16, n = 8, E = 4, K = 2); each test breaks one thing.
struct Args {
  MoEConfig cfg;
  int64_t T = 8;
  DType dt = DType::f32;
  std::vector<float> x_v, r_v, w1_v, w2_v, out_v, dout_v, dx_v, dr_v, dw1_v, dw2_v, loss_v = {0, 0}, dloss_v = {1, 1};
  Tensor x, out, losses, d_out, d_losses;
  MoEWeights w;
  MoEGrads g;
  LayerMemory mem;

  static MoEConfig base_config() { return leanmoe::testing::small_config(/*d=*/16, /*n=*/8, /*E=*/4, /*K=*/2); }
  Tensor make(std::vector<float>& v, std::initializer_list<int64_t> shape) {
    int64_t count = 1;
    for (int64_t s : shape) count *= s;
    v.assign(size_t(count), 0.5f);
    return Tensor::contiguous(v.data(), DType::f32, Device::cpu, shape);
  }
  Args() : cfg(base_config()), mem(cfg, 8, DType::f32, Device::cpu) {
    const int64_t d = cfg.d, n = cfg.n, E = cfg.E;
    x = make(x_v, {T, d});
    w = {make(r_v, {E, d}), make(w1_v, {E, 2 * n, d}), make(w2_v, {E, d, n})};
    out = make(out_v, {T, d});
    losses = Tensor::contiguous(loss_v.data(), DType::f32, Device::cpu, {2});
    d_out = make(dout_v, {T, d});
    d_losses = Tensor::contiguous(dloss_v.data(), DType::f32, Device::cpu, {2});
    g = {make(dx_v, {T, d}), make(dr_v, {E, d}), make(dw1_v, {E, 2 * n, d}), make(dw2_v, {E, d, n})};
  }
  void fwd() { forward(cfg, x, w, out, losses, mem.saved(), mem.forward_workspace()); }
  // Backward validation only needs saved.x set (as forward would); no forward compute runs here.
  void bwd() {
    if (!mem.saved().x.defined()) mem.saved().x = x;
    backward(cfg, d_out, d_losses, w, mem.saved(), g, mem.backward_workspace());
  }
};

// The same data, dtype and device viewed with another (contiguous) shape.
Tensor with_shape(const Tensor& t, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(t.data, t.dtype, t.device, shape, t.device_index);
}

}  // namespace

// ------------------------------------------------------------------------------------------ config
TEST(BadInput, ConfigWidthsMustBePositive) {
  for (const char* field : {"d", "n", "E", "K"}) {
    Args a;
    int64_t& v = std::string(field) == "d" ? a.cfg.d : std::string(field) == "n" ? a.cfg.n
                                                     : std::string(field) == "E" ? a.cfg.E
                                                                                 : a.cfg.K;
    v = 0;
    const std::string rule = std::string("cfg.") + field + " must be > 0";
    expect_error([&] { a.fwd(); }, {"leanmoe::forward", "argument 'cfg'", rule.c_str()});
  }
}

TEST(BadInput, ConfigKAtMostE) {
  Args a;
  a.cfg.K = 5;
  expect_error([&] { a.fwd(); }, {"argument 'cfg'", "cfg.K must be <= cfg.E = 4", "K = 5"});
  expect_error([&] { plan_layer(a.cfg, 8, DType::f32, Device::cpu); }, {"plan_layer", "argument 'cfg'", "cfg.K"});
}

TEST(BadInput, ConfigTileForTokenRounding) {
  Args a;
  a.cfg.routing = Routing::token_rounding;
  a.cfg.tile = 0;
  expect_error([&] { a.fwd(); }, {"argument 'cfg'", "cfg.tile must be > 0"});
}

TEST(BadInput, ConfigLossCoefficientsFinite) {
  Args a;
  a.cfg.aux_loss_coef = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { a.fwd(); }, {"argument 'cfg'", "cfg.aux_loss_coef must be finite"});
  Args b;
  b.cfg.z_loss_coef = std::numeric_limits<float>::infinity();
  expect_error([&] { b.bwd(); }, {"leanmoe::backward", "argument 'cfg'", "cfg.z_loss_coef must be finite"});
}

// ----------------------------------------------------------------------------------------------- x
TEST(BadInput, XMustBeGiven) {
  Args a;
  a.x = Tensor{};
  expect_error([&] { a.fwd(); }, {"argument 'x'", "must be given"});
}

// T = 0 is a valid call (tests/test_training_loop.cpp); a negative row count is not.
TEST(BadInput, NegativeTokens) {
  Args a;
  a.x.shape[0] = -1;
  expect_error([&] { a.fwd(); }, {"argument 'x'", "T = shape[0] >= 0"});
}

TEST(BadInput, XMustBe2DWithWidthD) {
  Args a;
  a.x = with_shape(a.x, {8 * 16});
  expect_error([&] { a.fwd(); }, {"argument 'x'", "2-D [T, d] with d = cfg.d = 16", "f32[128] on cpu"});
  a.x = with_shape(a.x, {16, 8});
  expect_error([&] { a.fwd(); }, {"argument 'x'", "d = cfg.d = 16", "f32[16, 8]"});
}

TEST(BadInput, XDtypeMustBeBf16OrF32) {
  Args a;
  a.x.dtype = DType::i32;
  expect_error([&] { a.fwd(); }, {"argument 'x'", "bf16 or f32", "i32[8, 16]"});
}

TEST(BadInput, XMustBeContiguous) {
  Args a;
  a.x.stride[0] = 32;  // every other row of a wider buffer
  expect_error([&] { a.fwd(); }, {"argument 'x'", "contiguous"});
}

TEST(BadInput, XMustNotBeNull) {
  Args a;
  a.x.data = nullptr;
  expect_error([&] { a.fwd(); }, {"argument 'x'", "null"});
}

// ----------------------------------------------------------------------------------------- weights
TEST(BadInput, WeightsMustBeGiven) {
  Args a;
  a.w.gate_up_proj = Tensor{};
  expect_error([&] { a.fwd(); }, {"argument 'w.gate_up_proj'", "must be given", "[E, 2n, d] = [4, 16, 16]"});
}

TEST(BadInput, WeightShapes) {
  Args a;
  a.w.router = with_shape(a.w.router, {16, 4});
  expect_error([&] { a.fwd(); }, {"argument 'w.router'", "[E, d] = [4, 16]", "f32[16, 4]"});
  Args b;
  b.w.gate_up_proj = with_shape(b.w.gate_up_proj, {4, 8, 32});
  expect_error([&] { b.fwd(); }, {"argument 'w.gate_up_proj'", "[E, 2n, d] = [4, 16, 16]"});
  Args c;
  c.w.down_proj = with_shape(c.w.down_proj, {4, 8, 16});  // [E, n, d]: the transposed layout
  expect_error([&] { c.fwd(); }, {"argument 'w.down_proj'", "[E, d, n] = [4, 16, 8]"});
}

TEST(BadInput, WeightDtypeMustMatchX) {
  Args a;
  a.w.down_proj.dtype = DType::bf16;
  expect_error([&] { a.fwd(); }, {"argument 'w.down_proj'", "dtype f32", "storage dtype of x"});
}

TEST(BadInput, WeightDeviceMustMatchX) {
  Args a;
  a.w.router.device = Device::cuda;
  expect_error([&] { a.fwd(); }, {"argument 'w.router'", "same device as x (cpu:0)", "on cuda"});
  Args b;
  b.w.gate_up_proj.device_index = 1;
  expect_error([&] { b.fwd(); }, {"argument 'w.gate_up_proj'", "same device as x", "cpu:1"});
}

TEST(BadInput, WeightMustBeContiguousAndNonNull) {
  Args a;
  a.w.gate_up_proj.stride[2] = 2;
  expect_error([&] { a.fwd(); }, {"argument 'w.gate_up_proj'", "contiguous"});
  Args b;
  b.w.down_proj.data = nullptr;
  expect_error([&] { b.fwd(); }, {"argument 'w.down_proj'", "null"});
}

// ------------------------------------------------------------------------------------ out / losses
TEST(BadInput, OutShapeDtypeDevice) {
  Args a;
  a.out = with_shape(a.out, {4, 32});
  expect_error([&] { a.fwd(); }, {"argument 'out'", "[T, d] = [8, 16]"});
  Args b;
  b.out.dtype = DType::bf16;
  expect_error([&] { b.fwd(); }, {"argument 'out'", "dtype f32"});
  Args c;
  c.out.device = Device::cuda;
  expect_error([&] { c.fwd(); }, {"argument 'out'", "same device as x"});
  Args e;
  e.out = Tensor{};
  expect_error([&] { e.fwd(); }, {"argument 'out'", "must be given"});
}

TEST(BadInput, LossesMustBeF32Pair) {
  Args a;
  a.losses.dtype = DType::bf16;
  expect_error([&] { a.fwd(); }, {"argument 'losses'", "dtype f32"});
  Args b;
  b.losses = with_shape(b.losses, {1});
  expect_error([&] { b.fwd(); }, {"argument 'losses'", "[2] = [2]"});
  Args c;
  c.losses.device = Device::cuda;
  expect_error([&] { c.fwd(); }, {"argument 'losses'", "same device as x"});
}

// ------------------------------------------------------------------------------------------ saved
TEST(BadInput, SavedMadeForOtherT) {
  Args a;
  LayerMemory other(a.cfg, 4, DType::f32, Device::cpu);
  expect_error([&] { forward(a.cfg, a.x, a.w, a.out, a.losses, other.saved(), a.mem.forward_workspace()); },
               {"argument 'saved'", "T = 8", "saved.T = 4"});
}

TEST(BadInput, SavedMadeForOtherConfig) {
  Args a;
  MoEConfig k1 = a.cfg;
  k1.K = 1;
  LayerMemory other(k1, 8, DType::f32, Device::cpu);
  expect_error([&] { forward(a.cfg, a.x, a.w, a.out, a.losses, other.saved(), a.mem.forward_workspace()); },
               {"argument 'saved'", "rows_capacity"});
}

TEST(BadInput, SavedMadeForOtherDtype) {
  Args a;
  LayerMemory other(a.cfg, 8, DType::bf16, Device::cpu);
  expect_error([&] { forward(a.cfg, a.x, a.w, a.out, a.losses, other.saved(), a.mem.forward_workspace()); },
               {"argument 'saved.h'", "dtype f32"});
}

TEST(BadInput, SavedMadeForOtherDevice) {
  Args a;
  a.mem.saved().row_gate.device = Device::cuda;
  expect_error([&] { a.fwd(); }, {"argument 'saved.row_gate'", "same device as x"});
}

// ------------------------------------------------------------------------------------- workspace
// A backend that accepts nothing fancy, to test the rules that depend on the backend's answers.
class StrictBackend : public detail::Backend {
 public:
  std::string reason;
  Device device() const override { return Device::cpu; }
  std::string description() const override { return "strict test backend"; }
  void* allocate(size_t) override { return nullptr; }
  void deallocate(void*) override {}
  void copy(void*, const void*, size_t, detail::CopyKind) override {}
  void synchronize() override {}
  std::string unsupported_reason(const MoEConfig&, DType) const override { return reason; }
  size_t forward_workspace_bytes(const MoEConfig&, int64_t, DType) const override { return 1024; }
  size_t backward_workspace_bytes(const MoEConfig&, int64_t, DType) const override { return 2048; }
  bool all_finite(const Tensor&) override { return true; }
  void forward(const detail::ForwardArgs&) override {}
  void backward(const detail::BackwardArgs&) override {}
};

TEST(BadInput, WorkspaceTooSmall) {
  Args a;
  StrictBackend be;
  std::vector<char> ws(2048);
  detail::ForwardArgs f{a.cfg, a.x, a.w, a.out, a.losses, a.mem.saved(), {ws.data(), 1023}, nullptr};
  expect_error([&] { detail::validate_forward(f, be); },
               {"leanmoe::forward", "argument 'ws'", "forward_workspace_bytes = 1024", "1023 bytes"});
  a.mem.saved().x = a.x;
  detail::BackwardArgs b{a.cfg, a.d_out, a.d_losses, a.w, a.mem.saved(), a.g, {ws.data(), 2047}, nullptr, nullptr};
  expect_error([&] { detail::validate_backward(b, be); },
               {"leanmoe::backward", "argument 'ws'", "backward_workspace_bytes = 2048"});
}

TEST(BadInput, WorkspaceNull) {
  Args a;
  StrictBackend be;
  detail::ForwardArgs f{a.cfg, a.x, a.w, a.out, a.losses, a.mem.saved(), {nullptr, 4096}, nullptr};
  expect_error([&] { detail::validate_forward(f, be); }, {"argument 'ws'", "null"});
}

// The library's own CPU plan: a workspace one byte short of it is refused by the public API.
TEST(BadInput, WorkspaceShortOfPlan) {
  Args a;
  const size_t need = a.mem.plan().forward_workspace_bytes;
  if (need == 0) GTEST_SKIP() << "the CPU backend needs no forward workspace for this shape";
  Workspace ws = a.mem.forward_workspace();
  ws.bytes = need - 1;
  expect_error([&] { forward(a.cfg, a.x, a.w, a.out, a.losses, a.mem.saved(), ws); }, {"argument 'ws'"});
}

TEST(BadInput, BackendUnsupportedWidthNamesConfigAndBackend) {
  Args a;
  StrictBackend be;
  be.reason = "cfg.d must be a multiple of 64";
  std::vector<char> ws(4096);
  detail::ForwardArgs f{a.cfg, a.x, a.w, a.out, a.losses, a.mem.saved(), {ws.data(), ws.size()}, nullptr};
  expect_error([&] { detail::validate_forward(f, be); },
               {"argument 'cfg'", "cfg.d must be a multiple of 64", "strict test backend", "d=16"});
}

// ---------------------------------------------------------------------------------- check_finite
TEST(BadInput, NonFiniteInputsWhenChecking) {
  Args a;
  a.cfg.check_finite = true;
  a.x_v[5] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { a.fwd(); }, {"argument 'x'", "finite", "cfg.check_finite"});
  Args b;
  b.cfg.check_finite = true;
  b.w2_v[7] = std::numeric_limits<float>::infinity();
  expect_error([&] { b.fwd(); }, {"argument 'w.down_proj'", "finite"});
  Args c;
  c.cfg.check_finite = true;
  c.dout_v[3] = -std::numeric_limits<float>::infinity();
  expect_error([&] { c.bwd(); }, {"leanmoe::backward", "argument 'd_out'", "finite"});
}

// -------------------------------------------------------------------------------------- backward
TEST(BadInput, BackwardBeforeForward) {
  Args a;
  expect_error([&] { backward(a.cfg, a.d_out, a.d_losses, a.w, a.mem.saved(), a.g, a.mem.backward_workspace()); },
               {"leanmoe::backward", "argument 'saved'", "forward"});
}

TEST(BadInput, DOutMustMatchSavedT) {
  Args a;
  a.d_out = with_shape(a.d_out, {4, 16});
  expect_error([&] { a.bwd(); }, {"argument 'd_out'", "saved.T = 8"});
  Args b;
  b.d_out = with_shape(b.d_out, {8 * 16});
  expect_error([&] { b.bwd(); }, {"argument 'd_out'", "2-D [T, d]"});
}

TEST(BadInput, DOutDtypeMustMatchSavedX) {
  Args a;
  a.d_out.dtype = DType::bf16;
  expect_error([&] { a.bwd(); }, {"argument 'saved.x'", "dtype bf16", "d_out"});
}

TEST(BadInput, DLossesMustBeF32Pair) {
  Args a;
  a.d_losses.dtype = DType::i32;
  expect_error([&] { a.bwd(); }, {"argument 'd_losses'", "dtype f32"});
  Args b;
  b.d_losses = with_shape(b.d_losses, {3});
  expect_error([&] { b.bwd(); }, {"argument 'd_losses'", "[2] = [2]"});
}

TEST(BadInput, GradShapesDtypesDevices) {
  Args a;
  a.g.dx = with_shape(a.g.dx, {16, 8});
  expect_error([&] { a.bwd(); }, {"argument 'grads.dx'", "[T, d] = [8, 16]"});
  Args b;
  b.g.d_router.dtype = DType::bf16;
  expect_error([&] { b.bwd(); }, {"argument 'grads.d_router'", "dtype f32"});
  Args c;
  c.g.d_gate_up_proj.device = Device::cuda;
  expect_error([&] { c.bwd(); }, {"argument 'grads.d_gate_up_proj'", "same device as d_out"});
  Args e;
  e.g.d_down_proj = with_shape(e.g.d_down_proj, {4, 8, 16});
  expect_error([&] { e.bwd(); }, {"argument 'grads.d_down_proj'", "[E, d, n] = [4, 16, 8]"});
  Args f;
  f.g.d_down_proj.stride[0] = 1;
  expect_error([&] { f.bwd(); }, {"argument 'grads.d_down_proj'", "contiguous"});
}

TEST(BadInput, BackwardWeightsChecked) {
  Args a;
  a.w.router = Tensor{};
  expect_error([&] { a.bwd(); }, {"leanmoe::backward", "argument 'w.router'", "must be given"});
}

TEST(BadInput, BackwardSavedMustMatchDevice) {
  Args a;
  a.mem.saved().x = a.x;
  a.mem.saved().x.device = Device::cuda;
  expect_error([&] { a.bwd(); }, {"argument 'saved.x'", "same device as d_out"});
}

// A view's shape: at most kMaxDims dims, none negative (a negative one gave a negative numel and,
// through Buffer::view, a refusal of 2^64-ish bytes), each refusal naming 'shape'.
TEST(BadInput, ContiguousShapeRules) {
  float f = 0;
  expect_error([&] { Tensor::contiguous(&f, DType::f32, Device::cpu, {1, 1, 1, 1, 1}); },
               {"argument 'shape'", "at most 4 dims", "got 5"});
  expect_error([&] { Tensor::contiguous(&f, DType::f32, Device::cpu, {-1, 2}); },
               {"argument 'shape'", "must be >= 0", "[-1, 2]"});
  Buffer b(Device::cpu, 16);
  expect_error([&] { b.view(DType::f32, {4, -1}); }, {"argument 'shape'", "must be >= 0", "[4, -1]"});
  EXPECT_EQ(Tensor::contiguous(nullptr, DType::f32, Device::cpu, {0, 3}).numel(), 0);
}

// The storage dtype is bf16 or f32, refused by name where the layer is planned (before, plan_layer,
// make_saved_state and LayerMemory sized an i32 or e4m3 layer and forward refused it later as 'x').
TEST(BadInput, StorageDtypeRefusedWhenPlanned) {
  MoEConfig cfg;
  cfg.d = 8, cfg.n = 4, cfg.E = 3, cfg.K = 2;
  for (DType dt : {DType::i32, DType::e4m3}) {
    expect_error([&] { plan_layer(cfg, 4, dt, Device::cpu); }, {"plan_layer", "argument 'dtype'", "bf16 or f32"});
    expect_error([&] { LayerMemory(cfg, 4, dt, Device::cpu); }, {"argument 'dtype'", "bf16 or f32"});
    std::vector<char> buf(1 << 16);
    expect_error([&] { make_saved_state(cfg, 4, dt, Device::cpu, buf.data(), buf.size()); },
                 {"make_saved_state", "argument 'dtype'", "bf16 or f32", dtype_name(dt)});
  }
}
