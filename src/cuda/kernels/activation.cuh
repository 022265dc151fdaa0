// The experts' activations on the GPU, one type each, shared by every kernel that applies one: the
// up-projection epilogue calls forward, dH's epilogue backward (sm90_grouped_gemm_gather_epilogue.cuh,
// both templated on the type). A new activation is a new type with the same members; only SwiGLU
// exists so far. (The CPU backend keeps its own host definition, src/cpu/experts.cpp.)
// Device-only header.
#pragma once
#include <cuda_runtime.h>

namespace leanmoe::cuda::kernels {

// a = silu(g) · u of H's gate column g and up column u (docs/SPEC.md §2).
//
// __fdividef (MUFU.RCP and a multiply, 2 ulp) instead of '/': the IEEE division brought a compare, a
// branch and a called slow path per element into the up and dH epilogues (128 CALLs in the dH
// kernel). For g < -87 the denominator passes 2^126 and the result is 0 where the exact one is
// below 1e-36.
struct SwiGLU {
  // Gated: H holds [g, u] (2n columns) and a has n. A non-gated activation would read n columns of H.
  static constexpr bool kGated = true;

  __device__ __forceinline__ static float sigmoid(float g) { return __fdividef(1.f, 1.f + __expf(-g)); }

  __device__ __forceinline__ static float forward(float g, float u) { return __fdividef(g, 1.f + __expf(-g)) * u; }

  // The backward of s·a for one column pair, from H's g and u, the upstream gradient dA and the row's
  // routing weight s: dg = s·dA·u·silu'(g), du = s·dA·silu(g), and a = silu(g)·u itself, recomputed
  // here as g·σ(g)·u from the σ(g) the derivative needs (dH's epilogue forms A' = s·a and the ds term
  // dA·a from it).
  struct Backward {
    float dg, du, a;
  };
  __device__ __forceinline__ static Backward backward(float g, float u, float da, float s) {
    const float sig = sigmoid(g);
    const float silu_g = g * sig;
    const float a = silu_g * u;
    return {s * da * u * (sig * (1.f + g * (1.f - sig))), s * da * silu_g, a};
  }
};

}  // namespace leanmoe::cuda::kernels
