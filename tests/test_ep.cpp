// Expert parallelism on the CPU: P ranks as threads (ep_thread_communicator.h) against one rank
// running the concatenated batch [rank 0's tokens; rank 1's tokens; ...] with the same weights.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <vector>

#include "ep_thread_communicator.h"
#include "expect_error.h"
#include "leanmoe/ep.h"
#include "leanmoe/optim.h"

namespace leanmoe::testing {
namespace {

using Vec = std::vector<float>;

Vec random_vec(std::mt19937& rng, int64_t count, float scale) {
  std::normal_distribution<float> dist(0.f, scale);
  Vec v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

// A host tensor in storage dtype (f32 or bf16), filled from and read back as fp32.
class Stored {
 public:
  Stored(DType dtype, Vec::const_iterator begin, Vec::const_iterator end) : dtype_(dtype) {
    if (dtype == DType::f32) f_.assign(begin, end);
    for (auto it = begin; dtype == DType::bf16 && it != end; ++it) b_.push_back(float_to_bf16(*it));
  }
  Stored(DType dtype, int64_t count) : dtype_(dtype) {
    if (dtype == DType::f32) f_.assign(count, 0.f);
    else b_.assign(count, float_to_bf16(0.f));
  }
  Tensor view(std::initializer_list<int64_t> shape) {
    void* data = dtype_ == DType::f32 ? static_cast<void*>(f_.data()) : static_cast<void*>(b_.data());
    return Tensor::contiguous(data, dtype_, Device::cpu, shape);
  }
  Vec values() const {
    if (dtype_ == DType::f32) return f_;
    Vec v;
    for (bf16 b : b_) v.push_back(bf16_to_float(b));
    return v;
  }

 private:
  DType dtype_;
  Vec f_;
  std::vector<bf16> b_;
};

struct Problem {
  DType dtype = DType::f32;
  MoEConfig cfg;
  std::vector<int64_t> tokens_per_rank;
  int64_t T = 0;
  Vec x, router, gate_up, down, d_out;
};

Problem make_problem(int64_t E, int64_t K, std::vector<int64_t> tokens_per_rank, uint32_t seed, int64_t d = 16,
                     int64_t n = 8) {
  Problem pb;
  pb.cfg.d = d;
  pb.cfg.n = n;
  pb.cfg.E = E;
  pb.cfg.K = K;
  pb.cfg.router = RouterConvention::topk_then_softmax;
  pb.tokens_per_rank = tokens_per_rank;
  for (int64_t t : tokens_per_rank) pb.T += t;
  std::mt19937 rng(seed);
  pb.x = random_vec(rng, pb.T * d, 1.f);
  pb.router = random_vec(rng, E * d, 0.5f);
  pb.gate_up = random_vec(rng, E * 2 * n * d, 0.3f);
  pb.down = random_vec(rng, E * d * n, 0.3f);
  pb.d_out = random_vec(rng, pb.T * d, 1.f);
  return pb;
}

struct Result {
  Vec out, dx, d_router, d_gate_up, d_down;  // d_router: summed over ranks for EP
  std::vector<int64_t> expert_counts;         // rows per expert (EP: from the owners)
  float grad_norm = 0.f;                      // over d_router, d_gate_up, d_down
};

double sum_squares(const Vec& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return s;
}

Result run_single(const Problem& pb) {
  const MoEConfig& c = pb.cfg;
  const int64_t T = pb.T, d = c.d, n = c.n, E = c.E;
  const DType dt = pb.dtype;
  Stored x(dt, pb.x.begin(), pb.x.end()), d_out(dt, pb.d_out.begin(), pb.d_out.end());
  Stored router(dt, pb.router.begin(), pb.router.end()), gate_up(dt, pb.gate_up.begin(), pb.gate_up.end()),
      down(dt, pb.down.begin(), pb.down.end());
  Stored out(dt, T * d), dx(dt, T * d), d_router(dt, E * d), d_gate_up(dt, E * 2 * n * d), d_down(dt, E * d * n);
  const MoEWeights w{router.view({E, d}), gate_up.view({E, 2 * n, d}), down.view({E, d, n})};
  LayerMemory mem(c, T, dt, Device::cpu);
  forward(c, x.view({T, d}), w, out.view({T, d}), Tensor{}, mem.saved(), mem.forward_workspace());
  const MoEGrads g{dx.view({T, d}), d_router.view({E, d}), d_gate_up.view({E, 2 * n, d}), d_down.view({E, d, n})};
  backward(c, d_out.view({T, d}), Tensor{}, w, mem.saved(), g, mem.backward_workspace());
  Result r{out.values(), dx.values(), d_router.values(), d_gate_up.values(), d_down.values(), {}, 0.f};
  const int32_t* eo = mem.saved().expert_offsets.ptr<int32_t>();
  for (int64_t e = 0; e < E; ++e) r.expert_counts.push_back(eo[e + 1] - eo[e]);
  r.grad_norm = float(std::sqrt(sum_squares(r.d_router) + sum_squares(r.d_gate_up) + sum_squares(r.d_down)));
  return r;
}

// Every rank writes its own token rows and expert slices of the global result.
// With cfg.fp8_weights_given each rank passes the codes of its own experts (Fp8WeightBuffers over
// E/P experts); edit_weights, if given, then changes a rank's weight arguments.
Result run_ep(const Problem& pb, int P, std::vector<ExpertWeight>* callback_order = nullptr,
              const std::function<void(MoEWeights&)>& edit_weights = nullptr) {
  const MoEConfig& c = pb.cfg;
  const int64_t T = pb.T, d = c.d, n = c.n, E = c.E, El = E / P;
  Result r;
  r.out.resize(T * d);
  r.dx.resize(T * d);
  r.d_router.resize(E * d);
  r.d_gate_up.resize(E * 2 * n * d);
  r.d_down.resize(E * d * n);
  r.expert_counts.resize(E);
  std::vector<int64_t> first_token(P + 1, 0);
  for (int q = 0; q < P; ++q) first_token[q + 1] = first_token[q] + pb.tokens_per_rank[q];
  std::mutex order_mutex;
  run_ranks(P, [&](ThreadCommunicator& comm) {
    const int q = comm.rank();
    const int64_t Tr = pb.tokens_per_rank[q], t0 = first_token[q], e0 = q * El;
    const DType dt = pb.dtype;
    Stored x(dt, pb.x.begin() + t0 * d, pb.x.begin() + (t0 + Tr) * d);
    Stored d_out(dt, pb.d_out.begin() + t0 * d, pb.d_out.begin() + (t0 + Tr) * d);
    Stored router(dt, pb.router.begin(), pb.router.end());
    Stored gate_up(dt, pb.gate_up.begin() + e0 * 2 * n * d, pb.gate_up.begin() + (e0 + El) * 2 * n * d);
    Stored down(dt, pb.down.begin() + e0 * d * n, pb.down.begin() + (e0 + El) * d * n);
    Stored out_s(dt, Tr * d), dx_s(dt, Tr * d), d_router_s(dt, E * d), d_gate_up_s(dt, El * 2 * n * d),
        d_down_s(dt, El * d * n);
    MoEWeights w{router.view({E, d}), gate_up.view({El, 2 * n, d}), down.view({El, d, n})};
    MoEConfig local = c;
    local.E = El;
    std::optional<optim::Fp8WeightBuffers> codes;
    if (c.fp8_weights_given) {
      codes.emplace(local, Device::cpu);
      codes->quantize(w);
      w.fp8 = codes->weights();
    }
    if (edit_weights) edit_weights(w);
    ep::ExpertParallelLayer layer(c, comm);
    layer.forward(x.view({Tr, d}), w, out_s.view({Tr, d}));
    const MoEGrads g{dx_s.view({Tr, d}), d_router_s.view({E, d}), d_gate_up_s.view({El, 2 * n, d}),
                     d_down_s.view({El, d, n})};
    layer.backward(d_out.view({Tr, d}), w, g, [&](ExpertWeight which, const Tensor& grad) {
      EXPECT_EQ(grad.shape[0], El) << "the callback sees the local slice";
      if (callback_order && q == 0) {
        std::lock_guard<std::mutex> lock(order_mutex);
        callback_order->push_back(which);
      }
    });
    Vec out = out_s.values(), dx = dx_s.values(), d_router = d_router_s.values();
    const Vec d_gate_up = d_gate_up_s.values(), d_down = d_down_s.values();
    // Local squares: expert slices on their owner; the replicated router gradient, after its
    // all-reduce, on rank 0 only.
    comm.all_reduce_sum(d_router.data(), E * d);
    const double local_sq = sum_squares(d_gate_up) + sum_squares(d_down) + (q == 0 ? sum_squares(d_router) : 0.0);
    const float norm = ep::global_grad_norm(float(local_sq), comm);

    std::copy(out.begin(), out.end(), r.out.begin() + t0 * d);
    std::copy(dx.begin(), dx.end(), r.dx.begin() + t0 * d);
    std::copy(d_gate_up.begin(), d_gate_up.end(), r.d_gate_up.begin() + e0 * 2 * n * d);
    std::copy(d_down.begin(), d_down.end(), r.d_down.begin() + e0 * d * n);
    const std::vector<int64_t> counts = layer.local_expert_counts();
    std::copy(counts.begin(), counts.end(), r.expert_counts.begin() + e0);
    if (q == 0) {
      r.d_router = d_router;
      r.grad_norm = norm;
    }
  });
  return r;
}

double rel_error(const Vec& got, const Vec& want) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    ref += double(want[i]) * want[i];
  }
  return std::sqrt(diff / std::max(ref, 1e-300));
}

// fp32 tolerance, not bitwise. EP keeps the single-rank order of every sum (docs/ep.md: the
// grouped GEMMs see the same rows in the same order, the combine is the same gather-sum), but
// OpenBLAS sgemm picks its kernels by matrix shape: the router GEMM over T_r rows and over T rows
// round differently in the last bit (measured: rows 0..10 of a 17-row product differ in 10 of 88
// values), and that propagates. Measured here: <= 1.3e-7 relative on out, dx and the expert
// gradients. d_router is also summed in a different split (per-rank dzᵀ·X, then the all-reduce).
// 1e-5 relative covers re-associated fp32 sums of <= 64 terms (unit roundoff 6e-8, a few ulps of
// growth) while a missing token, pair or gate is O(1e-2) or more. Same for the norm.
constexpr double kF32Tol = 1e-5;
// bf16 storage: both runs round at the same points (docs/DESIGN.md), so they differ only where
// the fp32-level differences above push a value across a bf16 rounding boundary (one bf16 ulp,
// 2^-8 = 4e-3, on few elements), and in d_router, which EP rounds to bf16 per rank before the
// all-reduce (2^-9 relative per partial) where one rank rounds the full sum once. 1e-2 holds that
// while a logic error is O(1).
constexpr double kBf16Tol = 1e-2;

void expect_match(const Result& ep, const Result& one, double kTol = kF32Tol) {
  EXPECT_EQ(ep.expert_counts, one.expert_counts);
  EXPECT_LT(rel_error(ep.out, one.out), kTol) << "out";
  EXPECT_LT(rel_error(ep.dx, one.dx), kTol) << "dx";
  EXPECT_LT(rel_error(ep.d_gate_up, one.d_gate_up), kTol) << "d_gate_up_proj";
  EXPECT_LT(rel_error(ep.d_down, one.d_down), kTol) << "d_down_proj";
  EXPECT_LT(rel_error(ep.d_router, one.d_router), kTol) << "d_router summed over ranks";
  EXPECT_NEAR(ep.grad_norm, one.grad_norm, kTol * one.grad_norm) << "global gradient norm";
}

TEST(ExpertParallel, TwoRanksMatchOneRank) {
  Problem pb = make_problem(8, 2, {11, 6}, 1);
  std::vector<ExpertWeight> order;
  expect_match(run_ep(pb, 2, &order), run_single(pb));
  EXPECT_EQ(order, (std::vector<ExpertWeight>{ExpertWeight::down_proj, ExpertWeight::gate_up_proj}));
}

TEST(ExpertParallel, Bf16StorageMatchesOneRank) {
  Problem pb = make_problem(8, 2, {10, 3, 7, 12}, 9);
  pb.dtype = DType::bf16;
  expect_match(run_ep(pb, 4), run_single(pb), kBf16Tol);
}

TEST(ExpertParallel, FourRanksRaggedTokensMatchOneRank) {
  Problem pb = make_problem(8, 3, {9, 1, 14, 5}, 2);
  expect_match(run_ep(pb, 4), run_single(pb));
}

TEST(ExpertParallel, RankWithoutTokens) {
  // A rank whose batch is empty (the last micro-batch split unevenly) still serves its experts:
  // it routes nothing, receives the others' pairs and joins every collective.
  Problem pb = make_problem(8, 2, {9, 0, 14, 5}, 6);
  expect_match(run_ep(pb, 4), run_single(pb));
  Problem all_but_one = make_problem(8, 2, {0, 12}, 7);
  expect_match(run_ep(all_but_one, 2), run_single(all_but_one));
}

TEST(ExpertParallel, OneRankIsTheSingleRankLayer) {
  Problem pb = make_problem(4, 2, {13}, 3);
  expect_match(run_ep(pb, 1), run_single(pb));
}

TEST(ExpertParallel, RankWhoseExpertsGetNoTokens) {
  // Feature 0 of every token is 1 and only the first rank's experts weigh it (+6), so with K = 2
  // and 2 experts per rank the last rank's experts are never chosen.
  Problem pb = make_problem(8, 2, {7, 10, 4, 6}, 4);
  const int64_t d = pb.cfg.d;
  for (int64_t t = 0; t < pb.T; ++t) pb.x[t * d] = 1.f;
  for (int64_t e = 0; e < pb.cfg.E; ++e) pb.router[e * d] = e < 2 ? 6.f : 0.f;
  const Result one = run_single(pb);
  ASSERT_EQ(one.expert_counts[6] + one.expert_counts[7], 0) << "the test needs idle experts on rank 3";
  const Result ep = run_ep(pb, 4);
  expect_match(ep, one);
  for (int64_t i = 6 * 2 * pb.cfg.n * d; i < int64_t(ep.d_gate_up.size()); ++i) ASSERT_EQ(ep.d_gate_up[i], 0.f);
}

TEST(ExpertParallel, PerRankTokenRoundingGivesTileMultiples) {
  Problem pb = make_problem(8, 2, {13, 7, 22, 5}, 5);
  pb.cfg.routing = Routing::token_rounding;
  pb.cfg.tile = 4;
  for (RoundingMode mode : {RoundingMode::nearest, RoundingMode::up, RoundingMode::down}) {
    pb.cfg.rounding_mode = mode;
    const Result ep = run_ep(pb, 4);
    int64_t rows = 0;
    for (int64_t e = 0; e < pb.cfg.E; ++e) {
      EXPECT_EQ(ep.expert_counts[e] % pb.cfg.tile, 0) << "expert " << e << " mode " << rounding_mode_name(mode);
      rows += ep.expert_counts[e];
    }
    // Rounding moves each (rank, expert) count by less than a tile around the top-K count.
    EXPECT_LT(std::abs(rows - pb.T * pb.cfg.K), pb.cfg.E * 4 * pb.cfg.tile);
    for (float v : ep.out) ASSERT_TRUE(std::isfinite(v));
  }
}

// docs/ep.md: each rank rounds its own tokens, so expert e's rows on its owner are the sum over
// ranks of what one rank rounding only that rank's tokens would route to e, and a token's output
// and dx are those of one rank running only its own rank's tokens (rows are independent).
void expect_each_ranks_own_rounding(Problem pb, int64_t tile, double tol) {
  pb.cfg.routing = Routing::token_rounding;
  pb.cfg.tile = tile;
  const Result ep = run_ep(pb, int(pb.tokens_per_rank.size()));
  std::vector<int64_t> want(pb.cfg.E, 0);
  int64_t t0 = 0;
  for (int64_t Tr : pb.tokens_per_rank) {
    Problem part = pb;
    part.T = Tr;
    part.tokens_per_rank = {Tr};
    part.x.assign(pb.x.begin() + t0 * pb.cfg.d, pb.x.begin() + (t0 + Tr) * pb.cfg.d);
    part.d_out.assign(pb.d_out.begin() + t0 * pb.cfg.d, pb.d_out.begin() + (t0 + Tr) * pb.cfg.d);
    const Result one = run_single(part);
    for (int64_t e = 0; e < pb.cfg.E; ++e) want[e] += one.expert_counts[e];
    const auto rows = [&](const Vec& v) { return Vec(v.begin() + t0 * pb.cfg.d, v.begin() + (t0 + Tr) * pb.cfg.d); };
    EXPECT_LT(rel_error(rows(ep.out), one.out), tol) << "out of the rank starting at token " << t0;
    EXPECT_LT(rel_error(rows(ep.dx), one.dx), tol) << "dx of the rank starting at token " << t0;
    t0 += Tr;
  }
  EXPECT_EQ(ep.expert_counts, want);
}

TEST(ExpertParallel, PerRankTokenRoundingIsEachRanksOwnRounding) {
  expect_each_ranks_own_rounding(make_problem(8, 2, {13, 7, 22, 5}, 8), 4, kF32Tol);
}

TEST(ExpertParallel, RejectsExpertsNotDivisibleByRanks) {
  Problem pb = make_problem(6, 2, {3, 3, 3, 3}, 6);
  EXPECT_THROW(run_ep(pb, 4), Error);
}

// A communicator that only answers rank(), size() and device(), its collectives doing nothing: for the
// constructor's refusals, which come before any communication.
class StubCommunicator final : public ep::Communicator {
 public:
  StubCommunicator(int rank, int size, Device device) : rank_(rank), size_(size), device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return device_; }
  Stream stream() const override { return nullptr; }
  void synchronize() override {}
  void all_to_all_v(const void*, const int64_t*, const int64_t*, void*, const int64_t*, const int64_t*,
                    size_t) override {}
  void all_reduce_sum(float*, int64_t) override {}

