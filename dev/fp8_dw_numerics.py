#!/usr/bin/env python3
"""Numerics of FP8 weight gradients without a T·K·d pass (issue 16), on the CPU.

    python3 dev/fp8_dw_numerics.py [--m 2048] [--d 1024] [--w 1024] [--seeds 3]

dW1ᵀ = X[tok]ᵀ·dH (and dW2ᵀ = dO[tok]ᵀ·A', the same shape of problem) contracts over an expert's
routed rows. Hopper's FP8 wgmma reads both operands K-major, i.e. token-contiguous, so the scheme
DeepSeek-V3 describes (both operands in 1x128 tiles along K = tokens) needs X[tok] and dO[tok]
gathered, transposed and quantized per expert: a pass over a T·K·d tensor (docs/DESIGN.md "FP8").
The scheme tried here avoids it:

  tok: the gathered operand G (X or dO, [m, d]) quantized with ONE power-of-two scale per token row
       over all d (s_g[t]; a T·d pass over x / dO, not T·K·d), and s_g[t] folded into the other
       operand before it is quantized: E' = s_g[t]·E[t, :] (E = dH or A', [m, W]; s_g is a power of
       two, so the product is exact), E' in 128x1 tiles along tokens (per column, per 128 rows),
       which the dH epilogue can write transposed since it owns 128-row tiles. Then
       dWᵀ[c, j] = Σ_blocks s_E'[blk, j]·Σ_{t in blk} q_g[t, c]·q_E'[t, j]: one scale per output
       column and k-block, a promotion like today's. G's codes still need a transposition into
       K-major shared memory, done in the kernel (the producer or the A-from-registers path).

against
  blk:  both in 128x1 tiles along tokens (DeepSeek-V3's wgrad; the T·K·d pass);
  row128: G in 1x128 tiles along d (the codes the up / dH GEMMs already have) with E' unscaled,
       for reference only: it is not computable with one E' (s_g varies per 128 columns of d).

Relative Frobenius error against the float64 product of the stored bf16 operands (what today's
bf16 dW computes, up to its fp32 sums), per input distribution. Quantization as
src/fp8.h (round to nearest even, satfinite, power-of-two scales s = 2^k, the smallest with
amax <= 448 s).
"""
import argparse
import math

import torch


def scale_pow2(amax):
    m, e = torch.frexp(amax)  # amax = m 2^e, m in [0.5, 1)
    k = torch.where(2 * m > 1.75, e - 8, e - 9).clamp_min(-126)
    k = torch.where(amax == 0, torch.full_like(k, -126), k)
    return torch.ldexp(torch.ones_like(amax), k)


