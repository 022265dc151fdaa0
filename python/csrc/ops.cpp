// PyTorch operators over the leanmoe C++ API (with ep_ops.cpp, the only files of the project that include torch).
//
//   leanmoe::moe_forward          routing + experts; returns the output, the losses {aux, z} and
//                                 the saved state of docs/SPEC.md §3 as tensors (H, gates, routing arrays)
//   leanmoe::moe_backward         gradients of x, the router and both expert weights
//   leanmoe::moe_backward_adamw_  in-backward mode: dx and d_router are returned, each expert
//                                 weight is updated by AdamW the moment its gradient is complete
//                                 (the API's on_expert_grad callback) and its gradient is dropped
//   leanmoe::adamw_step_          the same AdamW update, for the standard (after-backward) path
//   leanmoe::fp8_weight_codes_    writes an expert weight's FP8 codes (leanmoe.MoE, precision="fp8")
//   leanmoe::moe_routed_forward   routing given by the caller (topk_experts, topk_weights): experts
//                                 only, any activation, optional biases, every weight layout
//   leanmoe::moe_routed_backward  gradients of x, the routing weights, the expert weights and biases
//   leanmoe::moe_routed_backward_adamw_  its in-backward mode (expert weights updated inside backward)
//   leanmoe::expert_activation    the activation alone, on CPU rows (checks a model's own against it)
//
// One kernel per operator serves both devices: tensors are handed over as views, and on the GPU
// the backend runs on torch's current stream. Workspaces come from torch's allocator (the CUDA
// caching allocator on the GPU), so nothing is allocated behind torch's back.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#ifdef LEANMOE_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "leanmoe/leanmoe.h"
#include "leanmoe/optim.h"
#include "torch_bridge.h"

