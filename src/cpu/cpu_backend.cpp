// The CPU backend: the readable, threaded fp32-math reference that runs anywhere.
// OpenMP for gathers, elementwise work and routing; OpenBLAS sgemm for every GEMM.
// Routing lives in router.h, expert math in experts.h; this file owns the workspace layout and
// the order of the steps (notably the in-backward update points of docs/SPEC.md §6).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend.h"
#include "carver.h"
#include "cpu/experts.h"
#include "cpu/router.h"

namespace leanmoe::detail {
namespace {

using namespace leanmoe::cpu;



// fp32 copies of an expert's weights are needed only when storage is bf16.
int64_t weight_copy(DType dtype, int64_t size) { return dtype == DType::bf16 ? size : 0; }

// Router state both passes recompute: fp32 X and Wr, logits, probabilities.
struct RouterScratch {
  float *x, *router_w, *z, *p, *lse, *sum_chosen;
  int32_t* counts;  // [E]
  static RouterScratch carve(const MoEConfig& c, int64_t T, Carver& cv) {
    return {cv.take<float>(T * c.d), cv.take<float>(c.E * c.d), cv.take<float>(T * c.E), cv.take<float>(T * c.E),
            cv.take<float>(T), cv.take<float>(T), cv.take<int32_t>(c.E)};
  }
};

// The expert loops' scratch, each sized for one expert; W = up_width. An expert gets at most one
// row per token from the router, but routing given may list it in several slots of a token.
ExpertScratch carve_experts(const MoEConfig& c, int64_t tokens, DType dtype, bool backward, Carver& cv) {
  const int64_t d = c.d, n = c.n, W = up_width(c);
  const int64_t T = c.routing == Routing::given ? tokens * c.K : tokens;  // rows of one expert, at most
  ExpertScratch e{};
  e.rows = cv.take<float>(T * d);
  e.w1 = cv.take<float>(weight_copy(dtype, W * d));
  e.w2 = cv.take<float>(weight_copy(dtype, d * n));
  e.act = cv.take<float>(T * n);
  if (backward) {
    e.d_act = cv.take<float>(T * n);
    e.dw = cv.take<float>(W * d);  // the larger of dW1_e [W, d] and dW2_e [d, n] (W >= n)
    e.db = cv.take<float>(std::max(W, d));
    e.quantized = cv.take<float>(c.precision == Precision::fp8 ? T * std::max(W, d) : 0);
  } else {
    e.h_acc = cv.take<float>(T * W);
  }
  return e;
}

struct ForwardScratch {
  RouterScratch router;
  float* gate_denominator;  // [T]
  int32_t *code, *pair_scratch;  // [T, E] each
  float* y;                 // [R_max, d] expert outputs, rounded to storage
  ExpertScratch experts;
  static ForwardScratch carve(const MoEConfig& c, int64_t T, DType dtype, Carver& cv) {
    const int64_t R = max_routed_rows(c, T), d = c.d;
    ForwardScratch s{};
    s.router = RouterScratch::carve(c, T, cv);
    s.gate_denominator = cv.take<float>(T);
    s.code = cv.take<int32_t>(T * c.E);
    s.pair_scratch = cv.take<int32_t>(T * c.E);
    s.y = cv.take<float>(R * d);
    s.experts = carve_experts(c, T, dtype, false, cv);
    return s;
  }
};

struct BackwardScratch {
  RouterScratch router;
  int32_t* row_expert;  // [R_max]
  float* dS;            // [R_max]
  float* dH;            // [R_max, W] rounded to storage
  float* dx_rows;       // [R_max, d] dX_exp, rounded to storage
  float* dz;            // [T, E]
  float* dz_wr;         // [T, d] router path of dX: dz·Wr
  float* d_router;      // [E, d]
  ExpertScratch experts;
  static BackwardScratch carve(const MoEConfig& c, int64_t T, DType dtype, Carver& cv) {
    const int64_t R = max_routed_rows(c, T), d = c.d;
    BackwardScratch s{};
    s.router = RouterScratch::carve(c, T, cv);
    s.row_expert = cv.take<int32_t>(R);
    s.dS = cv.take<float>(R);
    s.dH = cv.take<float>(R * up_width(c));
    s.dx_rows = cv.take<float>(R * d);
    s.dz = cv.take<float>(T * c.E);
    s.dz_wr = cv.take<float>(T * d);
    s.d_router = cv.take<float>(c.E * d);
    s.experts = carve_experts(c, T, dtype, true, cv);
    return s;
  }
};

// Routing given by the caller: no router scratch.
struct RoutedForwardScratch {
  float* x;        // [T, d] fp32 X
  float* weights;  // [T, K] fp32 topk_weights
  int32_t* cursor; // [E]
  float* y;        // [R_max, d]
  ExpertScratch experts;
  static RoutedForwardScratch carve(const MoEConfig& c, int64_t T, DType dtype, Carver& cv) {
    RoutedForwardScratch s{};
    s.x = cv.take<float>(T * c.d);
    s.weights = cv.take<float>(T * c.K);
    s.cursor = cv.take<int32_t>(c.E);
    s.y = cv.take<float>(max_routed_rows(c, T) * c.d);
    s.experts = carve_experts(c, T, dtype, false, cv);
    return s;
  }
};

struct RoutedBackwardScratch {
  float* x;        // [T, d] fp32 X
  float* dS;       // [R_max]
  float* dH;       // [R_max, W]
  float* dx_rows;  // [R_max, d]
  ExpertScratch experts;
  static RoutedBackwardScratch carve(const MoEConfig& c, int64_t T, DType dtype, Carver& cv) {
    const int64_t R = max_routed_rows(c, T);
    RoutedBackwardScratch s{};
    s.x = cv.take<float>(T * c.d);
    s.dS = cv.take<float>(R);
    s.dH = cv.take<float>(R * up_width(c));
    s.dx_rows = cv.take<float>(R * c.d);
    s.experts = carve_experts(c, T, dtype, true, cv);
    return s;
  }
};

// z = X·Wrᵀ in fp32 (s.x already holds fp32 X), then p = softmax(z) and lse.
void router_probabilities(const MoEConfig& c, const Tensor& router_w, int64_t T, const RouterScratch& s) {
  to_float(router_w.data, router_w.dtype, c.E * c.d, s.router_w);
  gemm(false, true, T, c.E, c.d, s.x, s.router_w, s.z);
  softmax_rows(s.z, T, c.E, s.p, s.lse);
}

ExpertsProblem experts_problem(const MoEConfig& c, DType dtype, const MoEWeights& w, const SavedState& saved) {
  return {c.d, c.n, c.E, dtype, w.gate_up_proj.data, w.down_proj.data, saved.expert_offsets.ptr<int32_t>(),
          saved.row_token.ptr<int32_t>(), saved.row_gate.ptr<float>(), act::params_of(c), c.interleaved,
          c.transposed, w.gate_up_bias.data, w.down_bias.data, c.precision == Precision::fp8};
}

// The expert part of backward, shared by both routings: the W2 phase (dS, dH, dW2, db2), then the
// W1 phase (dX_exp, dW1, db1), each gradient handed to the callback right after its last read.
void experts_backward(const ExpertsProblem& problem, const void* d_out, const SavedState& saved, const float* x,
                      float* dS, float* dH, float* dx_rows, const MoEGrads& g, const ExpertGradCallback& on_grad,
                      const ExpertScratch& s) {
  experts_backward_down(problem, d_out, saved.h.data, dS, dH, g.d_down_proj.data, s, g.d_down_bias.data);
  if (on_grad && g.d_down_proj.defined()) on_grad(ExpertWeight::down_proj, g.d_down_proj);
  if (on_grad && g.d_down_bias.defined()) on_grad(ExpertWeight::down_bias, g.d_down_bias);
  experts_backward_up(problem, x, dH, dx_rows, g.d_gate_up_proj.data, s, g.d_gate_up_bias.data);
  if (on_grad && g.d_gate_up_proj.defined()) on_grad(ExpertWeight::gate_up_proj, g.d_gate_up_proj);
  if (on_grad && g.d_gate_up_bias.defined()) on_grad(ExpertWeight::gate_up_bias, g.d_gate_up_bias);
}

// Index of element i (row-major order) of a possibly strided tensor, in elements.
int64_t strided_offset(const Tensor& t, int64_t i) {
  int64_t off = 0;
  for (int k = t.ndim - 1; k >= 0; --k) {
    off += (i % t.shape[k]) * t.stride[k];
    i /= t.shape[k];
  }
  return off;
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu; }

