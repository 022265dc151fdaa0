// CPU implementation of the fused optimizer update (math in fused_update.h) and the device dispatch.
#include "optim/fused_update.h"

#include <cmath>
#include <cstring>
#include <string>

namespace leanmoe::optim::detail {
namespace {

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const bf16* p, int64_t i) { return bf16_to_float(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(bf16* p, int64_t i, float v) { p[i] = float_to_bf16(v); }

// Below this many elements a tensor is updated by one thread: spawning the team costs more than
// the ~1 ns per element of the update itself.
constexpr int64_t kParallelMin = int64_t(1) << 15;

template <class P, class G>
void update_adamw(const FusedUpdate& u) {
  P* param = u.param.ptr<P>();
  const G* grad = u.grad.ptr<G>();
  float* master = u.master;
  float* M = u.m;
  float* V = u.v;
  const int64_t numel = u.param.numel();
#pragma omp parallel for schedule(static) if (numel >= kParallelMin)
  for (int64_t i = 0; i < numel; ++i) {
    const float g = load(grad, i) * u.grad_scale;
    float p = master ? master[i] : load(param, i);
    p = p * u.decay;
    const float m = u.beta1 * M[i] + u.one_minus_beta1 * g;
    const float v = u.beta2 * V[i] + u.one_minus_beta2 * (g * g);
    M[i] = m;
    V[i] = v;
    p = p - u.step_size * (m / (std::sqrt(v) * u.inv_sqrt_bc2 + u.eps));
    if (master) master[i] = p;
    store(param, i, p);
  }
}

template <class P, class G>
void update_sgd(const FusedUpdate& u) {
  P* param = u.param.ptr<P>();
  const G* grad = u.grad.ptr<G>();
  float* master = u.master;
  float* buf = u.m;
  const int64_t numel = u.param.numel();
#pragma omp parallel for schedule(static) if (numel >= kParallelMin)
  for (int64_t i = 0; i < numel; ++i) {
    float p = master ? master[i] : load(param, i);
    float g = load(grad, i) * u.grad_scale;
    if (u.weight_decay != 0.f) g = g + u.weight_decay * p;
    float dir = g;
    if (buf) {
      const float b = u.momentum * buf[i] + g;
      buf[i] = b;
      dir = u.nesterov ? g + u.momentum * b : b;
    }
    p = p - u.lr * dir;
    if (master) master[i] = p;
    store(param, i, p);
  }
}

template <class P, class G>
void update_typed(const FusedUpdate& u) {
  if (u.kind == UpdateKind::adamw)
    update_adamw<P, G>(u);
  else
    update_sgd<P, G>(u);
}

}  // namespace

void fused_update_cpu(const FusedUpdate& u) {
  const bool p16 = u.param.dtype == DType::bf16, g16 = u.grad.dtype == DType::bf16;
  if (p16 && g16) return update_typed<bf16, bf16>(u);
  if (p16) return update_typed<bf16, float>(u);
  if (g16) return update_typed<float, bf16>(u);
  update_typed<float, float>(u);
}

#if !LEANMOE_OPTIM_CUDA_UPDATE
namespace {
[[noreturn]] void no_gpu_update(const char* fn, Device device) {
  throw Error(std::string(fn) + ": argument 'param': no fused update for device " + device_name(device) +
              " in this build (built without the CUDA backend)");
}
}  // namespace
#endif

void fused_update(const FusedUpdate& u) {
  if (u.param.device == Device::cpu) return fused_update_cpu(u);
#if LEANMOE_OPTIM_CUDA_UPDATE
  return fused_update_cuda(u);
#else
  no_gpu_update("ExpertOptimizer::step", u.param.device);
#endif
}

void zero_state(Device device, float* state, int64_t numel) {
  if (device == Device::cpu) {
    std::memset(state, 0, size_t(numel) * sizeof(float));
    return;
  }
#if LEANMOE_OPTIM_CUDA_UPDATE
  zero_state_cuda(state, numel);
#else
  no_gpu_update("ExpertOptimizer::register_tensor", device);
#endif
}

void master_from_bf16(Device device, const bf16* param, float* master, int64_t numel) {
  if (device == Device::cpu) {
    for (int64_t i = 0; i < numel; ++i) master[i] = bf16_to_float(param[i]);
    return;
  }
#if LEANMOE_OPTIM_CUDA_UPDATE
  master_from_bf16_cuda(param, master, numel);
#else
  no_gpu_update("ExpertOptimizer::register_tensor", device);
#endif
}

}  // namespace leanmoe::optim::detail
