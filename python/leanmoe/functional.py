"""The functional MoE layer: one call of ``leanmoe::moe_forward`` with autograd (``moe``: the fused
router), or of ``leanmoe::moe_routed_forward`` (``moe_routed``: routing given by the caller).

Two backward paths:
- standard: the operator's registered autograd returns dx, d_router, d_gate_up_proj, d_down_proj
  (traceable by torch.compile, checked by torch.library.opcheck);
- in-backward (eager only): when both expert weights belong to a ``leanmoe.optim.ExpertAdamW``
  with ``in_backward=True`` and require grad (a frozen one is never updated), backward updates each
  expert weight inside the C++ backward, the moment its gradient is complete, and the expert
  gradients never reach ``.grad``. A backward that accumulates no gradient into them
  (``torch.autograd.grad(loss, x)``, ``backward(inputs=[x])``) runs the standard one instead, and
  so does a call whose expert weights have a gradient hook (it needs the gradient) or are
  synchronised by torch's DistributedDataParallel (their gradients must be averaged across ranks
  before any update); a warning says so once.
Neither has a second derivative: a gradient taken with ``create_graph=True`` raises when it is
differentiated again (``_once_differentiable``).

Under ``torch.autocast`` the layer follows autocast as ``F.linear`` does: x and the weights are cast
to the autocast dtype (bfloat16; float32 is a no-op) for the call, the output has that dtype.
"""
import warnings
import weakref
from typing import NamedTuple, Optional, Tuple

import torch

from ._ops import ACTIVATIONS, FP8_BLOCK, GATED_ACTIVATIONS, PRECISIONS, _incoming_grads, _once_differentiable, ops

ROUTERS = ("softmax_then_topk", "topk_then_softmax")
ROUTINGS = ("topk", "token_rounding")
ROUNDING_MODES = ("nearest", "up", "down")


def routing_for_call(routing, inference_routing, training) -> str:
    """The routing of one call. Token rounding is a training-time routing (docs/SPEC.md §5): a module in
    eval mode, or a call under torch.no_grad() / torch.inference_mode(), routes with
    ``inference_routing`` (plain top-K unless asked otherwise); a training forward with autograd
    on routes with ``routing``."""
    if inference_routing not in ROUTINGS:
        raise ValueError(f"leanmoe: argument 'inference_routing': must be one of {ROUTINGS}, got {inference_routing!r}")
    return routing if training and torch.is_grad_enabled() else inference_routing


STORAGE_DTYPES = (torch.bfloat16, torch.float32)
_WHY_NOT_F64 = ("float64 is not offered: every backend computes in fp32 (python/README.md, 'Gradient checks', "
                "says how to check gradients)")


class MoEOutput(NamedTuple):
    output: torch.Tensor  # [..., d], the dtype of x
    aux_loss: torch.Tensor  # fp32 scalar: E * sum_e f_e * P_e (unscaled); 0 for T = 0
    z_loss: torch.Tensor  # fp32 scalar: mean_t logsumexp(z_t)^2 (unscaled); 0 for T = 0


class RouterStats(NamedTuple):
    """What routing did in one call, as device tensors (computing them never synchronises with the
    host; .item() or .tolist() on them does). f_e = the plain top-K count, r_e = the rows routed."""
    tokens: int  # T
    expert_rows: torch.Tensor  # [E] int32: r_e, rows each expert computed (token rounding included)
    topk_counts: torch.Tensor  # [E] int32: f_e, tokens whose top-K chose the expert
    dropped_pairs: torch.Tensor  # int32 scalar: top-K pairs token rounding dropped, sum_e max(f_e - r_e, 0)
    added_pairs: torch.Tensor  # int32 scalar: pairs token rounding added, sum_e max(r_e - f_e, 0)
    tokens_without_expert: torch.Tensor  # int32 scalar: tokens routed to no expert (their output is 0)


class MoEOutputWithStats(NamedTuple):
    output: torch.Tensor
    aux_loss: torch.Tensor
    z_loss: torch.Tensor
    stats: RouterStats


