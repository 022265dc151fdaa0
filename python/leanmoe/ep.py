"""Expert parallelism under torch.distributed (CPU tensors, gloo; docs/ep.md).

    dist.init_process_group("gloo", ...)
    moe = leanmoe.ep.ExpertParallelMoE(d, n, E, K)      # this rank: experts [r*E/P, (r+1)*E/P)
    out = moe(x_r)                                     # x_r: this rank's tokens [..., d]
    out.sum().backward()
    norm = leanmoe.ep.clip_grad_norm_(moe.parameters(), max_norm=1.0, group=moe.group)

Every rank holds the whole router (replicated) and its E/P slice of the expert weights (HF
layout). Forward and backward run the C++ ep::ExpertParallelLayer over the group's ProcessGroup:
token rows travel to the ranks owning their experts and back (all_to_all_single, waited on).
Gradients are those of the sum over ranks of each rank's loss: dx of this rank's tokens, the
expert slices' gradients from every rank's tokens, and the router gradient all-reduced (summed)
in backward, so it is identical on every rank (do not all-reduce it again, e.g. exclude it from
DDP). Only top-K routing; the aux and z losses are not computed (their batch statistics would
need cross-rank reductions).
"""
import math

import torch
import torch.distributed as dist
from torch import nn

from . import _ops  # noqa: F401  (loads the operators and torch.classes.leanmoe)
from ._ops import _once_differentiable
from .functional import _autocast, _check_fp8_widths, _check_precision


def _group_name(group):
    group = dist.group.WORLD if group is None else group
    return group, group.group_name


class _ExpertParallelFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, router_weight, gate_up_proj, down_proj, group, config):
        group, name = _group_name(group)
        layer = torch.classes.leanmoe.EPLayer(name, *config)
        out = layer.forward(x, router_weight, gate_up_proj, down_proj)
        ctx.layer, ctx.group = layer, group
        ctx.save_for_backward(router_weight, gate_up_proj, down_proj)
        return out

    @staticmethod
    def backward(ctx, d_out):
        router_weight, gate_up_proj, down_proj = ctx.saved_tensors
        dx, d_router, d_gate_up, d_down = ctx.layer.backward(d_out, router_weight, gate_up_proj, down_proj)
        ctx.layer = None
        dist.all_reduce(d_router, op=dist.ReduceOp.SUM, group=ctx.group)  # the router is replicated
        # No second derivative, said as leanmoe.moe says it (torch's own error named no layer).
        return _once_differentiable((dx, d_router, d_gate_up, d_down), ctx.needs_input_grad[:4]) + (None, None)


def expert_parallel_moe(x, router_weight, gate_up_proj, down_proj, top_k, *, router="softmax_then_topk",
                        norm_topk_prob=False, group=None, precision="storage"):
    """x [..., d] (this rank's tokens); router_weight [E, d] (replicated); gate_up_proj [E/P, 2n, d] and
    down_proj [E/P, d, n]: this rank's experts. Returns the output [..., d]. Every rank of `group`
    must call it (collective). precision="fp8" runs the expert GEMMs as leanmoe.MoE(precision="fp8")
    does (bfloat16 tensors, d and n multiples of 128); each call quantizes the weights itself. Under
    torch.autocast x and the weights are cast as in leanmoe.moe."""
    x, (router_weight, gate_up_proj, down_proj) = _autocast("leanmoe.ep", x, (router_weight, gate_up_proj, down_proj))
    group, _ = _group_name(group)
    E, d = router_weight.shape
    n = gate_up_proj.shape[1] // 2
    P = dist.get_world_size(group)
    if E % P != 0 or gate_up_proj.shape[0] != E // P:
        raise ValueError(f"leanmoe.ep: argument 'gate_up_proj': must hold E/P = {E}/{P} experts (E a multiple of "
                         f"the ranks), got {tuple(gate_up_proj.shape)}")
    shape = x.shape
    config = (E, n, d, int(top_k), router, bool(norm_topk_prob), precision)
    out = _ExpertParallelFunction.apply(x.reshape(-1, d), router_weight, gate_up_proj, down_proj, group, config)
    return out.view(shape)


