"""The functional MoE layer: one call of ``leanmoe::moe_forward`` with autograd (``moe``: the fused
router), or of ``leanmoe::moe_routed_forward`` (``moe_routed``: routing given by the caller).

Two backward paths:
- standard: the operator's registered autograd returns dx, d_router, d_gate_up_proj, d_down_proj
  (traceable by torch.compile, checked by torch.library.opcheck);
- in-backward (eager only): when both expert weights belong to a ``leanmoe.optim.ExpertAdamW``
  with ``in_backward=True``, backward updates each expert weight inside the C++ backward, the
  moment its gradient is complete, and the expert gradients never reach ``.grad``.
"""
from typing import NamedTuple

import torch

from ._ops import ACTIVATIONS, GATED_ACTIVATIONS, _incoming_grads, ops

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


def moe_routed(x, topk_experts, topk_weights, gate_up_proj, down_proj, gate_up_bias=None, down_bias=None, *,
               activation="swiglu", act_alpha=1.702, act_limit=7.0, interleaved=False,
               transposed=False) -> torch.Tensor:
    """The experts under a routing computed by the caller's router (any: softmax or sigmoid, with
    a correction bias, group-limited, ...): out_t = sum_k topk_weights[t, k] * expert_{topk_experts[t, k]}(x_t).

    x [..., d]; topk_experts [..., K] integer (an id outside [0, E) is "no expert": that slot adds
    nothing and its weight gets gradient 0); topk_weights [..., K] (float32 or the dtype of x; its
    gradient dS flows back into the router). W = 2n for a gated activation, n for a plain one:
      gate_up_proj [E, W, d] ([E, d, W] when transposed), rows [gate; up] or interleaved [g0, u0, ...]
      down_proj    [E, d, n] ([E, n, d] when transposed)
      gate_up_bias [E, W], down_bias [E, d]: optional
    activation: one of leanmoe.functional.ACTIVATIONS (swiglu_clamped is gpt-oss's, with act_alpha
    and act_limit). Expert weights and x share one dtype (bfloat16 or float32) and device."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"leanmoe.moe_routed: argument 'activation': must be one of {ACTIVATIONS}, got {activation!r}")
    if interleaved and activation not in GATED_ACTIVATIONS:
        raise ValueError(f"leanmoe.moe_routed: argument 'interleaved': needs a gated activation, got {activation!r}")
    if topk_weights.shape != topk_experts.shape:
        raise ValueError(f"leanmoe.moe_routed: argument 'topk_weights': must have the shape of topk_experts "
                         f"{tuple(topk_experts.shape)}, got {tuple(topk_weights.shape)}")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    ids = topk_experts.reshape(-1, topk_experts.shape[-1]).to(torch.int32).contiguous()
    weights = topk_weights.reshape(ids.shape)
    if weights.dtype not in (torch.float32, x.dtype):
        weights = weights.float()
    weights = weights.contiguous()
    expert_fn = (activation, float(act_alpha), float(act_limit), bool(interleaved), bool(transposed))
    from .optim import _in_backward_optimizer  # late import: optim imports this module

    optimizer = None if torch.compiler.is_compiling() else _in_backward_optimizer(gate_up_proj, down_proj)
    if optimizer is not None and torch.is_grad_enabled():
        optimizer._check_not_updated(gate_up_proj, down_proj, "forward")
        out = _InBackwardRoutedMoE.apply(x2, ids, weights, gate_up_proj, down_proj, gate_up_bias, down_bias,
                                         expert_fn, optimizer)
    else:
        out = ops.moe_routed_forward(x2, ids, weights, gate_up_proj, down_proj, gate_up_bias, down_bias,
                                     *expert_fn)[0]
    return out.view(shape)


class _InBackwardRoutedMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ids, weights, gate_up_proj, down_proj, gate_up_bias, down_bias, expert_fn, optimizer):
        out, *saved = ops.moe_routed_forward(x, ids, weights, gate_up_proj, down_proj, gate_up_bias, down_bias,
                                             *expert_fn)
        ctx.save_for_backward(x, gate_up_bias, down_bias, *saved)
        ctx.experts = (gate_up_proj, down_proj)
        ctx.expert_fn, ctx.optimizer, ctx.weights_dtype = expert_fn, optimizer, weights.dtype
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, d_out):
        x, gate_up_bias, down_bias, *saved = ctx.saved_tensors
        gate_up_proj, down_proj = ctx.experts
        d_out = torch.zeros_like(x) if d_out is None else d_out.to(x.dtype)
        dx, d_weights, d_b1, d_b2 = ctx.optimizer._backward_routed_with_update(
            d_out, x, gate_up_proj, down_proj, gate_up_bias, down_bias, saved, ctx.expert_fn, ctx.weights_dtype)
        # The expert weights were updated in place: no gradient reaches their .grad. The biases'
        # gradients go the standard way (the optimizer steps them in step()).
        return (dx, None, d_weights, None, None, d_b1 if gate_up_bias is not None else None,
                d_b2 if down_bias is not None else None, None, None)