namespace {

using leanmoe::DType;
using leanmoe_torch::parse_precision;
using leanmoe_torch::translate_errors;
using leanmoe_torch::view_of;


leanmoe::Stream current_stream(const at::Tensor& t) {
#ifdef LEANMOE_TORCH_CUDA
  if (t.is_cuda()) return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#else
  TORCH_CHECK(!t.is_cuda(), "leanmoe: this build of the torch extension has no CUDA support");
#endif
  return nullptr;
}

leanmoe::MoEConfig make_config(const at::Tensor& gate_up_proj, int64_t top_k, c10::string_view router,
                               bool norm_topk_prob, c10::string_view routing, int64_t tile,
                               c10::string_view rounding_mode, c10::string_view precision,
                               bool fp8_weights_given = false) {
  TORCH_CHECK(gate_up_proj.dim() == 3, "leanmoe: argument 'gate_up_proj': must be 3-D [E, 2n, d], got ",
              gate_up_proj.sizes());
  leanmoe::MoEConfig c;
  c.E = gate_up_proj.size(0);
  c.n = gate_up_proj.size(1) / 2;
  c.d = gate_up_proj.size(2);
  c.K = top_k;
  if (router == "softmax_then_topk") c.router = leanmoe::RouterConvention::softmax_then_topk;
  else if (router == "topk_then_softmax") c.router = leanmoe::RouterConvention::topk_then_softmax;
  else TORCH_CHECK(false, "leanmoe: argument 'router': must be 'softmax_then_topk' or 'topk_then_softmax', got '",
                   std::string(router), "'");
  c.norm_topk_prob = norm_topk_prob;
  if (routing == "topk") c.routing = leanmoe::Routing::topk;
  else if (routing == "token_rounding") c.routing = leanmoe::Routing::token_rounding;
  else TORCH_CHECK(false, "leanmoe: argument 'routing': must be 'topk' or 'token_rounding', got '",
                   std::string(routing), "'");
  c.tile = tile;
  if (rounding_mode == "nearest") c.rounding_mode = leanmoe::RoundingMode::nearest;
  else if (rounding_mode == "up") c.rounding_mode = leanmoe::RoundingMode::up;
  else if (rounding_mode == "down") c.rounding_mode = leanmoe::RoundingMode::down;
  else TORCH_CHECK(false, "leanmoe: argument 'rounding_mode': must be 'nearest', 'up' or 'down', got '",
                   std::string(rounding_mode), "'");
  c.precision = parse_precision(precision);
  c.fp8_weights_given = fp8_weights_given;
  return c;
}

leanmoe::DType storage_dtype(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? DType::bf16 : DType::f32; }
leanmoe::Device leanmoe_device(const at::Tensor& t) { return t.is_cuda() ? leanmoe::Device::cuda : leanmoe::Device::cpu; }

at::Tensor workspace(size_t bytes, const at::Tensor& like) {
  return at::empty({int64_t(bytes)}, like.options().dtype(at::kByte));
}


using SavedTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The saved-state views over torch tensors (each contiguous, shaped as make_saved_state makes them).
leanmoe::SavedState saved_state(const leanmoe::MoEConfig& cfg, const at::Tensor& x, const at::Tensor& h,
                                const at::Tensor& row_gate, const at::Tensor& row_token,
                                const at::Tensor& token_rows, const at::Tensor& token_offsets,
                                const at::Tensor& expert_offsets, const at::Tensor& topk_experts) {
  leanmoe::SavedState s;
  s.T = x.size(0);
  s.rows_capacity = leanmoe::max_routed_rows(cfg, s.T);
  s.x = view_of(x, "x");
  s.h = view_of(h, "h");
  s.row_gate = view_of(row_gate, "row_gate");
  s.row_token = view_of(row_token, "row_token");
  s.token_rows = view_of(token_rows, "token_rows");
  s.token_offsets = view_of(token_offsets, "token_offsets");
  s.expert_offsets = view_of(expert_offsets, "expert_offsets");
  s.topk_experts = view_of(topk_experts, "topk_experts");
  return s;
}

// The expert weights' FP8 codes kept by leanmoe.MoE (precision="fp8") and by transformers experts
// under experts_implementation="leanmoe_fp8" (routing given): gate_up_proj's codes,
// scales, codes_t and scales_t, then down_proj's (MoEWeights::fp8's layout, e4m3 codes as
// torch.float8_e4m3fn). None: the layer quantizes the weights per call.
using Fp8Weights = c10::optional<at::TensorList>;

constexpr const char* kFp8WeightArgs[2][4] = {
    {"fp8_weights[0] (gate_up_proj codes)", "fp8_weights[1] (gate_up_proj scales)",
     "fp8_weights[2] (gate_up_proj codes_t)", "fp8_weights[3] (gate_up_proj scales_t)"},
    {"fp8_weights[4] (down_proj codes)", "fp8_weights[5] (down_proj scales)", "fp8_weights[6] (down_proj codes_t)",
     "fp8_weights[7] (down_proj scales_t)"}};

at::TensorList fp8_weight_list(const Fp8Weights& fp8, int which) {
  TORCH_CHECK_VALUE(fp8->size() == 8, "leanmoe: argument 'fp8_weights': 8 tensors (codes, scales, codes_t, "
                    "scales_t of gate_up_proj, then of down_proj), got ", fp8->size());
  return fp8->slice(4 * which, 4);
}

// The codes into w.fp8 (none: nothing), checked by the API (validate.cpp, check_fp8_weights).
void set_fp8_weights(leanmoe::MoEWeights& w, const Fp8Weights& fp8) {
  if (!fp8) return;
  leanmoe::Fp8WeightCodes* dst[2] = {&w.fp8.gate_up_proj, &w.fp8.down_proj};
  for (int which = 0; which < 2; ++which) {
    const at::TensorList t = fp8_weight_list(fp8, which);
    const char* const* arg = kFp8WeightArgs[which];
    *dst[which] = {view_of(t[0], arg[0]), view_of(t[1], arg[1]), view_of(t[2], arg[2]), view_of(t[3], arg[3])};
  }
}

leanmoe::MoEWeights weights(const at::Tensor& router_weight, const at::Tensor& gate_up_proj,
                            const at::Tensor& down_proj, const Fp8Weights& fp8 = c10::nullopt) {
  leanmoe::MoEWeights w{view_of(router_weight, "router_weight"), view_of(gate_up_proj, "gate_up_proj"),
                        view_of(down_proj, "down_proj")};
  set_fp8_weights(w, fp8);
  return w;
}

// One expert weight's FP8 copy for the optimizer's update and for fp8_weight_codes_: the weight
// [E, R, C] as stored, codes [E, R, C], scales [E, R/128, C/128], codes_t [E, C, R], scales_t
// [E, C/128, R/128]. Checked here: only raw pointers cross into leanmoe::optim::Fp8Copy.
leanmoe::optim::Fp8Copy fp8_copy_of(const at::Tensor& weight, at::TensorList t, const char* const* arg) {
  TORCH_CHECK_VALUE(t.size() == 4, "leanmoe: an FP8 copy is 4 tensors (codes, scales, codes_t, scales_t), got ",
                    t.size());
  TORCH_CHECK_VALUE(weight.dim() == 3, "leanmoe: an expert weight with an FP8 copy must be 3-D [E, R, C], got ",
                    weight.sizes());
  const int64_t E = weight.size(0), R = weight.size(1), C = weight.size(2);
  TORCH_CHECK_VALUE(R % 128 == 0 && C % 128 == 0, "leanmoe: an expert weight with an FP8 copy needs both matrix "
                    "dims multiples of 128 (the FP8 block), got ", weight.sizes());
  const std::vector<int64_t> shapes[4] = {{E, R, C}, {E, R / 128, C / 128}, {E, C, R}, {E, C / 128, R / 128}};
  for (int i = 0; i < 4; ++i) {
    const at::ScalarType want = i % 2 == 0 ? at::kFloat8_e4m3fn : at::kFloat;
    TORCH_CHECK_VALUE(t[i].scalar_type() == want && t[i].sizes() == at::IntArrayRef(shapes[i]) &&
                          t[i].is_contiguous() && t[i].device() == weight.device(),
                      "leanmoe: argument '", arg[i], "': must be a contiguous ", want, " tensor of shape ",
                      at::IntArrayRef(shapes[i]), " on ", weight.device(), ", got ", t[i].scalar_type(), t[i].sizes(),
                      " on ", t[i].device());
  }
  return {E, R, C, static_cast<uint8_t*>(t[0].data_ptr()), t[1].data_ptr<float>(),
          static_cast<uint8_t*>(t[2].data_ptr()), t[3].data_ptr<float>()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
moe_forward(const at::Tensor& x, const at::Tensor& router_weight, const at::Tensor& gate_up_proj,
            const at::Tensor& down_proj, int64_t top_k, c10::string_view router, bool norm_topk_prob,
            c10::string_view routing, int64_t tile, c10::string_view rounding_mode,
            c10::string_view precision, const Fp8Weights& fp8_weights) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const leanmoe::MoEConfig cfg = make_config(gate_up_proj, top_k, router, norm_topk_prob, routing, tile,
                                               rounding_mode, precision, fp8_weights.has_value());
    TORCH_CHECK(x.dim() == 2, "leanmoe::moe_forward: argument 'x': must be 2-D [T, d], got ", x.sizes());
    for (auto [name, t] : {std::pair{"x", &x}, {"router_weight", &router_weight}, {"gate_up_proj", &gate_up_proj},
                           {"down_proj", &down_proj}})
      TORCH_CHECK_VALUE(t->scalar_type() == at::kBFloat16 || t->scalar_type() == at::kFloat,
                        "leanmoe::moe_forward: argument '", name, "': dtype must be bfloat16 or float32, got ",
                        t->scalar_type());
    const int64_t T = x.size(0);
    // Checks cfg (e.g. top_k in 1..E) and T before any tensor is sized from them.
    const leanmoe::LayerPlan plan = leanmoe::plan_layer(cfg, T, storage_dtype(x), leanmoe_device(x));
    const int64_t R = leanmoe::max_routed_rows(cfg, T);
    const auto f32 = x.options().dtype(at::kFloat);
    const auto i32 = x.options().dtype(at::kInt);
    // With token rounding fewer than R_max rows may be used; the rest is zeroed so that the outputs
    // are a function of the inputs (opcheck and torch.compile compare them).
    const bool partial = cfg.routing == leanmoe::Routing::token_rounding;
    auto rows = [&](at::IntArrayRef shape, const at::TensorOptions& o) {
      return partial ? at::zeros(shape, o) : at::empty(shape, o);
    };
    at::Tensor out = at::empty({T, cfg.d}, x.options());
    at::Tensor losses = at::empty({2}, f32);
    at::Tensor h = rows({R, 2 * cfg.n}, x.options());
    at::Tensor row_gate = rows({R}, f32), row_token = rows({R}, i32), token_rows = rows({R}, i32);
    at::Tensor token_offsets = at::empty({T + 1}, i32), expert_offsets = at::empty({cfg.E + 1}, i32);
    at::Tensor topk_experts = at::empty({T, cfg.K}, i32);
    leanmoe::SavedState saved =
        saved_state(cfg, x, h, row_gate, row_token, token_rows, token_offsets, expert_offsets, topk_experts);
    at::Tensor ws = workspace(plan.forward_workspace_bytes, x);
    leanmoe::forward(cfg, view_of(x, "x"), weights(router_weight, gate_up_proj, down_proj, fp8_weights),
                     view_of(out, "out"),
                     view_of(losses, "losses"), saved, {ws.data_ptr(), plan.forward_workspace_bytes},
                     current_stream(x));
    return std::make_tuple(out, losses, h, row_gate, row_token, token_rows, token_offsets, expert_offsets,
                           topk_experts);
  });
}

