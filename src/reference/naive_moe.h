// The naive reference MoE layer, for tests and `leanmoe check` only (never used by the library).
// It caches everything a textbook autograd would (gathered X, H, A, Y) and computes the score
// gradient as dS = <dO, y>, independently of the memory-efficient path's dS = <dA', a>.
// Host memory, values held in `Real` (float or double). With dtype == bf16 it rounds at the
// points docs/DESIGN.md lists, so it computes the same function as the backends.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "leanmoe/leanmoe.h"

namespace leanmoe::reference {

// Layer inputs on the host, as values (already representable in `dtype` when it is bf16). The
// expert weights are in cfg's layout (leanmoe.h MoEWeights: W = up_width, interleaved, transposed).
struct HostLayerInputs {
  MoEConfig cfg;
  int64_t T = 0;
  DType dtype = DType::f32;
  std::vector<float> x;        // [T, d]
  std::vector<float> router;   // [E, d] (unused with routing given)
  std::vector<float> gate_up;  // [E, W, d] or [E, d, W]
  std::vector<float> down;     // [E, d, n] or [E, n, d]
  std::vector<float> gate_up_bias;  // [E, W] or empty (no bias)
  std::vector<float> down_bias;     // [E, d] or empty
  std::vector<float> d_out;    // [T, d]
  float d_aux = 0.f, d_z = 0.f;  // gradient of the loss w.r.t. aux_loss and z_loss
  // Routing given by the caller (cfg.routing == given): ids outside [0, E) are "no expert".
  std::vector<int32_t> topk_experts;  // [T, K]
  std::vector<float> topk_weights;    // [T, K], representable in weights_dtype
  DType weights_dtype = DType::f32;   // f32 or dtype
};

// Random inputs drawn from `seed`: x ~ N(0,1), weights ~ N(0, 1/fan_in), d_out ~ N(0,1), rounded
// to `dtype`. Never zeros. With routing given: K distinct random experts per token and weights
// uniform in (0.1, 1), in `dtype`.
HostLayerInputs random_inputs(const MoEConfig& cfg, int64_t T, DType dtype, uint64_t seed);

// Adds random biases ~ N(0, 0.5) (gate_up_bias [E, W], down_bias [E, d]) to `in`.
void add_random_biases(HostLayerInputs& in, uint64_t seed);

struct HostLayerOutputs {
  std::vector<float> out, dx, d_router, d_gate_up, d_down;
  std::vector<float> d_gate_up_bias, d_down_bias;  // empty without biases
  std::vector<float> d_topk_weights;                // [T, K] routing given only
  float aux_loss = 0.f, z_loss = 0.f;
  std::vector<int32_t> expert_counts;  // rows per expert after routing (token rounding included)
  std::vector<int32_t> topk_counts;    // rows per expert of the plain top-K choice
  size_t saved_bytes = 0;              // bytes this path keeps between forward and backward
};

// Forward then backward through the naive path, in precision Real.
template <class Real>
HostLayerOutputs naive_forward_backward(const HostLayerInputs& in);

// Which input a finite-difference probe perturbs.
enum class Param { x, router, gate_up, down, gate_up_bias, down_bias, topk_weights };

// The scalar L = <out, d_out> + d_aux * aux_loss + d_z * z_loss of the naive forward in double
// precision (no rounding; meant for dtype f32 inputs), with entry `index` of `which` shifted by
// `delta`. Its derivatives are what naive_forward_backward<double> returns as gradients.
double naive_loss(const HostLayerInputs& in, Param which, size_t index, double delta);

// Bytes the naive path keeps for backward (gathered X, H, A, Y, scores, indices; biases add nothing).
size_t naive_saved_bytes(const MoEConfig& cfg, int64_t T, DType dtype);

// Runs the library's forward+backward on `device` from host inputs (copies in, runs, copies out),
// poisoning outputs and workspaces first so unwritten elements show as NaN. saved_bytes = SavedState
// bytes + x. Forward and backward run on `stream`; `launch`, when given, is called with a function
// that enqueues the two instead of that function being called directly (the GPU tests capture it
// into a CUDA graph); it must have run the work when it returns or leave it on `stream`.
using LayerLauncher = std::function<void(const std::function<void()>& enqueue_layer)>;
HostLayerOutputs run_backend(const HostLayerInputs& in, Device device, Stream stream = nullptr,
                             const LayerLauncher& launch = nullptr);

// Relative error ||a - b|| / max(||b||, tiny), NaN-propagating (returns +inf if any NaN).
double rel_error(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace leanmoe::reference
