// CUDA expert-parallel layer (ep_layer.h). Per rank, on comm.stream():
//   forward:  router GEMM + the single-GPU routing kernels on this rank's T_r tokens (token
//             rounding per rank included) -> message plan and pair records (ep_kernels.cu) ->
//             count exchange -> ONE host sync (the all-to-all sizes) -> x rows and records to the
//             owners -> owner metadata built by the single-GPU build_metadata over a [T_loc, El]
//             routing matrix of the received pairs -> up_proj_act / down_proj on the received
//             rows -> Y per pair back to the origin -> the single-GPU gather-sum.
//   backward: dO rows to the owners -> dh_act_bwd, dw2, dx_expert, dw1 on the owner (the
//             in-backward callbacks see the local slices) -> dS and dX_exp per pair back -> the
//             single-GPU router backward and dx gather at the origin. No host sync.
//
// Equivalence with one GPU running the concatenated batch [rank 0's tokens; rank 1's; ...]
// (docs/ep.md): the owner's rows of expert e are the received tokens in (source rank, source
// token) order, which is the global token order, because build_metadata sorts stable by token and
// the received tokens are laid out by source rank, ascending within a source. So every expert
// GEMM sees the same rows in the same order as on one GPU, and the per-row and per-expert results
// only depend on those (grids come from rows_capacity, but no reduction is split across rows of
// different experts, and a row's result does not depend on its tile neighbours). What can differ:
// the cuBLAS router GEMMs run over T_r instead of T rows (cuBLAS may pick another algorithm for
// another shape: last-bit differences in the logits, hence in the gates), and dWr is summed per
// rank (then by the caller's all-reduce) instead of once.
//
// Memory: three grow-only arenas (stream-ordered cudaMallocAsync, so growing never syncs the host):
// the origin's (routing state kept for backward), the owner's (sized after the count exchange:
// the received x rows, H and the owner metadata kept for backward), and backward's scratch.
#include "cuda/ep_layer.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "carver.h"
#include "cuda/check.h"
#include "cuda/ep_launchers.h"
#include "cuda/expert_gemms.h"
#include "cuda/launchers.h"

namespace leanmoe::cuda {

using ep::PairRecord;
using ep::PeerCounts;

namespace {

using detail::Carver;
using bf16_bits = uint16_t;


// Grow-only device block in stream order. A peer's reads of the old block (all_to_all_v) are
// ordered before the free by the collectives themselves (every rank has passed them).
class Arena {
 public:
  ~Arena() {
    if (p_) cudaFreeAsync(p_, stream_);  // never throws: destructors
  }
  template <class Layout, class... A>
  Layout carve(cudaStream_t s, const A&... args) {
    stream_ = s;
    Carver measure(nullptr);
    Layout(measure, args...);
    if (measure.used() > cap_) {
      if (p_) LEANMOE_CUDA_CHECK(cudaFreeAsync(p_, s));
      p_ = nullptr;
      cap_ = 0;
      LEANMOE_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), measure.used(), s));
      cap_ = measure.used();
    }
    Carver c(p_);
    return Layout(c, args...);
  }

 private:
  char* p_ = nullptr;
  size_t cap_ = 0;
  cudaStream_t stream_ = nullptr;
};

struct Sizes {
  int64_t T = 0, R_max = 0, R = 0, n_send = 0, T_loc = 0, R_loc = 0;
};

// The origin's routing of its own tokens (kept for backward) and what forward needs before the sync.
struct OriginMem {
  RoutingScratch routing{};
  int32_t* topk = nullptr;         // [T, K]
  int32_t* row_token = nullptr;    // [R_max]
  float* row_gate = nullptr;       // [R_max]
  int32_t* token_rows = nullptr;   // [R_max]
  int32_t* token_offsets = nullptr;   // [T+1]
  int32_t* expert_offsets = nullptr;  // [E+1]
  int32_t* msg_index = nullptr;    // [P, T]
  int32_t* send_tokens = nullptr;  // [P*T] (at most one entry per (owner, token))
  PeerCounts* counts = nullptr;    // [2P]: sent, then received
  int32_t* recv_offsets = nullptr; // [2, P+1]
  PairRecord* records = nullptr;   // [R_max]
  OriginMem() = default;
  OriginMem(Carver& c, const MoEConfig& cfg, int64_t T, int64_t R_max, int P) {
    const int64_t E = cfg.E;
    routing = RoutingScratch(c, cfg, T);
    topk = c.take<int32_t>(T * cfg.K);
    row_token = c.take<int32_t>(R_max);
    row_gate = c.take<float>(R_max);
    token_rows = c.take<int32_t>(R_max);
    token_offsets = c.take<int32_t>(T + 1);
    expert_offsets = c.take<int32_t>(E + 1);
    msg_index = c.take<int32_t>(int64_t(P) * T);
    send_tokens = c.take<int32_t>(int64_t(P) * T);
    counts = c.take<PeerCounts>(2 * P);
    recv_offsets = c.take<int32_t>(2 * (P + 1));
    records = c.take<PairRecord>(R_max);
  }
};