def router_stats(T, expert_offsets, token_offsets, topk_experts) -> RouterStats:
    """RouterStats from the routing arrays of ``leanmoe::moe_forward`` (a few [E]-sized device ops).
    Token rounding keeps each expert's highest-priority tokens and every chosen pair outranks every
    unchosen one, so an expert either only drops (r_e < f_e) or only adds (r_e > f_e) pairs."""
    E = expert_offsets.shape[0] - 1
    rows = expert_offsets[1:] - expert_offsets[:-1]
    topk = torch.zeros(E, dtype=torch.int32, device=rows.device)
    topk.scatter_add_(0, topk_experts.reshape(-1).long(), torch.ones_like(topk_experts.reshape(-1)))
    moved = rows - topk
    empty = (token_offsets[1:] == token_offsets[:-1]).sum(dtype=torch.int32)
    return RouterStats(T, rows, topk, (-moved).clamp_min(0).sum(dtype=torch.int32),
                       moved.clamp_min(0).sum(dtype=torch.int32), empty)


def _check_tensors(fn, x, router_weight, gate_up_proj, down_proj, top_k):
    """The argument rules a Python caller can break before the operator runs, named like the C++ API's."""
    for name, t in (("x", x), ("router_weight", router_weight), ("gate_up_proj", gate_up_proj),
                    ("down_proj", down_proj)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: argument '{name}': must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in STORAGE_DTYPES:
            why = f" ({_WHY_NOT_F64})" if t.dtype == torch.float64 else ""
            raise ValueError(f"{fn}: argument '{name}': dtype must be torch.bfloat16 or torch.float32{why}, "
                             f"got {t.dtype}")
    if gate_up_proj.dim() != 3:
        raise ValueError(f"{fn}: argument 'gate_up_proj': must be 3-D [E, 2n, d], got shape "
                         f"{tuple(gate_up_proj.shape)}")
    E = gate_up_proj.shape[0]
    if isinstance(top_k, bool) or not isinstance(top_k, (int, torch.SymInt)) or not 1 <= top_k <= E:
        raise ValueError(f"{fn}: argument 'top_k': must be an int in 1..E = {E}, got {top_k!r}")


def _autocast(fn, x, weights):
    """Follows torch.autocast as F.linear does: floating operands other than float64 are cast to the
    autocast dtype (None stays None)."""
    device_type = x.device.type if isinstance(x, torch.Tensor) else "cpu"
    if not torch.is_autocast_enabled(device_type):
        return x, weights
    dtype = torch.get_autocast_dtype(device_type)
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"{fn}: torch.autocast dtype must be torch.bfloat16 (leanmoe stores bfloat16 or "
                         f"float32), got {dtype}: use torch.autocast('{device_type}', dtype=torch.bfloat16)")

    def cast(t):
        eligible = isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
        return t.to(dtype) if eligible else t

    return cast(x), tuple(cast(w) for w in weights)


def _check_precision(fn, precision):
    if precision not in PRECISIONS:
        raise ValueError(f"{fn}: argument 'precision': must be one of {PRECISIONS}, got {precision!r}")


def _fp8_width_unmet(d, n):
    """("d", d) or ("n", n), the first width precision="fp8" cannot run (not a multiple of its 128-wide
    scale tiles), or None."""
    return next(((name, value) for name, value in (("d", d), ("n", n)) if value % FP8_BLOCK), None)


def _check_fp8_widths(fn, precision, d, n):
    """A layer's widths are fixed at construction (its dtype is not: autocast, .to()): one that
    precision="fp8" could never run is refused there."""
    unmet = _fp8_width_unmet(d, n) if precision == "fp8" else None
    if unmet:
        raise ValueError(f"{fn}: argument '{unmet[0]}': must be a multiple of {FP8_BLOCK} with precision='fp8' "
                         f"(1x128 scale tiles, 128x128 weight blocks), got {unmet[1]}")


def _check_fp8_dtypes(fn, precision, named):
    """precision="fp8" quantizes bf16 values: the first tensor of another dtype is named (the C++ rule
    names the storage dtype, x's, which misleads when fp32 activations meet a bf16 layer)."""
    for name, t in named if precision == "fp8" else ():
        if isinstance(t, torch.Tensor) and t.dtype != torch.bfloat16:
            raise ValueError(f"{fn}: argument '{name}': precision='fp8' needs bfloat16 tensors (operands are "
                             f"quantized from bf16 values; torch.autocast to bfloat16 casts fp32 ones), got {t.dtype}")


