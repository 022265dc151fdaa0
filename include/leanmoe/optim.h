// leanmoe expert optimizer and in-backward expert updates (docs/SPEC.md §6, Sonar-MoE).
//
// ExpertOptimizer: AdamW or SGD-with-momentum over whole batched expert tensors ([E, 2n, d] or
// [E, d, n]); one fused, element-wise update per tensor (threaded on the CPU, one launch on the
// GPU). fp32 moments, or bf16 moments for bf16 parameters (what torch's fused AdamW keeps for them:
// the math in fp32, the moments rounded to bf16 when stored); bf16 parameters with or without an
// fp32 master copy, or fp32 parameters.
//
// MoEStack: L MoE layers trained end to end in one of two modes with identical results, bit for bit:
//   standard     every layer's dW1/dW2 is materialised, then step() updates every expert tensor;
//   in_backward  backward() hands each gradient to the optimizer the moment it is complete (dW2
//                after the last read of W2, dW1 after the last read of W1) and reuses one gradient
//                workspace, sized for the largest layer, for the whole stack.
// See docs/optim.md for the contract and the errors.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "leanmoe/leanmoe.h"

namespace leanmoe::optim {

// AdamW with decoupled weight decay and bias correction (the PyTorch formulation):
//   p <- p * (1 - lr*wd);  m <- b1*m + (1-b1)*g;  v <- b2*v + (1-b2)*g^2
//   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
struct AdamW {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// SGD with momentum (PyTorch formulation, no dampening): g <- g + wd*p; buf <- momentum*buf + g;
// step direction = nesterov ? g + momentum*buf : buf; p <- p - lr*direction. No buffer when momentum == 0.
struct SGD {
  float lr = 1e-2f;
  float momentum = 0.9f;
  float weight_decay = 0.f;
  bool nesterov = false;
};

using Rule = std::variant<AdamW, SGD>;

// The FP8 copy of a bf16 parameter that ExpertOptimizer::step writes in its update pass
// (docs/DESIGN.md "FP8", docs/optim.md): the parameter viewed as E matrices [R, C], quantized in
// 128 x 128 blocks exactly as fp8::quantize / fp8_quantize_blocks would quantize its bf16 values.
// Buffers are the caller's (on the parameter's device); the optimizer keeps the pointers.
struct Fp8Copy {
  int64_t E = 0, R = 0, C = 0;  // E * R * C = the parameter's numel; R, C multiples of 128
  uint8_t* codes = nullptr;     // e4m3 [E, R, C]
  float* scales = nullptr;      // [E, R/128, C/128], powers of two
  uint8_t* codes_t = nullptr;   // optional: the same codes transposed, [E, C, R] (K-major for W^T)
  float* scales_t = nullptr;    // [E, C/128, R/128]; given exactly when codes_t is
};

// Owned buffers for one layer's MoEWeights::fp8 (cfg.fp8_weights_given) on `device`: each expert
// weight's codes, scales and transposed copy in cfg's layout, and the Fp8Copy that
// ExpertOptimizer::set_fp8_copy fills them through (the weight seen as E matrices [R, C] as stored).
class Fp8WeightBuffers {
 public:
  Fp8WeightBuffers(const MoEConfig& cfg, Device device);
  const Fp8ExpertWeights& weights() const { return weights_; }
  Fp8Copy copy(ExpertWeight which) const;  // gate_up_proj or down_proj
  // Writes the codes of w's current gate_up_proj and down_proj once (enqueued on `stream` for the
  // GPU), through set_fp8_copy of a stateless optimizer: for callers with no optimizer keeping them
  // current (benchmarks, tests, inference). A training loop registers copy() with its own optimizer.
  void quantize(const MoEWeights& w, Stream stream = nullptr) const;