  std::string description() const override {
    // The OpenBLAS core matters: on VMs it may detect "Prescott" (SSE3 kernels, ~2.6x slower than
    // SkylakeX's on the same machine); OPENBLAS_CORETYPE=SkylakeX or Haswell overrides it.
    return "cpu: fp32 math, OpenMP (" + std::to_string(omp_get_max_threads()) + " threads) + OpenBLAS sgemm (core " +
           openblas_get_corename() + ")";
  }

  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(kCarveAlign, (bytes + kCarveAlign - 1) / kCarveAlign * kCarveAlign);
    if (!p) throw Error("cpu allocate: argument 'bytes': could not allocate " + std::to_string(bytes) + " bytes");
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
  void copy(void* dst, const void* src, size_t bytes, CopyKind) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}

  std::string unsupported_reason(const MoEConfig&, DType) const override { return ""; }  // any valid storage
  bool supports_expert_biases() const override { return true; }

  size_t forward_workspace_bytes(const MoEConfig& c, int64_t T, DType dtype) const override {
    Carver measure;
    if (c.routing == Routing::given)
      RoutedForwardScratch::carve(c, T, dtype, measure);
    else
      ForwardScratch::carve(c, T, dtype, measure);
    return measure.used();
  }
  size_t backward_workspace_bytes(const MoEConfig& c, int64_t T, DType dtype) const override {
    Carver measure;
    if (c.routing == Routing::given)
      RoutedBackwardScratch::carve(c, T, dtype, measure);
    else
      BackwardScratch::carve(c, T, dtype, measure);
    return measure.used();
  }

