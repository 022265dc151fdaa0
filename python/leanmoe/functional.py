"""The functional MoE layer: one call of ``leanmoe::moe_forward`` with autograd.

Two backward paths:
- standard: the operator's registered autograd returns dx, d_router, d_gate_up_proj, d_down_proj
  (traceable by torch.compile, checked by torch.library.opcheck);
- in-backward (eager only): when both expert weights belong to a ``leanmoe.optim.ExpertAdamW``
  with ``in_backward=True``, backward updates each expert weight inside the C++ backward, the
  moment its gradient is complete, and the expert gradients never reach ``.grad``.
"""
from typing import NamedTuple

import torch

from ._ops import _incoming_grads, ops

ROUTERS = ("softmax_then_topk", "topk_then_softmax")
ROUTINGS = ("topk", "token_rounding")
ROUNDING_MODES = ("nearest", "up", "down")


def routing_for_call(routing, inference_routing, training) -> str:
    """The routing of one call. Token rounding is a training-time routing (SPEC §5): a module in
    eval mode, or a call under torch.no_grad() / torch.inference_mode(), routes with
    ``inference_routing`` (plain top-K unless asked otherwise); a training forward with autograd
    on routes with ``routing``."""
    if inference_routing not in ROUTINGS:
        raise ValueError(f"leanmoe: argument 'inference_routing': must be one of {ROUTINGS}, got {inference_routing!r}")
    return routing if training and torch.is_grad_enabled() else inference_routing


class MoEOutput(NamedTuple):
    output: torch.Tensor  # [..., d], the dtype of x
    aux_loss: torch.Tensor  # fp32 scalar: E * sum_e f_e * P_e (unscaled)
    z_loss: torch.Tensor  # fp32 scalar: mean_t logsumexp(z_t)^2 (unscaled)


def moe(x, router_weight, gate_up_proj, down_proj, top_k, *, router="softmax_then_topk", norm_topk_prob=False,
        routing="topk", tile=128, rounding_mode="nearest") -> MoEOutput:
    """x [..., d]; router_weight [E, d]; gate_up_proj [E, 2n, d]; down_proj [E, d, n] (HF v5 layout).
    All of one dtype (bfloat16 or float32) and device."""
    if router not in ROUTERS:
        raise ValueError(f"leanmoe.moe: argument 'router': must be one of {ROUTERS}, got {router!r}")
    if routing not in ROUTINGS:
        raise ValueError(f"leanmoe.moe: argument 'routing': must be one of {ROUTINGS}, got {routing!r}")
    if rounding_mode not in ROUNDING_MODES:
        raise ValueError(f"leanmoe.moe: argument 'rounding_mode': must be one of {ROUNDING_MODES}, got {rounding_mode!r}")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    config = (int(top_k), router, bool(norm_topk_prob), routing, int(tile), rounding_mode)
    from .optim import _in_backward_optimizer  # late import: optim imports this module

    # Traced by torch.compile: always the standard path (the expert gradients then reach .grad and
    # ExpertAdamW.step() applies them; same update, after backward).
    optimizer = None if torch.compiler.is_compiling() else _in_backward_optimizer(gate_up_proj, down_proj)
    if optimizer is not None and torch.is_grad_enabled():
        optimizer._check_not_updated(gate_up_proj, down_proj, "forward")
        out, losses = _InBackwardMoE.apply(x2, router_weight, gate_up_proj, down_proj, config, optimizer)
    else:
        out, losses, *_ = ops.moe_forward(x2, router_weight, gate_up_proj, down_proj, *config)
    return MoEOutput(out.view(shape), losses[0], losses[1])


class _InBackwardMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, router_weight, gate_up_proj, down_proj, config, optimizer):
        out, losses, *saved = ops.moe_forward(x, router_weight, gate_up_proj, down_proj, *config)
        ctx.save_for_backward(x, router_weight, *saved)
        # The parameters themselves (not saved-tensor copies): the optimizer finds its state by identity.
        ctx.experts = (gate_up_proj, down_proj)
        ctx.config, ctx.optimizer = config, optimizer
        ctx.set_materialize_grads(False)
        return out, losses

    @staticmethod
    def backward(ctx, d_out, d_losses):
        x, router_weight, *saved = ctx.saved_tensors
        gate_up_proj, down_proj = ctx.experts
        d_out, d_losses = _incoming_grads(x, d_out, d_losses)
        dx, d_router = ctx.optimizer._backward_with_update(d_out, d_losses, x, router_weight, gate_up_proj,
                                                           down_proj, saved, ctx.config)
        # The expert weights were updated in place: no gradient reaches .grad.
        return dx, d_router, None, None, None, None
