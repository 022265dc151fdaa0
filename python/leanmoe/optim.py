"""Expert optimizer with in-backward updates (docs/SPEC.md §6, Sonar-MoE).

ExpertAdamW(expert_params, lr, betas, eps, weight_decay, in_backward=True, master_weights=False,
update="torch") is a
torch Optimizer over the batched expert tensors ([E, 2n, d] gate_up_proj and [E, d, n] down_proj of
each layer):

- in_backward=True: each expert tensor is updated inside the layer's C++ backward, the moment its
  gradient is complete (down_proj after the last read of W2, then gate_up_proj after the last read
  of W1); the gradient is dropped at once and never lands in ``.grad``. ``step()`` ends the training
  step (and updates, the standard way, any expert tensor that did receive a ``.grad``).
  Under torch DistributedDataParallel (expert gradients averaged across ranks after backward), or
  with a gradient hook on an expert weight, the layers take the standard path: the gradients reach
  ``.grad`` and ``step()`` applies them. torch.amp.GradScaler is refused at ``scaler.step()`` after
  in-backward updates (they ran on the scaled gradients), honored when there were none.
- in_backward=False: standard; ``step()`` updates every expert tensor from its ``.grad``.

Both modes run the same update (by default torch's fused AdamW kernel, one tensor at a time, what
``torch.optim.AdamW(fused=True)`` does), so without gradient accumulation and without clipping of
expert gradients the weights and the optimizer state are bitwise equal between the two modes, and
equal to torch.optim.AdamW(fused=True) over the same tensors.

master_weights=True (bfloat16 parameters): the optimizer keeps an fp32 master copy of each bf16
tensor (``state["master"]``) with fp32 moments, steps the master with the gradient upcast to fp32
and stores bf16(master) into the parameter, so updates smaller than a bf16 ulp accumulate instead
of rounding away (the C++ ExpertOptimizer's fp32_master). Both modes stay bitwise equal, and equal
to torch.optim.AdamW(fused=True) over fp32 copies of the parameters fed the upcast gradients.
A bf16 parameter changed outside the optimizer (the model's load_state_dict, an edit under no_grad;
not a write through ``.data``) is copied into its master before the next update.

FP8 layers (leanmoe.MoE(precision="fp8"), python/README.md "FP8"): their expert weights are
stepped, in both modes, by leanmoe's fused update instead of torch's kernel (the C++
ExpertOptimizer's AdamW, leanmoe::optim::update_tensor: moments in the parameter's dtype as torch's
kernel keeps them (bf16, fp32 with master_weights), so a layer switched between precisions keeps
a compatible state; the step count as a CPU scalar, the same bits on CPU and GPU;
torch.optim.AdamW's formula, not its rounding), which also
rewrites the layer's FP8 codes of the updated weight in the same pass (on the GPU one kernel: no
separate quantization per step). Both modes stay bitwise equal, with or without the codes kept.

update="leanmoe": every expert tensor (bf16 and fp32 layers' weights and biases too) is stepped by
that same leanmoe update instead of torch's kernel: torch.optim.AdamW's formula, not its rounding
(docs/optim.md lists the differences), and faster on large tensors (5.67 against 8.76 ms for the bf16
experts of a 120B-size layer on an H200, docs/optim.md). Both modes stay bitwise equal; the state
dict keeps torch AdamW's format. The default, update="torch", keeps torch's kernel for every tensor
but the FP8 layers' weights, which always take the leanmoe update. Another value: ValueError.

Lifetime: the optimizer holds its parameters, not the reverse. The in-backward registry refers to
the optimizer weakly, so a deleted optimizer stops updating in backward; a new in-backward
ExpertAdamW over the same tensors takes them over from an older one (resuming from a checkpoint:
build a new optimizer, ``load_state_dict``), and the older one no longer updates them in backward.

The dense (non-expert) parameters are handled by any torch optimizer; clip them with
``torch.nn.utils.clip_grad_norm_(leanmoe.optim.dense_parameters(model), max_norm)``. Expert
gradients are never clipped (a global norm is unknown until backward ends): a change of semantics
versus clipping every gradient. The state dict has torch AdamW's format (plus ``master`` with
master_weights); LR schedulers work on ``param_groups`` as usual.
"""
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _fp8_codes
from ._ops import ops