// Shared by both backward operators: runs leanmoe::backward with the given expert-gradient
// buffers and callback, returns {dx, d_router}.
std::tuple<at::Tensor, at::Tensor> run_backward(
    const leanmoe::MoEConfig& cfg, const at::Tensor& d_out, const at::Tensor& d_losses, const at::Tensor& x,
    const at::Tensor& router_weight, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
    const at::Tensor& h, const at::Tensor& row_gate, const at::Tensor& row_token, const at::Tensor& token_rows,
    const at::Tensor& token_offsets, const at::Tensor& expert_offsets, const at::Tensor& topk_experts,
    const leanmoe::Tensor& d_gate_up_proj, const leanmoe::Tensor& d_down_proj,
    const leanmoe::ExpertGradCallback& on_expert_grad, const Fp8Weights& fp8_weights) {
  const int64_t T = x.size(0);
  // Autograd may hand over a non-contiguous or expanded gradient; the API wants row-major storage.
  const at::Tensor dout = d_out.contiguous();
  const at::Tensor dlosses = d_losses.to(at::kFloat).contiguous();
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor d_router = at::empty_like(router_weight, at::MemoryFormat::Contiguous);
  const leanmoe::SavedState saved =
      saved_state(cfg, x, h, row_gate, row_token, token_rows, token_offsets, expert_offsets, topk_experts);
  const leanmoe::LayerPlan plan = leanmoe::plan_layer(cfg, T, storage_dtype(x), leanmoe_device(x));
  at::Tensor ws = workspace(plan.backward_workspace_bytes, x);
  const leanmoe::MoEGrads grads{view_of(dx, "dx"), view_of(d_router, "d_router"), d_gate_up_proj, d_down_proj};
  leanmoe::backward(cfg, view_of(dout, "d_out"), view_of(dlosses, "d_losses"),
                    weights(router_weight, gate_up_proj, down_proj, fp8_weights), saved, grads,
                    {ws.data_ptr(), plan.backward_workspace_bytes}, on_expert_grad, current_stream(x));
  return {dx, d_router};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_backward(
    const at::Tensor& d_out, const at::Tensor& d_losses, const at::Tensor& x, const at::Tensor& router_weight,
    const at::Tensor& gate_up_proj, const at::Tensor& down_proj, const at::Tensor& h, const at::Tensor& row_gate,
    const at::Tensor& row_token, const at::Tensor& token_rows, const at::Tensor& token_offsets,
    const at::Tensor& expert_offsets, const at::Tensor& topk_experts, int64_t top_k, c10::string_view router,
    bool norm_topk_prob, c10::string_view routing, int64_t tile, c10::string_view rounding_mode,
    c10::string_view precision, const Fp8Weights& fp8_weights) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const leanmoe::MoEConfig cfg = make_config(gate_up_proj, top_k, router, norm_topk_prob, routing, tile,
                                               rounding_mode, precision, fp8_weights.has_value());
    at::Tensor d_gate_up = at::empty_like(gate_up_proj, at::MemoryFormat::Contiguous);
    at::Tensor d_down = at::empty_like(down_proj, at::MemoryFormat::Contiguous);
    auto [dx, d_router] = run_backward(cfg, d_out, d_losses, x, router_weight, gate_up_proj, down_proj, h, row_gate,
                                       row_token, token_rows, token_offsets, expert_offsets, topk_experts,
                                       view_of(d_gate_up, "d_gate_up_proj"), view_of(d_down, "d_down_proj"), nullptr,
                                       fp8_weights);
    return std::make_tuple(dx, d_router, d_gate_up, d_down);
  });
}

struct AdamWHyper {
  double lr, beta1, beta2, weight_decay, eps;
};

// Elements per fp32 copy of the gradient in a master-weight step: bounds that transient copy
// (64 MiB) whatever the tensor's size.
constexpr int64_t kMasterChunk = int64_t(1) << 24;

// Which arithmetic steps a tensor (leanmoe.optim.ExpertAdamW picks it per tensor): "torch", torch's
// fused AdamW kernel (torch.optim.AdamW(fused=True)'s bits), or "leanmoe", the core's fused update
// (leanmoe::optim::update_tensor, the C++ ExpertOptimizer's AdamW: moments of exp_avg's dtype, fp32
// or bf16 (what ExpertAdamW keeps for bf16 weights without a master), the step count on
// the host, the same bits on CPU and GPU), which also writes the tensor's FP8 copy in its pass (the
// expert weights of leanmoe.MoE(precision="fp8") take it).
enum class UpdateKernel { torch, leanmoe };

UpdateKernel parse_update(c10::string_view name) {
  if (name == "torch") return UpdateKernel::torch;
  TORCH_CHECK_VALUE(name == "leanmoe", "leanmoe: argument 'update': must be 'torch' or 'leanmoe', got '",
                    std::string(name), "'");
  return UpdateKernel::leanmoe;
}

