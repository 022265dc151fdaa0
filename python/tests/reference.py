"""A pure-torch MoE that follows docs/DESIGN.md literally (fp32 math, loops over experts), used as
the ground truth of the tests. Gradients come from torch autograd through it."""
import torch
import torch.nn.functional as F


def rounded_count(f, tile, mode, T):
    """docs/DESIGN.md: the targets are the multiples of tile below T and T itself."""
    below = f // tile * tile
    if below == f:
        return f
    above = min(below + tile, T)
    if mode == "up":
        return above
    if mode == "down":
        return below
    return above if above - f <= f - below else below  # nearest, a tie goes up


def routing(z, K, router="softmax_then_topk", norm_topk_prob=False, routing="topk", tile=128, rounding_mode="nearest"):
    """Returns (pairs, gates, p): pairs a list of (t, e), gates [len(pairs)] (differentiable), p = softmax(z)."""
    T, E = z.shape
    p = torch.softmax(z, dim=-1)
    topk = torch.topk(z.detach(), K, dim=-1).indices  # random data: no ties
    chosen = torch.zeros(T, E, dtype=torch.bool)
    chosen[torch.arange(T)[:, None], topk] = True
    sum_chosen = (p * chosen).sum(-1)
    renorm = router == "topk_then_softmax" or norm_topk_prob
    denom = sum_chosen if renorm else torch.ones_like(sum_chosen)
    keep = chosen.clone()
    if routing == "token_rounding":
        pd, sd = p.detach(), sum_chosen.detach()
        priority = torch.where(chosen, pd / sd[:, None], pd - 1)
        keep = torch.zeros_like(chosen)
        for e in range(E):
            r = rounded_count(int(chosen[:, e].sum()), tile, rounding_mode, T)
            # highest priority first, ties by lower token index (a stable sort)
            order = sorted(range(T), key=lambda t: (-priority[t, e].item(), t))
            keep[order[:r], e] = True
    pairs, gates = [], []
    for e in range(E):
        for t in range(T):
            if keep[t, e]:
                pairs.append((t, e))
                gates.append(p[t, e] / denom[t] if chosen[t, e] else p[t, e])
    return pairs, torch.stack(gates) if gates else z.new_zeros(0), p, chosen, keep


def moe_reference(x, router_weight, gate_up_proj, down_proj, K, **routing_kwargs):
    """fp32 reference of leanmoe.moe: returns (out, aux_loss, z_loss, keep [T, E] bool)."""
    xf, wr = x.float(), router_weight.float()
    w1, w2 = gate_up_proj.float(), down_proj.float()
    T, E = x.shape[0], wr.shape[0]
    n = w2.shape[2]
    z = xf @ wr.t()
    pairs, gates, p, chosen, keep = routing(z, K, **routing_kwargs)
    out = torch.zeros_like(xf)
    for e in range(E):
        idx = [i for i, (t, ee) in enumerate(pairs) if ee == e]
        if not idx:
            continue
        tokens = torch.tensor([pairs[i][0] for i in idx])
        h = xf[tokens] @ w1[e].t()
        a = F.silu(h[:, :n]) * h[:, n:]
        y = a @ w2[e].t()
        out = out.index_add(0, tokens, gates[idx][:, None] * y)
    f = chosen.float().sum(0) / (T * K)
    aux = E * (f * p.mean(0)).sum()
    zl = (torch.logsumexp(z, dim=-1) ** 2).mean()
    return out, aux, zl, keep
