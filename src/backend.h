// The seam between the public API and a backend. The API validates arguments (validate.h) and
// then dispatches on the device of the input tensor; a backend never re-checks what the API checked.
#pragma once
#include <string>

#include "leanmoe/leanmoe.h"

namespace leanmoe::detail {

struct ForwardArgs {
  const MoEConfig& cfg;
  const Tensor& x;
  const MoEWeights& w;
  const Tensor& out;
  const Tensor& losses;  // may be undefined
  SavedState& saved;
  Workspace ws;
  Stream stream;
};

struct BackwardArgs {
  const MoEConfig& cfg;
  const Tensor& d_out;
  const Tensor& d_losses;  // may be undefined: then cfg's coefficients are the loss weights
  const MoEWeights& w;
  const SavedState& saved;
  const MoEGrads& grads;
  Workspace ws;
  const ExpertGradCallback& on_expert_grad;  // may be empty
  Stream stream;
};

// Routing given by the caller (forward_routed / backward_routed), and the expert-parallel owner's
// expert steps (src/ep: the pairs it received are the tokens, K = 1, experts local to the rank).
struct RoutedForwardArgs {
  const MoEConfig& cfg;
  const Tensor& x;
  const Tensor& topk_experts;  // [T, K] i32
  const Tensor& topk_weights;  // [T, K] f32 or storage dtype
  const MoEWeights& w;
  const Tensor& out;
  SavedState& saved;
  Workspace ws;
  Stream stream;
  // The EP owner only (forward_routed leaves both): token t's rows read x row x_rows[t] (i32 [T] on
  // x's device; x then holds the received tokens, fewer than T, and so does saved.x for backward),
  // and out [T, d] gets each token's rows unweighted, so the pair's origin applies the gate in its
  // own gather-sum, in the single-device order (docs/ep.md). backward_routed needs no such field.
  const int32_t* x_rows = nullptr;
  bool weighted_out = true;
};

struct RoutedBackwardArgs {
  const MoEConfig& cfg;
  const Tensor& d_out;
  const MoEWeights& w;
  const SavedState& saved;
  const MoEGrads& grads;
  Workspace ws;
  const ExpertGradCallback& on_expert_grad;  // may be empty
  Stream stream;
};

enum class CopyKind { host_to_device, device_to_host };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string description() const = 0;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes, CopyKind kind) = 0;
  virtual void synchronize() = 0;
  // Widths the backend's kernels can take (e.g. 16-byte aligned rows), activations, layouts; "" when
  // fine, else the rule broken.
  virtual std::string unsupported_reason(const MoEConfig& cfg, DType dtype) const = 0;
  // Whether the expert biases (MoEWeights::gate_up_bias, down_bias) can be given.
  virtual bool supports_expert_biases() const { return false; }
  // Workspace sizes follow cfg.routing: the fused router's, or routing given's (no router scratch).
  virtual size_t forward_workspace_bytes(const MoEConfig& cfg, int64_t T, DType dtype) const = 0;
  virtual size_t backward_workspace_bytes(const MoEConfig& cfg, int64_t T, DType dtype) const = 0;
  // True when every element is finite (used only when cfg.check_finite is on).
  virtual bool all_finite(const Tensor& t) = 0;
  virtual void forward(const ForwardArgs& a) = 0;
  virtual void backward(const BackwardArgs& a) = 0;
  // Routing given by the caller; a backend without it refuses by name.
  virtual void forward_routed(const RoutedForwardArgs&) { throw Error(description() + ": no forward_routed"); }
  virtual void backward_routed(const RoutedBackwardArgs&) { throw Error(description() + ": no backward_routed"); }
};

Backend& cpu_backend();
// nullptr when the library was built without CUDA or no GPU is visible.
Backend* cuda_backend();
// The backend for a device, or an Error naming `arg` when that device has none.
Backend& backend_for(Device device, const char* arg);

}  // namespace leanmoe::detail