// The "leanmoe" update: the step count is a CPU float32 scalar (read without a device sync).
void leanmoe_adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_sq, const at::Tensor& step, const AdamWHyper& hp,
                          const c10::optional<at::Tensor>& master, const leanmoe::optim::Fp8Copy& fp8) {
  TORCH_CHECK_VALUE(step.device().is_cpu() && step.numel() == 1 && step.scalar_type() == at::kFloat,
                    "leanmoe: argument 'step': update='leanmoe' counts steps on the host: a CPU float32 scalar, "
                    "got ", step.scalar_type(), step.sizes(), " on ", step.device());
  const int64_t t = int64_t(step.item<float>()) + 1;
  leanmoe::optim::UpdateState state;
  state.exp_avg = view_of(exp_avg, "exp_avg");
  state.exp_avg_sq = view_of(exp_avg_sq, "exp_avg_sq");
  state.moments = state.exp_avg.dtype;  // the core checks exp_avg_sq against it
  if (master && master->defined()) state.master = view_of(*master, "master");
  const at::Tensor g = grad.contiguous();
  const leanmoe::optim::AdamW rule{float(hp.lr), float(hp.beta1), float(hp.beta2), float(hp.eps),
                                   float(hp.weight_decay)};
  leanmoe::optim::update_tensor(rule, t, view_of(param, "param"), view_of(g, "grad"), state, fp8, 1.f,
                                current_stream(param));
  step.fill_(double(t));
}

// One AdamW step of one tensor: exactly what torch.optim.AdamW(fused=True) does per parameter
// (step += 1, then the fused kernel), so both training modes and plain torch agree bit for bit.
// With an fp32 master copy (bf16 parameters, ExpertAdamW(master_weights=True)): the same step on
// the master, with the gradient upcast to fp32 chunk by chunk (the kernel is element-wise, so the
// chunks change no bit) and fp32 moments, then the parameter receives bf16(master): what
// torch.optim.AdamW(fused=True) over fp32 copies of the parameters computes, rounded to bf16.
void adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, const at::Tensor& step, const AdamWHyper& hp,
                  const c10::optional<at::Tensor>& master, UpdateKernel kernel, const leanmoe::optim::Fp8Copy& fp8) {
  if (kernel == UpdateKernel::leanmoe)
    return leanmoe_adamw_update(param, grad, exp_avg, exp_avg_sq, step, hp, master, fp8);
  TORCH_CHECK_VALUE(fp8.codes == nullptr, "leanmoe: argument 'fp8_copy': written by update='leanmoe' only");
  step.add_(1);
  if (!master.has_value() || !master->defined()) {
    at::_fused_adamw_({param}, {grad}, {exp_avg}, {exp_avg_sq}, {}, {step}, hp.lr, hp.beta1, hp.beta2,
                      hp.weight_decay, hp.eps, /*amsgrad=*/false, /*maximize=*/false);
    return;
  }
  TORCH_CHECK_VALUE(master->scalar_type() == at::kFloat && master->numel() == param.numel() &&
                        master->is_contiguous() && exp_avg.scalar_type() == at::kFloat &&
                        exp_avg_sq.scalar_type() == at::kFloat,
                    "leanmoe::adamw_step_: argument 'master': must be a contiguous float32 tensor of the "
                    "parameter's numel, with float32 moments");
  const at::Tensor m = master->view({-1}), g = grad.contiguous().view({-1});
  const at::Tensor ea = exp_avg.view({-1}), eas = exp_avg_sq.view({-1});
  for (int64_t begin = 0; begin < m.numel(); begin += kMasterChunk) {
    const int64_t len = std::min(kMasterChunk, m.numel() - begin);
    at::_fused_adamw_({m.narrow(0, begin, len)}, {g.narrow(0, begin, len).to(at::kFloat)},
                      {ea.narrow(0, begin, len)}, {eas.narrow(0, begin, len)}, {}, {step}, hp.lr, hp.beta1,
                      hp.beta2, hp.weight_decay, hp.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
  param.copy_(master->view(param.sizes()));
}

constexpr const char* kFp8CopyArgs[4] = {"fp8_copy[0] (codes)", "fp8_copy[1] (scales)", "fp8_copy[2] (codes_t)",
                                         "fp8_copy[3] (scales_t)"};

void adamw_step_(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                 const at::Tensor& exp_avg_sq, const at::Tensor& step, double lr, double beta1, double beta2,
                 double weight_decay, double eps, const c10::optional<at::Tensor>& master, c10::string_view update,
                 const c10::optional<at::TensorList>& fp8_copy) {
  translate_errors([&] {
    c10::DeviceGuard guard(param.device());
    leanmoe::optim::Fp8Copy copy;
    if (fp8_copy) copy = fp8_copy_of(param, *fp8_copy, kFp8CopyArgs);
    adamw_update(param, grad, exp_avg, exp_avg_sq, step, {lr, beta1, beta2, weight_decay, eps}, master,
                 parse_update(update), copy);
  });
}

void fp8_weight_codes_(const at::Tensor& weight, at::TensorList codes) {
  translate_errors([&] {
    c10::DeviceGuard guard(weight.device());
    TORCH_CHECK_VALUE(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous(),
                      "leanmoe::fp8_weight_codes_: argument 'weight': must be a contiguous bfloat16 tensor, got ",
                      weight.scalar_type(), weight.sizes());
    leanmoe::optim::write_fp8_copy(view_of(weight, "weight"), fp8_copy_of(weight, codes, kFp8CopyArgs),
                                   current_stream(weight));
  });
}

// The in-backward AdamW step of one layer's two expert weights, for both routings. One gradient
// buffer for both: dW2 ([E, d, n]) sits in the front of dW1's [E, 2n, d] and is consumed (the
// callback) before dW1 is written, so the layer's expert gradients cost 2/3 of dW1 + dW2.
struct InBackwardAdamW {
  struct Weight {
    const at::Tensor& param;
    const at::Tensor &exp_avg, &exp_avg_sq, &step;
    const c10::optional<at::Tensor>& master;
  };
  const char* op;
  Weight gate_up, down;
  AdamWHyper hp;
  UpdateKernel kernel;
  leanmoe::optim::Fp8Copy gate_up_fp8, down_fp8;  // the FP8 copies the update rewrites (codes null: none)
  at::Tensor d_gate_up, d_down;
  bool updated_down = false, updated_gate_up = false;

  InBackwardAdamW(const char* op_name, Weight gate_up_w, Weight down_w, AdamWHyper hyper,
                  UpdateKernel update = UpdateKernel::torch, const Fp8Weights& fp8 = c10::nullopt)
      : op(op_name), gate_up(gate_up_w), down(down_w), hp(hyper), kernel(update) {
    if (fp8) {  // refused before backward runs: only the leanmoe update writes a copy
      TORCH_CHECK_VALUE(kernel == UpdateKernel::leanmoe, op, ": argument 'fp8_weights': the weights' FP8 codes "
                        "are rewritten by update='leanmoe' only");
      gate_up_fp8 = fp8_copy_of(gate_up.param, fp8_weight_list(fp8, 0), kFp8WeightArgs[0]);
      down_fp8 = fp8_copy_of(down.param, fp8_weight_list(fp8, 1), kFp8WeightArgs[1]);
    }
    TORCH_CHECK_VALUE(gate_up.param.is_contiguous() && down.param.is_contiguous(), op,
                      ": arguments 'gate_up_proj' and 'down_proj': must be contiguous (they are updated in place)");
    at::Tensor grad_buffer = at::empty({gate_up.param.numel()}, gate_up.param.options());
    d_gate_up = grad_buffer.view(gate_up.param.sizes());
    d_down = grad_buffer.narrow(0, 0, down.param.numel()).view(down.param.sizes());
  }
  // The expert biases (routing given) are not updated here: their gradients are returned.
  leanmoe::ExpertGradCallback callback() {
    return [this](leanmoe::ExpertWeight which, const leanmoe::Tensor&) {
      if (which == leanmoe::ExpertWeight::down_proj) {
        adamw_update(down.param, d_down, down.exp_avg, down.exp_avg_sq, down.step, hp, down.master, kernel, down_fp8);
        updated_down = true;
      } else if (which == leanmoe::ExpertWeight::gate_up_proj) {
        adamw_update(gate_up.param, d_gate_up, gate_up.exp_avg, gate_up.exp_avg_sq, gate_up.step, hp,
                     gate_up.master, kernel, gate_up_fp8);
        updated_gate_up = true;
      }
    };
  }
  void check_done() const {
    TORCH_CHECK(updated_down && updated_gate_up, op, ": the backend returned without handing over both expert "
                "gradients");
  }
};

std::tuple<at::Tensor, at::Tensor> moe_backward_adamw_(
    const at::Tensor& d_out, const at::Tensor& d_losses, const at::Tensor& x, const at::Tensor& router_weight,
    const at::Tensor& gate_up_proj, const at::Tensor& down_proj, const at::Tensor& h, const at::Tensor& row_gate,
    const at::Tensor& row_token, const at::Tensor& token_rows, const at::Tensor& token_offsets,
    const at::Tensor& expert_offsets, const at::Tensor& topk_experts, int64_t top_k, c10::string_view router,
    bool norm_topk_prob, c10::string_view routing, int64_t tile, c10::string_view rounding_mode,
    c10::string_view precision, const at::Tensor& gate_up_exp_avg, const at::Tensor& gate_up_exp_avg_sq,
    const at::Tensor& gate_up_step, const at::Tensor& down_exp_avg, const at::Tensor& down_exp_avg_sq,
    const at::Tensor& down_step, double lr, double beta1, double beta2, double weight_decay, double eps,
    const c10::optional<at::Tensor>& gate_up_master, const c10::optional<at::Tensor>& down_master,
    c10::string_view update_kernel, const Fp8Weights& fp8_weights) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const leanmoe::MoEConfig cfg = make_config(gate_up_proj, top_k, router, norm_topk_prob, routing, tile,
                                               rounding_mode, precision, fp8_weights.has_value());
    // With the weights' codes given, the update rewrites them (the backend's callback order makes it
    // safe: docs/DESIGN.md "The weights' codes given").
    InBackwardAdamW update("leanmoe::moe_backward_adamw_",
                           {gate_up_proj, gate_up_exp_avg, gate_up_exp_avg_sq, gate_up_step, gate_up_master},
                           {down_proj, down_exp_avg, down_exp_avg_sq, down_step, down_master},
                           {lr, beta1, beta2, weight_decay, eps}, parse_update(update_kernel), fp8_weights);
    auto result = run_backward(cfg, d_out, d_losses, x, router_weight, gate_up_proj, down_proj, h, row_gate,
                               row_token, token_rows, token_offsets, expert_offsets, topk_experts,
                               view_of(update.d_gate_up, "d_gate_up_proj"), view_of(update.d_down, "d_down_proj"),
                               update.callback(), fp8_weights);
    update.check_done();
    return result;
  });
}

