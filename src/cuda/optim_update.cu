// The GPU side of the expert optimizer (seam: src/optim/fused_update.h): the fused update of one
// whole tensor in one launch (with or without the FP8 copy of the updated parameter), enqueued on the caller's stream with no synchronisation, and the
// state initialisation of ExpertOptimizer::register_tensor (zeroed moments, fp32 master copy).
// Kernels: src/cuda/kernels/optim_update.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/expert_gemms.h"
#include "cuda/kernels/optim_update.cuh"
#include "cuda/launchers.h"
#include "optim/fused_update.h"

namespace leanmoe::optim::detail {
namespace {

using cuda::optim::Rule;
using cuda::optim::UpdateArgs;

constexpr int kThreads = 256;

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Grid-stride launch: at most as many blocks as fit on the GPU at once (more would only queue),
// at least enough to give every group of V elements its own thread on small tensors.
// Templated on the kernel itself: every instantiation has the same pointer type, but its own occupancy.
template <auto Kernel>
int grid_for(int64_t work_items) {
  static const int blocks_per_sm = [] {
    int b = 0;
    LEANMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, Kernel, kThreads, 0));
    return std::max(b, 1);
  }();
  const int64_t wanted = (work_items + kThreads - 1) / kThreads;
  return int(std::clamp<int64_t>(wanted, 1, int64_t(blocks_per_sm) * cuda::current_gpu().sm_count));
}

template <Rule R, class P, class G, class M>
void launch(const UpdateArgs& a, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(P);  // 8 bf16 or 4 fp32 parameters per 16-byte access
  const bool vector = aligned16(a.param) && aligned16(a.grad) && aligned16(a.master) && aligned16(a.m) &&
                      aligned16(a.v);
  if (vector) {
    constexpr auto kernel = cuda::optim::fused_update_kernel<R, P, G, M, V>;
    kernel<<<grid_for<kernel>(a.numel / V + a.numel % V), kThreads, 0, stream>>>(a);
  } else {  // a view into the middle of a buffer: same math, element by element
    constexpr auto kernel = cuda::optim::fused_update_kernel<R, P, G, M, 1>;
    kernel<<<grid_for<kernel>(a.numel), kThreads, 0, stream>>>(a);
  }
  LEANMOE_CUDA_CHECK_LAUNCH("fused_update_kernel");
}

// The update with the FP8 copy: a CTA per 128 x 128 block of the bf16 parameter. Alignment (16 bytes
// for every pointer) and the grid size were checked by ExpertOptimizer::set_fp8_copy and step.
template <Rule R, class G, class M>
void launch_fp8(const UpdateArgs& a, const cuda::optim::Fp8Args& q, int64_t E, cudaStream_t stream) {
  const int64_t blocks = E * (q.R / fp8::kTile) * (q.C / fp8::kTile);
  cuda::optim::fused_update_fp8_kernel<R, G, M><<<unsigned(blocks), cuda::kernels::kBlockThreads, 0, stream>>>(a, q);
  LEANMOE_CUDA_CHECK_LAUNCH("fused_update_fp8_kernel");
}

// bf16 moments come only with bf16 parameters (check_moment_dtype), so 6 instantiations, not 8.
template <Rule R>
void launch_typed(const UpdateArgs& a, DType param, DType grad, DType moments, cudaStream_t stream) {
  using bf = __nv_bfloat16;
  const bool p16 = param == DType::bf16, g16 = grad == DType::bf16;
  if (moments == DType::bf16) return g16 ? launch<R, bf, bf, bf>(a, stream) : launch<R, bf, float, bf>(a, stream);
  if (p16 && g16) return launch<R, bf, bf, float>(a, stream);
  if (p16) return launch<R, bf, float, float>(a, stream);
  if (g16) return launch<R, float, bf, float>(a, stream);
  launch<R, float, float, float>(a, stream);
}

template <Rule R, class M>
void launch_fp8_typed(const UpdateArgs& a, const cuda::optim::Fp8Args& q, int64_t E, DType grad, cudaStream_t stream) {
  if (grad == DType::bf16) return launch_fp8<R, __nv_bfloat16, M>(a, q, E, stream);
  launch_fp8<R, float, M>(a, q, E, stream);
}

}  // namespace

void fused_update_cuda(const FusedUpdate& u) {
  UpdateArgs a;
  a.param = u.param.data;
  a.grad = u.grad.data;
  a.master = u.master;
  a.m = u.m;
  a.v = u.v;
  a.numel = u.param.numel();
  a.grad_scale = u.grad_scale;
  a.decay = u.decay;
  a.beta1 = u.beta1;
  a.one_minus_beta1 = u.one_minus_beta1;
  a.beta2 = u.beta2;
  a.one_minus_beta2 = u.one_minus_beta2;
  a.step_size = u.step_size;
  a.inv_sqrt_bc2 = u.inv_sqrt_bc2;
  a.eps = u.eps;
  a.lr = u.lr;
  a.momentum = u.momentum;
  a.weight_decay = u.weight_decay;
  a.nesterov = u.nesterov;
  const auto stream = static_cast<cudaStream_t>(u.stream);
  if (u.fp8.codes) {  // bf16 parameter (ExpertOptimizer::set_fp8_copy checked the copy's arguments)
    const cuda::optim::Fp8Args q{u.fp8.R, u.fp8.C, u.fp8.codes, u.fp8.scales, u.fp8.codes_t, u.fp8.scales_t};
    const bool adamw = u.kind == UpdateKind::adamw, m16 = u.moments == DType::bf16;
    const DType g = u.grad.dtype;
    if (m16)
      return adamw ? launch_fp8_typed<Rule::adamw, __nv_bfloat16>(a, q, u.fp8.E, g, stream)
                   : launch_fp8_typed<Rule::sgd, __nv_bfloat16>(a, q, u.fp8.E, g, stream);
    return adamw ? launch_fp8_typed<Rule::adamw, float>(a, q, u.fp8.E, g, stream)
                 : launch_fp8_typed<Rule::sgd, float>(a, q, u.fp8.E, g, stream);
  }
  if (u.kind == UpdateKind::adamw)
    launch_typed<Rule::adamw>(a, u.param.dtype, u.grad.dtype, u.moments, stream);
  else
    launch_typed<Rule::sgd>(a, u.param.dtype, u.grad.dtype, u.moments, stream);
}

// Setup only (registration), so these finish before returning: the state is ready for a step on
// any stream, blocking or not.
void zero_state_cuda(void* state, size_t bytes) {
  LEANMOE_CUDA_CHECK(cudaMemsetAsync(state, 0, bytes, nullptr));
  LEANMOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void master_from_bf16_cuda(const bf16* param, float* master, int64_t numel) {
  constexpr auto kernel = cuda::optim::bf16_to_f32_kernel;
  kernel<<<grid_for<kernel>(numel), kThreads>>>(reinterpret_cast<const __nv_bfloat16*>(param), master, numel);
  LEANMOE_CUDA_CHECK_LAUNCH("bf16_to_f32_kernel");
  LEANMOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void write_fp8_copy_cuda(const Tensor& param, const Fp8Copy& q, Stream stream) {
  cuda::fp8_quantize_blocks(param.data, q.E, q.R, q.C, q.codes, q.scales, q.codes_t, q.scales_t,
                            static_cast<cudaStream_t>(stream));
}

int pointer_device_cuda(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {  // e.g. no CUDA device at all: host memory
    (void)cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? attr.device : -1;
}

}  // namespace leanmoe::optim::detail
