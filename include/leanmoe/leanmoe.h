// leanmoe public C++ API: a memory-lean Mixture-of-Experts layer (gated or plain experts, top-K,
// token-rounding or caller-given routing) with a CPU reference backend and a CUDA (sm_90a) backend.
//
// Plain types only: raw pointers + shape + strides + dtype + device, an opaque stream, and
// exceptions (leanmoe::Error) whose message names the argument and the rule it broke.
// No torch header appears here or anywhere in the core. Shape letters follow docs/SPEC.md §1:
//   T tokens, d model width, n expert intermediate width, E experts, K experts per token,
//   R routed (token, expert) rows (R = T*K for top-K; varies with token rounding).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "leanmoe/bf16.h"

namespace leanmoe {

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& what) : std::invalid_argument(what) {}
};

// ---------------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------------
// e4m3: fp8 codes (1 byte, OCP E4M3), only in MoEWeights::fp8 (cfg.fp8_weights_given).
enum class DType { bf16, f32, i32, e4m3 };
enum class Device { cpu, cuda };

const char* dtype_name(DType);
const char* device_name(Device);
size_t dtype_size(DType);

// A non-owning view. Strides are in elements. An empty view (data == nullptr, ndim == 0) means
// "not given" where an argument is optional.
struct Tensor {
  static constexpr int kMaxDims = 4;
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int device_index = 0;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};

  // A contiguous (row-major) view.
  static Tensor contiguous(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
                           int device_index = 0);
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  bool defined() const { return data != nullptr || ndim != 0; }
  int64_t size(int i) const { return shape[i]; }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  std::string shape_str() const;  // e.g. "[4096, 768]"
  std::string describe() const;   // e.g. "bf16[4096, 768] on cpu"
};

// ---------------------------------------------------------------------------------------------
// Layer configuration
// ---------------------------------------------------------------------------------------------
enum class RouterConvention {
  topk_then_softmax,  // Mixtral, SonicMoE: K largest logits, softmax over those K
  softmax_then_topk,  // OLMoE, Qwen3-MoE, Granite: softmax over E, top-K of p (optionally renormalised)
};
// topk and token_rounding run the layer's own router (forward / backward); given takes the chosen
// experts and their weights from the caller (forward_routed / backward_routed): any router
// computed them, and the router's gradient flows back through d(weights).
enum class Routing { topk, token_rounding, given };
enum class RoundingMode { nearest, up, down };

// The expert's function of its up-projection h (DESIGN.md "Activations"). Gated activations split
// h into gate g and up u (n values each): a = f(g) * u. Plain ones have no gate: a = f(h), and the
// up-projection has n rows instead of 2n.
enum class Activation {
  swiglu,          // silu(g) * u
  geglu,           // gelu(g) * u, exact (erf) GELU
  geglu_tanh,      // gelu_tanh(g) * u
  reglu,           // relu(g) * u
  swiglu_clamped,  // gpt-oss: (clamp(u, -limit, limit) + up_offset) * g' * sigmoid(alpha * g'), g' = min(g, limit)
  // Inkling2: sc(g, alpha) * sigmoid(g) * sc(u, limit), sc(x, c) = c * tanh(x / c): the soft caps bound the
  // gate's linear factor and up, the sigmoid sees the raw gate (act_alpha, act_limit: the two caps).
  swiglu_softcapped,
  gelu,            // plain: gelu(h), exact
  gelu_tanh,       // plain: gelu_tanh(h)
  silu,            // plain: silu(h)
  relu,            // plain: relu(h)
  relu2,           // plain: relu(h)^2
};

// The operands of the up, down, dH and dX expert GEMMs (docs/DESIGN.md "FP8"): the storage dtype's
// values, or fp8 e4m3 codes with power-of-two scales per 1x128 tile along K (activations and
// gradients) or 128x128 block (weights), accumulated in fp32. The weight gradients (dW1, dW2), the
// router and the saved state keep the storage dtype.
enum class Precision { storage, fp8 };

const char* router_convention_name(RouterConvention);
const char* routing_name(Routing);
const char* rounding_mode_name(RoundingMode);
const char* activation_name(Activation);
const char* precision_name(Precision);
constexpr bool activation_is_gated(Activation a) {
  return a == Activation::swiglu || a == Activation::geglu || a == Activation::geglu_tanh || a == Activation::reglu ||
         a == Activation::swiglu_clamped || a == Activation::swiglu_softcapped;
}

