// ExpertParallelLayer (include/leanmoe/ep.h): routing on the token's own rank, dispatch of token
// rows to the expert owners, local expert math, and the way back. The routing is the CPU backend's
// own functions (cpu/router.h); the owner's expert steps are the CPU backend's routing-given entry
// point (Backend::forward_routed / backward_routed) over the pairs it received, as tokens with
// K = 1 and experts local to the rank, so EP runs exactly the steps one rank runs.
//
// Row orders. EP keeps every sum of one rank running the concatenated batch
// [rank 0's tokens; rank 1's tokens; ...] in the same order (docs/ep.md):
// - origin: rows sorted by expert, stable by token (build_metadata). Owner q's experts are
//   contiguous, so the rows bound for q are one contiguous range, sent in row order.
// - owner: pairs arrive by source rank, in the source's row order. Routing given sorts them by
//   local expert, stable by pair = by (source rank, source token) = global token order, which is
//   the single-rank row order of that expert: the grouped GEMMs see the same rows in the same order.
// - combine: the owner returns one row per (token, expert) pair (Y forward, unweighted; dX_exp and
//   dS backward) in the order it received them, so the origin receives them in its own row order
//   and runs the single-rank gather-sum unchanged. Returning per-pair rows costs K*d per token
//   instead of at most min(K, P)*d for owner-side partial sums; it buys the unchanged sum order.
// Results are still not bitwise equal to one rank: BLAS picks GEMM kernels by shape (the router
// GEMM over T_r rows rounds differently from the one over T rows), and d_router is summed per
// rank and then across ranks.
//
// With a cuda communicator (comm.device() == cuda) the tensors live on the GPU and this file only
// validates and forwards to the CUDA implementation (src/cuda/ep_layer.cpp), which follows the same
// row orders and calls the CUDA backend's routing-given entry point the same way.
#include <cstring>

#include "backend.h"
#include "cpu/experts.h"
#include "cpu/router.h"
#include "leanmoe/ep.h"
#include "validate.h"
#if defined(LEANMOE_WITH_CUDA)
#include "cuda/ep_layer.h"
#endif

namespace leanmoe::ep {

using namespace leanmoe::cpu;

namespace {

// One (token, expert) pair as sent to the expert's owner.
struct PairRecord {
  int32_t token;         // index among the tokens of the same message
  int32_t local_expert;  // expert index on the owner, 0..E/P-1
  float gate;
};

std::vector<int64_t> prefix_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

// The message is built only when the check fails (a macro: it is not evaluated otherwise); checks
// run on every construction and forward, and most messages describe tensors or the config.
#define EP_REQUIRE(ok, msg)       \
  do {                            \
    if (!(ok)) throw Error(msg);  \
  } while (0)

// Every tensor lives on the communicator's device (cpu: the CPU backend's math; cuda: ep_layer.cpp).
void check_matrix(const Tensor& t, const char* fn, const char* arg, std::initializer_list<int64_t> shape, DType dtype,
                  Device device) {
  const std::string where = std::string(fn) + ": argument '" + arg + "': ";
  EP_REQUIRE(t.defined(), where + "is required");
  // An empty tensor (a rank without tokens) may have no storage.
  EP_REQUIRE(t.data != nullptr || t.numel() == 0,
             where + "must not have a null data pointer, got " + t.describe() + " with data = null");
  EP_REQUIRE(t.device == device, where + "must be on " + device_name(device) + " (the communicator's device), got " +
                                  t.describe());
  // The CUDA kernels move rows in 16-byte vectors (gather-sum, row copies, the GEMMs' cp.async).
  EP_REQUIRE(device == Device::cpu || reinterpret_cast<uintptr_t>(t.data) % 16 == 0,
          where + "must be 16-byte aligned on cuda (vector loads), got " + t.describe() + " at an address that is not");
  EP_REQUIRE(t.dtype == dtype, where + "must have dtype " + dtype_name(dtype) + ", got " + t.describe());
  EP_REQUIRE(t.ndim == int(shape.size()), where + "must have " + std::to_string(shape.size()) + " dims, got " + t.describe());
  int i = 0;
  for (int64_t s : shape) {
    EP_REQUIRE(t.shape[i] == s, where + "dim " + std::to_string(i) + " must be " + std::to_string(s) + ", got " +
                                 t.describe());
    ++i;
  }
  EP_REQUIRE(t.is_contiguous(), where + "must be contiguous, got " + t.describe());
}

// The owner's layer call: cfg over the local experts, the received pairs as tokens (K = 1),
// routing given (the origin routed them).
MoEConfig owner_config(const MoEConfig& cfg, int64_t local_experts) {
  MoEConfig c = cfg;
  c.E = local_experts;
  c.K = 1;
  c.routing = Routing::given;
  return c;
}

}  // namespace

struct ExpertParallelLayer::State {
  MoEConfig cfg;
  Communicator& comm;
  int P = 1;
  int64_t El = 0, first = 0;
  DType dtype = DType::f32;
  bool forward_done = false;