 private:
  int rank_, size_;
  Device device_;
};

// A communicator whose rank() is outside [0, size()) (a caller's own Communicator with a bug) is
// refused by name: rank 5 of 2 took the expert slice [10, 15) of E = 4 without a word.
TEST(ExpertParallel, RejectsRankOutsideSize) {
  StubCommunicator comm(5, 2, Device::cpu);
  MoEConfig cfg;
  cfg.d = 8, cfg.n = 4, cfg.E = 4, cfg.K = 2;
  expect_error([&] { ep::ExpertParallelLayer(cfg, comm); },
               {"ExpertParallelLayer", "argument 'comm'", "rank", "got 5"});
}

TEST(ExpertParallel, RejectsRouterLosses) {
  Problem pb = make_problem(4, 2, {3, 3}, 7);
  pb.cfg.aux_loss_coef = 0.01f;
  EXPECT_THROW(run_ep(pb, 2), Error);
}

// FP8 (docs/DESIGN.md "FP8"): every scale tile is one token row's (x, dO, A, dH: 1x128 along the
// GEMM's K) or one expert's (weights: 128x128 blocks), so an owner quantizes exactly what one rank
// running the concatenated batch quantizes, and its FP8 GEMMs see the same rows in the same order.
// What differs is what differs in bf16 storage (kBf16Tol): gates at the fp32 level (the router
// GEMM's shape), which can flip a bf16 rounding of A' or dH; a flipped dH value can in turn move
// its e4m3 code by one step (2^-4 relative) in dX's operand, on a few elements of the ~T·K·2n, so
// norm-wise still far below 1e-2, while a lost pair or an unquantized operand (FP8 is several
// percent off storage precision, checked below) is far above it. Measured on these tests: dx,
// dW1, dW2 bitwise equal, out within 1.2e-4, d_router 2.3e-3 (rounded to bf16 per rank before
// the sum, as in bf16 storage).
Problem fp8_problem(int64_t E, int64_t K, std::vector<int64_t> tokens_per_rank, uint32_t seed) {
  Problem pb = make_problem(E, K, tokens_per_rank, seed, 128, 128);
  pb.dtype = DType::bf16;
  pb.cfg.precision = Precision::fp8;
  return pb;
}
constexpr double kFp8Tol = kBf16Tol;

