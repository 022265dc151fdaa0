"""leanmoe's token rounding against SonicMoE's published rule (Dao-AILab/sonic-moe,
benchmarks/moe-token-rounding.py) written here in that rule's scatter form: the renormalised top-K
scores scattered into the full softmax, p - 1 for the unchosen pairs, a per-expert descending sort,
the first r_e kept, gates gathered from the score matrix, gradients by autograd. fp32; `nearest`
breaks a tie upwards as leanmoe does (SonicMoE's torch.round goes to even). Compares the rows per
expert exactly and out, dx, dWr (docs/DESIGN.md "Routing"; 3e-7 relative at most when last run).

    PYTHONPATH=<leanmoe python front> python3 dev/token_rounding_sonic_form.py
"""
import torch, torch.nn.functional as F, leanmoe
torch.manual_seed(0)
def sonic_tr(x, wr, K, tile, mode):
    T, E = x.shape[0], wr.shape[0]
    p = F.softmax(x @ wr.t(), dim=-1)
    topv, topi = p.topk(K, dim=-1)
    f = torch.bincount(topi.reshape(-1), minlength=E)
    topv = topv / topv.sum(-1, keepdim=True)           # renormalised over the ORIGINAL top-K
    scores = p.scatter(-1, topi, topv)                   # chosen: renormalised, unchosen: raw p
    prio = (scores.detach() - 1).scatter(1, topi, topv.detach())
    order = prio.argsort(dim=0, descending=True, stable=True)
    if mode == "up": r = (f + tile - 1) // tile * tile
    elif mode == "down": r = f // tile * tile
    else:
        lo = f // tile * tile; r = torch.where(f - lo >= tile - (f - lo), lo + tile, lo)  # ties up (ours); sonic: half-even
    r = r.clamp(max=T)
    mask = torch.arange(T)[:, None] < r[None, :]
    tok = order[mask]; exp = torch.arange(E)[None, :].expand(T, E)[mask]
    return scores[tok, exp], tok, exp, p, f
def experts(x, w1, w2, g, tok, exp):
    out = torch.zeros_like(x)
    for e in range(w1.shape[0]):
        m = exp == e
        if m.any():
            h = x[tok[m]] @ w1[e].t(); n = h.shape[1] // 2
            a = F.silu(h[:, :n]) * h[:, n:]
            out.index_add_(0, tok[m], (a @ w2[e].t()) * g[m, None])
    return out
worst = 0.0
for (T, E, K, tile) in [(37, 8, 2, 4), (64, 16, 4, 8), (100, 8, 3, 16)]:
    for mode in ["nearest", "up", "down"]:
        d, n = 16, 8
        x = torch.randn(T, d, requires_grad=True); wr = (torch.randn(E, d) * 0.5).requires_grad_()
        w1 = torch.randn(E, 2 * n, d) * 0.3; w2 = torch.randn(E, d, n) * 0.3
        dO = torch.randn(T, d)
        g, tok, exp, p, f = sonic_tr(x, wr, K, tile, mode)
        ref = experts(x, w1, w2, g, tok, exp)
        dx_r, dwr_r = torch.autograd.grad(ref, [x, wr], dO)
        x2 = x.detach().clone().requires_grad_(); wr2 = wr.detach().clone().requires_grad_()
        out = leanmoe.moe(x2, wr2, w1, w2, K, router="softmax_then_topk", norm_topk_prob=True,
                          routing="token_rounding", tile=tile, rounding_mode=mode, return_stats=True)
        rows = torch.bincount(exp, minlength=E)
        assert torch.equal(out.stats.expert_rows.long(), rows), (mode, out.stats.expert_rows, rows)
        dx, dwr = torch.autograd.grad(out.output, [x2, wr2], dO)
        errs = [(out.output - ref).abs().max() / ref.abs().max(), (dx - dx_r).abs().max() / dx_r.abs().max(),
                (dwr - dwr_r).abs().max() / dwr_r.abs().max()]
        worst = max(worst, max(float(e.detach()) for e in errs))
        print(T, E, K, tile, mode, "dropped", int(out.stats.dropped_pairs), "added", int(out.stats.added_pairs),
              "rel err out/dx/dWr", ["%.1e" % float(e) for e in errs])
print("worst", worst)