def moe(x, router_weight, gate_up_proj, down_proj, top_k, *, router="softmax_then_topk", norm_topk_prob=False,
        routing="topk", tile=128, rounding_mode="nearest", return_stats=False, precision="storage",
        _fp8_weights=None):
    """x [..., d]; router_weight [E, d]; gate_up_proj [E, 2n, d]; down_proj [E, d, n] (HF v5 layout).
    All of one dtype (bfloat16 or float32) and device; x may have no tokens (then the output is empty,
    the losses 0 and the weight gradients 0). Returns MoEOutput, or MoEOutputWithStats with
    ``return_stats=True`` (RouterStats: device tensors, no host synchronisation).
    precision="fp8": the up, down, dH and dX expert GEMMs on e4m3 operands with block scales
    (bfloat16 tensors, d and n multiples of 128; the weights quantized per call; docs/DESIGN.md "FP8").
    _fp8_weights (leanmoe.MoE's, python/leanmoe/_fp8_codes.py): the weights' FP8 codes, which the
    caller keeps current; then no weight is quantized (the in-backward update rewrites them)."""
    if router not in ROUTERS:
        raise ValueError(f"leanmoe.moe: argument 'router': must be one of {ROUTERS}, got {router!r}")
    if routing not in ROUTINGS:
        raise ValueError(f"leanmoe.moe: argument 'routing': must be one of {ROUTINGS}, got {routing!r}")
    if rounding_mode not in ROUNDING_MODES:
        raise ValueError(f"leanmoe.moe: argument 'rounding_mode': must be one of {ROUNDING_MODES}, got {rounding_mode!r}")
    if isinstance(tile, bool) or not isinstance(tile, (int, torch.SymInt)) or tile <= 0:
        raise ValueError(f"leanmoe.moe: argument 'tile': must be an int > 0, got {tile!r}")
    _check_precision("leanmoe.moe", precision)
    params = (gate_up_proj, down_proj)
    x, (router_weight, gate_up_proj, down_proj) = _autocast("leanmoe.moe", x,
                                                            (router_weight, gate_up_proj, down_proj))
    _check_tensors("leanmoe.moe", x, router_weight, gate_up_proj, down_proj, top_k)
    _check_fp8_dtypes("leanmoe.moe", precision, (("x", x), ("router_weight", router_weight),
                                                  ("gate_up_proj", gate_up_proj), ("down_proj", down_proj)))
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    config = (int(top_k), router, bool(norm_topk_prob), routing, int(tile), rounding_mode, precision)
    # Codes of the parameters, not of autocast's copies.
    fp8_weights = _fp8_weights if gate_up_proj is params[0] and down_proj is params[1] else None
    optimizer = _in_backward_optimizer_of_call(params, (gate_up_proj, down_proj))
    if optimizer is not None:
        out, losses, *routing_arrays = _InBackwardMoE.apply(x2, router_weight, gate_up_proj, down_proj, config,
                                                            optimizer, fp8_weights)
    else:
        out, losses, _, _, _, _, token_offsets, expert_offsets, topk_experts = ops.moe_forward(
            x2, router_weight, gate_up_proj, down_proj, *config, fp8_weights)
        routing_arrays = (expert_offsets, token_offsets, topk_experts)
    if return_stats:
        return MoEOutputWithStats(out.view(shape), losses[0], losses[1], router_stats(x2.shape[0], *routing_arrays))
    return MoEOutput(out.view(shape), losses[0], losses[1])