TEST(ExpertParallel, Fp8TwoRanksMatchOneRank) {
  Problem pb = fp8_problem(8, 2, {37, 21}, 11);  // T = 58, not a multiple of 128
  const Result ep = run_ep(pb, 2), one = run_single(pb);
  expect_match(ep, one, kFp8Tol);
  // FP8 really ran on both sides: storage precision is several percent away.
  Problem storage = pb;
  storage.cfg.precision = Precision::storage;
  const Result bf16 = run_single(storage);
  EXPECT_GT(rel_error(ep.out, bf16.out), 1e-2) << "out: EP in fp8 against one rank in bf16";
  EXPECT_GT(rel_error(ep.dx, bf16.dx), 1e-2) << "dx: EP in fp8 against one rank in bf16";
}

TEST(ExpertParallel, Fp8FourRanksRaggedTokensMatchOneRank) {
  const Problem pb = fp8_problem(8, 3, {45, 1, 70, 13}, 12);  // T = 129, a one-token rank
  expect_match(run_ep(pb, 4), run_single(pb), kFp8Tol);
}

TEST(ExpertParallel, Fp8RankWhoseExpertsGetNoTokens) {
  // Feature 0 of every token is 1 and the last rank's experts weigh it -60 (the other 127 features
  // give logits of std ~6), so they are never chosen; the others share the tokens at random.
  Problem pb = fp8_problem(8, 2, {19, 30, 4, 9}, 13);
  const int64_t d = pb.cfg.d;
  for (int64_t t = 0; t < pb.T; ++t) pb.x[t * d] = 1.f;
  for (int64_t e = 6; e < pb.cfg.E; ++e) pb.router[e * d] = -60.f;
  const Result one = run_single(pb);
  ASSERT_EQ(one.expert_counts[6] + one.expert_counts[7], 0) << "the test needs idle experts on rank 3";
  const Result ep = run_ep(pb, 4);
  expect_match(ep, one, kFp8Tol);
  for (int64_t i = 6 * 2 * pb.cfg.n * d; i < int64_t(ep.d_gate_up.size()); ++i) ASSERT_EQ(ep.d_gate_up[i], 0.f);
}

