// The expert activations (leanmoe.h Activation; DESIGN.md "Activations"): one definition of each
// function and of its two partial derivatives, shared by the CPU backend, the naive reference
// (Real = float or double) and, being __host__ __device__ under nvcc, by GPU epilogues.
//
// Gated: a = f(g, u) from the gate g and the up value u. Plain: a = f(g), u is ignored (pass 0).
// Derivatives follow torch's autograd of the same expressions, so gradients match transformers'
// eager experts: relu'(0) = 0, and a clamp passes the gradient on its closed interval
// (torch.clamp's backward masks with min <= x <= max).
#pragma once
#include <cmath>
#include <type_traits>

#include "host_device.h"
#include "leanmoe/leanmoe.h"

namespace leanmoe::act {

// Every Activation, in enum order (the GPU's launch tables are indexed by it; tests sweep it).
inline constexpr Activation kAll[] = {Activation::swiglu,    Activation::geglu,          Activation::geglu_tanh,
                                      Activation::reglu,     Activation::swiglu_clamped, Activation::swiglu_softcapped,
                                      Activation::gelu,      Activation::gelu_tanh,      Activation::silu,
                                      Activation::relu,      Activation::relu2};

// What an activation needs beyond its kind (the clamped SwiGLU's constants, the soft-capped one's caps).
struct Params {
  Activation kind = Activation::swiglu;
  float alpha = 1.702f;
  float limit = 7.f;
  float up_offset = 1.f;
};

inline Params params_of(const MoEConfig& cfg) {
  return {cfg.activation, cfg.act_alpha, cfg.act_limit, cfg.act_up_offset};
}

// Columns of g_j and u_j in a row of H (the row order of W1): [gate; up], or interleaved
// [g0, u0, g1, u1, ...] (gpt-oss). A plain activation reads its value at gate_column.
LEANMOE_HOST_DEVICE inline int64_t gate_column(int64_t j, bool interleaved) { return interleaved ? 2 * j : j; }
LEANMOE_HOST_DEVICE inline int64_t up_column(int64_t j, int64_t n, bool interleaved) {
  return interleaved ? 2 * j + 1 : n + j;
}

// In float on the GPU, __expf and __fdividef (MUFU.EX2 / MUFU.RCP and a multiply, 2 ulp) instead of
// exp and '/': the IEEE division brought a compare, a branch and a called slow path per element into
// the up and dH epilogues (128 CALLs in the dH kernel). For v < -87 the denominator passes 2^126 and
// the result is 0 where the exact one is below 1e-36.
#if defined(__CUDA_ARCH__)
// __expf(x) with the flush-to-zero ex2 (one MUFU.EX2; __expf's denormal-safe ex2 adds a compare and
// two predicated multiplies per call). Used only as 1 + exp(x): where the two differ (2^(x·log2 e)
// below 2^-126, or a denormal x·log2 e), 1 + e rounds to 1 + 0 either way, so sigmoid and silu are
// bit-identical to __expf's for every float (dev/ex2_ftz_check.cu checks all 2^32 on the GPU).
__device__ inline float exp_ftz(float x) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * 1.44269504088896341f));
  return e;
}
#endif
template <class Real>
LEANMOE_HOST_DEVICE inline Real sigmoid(Real v) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<Real, float>) return __fdividef(1.f, 1.f + exp_ftz(-v));
#endif
  return Real(1) / (Real(1) + std::exp(-v));
}

// GELU, exact: x * Phi(x); its derivative Phi(x) + x * phi(x).
template <class Real>
LEANMOE_HOST_DEVICE inline Real gelu(Real x) {
  return Real(0.5) * x * (Real(1) + std::erf(x * Real(0.70710678118654752440)));
}
template <class Real>
LEANMOE_HOST_DEVICE inline Real gelu_grad(Real x) {
  const Real cdf = Real(0.5) * (Real(1) + std::erf(x * Real(0.70710678118654752440)));
  const Real pdf = std::exp(Real(-0.5) * x * x) * Real(0.39894228040143267794);
  return cdf + x * pdf;
}

// GELU, tanh approximation: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2 / pi).
template <class Real>
LEANMOE_HOST_DEVICE inline Real gelu_tanh(Real x) {
  const Real inner = Real(0.79788456080286535588) * (x + Real(0.044715) * x * x * x);
  return Real(0.5) * x * (Real(1) + std::tanh(inner));
}
template <class Real>
LEANMOE_HOST_DEVICE inline Real gelu_tanh_grad(Real x) {
  const Real c = Real(0.79788456080286535588);
  const Real t = std::tanh(c * (x + Real(0.044715) * x * x * x));
  return Real(0.5) * (Real(1) + t) + Real(0.5) * x * (Real(1) - t * t) * c * (Real(1) + Real(3 * 0.044715) * x * x);
}

template <class Real>
LEANMOE_HOST_DEVICE inline Real silu(Real x) {
#if defined(__CUDA_ARCH__)  // one MUFU.RCP and a multiply, as sigmoid
  if constexpr (std::is_same_v<Real, float>) return __fdividef(x, 1.f + exp_ftz(-x));
#endif
  return x * sigmoid(x);
}
// silu' from x and s = sigmoid(x) (the GPU SwiGLU backward has s already).
template <class Real>
LEANMOE_HOST_DEVICE inline Real silu_grad_of_sigmoid(Real x, Real s) {
  return s * (Real(1) + x * (Real(1) - s));
}
template <class Real>
LEANMOE_HOST_DEVICE inline Real silu_grad(Real x) {
  return silu_grad_of_sigmoid(x, sigmoid(x));
}

