// The experts' activations on the GPU, one type per Activation, shared by every kernel that applies
// one: the up-projection epilogue calls forward, dH's epilogue backward
// (sm90_grouped_gemm_gather_epilogue.cuh, both templated on the type). The formulas are
// src/activation.h's (the CPU backend's and the reference's, in float: on the GPU sigmoid and silu
// use __expf/__fdividef, see there); these types only bind the kind at compile time, so that each
// epilogue is one instantiation per activation with the kind's branches folded away.
// Device-only header.
#pragma once
#include <cuda_runtime.h>

#include "../../activation.h"

namespace leanmoe::cuda::kernels {

// The constants of the clamped SwiGLU (act_alpha, act_limit, act_up_offset) or the soft-capped one's
// caps (act_alpha, act_limit), from the launch arguments. 8 bytes: GemmArgs has no 4 bytes left (its
// 128 keep the default kernels' SASS), so the up offset, 0 or 1 (validate.cpp), rides in the limit's
// sign bit (the limit is > 0).
struct ActConstants {
  float alpha, limit_signed;  // limit_signed: +limit for up offset 1, -limit for 0

  __host__ __device__ static ActConstants of(float alpha, float limit, float up_offset) {
    return {alpha, up_offset == 0.f ? -limit : limit};
  }
  // The offset by arithmetic, not a select on the sign: with the select nvcc kept two copies of
  // dH's epilogue (the swiglu_clamped dH kernels grew from 14.6k to 24.8k instructions).
  __device__ __forceinline__ act::Params params(Activation kind) const {
    return {kind, alpha, fabsf(limit_signed), 0.5f + copysignf(0.5f, limit_signed)};
  }
};

// The backward of s·a for one column pair (g, u), with the upstream gradient dA and the row's
// routing weight s: dg = s·dA·da/dg, du = s·dA·da/du, and a itself (dH's epilogue forms A' = s·a
// and the ds term dA·a from it).
struct ActBackward {
  float dg, du, a;
};

template <Activation kKind>
struct DeviceActivation {
  // Gated: H holds g and u (2n columns) and a has n; plain: H holds h (n columns), a = f(h).
  static constexpr bool kGated = activation_is_gated(kKind);
  static constexpr bool kNoBiasGateUp = false;  // see NoBiasGateUp

  __device__ __forceinline__ static act::Params params(ActConstants c) { return c.params(kKind); }

  __device__ __forceinline__ static float forward(ActConstants c, float g, float u) {
    return act::forward(params(c), g, u);
  }

  __device__ __forceinline__ static ActBackward backward(ActConstants c, float g, float u, float da, float s) {
    float da_dg, da_du;
    const float a = act::backward(params(c), g, u, da_dg, da_du);
    const float sda = s * da;
    return {sda * da_dg, sda * da_du, a};
  }
};

// SwiGLU, a = silu(g)·u (docs/SPEC.md §2): the backward shares σ(g) between silu(g) = g·σ(g) and
// silu'(g) (the generic form evaluates silu twice), in the operation order the kernel was tuned with.
template <>
struct DeviceActivation<Activation::swiglu> {
  static constexpr bool kGated = true;
  static constexpr bool kNoBiasGateUp = false;

  __device__ __forceinline__ static float forward(ActConstants, float g, float u) { return act::silu(g) * u; }

  __device__ __forceinline__ static ActBackward backward(ActConstants, float g, float u, float da, float s) {
    const float sig = act::sigmoid(g);
    const float silu_g = g * sig;
    const float a = silu_g * u;
    return {s * da * u * act::silu_grad_of_sigmoid(g, sig), s * da * silu_g, a};
  }
};

using SwiGLU = DeviceActivation<Activation::swiglu>;

// Act on the default path, no b1 and W1 in [gate; up] order, both fixed at compile time: up's and
// dH's kernels then carry no branch on either (the run-time branches cost 2-4% on up, its SASS
// grew from ~2500 to ~6700 instructions). Instantiated for SwiGLU only (expert_gemms.cu); the other
// combinations read args.b1 and args.interleaved at run time.
template <class Act>
struct NoBiasGateUp : Act {
  static_assert(Act::kGated, "a plain activation has no row order");
  static constexpr bool kNoBiasGateUp = true;
};

}  // namespace leanmoe::cuda::kernels