TEST(ExpertParallel, Fp8PerRankTokenRoundingIsEachRanksOwnRounding) {
  // In FP8 too a token's out and dx depend only on its own rows (row tiles).
  expect_each_ranks_own_rounding(fp8_problem(8, 2, {29, 7, 40, 3}, 14), 8, kFp8Tol);
}

TEST(ExpertParallel, Fp8WeightCodesGivenPerRank) {
  // Each rank passes its own E/P experts' codes (the CPU backend reads the bf16 weights, the same
  // values by the contract): the same result as quantizing per call.
  Problem pb = fp8_problem(8, 2, {23, 31}, 15);
  const Result per_call = run_ep(pb, 2);
  pb.cfg.fp8_weights_given = true;
  const Result given = run_ep(pb, 2);
  EXPECT_EQ(given.out, per_call.out);
  EXPECT_EQ(given.dx, per_call.dx);
  EXPECT_EQ(given.d_gate_up, per_call.d_gate_up);
  EXPECT_EQ(given.d_down, per_call.d_down);
  // Codes of all E experts on a rank that owns E/P of them.
  expect_error([&] { run_ep(pb, 2, nullptr, [&](MoEWeights& w) { w.fp8.gate_up_proj.codes.shape[0] = 8; }); },
                        {"ep forward: argument 'w.fp8.gate_up_proj.codes'", "[E/P, 2n, d] = [4, 256, 128]"});
  // Codes without cfg.fp8_weights_given.
  pb.cfg.fp8_weights_given = false;
  optim::Fp8WeightBuffers stray(fp8_problem(4, 2, {1}, 0).cfg, Device::cpu);
  expect_error([&] { run_ep(pb, 2, nullptr, [&](MoEWeights& w) { w.fp8 = stray.weights(); }); },
                        {"argument 'w.fp8.gate_up_proj.codes'", "must be undefined unless cfg.fp8_weights_given"});
}