// ---- routing given by the caller ----
leanmoe::Activation parse_activation(c10::string_view name) {
  for (int i = 0; i <= int(leanmoe::Activation::relu2); ++i)
    if (name == leanmoe::activation_name(leanmoe::Activation(i))) return leanmoe::Activation(i);
  std::string all;
  for (int i = 0; i <= int(leanmoe::Activation::relu2); ++i)
    all += std::string(i ? ", " : "") + leanmoe::activation_name(leanmoe::Activation(i));
  TORCH_CHECK_VALUE(false, "leanmoe: argument 'activation': must be one of ", all, ", got '", std::string(name), "'");
}

// The experts' function from the ops' arguments (the activation, its constants, W1's row order); the rest
// of the config at its defaults.
leanmoe::MoEConfig expert_function_config(c10::string_view activation, double act_alpha, double act_limit,
                                          double act_up_offset, bool interleaved) {
  leanmoe::MoEConfig c;
  c.activation = parse_activation(activation);
  c.act_alpha = float(act_alpha);
  c.act_limit = float(act_limit);
  c.act_up_offset = float(act_up_offset);
  c.interleaved = interleaved;
  return c;
}

// The layer's shape from the weights in their layout: gate_up_proj [E, W, d] ([E, d, W] transposed).
leanmoe::MoEConfig routed_config(const at::Tensor& gate_up_proj, int64_t top_k, c10::string_view activation,
                                 double act_alpha, double act_limit, double act_up_offset, bool interleaved,
                                 bool transposed, c10::string_view precision, bool fp8_weights_given = false) {
  TORCH_CHECK_VALUE(gate_up_proj.dim() == 3, "leanmoe: argument 'gate_up_proj': must be 3-D [E, W, d] (or [E, d, W] "
                    "transposed), got ", gate_up_proj.sizes());
  leanmoe::MoEConfig c = expert_function_config(activation, act_alpha, act_limit, act_up_offset, interleaved);
  c.routing = leanmoe::Routing::given;
  c.transposed = transposed;
  const int64_t W = gate_up_proj.size(transposed ? 2 : 1);
  const bool gated = leanmoe::activation_is_gated(c.activation);
  TORCH_CHECK_VALUE(!gated || W % 2 == 0, "leanmoe: argument 'gate_up_proj': a gated activation (",
                    std::string(activation),
                    ") needs an even up-projection width W = 2n, got W = ", W);
  c.E = gate_up_proj.size(0);
  c.d = gate_up_proj.size(transposed ? 1 : 2);
  c.n = gated ? W / 2 : W;
  c.K = top_k;
  c.precision = parse_precision(precision);
  c.fp8_weights_given = fp8_weights_given;
  return c;
}

