// Expert parallelism on the GPU: P ranks as threads on ONE GPU (DeviceThreadCommunicator below:
// each rank has its own stream and device buffers; all_to_all_v is cudaMemcpyAsync between the
// ranks' device buffers) against the single-GPU CUDA layer on the concatenated batch
// [rank 0's tokens; rank 1's; ...] with the same weights (reference::run_backend). One test runs
// the real NCCL communicator at P = 1, so NCCL's all_to_all_v / all_reduce path runs once.
// Fresh random bf16 inputs per case; skipped when no GPU is visible.
//
// What to expect (docs/ep.md, src/cuda/ep_layer.cpp): every expert GEMM on an owner sees the same
// rows in the same order as on one GPU, the GEMM launch configuration depends only on the static
// shape and the row capacity, and a row's result does not depend on its tile neighbours; the
// gather-sums run in the same order. The only different computations are the cuBLAS router GEMMs
// over T_r instead of T rows (cuBLAS may choose another algorithm for another shape: last-bit
// differences in logits and gates, and in dz·Wr) and dWr, which EP rounds to bf16 per rank before
// the sum over ranks. Hence:
//  - P = 1 (and per-rank token rounding against one GPU per rank's tokens, same shapes): bitwise.
//  - P > 1: expert counts equal; out, dx, dW1, dW2 bitwise where cuBLAS picked the same algorithm,
//    else one bf16 ulp (2^-8 relative) on a few elements; dWr within the per-rank bf16 rounding
//    (2^-9 relative per partial). kTol = 1e-2 (norm-wise relative) holds both with margin while a
//    lost row, gate or token is O(1). The number of bitwise-different elements is printed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "../ep_thread_communicator.h"
#include "leanmoe/ep.h"
#include "naive_moe.h"

namespace leanmoe::testing {
namespace {

using reference::HostLayerInputs;
using Vec = std::vector<float>;

constexpr double kTol = 1e-2;

bool have_cuda() { return backend_available(Device::cuda); }

#define REQUIRE_GPU() \
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device visible"

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("test_ep_gpu: ") + what + ": " + cudaGetErrorString(e));
}

