// The fused, element-wise optimizer update of one whole tensor, and its per-device dispatch.
//
// Every scalar that depends on the step (bias corrections, decay factor) is computed once on the
// host, in double, then rounded to float, so each device runs the same float math per element:
//   AdamW  g = grad*grad_scale;  p = p*decay;  m = beta1*m + one_minus_beta1*g;
//          v = beta2*v + one_minus_beta2*(g*g);  p = p - step_size*(m / (sqrt(v)*inv_sqrt_bc2 + eps))
//   SGD    g = grad*grad_scale + weight_decay*p;  buf = momentum*buf + g (when buf exists);
//          dir = nesterov ? g + momentum*buf : (buf ? buf : g);  p = p - lr*dir
// p is read from the fp32 master copy when there is one (and written back there; the parameter
// then gets bf16(p)), else from the parameter (bf16 parameters are rounded back to bf16).
// Moments (m, v, buf) are read into fp32 and, when kept in bf16, rounded to bf16 only when stored:
// the parameter's step uses the fp32 values, as torch's fused AdamW does for bf16 moments.
// No reduction anywhere: each element depends only on its own inputs, so any split across
// threads or CUDA blocks gives the same bits.
//
// FP8 copy (fp8.codes not null; bf16 parameters viewed as [E, R, C]): after the update, the codes
// and scales of the parameter's new bf16 values, 128 x 128 blocks, and optionally the transposed
// codes, exactly fp8::quantize's (the block amax is a max, exact in any order). The CPU updates the
// whole tensor, then quantizes it; the GPU does both in one kernel, a CTA per block.
//
// GPU: src/cuda/optim_update.cu defines the *_cuda functions below (one launch per tensor, 16-byte
// vector accesses, on u.stream, no synchronisation); LEANMOE_OPTIM_CUDA_UPDATE is 1 whenever the
// library is built with its CUDA backend. The GPU kernel rounds every operation explicitly, so
// both devices produce the same bits (src/cuda/kernels/optim_update.cuh says why).
#pragma once
#include <cstdint>

#include "leanmoe/optim.h"

#ifndef LEANMOE_OPTIM_CUDA_UPDATE
#ifdef LEANMOE_WITH_CUDA
#define LEANMOE_OPTIM_CUDA_UPDATE 1
#else
#define LEANMOE_OPTIM_CUDA_UPDATE 0
#endif
#endif

namespace leanmoe::optim::detail {

enum class UpdateKind { adamw, sgd };

struct FusedUpdate {
  UpdateKind kind = UpdateKind::adamw;
  Tensor param;            // bf16 or f32, contiguous, updated in place
  Tensor grad;             // same numel, bf16 or f32, contiguous
  float* master = nullptr; // fp32 [numel] or nullptr
  void* m = nullptr;       // AdamW exp_avg, or SGD momentum buffer (nullptr: momentum == 0)
  void* v = nullptr;       // AdamW exp_avg_sq
  DType moments = DType::f32;  // of m and v: f32, or bf16 for bf16 parameters
  float grad_scale = 1.f;
  // AdamW
  float decay = 1.f;  // 1 - lr*weight_decay
  float beta1 = 0.f, one_minus_beta1 = 1.f, beta2 = 0.f, one_minus_beta2 = 1.f;
  float step_size = 0.f;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2 = 1.f;  // 1 / sqrt(1 - beta2^t)
  float eps = 0.f;
  // SGD
  float lr = 0.f, momentum = 0.f, weight_decay = 0.f;
  bool nesterov = false;
  Fp8Copy fp8;  // written when fp8.codes is not null
  Stream stream = nullptr;
};

// Dispatches on param.device.
void fused_update(const FusedUpdate& u);
void fused_update_cpu(const FusedUpdate& u);

// State initialisation on the state's device (register_tensor): a zeroed buffer, and the fp32
// master copy of bf16 parameters. Both have returned with the memory written.
void zero_state(Device device, void* state, size_t bytes);
void master_from_bf16(Device device, const bf16* param, float* master, int64_t numel);

// The FP8 copy of the bf16 parameter's current values (ExpertOptimizer::set_fp8_copy), on u.stream
// for the GPU; the CPU one is fp8_copy_cpu.
void write_fp8_copy(const Tensor& param, const Fp8Copy& copy, Stream stream);
void fp8_copy_cpu(const Tensor& param, const Fp8Copy& copy);
// Whether p points into memory of param's device (host memory for Device::cpu), for argument checks.
bool on_device_of(const Tensor& param, const void* p);

#if LEANMOE_OPTIM_CUDA_UPDATE
void fused_update_cuda(const FusedUpdate& u);
void zero_state_cuda(void* state, size_t bytes);
void master_from_bf16_cuda(const bf16* param, float* master, int64_t numel);
void write_fp8_copy_cuda(const Tensor& param, const Fp8Copy& copy, Stream stream);
int pointer_device_cuda(const void* p);  // the CUDA device holding p, or -1 for host memory
#endif

}  // namespace leanmoe::optim::detail