# expert parameter -> weakref to the in-backward ExpertAdamW owning it (weak both ways: neither
# the parameter nor the optimizer is kept alive by this registry)
_IN_BACKWARD = WeakIdKeyDictionary()

EXPERT_PARAMETER_NAMES = ("gate_up_proj", "down_proj", "up_proj")  # up_proj: experts without a gate
EXPERT_BIAS_NAMES = ("gate_up_proj_bias", "down_proj_bias", "up_proj_bias")


def expert_parameters(model: torch.nn.Module):
    """The batched expert tensors of a model: 3-D parameters named gate_up_proj, down_proj or up_proj
    (transformers' experts), and their 2-D biases (gate_up_proj_bias, ...). In-backward mode updates
    the weights inside backward; the biases ([E, W], [E, d]: small) are stepped in step()."""
    def is_expert(name, p):
        last = name.rsplit(".", 1)[-1]
        return (last in EXPERT_PARAMETER_NAMES and p.dim() == 3) or (last in EXPERT_BIAS_NAMES and p.dim() == 2)
    return [p for name, p in model.named_parameters() if is_expert(name, p)]


def dense_parameters(model: torch.nn.Module):
    """Every other parameter (router, attention, embeddings, norms, ...)."""
    experts = {id(p) for p in expert_parameters(model)}
    return [p for p in model.parameters() if id(p) not in experts]


def _owner(p):
    ref = _IN_BACKWARD.get(p)
    opt = ref() if ref is not None else None
    return opt if opt is not None and opt.in_backward else None


def _in_backward_optimizer(gate_up_proj, down_proj):
    opt = _owner(gate_up_proj)
    if _owner(down_proj) is not opt:
        raise ValueError("leanmoe: arguments 'gate_up_proj' and 'down_proj': must both belong to the same in-backward "
                         "ExpertAdamW, or neither")
    return opt


def _check_hyper(lr, betas, eps, weight_decay):
    """torch.optim.AdamW's argument rules, with messages naming the argument."""
    fn = "leanmoe.optim.ExpertAdamW"
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError(f"{fn}: argument 'lr': a tensor lr must have one element, got shape {tuple(lr.shape)}")
    if not 0.0 <= float(lr):
        raise ValueError(f"{fn}: argument 'lr': must be >= 0, got {lr}")
    if not 0.0 <= float(eps):
        raise ValueError(f"{fn}: argument 'eps': must be >= 0, got {eps}")
    betas = tuple(betas)
    if len(betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in betas):
        raise ValueError(f"{fn}: argument 'betas': must be two values in [0, 1), got {betas}")
    if not 0.0 <= float(weight_decay):
        raise ValueError(f"{fn}: argument 'weight_decay': must be >= 0, got {weight_decay}")