  // Origin side: this rank's tokens and their routing (as SavedState on one rank).
  Tensor x;
  int64_t T = 0, R = 0;
  std::vector<int32_t> topk, row_token, token_offsets, token_rows, expert_offsets;
  std::vector<float> row_gate;
  std::vector<int32_t> send_tokens;          // tokens sent to each owner, concatenated by owner
  std::vector<int64_t> send_token_counts;    // [P]
  std::vector<int64_t> send_pair_counts;     // [P] = this rank's rows of each owner's experts

  // Owner side: the received pairs, the tokens of one routing-given call over the local experts.
  int64_t T_loc = 0, R_loc = 0;
  std::vector<int64_t> recv_token_counts, recv_pair_counts;  // [P]
  std::vector<char> x_recv;                  // [T_loc, d] storage dtype (kept: backward's dW1 needs it)
  MoEConfig owner_cfg;                       // owner_config(cfg, El), both devices
  LayerPlan owner_plan;                      // plan_layer(owner_cfg, R_loc)
  Buffer owner_saved_buf;                    // behind owner_saved (H and the owner's routing metadata)
  SavedState owner_saved;                    // owner_saved.x = the received x rows
#if defined(LEANMOE_WITH_CUDA)
  std::unique_ptr<cuda::EpLayer> gpu;        // set when comm.device() == cuda: everything below is unused
#endif

  State(const MoEConfig& c, Communicator& cm) : cfg(c), comm(cm) {}

  // all_to_all_v of `per_peer` elements of elem_bytes from each rank (counts on both sides known).
  void exchange(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                const std::vector<int64_t>& recv_counts, size_t elem_bytes) {
    const std::vector<int64_t> so = prefix_offsets(send_counts), ro = prefix_offsets(recv_counts);
    comm.all_to_all_v(send, send_counts.data(), so.data(), recv, recv_counts.data(), ro.data(), elem_bytes);
  }

