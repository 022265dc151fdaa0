"""Loads the compiled operators and registers what torch needs around them: fake (meta) kernels
for torch.compile / FakeTensor, and the autograd formula of ``leanmoe::moe_forward``."""
import os

import torch

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_leanmoe_ops.so")
if not os.path.exists(_LIBRARY):
    raise ImportError(f"leanmoe: the compiled operators are missing ({_LIBRARY}). This is the source tree: "
                      "install the package (pip install --no-build-isolation ./python) and import it from "
                      "outside python/.")
torch.ops.load_library(_LIBRARY)

ops = torch.ops.leanmoe


def max_routed_rows(T, E, K, routing, tile, rounding_mode):
    """R_max of the saved state (leanmoe::max_routed_rows): T*K for top-K; token rounding may add
    up to tile-1 rows per expert (not when rounding down) and never exceeds T*E."""
    if routing == "topk":
        return T * K
    bound = T * K if rounding_mode == "down" else T * K + E * (tile - 1)
    return torch.sym_min(bound, T * E) if isinstance(T, torch.SymInt) else min(bound, T * E)


@torch.library.register_fake("leanmoe::moe_forward")
def _moe_forward_fake(x, router_weight, gate_up_proj, down_proj, top_k, router, norm_topk_prob, routing, tile,
                      rounding_mode, precision, fp8_weights=None):
    torch._check(x.dim() == 2, lambda: "leanmoe::moe_forward: x must be 2-D [T, d]")
    T, d = x.shape
    E, two_n = gate_up_proj.shape[0], gate_up_proj.shape[1]
    R = max_routed_rows(T, E, top_k, routing, tile, rounding_mode)
    i32 = dict(dtype=torch.int32, device=x.device)
    return (
        x.new_empty(T, d),
        x.new_empty(2, dtype=torch.float32),
        x.new_empty(R, two_n),
        x.new_empty(R, dtype=torch.float32),
        torch.empty(R, **i32),
        torch.empty(R, **i32),
        torch.empty(T + 1, **i32),
        torch.empty(E + 1, **i32),
        torch.empty(T, top_k, **i32),
    )


@torch.library.register_fake("leanmoe::moe_backward")
def _moe_backward_fake(d_out, d_losses, x, router_weight, gate_up_proj, down_proj, *saved_and_config):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(router_weight, memory_format=torch.contiguous_format),
            torch.empty_like(gate_up_proj, memory_format=torch.contiguous_format),
            torch.empty_like(down_proj, memory_format=torch.contiguous_format))


@torch.library.register_fake("leanmoe::moe_backward_adamw_")
def _moe_backward_adamw_fake(d_out, d_losses, x, router_weight, *rest):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(router_weight, memory_format=torch.contiguous_format))


@torch.library.register_fake("leanmoe::adamw_step_")
def _adamw_step_fake(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, weight_decay, eps, master=None,
                     update="torch", fp8_copy=None):
    return None


@torch.library.register_fake("leanmoe::fp8_weight_codes_")
def _fp8_weight_codes_fake(weight, codes):
    return None


# ---- autograd of moe_forward: the standard path (every gradient returned) ----
def _setup_context(ctx, inputs, output):
    x, router_weight, gate_up_proj, down_proj = inputs[:4]
    ctx.config = tuple(inputs[4:])
    saved = output[2:]
    # docs/SPEC.md §3: x, H, gates and routing arrays; the weights are the caller's parameters.
    ctx.save_for_backward(x, router_weight, gate_up_proj, down_proj, *saved)
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)


def _backward(ctx, d_out, d_losses, *unused):
    x, router_weight, gate_up_proj, down_proj, *saved = ctx.saved_tensors
    d_out, d_losses = _incoming_grads(x, d_out, d_losses)
    with torch.no_grad():  # moe_backward has no derivative of its own (see _once_differentiable)
        grads = ops.moe_backward(d_out, d_losses, x, router_weight, gate_up_proj, down_proj, *saved, *ctx.config)
    # No gradient for the config, nor for each of the weights' FP8 codes (a list: one None per tensor).
    # The structure torch expects is that of needs_input_grad, not of ctx.config: torch 2.11 drops a
    # trailing argument left at its default (fp8_weights=None) from the inputs it checks against.
    no_grads = tuple([None] * len(n) if isinstance(n, (list, tuple)) else None for n in ctx.needs_input_grad[4:])
    return _once_differentiable(tuple(grads), ctx.needs_input_grad[:4]) + no_grads