struct MoEConfig {
  int64_t d = 0;  // model width
  int64_t n = 0;  // expert intermediate width (half of a gated up-projection)
  int64_t E = 0;  // experts
  int64_t K = 0;  // experts per token
  RouterConvention router = RouterConvention::softmax_then_topk;
  bool norm_topk_prob = false;  // softmax_then_topk only: renormalise the K probabilities to sum to 1
  Routing routing = Routing::topk;
  int64_t tile = 128;  // token rounding: expert row counts become multiples of this
  RoundingMode rounding_mode = RoundingMode::nearest;
  float aux_loss_coef = 0.f;  // load-balancing loss  E * sum_e f_e * P_e
  float z_loss_coef = 0.f;    // router z-loss  mean_t logsumexp(z_t)^2
  bool check_finite = false;  // reject NaN/Inf in x and the weights (costs one pass over each)
  // The experts (DESIGN.md "Activations" and "Weight layouts"):
  Activation activation = Activation::swiglu;
  float act_alpha = 1.702f;  // swiglu_clamped; swiglu_softcapped: the gate's cap (Inkling2: 4)
  float act_limit = 7.f;     // swiglu_clamped; swiglu_softcapped: up's cap (Inkling2: 25)
  // swiglu_clamped only: added to the clamped up value, 1 (gpt-oss) or 0 (DeepSeek-V4 and its kin,
  // whose a = silu(min(g, l)) clamp(u, -l, l) is this with act_alpha 1).
  float act_up_offset = 1.f;
  bool interleaved = false;  // gated only: up-projection rows alternate [g0, u0, g1, u1, ...] (else [gate; up])
  bool transposed = false;   // gate_up_proj [E, d, 2n] and down_proj [E, n, d] (else [E, 2n, d] and [E, d, n])
  Precision precision = Precision::storage;  // fp8: bf16 storage, d and n multiples of 128
  // fp8 only: the caller gives the weights' FP8 codes in MoEWeights::fp8 (kept current by the
  // optimizer, ExpertOptimizer::set_fp8_copy), so no call quantizes a weight and plan_layer's
  // workspaces hold no weight codes. false: each forward/backward quantizes the bf16 weights
  // itself, into its workspace. A config field, not just the argument, because the workspace
  // sizes are planned from the config.
  bool fp8_weights_given = false;

  std::string describe() const;
};

// Rows of the up-projection (and columns of SavedState::h): 2n for a gated activation, n for a plain one.
int64_t up_width(const MoEConfig& cfg);

// cfg's expert activation on host rows: a [R, n] = f(h [R, W]), h in cfg's row order
// ([gate; up], interleaved, or the plain up-projection), both f32 and contiguous on cpu. The
// definition every backend uses, for bridges and tests that compare a model's own activation.
void expert_activation(const MoEConfig& cfg, const Tensor& h, const Tensor& a);

// Routing indices are int32: T, E and R_max must each be at most 2^31 - 1 (checked).
// Upper bound of routed rows R for T tokens (exact T*K for top-K routing; token rounding may add
// up to tile-1 rows per expert, never more than T per expert).
int64_t max_routed_rows(const MoEConfig& cfg, int64_t T);

// Whether a chosen pair's gate is p divided by the sum of the token's top-K p (topk_then_softmax,
// or softmax_then_topk with norm_topk_prob) rather than p itself.
bool gates_renormalised(const MoEConfig& cfg);

// Expert FLOPs of one layer (docs/SPEC.md §1): forward 2*T*K*d*(up_width(cfg) + n), backward twice
// that: 6*T*K*d*n and 12*T*K*d*n for gated experts, 4 and 8 for plain ones.
double forward_flops(const MoEConfig& cfg, int64_t T);
double backward_flops(const MoEConfig& cfg, int64_t T);

// Weights, in the HuggingFace transformers v5 layout (W = up_width(cfg): 2n gated, n plain):
//   router        [E, d]   (not read with routing given by the caller)
//   gate_up_proj  [E, W, d] (rows 0..n-1 gate, rows n..2n-1 up; cfg.interleaved: g0, u0, g1, u1, ...;
//                            plain activations: the up-projection alone); cfg.transposed: [E, d, W]
//   down_proj     [E, d, n]; cfg.transposed: [E, n, d]
//   gate_up_bias  [E, W] optional, in the row order of gate_up_proj: h = W1·x + b1
//   down_bias     [E, d] optional: y = W2·a + b2
//
// fp8 (cfg.fp8_weights_given only, else all undefined): the expert weights' FP8 codes, each weight
// seen as E matrices [R, C] as stored (gate_up_proj: [W, d], transposed [d, W]; down_proj: [d, n],
// transposed [n, d]) and quantized in 128 x 128 blocks, plus the same codes transposed: exactly
// what fp8 quantization of the current bf16 weights gives (ExpertOptimizer::set_fp8_copy writes
// them in each update). The layer reads them instead of quantizing; it does not check their values.
struct Fp8WeightCodes {
  Tensor codes;     // e4m3 [E, R, C], the weight's shape
  Tensor scales;    // f32 [E, R/128, C/128], powers of two
  Tensor codes_t;   // e4m3 [E, C, R]: the codes transposed
  Tensor scales_t;  // f32 [E, C/128, R/128]
};
struct Fp8ExpertWeights {
  Fp8WeightCodes gate_up_proj;  // forward reads codes (transposed layout: codes_t), backward codes_t (codes)
  Fp8WeightCodes down_proj;     // likewise
};