  // Rows of `src` [T, d] (storage dtype) for the tokens each owner needs, concatenated by owner.
  std::vector<char> gather_token_rows(const void* src) const {
    const size_t row_bytes = size_t(cfg.d) * dtype_size(dtype);
    std::vector<char> rows(send_tokens.size() * row_bytes);
    for (size_t i = 0; i < send_tokens.size(); ++i)
      std::memcpy(rows.data() + i * row_bytes, static_cast<const char*>(src) + send_tokens[i] * row_bytes, row_bytes);
    return rows;
  }
};

ExpertParallelLayer::ExpertParallelLayer(const MoEConfig& cfg, Communicator& comm)
    : s_(std::make_unique<State>(cfg, comm)) {
  const int P = comm.size();
  EP_REQUIRE(P >= 1, "ExpertParallelLayer: argument 'comm': size must be >= 1, got " + std::to_string(P));
  EP_REQUIRE(comm.rank() >= 0 && comm.rank() < P, "ExpertParallelLayer: argument 'comm': rank must be in [0, size = " +
                                                      std::to_string(P) + "), got " + std::to_string(comm.rank()));
  // The single-device rules (d, n, E, K, tile; FP8: d and n multiples of 128), then the EP ones.
  ::leanmoe::detail::validate_config(cfg, "ExpertParallelLayer");
  EP_REQUIRE(cfg.E % P == 0, "ExpertParallelLayer: argument 'cfg': E (" + std::to_string(cfg.E) +
                              ") must be a multiple of the ranks (" + std::to_string(P) + ")");
  EP_REQUIRE(cfg.aux_loss_coef == 0.f && cfg.z_loss_coef == 0.f,
          "ExpertParallelLayer: argument 'cfg': aux_loss_coef and z_loss_coef must be 0 (cross-rank batch "
          "statistics of the router losses are not implemented), got " + cfg.describe());
  EP_REQUIRE(cfg.routing != Routing::given,
             "ExpertParallelLayer: argument 'cfg': routing given by the caller is not supported by the EP layer, got " +
                 cfg.describe());
  EP_REQUIRE(cfg.activation == Activation::swiglu && !cfg.interleaved && !cfg.transposed,
             "ExpertParallelLayer: argument 'cfg': the EP layer runs SwiGLU experts in the [gate; up] HF layout only, "
             "got " + cfg.describe());
  // FP8 is the owner's single-device FP8 call (owner_config keeps cfg.precision): every tile is one
  // token row's or one expert's, so it quantizes what one rank does. The CUDA EP layer would run
  // the CUDA backend's FP8 steps the same way, but has never run them.
  EP_REQUIRE(cfg.precision == Precision::storage || comm.device() != Device::cuda,
             "ExpertParallelLayer: argument 'cfg': FP8 in the EP layer runs on CPU ranks only: its CUDA path is "
             "untested, got " + cfg.describe());
  s_->P = P;
  s_->El = cfg.E / P;
  s_->owner_cfg = owner_config(cfg, s_->El);
  s_->first = comm.rank() * s_->El;
  if (comm.device() == Device::cuda) {
#if defined(LEANMOE_WITH_CUDA)
    // Storage-independent rules here; the dtype (bf16 only) is checked in forward.
    const std::string why = cuda::ep_unsupported_reason(cfg, DType::bf16);
    EP_REQUIRE(why.empty(), "ExpertParallelLayer: argument 'cfg': not supported by the CUDA EP layer: " + why);
    s_->gpu = std::make_unique<cuda::EpLayer>(cfg, s_->owner_cfg, comm);
#else
    throw Error("ExpertParallelLayer: argument 'comm': is a cuda communicator, but this leanmoe was built without "
                "the CUDA backend");
#endif
  }
}

ExpertParallelLayer::~ExpertParallelLayer() = default;

int64_t ExpertParallelLayer::local_experts() const { return s_->El; }
int64_t ExpertParallelLayer::first_expert() const { return s_->first; }

std::vector<int64_t> ExpertParallelLayer::local_expert_counts() const {
#if defined(LEANMOE_WITH_CUDA)
  if (s_->gpu) return s_->gpu->local_expert_counts();
#endif
  std::vector<int64_t> counts(s_->El, 0);
  if (!s_->forward_done) return counts;
  const int32_t* offsets = s_->owner_saved.expert_offsets.ptr<int32_t>();
  for (int64_t e = 0; e < s_->El; ++e) counts[e] = offsets[e + 1] - offsets[e];
  return counts;
}

void ExpertParallelLayer::forward(const Tensor& x, const MoEWeights& w, const Tensor& out) {
  State& s = *s_;
  const MoEConfig& c = s.cfg;
  const int64_t d = c.d, n = c.n, E = c.E, K = c.K, El = s.El;
  const int P = s.P;
  EP_REQUIRE(x.defined() && x.ndim == 2, "ep forward: argument 'x': must be [T, d], got " + x.describe());
  EP_REQUIRE(!w.gate_up_bias.defined() && !w.down_bias.defined(),
             "ep forward: argument 'w': expert biases are not supported by the EP layer");
  const int64_t T = x.shape[0];
  ::leanmoe::detail::validate_tokens(c, T, "ep forward");  // routing metadata is i32
  s.dtype = x.dtype;
  EP_REQUIRE(s.dtype == DType::f32 || s.dtype == DType::bf16,
          "ep forward: argument 'x': dtype must be bf16 or f32, got " + x.describe());
  ::leanmoe::detail::validate_storage(c, s.dtype, "ep forward");  // fp8: bf16
  // This rank's experts' codes (cfg.fp8_weights_given), as the owner's call reads them.
  ::leanmoe::detail::validate_fp8_weights(s.owner_cfg, w, x, "x", "E/P", "ep forward");
  const Device dev = s.comm.device();
#if defined(LEANMOE_WITH_CUDA)
  if (s.gpu) {
    const std::string why = cuda::ep_unsupported_reason(c, s.dtype);
    EP_REQUIRE(why.empty(), "ep forward: argument 'x': " + why + " (" + x.describe() + ")");
    // A CPU rank may hold no tokens (tested); the CUDA rank's path with T = 0 has never run.
    EP_REQUIRE(T > 0, "ep forward: argument 'x': a rank on a cuda communicator needs at least one token, got " +
                          x.describe());
  }
#endif
  check_matrix(x, "ep forward", "x", {T, d}, s.dtype, dev);
  check_matrix(out, "ep forward", "out", {T, d}, s.dtype, dev);
  check_matrix(w.router, "ep forward", "w.router", {E, d}, s.dtype, dev);
  check_matrix(w.gate_up_proj, "ep forward", "w.gate_up_proj", {El, 2 * n, d}, s.dtype, dev);
  check_matrix(w.down_proj, "ep forward", "w.down_proj", {El, d, n}, s.dtype, dev);
#if defined(LEANMOE_WITH_CUDA)
  if (s.gpu) {
    s.forward_done = false;
    s.T = T;
    s.gpu->forward(x, w, out);
    s.forward_done = true;
    return;
  }
#endif

  // 1. Routing of this rank's own tokens (cpu_backend.cpp's steps, on T_r tokens).
  s.x = x;
  s.T = T;
  std::vector<float> xf(T * d), wr(E * d), z(T * E), p(T * E), lse(T), sum_chosen(T), gate_den(T);
  to_float(x.data, s.dtype, T * d, xf.data());
  to_float(w.router.data, s.dtype, E * d, wr.data());
  gemm(false, true, T, E, d, xf.data(), wr.data(), z.data());
  softmax_rows(z.data(), T, E, p.data(), lse.data());
  s.topk.resize(T * K);
  topk_rows(z.data(), T, E, K, s.topk.data());
  chosen_prob_sums(p.data(), s.topk.data(), T, E, K, sum_chosen.data());
  const bool renormalised = gates_renormalised(c);
  for (int64_t t = 0; t < T; ++t) gate_den[t] = renormalised ? sum_chosen[t] : 1.f;
  std::vector<int32_t> code(T * E), pair_scratch(T * E);
  mark_topk_pairs(s.topk.data(), T, E, K, code.data());
  // Per-rank token rounding: this rank's counts per expert become tile multiples, so each owner's
  // total (a sum over ranks) is one too.
  if (c.routing == Routing::token_rounding)
    round_tokens(p.data(), sum_chosen.data(), T, E, c.tile, c.rounding_mode, code.data(), pair_scratch.data());
  const int64_t R_max = max_routed_rows(c, T);
  s.row_token.assign(R_max, 0);
  s.row_gate.assign(R_max, 0.f);
  s.token_rows.assign(R_max, 0);
  s.expert_offsets.assign(E + 1, 0);
  s.token_offsets.assign(T + 1, 0);
  const RoutingMetadata meta{s.row_token.data(), s.row_gate.data(), s.expert_offsets.data(), s.token_offsets.data(),
                             s.token_rows.data()};
  s.R = build_metadata(code.data(), p.data(), gate_den.data(), T, E, pair_scratch.data(), meta);
  std::vector<int32_t> row_expert(s.R);
  row_experts(s.expert_offsets.data(), E, row_expert.data());

  // 2. What goes to each owner q: its rows (one pair record each, in row order) and the tokens
  //    they use, each token once, ascending.
  s.send_tokens.clear();
  s.send_token_counts.assign(P, 0);
  s.send_pair_counts.assign(P, 0);
  std::vector<PairRecord> pairs(s.R);
  std::vector<int32_t> message_index(T, -1);
  for (int q = 0; q < P; ++q) {
    const int64_t begin = s.expert_offsets[q * El], end = s.expert_offsets[(q + 1) * El];
    s.send_pair_counts[q] = end - begin;
    std::fill(message_index.begin(), message_index.end(), -1);
    for (int64_t row = begin; row < end; ++row) message_index[s.row_token[row]] = 0;
    int32_t next = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (message_index[t] < 0) continue;
      message_index[t] = next++;
      s.send_tokens.push_back(int32_t(t));
    }
    s.send_token_counts[q] = next;
    for (int64_t row = begin; row < end; ++row)
      pairs[row] = {message_index[s.row_token[row]], int32_t(row_expert[row] - q * El), s.row_gate[row]};
  }