// Sized after the count exchange. x_recv, the owner metadata, pair_row and h are kept for backward.
struct OwnerMem {
  bf16_bits* x_send = nullptr;       // [n_send, d]
  bf16_bits* x_recv = nullptr;       // [T_loc, d]
  PairRecord* records = nullptr;     // [R_loc]
  uint8_t* code = nullptr;           // [T_loc, El]
  float* gate_matrix = nullptr;      // [T_loc, El]
  int32_t* meta_scratch = nullptr;
  int32_t* row_token = nullptr;      // [R_loc]
  float* row_gate = nullptr;         // [R_loc]
  int32_t* token_rows = nullptr;     // [R_loc]
  int32_t* token_offsets = nullptr;  // [T_loc+1]
  int32_t* expert_offsets = nullptr; // [El+1]
  int32_t* pair_row = nullptr;       // [R_loc]
  bf16_bits* h = nullptr;            // [R_loc, 2n]
  bf16_bits* a = nullptr;            // [R_loc, n]
  bf16_bits* y = nullptr;            // [R_loc, d]
  bf16_bits* y_send = nullptr;       // [R_loc, d] in received-pair order
  bf16_bits* y_rows = nullptr;       // [R, d] in the origin's row order
  void* expert_gemm = nullptr;       // down_proj's own scratch: ranks on one GPU run concurrently
  OwnerMem() = default;
  OwnerMem(Carver& c, const MoEConfig& cfg, const Sizes& z, int64_t El) {
    const int64_t d = cfg.d, n = cfg.n;
    x_send = c.take<bf16_bits>(z.n_send * d);
    x_recv = c.take<bf16_bits>(z.T_loc * d);
    records = c.take<PairRecord>(z.R_loc);
    code = c.take<uint8_t>(z.T_loc * El);
    gate_matrix = c.take<float>(z.T_loc * El);
    meta_scratch = c.take<int32_t>(z.T_loc > 0 ? metadata_scratch_ints(z.T_loc, El) : 0);
    row_token = c.take<int32_t>(z.R_loc);
    row_gate = c.take<float>(z.R_loc);
    token_rows = c.take<int32_t>(z.R_loc);
    token_offsets = c.take<int32_t>(z.T_loc + 1);
    expert_offsets = c.take<int32_t>(El + 1);
    pair_row = c.take<int32_t>(z.R_loc);
    h = c.take<bf16_bits>(z.R_loc * 2 * n);
    a = c.take<bf16_bits>(z.R_loc * n);
    y = c.take<bf16_bits>(z.R_loc * d);
    y_send = c.take<bf16_bits>(z.R_loc * d);
    y_rows = c.take<bf16_bits>(z.R * d);
    expert_gemm = c.take<char>(int64_t(expert_gemm_workspace_bytes(El)));
  }
};