  bool all_finite(const Tensor& t) override {
    if (t.dtype == DType::i32) return true;
    const int64_t count = t.numel();
    const bool flat = t.is_contiguous();
    bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
    for (int64_t i = 0; i < count; ++i)
      finite = finite && std::isfinite(load(t.data, t.dtype, flat ? i : strided_offset(t, i)));
    return finite;
  }

  void forward(const ForwardArgs& a) override {
    const MoEConfig& c = a.cfg;
    const int64_t T = a.x.shape[0], E = c.E, K = c.K;
    const DType dtype = a.x.dtype;
    SavedState& saved = a.saved;
    Carver cv(a.ws, "forward");
    const ForwardScratch s = ForwardScratch::carve(c, T, dtype, cv);
    const RouterScratch& r = s.router;

    // Routing: top-K on the logits, gates per DESIGN.md, optional token rounding, metadata.
    to_float(a.x.data, dtype, T * c.d, r.x);
    router_probabilities(c, a.w.router, T, r);
    int32_t* topk = saved.topk_experts.ptr<int32_t>();
    topk_rows(r.z, T, E, K, topk);
    chosen_prob_sums(r.p, topk, T, E, K, r.sum_chosen);
    const bool renormalised = gates_renormalised(c);
    for (int64_t t = 0; t < T; ++t) s.gate_denominator[t] = renormalised ? r.sum_chosen[t] : 1.f;
    mark_topk_pairs(topk, T, E, K, s.code);
    if (c.routing == Routing::token_rounding)
      round_tokens(r.p, r.sum_chosen, T, E, c.tile, c.rounding_mode, s.code, s.pair_scratch);
    const RoutingMetadata meta{saved.row_token.ptr<int32_t>(), saved.row_gate.ptr<float>(),
                               saved.expert_offsets.ptr<int32_t>(), saved.token_offsets.ptr<int32_t>(),
                               saved.token_rows.ptr<int32_t>()};
    build_metadata(s.code, r.p, s.gate_denominator, T, E, s.pair_scratch, meta);

    if (a.losses.defined()) {
      topk_counts(topk, T, E, K, r.counts);
      float* losses = a.losses.ptr<float>();
      router_losses(r.p, r.lse, r.counts, T, E, K, &losses[0], &losses[1]);
    }

    // Experts, then the gather-sum aggregation o_t = sum over the token's rows of gate * Y.
    experts_forward(experts_problem(c, dtype, a.w, saved), r.x, saved.h.data, s.y, s.experts);
    gather_sum_rows(s.y, meta.row_gate, nullptr, meta.token_offsets, meta.token_rows, T, c.d, dtype, a.out.data);
  }

  void backward(const BackwardArgs& a) override {
    const MoEConfig& c = a.cfg;
    const SavedState& saved = a.saved;
    const int64_t T = saved.T, E = c.E, K = c.K, d = c.d;
    const DType dtype = a.d_out.dtype;
    const MoEGrads& g = a.grads;
    Carver cv(a.ws, "backward");
    const BackwardScratch s = BackwardScratch::carve(c, T, dtype, cv);
    const RouterScratch& r = s.router;
    const ExpertsProblem problem = experts_problem(c, dtype, a.w, saved);
    const int32_t* token_offsets = saved.token_offsets.ptr<int32_t>();
    const int32_t* token_rows = saved.token_rows.ptr<int32_t>();

    to_float(saved.x.data, saved.x.dtype, T * d, r.x);
    const bool want_dx = g.dx.defined();
    experts_backward(problem, a.d_out.data, saved, r.x, s.dS, s.dH, want_dx ? s.dx_rows : nullptr, g, a.on_expert_grad,
                     s.experts);

    // Router path, from logits recomputed out of X and Wr (nothing else is cached).
    if (!want_dx && !g.d_router.defined()) return;
    router_probabilities(c, a.w.router, T, r);
    const int32_t* topk = saved.topk_experts.ptr<int32_t>();
    chosen_prob_sums(r.p, topk, T, E, K, r.sum_chosen);
    topk_counts(topk, T, E, K, r.counts);
    row_experts(saved.expert_offsets.ptr<int32_t>(), E, s.row_expert);
    const bool weights_given = a.d_losses.defined();
    const RouterBackwardInputs in{r.p,
                                  r.lse,
                                  r.sum_chosen,
                                  gates_renormalised(c),
                                  topk,
                                  r.counts,
                                  token_offsets,
                                  token_rows,
                                  s.row_expert,
                                  s.dS,
                                  weights_given ? a.d_losses.ptr<float>()[0] : c.aux_loss_coef,
                                  weights_given ? a.d_losses.ptr<float>()[1] : c.z_loss_coef};
    router_backward(in, T, E, K, s.dz);

    if (g.d_router.defined()) {
      gemm(true, false, E, d, T, s.dz, r.x, s.d_router);  // dWr = dzᵀ·X
      store(s.d_router, E * d, dtype, g.d_router.data);
    }
    if (want_dx) {
      gemm(false, false, T, d, E, s.dz, r.router_w, s.dz_wr);  // dz·Wr
      gather_sum_rows(s.dx_rows, nullptr, s.dz_wr, token_offsets, token_rows, T, d, dtype, g.dx.data);
    }
  }