def _in_backward_optimizer_of_call(params, used):
    """The in-backward ExpertAdamW that updates `params` (gate_up_proj, down_proj) inside this call's
    backward, or None for the standard path. `used`: the tensors the call runs on (autocast's copies
    when it cast them). Traced by torch.compile: always the standard path (the expert gradients then
    reach .grad and ExpertAdamW.step() applies them; same update, after backward)."""
    from .optim import _in_backward_optimizer  # late import: optim imports this module

    # A frozen expert weight (requires_grad=False) gets no gradient, so no update: the backward's
    # fused update steps both weights, so a call with one frozen runs the standard path (whatever
    # optimizer holds the other one).
    if torch.compiler.is_compiling() or not torch.is_grad_enabled() or not all(p.requires_grad for p in params):
        return None
    optimizer = _in_backward_optimizer(*params)
    if optimizer is None:
        return None
    if used[0] is not params[0]:
        _warn_once("leanmoe: torch.autocast casts the expert weights to another dtype for the layer, so their "
                   "in-backward updates cannot run in place: their gradients go to .grad and ExpertAdamW.step() "
                   "applies them (the standard path, same update). For in-backward updates keep the expert "
                   "weights in the autocast dtype (bfloat16, with ExpertAdamW(..., master_weights=True)).")
        return None
    if any(getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None) for p in params):
        _warn_once("leanmoe: an expert weight has a gradient hook (register_hook or "
                   "register_post_accumulate_grad_hook), which needs its gradient: the layer's gradients go to "
                   ".grad and ExpertAdamW.step() applies them (the standard path, same update).")
        return None
    if _synced_by_ddp(params):
        _warn_once("leanmoe: the expert weights are synchronised by torch DistributedDataParallel, which averages "
                   "their gradients across ranks after backward: an in-backward update would step each rank with "
                   "its own gradient and the ranks would diverge. Their gradients go to .grad (averaged) and "
                   "ExpertAdamW.step() applies them (the standard path, same update).")
        return None
    optimizer._check_not_updated(*params, "forward")
    optimizer._check_no_stale_grad(*params)
    return optimizer


_warned = set()


def _warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=4)  # the caller of moe() / moe_routed()


_DDP_SYNCED = weakref.WeakKeyDictionary()  # DistributedDataParallel -> ids of the parameters it all-reduces


def _synced_by_ddp(params):
    """Whether this call runs inside the forward of a DistributedDataParallel that all-reduces the
    gradient of one of `params` (one of its module's, not in _ddp_params_and_buffers_to_ignore)."""
    ddp = torch.nn.parallel.DistributedDataParallel._active_ddp_module if torch.distributed.is_available() else None
    if ddp is None:
        return False
    if ddp not in _DDP_SYNCED:  # once per DDP (its parameters are fixed at construction): not per call
        _DDP_SYNCED[ddp] = frozenset(id(p) for name, p in ddp.module.named_parameters()
                                     if name not in ddp.parameters_to_ignore)
    return any(id(p) in _DDP_SYNCED[ddp] for p in params)


def _updates_asked_for(experts):
    """Whether this backward accumulates into both expert weights (backward() of a loss, or inputs
    naming them). torch.autograd.grad(loss, x) or backward(inputs=[x]) (a gradient penalty, a saliency
    map) asks for none: an update there would be an optimizer step nobody called."""
    def accumulated(p):
        try:
            return torch._C._will_engine_execute_node(torch.autograd.graph.get_gradient_edge(p).node)
        except RuntimeError:  # torch refuses the query for a leaf autograd.grad returns: not accumulated
            return False
    return all(accumulated(p) for p in experts)


def _check_experts_unmodified(ctx):
    """The in-backward path keeps the expert weights outside the saved tensors (the optimizer finds
    them by identity), so it repeats autograd's check that they were not modified in place since
    the forward (the standard path gets it from save_for_backward), before anything is updated."""
    for name, p, version in zip(("gate_up_proj", "down_proj"), ctx.experts, ctx.versions):
        if p._version != version:
            raise RuntimeError(f"leanmoe: one of the variables needed for gradient computation has been modified by an "
                               f"inplace operation: the expert weight '{name}' {tuple(p.shape)} is at version "
                               f"{p._version}; expected version {version} (its value at the forward)")


