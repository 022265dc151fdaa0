// Backend-independent parts of the public API: tensor helpers, planning, the saved-state layout,
// owned buffers, and the dispatch of forward/backward to the backend of the input's device.
#include <algorithm>
#include <string>

#include "activation.h"
#include "backend.h"
#include "validate.h"

namespace leanmoe {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::e4m3: return "e4m3";
  }
  return "?";
}
const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }
size_t dtype_size(DType t) { return t == DType::bf16 ? 2 : t == DType::e4m3 ? 1 : 4; }

const char* router_convention_name(RouterConvention r) {
  return r == RouterConvention::topk_then_softmax ? "topk_then_softmax" : "softmax_then_topk";
}
const char* routing_name(Routing r) {
  return r == Routing::topk ? "topk" : r == Routing::token_rounding ? "token_rounding" : "given";
}
const char* activation_name(Activation a) {
  switch (a) {
    case Activation::swiglu: return "swiglu";
    case Activation::geglu: return "geglu";
    case Activation::geglu_tanh: return "geglu_tanh";
    case Activation::reglu: return "reglu";
    case Activation::swiglu_clamped: return "swiglu_clamped";
    case Activation::swiglu_softcapped: return "swiglu_softcapped";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
    case Activation::relu: return "relu";
    case Activation::relu2: return "relu2";
  }
  return "?";
}
const char* precision_name(Precision p) { return p == Precision::fp8 ? "fp8" : "storage"; }
int64_t up_width(const MoEConfig& cfg) { return activation_is_gated(cfg.activation) ? 2 * cfg.n : cfg.n; }

void expert_activation(const MoEConfig& cfg, const Tensor& h, const Tensor& a) {
  const char* fn = "leanmoe::expert_activation";
  const int64_t W = up_width(cfg), n = cfg.n;
  auto check = [&](const char* arg, const Tensor& t, int64_t cols) {
    if (t.ndim != 2 || t.shape[1] != cols || t.dtype != DType::f32 || t.device != Device::cpu || !t.is_contiguous() ||
        (t.data == nullptr && t.numel() > 0))
      throw Error(std::string(fn) + ": argument '" + arg + "': must be a contiguous f32 [R, " + std::to_string(cols) +
                  "] tensor on cpu, got " + t.describe());
  };
  check("h", h, W);
  check("a", a, n);
  if (a.shape[0] != h.shape[0])
    throw Error(std::string(fn) + ": argument 'a': must have the rows of h (" + std::to_string(h.shape[0]) + "), got " +
                a.describe());
  const act::Params p = act::params_of(cfg);
  const bool gated = activation_is_gated(cfg.activation);
  for (int64_t r = 0; r < h.shape[0]; ++r) {
    const float* hr = h.ptr<float>() + r * W;
    for (int64_t j = 0; j < n; ++j) {
      const float g = hr[act::gate_column(j, cfg.interleaved)];
      const float u = gated ? hr[act::up_column(j, n, cfg.interleaved)] : 0.f;
      a.ptr<float>()[r * n + j] = act::forward(p, g, u);
    }
  }
}
const char* rounding_mode_name(RoundingMode m) {
  return m == RoundingMode::nearest ? "nearest" : m == RoundingMode::up ? "up" : "down";
}
const char* expert_weight_name(ExpertWeight w) {
  switch (w) {
    case ExpertWeight::down_proj: return "down_proj";
    case ExpertWeight::gate_up_proj: return "gate_up_proj";
    case ExpertWeight::down_bias: return "down_bias";
    case ExpertWeight::gate_up_bias: return "gate_up_bias";
  }
  return "?";
}

Tensor Tensor::contiguous(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
                          int device_index) {
  if (shape.size() > size_t(kMaxDims))
    throw Error("Tensor::contiguous: argument 'shape': at most 4 dims, got " + std::to_string(shape.size()));
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_index = device_index;
  t.ndim = int(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  if (std::any_of(shape.begin(), shape.end(), [](int64_t s) { return s < 0; }))
    throw Error("Tensor::contiguous: argument 'shape': every dimension must be >= 0, got " + t.shape_str());
  int64_t st = 1;
  for (int k = t.ndim - 1; k >= 0; --k) {
    t.stride[k] = st;
    st *= t.shape[k];
  }
  return t;
}

int64_t Tensor::numel() const {
  if (ndim < 0 || ndim > kMaxDims) return 0;  // an invalid hand-built view: never index past shape[]
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return ndim == 0 ? 0 : n;
}

bool Tensor::is_contiguous() const {
  if (ndim < 0 || ndim > kMaxDims) return false;
  for (int k = 0; k < ndim; ++k)
    if (shape[k] == 0) return true;  // no elements: any strides (torch's expanded empty gradients)
  int64_t st = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    if (shape[k] != 1 && stride[k] != st) return false;
    st *= shape[k];
  }
  return true;
}