  void forward_routed(const RoutedForwardArgs& a) override {
    const MoEConfig& c = a.cfg;
    const int64_t T = a.topk_experts.shape[0], K = c.K;
    const DType dtype = a.x.dtype;
    SavedState& saved = a.saved;
    Carver cv(a.ws, "forward_routed");
    const RoutedForwardScratch s = RoutedForwardScratch::carve(c, T, dtype, cv);
    to_float(a.x.data, dtype, a.x.numel(), s.x);  // T rows, or the EP owner's received tokens (<= T)
    to_float(a.topk_weights.data, a.topk_weights.dtype, T * K, s.weights);
    if (T > 0) std::memcpy(saved.topk_experts.data, a.topk_experts.data, size_t(T * K) * sizeof(int32_t));
    const RoutingMetadata meta{saved.row_token.ptr<int32_t>(), saved.row_gate.ptr<float>(),
                               saved.expert_offsets.ptr<int32_t>(), saved.token_offsets.ptr<int32_t>(),
                               saved.token_rows.ptr<int32_t>()};
    const int64_t R =
        build_given_metadata(saved.topk_experts.ptr<int32_t>(), s.weights, T, c.E, K, s.cursor, meta, a.x_rows);
    // Rows past the routed ones (sentinel slots) are zeroed: the saved state is a function of the inputs.
    const int64_t tail = saved.rows_capacity - R, W = up_width(c);
    if (tail > 0) {
      std::memset(advance(saved.h.data, dtype, R * W), 0, size_t(tail * W) * dtype_size(dtype));
      for (Tensor* t : {&saved.row_gate, &saved.row_token, &saved.token_rows})
        std::memset(static_cast<char*>(t->data) + R * 4, 0, size_t(tail) * 4);
    }
    experts_forward(experts_problem(c, dtype, a.w, saved), s.x, saved.h.data, s.y, s.experts);
    gather_sum_rows(s.y, a.weighted_out ? meta.row_gate : nullptr, nullptr, meta.token_offsets, meta.token_rows, T,
                    c.d, dtype, a.out.data);
  }

  void backward_routed(const RoutedBackwardArgs& a) override {
    const MoEConfig& c = a.cfg;
    const SavedState& saved = a.saved;
    const int64_t T = saved.T, d = c.d;
    const DType dtype = a.d_out.dtype;
    const MoEGrads& g = a.grads;
    Carver cv(a.ws, "backward_routed");
    const RoutedBackwardScratch s = RoutedBackwardScratch::carve(c, T, dtype, cv);
    to_float(saved.x.data, saved.x.dtype, saved.x.numel(), s.x);  // as in forward_routed
    const bool want_dx = g.dx.defined();
    experts_backward(experts_problem(c, dtype, a.w, saved), a.d_out.data, saved, s.x, s.dS, s.dH,
                     want_dx ? s.dx_rows : nullptr, g, a.on_expert_grad, s.experts);
    const int32_t* token_offsets = saved.token_offsets.ptr<int32_t>();
    const int32_t* token_rows = saved.token_rows.ptr<int32_t>();
    if (want_dx) gather_sum_rows(s.dx_rows, nullptr, nullptr, token_offsets, token_rows, T, d, dtype, g.dx.data);
    if (g.d_topk_weights.defined())
      scatter_given_ds(saved.topk_experts.ptr<int32_t>(), T, c.E, c.K, token_offsets, token_rows, s.dS,
                       g.d_topk_weights.dtype, g.d_topk_weights.data);
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace leanmoe::detail