class _InBackwardMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, router_weight, gate_up_proj, down_proj, config, optimizer, fp8_weights):
        out, losses, *saved = ops.moe_forward(x, router_weight, gate_up_proj, down_proj, *config, fp8_weights)
        ctx.save_for_backward(x, router_weight, *saved)
        # The parameters themselves (not saved-tensor copies): the optimizer finds its state by identity.
        ctx.experts = (gate_up_proj, down_proj)
        ctx.versions = (gate_up_proj._version, down_proj._version)
        ctx.config, ctx.optimizer, ctx.fp8_weights = config, optimizer, fp8_weights
        ctx.set_materialize_grads(False)
        token_offsets, expert_offsets, topk_experts = saved[4], saved[5], saved[6]
        ctx.mark_non_differentiable(expert_offsets, token_offsets, topk_experts)
        return out, losses, expert_offsets, token_offsets, topk_experts

    @staticmethod
    def backward(ctx, d_out, d_losses, *unused):
        x, router_weight, *saved = ctx.saved_tensors
        _check_experts_unmodified(ctx)
        gate_up_proj, down_proj = ctx.experts
        d_out, d_losses = _incoming_grads(x, d_out, d_losses)
        if not _updates_asked_for(ctx.experts):  # the standard backward, every gradient returned
            with torch.no_grad():
                grads = ops.moe_backward(d_out, d_losses, x, router_weight, gate_up_proj, down_proj, *saved,
                                         *ctx.config, ctx.fp8_weights)
            return _once_differentiable(tuple(grads), ctx.needs_input_grad[:4]) + (None, None, None)
        with torch.no_grad():
            dx, d_router = ctx.optimizer._backward_with_update(d_out, d_losses, x, router_weight, gate_up_proj,
                                                               down_proj, saved, ctx.config, ctx.fp8_weights)
        # The expert weights were updated in place: no gradient reaches .grad.
        dx, d_router = _once_differentiable((dx, d_router), ctx.needs_input_grad[:2])
        return dx, d_router, None, None, None, None, None


