// Argument rules of the public API, checked before any backend runs. Each failure throws
// leanmoe::Error with a message "<function>: argument '<name>': <rule>, got <what>".
#pragma once
#include "backend.h"

namespace leanmoe::detail {

void validate_config(const MoEConfig& cfg, const char* fn);
// The storage dtype: bf16 or f32 (bf16 for cfg.precision = fp8).
void validate_storage(const MoEConfig& cfg, DType dtype, const char* fn);
// w.fp8 (cfg.fp8_weights_given: all eight codes and scales of cfg.E experts, else none) on ref's
// device; experts_name is cfg.E's letter in messages (the EP layer's local experts: "E/P").
void validate_fp8_weights(const MoEConfig& cfg, const MoEWeights& w, const Tensor& ref, const char* ref_name,
                          const char* experts_name, const char* fn);
// T >= 0 and every routed-row index fits the i32 routing metadata: T and R_max <= 2^31 - 1.
void validate_tokens(const MoEConfig& cfg, int64_t T, const char* fn);
void validate_forward(const ForwardArgs& a, Backend& be);
void validate_backward(const BackwardArgs& a, Backend& be);
void validate_forward_routed(const RoutedForwardArgs& a, Backend& be);
void validate_backward_routed(const RoutedBackwardArgs& a, Backend& be);

}  // namespace leanmoe::detail