leanmoe::MoEWeights routed_weights(const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
                                   const c10::optional<at::Tensor>& gate_up_bias,
                                   const c10::optional<at::Tensor>& down_bias, const Fp8Weights& fp8) {
  leanmoe::MoEWeights w;
  w.gate_up_proj = view_of(gate_up_proj, "gate_up_proj");
  w.down_proj = view_of(down_proj, "down_proj");
  if (gate_up_bias) w.gate_up_bias = view_of(*gate_up_bias, "gate_up_bias");
  if (down_bias) w.down_bias = view_of(*down_bias, "down_bias");
  set_fp8_weights(w, fp8);
  return w;
}

using RoutedSaved = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                               at::Tensor>;

RoutedSaved moe_routed_forward(const at::Tensor& x, const at::Tensor& topk_experts, const at::Tensor& topk_weights,
                               const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
                               const c10::optional<at::Tensor>& gate_up_bias,
                               const c10::optional<at::Tensor>& down_bias, c10::string_view activation,
                               double act_alpha, double act_limit, double act_up_offset, bool interleaved,
                               bool transposed, c10::string_view precision, const Fp8Weights& fp8_weights) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    TORCH_CHECK_VALUE(topk_experts.dim() == 2, "leanmoe::moe_routed_forward: argument 'topk_experts': must be 2-D "
                      "[T, K], got ", topk_experts.sizes());
    const leanmoe::MoEConfig cfg =
        routed_config(gate_up_proj, topk_experts.size(1), activation, act_alpha, act_limit, act_up_offset,
                      interleaved, transposed, precision, fp8_weights.has_value());
    TORCH_CHECK_VALUE(x.dim() == 2, "leanmoe::moe_routed_forward: argument 'x': must be 2-D [T, d], got ", x.sizes());
    const int64_t T = x.size(0), R = leanmoe::max_routed_rows(cfg, T);
    const auto f32 = x.options().dtype(at::kFloat), i32 = x.options().dtype(at::kInt);
    at::Tensor out = at::empty({T, cfg.d}, x.options());
    at::Tensor h = at::empty({R, leanmoe::up_width(cfg)}, x.options());
    at::Tensor row_gate = at::empty({R}, f32), row_token = at::empty({R}, i32), token_rows = at::empty({R}, i32);
    at::Tensor token_offsets = at::empty({T + 1}, i32), expert_offsets = at::empty({cfg.E + 1}, i32);
    at::Tensor topk_saved = at::empty({T, cfg.K}, i32);
    leanmoe::SavedState saved =
        saved_state(cfg, x, h, row_gate, row_token, token_rows, token_offsets, expert_offsets, topk_saved);
    const leanmoe::LayerPlan plan = leanmoe::plan_layer(cfg, T, storage_dtype(x), leanmoe_device(x));
    at::Tensor ws = workspace(plan.forward_workspace_bytes, x);
    leanmoe::forward_routed(cfg, view_of(x, "x"), view_of(topk_experts, "topk_experts"),
                            view_of(topk_weights, "topk_weights"),
                            routed_weights(gate_up_proj, down_proj, gate_up_bias, down_bias, fp8_weights),
                            view_of(out, "out"),
                            saved, {ws.data_ptr(), plan.forward_workspace_bytes}, current_stream(x));
    return std::make_tuple(out, h, row_gate, row_token, token_rows, token_offsets, expert_offsets, topk_saved);
  });
}