class ExpertAdamW(torch.optim.Optimizer):
    _writes_fp8_codes = True  # its update rewrites FP8 layers' codes (no stale stamp after its step)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, in_backward=True,
                 master_weights=False, update="torch"):
        _check_hyper(lr, betas, eps, weight_decay)
        if update not in ("torch", "leanmoe"):
            raise ValueError(f"leanmoe.optim.ExpertAdamW: argument 'update': must be 'torch' or 'leanmoe', got "
                             f"{update!r}")
        self.update = update
        self.in_backward = bool(in_backward)
        self.master_weights = bool(master_weights)
        self._updated = set()  # ids of the tensors updated in backward since the last step()
        # bf16 parameter with a master copy -> (storage, version) after this optimizer last wrote it
        self._written = WeakIdKeyDictionary()
        # fused=True: load_state_dict then puts 'step' on the parameter's device, as the fused kernel needs.
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fused=True)
        super().__init__(params, defaults)
        # torch's load_state_dict casts every state tensor to its parameter's dtype: keep the fp32 ones
        # (masters, and the moments with a master).
        self.register_load_state_dict_pre_hook(_stash_fp32_state)
        self.register_load_state_dict_post_hook(_restore_fp32_state)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)  # fills the defaults in, then the group is checked
        group = self.param_groups[-1]
        try:
            _check_hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])
            for p in group["params"]:
                if p.dtype not in (torch.float32, torch.bfloat16):
                    raise ValueError(f"leanmoe.optim.ExpertAdamW: argument 'params': dtype must be float32 or "
                                     f"bfloat16, got {p.dtype}")
        except ValueError:
            self.param_groups.pop()  # refused: the optimizer stays as it was
            raise
        if not hasattr(self, "_group_of"):
            self._group_of = {}  # id(parameter) -> index of its param group
        self._group_of.update((id(p), len(self.param_groups) - 1) for p in group["params"])
        if self.in_backward:
            for p in group["params"]:
                _IN_BACKWARD[p] = weakref.ref(self)  # takes p over from an older optimizer

    def release(self):
        """Stops in-backward updates for this optimizer's tensors (they get .grad again)."""
        for group in self.param_groups:
            for p in group["params"]:
                if _owner(p) is self:
                    del _IN_BACKWARD[p]
        self.in_backward = False

    # ---- the update, shared by both modes ----
    def _uses_master(self, p):
        return self.master_weights and p.dtype == torch.bfloat16

    def _kernel(self, p):
        """The update that steps p: 'leanmoe' for an FP8 layer's weight or with update='leanmoe', else
        'torch'."""
        return "leanmoe" if self.update == "leanmoe" else _fp8_codes.update_kernel(p)

    def _state(self, p, kernel):
        """p's state for `kernel` (_kernel). 'torch': torch.optim.AdamW(fused=True)'s, an
        fp32 step on the device. 'leanmoe': the step on the CPU (read without a device sync). Both keep
        the moments like p (like the fp32 master when there is one): bf16 moments halve the leanmoe
        update's moment traffic (14 instead of 22 bytes per element) and keep an fp8 layer's state
        the same as a bf16 layer's. A state loaded or made for the other kernel is converted once."""
        state = self.state[p]
        step_device = torch.device("cpu") if kernel == "leanmoe" else p.device
        moments = torch.float32 if self._uses_master(p) else p.dtype
        if len(state) == 0:
            state["step"] = torch.zeros((), dtype=torch.float32, device=step_device)
            like = p
            if self._uses_master(p):
                state["master"] = p.detach().to(torch.float32, memory_format=torch.contiguous_format)
                like = state["master"]
            layout = torch.contiguous_format if kernel == "leanmoe" else torch.preserve_format
            state["exp_avg"] = torch.zeros_like(like, dtype=moments, memory_format=layout)
            state["exp_avg_sq"] = torch.zeros_like(like, dtype=moments, memory_format=layout)
            return state
        if state["step"].device != step_device:
            state["step"] = state["step"].to(step_device)
        if self.master_weights and self._uses_master(p) != ("master" in state):
            # p's dtype changed since its state was made (model.to(dtype)): a bf16 p gets a master of its
            # value, an fp32 one is its own (p wins, as after any change outside the optimizer).
            if self._uses_master(p):
                state["master"] = p.detach().to(torch.float32, memory_format=torch.contiguous_format)
                self._wrote(p)
            else:
                del state["master"]
        if self._uses_master(p) and "master" in state and self._written.get(p) != self._stamp(p):
            # p changed since this optimizer wrote it (the model's load_state_dict, an edit, a load of this
            # optimizer's state): the master follows p unless p is its rounding, else the next update
            # would store the stale master back into p. One compare per change, not per step.
            if not torch.equal(state["master"].to(p.dtype), p):
                state["master"] = p.detach().to(torch.float32, memory_format=torch.contiguous_format)
            self._wrote(p)
        for key in ("exp_avg", "exp_avg_sq"):
            if state[key].dtype != moments:
                state[key] = state[key].to(moments)
        return state

    def _wrote(self, *params):
        for p in params:
            if self._uses_master(p):
                self._written[p] = self._stamp(p)

    @staticmethod
    def _stamp(p):
        # The storage itself, not only its address: p converted to float and back may land at the
        # freed storage's address with the same version, and the stale master would be stored back.
        return _fp8_codes.storage_identity(p), p._version

    def _master(self, state):
        return state.get("master") if self.master_weights else None

    def _hyper(self, p):
        # O(1) per call: backward asks for every layer (32 layers x 2 tensors on Granite-3B), and
        # scanning the group lists each time was host work on the step's critical path.
        index = self._group_of.get(id(p))
        if index is None:
            raise ValueError("leanmoe.optim.ExpertAdamW: a tensor handed to the update is not one of this "
                             "optimizer's")
        group = self.param_groups[index]  # load_state_dict replaces the dicts, never their order
        beta1, beta2 = group["betas"]
        return (float(group["lr"]), float(beta1), float(beta2), float(group["weight_decay"]), float(group["eps"]))

    def _check_not_updated(self, gate_up_proj, down_proj, where):
        if id(gate_up_proj) in self._updated or id(down_proj) in self._updated:
            raise RuntimeError(
                f"leanmoe.optim: an expert weight updated in this step's backward is read again by {where} before "
                "optimizer.step(). In-backward expert updates do not support a layer called more than once per "
                "step (weights shared between calls), gradient accumulation over micro-batches nor activation "
                "recomputation (gradient checkpointing): call step() after every backward, or use "
                "ExpertAdamW(..., in_backward=False).")

    def _check_no_stale_grad(self, gate_up_proj, down_proj):
        for name, p in (("gate_up_proj", gate_up_proj), ("down_proj", down_proj)):
            if p.grad is not None:
                raise RuntimeError(
                    f"leanmoe.optim.ExpertAdamW: the expert weight '{name}' {tuple(p.shape)} has a .grad (from a "
                    "backward before this in-backward optimizer existed, or from the torch.compile path) while "
                    "this optimizer updates it inside backward: clear it first, e.g. optimizer.zero_grad() or "
                    "model.zero_grad() (set_to_none=True), or step() it away with the standard path.")

    def _prepare_update(self, gate_up_proj, down_proj):
        """Checks and the state of an in-backward update of one layer: (gate_up state, down state, hyper,
        update kernel)."""
        self._check_not_updated(gate_up_proj, down_proj, "a second backward")
        hyper = self._hyper(gate_up_proj)
        if self._hyper(down_proj) != hyper:
            raise ValueError("leanmoe.optim.ExpertAdamW: a layer's gate_up_proj and down_proj must share their "
                             "hyper-parameters (put them in the same param group)")
        if _fp8_codes.update_kernel(down_proj) != _fp8_codes.update_kernel(gate_up_proj):
            raise ValueError("leanmoe.optim.ExpertAdamW: a layer's gate_up_proj and down_proj must both be the "
                             "expert weights of one precision='fp8' leanmoe.MoE, or neither")
        kernel = self._kernel(gate_up_proj)
        return self._state(gate_up_proj, kernel), self._state(down_proj, kernel), hyper, kernel

    def _backward_with_update(self, d_out, d_losses, x, router_weight, gate_up_proj, down_proj, saved, config,
                              fp8_weights=None):
        """fp8_weights: the layer's codes the call read (leanmoe.MoE); the update rewrites them."""
        g, d, hyper, kernel = self._prepare_update(gate_up_proj, down_proj)
        with torch.no_grad():
            dx, d_router = ops.moe_backward_adamw_(
                d_out, d_losses, x, router_weight, gate_up_proj, down_proj, *saved, *config,
                g["exp_avg"], g["exp_avg_sq"], g["step"], d["exp_avg"], d["exp_avg_sq"], d["step"], *hyper,
                self._master(g), self._master(d), kernel, fp8_weights)
        self._after_in_backward_update(gate_up_proj, down_proj, fp8_weights)
        return dx, d_router

    def _after_in_backward_update(self, gate_up_proj, down_proj, fp8_weights):
        """What a layer's in-backward update leaves: both weights stepped this step, written by this
        optimizer (their masters current), and the codes given rewritten in its pass (without, any
        kept are stale)."""
        self._updated.update((id(gate_up_proj), id(down_proj)))
        self._wrote(gate_up_proj, down_proj)
        _fp8_codes.updated(gate_up_proj, fp8_weights[:4] if fp8_weights is not None else None)
        _fp8_codes.updated(down_proj, fp8_weights[4:] if fp8_weights is not None else None)

    def _backward_routed_with_update(self, d_out, x, gate_up_proj, down_proj, gate_up_bias, down_bias, saved,
                                     expert_fn, weights_dtype, fp8_weights=None):
        """Routing given by the caller: returns dx, d_topk_weights and the bias gradients. fp8_weights:
        the codes the call read (transformers experts under "leanmoe_fp8"); the update rewrites them."""
        g, d, hyper, kernel = self._prepare_update(gate_up_proj, down_proj)
        with torch.no_grad():
            result = ops.moe_routed_backward_adamw_(
                d_out, x, gate_up_proj, down_proj, gate_up_bias, down_bias, *saved, *expert_fn, weights_dtype,
                g["exp_avg"], g["exp_avg_sq"], g["step"], d["exp_avg"], d["exp_avg_sq"], d["step"], *hyper,
                self._master(g), self._master(d), kernel, fp8_weights)
        self._after_in_backward_update(gate_up_proj, down_proj, fp8_weights)
        return result

    @property
    def _step_supports_amp_scaling(self):
        # torch.amp.GradScaler then sets self.found_inf (and self.grad_scale unless unscale_() ran)
        # for step() instead of unscaling .grad itself: how an in-backward optimizer learns that
        # loss scaling is on, to refuse it after in-backward updates (and honor it otherwise).
        return self.in_backward

    @torch.no_grad()
    def step(self, closure=None):
        found_inf = getattr(self, "found_inf", None)  # set by torch.amp.GradScaler (_step_supports_amp_scaling)
        if found_inf is not None:
            if self._updated:
                for name in ("grad_scale", "found_inf"):  # GradScaler removes them only after a step that returns
                    self.__dict__.pop(name, None)
                raise RuntimeError(
                    "leanmoe.optim.ExpertAdamW(in_backward=True): torch.amp.GradScaler cannot be honored: the expert "
                    "weights were updated inside backward from the scaled gradients, before GradScaler could "
                    "unscale them or skip a step with inf/nan ones. Use ExpertAdamW(..., in_backward=False) with "
                    "GradScaler, or no loss scaling (bfloat16 needs none).")
            # Only .grad to step (every layer took the standard path): GradScaler's own contract.
            if bool(found_inf):  # a tensor, or 0 when no tensor had a .grad
                return None
            if getattr(self, "grad_scale", None) is not None:  # unscale_() did not run: unscale as it would
                inv_scale = self.grad_scale.double().reciprocal().float()
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            torch._amp_foreach_non_finite_check_and_unscale_([p.grad], torch.zeros_like(found_inf),
                                                                            inv_scale.to(p.grad.device))
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if id(p) in self._updated:
                    raise RuntimeError("leanmoe.optim.ExpertAdamW: a tensor was updated in backward and also has a "
                                       ".grad (two paths into one weight)")
                kernel = self._kernel(p)
                state = self._state(p, kernel)
                codes = _fp8_codes.codes_for_update(p) if kernel == "leanmoe" else None
                ops.adamw_step_(p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"], *self._hyper(p),
                                self._master(state), kernel, codes)
                self._wrote(p)
                _fp8_codes.updated(p, codes)  # torch's kernel too: an fp8 layer switched to storage for a step
        self._updated.clear()
        return loss


_FP32_STATE = ("master", "exp_avg", "exp_avg_sq")


def _stash_fp32_state(optimizer, state_dict):
    """load_state_dict pre-hook: keeps fp32 state (master copies, moments with a master) out of
    torch's cast of every state tensor to its parameter's dtype. A moment in fp32 that the tensor's
    kernel keeps in bf16 (a checkpoint from before the leanmoe update kept bf16 moments) is cast by
    _state at its next update."""
    optimizer._loading_fp32 = {
        k: {name: v[name] for name in _FP32_STATE if torch.is_tensor(v.get(name)) and v[name].dtype == torch.float32}
        for k, v in state_dict["state"].items() if isinstance(v, dict)}
    return state_dict


def _restore_fp32_state(optimizer):
    stashed = getattr(optimizer, "_loading_fp32", {})
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if index in stashed and p in optimizer.state:
                for name, value in stashed[index].items():
                    optimizer.state[p][name] = value.to(device=p.device, dtype=torch.float32,
                                                        memory_format=torch.contiguous_format, copy=True)
            index += 1
    optimizer._loading_fp32 = {}
