// The CUDA backend under what a training loop sends it (issue 14), as tests/test_training_loop.cpp
// does on the CPU: T = 0 tokens on a non-blocking stream (no empty grid is launched: forward writes
// no rows and losses {0, 0}, backward zero weight gradients handed over in docs/SPEC.md §6 order), outputs
// aliasing inputs refused, and device pointers that break the kernels' 16-byte vector access
// refused naming the argument. Skipped when no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "leanmoe/leanmoe.h"

namespace {

using namespace leanmoe;

bool have_cuda() { return backend_available(Device::cuda); }

#define REQUIRE_GPU() \
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device visible"

MoEConfig config() {
  MoEConfig c;
  c.d = 128;  // the expert GEMMs take multiples of 64
  c.n = 64;
  c.E = 8;
  c.K = 2;
  c.aux_loss_coef = 0.01f;
  return c;
}

std::vector<unsigned char> to_host(const Tensor& t) {
  std::vector<unsigned char> h(t.nbytes());
  if (!h.empty()) copy_to_host(Device::cuda, h.data(), t.data, h.size());
  return h;
}

void fill_device(const Buffer& b, unsigned char byte) {
  std::vector<unsigned char> h(b.bytes(), byte);
  copy_to_device(Device::cuda, b.data(), h.data(), h.size());
}

// Weights of `config()` on the GPU (values do not matter: nothing is routed or checked by value).
struct Weights {
  MoEConfig c = config();
  Buffer router{Device::cuda, size_t(c.E * c.d * 2)}, gate_up{Device::cuda, size_t(c.E * 2 * c.n * c.d * 2)},
      down{Device::cuda, size_t(c.E * c.d * c.n * 2)};
  MoEWeights view() const {
    return {router.view(DType::bf16, {c.E, c.d}), gate_up.view(DType::bf16, {c.E, 2 * c.n, c.d}),
            down.view(DType::bf16, {c.E, c.d, c.n})};
  }
};

}  // namespace

TEST(TrainingLoopGpu, ZeroTokensOnAStream) {
  REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (Routing routing : {Routing::topk, Routing::token_rounding}) {
    MoEConfig c = config();
    c.routing = routing;
    SCOPED_TRACE(c.describe());
    Weights w;
    LayerMemory mem(c, 0, DType::bf16, Device::cuda);
    const Tensor empty = Tensor::contiguous(nullptr, DType::bf16, Device::cuda, {0, c.d});
    Buffer losses(Device::cuda, 8), d_router(Device::cuda, w.router.bytes()),
        d_gate_up(Device::cuda, w.gate_up.bytes()), d_down(Device::cuda, w.down.bytes());
    for (const Buffer* b : {&losses, &d_router, &d_gate_up, &d_down}) fill_device(*b, 0xff);  // NaN bits
    forward(c, empty, w.view(), empty, losses.view(DType::f32, {2}), mem.saved(), mem.forward_workspace(), stream);
    const MoEGrads g{empty, d_router.view(DType::bf16, {c.E, c.d}), d_gate_up.view(DType::bf16, {c.E, 2 * c.n, c.d}),
                     d_down.view(DType::bf16, {c.E, c.d, c.n})};
    std::vector<ExpertWeight> order;
    backward(c, empty, Tensor{}, w.view(), mem.saved(), g, mem.backward_workspace(),
             [&](ExpertWeight which, const Tensor&) { order.push_back(which); }, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(order, (std::vector<ExpertWeight>{ExpertWeight::down_proj, ExpertWeight::gate_up_proj}));
    float host_losses[2] = {1.f, 1.f};
    copy_to_host(Device::cuda, host_losses, losses.data(), sizeof host_losses);
    EXPECT_EQ(host_losses[0], 0.f);
    EXPECT_EQ(host_losses[1], 0.f);
    std::vector<int32_t> offsets(size_t(c.E + 1), -1);
    copy_to_host(Device::cuda, offsets.data(), mem.saved().expert_offsets.data, offsets.size() * 4);
    EXPECT_EQ(offsets, std::vector<int32_t>(size_t(c.E + 1), 0));
    for (const Tensor* t : {&g.d_router, &g.d_gate_up_proj, &g.d_down_proj})
      for (unsigned char byte : to_host(*t)) ASSERT_EQ(byte, 0) << "a weight gradient is not exactly zero";
  }
  cudaStreamDestroy(stream);
}

TEST(TrainingLoopGpu, RefusesAliasingAndMisalignedPointers) {
  REQUIRE_GPU();
  const MoEConfig c = config();
  const int64_t T = 64;
  Weights w;
  LayerMemory mem(c, T, DType::bf16, Device::cuda);
  Buffer x(Device::cuda, size_t(T * c.d * 2 + 16)), out(Device::cuda, size_t(T * c.d * 2));
  const Tensor x_t = x.view(DType::bf16, {T, c.d});
  auto expect_error = [](const std::function<void()>& call, const std::string& a, const std::string& b) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected an error naming '" << a << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(a), std::string::npos) << what;
      EXPECT_NE(what.find(b), std::string::npos) << what;
    }
  };
  expect_error([&] { forward(c, x_t, w.view(), x_t, Tensor{}, mem.saved(), mem.forward_workspace()); },
               "argument 'out'", "must not overlap x");
  // One bf16 element past a 16-byte boundary: the gather loads rows in 16-byte vectors.
  const Tensor shifted = Tensor::contiguous(static_cast<char*>(x.data()) + 2, DType::bf16, Device::cuda, {T, c.d});
  expect_error([&] { forward(c, shifted, w.view(), out.view(DType::bf16, {T, c.d}), Tensor{}, mem.saved(),
                             mem.forward_workspace()); },
               "argument 'x'", "16-byte aligned");
  // A caller-made saved state whose i32 array is off its 4-byte grid.
  SavedState odd = mem.saved();
  odd.expert_offsets.data = static_cast<char*>(odd.expert_offsets.data) + 2;
  expect_error([&] { forward(c, x_t, w.view(), out.view(DType::bf16, {T, c.d}), Tensor{}, odd,
                             mem.forward_workspace()); },
               "argument 'saved.expert_offsets'", "aligned to its element size");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // nothing was launched with a bad pointer
}
