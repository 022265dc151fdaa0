// Device code of the fused expert-optimizer update (the math is specified in src/optim/fused_update.h).
//
// Bit-exact with the CPU path: every operation is an explicitly rounded intrinsic (__fmul_rn,
// __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn), which nvcc never contracts into an FMA and never
// replaces by an approximation, in the same order as the CPU loop. The CPU loop is compiled with
// -ffp-contract=off (CMakeLists.txt) and without -ffast-math, with correctly rounded sqrt and
// division, so both devices round every operation once, the same way. bf16 stores use cvt.rn.bf16 (round to
// nearest even), the same rounding as leanmoe::float_to_bf16 for every non-NaN value.
//
// Memory: the update is bandwidth-bound (AdamW, bf16 parameters, no master: 22 bytes moved per
// element with fp32 moments, 14 with bf16 moments, against ~12 flops), so each thread moves a group
// of V elements with 16-byte accesses (V = 8 for bf16 parameters: one 16-byte access of the
// parameter, two of each fp32 buffer or one of each bf16 moment; V = 4 for fp32 parameters),
// grid-stride over the groups; the numel % V tail is done element by element. The moments' storage
// type M (float, or bf16 for bf16 parameters) is a template argument: bf16 moments are widened on
// load and rounded (cvt.rn.bf16) on store, the math between stays fp32.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "fp8_encode.cuh"

namespace leanmoe::cuda::optim {

enum class Rule { adamw, sgd };

// Raw pointers and the step scalars (computed on the host, see fused_update.h).
struct UpdateArgs {
  void* param = nullptr;        // P[numel]
  const void* grad = nullptr;   // G[numel]
  float* master = nullptr;      // fp32 master copy or nullptr
  void* m = nullptr;            // AdamW exp_avg / SGD momentum buffer (nullptr: no momentum), of M
  void* v = nullptr;            // AdamW exp_avg_sq, of M
  int64_t numel = 0;
  float grad_scale = 1.f;
  float decay = 1.f, beta1 = 0.f, one_minus_beta1 = 1.f, beta2 = 0.f, one_minus_beta2 = 1.f;
  float step_size = 0.f, inv_sqrt_bc2 = 1.f, eps = 0.f;
  float lr = 0.f, momentum = 0.f, weight_decay = 0.f;
  bool nesterov = false;
};

// ---- element math: the same operations, in the same order, as fused_update.cpp ----------------

__device__ __forceinline__ void adamw_element(const UpdateArgs& a, float grad, float& p, float& m, float& v) {
  const float g = __fmul_rn(grad, a.grad_scale);
  p = __fmul_rn(p, a.decay);
  m = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(a.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(a.one_minus_beta2, __fmul_rn(g, g)));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), a.inv_sqrt_bc2), a.eps);
  p = __fsub_rn(p, __fmul_rn(a.step_size, __fdiv_rn(m, denom)));
}

// `buf` is ignored when has_buf is false (momentum == 0: no buffer).
__device__ __forceinline__ void sgd_element(const UpdateArgs& a, float grad, float& p, float& buf, bool has_buf) {
  float g = __fmul_rn(grad, a.grad_scale);
  if (a.weight_decay != 0.f) g = __fadd_rn(g, __fmul_rn(a.weight_decay, p));
  float dir = g;
  if (has_buf) {
    buf = __fadd_rn(__fmul_rn(a.momentum, buf), g);
    dir = a.nesterov ? __fadd_rn(g, __fmul_rn(a.momentum, buf)) : buf;
  }
  p = __fsub_rn(p, __fmul_rn(a.lr, dir));
}

// ---- vector loads and stores ----------------------------------------------------------------

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// V elements of T moved as raw 16-byte words (uint4; uint2 for 8 bytes, e.g. 4 bf16 gradients of
// fp32 parameters), then converted in registers. V == 1: a plain scalar access.
template <class T, int V>
__device__ __forceinline__ void load(const void* base, int64_t i, float (&out)[V]) {
  const T* src = static_cast<const T*>(base) + i;
  T x[V];
  constexpr int kBytes = int(sizeof(T)) * V;
  if constexpr (kBytes % 16 == 0) {
    uint4 raw[kBytes / 16];
#pragma unroll
    for (int r = 0; r < kBytes / 16; ++r) raw[r] = reinterpret_cast<const uint4*>(src)[r];
    memcpy(x, raw, kBytes);
  } else if constexpr (kBytes == 8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    memcpy(x, &raw, kBytes);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] = src[k];
  }
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = to_float(x[k]);
}