struct BackwardMem {
  bf16_bits* dout_send = nullptr;   // [n_send, d]
  bf16_bits* dout_recv = nullptr;   // [T_loc, d]
  float* ds_partial = nullptr;      // [R_loc, parts]
  float* ds_loc = nullptr;          // [R_loc]
  float* ds_send = nullptr;         // [R_loc]
  bf16_bits* dh = nullptr;          // [R_loc, 2n]
  bf16_bits* a_prime_dx = nullptr;  // [R_loc, max(n, d)]: A', later dX_exp (as cuda_backend.cpp)
  bf16_bits* dx_send = nullptr;     // [R_loc, d]
  float* dS;              // [R] origin rows
  bf16_bits* dx_rows = nullptr;     // [R, d] origin rows
  float* zdz = nullptr;             // [T, E]
  bf16_bits* dz_split = nullptr;    // [T, 2E]
  bf16_bits* router_twice = nullptr;  // [2E, d]
  int32_t* topk_counts = nullptr;   // [E]
  float* dx_router = nullptr;       // [T, d]
  float* d_router_f32 = nullptr;    // [2E, d]
  void* expert_gemm = nullptr;      // dx_expert's own scratch
  BackwardMem() = default;
  BackwardMem(Carver& c, const MoEConfig& cfg, const Sizes& z, int parts, int64_t El) {
    const int64_t d = cfg.d, n = cfg.n, E = cfg.E;
    dout_send = c.take<bf16_bits>(z.n_send * d);
    dout_recv = c.take<bf16_bits>(z.T_loc * d);
    ds_partial = c.take<float>(z.R_loc * parts);
    ds_loc = c.take<float>(z.R_loc);
    ds_send = c.take<float>(z.R_loc);
    dh = c.take<bf16_bits>(z.R_loc * 2 * n);
    a_prime_dx = c.take<bf16_bits>(z.R_loc * std::max(n, d));
    dx_send = c.take<bf16_bits>(z.R_loc * d);
    dS = c.take<float>(z.R);
    dx_rows = c.take<bf16_bits>(z.R * d);
    zdz = c.take<float>(z.T * E);
    dz_split = c.take<bf16_bits>(z.T * 2 * E);
    router_twice = c.take<bf16_bits>(2 * E * d);
    topk_counts = c.take<int32_t>(E);
    dx_router = c.take<float>(z.T * d);
    d_router_f32 = c.take<float>(2 * E * d);
    expert_gemm = c.take<char>(int64_t(expert_gemm_workspace_bytes(El)));
  }
};

std::vector<int64_t> prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

}  // namespace

std::string ep_unsupported_reason(const MoEConfig& cfg, DType dtype) {
  if (dtype != DType::bf16)
    return std::string("the CUDA EP layer stores bf16 only (run f32 storage with a cpu communicator), got ") +
           dtype_name(dtype);
  if (cfg.E > kMaxExperts) return "cfg.E must be <= " + std::to_string(kMaxExperts) + " on cuda, got " +
                                  std::to_string(cfg.E);
  const char* gemm = expert_gemms_unsupported({1, cfg.d, cfg.n});
  if (gemm && *gemm) return std::string("cfg: ") + gemm;
  return "";
}

struct EpLayer::Impl {
  MoEConfig cfg;
  ::leanmoe::ep::Communicator& comm;
  int P;
  int64_t El;
  cudaStream_t stream;
  cublasHandle_t cublas = nullptr;
  void* cublas_ws = nullptr;
  PeerCounts* host_counts = nullptr;  // pinned [2P]: the one device-to-host copy of forward
  Arena origin_arena, owner_arena, backward_arena;

  bool forward_done = false;
  Tensor x;
  Sizes z;
  OriginMem o;  // the origin's routing (kept for backward)
  OwnerMem own;  // the owner's received rows and metadata (kept for backward)
  std::vector<int64_t> send_tokens, send_pairs, recv_tokens, recv_pairs;  // per peer