// Shared by both routed backward operators: dx, d_topk_weights (dtype weights_dtype) and the bias
// gradients (empty when the bias is absent) are returned; the weight gradients go to the views given.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> run_routed_backward(
    const leanmoe::MoEConfig& cfg, const at::Tensor& d_out, const at::Tensor& x, const at::Tensor& gate_up_proj,
    const at::Tensor& down_proj, const c10::optional<at::Tensor>& gate_up_bias,
    const c10::optional<at::Tensor>& down_bias, const at::Tensor& h, const at::Tensor& row_gate,
    const at::Tensor& row_token, const at::Tensor& token_rows, const at::Tensor& token_offsets,
    const at::Tensor& expert_offsets, const at::Tensor& topk_saved, at::ScalarType weights_dtype,
    const leanmoe::Tensor& d_gate_up_proj, const leanmoe::Tensor& d_down_proj,
    const leanmoe::ExpertGradCallback& on_expert_grad, const Fp8Weights& fp8_weights) {
  const int64_t T = x.size(0);
  const at::Tensor dout = d_out.contiguous();
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor d_weights = at::empty({T, cfg.K}, x.options().dtype(weights_dtype));
  at::Tensor d_b1 = gate_up_bias ? at::empty_like(*gate_up_bias, at::MemoryFormat::Contiguous)
                                 : at::empty({0}, x.options());
  at::Tensor d_b2 = down_bias ? at::empty_like(*down_bias, at::MemoryFormat::Contiguous) : at::empty({0}, x.options());
  const leanmoe::SavedState saved =
      saved_state(cfg, x, h, row_gate, row_token, token_rows, token_offsets, expert_offsets, topk_saved);
  const leanmoe::LayerPlan plan = leanmoe::plan_layer(cfg, T, storage_dtype(x), leanmoe_device(x));
  at::Tensor ws = workspace(plan.backward_workspace_bytes, x);
  leanmoe::MoEGrads grads;
  grads.dx = view_of(dx, "dx");
  grads.d_gate_up_proj = d_gate_up_proj;
  grads.d_down_proj = d_down_proj;
  if (gate_up_bias) grads.d_gate_up_bias = view_of(d_b1, "d_gate_up_bias");
  if (down_bias) grads.d_down_bias = view_of(d_b2, "d_down_bias");
  grads.d_topk_weights = view_of(d_weights, "d_topk_weights");
  leanmoe::backward_routed(cfg, view_of(dout, "d_out"),
                           routed_weights(gate_up_proj, down_proj, gate_up_bias, down_bias, fp8_weights), saved,
                           grads, {ws.data_ptr(), plan.backward_workspace_bytes}, on_expert_grad, current_stream(x));
  return {dx, d_weights, d_b1, d_b2};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_routed_backward(
    const at::Tensor& d_out, const at::Tensor& x, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
    const c10::optional<at::Tensor>& gate_up_bias, const c10::optional<at::Tensor>& down_bias, const at::Tensor& h,
    const at::Tensor& row_gate, const at::Tensor& row_token, const at::Tensor& token_rows,
    const at::Tensor& token_offsets, const at::Tensor& expert_offsets, const at::Tensor& topk_saved,
    c10::string_view activation, double act_alpha, double act_limit, double act_up_offset, bool interleaved,
    bool transposed, c10::string_view precision, at::ScalarType weights_dtype, const Fp8Weights& fp8_weights) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const leanmoe::MoEConfig cfg =
        routed_config(gate_up_proj, topk_saved.size(1), activation, act_alpha, act_limit, act_up_offset, interleaved,
                      transposed, precision, fp8_weights.has_value());
    at::Tensor d_gate_up = at::empty_like(gate_up_proj, at::MemoryFormat::Contiguous);
    at::Tensor d_down = at::empty_like(down_proj, at::MemoryFormat::Contiguous);
    auto [dx, d_weights, d_b1, d_b2] = run_routed_backward(
        cfg, d_out, x, gate_up_proj, down_proj, gate_up_bias, down_bias, h, row_gate, row_token, token_rows,
        token_offsets, expert_offsets, topk_saved, weights_dtype, view_of(d_gate_up, "d_gate_up_proj"),
        view_of(d_down, "d_down_proj"), nullptr, fp8_weights);
    return std::make_tuple(dx, d_weights, d_gate_up, d_down, d_b1, d_b2);
  });
}

// In-backward mode of routing given: the expert weights are updated by AdamW inside backward
// (InBackwardAdamW, as moe_backward_adamw_); the biases' gradients are returned (the optimizer
// steps them after backward: they are E x W and E x d, not where the memory is).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_routed_backward_adamw_(
    const at::Tensor& d_out, const at::Tensor& x, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
    const c10::optional<at::Tensor>& gate_up_bias, const c10::optional<at::Tensor>& down_bias, const at::Tensor& h,
    const at::Tensor& row_gate, const at::Tensor& row_token, const at::Tensor& token_rows,
    const at::Tensor& token_offsets, const at::Tensor& expert_offsets, const at::Tensor& topk_saved,
    c10::string_view activation, double act_alpha, double act_limit, double act_up_offset, bool interleaved,
    bool transposed, c10::string_view precision, at::ScalarType weights_dtype, const at::Tensor& gate_up_exp_avg,
    const at::Tensor& gate_up_exp_avg_sq, const at::Tensor& gate_up_step, const at::Tensor& down_exp_avg,
    const at::Tensor& down_exp_avg_sq, const at::Tensor& down_step, double lr, double beta1, double beta2,
    double weight_decay, double eps, const c10::optional<at::Tensor>& gate_up_master,
    const c10::optional<at::Tensor>& down_master, c10::string_view update_kernel, const Fp8Weights& fp8_weights) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const leanmoe::MoEConfig cfg =
        routed_config(gate_up_proj, topk_saved.size(1), activation, act_alpha, act_limit, act_up_offset, interleaved,
                      transposed, precision, fp8_weights.has_value());
    InBackwardAdamW update("leanmoe::moe_routed_backward_adamw_",
                           {gate_up_proj, gate_up_exp_avg, gate_up_exp_avg_sq, gate_up_step, gate_up_master},
                           {down_proj, down_exp_avg, down_exp_avg_sq, down_step, down_master},
                           {lr, beta1, beta2, weight_decay, eps}, parse_update(update_kernel), fp8_weights);
    auto result = run_routed_backward(cfg, d_out, x, gate_up_proj, down_proj, gate_up_bias, down_bias, h, row_gate,
                                      row_token, token_rows, token_offsets, expert_offsets, topk_saved, weights_dtype,
                                      view_of(update.d_gate_up, "d_gate_up_proj"),
                                      view_of(update.d_down, "d_down_proj"), update.callback(), fp8_weights);
    update.check_done();
    return result;
  });
}

// "" when the backend of `like`'s device runs these experts (the layer's d, n, E from `like` =
// gate_up_proj in its layout), else the rule: leanmoe.hf checks a model once before running it.
std::string layer_unsupported_reason(const at::Tensor& like, c10::string_view activation, double act_alpha,
                                     double act_limit, double act_up_offset, bool interleaved, bool transposed,
                                     bool biases, c10::string_view precision) {
  return translate_errors([&] {
    leanmoe::MoEConfig cfg =
        routed_config(like, 1, activation, act_alpha, act_limit, act_up_offset, interleaved, transposed, precision);
    return leanmoe::unsupported_reason(cfg, storage_dtype(like), leanmoe_device(like), biases);
  });
}

at::Tensor expert_activation(const at::Tensor& h, c10::string_view activation, double act_alpha, double act_limit,
                             double act_up_offset, bool interleaved) {
  return translate_errors([&] {
    TORCH_CHECK_VALUE(h.dim() == 2, "leanmoe::expert_activation: argument 'h': must be 2-D [R, W], got ", h.sizes());
    leanmoe::MoEConfig c = expert_function_config(activation, act_alpha, act_limit, act_up_offset, interleaved);
    const bool gated = leanmoe::activation_is_gated(c.activation);
    c.n = gated ? h.size(1) / 2 : h.size(1);
    const at::Tensor hf = h.to(at::kFloat).contiguous();
    at::Tensor a = at::empty({h.size(0), c.n}, hf.options());
    leanmoe::expert_activation(c, view_of(hf, "h"), view_of(a, "a"));
    return a.to(h.scalar_type());
  });
}

}  // namespace