// P ranks as threads on one GPU, device memory. Each collective: wait for this rank's stream (its
// send buffer is written), publish, barrier, copy the peers' parts with cudaMemcpyAsync on this
// rank's stream, wait for it, barrier (no peer reuses a buffer another is still reading). Test
// infrastructure, not a transport.
class DeviceThreadCommunicator final : public ep::Communicator {
 public:
  DeviceThreadCommunicator(ThreadGroup& group, int rank) : group_(group), rank_(rank) {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~DeviceThreadCommunicator() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  Device device() const override { return Device::cuda; }
  Stream stream() const override { return stream_; }
  void synchronize() override { cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                    const int64_t* recv_counts, const int64_t* recv_offsets, size_t elem_bytes) override {
    synchronize();
    group_.slot(rank_) = {send, send_counts, send_offsets, nullptr};
    group_.arrive_and_wait();
    std::string mismatch;
    for (int p = 0; p < size() && mismatch.empty(); ++p) {
      const ThreadGroup::Slot& peer = group_.slot(p);
      if (peer.send_counts[rank_] != recv_counts[p]) {
        mismatch = "DeviceThreadCommunicator: argument 'recv_counts': rank " + std::to_string(rank_) + " expects " +
                   std::to_string(recv_counts[p]) + " elements from rank " + std::to_string(p) + ", which sends " +
                   std::to_string(peer.send_counts[rank_]);
      } else if (recv_counts[p] > 0) {
        cuda_check(cudaMemcpyAsync(static_cast<char*>(recv) + recv_offsets[p] * elem_bytes,
                                   static_cast<const char*>(peer.send) + peer.send_offsets[rank_] * elem_bytes,
                                   size_t(recv_counts[p]) * elem_bytes, cudaMemcpyDeviceToDevice, stream_),
                   "cudaMemcpyAsync");
      }
    }
    synchronize();
    group_.arrive_and_wait();
    if (!mismatch.empty()) throw Error(mismatch);
  }

  // Summed on the host in rank order, so every rank gets the same bits.
  void all_reduce_sum(float* data, int64_t count) override {
    synchronize();
    group_.slot(rank_) = {nullptr, nullptr, nullptr, data};
    group_.arrive_and_wait();
    Vec sum(count, 0.f), part(count);
    for (int p = 0; p < size(); ++p) {
      cuda_check(cudaMemcpy(part.data(), group_.slot(p).values, count * sizeof(float), cudaMemcpyDeviceToHost),
                 "cudaMemcpy");
      for (int64_t i = 0; i < count; ++i) sum[i] += part[i];
    }
    group_.arrive_and_wait();
    cuda_check(cudaMemcpyAsync(data, sum.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync");
    synchronize();
  }

 private:
  ThreadGroup& group_;
  int rank_;
  cudaStream_t stream_ = nullptr;
};

// A bf16 device tensor filled from host values (or with 0xFF bytes = NaN, so unwritten output shows).
class DeviceBf16 {
 public:
  DeviceBf16(std::initializer_list<int64_t> shape, const float* values = nullptr) {
    int64_t count = 1;
    for (int64_t s : shape) count *= s;
    buf_ = Buffer(Device::cuda, size_t(count) * 2);
    std::vector<bf16> host(count);
    if (values)
      for (int64_t i = 0; i < count; ++i) host[i] = float_to_bf16(values[i]);
    else
      for (bf16& b : host) b.bits = 0xFFFF;
    copy_to_device(Device::cuda, buf_.data(), host.data(), host.size() * 2);
    t_ = buf_.view(DType::bf16, shape);
  }
  const Tensor& t() const { return t_; }
  Vec values() const {
    std::vector<bf16> host(t_.numel());
    copy_to_host(Device::cuda, host.data(), t_.data, host.size() * 2);
    Vec v(host.size());
    for (size_t i = 0; i < host.size(); ++i) v[i] = bf16_to_float(host[i]);
    return v;
  }

 private:
  Buffer buf_;
  Tensor t_;
};

struct EpResult {
  Vec out, dx, d_router, d_gate_up, d_down;  // d_router: summed over ranks (fp32 sum of bf16 values)
  std::vector<int32_t> expert_counts;
  float grad_norm = 0.f;                    // ep::global_grad_norm over dWr, dW1, dW2
  std::vector<ExpertWeight> callback_order;  // rank 0's
};

double sum_squares(const Vec& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return s;
}

// Rank comm.rank()'s share of the whole problem `in`, split by tokens_per_rank; writes its token
// rows and expert slices into r.
void run_rank(const HostLayerInputs& in, const std::vector<int64_t>& tokens_per_rank, ep::Communicator& comm,
              EpResult& r, std::mutex& mutex) {
  const MoEConfig& c = in.cfg;
  const int P = comm.size(), q = comm.rank();
  const int64_t d = c.d, n = c.n, E = c.E, El = E / P, e0 = q * El, Tr = tokens_per_rank[q];
  int64_t t0 = 0;
  for (int p = 0; p < q; ++p) t0 += tokens_per_rank[p];
  DeviceBf16 x({Tr, d}, &in.x[t0 * d]), d_out({Tr, d}, &in.d_out[t0 * d]), router({E, d}, in.router.data());
  DeviceBf16 gate_up({El, 2 * n, d}, &in.gate_up[e0 * 2 * n * d]), down({El, d, n}, &in.down[e0 * d * n]);
  DeviceBf16 out({Tr, d}), dx({Tr, d}), d_router({E, d}), d_gate_up({El, 2 * n, d}), d_down({El, d, n});
  const MoEWeights w{router.t(), gate_up.t(), down.t()};
  ep::ExpertParallelLayer layer(c, comm);
  layer.forward(x.t(), w, out.t());
  std::vector<ExpertWeight> order;
  layer.backward(d_out.t(), w, {dx.t(), d_router.t(), d_gate_up.t(), d_down.t()},
                 [&](ExpertWeight which, const Tensor& grad) {
                   EXPECT_EQ(grad.shape[0], El) << "the callback sees the local slice";
                   EXPECT_EQ(grad.device, Device::cuda);
                   order.push_back(which);
                 });
  comm.synchronize();
  const Vec o = out.values(), g = dx.values(), dwr = d_router.values(), dw1 = d_gate_up.values(),
            dw2 = d_down.values();
  const std::vector<int64_t> counts = layer.local_expert_counts();
  // Clipping norm of the expert slices, each counted on its owner, through the communicator
  // (device staging + all_reduce_sum); finish_norm adds the squares of the summed dWr.
  const float expert_norm = ep::global_grad_norm(float(sum_squares(dw1) + sum_squares(dw2)), comm);
  std::lock_guard<std::mutex> lock(mutex);
  std::copy(o.begin(), o.end(), r.out.begin() + t0 * d);
  std::copy(g.begin(), g.end(), r.dx.begin() + t0 * d);
  std::copy(dw1.begin(), dw1.end(), r.d_gate_up.begin() + e0 * 2 * n * d);
  std::copy(dw2.begin(), dw2.end(), r.d_down.begin() + e0 * d * n);
  for (size_t i = 0; i < dwr.size(); ++i) r.d_router[i] += dwr[i];
  for (int64_t e = 0; e < El; ++e) r.expert_counts[e0 + e] = int32_t(counts[e]);
  if (q == 0) {
    r.callback_order = order;
    r.grad_norm = expert_norm;  // completed with dWr by the caller
  }
}

EpResult make_result(const HostLayerInputs& in) {
  const MoEConfig& c = in.cfg;
  EpResult r;
  r.out.assign(in.T * c.d, 0.f);
  r.dx.assign(in.T * c.d, 0.f);
  r.d_router.assign(c.E * c.d, 0.f);
  r.d_gate_up.assign(c.E * 2 * c.n * c.d, 0.f);
  r.d_down.assign(c.E * c.d * c.n, 0.f);
  r.expert_counts.assign(c.E, 0);
  return r;
}

void finish_norm(EpResult& r) {
  r.grad_norm = float(std::sqrt(double(r.grad_norm) * r.grad_norm + sum_squares(r.d_router)));
}

EpResult run_ep(const HostLayerInputs& in, const std::vector<int64_t>& tokens_per_rank) {
  EpResult r = make_result(in);
  std::mutex mutex;
  run_ranks<DeviceThreadCommunicator>(int(tokens_per_rank.size()), [&](DeviceThreadCommunicator& comm) {
    run_rank(in, tokens_per_rank, comm, r, mutex);
  });
  finish_norm(r);
  return r;
}

HostLayerInputs make_inputs(MoEConfig c, int64_t T, uint64_t seed) {
  return reference::random_inputs(c, T, DType::bf16, seed);
}

MoEConfig config(int64_t E, int64_t K, RouterConvention router) {
  MoEConfig c;
  c.d = 128;  // the expert GEMMs take multiples of 64
  c.n = 64;
  c.E = E;
  c.K = K;
  c.router = router;
  return c;
}

int64_t bitwise_differences(const Vec& a, const Vec& b) {
  int64_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return diff;
}

// `bitwise`: every output must equal the single GPU's bit for bit (P = 1: identical shapes).
void expect_match(const EpResult& ep, const HostLayerInputs& in, const std::string& what, bool bitwise = false) {
  SCOPED_TRACE(what + ": " + in.cfg.describe() + " T=" + std::to_string(in.T));
  const reference::HostLayerOutputs one = reference::run_backend(in, Device::cuda);
  EXPECT_EQ(ep.expert_counts, one.expert_counts);
  const std::pair<const char*, std::pair<const Vec*, const Vec*>> pairs[] = {
      {"out", {&ep.out, &one.out}},           {"dx", {&ep.dx, &one.dx}},
      {"d_gate_up_proj", {&ep.d_gate_up, &one.d_gate_up}}, {"d_down_proj", {&ep.d_down, &one.d_down}},
      {"d_router (sum over ranks)", {&ep.d_router, &one.d_router}}};
  for (const auto& [name, v] : pairs) {
    const double err = reference::rel_error(*v.first, *v.second);
    const int64_t differ = bitwise_differences(*v.first, *v.second);
    std::cout << "[ep-gpu] " << what << " " << name << ": rel " << err << ", " << differ << " of " << v.first->size()
              << " elements differ bitwise\n";
    EXPECT_LE(err, kTol) << name;
    if (bitwise) {
      EXPECT_EQ(differ, 0) << name << " should be bitwise equal";
    }
  }
  const double one_norm =
      std::sqrt(sum_squares(one.d_router) + sum_squares(one.d_gate_up) + sum_squares(one.d_down));
  EXPECT_NEAR(ep.grad_norm, one_norm, kTol * one_norm) << "global gradient norm";
}

TEST(EpGpu, TwoRanksMatchOneGpu) {
  REQUIRE_GPU();
  const HostLayerInputs in = make_inputs(config(8, 2, RouterConvention::softmax_then_topk), 37 + 90, 11);
  const EpResult ep = run_ep(in, {37, 90});
  expect_match(ep, in, "P=2");
  EXPECT_EQ(ep.callback_order, (std::vector<ExpertWeight>{ExpertWeight::down_proj, ExpertWeight::gate_up_proj}));
}

TEST(EpGpu, FourRanksRaggedMatchOneGpu) {
  REQUIRE_GPU();
  // A rank with one token, counts not multiples of 128, renormalised gates.
  const HostLayerInputs in = make_inputs(config(16, 4, RouterConvention::topk_then_softmax), 1 + 130 + 77 + 256, 12);
  expect_match(run_ep(in, {1, 130, 77, 256}), in, "P=4");
}

TEST(EpGpu, FourRanksNormTopKProbManyTokens) {
  REQUIRE_GPU();
  MoEConfig c = config(32, 8, RouterConvention::softmax_then_topk);
  c.norm_topk_prob = true;
  c.d = 256;
  c.n = 192;
  const HostLayerInputs in = make_inputs(c, 4 * 700, 13);
  expect_match(run_ep(in, {700, 700, 700, 700}), in, "P=4 wide");
}

TEST(EpGpu, OneRankIsBitwiseTheSingleGpuLayer) {
  REQUIRE_GPU();
  const HostLayerInputs in = make_inputs(config(8, 2, RouterConvention::softmax_then_topk), 200, 14);
  expect_match(run_ep(in, {200}), in, "P=1", /*bitwise=*/true);
}

TEST(EpGpu, IdleRankAndHotExpert) {
  REQUIRE_GPU();
  // x[:, 0] = 1; router column 0: +20 for expert 0 (every token's first choice), -20 for experts
  // 6 and 7 (never chosen): with E = 8 on 4 ranks, rank 3 receives no rows at all (T_loc = 0) and
  // its expert gradients must be zeros; rank 0 receives every token.
  HostLayerInputs in = make_inputs(config(8, 2, RouterConvention::softmax_then_topk), 50 + 3 + 64 + 20, 15);
  const int64_t d = in.cfg.d;
  for (int64_t t = 0; t < in.T; ++t) in.x[t * d] = 1.f;
  in.router[0 * d] = 20.f;
  in.router[6 * d] = -20.f;
  in.router[7 * d] = -20.f;
  const EpResult ep = run_ep(in, {50, 3, 64, 20});
  EXPECT_EQ(ep.expert_counts[0], in.T);
  EXPECT_EQ(ep.expert_counts[6] + ep.expert_counts[7], 0);
  expect_match(ep, in, "P=4 idle rank");
  for (size_t i = 6 * 2 * in.cfg.n * d; i < ep.d_gate_up.size(); ++i) ASSERT_EQ(ep.d_gate_up[i], 0.f);
  for (size_t i = 6 * d * in.cfg.n; i < ep.d_down.size(); ++i) ASSERT_EQ(ep.d_down[i], 0.f);
}

TEST(EpGpu, PerRankTokenRoundingIsEachRanksOwnRounding) {
  REQUIRE_GPU();
  // docs/ep.md: each rank rounds its own tokens. So a token's out and dx are those of one GPU
  // running only that rank's tokens with all experts (same router GEMM shape, rows independent:
  // bitwise), and each expert's rows on its owner are the sum of those runs' counts (each a tile
  // multiple or that rank's T_r).
  MoEConfig c = config(8, 2, RouterConvention::softmax_then_topk);
  c.routing = Routing::token_rounding;
  c.tile = 16;
  const std::vector<int64_t> ranks = {40, 17, 64, 5};
  for (RoundingMode mode : {RoundingMode::nearest, RoundingMode::up, RoundingMode::down}) {
    c.rounding_mode = mode;
    const HostLayerInputs in = make_inputs(c, 40 + 17 + 64 + 5, 16);
    const EpResult ep = run_ep(in, ranks);
    std::vector<int32_t> want(c.E, 0);
    int64_t t0 = 0;
    for (int64_t Tr : ranks) {
      SCOPED_TRACE(std::string("mode ") + rounding_mode_name(mode) + ", rank starting at token " + std::to_string(t0));
      HostLayerInputs part = in;
      part.T = Tr;
      part.x.assign(in.x.begin() + t0 * c.d, in.x.begin() + (t0 + Tr) * c.d);
      part.d_out.assign(in.d_out.begin() + t0 * c.d, in.d_out.begin() + (t0 + Tr) * c.d);
      const reference::HostLayerOutputs one = reference::run_backend(part, Device::cuda);
      for (int64_t e = 0; e < c.E; ++e) {
        want[e] += one.expert_counts[e];
        // A tile multiple, or the rank's T_r (the cap at T; the 5-token rank is below the tile).
        EXPECT_TRUE(one.expert_counts[e] % c.tile == 0 || one.expert_counts[e] == Tr) << "expert " << e;
      }
      const auto rows = [&](const Vec& v) { return Vec(v.begin() + t0 * c.d, v.begin() + (t0 + Tr) * c.d); };
      EXPECT_EQ(bitwise_differences(rows(ep.out), one.out), 0) << "out";
      EXPECT_EQ(bitwise_differences(rows(ep.dx), one.dx), 0) << "dx";
      t0 += Tr;
    }
    EXPECT_EQ(ep.expert_counts, want) << rounding_mode_name(mode);
  }
}

TEST(EpGpu, NcclOneRankMatchesSingleGpu) {
  REQUIRE_GPU();
  if (!ep::nccl_available()) {
    GTEST_SKIP() << "built without NCCL";
  }
  const HostLayerInputs in = make_inputs(config(8, 2, RouterConvention::topk_then_softmax), 150, 17);
  std::vector<std::unique_ptr<ep::Communicator>> comms = ep::make_nccl_communicators({0});
  ASSERT_EQ(comms.size(), 1u);
  EpResult r = make_result(in);
  std::mutex mutex;
  run_rank(in, {in.T}, *comms[0], r, mutex);
  finish_norm(r);
  expect_match(r, in, "NCCL P=1", /*bitwise=*/true);
  // all_reduce_sum over NCCL on a device buffer (one rank: the identity).
  Buffer buf(Device::cuda, 3 * sizeof(float));
  const float v[3] = {1.5f, -2.f, 3.25f};
  copy_to_device(Device::cuda, buf.data(), v, sizeof(v));
  comms[0]->all_reduce_sum(static_cast<float*>(buf.data()), 3);
  comms[0]->synchronize();
  float back[3];
  copy_to_host(Device::cuda, back, buf.data(), sizeof(back));
  EXPECT_EQ(std::memcmp(back, v, sizeof(v)), 0);
}

TEST(EpGpu, RejectsF32StorageAndHostTensors) {
  REQUIRE_GPU();
  const MoEConfig c = config(4, 2, RouterConvention::softmax_then_topk);
  run_ranks<DeviceThreadCommunicator>(1, [&](DeviceThreadCommunicator& comm) {
    ep::ExpertParallelLayer layer(c, comm);
    Buffer xf(Device::cuda, 8 * c.d * 4), outf(Device::cuda, 8 * c.d * 4);
    DeviceBf16 router({c.E, c.d}), gate_up({c.E, 2 * c.n, c.d}), down({c.E, c.d, c.n});
    const MoEWeights w{router.t(), gate_up.t(), down.t()};
    try {
      layer.forward(xf.view(DType::f32, {8, c.d}), w, outf.view(DType::f32, {8, c.d}));
      ADD_FAILURE() << "f32 storage on cuda must be rejected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
    }
    std::vector<bf16> host_x(8 * c.d);
    DeviceBf16 out({8, c.d});
    try {
      layer.forward(Tensor::contiguous(host_x.data(), DType::bf16, Device::cpu, {8, c.d}), w, out.t());
      ADD_FAILURE() << "host tensors with a cuda communicator must be rejected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("argument 'x'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("must be on cuda"), std::string::npos) << e.what();
    }
  });
  MoEConfig odd = c;
  odd.d = 96;  // not a multiple of 64
  EXPECT_THROW(run_ranks<DeviceThreadCommunicator>(1, [&](DeviceThreadCommunicator& comm) {
                 ep::ExpertParallelLayer layer(odd, comm);
               }),
               Error);
}

}  // namespace
}  // namespace leanmoe::testing