def quantize(v, rows, cols):
    """v [R, C] -> (codes as float, scales broadcast to v's shape): tiles of rows x cols."""
    R, C = v.shape
    f = v.double().reshape(R // rows, rows, C // cols, cols)
    s = scale_pow2(f.abs().amax(dim=(1, 3), keepdim=True))
    q = (f / s).clamp(-448, 448).float().to(torch.float8_e4m3fn).double()
    return q.reshape(R, C), s.expand_as(f).reshape(R, C)


def dq(v, rows, cols):
    q, s = quantize(v, rows, cols)
    return q * s


def schemes(g, e):
    """g [m, d] gathered operand, e [m, W] epilogue operand -> {name: gᵀe estimate}."""
    m, d = g.shape
    out = {"blk": dq(g, 128, 1).T @ dq(e, 128, 1)}
    q_g, s_g = quantize(g, 1, d)  # one scale per token row
    e_fold = e * s_g[:, :1]  # exact: s_g is a power of two
    out["tok"] = q_g.T @ dq(e_fold, 128, 1)
    out["row128"] = dq(g, 1, 128).T @ dq(e, 128, 1)
    return out


def inputs(kind, m, d, w, gen):
    g = torch.randn(m, d, generator=gen, dtype=torch.float64)
    e = torch.randn(m, w, generator=gen, dtype=torch.float64)
    if kind == "outlier channels":  # LLM activations: a few channels 30-100x (RMSNorm weights)
        idx = torch.randperm(d, generator=gen)[: max(1, d // 100)]
        g[:, idx] *= 30 + 70 * torch.rand(len(idx), generator=gen, dtype=torch.float64)
    elif kind == "token spread":  # per-token magnitudes over ~4 binades (gradients dO, dH)
        g *= torch.exp(1.5 * torch.randn(m, 1, generator=gen, dtype=torch.float64))
        e *= torch.exp(1.5 * torch.randn(m, 1, generator=gen, dtype=torch.float64))
    elif kind == "heavy tails":  # student-t, 3 degrees of freedom, both operands
        def t3(shape):
            z = torch.randn(*shape, generator=gen, dtype=torch.float64)
            chi = (torch.randn(*shape, 3, generator=gen, dtype=torch.float64) ** 2).sum(-1)
            return z / torch.sqrt(chi / 3)
        g, e = t3((m, d)), t3((m, w))
    elif kind == "outlier tokens":  # a few tokens 100x (attention sinks, BOS)
        idx = torch.randperm(m, generator=gen)[: max(1, m // 256)]
        g[idx] *= 100
    elif kind == "massive activations":  # a few channels ~2000x (Sun et al. 2024, LLaMA-2: up to ~2^11)
        idx = torch.randperm(d, generator=gen)[:4]
        g[:, idx] *= 2000
    elif kind == "channels 2^±10":  # stress: channel magnitudes over 20 binades (G only)
        g *= torch.exp2(torch.empty(1, d, dtype=torch.float64).uniform_(-10, 10, generator=gen))
    elif kind == "tokens 2^±10":  # stress: token magnitudes over 20 binades (both operands)
        g *= torch.exp2(torch.empty(m, 1, dtype=torch.float64).uniform_(-10, 10, generator=gen))
        e *= torch.exp2(torch.empty(m, 1, dtype=torch.float64).uniform_(-10, 10, generator=gen))
    elif kind != "gaussian":
        raise ValueError(kind)
    return g.bfloat16().double(), e.bfloat16().double()  # what the storage path holds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=2048, help="an expert's routed rows (multiple of 128)")
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--w", type=int, default=1024)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    for v, name in ((a.m, "--m"), (a.d, "--d"), (a.w, "--w")):
        if v <= 0 or v % 128:
            ap.error(f"{name} must be a positive multiple of 128, got {v}")
    kinds = ["gaussian", "outlier channels", "token spread", "heavy tails", "outlier tokens", "massive activations",
             "channels 2^±10",
             "tokens 2^±10"]
    names = ["blk", "tok", "row128"]
    print(f"relative error of Gᵀ·E against float64, m={a.m} d={a.d} W={a.w}, {a.seeds} seeds: "
          "whole matrix (Frobenius, mean over seeds) / worst row of Gᵀ·E (one G column: its own norm, "
          "max over rows and seeds)")
    print(f"| inputs | {' | '.join(names)} |")
    print("|---|" + "---:|" * len(names))
    for kind in kinds:
        whole, worst = {n: [] for n in names}, {n: 0.0 for n in names}
        for seed in range(a.seeds):
            gen = torch.Generator().manual_seed(seed)
            g, e = inputs(kind, a.m, a.d, a.w, gen)
            ref = g.T @ e
            for n, est in schemes(g, e).items():
                whole[n].append(((est - ref).norm() / ref.norm()).item())
                rows = (est - ref).norm(dim=1) / ref.norm(dim=1)
                worst[n] = max(worst[n], rows.max().item())
        cells = [f"{sum(whole[n]) / len(whole[n]):.4f} / {worst[n]:.3g}" for n in names]
        print(f"| {kind} | {' | '.join(cells)} |")

if __name__ == "__main__":
    main()