struct MoEWeights {
  Tensor router;
  Tensor gate_up_proj;
  Tensor down_proj;
  Tensor gate_up_bias;
  Tensor down_bias;
  Fp8ExpertWeights fp8;
};

// Gradients, same shapes and dtype as the weights / input. Any may be left undefined: that
// gradient is then not computed, and for an expert weight its ExpertGradCallback is not called.
struct MoEGrads {
  Tensor dx;              // [T, d]
  Tensor d_router;        // [E, d] (fused router only)
  Tensor d_gate_up_proj;  // like gate_up_proj
  Tensor d_down_proj;     // like down_proj
  Tensor d_gate_up_bias;  // [E, W] (only with w.gate_up_bias)
  Tensor d_down_bias;     // [E, d] (only with w.down_bias)
  Tensor d_topk_weights;  // [T, K] routing given only: d(loss)/d(topk_weights), dtype of topk_weights
};

// ---------------------------------------------------------------------------------------------
// Saved state: exactly what docs/SPEC.md §3 allows to live between forward and backward.
// ---------------------------------------------------------------------------------------------
// All views point into one caller-owned buffer of LayerPlan::saved_bytes bytes (except x, which
// is the caller's own input: it is referenced, never copied). Nothing here grows with T*K*d.
struct SavedState {
  int64_t T = 0;
  int64_t rows_capacity = 0;  // R_max
  Tensor x;              // [T, d] the layer input (a reference to the caller's tensor)
  Tensor h;              // [R_max, W] pre-activation (bias included), storage dtype, expert-sorted rows
  Tensor row_gate;       // [R_max] f32: gate value s of each sorted row
  Tensor row_token;      // [R_max] i32: token of each sorted row (stable by token inside an expert)
  Tensor token_rows;     // [R_max] i32: reverse map, token t's rows are token_rows[token_offsets[t]..[t+1])
  Tensor token_offsets;  // [T+1] i32
  Tensor expert_offsets; // [E+1] i32: expert e owns sorted rows [expert_offsets[e], expert_offsets[e+1])
  Tensor topk_experts;   // [T, K] i32: the plain top-K choice (router backward, aux loss, rounding),
                         // or the caller's expert ids with routing given

  // Every view above, for tests and accounting.
  static constexpr int kNumViews = 8;
  const Tensor* views(int i) const;
  size_t bytes_excluding_x() const;
};

// Sizes a caller allocates up front (no allocation happens inside forward/backward).
struct LayerPlan {
  int64_t T = 0;
  int64_t rows_capacity = 0;          // R_max
  size_t saved_bytes = 0;             // buffer behind SavedState (excluding x)
  size_t forward_workspace_bytes = 0;
  size_t backward_workspace_bytes = 0;
};

LayerPlan plan_layer(const MoEConfig& cfg, int64_t T, DType dtype, Device device);

// Carves a SavedState out of `buffer` (plan.saved_bytes bytes on `device`).
SavedState make_saved_state(const MoEConfig& cfg, int64_t T, DType dtype, Device device, void* buffer,
                            size_t buffer_bytes, int device_index = 0);

struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// Opaque stream handle: a cudaStream_t for the CUDA backend (nullptr = default stream), ignored on CPU.
using Stream = void*;

// ---------------------------------------------------------------------------------------------
// Forward / backward
// ---------------------------------------------------------------------------------------------
// out    [T, d] storage dtype.
// losses optional f32 [2] on the same device: receives {aux_loss, z_loss} (unscaled).
// saved  from make_saved_state(); filled here, read by backward.
// T = 0 is a valid call (no rows; losses {0, 0}; backward then writes zero weight gradients); a
// tensor with no elements may have a null data pointer. No tensor a call writes may share memory
// with one it reads, with another it writes or with the workspace (docs/DESIGN.md "Degenerate
// calls and aliasing"); the Error names both.
void forward(const MoEConfig& cfg, const Tensor& x, const MoEWeights& w, const Tensor& out,
             const Tensor& losses, SavedState& saved, Workspace ws, Stream stream = nullptr);

