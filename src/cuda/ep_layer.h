// The CUDA half of ep::ExpertParallelLayer (include/leanmoe/ep.h, docs/ep.md): one rank's share of
// an expert-parallel MoE layer with bf16 storage on the GPU, every step enqueued on comm.stream().
// src/ep/expert_parallel_layer.cpp validates the arguments and dispatches here when the
// communicator's device is cuda. Plain C++ header (no CUDA types).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "leanmoe/ep.h"

namespace leanmoe::cuda {

// Empty when the CUDA EP layer takes this configuration with this storage dtype, else the rule.
std::string ep_unsupported_reason(const MoEConfig& cfg, DType dtype);

class EpLayer {
 public:
  // owner_cfg: the config of the owner's routing-given layer call over the received pairs
  // (expert_parallel_layer.cpp's owner_config: E/P experts, K = 1).
  EpLayer(const MoEConfig& cfg, const MoEConfig& owner_cfg, ::leanmoe::ep::Communicator& comm);
  ~EpLayer();
  EpLayer(const EpLayer&) = delete;
  EpLayer& operator=(const EpLayer&) = delete;

  void forward(const Tensor& x, const MoEWeights& w, const Tensor& out);
  void backward(const Tensor& d_out, const MoEWeights& w, const MoEGrads& grads, const ExpertGradCallback& cb);
  std::vector<int64_t> local_expert_counts();  // synchronises comm.stream()

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace leanmoe::cuda