  // 3. Dispatch: counts, token rows, pair records.
  s.recv_token_counts = exchange_counts(s.comm, s.send_token_counts);
  s.recv_pair_counts = exchange_counts(s.comm, s.send_pair_counts);
  const std::vector<int64_t> recv_token_off = prefix_offsets(s.recv_token_counts);
  const std::vector<int64_t> recv_pair_off = prefix_offsets(s.recv_pair_counts);
  s.T_loc = recv_token_off[P];
  s.R_loc = recv_pair_off[P];
  const size_t row_bytes = size_t(d) * dtype_size(s.dtype);
  const std::vector<char> x_send = s.gather_token_rows(x.data);
  s.x_recv.assign(s.T_loc * row_bytes, 0);
  s.exchange(x_send.data(), s.send_token_counts, s.x_recv.data(), s.recv_token_counts, row_bytes);
  std::vector<PairRecord> pairs_recv(s.R_loc);
  s.exchange(pairs.data(), s.send_pair_counts, pairs_recv.data(), s.recv_pair_counts, sizeof(PairRecord));

  // 4. Owner: the CPU backend's routing-given forward over the received pairs as tokens (K = 1):
  //    pair i goes to its local expert with its gate and reads the x row of its token. Rows come
  //    out sorted by local expert, stable by pair; H and the metadata stay in owner_saved for
  //    backward; y_send gets Y per pair, unweighted, in received order.
  std::vector<int32_t> pair_expert(s.R_loc), pair_x_row(s.R_loc);
  std::vector<float> pair_gate(s.R_loc);
  for (int src = 0; src < P; ++src)
    for (int64_t i = recv_pair_off[src]; i < recv_pair_off[src + 1]; ++i) {
      pair_expert[i] = pairs_recv[i].local_expert;
      pair_gate[i] = pairs_recv[i].gate;
      pair_x_row[i] = int32_t(recv_token_off[src] + pairs_recv[i].token);
    }
  s.owner_plan = plan_layer(s.owner_cfg, s.R_loc, s.dtype, dev);
  s.owner_saved_buf = Buffer(dev, s.owner_plan.saved_bytes);
  s.owner_saved = make_saved_state(s.owner_cfg, s.R_loc, s.dtype, dev, s.owner_saved_buf.data(),
                                   s.owner_saved_buf.bytes());
  s.owner_saved.x = Tensor::contiguous(s.x_recv.data(), s.dtype, dev, {s.T_loc, d});
  const Tensor topk = Tensor::contiguous(pair_expert.data(), DType::i32, dev, {s.R_loc, 1});
  const Tensor gates = Tensor::contiguous(pair_gate.data(), DType::f32, dev, {s.R_loc, 1});
  std::vector<char> y_send(s.R_loc * row_bytes);
  const Tensor y_send_t = Tensor::contiguous(y_send.data(), s.dtype, dev, {s.R_loc, d});
  const Buffer ws(dev, s.owner_plan.forward_workspace_bytes);
  const ::leanmoe::detail::RoutedForwardArgs routed{
      s.owner_cfg, s.owner_saved.x, topk, gates, w, y_send_t, s.owner_saved, {ws.data(), ws.bytes()}, nullptr,
      pair_x_row.data(), /*weighted_out=*/false};
  ::leanmoe::detail::cpu_backend().forward_routed(routed);
  s.forward_done = true;

