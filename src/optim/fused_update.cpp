// CPU implementation of the fused optimizer update (math in fused_update.h) and the device dispatch.
#include "optim/fused_update.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fp8.h"

namespace leanmoe::optim::detail {
namespace {

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const bf16* p, int64_t i) { return bf16_to_float(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(bf16* p, int64_t i, float v) { p[i] = float_to_bf16(v); }

// M: the moments' storage type (float or bf16).

// Below this many elements a tensor is updated by one thread: spawning the team costs more than
// the ~1 ns per element of the update itself.
constexpr int64_t kParallelMin = int64_t(1) << 15;

template <class P, class G, class M>
void update_adamw(const FusedUpdate& u) {
  P* param = u.param.ptr<P>();
  const G* grad = u.grad.ptr<G>();
  float* master = u.master;
  M* m_buf = static_cast<M*>(u.m);
  M* v_buf = static_cast<M*>(u.v);
  const int64_t numel = u.param.numel();
#pragma omp parallel for schedule(static) if (numel >= kParallelMin)
  for (int64_t i = 0; i < numel; ++i) {
    const float g = load(grad, i) * u.grad_scale;
    float p = master ? master[i] : load(param, i);
    p = p * u.decay;
    const float m = u.beta1 * load(m_buf, i) + u.one_minus_beta1 * g;
    const float v = u.beta2 * load(v_buf, i) + u.one_minus_beta2 * (g * g);
    store(m_buf, i, m);
    store(v_buf, i, v);
    p = p - u.step_size * (m / (std::sqrt(v) * u.inv_sqrt_bc2 + u.eps));
    if (master) master[i] = p;
    store(param, i, p);
  }
}

template <class P, class G, class M>
void update_sgd(const FusedUpdate& u) {
  P* param = u.param.ptr<P>();
  const G* grad = u.grad.ptr<G>();
  float* master = u.master;
  M* buf = static_cast<M*>(u.m);
  const int64_t numel = u.param.numel();
#pragma omp parallel for schedule(static) if (numel >= kParallelMin)
  for (int64_t i = 0; i < numel; ++i) {
    float p = master ? master[i] : load(param, i);
    float g = load(grad, i) * u.grad_scale;
    if (u.weight_decay != 0.f) g = g + u.weight_decay * p;
    float dir = g;
    if (buf) {
      const float b = u.momentum * load(buf, i) + g;
      store(buf, i, b);
      dir = u.nesterov ? g + u.momentum * b : b;
    }
    p = p - u.lr * dir;
    if (master) master[i] = p;
    store(param, i, p);
  }
}

template <class P, class G, class M = float>
void update_typed(const FusedUpdate& u) {
  if (u.kind == UpdateKind::adamw)
    update_adamw<P, G, M>(u);
  else
    update_sgd<P, G, M>(u);
}

}  // namespace

void fused_update_cpu(const FusedUpdate& u) {
  const bool p16 = u.param.dtype == DType::bf16, g16 = u.grad.dtype == DType::bf16;
  const bool m16 = u.moments == DType::bf16;  // bf16 parameters only (check_moment_dtype)
  if (m16)
    g16 ? update_typed<bf16, bf16, bf16>(u) : update_typed<bf16, float, bf16>(u);
  else if (p16 && g16)
    update_typed<bf16, bf16>(u);
  else if (p16)
    update_typed<bf16, float>(u);
  else if (g16)
    update_typed<float, bf16>(u);
  else
    update_typed<float, float>(u);
  if (u.fp8.codes) fp8_copy_cpu(u.param, u.fp8);
}

// Expert by expert: fp8::quantize of its bf16 values (as floats: exact), then the codes and block
// scales transposed.
void fp8_copy_cpu(const Tensor& param, const Fp8Copy& q) {
  const int64_t R = q.R, C = q.C, nbr = R / fp8::kTile, nbc = C / fp8::kTile;
  const bf16* w = param.ptr<bf16>();
#pragma omp parallel for schedule(static) if (q.E > 1)
  for (int64_t e = 0; e < q.E; ++e) {
    std::vector<float> v(size_t(R * C));
    for (int64_t i = 0; i < R * C; ++i) v[size_t(i)] = bf16_to_float(w[e * R * C + i]);
    uint8_t* codes = q.codes + e * R * C;
    float* scales = q.scales + e * nbr * nbc;
    fp8::quantize(v.data(), R, C, fp8::kTile, codes, scales);
    if (!q.codes_t) continue;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) q.codes_t[(e * C + c) * R + r] = codes[r * C + c];
    for (int64_t br = 0; br < nbr; ++br)
      for (int64_t bc = 0; bc < nbc; ++bc) q.scales_t[(e * nbc + bc) * nbr + br] = scales[br * nbc + bc];
  }
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

void zero_state(Device device, void* state, size_t bytes) {
  if (device == Device::cpu) {
    std::memset(state, 0, bytes);
    return;
  }
#if LEANMOE_OPTIM_CUDA_UPDATE
  zero_state_cuda(state, bytes);
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

void write_fp8_copy(const Tensor& param, const Fp8Copy& copy, Stream stream) {
  if (param.device == Device::cpu) return fp8_copy_cpu(param, copy);
#if LEANMOE_OPTIM_CUDA_UPDATE
  write_fp8_copy_cuda(param, copy, stream);
#else
  (void)stream;
  no_gpu_update("ExpertOptimizer::set_fp8_copy", param.device);
#endif
}

bool on_device_of(const Tensor& param, const void* p) {
#if LEANMOE_OPTIM_CUDA_UPDATE
  const int holder = pointer_device_cuda(p);
  return param.device == Device::cpu ? holder < 0 : holder == param.device_index;
#else
  (void)p;
  return param.device == Device::cpu;
#endif
}

}  // namespace leanmoe::optim::detail
