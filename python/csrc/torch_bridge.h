// What the two torch binding files share: torch tensors as leanmoe::Tensor views and
// leanmoe::Error turned into a Python ValueError. Included only by python/csrc/*.cpp.
#pragma once
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "leanmoe/leanmoe.h"

namespace leanmoe_torch {

using leanmoe::DType;

// A view of `t` (undefined stays undefined); `arg` names the argument in errors.
inline leanmoe::Tensor view_of(const at::Tensor& t, const char* arg) {
  leanmoe::Tensor v;
  if (!t.defined()) return v;
  TORCH_CHECK(t.dim() <= leanmoe::Tensor::kMaxDims, "leanmoe: argument '", arg, "': at most 4 dims, got ",
              t.dim());
  switch (t.scalar_type()) {
    case at::kBFloat16: v.dtype = DType::bf16; break;
    case at::kFloat: v.dtype = DType::f32; break;
    case at::kInt: v.dtype = DType::i32; break;
    case at::kFloat8_e4m3fn: v.dtype = DType::e4m3; break;  // FP8 codes (MoEWeights::fp8)
    default: TORCH_CHECK(false, "leanmoe: argument '", arg, "': dtype must be bfloat16, float32, int32 or "
                         "float8_e4m3fn, got ",
                         t.scalar_type());
  }
  TORCH_CHECK(t.is_cpu() || t.is_cuda(), "leanmoe: argument '", arg, "': must be on cpu or cuda, got ",
              t.device());
  v.device = t.is_cuda() ? leanmoe::Device::cuda : leanmoe::Device::cpu;
  v.device_index = t.is_cuda() ? t.device().index() : 0;
  v.data = t.data_ptr();
  v.ndim = int(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = t.size(i);
    v.stride[i] = t.stride(i);
  }
  return v;
}

// Converts leanmoe::Error into a Python ValueError (its message already names argument and rule).
template <class F>
auto translate_errors(F&& f) {
  try {
    return f();
  } catch (const leanmoe::Error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

// "storage" or "fp8" (leanmoe.MoE's and leanmoe.ep's precision argument).
inline leanmoe::Precision parse_precision(c10::string_view name) {
  for (leanmoe::Precision p : {leanmoe::Precision::storage, leanmoe::Precision::fp8})
    if (name == leanmoe::precision_name(p)) return p;
  TORCH_CHECK_VALUE(false, "leanmoe: argument 'precision': must be 'storage' or 'fp8', got '", std::string(name), "'");
}

}  // namespace leanmoe_torch