// The messages below are built with std::string and std::to_string, not iostreams: on the H200
// image (g++ 13 extension linked against this archive built by g++ 12) formatting an int64 through
// std::ostringstream crashed inside libstdc++'s locale code (in MoEConfig::describe).
std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim && i < kMaxDims; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string Tensor::describe() const {
  if (!defined()) return "an undefined tensor";
  // A hand-built view may carry any ndim: never index shape[] past kMaxDims (error messages land here).
  if (ndim < 0 || ndim > kMaxDims) return "a tensor with invalid ndim = " + std::to_string(ndim);
  std::string s = std::string(dtype_name(dtype)) + shape_str() + " on " + device_name(device);
  if (!is_contiguous()) s += " (non-contiguous)";
  return s;
}

std::string MoEConfig::describe() const {
  std::string s = "d=" + std::to_string(d) + " n=" + std::to_string(n) + " E=" + std::to_string(E) +
                  " K=" + std::to_string(K) + " router=" + router_convention_name(router) +
                  (norm_topk_prob ? "(norm)" : "") + " routing=" + routing_name(routing);
  if (routing == Routing::token_rounding)
    s += "(tile " + std::to_string(tile) + ", " + rounding_mode_name(rounding_mode) + ")";
  if (activation != Activation::swiglu) s += std::string(" activation=") + activation_name(activation);
  if (activation == Activation::swiglu_clamped)
    s += "(alpha " + std::to_string(act_alpha) + ", limit " + std::to_string(act_limit) + ", up offset " +
         std::to_string(act_up_offset) + ")";
  if (activation == Activation::swiglu_softcapped)
    s += "(gate cap " + std::to_string(act_alpha) + ", up cap " + std::to_string(act_limit) + ")";
  if (interleaved) s += " interleaved";
  if (transposed) s += " transposed";
  if (precision != Precision::storage) s += std::string(" precision=") + precision_name(precision);
  if (fp8_weights_given) s += " fp8_weights_given";
  return s;
}

// The gate denominator D_t of a chosen pair is the sum of its token's top-K p under these
// conventions, else 1 (docs/SPEC.md §2).
bool gates_renormalised(const MoEConfig& cfg) {
  return cfg.router == RouterConvention::topk_then_softmax || cfg.norm_topk_prob;
}

int64_t max_routed_rows(const MoEConfig& cfg, int64_t T) {
  if (cfg.routing != Routing::token_rounding) return T * cfg.K;
  // Rounding moves each expert's count by less than one tile and never above T.
  // An expert never gains more than T rows, so min(tile - 1, T) bounds the gain and keeps
  // E * gain inside int64 for any tile (a tile near 2^63 would otherwise overflow).
  int64_t bound = T * cfg.K;
  if (cfg.rounding_mode != RoundingMode::down) bound += cfg.E * std::min(cfg.tile - 1, T);
  return std::min(bound, T * cfg.E);
}

// Up-projection 2*T*K*d*W, down-projection 2*T*K*d*n; backward runs each twice (data and weight gradients).
double forward_flops(const MoEConfig& c, int64_t T) { return 2.0 * double(T) * c.K * c.d * (up_width(c) + c.n); }
double backward_flops(const MoEConfig& c, int64_t T) { return 2.0 * forward_flops(c, T); }

// ---------------------------------------------------------------------------------------------
// Saved-state layout: one buffer, each view 256-byte aligned (the GPU's vector loads want 16).
// ---------------------------------------------------------------------------------------------
namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

struct SavedLayout {
  size_t h, row_gate, row_token, token_rows, token_offsets, expert_offsets, topk_experts, total;
};