_NO_DOUBLE_BACKWARD = (b"leanmoe: the MoE layer has no second derivative (double backward is not implemented): a "
                       b"gradient taken through it with create_graph=True cannot be differentiated again")


def _once_differentiable(grads, needs_input_grad):
    """What torch.autograd.function.once_differentiable does, with leanmoe's message: under
    backward(create_graph=True) the gradients come out first-order correct but raise when they are
    differentiated again (without this, second-order gradients through the layer were silently 0).
    Under torch.compile, AOTAutograd refuses double backward itself."""
    if not torch.is_grad_enabled() or not any(needs_input_grad) or torch.compiler.is_compiling():
        return grads
    err = torch._C._functions.DelayedError(_NO_DOUBLE_BACKWARD, len(grads))

    def fake_requires_grad(g):
        if g is not None:
            g = g.detach()
            g.requires_grad = True
        return g

    out = err(*[fake_requires_grad(g) for g in grads])
    return out if isinstance(out, tuple) else (out,)


def _incoming_grads(x, d_out, d_losses):
    """Gradients autograd hands over, made into what the kernel takes (None means zero)."""
    d_out = torch.zeros_like(x) if d_out is None else d_out.to(x.dtype)
    if d_losses is None:
        d_losses = torch.zeros(2, dtype=torch.float32, device=x.device)
    return d_out, d_losses.to(torch.float32)


torch.library.register_autograd("leanmoe::moe_forward", _backward, setup_context=_setup_context)


# ---- routing given by the caller ----
# leanmoe.h Activation, by name; the gated ones split the up-projection into gate and up halves.
ACTIVATIONS = ("swiglu", "geglu", "geglu_tanh", "reglu", "swiglu_clamped", "swiglu_softcapped", "gelu", "gelu_tanh",
               "silu", "relu", "relu2")
GATED_ACTIVATIONS = ACTIVATIONS[:6]
# leanmoe.h Precision: the expert GEMMs' operands in the parameters' dtype, or e4m3 with block scales
# (bfloat16 parameters, d and n multiples of 128; docs/DESIGN.md "FP8").
PRECISIONS = ("storage", "fp8")
FP8_BLOCK = 128  # src/fp8.h kTile: an FP8 scale covers 128 values along K (a 128x128 block of a weight)


def _up_width(gate_up_proj, transposed):
    return gate_up_proj.shape[2] if transposed else gate_up_proj.shape[1]


@torch.library.register_fake("leanmoe::moe_routed_forward")
def _moe_routed_forward_fake(x, topk_experts, topk_weights, gate_up_proj, down_proj, gate_up_bias, down_bias,
                             activation, act_alpha, act_limit, act_up_offset, interleaved, transposed, precision,
                             fp8_weights=None):
    torch._check(x.dim() == 2, lambda: "leanmoe::moe_routed_forward: x must be 2-D [T, d]")
    T, d = x.shape
    K = topk_experts.shape[1]
    E = gate_up_proj.shape[0]
    i32 = dict(dtype=torch.int32, device=x.device)
    return (
        x.new_empty(T, d),
        x.new_empty(T * K, _up_width(gate_up_proj, transposed)),
        x.new_empty(T * K, dtype=torch.float32),
        torch.empty(T * K, **i32),
        torch.empty(T * K, **i32),
        torch.empty(T + 1, **i32),
        torch.empty(E + 1, **i32),
        torch.empty(T, K, **i32),
    )


def _empty_or_like(bias, x):
    return x.new_empty(0) if bias is None else torch.empty_like(bias, memory_format=torch.contiguous_format)