 private:
  struct One {
    int64_t E = 0, R = 0, C = 0;
    Buffer codes, scales, codes_t, scales_t;
  };
  One gate_up_, down_;
  Fp8ExpertWeights weights_;
};

// Per-tensor state buffers (same numel as the parameter): the moments (exp_avg, exp_avg_sq,
// momentum) in the tensor's moment dtype, the master in fp32.
enum class StateKind { exp_avg, exp_avg_sq, momentum, master };
const char* state_kind_name(StateKind);

// The dtype the moments are stored in (the update computes in fp32 either way). bf16 halves the
// update's moment traffic (AdamW, bf16 parameters: 14 instead of 22 bytes moved per element) and
// keeps the state of torch.optim.AdamW over the same bf16 parameters. Rules (else an Error naming
// the argument): f32 or bf16; bf16 only for bf16 parameters without an fp32 master copy (a master
// asks for fp32 state).
void check_moment_dtype(const std::string& fn, DType moments, DType param, bool master);

// One tensor's optimizer state kept by the caller, for update_tensor (a front that owns its state,
// e.g. the PyTorch ExpertAdamW): each contiguous, of the parameter's numel, on its device; the
// moments of dtype `moments` (check_moment_dtype's rules), the master fp32.
struct UpdateState {
  Tensor exp_avg, exp_avg_sq;  // AdamW: both; SGD: neither
  Tensor momentum;             // SGD with momentum != 0; else undefined
  Tensor master;               // optional, bf16 parameters only: the fp32 master copy (as register_tensor's)
  DType moments = DType::f32;  // the dtype of exp_avg, exp_avg_sq and momentum
};

// The update ExpertOptimizer::step runs, on caller-owned state: `t` is the tensor's step count after
// this update (>= 1); `param` contiguous bf16 or f32; `grad` as in step(); `fp8` (codes not null)
// is rewritten in the same pass, under set_fp8_copy's rules. The same bits as ExpertOptimizer::step
// given the same state. Enqueued on `stream` for the GPU. Errors name the argument (state.exp_avg, ...).
void update_tensor(const Rule& rule, int64_t t, const Tensor& param, const Tensor& grad, const UpdateState& state,
                   const Fp8Copy& fp8 = {}, float grad_scale = 1.f, Stream stream = nullptr);

// Writes `copy` from the bf16 `param`'s current values (what set_fp8_copy writes when called: on
// the GPU fp8_quantize_blocks, enqueued on `stream`), under set_fp8_copy's rules. For a caller
// whose weights changed outside the update (loaded, edited).
void write_fp8_copy(const Tensor& param, const Fp8Copy& copy, Stream stream = nullptr);

class ExpertOptimizer {
 public:
  explicit ExpertOptimizer(Rule rule);
  ~ExpertOptimizer();
  ExpertOptimizer(ExpertOptimizer&&) noexcept;
  ExpertOptimizer& operator=(ExpertOptimizer&&) noexcept;

  const Rule& rule() const { return rule_; }
  // The learning rate of the next steps (settable every step, e.g. by a schedule).
  void set_lr(float lr);
  float lr() const;

  // Registers a parameter (contiguous bf16 or f32, any shape) under a unique name. The optimizer
  // keeps the view and updates that memory in place; state is allocated on the parameter's device
  // and zeroed. fp32_master (bf16 parameters only): keep an fp32 copy, initialised from `param`,
  // which the update reads and writes; the parameter then receives bf16(master). moments: the
  // dtype the moments are kept in (check_moment_dtype's rules).
  void register_tensor(const std::string& name, const Tensor& param, bool fp32_master = false,
                       DType moments = DType::f32);
  bool has_tensor(const std::string& name) const;
  std::vector<std::string> names() const;  // in registration order

  // From now on every step(name) also writes `copy`, the FP8 codes and scales of the parameter's new
  // bf16 values, in the same pass (on the GPU one kernel: no separate quantization per step). Also
  // writes the copy of the parameter's current values now (enqueued on `stream` for the GPU), so the
  // copy is valid from this call on; call it again after changing the parameter outside step()
  // (e.g. loading weights). Rules (else an Error naming the argument): bf16 parameter; E >= 1, R and
  // C positive multiples of 128, E * R * C = numel; codes and scales not null, codes_t and scales_t
  // both or neither; every buffer on the parameter's device; on the GPU the parameter, codes and
  // codes_t 16-byte aligned (and each step's gradient too). Not part of save()/load().
  void set_fp8_copy(const std::string& name, const Fp8Copy& copy, Stream stream = nullptr);

  // The fused update of the whole tensor `name` with gradient `grad` (same shape, bf16 or f32,
  // contiguous, on the parameter's device), each element scaled by grad_scale first (clipping).
  // Increments that tensor's step count. Enqueued on `stream` for the GPU.
  void step(const std::string& name, const Tensor& grad, float grad_scale = 1.f, Stream stream = nullptr);
  int64_t step_count(const std::string& name) const;