// tanh(x / c) (the soft cap c·tanh(x / c) over c). On the GPU the quotient by __fdividef: IEEE '/'
// brings a slow path per element (see sigmoid); c is a cap of order 1-100, far from __fdividef's
// limits, so the quotient is within 2 ulp.
template <class Real>
LEANMOE_HOST_DEVICE inline Real tanh_over(Real x, Real c) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<Real, float>) return tanhf(__fdividef(x, c));
#endif
  return std::tanh(x / c);
}

// f of the gate (gated) or of h (plain), and f'.
template <class Real>
LEANMOE_HOST_DEVICE inline Real gate_fn(Activation k, Real x) {
  switch (k) {
    case Activation::swiglu:
    case Activation::silu: return silu(x);
    case Activation::geglu:
    case Activation::gelu: return gelu(x);
    case Activation::geglu_tanh:
    case Activation::gelu_tanh: return gelu_tanh(x);
    case Activation::reglu:
    case Activation::relu: return x > Real(0) ? x : Real(0);
    case Activation::relu2: return x > Real(0) ? x * x : Real(0);
    case Activation::swiglu_clamped:
    case Activation::swiglu_softcapped: break;  // not of this form (forward() handles them)
  }
  return Real(0);
}
template <class Real>
LEANMOE_HOST_DEVICE inline Real gate_fn_grad(Activation k, Real x) {
  switch (k) {
    case Activation::swiglu:
    case Activation::silu: return silu_grad(x);
    case Activation::geglu:
    case Activation::gelu: return gelu_grad(x);
    case Activation::geglu_tanh:
    case Activation::gelu_tanh: return gelu_tanh_grad(x);
    case Activation::reglu:
    case Activation::relu: return x > Real(0) ? Real(1) : Real(0);
    case Activation::relu2: return x > Real(0) ? Real(2) * x : Real(0);
    case Activation::swiglu_clamped:
    case Activation::swiglu_softcapped: break;
  }
  return Real(0);
}

// a = f(g, u).
template <class Real>
LEANMOE_HOST_DEVICE inline Real forward(const Params& p, Real g, Real u) {
  if (p.kind == Activation::swiglu_clamped) {
    const Real l = Real(p.limit);
    const Real gc = g < l ? g : l;
    const Real uc = u < -l ? -l : (u > l ? l : u);
    return (uc + Real(p.up_offset)) * gc * sigmoid(Real(p.alpha) * gc);
  }
  if (p.kind == Activation::swiglu_softcapped) {  // in Inkling2's order: (sc(g) * sigmoid(g)) * sc(u)
    const Real cg = Real(p.alpha), cu = Real(p.limit);
    return cg * tanh_over(g, cg) * sigmoid(g) * (cu * tanh_over(u, cu));
  }
  const Real f = gate_fn(p.kind, g);
  return activation_is_gated(p.kind) ? f * u : f;
}

// da/dg and da/du (the latter 0 for a plain activation); returns a = f(g, u) from the same terms,
// bitwise forward()'s (the same operations in the same order; tests/test_activations.cpp), so that
// dH's epilogue, which needs both, evaluates the sigmoid of the clamped and soft-capped SwiGLU once
// (with forward() called beside it nvcc kept a second one: 2 ex2 + 2 divisions against 1 + 1 for the
// clamp, 4 + 4 against 3 + 3 for the soft cap, in the PTX of DeviceActivation::backward).
template <class Real>
LEANMOE_HOST_DEVICE inline Real backward(const Params& p, Real g, Real u, Real& da_dg, Real& da_du) {
  if (p.kind == Activation::swiglu_clamped) {
    const Real l = Real(p.limit), alpha = Real(p.alpha);
    const Real gc = g < l ? g : l;
    const Real uc = u < -l ? -l : (u > l ? l : u);
    const Real s = sigmoid(alpha * gc);
    const Real glu = gc * s;
    const Real dglu = s + alpha * gc * s * (Real(1) - s);
    da_dg = g <= l ? (uc + Real(p.up_offset)) * dglu : Real(0);
    da_du = (u >= -l && u <= l) ? glu : Real(0);
    return (uc + Real(p.up_offset)) * gc * s;
  }
  if (p.kind == Activation::swiglu_softcapped) {  // d(c·tanh(x/c))/dx = 1 - tanh(x/c)^2
    const Real cg = Real(p.alpha), cu = Real(p.limit);
    const Real tg = tanh_over(g, cg), tu = tanh_over(u, cu), s = sigmoid(g);
    const Real gate = cg * tg * s, up = cu * tu;
    da_dg = ((Real(1) - tg * tg) * s + cg * tg * s * (Real(1) - s)) * up;
    da_du = gate * (Real(1) - tu * tu);
    return gate * up;
  }
  const Real f = gate_fn(p.kind, g);
  if (activation_is_gated(p.kind)) {
    da_dg = gate_fn_grad(p.kind, g) * u;
    da_du = f;
    return f * u;
  }
  da_dg = gate_fn_grad(p.kind, g);
  da_du = Real(0);
  return f;
}

}  // namespace leanmoe::act