def moe_routed(x, topk_experts, topk_weights, gate_up_proj, down_proj, gate_up_bias=None, down_bias=None, *,
               activation="swiglu", act_alpha=1.702, act_limit=7.0, act_up_offset=1.0, interleaved=False,
               transposed=False, precision="storage", _fp8_weights=None) -> torch.Tensor:
    """The experts under a routing computed by the caller's router (any: softmax or sigmoid, with
    a correction bias, group-limited, ...): out_t = sum_k topk_weights[t, k] * expert_{topk_experts[t, k]}(x_t).

    x [..., d]; topk_experts [..., K] integer (an id outside [0, E) is "no expert": that slot adds
    nothing and its weight gets gradient 0); topk_weights [..., K] (float32 or the dtype of x; its
    gradient dS flows back into the router). W = 2n for a gated activation, n for a plain one:
      gate_up_proj [E, W, d] ([E, d, W] when transposed), rows [gate; up] or interleaved [g0, u0, ...]
      down_proj    [E, d, n] ([E, n, d] when transposed)
      gate_up_bias [E, W], down_bias [E, d]: optional
    activation: one of leanmoe.functional.ACTIVATIONS (swiglu_clamped is gpt-oss's, with act_alpha
    and act_limit: (clamp(u, -l, l) + act_up_offset) g' sigmoid(act_alpha g'), g' = min(g, l);
    act_up_offset 0 with act_alpha 1 is DeepSeek-V4's, GLM-5-Next's and HY-V4's; 0 and 1 only;
    swiglu_softcapped is Inkling2's, cg tanh(g / cg) sigmoid(g) cu tanh(u / cu) with the gate's cap
    cg = act_alpha and up's cu = act_limit, both finite and > 0)
    Expert weights and x share one dtype (bfloat16 or float32) and device; under
    torch.autocast x, the weights and biases are cast as in ``moe``. x may have no tokens.
    precision: as in ``moe``. _fp8_weights (transformers experts under "leanmoe_fp8", leanmoe.hf):
    the weights' FP8 codes as in ``moe``, in the weights' layout."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"leanmoe.moe_routed: argument 'activation': must be one of {ACTIVATIONS}, got {activation!r}")
    if interleaved and activation not in GATED_ACTIVATIONS:
        raise ValueError(f"leanmoe.moe_routed: argument 'interleaved': needs a gated activation, got {activation!r}")
    _check_precision("leanmoe.moe_routed", precision)
    if topk_weights.shape != topk_experts.shape:
        raise ValueError(f"leanmoe.moe_routed: argument 'topk_weights': must have the shape of topk_experts "
                         f"{tuple(topk_experts.shape)}, got {tuple(topk_weights.shape)}")
    params = (gate_up_proj, down_proj)
    x, (gate_up_proj, down_proj, gate_up_bias, down_bias) = _autocast(
        "leanmoe.moe_routed", x, (gate_up_proj, down_proj, gate_up_bias, down_bias))
    _check_fp8_dtypes("leanmoe.moe_routed", precision, (("x", x), ("gate_up_proj", gate_up_proj),
                                                        ("down_proj", down_proj), ("gate_up_bias", gate_up_bias),
                                                        ("down_bias", down_bias)))
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    ids = topk_experts.reshape(-1, topk_experts.shape[-1]).to(torch.int32).contiguous()
    weights = topk_weights.reshape(ids.shape)
    if weights.dtype not in (torch.float32, x.dtype):
        weights = weights.float()
    weights = weights.contiguous()
    expert_fn = (activation, float(act_alpha), float(act_limit), float(act_up_offset), bool(interleaved),
                 bool(transposed), precision)
    # Codes of the parameters, not of autocast's copies.
    fp8_weights = _fp8_weights if gate_up_proj is params[0] and down_proj is params[1] else None
    optimizer = _in_backward_optimizer_of_call(params, (gate_up_proj, down_proj))
    if optimizer is not None:
        out = _InBackwardRoutedMoE.apply(x2, ids, weights, gate_up_proj, down_proj, gate_up_bias, down_bias,
                                         expert_fn, optimizer, fp8_weights)
    else:
        out = ops.moe_routed_forward(x2, ids, weights, gate_up_proj, down_proj, gate_up_bias, down_bias,
                                     *expert_fn, fp8_weights)[0]
    return out.view(shape)


class _InBackwardRoutedMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ids, weights, gate_up_proj, down_proj, gate_up_bias, down_bias, expert_fn, optimizer,
                fp8_weights):
        out, *saved = ops.moe_routed_forward(x, ids, weights, gate_up_proj, down_proj, gate_up_bias, down_bias,
                                             *expert_fn, fp8_weights)
        ctx.save_for_backward(x, gate_up_bias, down_bias, *saved)
        ctx.experts = (gate_up_proj, down_proj)
        ctx.versions = (gate_up_proj._version, down_proj._version)
        ctx.expert_fn, ctx.optimizer, ctx.weights_dtype = expert_fn, optimizer, weights.dtype
        ctx.fp8_weights = fp8_weights
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, d_out):
        x, gate_up_bias, down_bias, *saved = ctx.saved_tensors
        _check_experts_unmodified(ctx)
        gate_up_proj, down_proj = ctx.experts
        d_out = torch.zeros_like(x) if d_out is None else d_out.to(x.dtype)
        if not _updates_asked_for(ctx.experts):  # the standard backward, every gradient returned
            with torch.no_grad():
                dx, d_weights, d_gate_up, d_down, d_b1, d_b2 = ops.moe_routed_backward(
                    d_out, x, gate_up_proj, down_proj, gate_up_bias, down_bias, *saved, *ctx.expert_fn,
                    ctx.weights_dtype, ctx.fp8_weights)
            grads = _once_differentiable((dx, None, d_weights, d_gate_up, d_down,
                                          d_b1 if gate_up_bias is not None else None,
                                          d_b2 if down_bias is not None else None), ctx.needs_input_grad[:7])
            return grads + (None, None, None)
        dx, d_weights, d_b1, d_b2 = ctx.optimizer._backward_routed_with_update(
            d_out, x, gate_up_proj, down_proj, gate_up_bias, down_bias, saved, ctx.expert_fn, ctx.weights_dtype,
            ctx.fp8_weights)
        # The expert weights were updated in place: no gradient reaches their .grad. The biases'
        # gradients go the standard way (the optimizer steps them in step()).
        dx, d_weights, d_b1, d_b2 = _once_differentiable(
            (dx, d_weights, d_b1 if gate_up_bias is not None else None, d_b2 if down_bias is not None else None),
            ctx.needs_input_grad)
        return dx, None, d_weights, None, None, d_b1, d_b2, None, None, None