@torch.library.register_fake("leanmoe::moe_routed_backward")
def _moe_routed_backward_fake(d_out, x, gate_up_proj, down_proj, gate_up_bias, down_bias, h, row_gate, row_token,
                              token_rows, token_offsets, expert_offsets, topk_saved, activation, act_alpha, act_limit,
                              act_up_offset, interleaved, transposed, precision, weights_dtype, fp8_weights=None):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(topk_saved.shape, dtype=weights_dtype),
            torch.empty_like(gate_up_proj, memory_format=torch.contiguous_format),
            torch.empty_like(down_proj, memory_format=torch.contiguous_format),
            _empty_or_like(gate_up_bias, x), _empty_or_like(down_bias, x))


@torch.library.register_fake("leanmoe::moe_routed_backward_adamw_")
def _moe_routed_backward_adamw_fake(d_out, x, gate_up_proj, down_proj, gate_up_bias, down_bias, h, row_gate,
                                    row_token, token_rows, token_offsets, expert_offsets, topk_saved, activation,
                                    act_alpha, act_limit, act_up_offset, interleaved, transposed, precision,
                                    weights_dtype, *state_and_hyper):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(topk_saved.shape, dtype=weights_dtype),
            _empty_or_like(gate_up_bias, x), _empty_or_like(down_bias, x))


@torch.library.register_fake("leanmoe::expert_activation")
def _expert_activation_fake(h, activation, act_alpha, act_limit, act_up_offset, interleaved):
    return h.new_empty(h.shape[0], h.shape[1] // 2 if activation in GATED_ACTIVATIONS else h.shape[1])


_EXPERT_FN_ARGS = 7  # activation, act_alpha, act_limit, act_up_offset, interleaved, transposed, precision


def _routed_setup_context(ctx, inputs, output):
    x, topk_experts, topk_weights, gate_up_proj, down_proj, gate_up_bias, down_bias = inputs[:7]
    ctx.expert_fn = tuple(inputs[7:7 + _EXPERT_FN_ARGS])
    ctx.fp8_weights = inputs[7 + _EXPERT_FN_ARGS] if len(inputs) > 7 + _EXPERT_FN_ARGS else None
    ctx.weights_dtype = topk_weights.dtype
    ctx.has_bias = (gate_up_bias is not None, down_bias is not None)
    saved = output[1:]
    # docs/SPEC.md §3: x, H, gates and routing arrays; the weights and biases are the caller's parameters.
    ctx.save_for_backward(x, gate_up_proj, down_proj, gate_up_bias, down_bias, *saved)
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)


def _routed_backward(ctx, d_out, *unused):
    x, gate_up_proj, down_proj, gate_up_bias, down_bias, *saved = ctx.saved_tensors
    d_out = torch.zeros_like(x) if d_out is None else d_out.to(x.dtype)
    with torch.no_grad():  # moe_routed_backward has no derivative of its own (see _once_differentiable)
        dx, d_weights, d_gate_up, d_down, d_b1, d_b2 = ops.moe_routed_backward(
            d_out, x, gate_up_proj, down_proj, gate_up_bias, down_bias, *saved, *ctx.expert_fn, ctx.weights_dtype,
            ctx.fp8_weights)
    dx, d_weights, d_gate_up, d_down, d_b1, d_b2 = _once_differentiable(
        (dx, d_weights, d_gate_up, d_down, d_b1 if ctx.has_bias[0] else None, d_b2 if ctx.has_bias[1] else None),
        ctx.needs_input_grad[:7])
    # No gradient for the expert function's arguments nor the codes (structured as needs_input_grad, as
    # _backward says).
    no_grads = tuple([None] * len(n) if isinstance(n, (list, tuple)) else None for n in ctx.needs_input_grad[7:])
    return (dx, None, d_weights, d_gate_up, d_down, d_b1, d_b2) + no_grads


torch.library.register_autograd("leanmoe::moe_routed_forward", _routed_backward, setup_context=_routed_setup_context)


def cuda_available() -> bool:
    """True when the library was built with its CUDA backend and a GPU is visible."""
    return bool(ops.cuda_available())