  Impl(const MoEConfig& c, ::leanmoe::ep::Communicator& cm)
      : cfg(c), comm(cm), P(cm.size()), El(c.E / cm.size()), stream(static_cast<cudaStream_t>(cm.stream())) {
    LEANMOE_CUBLAS_CHECK(cublasCreate(&cublas));
    LEANMOE_CUDA_CHECK(cudaMalloc(&cublas_ws, kRouterCublasWorkspace));
    LEANMOE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_counts), 2 * P * sizeof(PeerCounts)));
  }
  ~Impl() {
    cudaStreamSynchronize(stream);  // arenas and the handle may still be in use by enqueued work
    cublasDestroy(cublas);
    cudaFree(cublas_ws);
    cudaFreeHost(host_counts);
  }

  // all_to_all_v with host counts on both sides (offsets = prefix sums).
  void exchange(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                const std::vector<int64_t>& recv_counts, size_t elem_bytes) {
    const std::vector<int64_t> so = prefix(send_counts), ro = prefix(recv_counts);
    comm.all_to_all_v(send, send_counts.data(), so.data(), recv, recv_counts.data(), ro.data(), elem_bytes);
  }

  // Column-major C (m x n, fp32) = op(A) · op(B), bf16 operands, fp32 accumulation (as cuda_backend.cpp).
  void gemm_bf16(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, const void* a, int lda,
                 const void* b, int ldb, float* c) {
    LEANMOE_CUBLAS_CHECK(cublasSetStream(cublas, stream));  // resets the workspace: set it after
    LEANMOE_CUBLAS_CHECK(cublasSetWorkspace(cublas, cublas_ws, kRouterCublasWorkspace));
    const float one = 1.f, zero = 0.f;
    LEANMOE_CUBLAS_CHECK(cublasGemmEx(cublas, op_a, op_b, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb,
                                      &zero, c, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  // z [T, E] = X [T, d] · Wr [E, d]^T; column-major: z (E x T) = Wr^T (E x d) · X (d x T).
  void router_logits(const void* xd, const void* wr, int64_t T, float* zout) {
    gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, int(cfg.E), int(T), int(cfg.d), wr, int(cfg.d), xd, int(cfg.d), zout);
  }

  RoutedRows local_rows() const { return {own.expert_offsets, own.row_token, own.row_gate, z.R_loc, El}; }
  ExpertShape local_shape() const { return {z.T_loc, cfg.d, cfg.n}; }

  void forward(const Tensor& xin, const MoEWeights& wt, const Tensor& out) {
    const int64_t T = xin.shape[0], E = cfg.E, d = cfg.d;
    const size_t row_bytes = size_t(d) * sizeof(bf16_bits);
    forward_done = false;
    x = xin;
    z = Sizes{};
    z.T = T;
    z.R_max = max_routed_rows(cfg, T);

    // 1. Routing of this rank's tokens: the single-GPU steps (cuda_backend.cpp forward) on T_r rows.
    o = origin_arena.carve<OriginMem>(stream, cfg, T, z.R_max, P);
    //    Token rounding is per rank: this rank's counts become tile multiples.
    router_logits(x.data, wt.router.data, T, o.routing.zp);
    route(cfg, T, o.routing, false, o.topk, {o.row_token, o.row_gate, o.token_rows, o.token_offsets, o.expert_offsets},
          stream);

    // 2. Messages: token rows per owner (each token once, ascending) and one record per pair.
    ep::plan_messages(o.expert_offsets, o.token_offsets, o.token_rows, T, E, El, P, o.msg_index, o.counts,
                      o.send_tokens, stream);
    ep::pack_pair_records(o.expert_offsets, o.row_token, o.row_gate, o.msg_index, T, E, El, z.R_max, o.records,
                          stream);

    // 3. Counts: one PeerCounts per peer, device to device; then the forward's one host sync,
    //    because every later all_to_all_v needs its sizes on the host.
    const std::vector<int64_t> ones(P, 1), iota = [&] {
      std::vector<int64_t> v(P);
      for (int p = 0; p < P; ++p) v[p] = p;
      return v;
    }();
    comm.all_to_all_v(o.counts, ones.data(), iota.data(), o.counts + P, ones.data(), iota.data(), sizeof(PeerCounts));
    ep::receive_offsets(o.counts + P, P, o.recv_offsets, stream);
    LEANMOE_CUDA_CHECK(cudaMemcpyAsync(host_counts, o.counts, 2 * P * sizeof(PeerCounts), cudaMemcpyDeviceToHost,
                                       stream));
    LEANMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    send_tokens.assign(P, 0), send_pairs.assign(P, 0), recv_tokens.assign(P, 0), recv_pairs.assign(P, 0);
    for (int p = 0; p < P; ++p) {
      send_tokens[p] = host_counts[p].tokens, send_pairs[p] = host_counts[p].pairs;
      recv_tokens[p] = host_counts[P + p].tokens, recv_pairs[p] = host_counts[P + p].pairs;
      z.n_send += send_tokens[p], z.R += send_pairs[p], z.T_loc += recv_tokens[p], z.R_loc += recv_pairs[p];
    }
    constexpr int64_t kMaxI32 = std::numeric_limits<int32_t>::max();
    if (z.T_loc > kMaxI32 || z.R_loc > kMaxI32)
      throw Error("ep forward: argument 'x': rank " + std::to_string(comm.rank()) + " received " +
                  std::to_string(z.T_loc) + " token rows and " + std::to_string(z.R_loc) +
                  " pairs; both must be <= 2^31 - 1 (the owner's routing metadata is i32)");

    // 4. Dispatch: token rows and pair records to the owners.
    own = owner_arena.carve<OwnerMem>(stream, cfg, z, El);
    ep::gather_rows(x.data, o.send_tokens, z.n_send, row_bytes, own.x_send, stream);
    exchange(own.x_send, send_tokens, own.x_recv, recv_tokens, row_bytes);
    exchange(o.records, send_pairs, own.records, recv_pairs, sizeof(PairRecord));

    // 5. Owner metadata: rows by local expert, stable by received token = (source rank, token).
    if (z.T_loc > 0) {
      LEANMOE_CUDA_CHECK(cudaMemsetAsync(own.code, 0, size_t(z.T_loc * El), stream));
      const int32_t* recv_offsets = o.recv_offsets;
      ep::scatter_received_pairs(own.records, z.R_loc, recv_offsets, P, El, own.code, own.gate_matrix, stream);
      // gate = the matrix value as is (renormalised = false; sum_chosen is then never read).
      build_metadata(own.code, own.gate_matrix, own.gate_matrix, false, z.T_loc, El, own.meta_scratch,
                     {own.row_token, own.row_gate, own.token_rows, own.token_offsets, own.expert_offsets}, stream);
      ep::received_pair_rows(own.records, z.R_loc, recv_offsets, P, own.expert_offsets, own.token_offsets, own.token_rows,
                             own.pair_row, stream);
    } else {
      LEANMOE_CUDA_CHECK(cudaMemsetAsync(own.expert_offsets, 0, size_t(El + 1) * sizeof(int32_t), stream));
    }
    forward_done = true;

    // 6. Local experts on the received rows (H kept for backward), Y per pair back to the origin,
    //    which receives them in its own row order and runs the single-GPU gather-sum.
    up_proj_act(local_rows(), local_shape(), {}, own.x_recv, wt.gate_up_proj.data, nullptr, own.h, own.a, stream);
    down_proj(local_rows(), local_shape(), own.a, wt.down_proj.data, own.y, stream, own.expert_gemm);
    ep::gather_rows(own.y, own.pair_row, z.R_loc, row_bytes, own.y_send, stream);
    exchange(own.y_send, recv_pairs, own.y_rows, send_pairs, row_bytes);
    aggregate_rows(own.y_rows, o.row_gate, o.token_offsets, o.token_rows, T, d, out.data, stream);
  }

  void backward(const Tensor& d_out, const MoEWeights& wt, const MoEGrads& g, const ExpertGradCallback& cb) {
    const int64_t T = z.T, E = cfg.E, K = cfg.K, d = cfg.d;
    const size_t row_bytes = size_t(d) * sizeof(bf16_bits);
    const int parts = ds_partials(local_shape());
    BackwardMem b = backward_arena.carve<BackwardMem>(stream, cfg, z, parts, El);
    const RoutedRows rows = local_rows();
    const ExpertShape shape = local_shape();

    // 1. dO rows to the owners (the same tokens as x in forward).
    ep::gather_rows(d_out.data, o.send_tokens, z.n_send, row_bytes, b.dout_send, stream);
    exchange(b.dout_send, send_tokens, b.dout_recv, recv_tokens, row_bytes);

    // 2. Owner: the single-GPU expert backward on the received rows, callbacks on the local slices.
    dh_act_bwd(rows, shape, {}, b.dout_recv, wt.down_proj.data, own.h, b.dh, b.a_prime_dx, b.ds_partial, stream);
    if (g.d_down_proj.defined()) {
      dw2(rows, shape, b.dout_recv, b.a_prime_dx, g.d_down_proj.data, stream);
      if (cb) cb(ExpertWeight::down_proj, g.d_down_proj);
    }
    if (g.dx.defined()) dx_expert(rows, shape, b.dh, wt.gate_up_proj.data, b.a_prime_dx, stream, b.expert_gemm);
    if (g.d_gate_up_proj.defined()) {
      dw1(rows, shape, b.dh, own.x_recv, g.d_gate_up_proj.data, stream);
      if (cb) cb(ExpertWeight::gate_up_proj, g.d_gate_up_proj);
    }
    if (!g.dx.defined() && !g.d_router.defined()) return;

    // 3. Per pair back to the origin: dS (the router needs it for dx and dWr), dX_exp rows (dx only).
    //    Two exchanges that land where they are read, instead of one packed message and an unpack.
    if (z.R_loc > 0) reduce_ds(b.ds_partial, parts, own.expert_offsets, El, z.R_loc, b.ds_loc, stream);
    ep::gather_rows(b.ds_loc, own.pair_row, z.R_loc, sizeof(float), b.ds_send, stream);
    exchange(b.ds_send, recv_pairs, b.dS, send_pairs, sizeof(float));
    if (g.dx.defined()) {
      ep::gather_rows(b.a_prime_dx, own.pair_row, z.R_loc, row_bytes, b.dx_send, stream);
      exchange(b.dx_send, recv_pairs, b.dx_rows, send_pairs, row_bytes);
    }

    // 4. Router backward at the origin: cuda_backend.cpp's steps on this rank's T_r tokens.
    router_logits(x.data, wt.router.data, T, b.zdz);
    count_topk(o.topk, T, E, K, b.topk_counts, stream);
    RouterBackwardArgs rb{};
    rb.zdz = b.zdz;
    rb.topk_experts = o.topk;
    rb.topk_counts = b.topk_counts;
    rb.token_offsets = o.token_offsets;
    rb.token_rows = o.token_rows;
    rb.expert_offsets = o.expert_offsets;
    rb.dS = b.dS;
    rb.d_losses = nullptr;
    rb.c_aux = 0.f, rb.c_z = 0.f;  // the EP layer rejects router losses
    rb.renormalised = gates_renormalised(cfg);
    rb.T = T, rb.E = E, rb.K = K;
    rb.dz_split = b.dz_split;
    router_backward(rb, stream);
    if (g.d_router.defined()) {
      // [dWr_hi; dWr_lo] [2E, d] = dz_split^T · X over this rank's tokens.
      gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, int(d), int(2 * E), int(T), x.data, int(d), b.dz_split, int(2 * E),
                b.d_router_f32);
      sum_halves_to_bf16(b.d_router_f32, E * d, g.d_router.data, stream);
    }
    if (g.dx.defined()) {
      const size_t router_bytes = size_t(E * d) * sizeof(bf16_bits);
      LEANMOE_CUDA_CHECK(cudaMemcpyAsync(b.router_twice, wt.router.data, router_bytes, cudaMemcpyDeviceToDevice,
                                         stream));
      LEANMOE_CUDA_CHECK(cudaMemcpyAsync(b.router_twice + E * d, wt.router.data, router_bytes,
                                         cudaMemcpyDeviceToDevice, stream));
      gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, int(d), int(T), int(2 * E), b.router_twice, int(d), b.dz_split, int(2 * E),
                b.dx_router);
      gather_dx(b.dx_rows, b.dx_router, o.token_offsets, o.token_rows, T, d, g.dx.data, stream);
    }
  }
};

EpLayer::EpLayer(const MoEConfig& cfg, ::leanmoe::ep::Communicator& comm) : impl_(std::make_unique<Impl>(cfg, comm)) {}
EpLayer::~EpLayer() = default;

void EpLayer::forward(const Tensor& x, const MoEWeights& w, const Tensor& out) { impl_->forward(x, w, out); }

void EpLayer::backward(const Tensor& d_out, const MoEWeights& w, const MoEGrads& grads, const ExpertGradCallback& cb) {
  impl_->backward(d_out, w, grads, cb);
}

std::vector<int64_t> EpLayer::local_expert_counts() {
  const int64_t El = impl_->El;
  std::vector<int64_t> counts(El, 0);
  if (!impl_->forward_done) return counts;
  std::vector<int32_t> offsets(El + 1);
  LEANMOE_CUDA_CHECK(cudaMemcpyAsync(offsets.data(), impl_->own.expert_offsets, offsets.size() * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, impl_->stream));
  LEANMOE_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  for (int64_t e = 0; e < El; ++e) counts[e] = offsets[e + 1] - offsets[e];
  return counts;
}

}  // namespace leanmoe::cuda