enum class ExpertWeight { down_proj, gate_up_proj, down_bias, gate_up_bias };
const char* expert_weight_name(ExpertWeight);

// Called from inside backward the moment an expert weight gradient is complete (enqueued on
// `stream` for the GPU): down_proj (dW2) first, right after the last read of W2, then down_bias,
// then gate_up_proj (dW1), right after the last read of W1, then gate_up_bias (the biases only
// when given). The callback may update that tensor in place and reuse the gradient buffer:
// backward never reads that tensor or gradient again.
using ExpertGradCallback = std::function<void(ExpertWeight which, const Tensor& grad)>;

// d_out    [T, d] storage dtype: gradient of the loss w.r.t. out.
// d_losses optional f32 [2] on the device: gradient w.r.t. {aux_loss, z_loss}; when not given,
//          cfg.aux_loss_coef and cfg.z_loss_coef are used (the loss is main + coef * aux + coef * z).
void backward(const MoEConfig& cfg, const Tensor& d_out, const Tensor& d_losses, const MoEWeights& w,
              const SavedState& saved, const MoEGrads& grads, Workspace ws,
              const ExpertGradCallback& on_expert_grad = nullptr, Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Routing given by the caller (cfg.routing == Routing::given)
// ---------------------------------------------------------------------------------------------
// topk_experts [T, K] i32: the experts each token goes to. An id outside [0, E) means "no
//              expert" (expert-parallel sentinels, dropped pairs): that slot contributes nothing
//              and gets d_topk_weights = 0. A token may list an expert twice (two rows).
// topk_weights [T, K] f32 or the storage dtype: the weight of each slot in out_t = sum_k w_tk * y_tk.
// Rows are sorted by expert, stable by (token, slot); a token's rows are summed in slot order.
// cfg's router fields, aux/z-loss coefficients and w.router are not used. The saved state is
// the same as the fused router's (topk_experts holds a copy of the caller's ids): nothing of size
// T*K*d, and backward takes dS = <dA', a> (+ <dO, b2>) from the memory-efficient dH step.
void forward_routed(const MoEConfig& cfg, const Tensor& x, const Tensor& topk_experts, const Tensor& topk_weights,
                    const MoEWeights& w, const Tensor& out, SavedState& saved, Workspace ws,
                    Stream stream = nullptr);

// grads.dx, the expert gradients and grads.d_topk_weights ([T, K], f32 or the storage dtype);
// grads.d_router must be undefined. Expert gradient callbacks as in backward(). T = 0 is allowed
// (both calls): out and dx are empty, the expert gradients are zeros.
void backward_routed(const MoEConfig& cfg, const Tensor& d_out, const MoEWeights& w, const SavedState& saved,
                     const MoEGrads& grads, Workspace ws, const ExpertGradCallback& on_expert_grad = nullptr,
                     Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Backends and memory
// ---------------------------------------------------------------------------------------------
bool backend_available(Device device);
// "" when `device`'s backend runs this layer (cfg, storage dtype, with or without expert biases),
// else the rule it breaks (e.g. an activation the GPU epilogues do not fuse yet).
std::string unsupported_reason(const MoEConfig& cfg, DType dtype, Device device, bool expert_biases = false);
Device best_device();  // cuda when a backend and a GPU are present, else cpu
std::string backend_description(Device device);

// Owning buffer on a device, allocated through that device's backend.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  Tensor view(DType dtype, std::initializer_list<int64_t> shape) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu;
};

// Copies between host memory and a device (plain memcpy on cpu).
void copy_to_device(Device device, void* dst, const void* src, size_t bytes);
void copy_to_host(Device device, void* dst, const void* src, size_t bytes);
void synchronize(Device device);

// A layer's memory, owned: the saved-state buffer and the two workspaces, sized by plan_layer.
class LayerMemory {
 public:
  LayerMemory(const MoEConfig& cfg, int64_t T, DType dtype, Device device);
  const LayerPlan& plan() const { return plan_; }
  SavedState& saved() { return saved_; }
  Workspace forward_workspace() const { return {fwd_ws_.data(), fwd_ws_.bytes()}; }
  Workspace backward_workspace() const { return {bwd_ws_.data(), bwd_ws_.bytes()}; }

 private:
  LayerPlan plan_;
  Buffer saved_buf_, fwd_ws_, bwd_ws_;
  SavedState saved_;
};

}  // namespace leanmoe