TEST(ExpertParallel, Fp8Rules) {
  Problem pb = fp8_problem(4, 2, {3, 3}, 7);
  pb.dtype = DType::f32;
  expect_error([&] { run_ep(pb, 2); }, {"ep forward: argument 'cfg'", "fp8 needs bf16 storage"});
  Problem small = make_problem(4, 2, {3, 3}, 7);
  small.dtype = DType::bf16;
  small.cfg.precision = Precision::fp8;
  expect_error([&] { run_ep(small, 2); },
                        {"ExpertParallelLayer: argument 'cfg'", "cfg.d must be a multiple of 128 with cfg.precision = fp8"});
}

// A one-rank communicator that says its tensors live on the GPU; the constructor refuses FP8
// before it looks for the CUDA backend, so this runs in any build.
TEST(ExpertParallel, Fp8RefusedOnCuda) {
  StubCommunicator comm(0, 1, Device::cuda);
  expect_error([&] { ep::ExpertParallelLayer layer(fp8_problem(4, 2, {3}, 7).cfg, comm); },
               {"ExpertParallelLayer: argument 'cfg'", "FP8 in the EP layer runs on CPU ranks only: its CUDA path is "
                                                       "untested"});
}

TEST(ExpertParallel, NcclCommunicatorNeedsAComm) {
  EXPECT_THROW(ep::make_nccl_communicator(nullptr, 0, 1, 0, nullptr), Error);
}

}  // namespace
}  // namespace leanmoe::testing