SavedLayout saved_layout(const MoEConfig& cfg, int64_t T, DType dtype) {
  const int64_t R = max_routed_rows(cfg, T);
  SavedLayout l{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    size_t at = off;
    off = align_up(off + bytes);
    return at;
  };
  l.h = take(size_t(R) * up_width(cfg) * dtype_size(dtype));
  l.row_gate = take(size_t(R) * 4);
  l.row_token = take(size_t(R) * 4);
  l.token_rows = take(size_t(R) * 4);
  l.token_offsets = take(size_t(T + 1) * 4);
  l.expert_offsets = take(size_t(cfg.E + 1) * 4);
  l.topk_experts = take(size_t(T) * cfg.K * 4);
  l.total = off;
  return l;
}
}  // namespace

const Tensor* SavedState::views(int i) const {
  const Tensor* all[kNumViews] = {&x, &h, &row_gate, &row_token, &token_rows,
                                  &token_offsets, &expert_offsets, &topk_experts};
  return (i >= 0 && i < kNumViews) ? all[i] : nullptr;
}

size_t SavedState::bytes_excluding_x() const {
  size_t b = 0;
  for (int i = 1; i < kNumViews; ++i)
    if (const Tensor* t = views(i)) b += t->nbytes();
  return b;
}

LayerPlan plan_layer(const MoEConfig& cfg, int64_t T, DType dtype, Device device) {
  detail::validate_config(cfg, "plan_layer");
  detail::validate_tokens(cfg, T, "plan_layer");
  detail::validate_storage(cfg, dtype, "plan_layer");
  detail::Backend& be = detail::backend_for(device, "device");
  LayerPlan p;
  p.T = T;
  p.rows_capacity = max_routed_rows(cfg, T);
  p.saved_bytes = saved_layout(cfg, T, dtype).total;
  p.forward_workspace_bytes = be.forward_workspace_bytes(cfg, T, dtype);
  p.backward_workspace_bytes = be.backward_workspace_bytes(cfg, T, dtype);
  return p;
}

SavedState make_saved_state(const MoEConfig& cfg, int64_t T, DType dtype, Device device, void* buffer,
                            size_t buffer_bytes, int device_index) {
  detail::validate_config(cfg, "make_saved_state");
  detail::validate_tokens(cfg, T, "make_saved_state");
  detail::validate_storage(cfg, dtype, "make_saved_state");
  const SavedLayout l = saved_layout(cfg, T, dtype);
  if (buffer == nullptr) throw Error("make_saved_state: argument 'buffer': must not be null");
  if (buffer_bytes < l.total)
    throw Error("make_saved_state: argument 'buffer_bytes': must be >= plan_layer().saved_bytes = " +
                std::to_string(l.total) + ", got " + std::to_string(buffer_bytes));
  char* b = static_cast<char*>(buffer);
  const int64_t R = max_routed_rows(cfg, T);
  auto v = [&](size_t off, DType t, std::initializer_list<int64_t> shape) {
    return Tensor::contiguous(b + off, t, device, shape, device_index);
  };
  SavedState s;
  s.T = T;
  s.rows_capacity = R;
  s.h = v(l.h, dtype, {R, up_width(cfg)});
  s.row_gate = v(l.row_gate, DType::f32, {R});
  s.row_token = v(l.row_token, DType::i32, {R});
  s.token_rows = v(l.token_rows, DType::i32, {R});
  s.token_offsets = v(l.token_offsets, DType::i32, {T + 1});
  s.expert_offsets = v(l.expert_offsets, DType::i32, {cfg.E + 1});
  s.topk_experts = v(l.topk_experts, DType::i32, {T, cfg.K});
  return s;
}

// ---------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------
namespace detail {
Backend& backend_for(Device device, const char* arg) {
  if (device == Device::cpu) return cpu_backend();
  if (Backend* b = cuda_backend()) return *b;
  throw Error(std::string("leanmoe: argument '") + arg +
              "': device cuda has no backend (library built without CUDA, or no GPU visible)");
}

#ifndef LEANMOE_WITH_CUDA
Backend* cuda_backend() { return nullptr; }
#endif
}  // namespace detail

void forward(const MoEConfig& cfg, const Tensor& x, const MoEWeights& w, const Tensor& out, const Tensor& losses,
             SavedState& saved, Workspace ws, Stream stream) {
  detail::Backend& be = detail::backend_for(x.device, "x");
  detail::ForwardArgs a{cfg, x, w, out, losses, saved, ws, stream};
  detail::validate_forward(a, be);
  saved.x = x;
  be.forward(a);
}