  // A view of one state buffer of `name` (undefined when that rule/tensor has none), in its dtype.
  Tensor state(const std::string& name, StateKind kind) const;
  size_t state_bytes() const;  // all state buffers together

  // Hyper-parameters, and for every tensor: name, dtype, shape, step count, moments, master copy.
  // load() restores it bit for bit into an optimizer whose registered tensors have the same names,
  // dtypes, shapes and moment dtypes (else an Error naming the tensor); parameters are not touched.
  void save(std::ostream& out) const;
  void load(std::istream& in);

 private:
  struct Slot;
  Slot& slot(const std::string& name, const char* fn) const;
  Rule rule_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::map<std::string, size_t> index_;
};

// ---------------------------------------------------------------------------------------------
// A stack of MoE layers with in-backward (or standard) expert updates
// ---------------------------------------------------------------------------------------------
enum class ExpertUpdateMode { standard, in_backward };
const char* expert_update_mode_name(ExpertUpdateMode);

struct StackOptions {
  ExpertUpdateMode mode = ExpertUpdateMode::in_backward;
  Rule expert_rule = AdamW{};
  bool fp32_master = false;            // bf16 stacks: fp32 master copies of the expert weights
  DType expert_moments = DType::f32;  // the expert optimizer's moment dtype (check_moment_dtype)
  Rule dense_rule = AdamW{};           // the router weights (dense parameters)
  float dense_max_grad_norm = 0.f;     // global-norm clipping over the router gradients; 0 = off
  // Summing gradients over several backward() calls before step(). Incompatible with in_backward
  // (each backward would update the experts per micro-batch): the constructor refuses it. The
  // standard path of this stack does not implement it either yet.
  bool accumulate_gradients = false;
  // Layers with cfg.precision = fp8: the expert optimizer keeps each expert weight's FP8 codes
  // (set_fp8_copy: written in the update's pass) and the stack hands them to the layer
  // (cfg.fp8_weights_given, MoEWeights::fp8), so no forward or backward quantizes a weight; costs
  // the bf16 weights' size in codes, and each layer's workspaces drop theirs. false: every call
  // quantizes the weights itself (the same codes, bit for bit). The stack sets each fp8 layer's
  // cfg.fp8_weights_given from this (config() shows it).
  bool fp8_weight_copy = true;
};

// Layer l maps x_l [T, d] to x_{l+1} = moe_l(x_l) (no residual, so the stack only calls the public
// API and runs on any device). All layers share d; n, E, K, routing, the experts' activation and
// their weight layout (MoEConfig::interleaved, transposed) may differ per layer.
// One training step: forward(x), backward(d_out), step().
class MoEStack {
 public:
  // Weights drawn from `seed`: N(0, 1/fan_in), rounded to dtype.
  MoEStack(std::vector<MoEConfig> layers, int64_t T, DType dtype, Device device, StackOptions opt,
           uint64_t seed);
  ~MoEStack();

  int64_t num_layers() const;
  const MoEConfig& config(int64_t layer) const;
  const MoEWeights& weights(int64_t layer) const;
  ExpertOptimizer& expert_optimizer();
  ExpertOptimizer& dense_optimizer();
  const StackOptions& options() const;

  // x [T, d] in the stack's dtype on its device; the caller keeps x alive until backward() returns
  // (layer 0 references it, docs/SPEC.md §3). Returns a view of the last layer's output, owned by the stack.
  Tensor forward(const Tensor& x);
  // d_out [T, d]: gradient of the loss w.r.t. forward()'s output. in_backward: updates every
  // expert tensor before returning. standard: materialises every expert gradient.
  void backward(const Tensor& d_out);
  // standard: updates every expert tensor (same kernel, same order as in_backward); both modes:
  // clips and updates the router weights; ends the training step.
  void step();
  // Learning rates of the next steps.
  void set_lr(float expert_lr, float dense_lr);

  // Bytes of expert-gradient buffers the stack holds, and the most ever held at once.
  size_t expert_grad_bytes() const;
  size_t expert_grad_high_water_bytes() const;

  // Weights, expert and dense optimizer state. load() needs the same T, dtype and layer shapes; a
  // checkpoint from either mode loads into either mode.
  void save(std::ostream& out) const;
  void load(std::istream& in);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace leanmoe::optim