template <class T, int V>
__device__ __forceinline__ void store(void* base, int64_t i, const float (&in)[V]) {
  T* dst = static_cast<T*>(base) + i;
  T x[V];
#pragma unroll
  for (int k = 0; k < V; ++k) x[k] = from_float<T>(in[k]);
  constexpr int kBytes = int(sizeof(T)) * V;
  if constexpr (kBytes % 16 == 0) {
    uint4 raw[kBytes / 16];
    memcpy(raw, x, kBytes);
#pragma unroll
    for (int r = 0; r < kBytes / 16; ++r) reinterpret_cast<uint4*>(dst)[r] = raw[r];
  } else if constexpr (kBytes == 8) {
    uint2 raw;
    memcpy(&raw, x, kBytes);
    *reinterpret_cast<uint2*>(dst) = raw;
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) dst[k] = x[k];
  }
}

// ---- one group of V consecutive elements starting at i ---------------------------------------

// Leaves the updated fp32 values in p (the master's, when there is one). M: the moments' storage type.
template <Rule R, class P, class G, class M, int V>
__device__ __forceinline__ void update_group(const UpdateArgs& a, int64_t i, float (&p)[V]) {
  float g[V], m[V], v[V];
  load<G, V>(a.grad, i, g);
  if (a.master)
    load<float, V>(a.master, i, p);
  else
    load<P, V>(a.param, i, p);
  if constexpr (R == Rule::adamw) {
    load<M, V>(a.m, i, m);
    load<M, V>(a.v, i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) adamw_element(a, g[k], p[k], m[k], v[k]);
    store<M, V>(a.m, i, m);
    store<M, V>(a.v, i, v);
  } else {
    const bool has_buf = a.m != nullptr;
    if (has_buf) load<M, V>(a.m, i, m);
#pragma unroll
    for (int k = 0; k < V; ++k) sgd_element(a, g[k], p[k], m[k], has_buf);
    if (has_buf) store<M, V>(a.m, i, m);
  }
  if (a.master) store<float, V>(a.master, i, p);
  store<P, V>(a.param, i, p);
}

// One launch per tensor. V > 1 needs every pointer 16-byte aligned (checked by the launcher);
// V == 1 is the fallback for views that are not.
template <Rule R, class P, class G, class M, int V>
__global__ void __launch_bounds__(256) fused_update_kernel(UpdateArgs a) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = a.numel / V;
  for (int64_t gi = first; gi < groups; gi += stride) {
    float p[V];
    update_group<R, P, G, M, V>(a, gi * V, p);
  }
  if constexpr (V > 1)
    for (int64_t i = groups * V + first; i < a.numel; i += stride) {
      float p[1];
      update_group<R, P, G, M, 1>(a, i, p);
    }
}

// ---- the update that also writes the FP8 copy of the updated parameter ------------------------
// bf16 parameters viewed as [E, R, C] (R, C multiples of 128): a CTA per 128 x 128 block, each thread
// updating the 8 x 8 elements whose codes it writes (kernels::BlockPlace: 16-byte accesses, 16
// threads on one 128-element row), then the block's scale, codes and transposed codes from the
// values the parameter now holds, bf16(p), by the same encode_block as fp8_quantize_blocks_kernel.
// One pass over the memory the update moves anyway: the separate quantization would read the bf16
// parameter again (2 bytes per element) on top of writing the codes. Every pointer 16-byte aligned.
struct Fp8Args {
  int64_t R = 0, C = 0;
  uint8_t* codes = nullptr;    // [E, R, C]
  float* scales = nullptr;     // [E, R/128, C/128]
  uint8_t* codes_t = nullptr;  // [E, C, R] or nullptr
  float* scales_t = nullptr;   // [E, C/128, R/128] or nullptr
};

// kMinBlocks: CTAs per SM that __launch_bounds__ asks registers for (dev/optim_fp8_bench.cu times
// the choices).
template <Rule R, class G, class M, int kMinBlocks = 2>
__global__ void __launch_bounds__(kernels::kBlockThreads, kMinBlocks) fused_update_fp8_kernel(UpdateArgs a, Fp8Args q) {
  using kernels::kBlockPasses;
  __shared__ kernels::BlockEncodeSmem smem;
  const kernels::BlockPlace b(q.R, q.C);
  uint4 stored[kBlockPasses];  // the bf16 values the parameter now holds, as stored
#pragma unroll
  for (int pass = 0; pass < kBlockPasses; ++pass) {
    float p[8];
    update_group<R, __nv_bfloat16, G, M, 8>(a, b.at(pass), p);
    __nv_bfloat16 x[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = __float2bfloat16_rn(p[k]);
    memcpy(&stored[pass], x, 16);
  }
  kernels::encode_block(b, stored, q.codes, q.scales, q.codes_t, q.scales_t, smem);
}

// fp32 master copy from bf16 parameters (ExpertOptimizer::register_tensor). Static: the header is
// also compiled into dev/optim_fp8_bench.cu.
static __global__ void bf16_to_f32_kernel(const __nv_bfloat16* src, float* dst, int64_t numel) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride)
    dst[i] = __bfloat162float(src[i]);
}

}  // namespace leanmoe::cuda::optim