  // 5. Combine: Y per pair back to its origin, which receives them in its own row order.
  std::vector<char> y_rows(s.R * row_bytes);
  s.exchange(y_send.data(), s.recv_pair_counts, y_rows.data(), s.send_pair_counts, row_bytes);
  std::vector<float> y(s.R * d);
  to_float(y_rows.data(), s.dtype, s.R * d, y.data());
  gather_sum_rows(y.data(), s.row_gate.data(), nullptr, s.token_offsets.data(), s.token_rows.data(), T, d, s.dtype,
                  out.data);
}

void ExpertParallelLayer::backward(const Tensor& d_out, const MoEWeights& w, const MoEGrads& g,
                                   const ExpertGradCallback& on_expert_grad) {
  State& s = *s_;
  const MoEConfig& c = s.cfg;
  const int64_t d = c.d, n = c.n, E = c.E, K = c.K, El = s.El, T = s.T;
  EP_REQUIRE(s.forward_done, "ep backward: argument 'd_out': forward must run first");
  const Device dev = s.comm.device();
  check_matrix(d_out, "ep backward", "d_out", {T, d}, s.dtype, dev);
  ::leanmoe::detail::validate_fp8_weights(s.owner_cfg, w, d_out, "d_out", "E/P", "ep backward");
  check_matrix(w.router, "ep backward", "w.router", {E, d}, s.dtype, dev);
  check_matrix(w.gate_up_proj, "ep backward", "w.gate_up_proj", {El, 2 * n, d}, s.dtype, dev);
  check_matrix(w.down_proj, "ep backward", "w.down_proj", {El, d, n}, s.dtype, dev);
  if (g.dx.defined()) check_matrix(g.dx, "ep backward", "grads.dx", {T, d}, s.dtype, dev);
  if (g.d_router.defined()) check_matrix(g.d_router, "ep backward", "grads.d_router", {E, d}, s.dtype, dev);
  if (g.d_gate_up_proj.defined())
    check_matrix(g.d_gate_up_proj, "ep backward", "grads.d_gate_up_proj", {El, 2 * n, d}, s.dtype, dev);
  if (g.d_down_proj.defined())
    check_matrix(g.d_down_proj, "ep backward", "grads.d_down_proj", {El, d, n}, s.dtype, dev);
#if defined(LEANMOE_WITH_CUDA)
  if (s.gpu) return s.gpu->backward(d_out, w, g, on_expert_grad);
#endif

  // 1. dO rows to the owners, the same tokens as x went in forward.
  const size_t row_bytes = size_t(d) * dtype_size(s.dtype);
  const std::vector<char> dout_send = s.gather_token_rows(d_out.data);
  std::vector<char> dout_recv(s.T_loc * row_bytes);
  s.exchange(dout_send.data(), s.send_token_counts, dout_recv.data(), s.recv_token_counts, row_bytes);

  // 2. Owner: the routing-given backward of the same call. The in-backward callbacks see only
  //    this rank's slices; dX_exp (storage dtype) and dS come out per received pair, in order.
  const bool want_dx = g.dx.defined(), want_ds = want_dx || g.d_router.defined();
  std::vector<char> dx_send(want_dx ? s.R_loc * row_bytes : 0);
  std::vector<float> ds_send(s.R_loc);
  MoEGrads owner_grads;
  if (want_dx) owner_grads.dx = Tensor::contiguous(dx_send.data(), s.dtype, dev, {s.R_loc, d});
  owner_grads.d_gate_up_proj = g.d_gate_up_proj;
  owner_grads.d_down_proj = g.d_down_proj;
  if (want_ds) owner_grads.d_topk_weights = Tensor::contiguous(ds_send.data(), DType::f32, dev, {s.R_loc, 1});
  const Tensor dout_t = Tensor::contiguous(dout_recv.data(), s.dtype, dev, {s.T_loc, d});
  const Buffer ws(dev, s.owner_plan.backward_workspace_bytes);
  const ::leanmoe::detail::RoutedBackwardArgs routed{
      s.owner_cfg, dout_t, w, s.owner_saved, owner_grads, {ws.data(), ws.bytes()}, on_expert_grad, nullptr};
  ::leanmoe::detail::cpu_backend().backward_routed(routed);
  if (!want_ds) return;

  // 3. Per pair back to the origin: dS (the router needs it for dx and dWr), dX_exp rows (dx only).
  std::vector<float> dS(s.R), dx_rows(want_dx ? s.R * d : 0);
  s.exchange(ds_send.data(), s.recv_pair_counts, dS.data(), s.send_pair_counts, sizeof(float));
  if (want_dx) {
    std::vector<char> dx_recv(s.R * row_bytes);
    s.exchange(dx_send.data(), s.recv_pair_counts, dx_recv.data(), s.send_pair_counts, row_bytes);
    to_float(dx_recv.data(), s.dtype, s.R * d, dx_rows.data());
  }

  // 4. Router backward on the origin, from logits recomputed out of X and Wr (as on one rank).
  std::vector<float> xf(T * d), wr(E * d), z(T * E), p(T * E), lse(T), sum_chosen(T), dz(T * E);
  std::vector<int32_t> counts(E), row_expert(s.R);
  to_float(s.x.data, s.dtype, T * d, xf.data());
  to_float(w.router.data, s.dtype, E * d, wr.data());
  gemm(false, true, T, E, d, xf.data(), wr.data(), z.data());
  softmax_rows(z.data(), T, E, p.data(), lse.data());
  chosen_prob_sums(p.data(), s.topk.data(), T, E, K, sum_chosen.data());
  topk_counts(s.topk.data(), T, E, K, counts.data());
  row_experts(s.expert_offsets.data(), E, row_expert.data());
  const RouterBackwardInputs in{p.data(), lse.data(), sum_chosen.data(), gates_renormalised(c), s.topk.data(),
                                counts.data(), s.token_offsets.data(), s.token_rows.data(), row_expert.data(),
                                dS.data(), 0.f, 0.f};
  router_backward(in, T, E, K, dz.data());
  if (g.d_router.defined()) {
    std::vector<float> d_router(E * d);
    gemm(true, false, E, d, T, dz.data(), xf.data(), d_router.data());  // dWr = dzᵀ·X over this rank's tokens
    store(d_router.data(), E * d, s.dtype, g.d_router.data);
  }
  if (g.dx.defined()) {
    std::vector<float> dz_wr(T * d);
    gemm(false, false, T, d, E, dz.data(), wr.data(), dz_wr.data());
    gather_sum_rows(dx_rows.data(), nullptr, dz_wr.data(), s.token_offsets.data(), s.token_rows.data(), T, d, s.dtype,
                    g.dx.data);
  }
}

}  // namespace leanmoe::ep

#undef EP_REQUIRE