class ExpertParallelMoE(nn.Module):
    """The MoE layer of leanmoe.MoE split over the ranks of a torch.distributed group.

    Parameters (HF names and layout; the expert ones hold this rank's slice):
      router.weight  [E, d]          replicated: same values on every rank (init from one seed)
      gate_up_proj   [E/P, 2n, d]    global experts first_expert .. first_expert + E/P - 1
      down_proj      [E/P, d, n]
    forward(x [..., d]) -> output [..., d]. precision: "storage" or "fp8" (as leanmoe.MoE; fp8 needs
    dtype=torch.bfloat16 and d, n multiples of 128).
    """

    def __init__(self, d, n, E, K, group=None, router="softmax_then_topk", *, norm_topk_prob=False, device=None,
                 dtype=None, precision="storage"):
        super().__init__()
        _check_precision("leanmoe.ep.ExpertParallelMoE", precision)
        _check_fp8_widths("leanmoe.ep.ExpertParallelMoE", precision, d, n)
        if not dist.is_initialized():
            raise RuntimeError("leanmoe.ep.ExpertParallelMoE: torch.distributed is not initialised "
                               "(call dist.init_process_group first)")
        if not 0 < K <= E:
            raise ValueError(f"leanmoe.ep.ExpertParallelMoE: argument 'K': must be in 1..E = {E}, got {K}")
        self.group, _ = _group_name(group)
        P, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if E % P != 0:
            raise ValueError(f"leanmoe.ep.ExpertParallelMoE: argument 'E': must be a multiple of the ranks ({P}), "
                             f"got {E}")
        self.d, self.n, self.E, self.K = d, n, E, K
        self.local_experts, self.first_expert = E // P, rank * (E // P)
        self.router_convention, self.norm_topk_prob, self.precision = router, norm_topk_prob, precision
        factory = dict(device=device, dtype=dtype)
        self.router = nn.Linear(d, E, bias=False, **factory)
        self.gate_up_proj = nn.Parameter(torch.empty(E // P, 2 * n, d, **factory))
        self.down_proj = nn.Parameter(torch.empty(E // P, d, n, **factory))
        self.reset_parameters()

    def reset_parameters(self):
        # As leanmoe.MoE: N(0, 1/fan_in). The router must be equal on every rank: broadcast rank 0's.
        with torch.no_grad():
            self.router.weight.normal_(0.0, 1.0 / math.sqrt(self.d))
            self.gate_up_proj.normal_(0.0, 1.0 / math.sqrt(self.d))
            self.down_proj.normal_(0.0, 1.0 / math.sqrt(self.n))
            dist.broadcast(self.router.weight, src=dist.get_global_rank(self.group, 0), group=self.group)

    @torch.no_grad()
    def load_global_weights(self, router_weight, gate_up_proj, down_proj):
        """Copies the whole layer's weights ([E, d], [E, 2n, d], [E, d, n]) and keeps this rank's slice."""
        s = slice(self.first_expert, self.first_expert + self.local_experts)
        self.router.weight.copy_(router_weight)
        self.gate_up_proj.copy_(gate_up_proj[s])
        self.down_proj.copy_(down_proj[s])

    def forward(self, x):
        return expert_parallel_moe(x, self.router.weight, self.gate_up_proj, self.down_proj, self.K,
                                   router=self.router_convention, norm_topk_prob=self.norm_topk_prob,
                                   group=self.group, precision=self.precision)


def global_grad_norm(expert_parameters, replicated_parameters=(), group=None):
    """L2 norm over the whole model of the gradients: expert slices summed over ranks (each rank
    owns different experts), replicated parameters (router, dense layers: same gradient on every
    rank after their all-reduce) counted once. Every rank gets the same fp32 value."""
    group, _ = _group_name(group)
    grads = [p.grad for p in expert_parameters if p.grad is not None]
    local = sum((g.detach().float().pow(2).sum() for g in grads), torch.zeros((), dtype=torch.float32))
    if dist.get_rank(group) == 0:  # a replicated gradient is counted on one rank only
        for p in replicated_parameters:
            if p.grad is not None:
                local = local + p.grad.detach().float().pow(2).sum()
    dist.all_reduce(local, op=dist.ReduceOp.SUM, group=group)
    return local.sqrt()


def clip_grad_norm_(module, max_norm, group=None):
    """torch.nn.utils.clip_grad_norm_ for an expert-parallel model: the norm is global_grad_norm
    (ExpertParallelMoE's gate_up_proj/down_proj are the expert parameters, all others replicated);
    every gradient is scaled by min(1, max_norm / (norm + 1e-6)), the same factor on every rank."""
    experts = [p for m in module.modules() if isinstance(m, ExpertParallelMoE) for p in (m.gate_up_proj, m.down_proj)]
    expert_ids = {id(p) for p in experts}
    replicated = [p for p in module.parameters() if id(p) not in expert_ids]
    norm = global_grad_norm(experts, replicated, group)
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in module.parameters():
        if p.grad is not None:
            p.grad.mul_(scale.to(p.grad.dtype))
    return norm
