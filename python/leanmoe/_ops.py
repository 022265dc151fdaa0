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
                      rounding_mode):
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
def _adamw_step_fake(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, weight_decay, eps, master=None):
    return None


# ---- autograd of moe_forward: the standard path (every gradient returned) ----
def _setup_context(ctx, inputs, output):
    x, router_weight, gate_up_proj, down_proj = inputs[:4]
    ctx.config = tuple(inputs[4:])
    saved = output[2:]
    # SPEC §3: x, H, gates and routing arrays; the weights are the caller's parameters.
    ctx.save_for_backward(x, router_weight, gate_up_proj, down_proj, *saved)
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)


def _backward(ctx, d_out, d_losses, *unused):
    x, router_weight, gate_up_proj, down_proj, *saved = ctx.saved_tensors
    d_out, d_losses = _incoming_grads(x, d_out, d_losses)
    with torch.no_grad():  # moe_backward has no derivative of its own (see _once_differentiable)
        grads = ops.moe_backward(d_out, d_losses, x, router_weight, gate_up_proj, down_proj, *saved, *ctx.config)
    return _once_differentiable(tuple(grads), ctx.needs_input_grad[:4]) + (None,) * len(ctx.config)


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


def cuda_available() -> bool:
    """True when the library was built with its CUDA backend and a GPU is visible."""
    return bool(ops.cuda_available())