void backward(const MoEConfig& cfg, const Tensor& d_out, const Tensor& d_losses, const MoEWeights& w,
              const SavedState& saved, const MoEGrads& grads, Workspace ws,
              const ExpertGradCallback& on_expert_grad, Stream stream) {
  detail::Backend& be = detail::backend_for(d_out.device, "d_out");
  detail::BackwardArgs a{cfg, d_out, d_losses, w, saved, grads, ws, on_expert_grad, stream};
  detail::validate_backward(a, be);
  be.backward(a);
}

void forward_routed(const MoEConfig& cfg, const Tensor& x, const Tensor& topk_experts, const Tensor& topk_weights,
                    const MoEWeights& w, const Tensor& out, SavedState& saved, Workspace ws, Stream stream) {
  detail::Backend& be = detail::backend_for(x.device, "x");
  detail::RoutedForwardArgs a{cfg, x, topk_experts, topk_weights, w, out, saved, ws, stream};
  detail::validate_forward_routed(a, be);
  saved.x = x;
  be.forward_routed(a);
}

void backward_routed(const MoEConfig& cfg, const Tensor& d_out, const MoEWeights& w, const SavedState& saved,
                     const MoEGrads& grads, Workspace ws, const ExpertGradCallback& on_expert_grad, Stream stream) {
  detail::Backend& be = detail::backend_for(d_out.device, "d_out");
  detail::RoutedBackwardArgs a{cfg, d_out, w, saved, grads, ws, on_expert_grad, stream};
  detail::validate_backward_routed(a, be);
  be.backward_routed(a);
}

std::string unsupported_reason(const MoEConfig& cfg, DType dtype, Device device, bool expert_biases) {
  try {
    detail::validate_config(cfg, "unsupported_reason");
    detail::validate_storage(cfg, dtype, "unsupported_reason");
  } catch (const Error& e) {
    return e.what();
  }
  if (!backend_available(device)) return std::string("device ") + device_name(device) + " has no backend";
  detail::Backend& be = detail::backend_for(device, "device");
  std::string reason = be.unsupported_reason(cfg, dtype);
  if (reason.empty() && expert_biases && !be.supports_expert_biases())
    reason = "expert biases are not supported by this backend yet (" + be.description() + "; run on cpu)";
  return reason;
}

bool backend_available(Device device) { return device == Device::cpu || detail::cuda_backend() != nullptr; }
Device best_device() { return backend_available(Device::cuda) ? Device::cuda : Device::cpu; }
std::string backend_description(Device device) { return detail::backend_for(device, "device").description(); }

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------
Buffer::Buffer(Device device, size_t bytes) : bytes_(bytes), device_(device) {
  if (bytes) data_ = detail::backend_for(device, "device").allocate(bytes);
}
Buffer::~Buffer() {
  if (data_) detail::backend_for(device_, "device").deallocate(data_);
}
Buffer::Buffer(Buffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_), device_(o.device_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (data_) detail::backend_for(device_, "device").deallocate(data_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}
Tensor Buffer::view(DType dtype, std::initializer_list<int64_t> shape) const {
  Tensor t = Tensor::contiguous(data_, dtype, device_, shape);
  if (t.nbytes() > bytes_)
    throw Error("Buffer::view: argument 'shape': needs " + std::to_string(t.nbytes()) + " bytes, buffer holds " +
                std::to_string(bytes_));
  return t;
}

void copy_to_device(Device device, void* dst, const void* src, size_t bytes) {
  detail::backend_for(device, "device").copy(dst, src, bytes, detail::CopyKind::host_to_device);
}
void copy_to_host(Device device, void* dst, const void* src, size_t bytes) {
  detail::backend_for(device, "device").copy(dst, src, bytes, detail::CopyKind::device_to_host);
}
void synchronize(Device device) { detail::backend_for(device, "device").synchronize(); }

LayerMemory::LayerMemory(const MoEConfig& cfg, int64_t T, DType dtype, Device device)
    : plan_(plan_layer(cfg, T, dtype, device)),
      saved_buf_(device, plan_.saved_bytes),
      fwd_ws_(device, plan_.forward_workspace_bytes),
      bwd_ws_(device, plan_.backward_workspace_bytes),
      saved_(make_saved_state(cfg, T, dtype, device, saved_buf_.data(), saved_buf_.bytes())) {}

}  // namespace leanmoe