TORCH_LIBRARY(leanmoe, m) {
  const std::string config =
      "int top_k, str router, bool norm_topk_prob, str routing, int tile, str rounding_mode, str precision";
  const std::string saved =
      "Tensor h, Tensor row_gate, Tensor row_token, Tensor token_rows, Tensor token_offsets, "
      "Tensor expert_offsets, Tensor topk_experts";
  // The weights' FP8 codes (leanmoe.MoE with precision="fp8", transformers experts under
  // "leanmoe_fp8"): read by the layer, and rewritten by the in-backward update.
  const std::string fp8_weights = "Tensor[]? fp8_weights=None";
  m.def(("moe_forward(Tensor x, Tensor router_weight, Tensor gate_up_proj, Tensor down_proj, " + config + ", " +
         fp8_weights + ") -> (Tensor out, Tensor losses, " + saved + ")").c_str());
  m.def(("moe_backward(Tensor d_out, Tensor d_losses, Tensor x, Tensor router_weight, Tensor gate_up_proj, "
        "Tensor down_proj, " + saved + ", " + config + ", " + fp8_weights +
        ") -> (Tensor dx, Tensor d_router, Tensor d_gate_up_proj, Tensor d_down_proj)").c_str());
  // The AdamW state and hyper-parameters of both in-backward operators (InBackwardAdamW).
  const std::string adamw_state =
      "Tensor(c!) gate_up_exp_avg, Tensor(d!) gate_up_exp_avg_sq, Tensor(e!) gate_up_step, "
      "Tensor(f!) down_exp_avg, Tensor(g!) down_exp_avg_sq, Tensor(h!) down_step, "
      "float lr, float beta1, float beta2, float weight_decay, float eps, Tensor(i!)? gate_up_master=None, "
      "Tensor(j!)? down_master=None";
  m.def(("moe_backward_adamw_(Tensor d_out, Tensor d_losses, Tensor x, Tensor router_weight, "
        "Tensor(a!) gate_up_proj, Tensor(b!) down_proj, " + saved + ", " + config + ", " + adamw_state +
        ", str update=\"torch\", Tensor(k!)[]? fp8_weights=None) -> (Tensor dx, Tensor d_router)").c_str());
  m.def("adamw_step_(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, Tensor(d!) step, "
        "float lr, float beta1, float beta2, float weight_decay, float eps, Tensor(e!)? master=None, "
        "str update=\"torch\", Tensor(f!)[]? fp8_copy=None) -> ()");
  m.def("fp8_weight_codes_(Tensor weight, Tensor(a!)[] codes) -> ()");
  m.def("cuda_available() -> bool", [] { return leanmoe::backend_available(leanmoe::Device::cuda); });
  const std::string experts =
      "Tensor gate_up_proj, Tensor down_proj, Tensor? gate_up_bias, Tensor? down_bias";
  const std::string expert_fn =
      "str activation, float act_alpha, float act_limit, float act_up_offset, bool interleaved, bool transposed, "
      "str precision";
  const std::string routed_saved =
      "Tensor h, Tensor row_gate, Tensor row_token, Tensor token_rows, Tensor token_offsets, Tensor expert_offsets, "
      "Tensor topk_saved";
  m.def(("moe_routed_forward(Tensor x, Tensor topk_experts, Tensor topk_weights, " + experts + ", " + expert_fn +
         ", " + fp8_weights + ") -> (Tensor out, " + routed_saved + ")").c_str());
  m.def(("moe_routed_backward(Tensor d_out, Tensor x, " + experts + ", " + routed_saved + ", " + expert_fn +
         ", ScalarType weights_dtype, " + fp8_weights + ") -> (Tensor dx, Tensor d_topk_weights, "
         "Tensor d_gate_up_proj, Tensor d_down_proj, Tensor d_gate_up_bias, Tensor d_down_bias)").c_str());
  m.def(("moe_routed_backward_adamw_(Tensor d_out, Tensor x, Tensor(a!) gate_up_proj, Tensor(b!) down_proj, "
         "Tensor? gate_up_bias, Tensor? down_bias, " + routed_saved + ", " + expert_fn +
         ", ScalarType weights_dtype, " + adamw_state + ", str update=\"torch\", Tensor(k!)[]? fp8_weights=None" +
         ") -> (Tensor dx, Tensor d_topk_weights, Tensor d_gate_up_bias, Tensor d_down_bias)").c_str());
  m.def("expert_activation(Tensor h, str activation, float act_alpha, float act_limit, float act_up_offset, "
        "bool interleaved) -> Tensor");
  m.def("layer_unsupported_reason(Tensor like, str activation, float act_alpha, float act_limit, "
        "float act_up_offset, bool interleaved, "
        "bool transposed, bool biases, str precision=\"storage\") -> str",
        &layer_unsupported_reason);
}

TORCH_LIBRARY_IMPL(leanmoe, CPU, m) {
  m.impl("moe_routed_forward", &moe_routed_forward);
  m.impl("moe_routed_backward", &moe_routed_backward);
  m.impl("moe_routed_backward_adamw_", &moe_routed_backward_adamw_);
  m.impl("expert_activation", &expert_activation);
  m.impl("moe_forward", &moe_forward);
  m.impl("moe_backward", &moe_backward);
  m.impl("moe_backward_adamw_", &moe_backward_adamw_);
  m.impl("adamw_step_", &adamw_step_);
  m.impl("fp8_weight_codes_", &fp8_weight_codes_);
}

TORCH_LIBRARY_IMPL(leanmoe, CUDA, m) {
  m.impl("moe_routed_forward", &moe_routed_forward);
  m.impl("moe_routed_backward", &moe_routed_backward);
  m.impl("moe_routed_backward_adamw_", &moe_routed_backward_adamw_);
  m.impl("moe_forward", &moe_forward);
  m.impl("moe_backward", &moe_backward);
  m.impl("moe_backward_adamw_", &moe_backward_adamw_);
  m.impl("adamw_step_", &adamw_step_);
  m.impl("fp8_weight_codes_", &fp8_weight_codes_);
}
