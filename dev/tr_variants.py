"""Token-rounding gate variants, trained with examples/train_lm.py at any preset: the routing is
computed here in torch and the experts run through leanmoe.moe_routed (the router gradient comes
from autograd through the gates), so a variant needs no kernel change until it wins.

Variants (nearest rounding, SonicMoE's ranking, docs/DESIGN.md "Routing"):
  tr-sonic       the library's rule (kept chosen: p / D_t over the original top-K; added: p); its
                 loss differs from the built-in tr-nearest run's by floating-point order alone, a
                 noise floor for the others
  tr-renorm      kept chosen gates renormalised over the token's kept top-K experts (a token that lost
                 one routes like top-(K-1)); added: p
  tr-addscaled   kept chosen as the library; added: p / D_t (the scale of a chosen gate)

    OMP_NUM_THREADS=1 PYTHONPATH=<front> python3 dev/tr_variants.py --runs topk,tr-nearest,tr-sonic,tr-renorm \\
        --out /tmp/v                                     # any train_lm flags
"""
import importlib.util
import os
import sys

import torch
import torch.nn.functional as F

import leanmoe

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path.insert(0, EXAMPLES)  # train_lm imports train_common from beside it
spec = importlib.util.spec_from_file_location("train_lm", os.path.join(EXAMPLES, "train_lm.py"))
train_lm = importlib.util.module_from_spec(spec)
sys.modules["train_lm"] = train_lm
spec.loader.exec_module(train_lm)

VARIANTS = {"tr-sonic": "token rounding, nearest, in torch (library rule)",
            "tr-renorm": "token rounding, nearest, kept gates renormalised",
            "tr-addscaled": "token rounding, nearest, added gate p / D"}
for name, label in VARIANTS.items():
    train_lm.RUNS[name] = train_lm.Run(name, label, "token_rounding", "nearest")


def rounded(f, tile, T):
    below = f // tile * tile
    above = torch.clamp(below + tile, max=T)
    return torch.where(f == below, f, torch.where(above - f <= f - below, above, below))


def routed_moe(moe, x, variant):
    """leanmoe.MoE's forward under token rounding with `variant`'s gates; returns (out, aux, z)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    T, E, K = x2.shape[0], moe.E, moe.K
    z = x2.float() @ moe.router.weight.float().t()
    p = torch.softmax(z, dim=-1)
    topi = torch.topk(z.detach(), K, dim=-1).indices
    chosen = torch.zeros(T, E, dtype=torch.bool, device=x.device)
    chosen[torch.arange(T, device=x.device)[:, None], topi] = True
    f = chosen.sum(0)
    D = (p * chosen).sum(-1, keepdim=True)
    prio = torch.where(chosen, p.detach() / D.detach(), p.detach() - 1)
    order = prio.argsort(dim=0, descending=True, stable=True)  # [T, E]: tokens of each expert, best first
    keep_sorted = torch.arange(T, device=x.device)[:, None] < rounded(f, moe.tile, T)[None, :]
    keep = torch.zeros_like(chosen)
    keep.scatter_(0, order, keep_sorted)
    kept_chosen = keep & chosen
    if variant == "tr-renorm":
        Dk = (p * kept_chosen).sum(-1, keepdim=True).clamp_min(1e-30)
        gates = torch.where(chosen, p / Dk, p)
    elif variant == "tr-addscaled":
        gates = p / D
    else:
        gates = torch.where(chosen, p / D, p)
    counts = keep.sum(-1)
    Kmax = max(int(counts.max()), 1)
    slot_experts = torch.where(keep, torch.arange(E, device=x.device)[None, :], E)  # E = no expert
    slot_experts, idx = slot_experts.sort(dim=-1)
    ids, w = slot_experts[:, :Kmax], gates.gather(1, idx)[:, :Kmax]
    out = leanmoe.moe_routed(x2, ids.to(torch.int32), w * (ids < E), moe.gate_up_proj, moe.down_proj)
    aux = E * ((f.float() / (T * K)) * p.mean(0)).sum()
    zl = (torch.logsumexp(z, dim=-1) ** 2).mean()
    return out.view(shape), aux, zl


_init = train_lm.Block.__init__


def block_init(self, cfg, run, factory):
    _init(self, cfg, run, factory)
    self.variant = run.name if run.name in VARIANTS else None


def block_forward(self, x, rotary):
    x = x + self.attn(self.attn_norm(x), rotary)
    if self.variant is None or not (self.training and torch.is_grad_enabled()):
        out = self.moe(self.moe_norm(x))
        self.stats = out.stats if self.moe.return_stats else None
        return x + out.output, out.aux_loss, out.z_loss
    o, aux, zl = routed_moe(self.moe, self.moe_norm(x), self.variant)
    self.stats = None
    return x + o, aux, zl


train_lm.Block.__init__, train_lm.Block.forward = block_init, block_forward
_step = train_lm.Trainer.step


def trainer_step(self, x, y, routing_stats=False):  # no RouterStats from the torch routing
    return _step(self, x, y, routing_stats and self.run.name not in VARIANTS)


train_lm.Trainer.step = trainer_step

if __name__ == "__main__":
    sys.exit(train_lm.main())
