"""leanmoe for transformers v5 MoE models, two ways.

1. The experts implementation "leanmoe" (routing given by the model's own router):

    import leanmoe.hf                    # registers "leanmoe" in transformers' experts interface
    model = AutoModelForCausalLM.from_pretrained(name, experts_implementation="leanmoe")
    model.set_experts_implementation("leanmoe")   # or switch an existing model

   Every model whose experts class is decorated with transformers' ``use_experts_implementation``
   (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, gpt-oss, GLM-4-MoE, Phi-MoE, ERNIE-4.5-MoE, OLMoE,
   Granite, Nemotron-H, ...) then runs its experts through ``leanmoe.moe_routed``: the model's
   router (softmax or sigmoid, correction bias, group-limited top-K, shared experts) runs as
   written, so ``output_router_logits`` and transformers' load-balancing loss work unchanged, and
   the gradient of the routing weights flows back into it. The experts' flags are honoured:
   ``has_gate`` (gated, or a plain up-projection ``up_proj``), ``has_bias``, ``is_transposed``,
   ``is_concatenated`` (else interleaved gate/up), and the activation (the module's ``act_fn``, or
   an overridden ``_apply_gate`` such as gpt-oss's or DeepSeek-V4's clamped SwiGLU, or Inkling2's
   soft-capped one), recognised by evaluating the module's own function against leanmoe's once per
   module. A post-expert norm (MuseSpark's ``has_post_expert_norm``) runs as the module's own norm
   on each (token, slot) output, at the cost of T*K*d activations (python/README.md). What
   leanmoe cannot run (an unknown activation, or a feature the device's backend lacks) raises an
   error naming the model and the feature. ``leanmoe.optim.ExpertAdamW`` updates these experts in backward.
   ``experts_implementation="leanmoe_fp8"`` runs the same with the up, down, dH and dX expert GEMMs
   in blockwise FP8 (``moe_routed(precision="fp8")``, docs/DESIGN.md "FP8"): bfloat16 models (or
   torch.autocast to bfloat16) whose hidden and expert widths are multiples of 128. Each experts
   module keeps its weights' FP8 codes as leanmoe.MoE(precision="fp8") does (the bf16 weights'
   bytes again; ExpertAdamW rewrites them in its update, in-backward or in step(), so no call
   quantizes a weight): ``fp8_weight_codes(model, False)`` frees them and quantizes per call.

2. ``apply(model)``: replaces the whole MoE block of OLMoE, Qwen3-MoE, GraniteMoE and Mixtral by
   leanmoe's fused router + experts (``leanmoe.moe``), which also offers token rounding:

    n = leanmoe.hf.apply(model, routing="token_rounding")
    loss = model(**batch).loss + coef * leanmoe.hf.aux_loss(model)
    leanmoe.hf.remove(model)

   The block object, its router and experts stay in the model with the same Parameter objects
   (no copies, state_dict keys unchanged); only the block's forward is swapped for one call of
   leanmoe.moe, which fuses routing, experts and the router backward (docs/SPEC.md §3-§4: it never
   materialises the per-pair gate tensor autograd would need). ``apply(model, precision="fp8")``
   runs its expert GEMMs in FP8.

Two load-balancing losses with apply() (both unscaled; a trainer multiplies by its coefficient):
- leanmoe's, per layer, E * sum_e f_e * P_e with f_e = (top-K count of e) / (T*K) and P_e the mean
  router probability; ``aux_loss(model)`` sums it over layers.
- transformers' (``load_balancing_loss_func``): f_e = (top-K count of e) / T, so K times larger per
  layer, and counts and probabilities pooled over all layers' tokens before the product (not a sum
  of per-layer losses). A model's ``router_aux_loss_coef`` is tuned for this one. When a forward
  asks for router logits (``output_router_logits=True``, or ``config.output_router_logits``), each
  leanmoe block runs its transformers router on the hidden states too (one [T, d] x [d, E] GEMM, so
  transformers records the logits): ``model(...).aux_loss`` and the loss it adds are then exactly
  transformers' (attention_mask included). ``aux_loss(model, formulation="transformers")`` gives
  the same value (without an attention mask) from the logits of the last forward, recorded when the
  forward asked for them or when ``apply(model, router_logits=True)``.
"""
import types
from typing import List, NamedTuple, Optional

import torch

from . import _fp8_codes
from ._ops import FP8_BLOCK, GATED_ACTIVATIONS, ops
from .functional import RouterStats, _check_precision, _fp8_width_unmet, moe, moe_routed, routing_for_call

EXPERTS_IMPLEMENTATION = "leanmoe"
# The same experts implementation with the expert GEMMs in blockwise FP8 (precision="fp8").
EXPERTS_IMPLEMENTATION_FP8 = "leanmoe_fp8"


# ---------------------------------------------------------------------------------------------
# 1. The registered experts implementation
# ---------------------------------------------------------------------------------------------
class ExpertsSpec(NamedTuple):
    """What leanmoe runs for one transformers experts module."""
    activation: str
    act_alpha: float
    act_limit: float
    act_up_offset: float
    interleaved: bool
    transposed: bool
    gated: bool
    bias: bool
    post_norm: bool = False  # the module's post_expert_norm on each expert's output (has_post_expert_norm)


_SPEC_ATTR = "_leanmoe_experts_spec"


def _model_name(module):
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    return f"{type(module).__name__}" + (f" (model_type {model_type!r})" if model_type else "")


def _default_apply_gate():
    try:
        from transformers.integrations.moe import _default_apply_gate as gate
    except ImportError:
        gate = None
    return gate


def _probe_gate_up(width, dtype=torch.float32):
    # Spans both signs and the clamp limits of gpt-oss (7) and DeepSeek-V4 (10) so every branch of an
    # activation shows.
    g = torch.Generator().manual_seed(0)
    return (torch.rand(97, width, generator=g, dtype=torch.float64) * 24 - 12).to(dtype)


def _clamped_swiglu_constant(module, names, default):
    """A clamped-SwiGLU constant of the module under the first of `names` it sets, else `default`:
    gpt-oss keeps ``alpha`` and ``limit``, DeepSeek-V4 ``limit``, GLM-5-Next and HY-V4
    ``swiglu_limit``, MiniMax-M3-VL ``swiglu_alpha`` (None, Step3p7's unclamped layers: unset)."""
    for attr in names:
        v = getattr(module, attr, None)
        if v is not None:
            return float(v)
    return default


def _softcaps(module):
    """The (gate, up) caps of a soft-capped SwiGLU, c·tanh(x / c) on each: Inkling2 keeps them on
    ``act_fn.gate_softcap.softcap`` and ``act_fn.up_softcap.softcap``. None when the module has none."""
    act_fn = getattr(module, "act_fn", None)
    caps = [getattr(getattr(act_fn, f"{part}_softcap", None), "softcap", None) for part in ("gate", "up")]
    return None if None in caps else tuple(float(c) for c in caps)


def _recognise_activation(module, gated, interleaved, name):
    """leanmoe's activation that equals the module's own (its _apply_gate or act_fn) on a probe."""
    if gated:
        probe = _probe_gate_up(2 * 8)
        with torch.no_grad():
            want = module._apply_gate(probe.clone()).float()
        alpha = _clamped_swiglu_constant(module, ("alpha", "swiglu_alpha"), 1.702)  # gpt-oss's defaults
        limit = _clamped_swiglu_constant(module, ("limit", "swiglu_limit"), 7.0)
        candidates = [(a, 1.702, 7.0, 1.0) for a in GATED_ACTIVATIONS
                      if a not in ("swiglu_clamped", "swiglu_softcapped")]
        candidates.append(("swiglu_clamped", alpha, limit, 1.0))
        # DeepSeek-V4's silu(min(g, limit)) * clamp(up, -limit, limit): alpha 1, no +1 on up.
        candidates.append(("swiglu_clamped", 1.0, limit, 0.0))
        caps = _softcaps(module)
        if caps is not None:  # the gate's cap rides in act_alpha, up's in act_limit
            candidates.append(("swiglu_softcapped", *caps, 1.0))
        layout = "interleaved" if interleaved else "[gate; up]"
        own_gate = type(module)._apply_gate is not _default_apply_gate()
        what = (f"its own {type(module).__qualname__}._apply_gate" if own_gate else
                f"act_fn {type(getattr(module, 'act_fn', None)).__name__} times up") + f", layout {layout}"
    else:
        probe = _probe_gate_up(8)
        act_fn = getattr(module, "act_fn", None)
        if act_fn is None:
            raise NotImplementedError(f"leanmoe experts implementation: {name}: experts without a gate must have an "
                                      "act_fn")
        with torch.no_grad():
            want = act_fn(probe.clone()).float()
        candidates = [(a, 1.702, 7.0, 1.0) for a in ("gelu", "gelu_tanh", "silu", "relu", "relu2")]
        what = f"its activation {type(act_fn).__name__}"
    for activation, alpha, limit, up_offset in candidates:
        ours = ops.expert_activation(probe, activation, alpha, limit, up_offset, interleaved)
        if ours.shape == want.shape and torch.allclose(ours, want, rtol=1e-5, atol=1e-5):
            return activation, alpha, limit, up_offset
    names = dict.fromkeys(a for a, _, _, _ in candidates)  # swiglu_clamped once
    raise NotImplementedError(
        f"leanmoe experts implementation: {name}: the experts' activation ({what}) is none of leanmoe's "
        f"({', '.join(names)}). Use another experts_implementation for this model.")


def experts_spec(module) -> ExpertsSpec:
    """The spec of a transformers experts module (computed once, kept on the module). Raises
    NotImplementedError naming the model and the feature leanmoe cannot run."""
    spec = module.__dict__.get(_SPEC_ATTR)
    return spec if spec is not None else _compute_experts_spec(module)


@torch.compiler.disable  # evaluates the module's own activation on a probe: eager, once per module
def _compute_experts_spec(module) -> ExpertsSpec:
    name = _model_name(module)
    post_norm = bool(getattr(module, "has_post_expert_norm", False))
    if post_norm and not callable(getattr(module, "post_expert_norm", None)):
        raise NotImplementedError(f"leanmoe experts implementation: {name}: has_post_expert_norm is set but the "
                                  "module has no callable post_expert_norm")
    gated = bool(getattr(module, "has_gate", True))
    interleaved = gated and not bool(getattr(module, "is_concatenated", True))
    activation, alpha, limit, up_offset = _recognise_activation(module, gated, interleaved, name)
    spec = ExpertsSpec(activation, alpha, limit, up_offset, interleaved, bool(getattr(module, "is_transposed", False)),
                       gated, bool(getattr(module, "has_bias", False)), post_norm)
    w = module.gate_up_proj if gated else module.up_proj
    reason = ops.layer_unsupported_reason(w, spec.activation, spec.act_alpha, spec.act_limit, spec.act_up_offset,
                                          spec.interleaved, spec.transposed, spec.bias)
    if reason:
        raise NotImplementedError(f"leanmoe experts implementation: {name} on {w.device.type} ({w.dtype}): {reason}")
    module.__dict__[_SPEC_ATTR] = spec
    return spec


def _experts_modules(model):
    """The transformers experts modules of `model` (the classes decorated for the experts interface)."""
    return [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "down_proj")]


def prepare(model: torch.nn.Module) -> int:
    """Recognises every experts module of `model` now (eager) instead of at its first forward:
    an unsupported model fails here, and torch.compile(fullgraph=True) then traces the experts
    without a graph break. Returns the number of experts modules."""
    modules = _experts_modules(model)
    for m in modules:
        experts_spec(m)
    return len(modules)


_WIDTH_NAMES = {"d": "d (hidden size)", "n": "n (expert intermediate size)"}


def _fp8_widths_unmet(d, n):
    """The width rule of precision="fp8" that d and n break, in a model's words, or None."""
    unmet = _fp8_width_unmet(d, n)
    if unmet is None:
        return None
    return f"{_WIDTH_NAMES[unmet[0]]} = {unmet[1]} must be a multiple of {FP8_BLOCK} for FP8 expert GEMMs"


def _fp8_unmet(w, d, n):
    """The rule of precision="fp8" experts with weight w and widths d, n break now, or None."""
    device_type = w.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else w.dtype
    if dtype != torch.bfloat16:
        return f"needs bfloat16 expert weights (or torch.autocast to bfloat16), got {dtype}"
    return _fp8_widths_unmet(d, n)


def _check_fp8(name, w, spec, d):
    """What precision="fp8" needs of an experts module, as an error naming the model and the rule
    (before the call, so the message names the model rather than moe_routed's arguments)."""
    n = (w.shape[-1] if spec.transposed else w.shape[-2]) // (2 if spec.gated else 1)
    reason = _fp8_unmet(w, d, n)
    if reason:
        raise NotImplementedError(f"leanmoe experts implementation {EXPERTS_IMPLEMENTATION_FP8!r}: {name}: {reason}")


def _fp8_codes_for_call(module, spec):
    """The experts module's FP8 codes for this call (python/leanmoe/_fp8_codes.py; None: quantize per
    call), making it an owner of codes at its first FP8 call."""
    state = module.__dict__
    if _fp8_codes.HF_NAMES not in state:
        state[_fp8_codes.HF_NAMES] = ("gate_up_proj" if spec.gated else "up_proj", "down_proj")
        state.setdefault(_fp8_codes.HF_KEEPS, True)
        state["_fp8_stamps"] = _fp8_codes.Stamps()
    state[_fp8_codes.HF_PRECISION] = "fp8"
    return _fp8_codes.codes_for_call(module)  # registers the weights: ExpertAdamW's update writes codes


def _experts(self, hidden_states, top_k_index, top_k_weights, precision):
    spec = experts_spec(self)
    up = self.gate_up_proj if spec.gated else self.up_proj
    fp8_weights = None
    if precision == "fp8":
        _check_fp8(_model_name(self), up, spec, hidden_states.shape[-1])
        # Traced by torch.compile: the weights quantized per call (the codes' checks read storage and
        # version counters, which a graph cannot), as leanmoe.MoE does.
        fp8_weights = None if torch.compiler.is_compiling() else _fp8_codes_for_call(self, spec)
    elif _fp8_codes.HF_PRECISION in self.__dict__:  # switched back from "leanmoe_fp8": torch's update again
        self.__dict__[_fp8_codes.HF_PRECISION] = "storage"
    up_bias = (self.gate_up_proj_bias if spec.gated else self.up_proj_bias) if spec.bias else None
    down_bias = self.down_proj_bias if spec.bias else None

    def experts(x, ids, weights):
        return moe_routed(x, ids, weights, up, self.down_proj, up_bias, down_bias,
                          activation=spec.activation, act_alpha=spec.act_alpha, act_limit=spec.act_limit,
                          act_up_offset=spec.act_up_offset,
                          interleaved=spec.interleaved, transposed=spec.transposed, precision=precision,
                          _fp8_weights=fp8_weights)

    x = hidden_states.to(up.dtype)
    if not spec.post_norm:
        return experts(x, top_k_index, top_k_weights).to(hidden_states.dtype)
    # The norm acts on each (token, slot) output before its weight, so the layer runs on the T*K
    # (token, slot) rows as tokens of their own, each with one expert of weight 1; their outputs go
    # through the module's own norm, then are weighted and summed over the slots as transformers
    # does. This keeps T*K*d activations (the repeated rows and the norm's input), which the fused
    # layer avoids; see python/README.md.
    T, K = top_k_index.shape
    out = experts(x.repeat_interleave(K, dim=0), top_k_index.reshape(T * K, 1),
                  torch.ones(T * K, 1, dtype=torch.float32, device=x.device))
    # A slot outside [0, E) adds nothing and gets no gradient (transformers masks its weight).
    E = up.shape[0]
    kept = top_k_weights.masked_fill((top_k_index < 0) | (top_k_index >= E), 0)
    normed = self.post_expert_norm(out)
    out = (normed.view(T, K, out.shape[-1]) * kept.unsqueeze(-1)).sum(dim=1)
    return out.to(hidden_states.dtype)


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' experts interface: hidden_states [T, d], top_k_index [T, K], top_k_weights [T, K]."""
    return _experts(self, hidden_states, top_k_index, top_k_weights, "storage")


def experts_forward_fp8(self, hidden_states, top_k_index, top_k_weights):
    """experts_forward with the expert GEMMs in blockwise FP8 (experts_implementation="leanmoe_fp8")."""
    return _experts(self, hidden_states, top_k_index, top_k_weights, "fp8")


def fp8_weight_codes(model: torch.nn.Module, enabled: bool = True) -> int:
    """Whether the experts modules of `model` keep their weights' FP8 codes under "leanmoe_fp8" (the
    default; the bf16 weights' bytes again). False frees the codes: each FP8 call then quantizes the
    weights itself (the same bits, slower on the GPU). Returns the number of experts modules."""
    modules = _experts_modules(model)
    for m in modules:
        m.__dict__[_fp8_codes.HF_KEEPS] = bool(enabled)
        if not enabled and _fp8_codes.HF_NAMES in m.__dict__:
            _fp8_codes.free(m)
    return len(modules)


def refresh_fp8_codes(model: torch.nn.Module) -> None:
    """Writes the FP8 codes of the experts' current weights now: after writes torch does not see
    (through ``weight.data``, or outside torch); every other change is found before the next call."""
    for m in model.modules():
        if _fp8_codes.HF_NAMES in m.__dict__:
            _fp8_codes.refresh(m)


def register() -> bool:
    """Registers "leanmoe" and "leanmoe_fp8" in transformers' experts interface (idempotent; done
    on import of leanmoe.hf when transformers has the interface). Returns False when it has none."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register(EXPERTS_IMPLEMENTATION, experts_forward)
    ExpertsInterface.register(EXPERTS_IMPLEMENTATION_FP8, experts_forward_fp8)
    return True


register()


# ---------------------------------------------------------------------------------------------
# 2. apply(): the fused router + experts in place of the whole block
# ---------------------------------------------------------------------------------------------
# block class name -> (router attribute, router convention)
SUPPORTED_BLOCKS = {
    "OlmoeSparseMoeBlock": ("gate", "softmax_then_topk"),
    "Qwen3MoeSparseMoeBlock": ("gate", "softmax_then_topk"),
    "GraniteMoeMoE": ("router", "topk_then_softmax"),
    "MixtralSparseMoeBlock": ("gate", "topk_then_softmax"),  # softmax, top-K, renormalised = softmax of the K
}


class _Settings(types.SimpleNamespace):
    pass


class BlockSpec(NamedTuple):
    router_attr: str  # "gate" or "router"
    convention: str  # leanmoe router convention
    top_k: int
    norm_topk_prob: bool


def _router_logits_requested() -> bool:
    """True while a transformers forward collects router logits (output_router_logits). transformers
    v5 records them with forward hooks on the router module, active through this context variable."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # a transformers without this module records nothing this way
        return False
    collected = _active_collector.get()
    return collected is not None and "router_logits" in collected


def _leanmoe_block_forward(self, hidden_states):
    s = self._leanmoe
    router = getattr(self, s.router_attr)
    jitter = getattr(self, "jitter_noise", 0)
    if self.training and jitter > 0:  # Mixtral's router jitter, as its block applies it
        hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(1.0 - jitter, 1.0 + jitter)
    routing = routing_for_call(s.routing, s.inference_routing, self.training)
    if s.precision == "fp8":  # the dtype can change after apply(): checked per call, naming the block
        w = self.experts.gate_up_proj
        reason = _fp8_unmet(w, w.shape[2], w.shape[1] // 2)
        if reason:
            raise ValueError(f"leanmoe.hf.apply(precision='fp8'): block '{s.name}' ({type(self).__name__}): {reason}")
    out = moe(hidden_states, router.weight, self.experts.gate_up_proj, self.experts.down_proj, router.top_k,
              router=s.convention, norm_topk_prob=bool(getattr(router, "norm_topk_prob", False)), routing=routing,
              tile=s.tile, rounding_mode=s.rounding_mode, return_stats=s.return_stats, precision=s.precision)
    self.leanmoe_aux_loss, self.leanmoe_z_loss = out.aux_loss, out.z_loss
    if s.return_stats:
        self.leanmoe_stats = out.stats
    if s.router_logits or _router_logits_requested():
        # transformers' router on the same hidden states: its forward hook records the logits for
        # load_balancing_loss_func; they carry that loss's gradient to the router and the input.
        self.leanmoe_router_logits = router(hidden_states.reshape(-1, hidden_states.shape[-1]))[0]
    else:
        self.__dict__.pop("leanmoe_router_logits", None)
    return out.output


def _check_swiglu(fn, name, block):
    act = getattr(block.experts, "act_fn", None)
    probe = torch.linspace(-4, 4, 17)
    if act is None or not torch.allclose(act(probe), torch.nn.functional.silu(probe)):
        raise ValueError(f"{fn}: block '{name}': experts activation must be SiLU (SwiGLU experts), "
                         f"got {type(act).__name__}; the experts implementation (experts_implementation="
                         f"'leanmoe') runs other activations")
    # transformers >= 5.2x describes its experts' layout; leanmoe takes the concatenated [gate; up]
    # SwiGLU layout of docs/SPEC.md §2 without biases.
    layout = dict(has_gate=True, has_bias=False, is_transposed=False, is_concatenated=True)
    for attr, want in layout.items():
        if getattr(block.experts, attr, want) != want:
            raise ValueError(f"{fn}: block '{name}': experts.{attr} must be {want} (leanmoe's expert layout), "
                             f"got {getattr(block.experts, attr)}; the experts implementation "
                             f"(experts_implementation='leanmoe') runs every layout")


def block_spec(block: torch.nn.Module, fn: str = "leanmoe.hf", name: str = "") -> BlockSpec:
    """How leanmoe runs a supported transformers MoE block (a ValueError naming the rule otherwise)."""
    spec = SUPPORTED_BLOCKS.get(type(block).__name__)
    if spec is None:
        raise ValueError(f"{fn}: argument 'block': must be one of {', '.join(SUPPORTED_BLOCKS)}, got "
                         f"{type(block).__name__}")
    _check_swiglu(fn, name or type(block).__name__, block)
    router = getattr(block, spec[0])
    return BlockSpec(spec[0], spec[1], int(router.top_k), bool(getattr(router, "norm_topk_prob", False)))


def apply(model: torch.nn.Module, routing: str = "topk", tile: int = 128, rounding_mode: str = "nearest",
          inference_routing: str = "topk", *, router_logits: bool = False, return_stats: bool = False,
          precision: str = "storage") -> int:
    """Runs every supported MoE block of `model` through leanmoe. Returns the number of blocks.
    routing="token_rounding" is for training (docs/SPEC.md §5): a block in eval mode, or a forward under
    torch.no_grad() / torch.inference_mode(), routes with `inference_routing` (plain top-K by
    default; "token_rounding" to round there too).
    router_logits: record every forward's router logits (for aux_loss(formulation="transformers"));
    without it they are computed only when the forward asks for them (output_router_logits).
    return_stats: each forward's RouterStats per block, read with router_stats(model).
    precision: "storage" or "fp8" (the expert GEMMs in blockwise FP8, as leanmoe.moe's)."""
    routing_for_call(routing, inference_routing, True)  # validates inference_routing
    _check_precision("leanmoe.hf.apply", precision)
    blocks = [(name, block, SUPPORTED_BLOCKS[type(block).__name__]) for name, block in model.named_modules()
              if type(block).__name__ in SUPPORTED_BLOCKS]
    # Every block is checked before any is changed: a refused model is left as it was.
    for name, block, _ in blocks:
        _check_swiglu("leanmoe.hf.apply", name, block)
        w = block.experts.gate_up_proj
        reason = _fp8_widths_unmet(w.shape[2], w.shape[1] // 2) if precision == "fp8" else None
        if reason:
            raise ValueError(f"leanmoe.hf.apply: block '{name}': argument 'precision': 'fp8': {reason}")
    count = 0
    for name, block, spec in blocks:
        block._leanmoe = _Settings(name=name, router_attr=spec[0], convention=spec[1], routing=routing, tile=tile,
                                   rounding_mode=rounding_mode, inference_routing=inference_routing,
                                   router_logits=bool(router_logits), return_stats=bool(return_stats),
                                   precision=precision)
        block.forward = types.MethodType(_leanmoe_block_forward, block)
        count += 1
    if count == 0:
        raise ValueError("leanmoe.hf.apply: argument 'model': no supported MoE block found (supported: "
                         + ", ".join(SUPPORTED_BLOCKS) + "); experts_implementation='leanmoe' covers every "
                         "transformers model with decorated experts")
    return count


def remove(model: torch.nn.Module) -> int:
    """Restores the transformers forward of every block apply() changed. Returns the number of blocks."""
    count = 0
    for block in model.modules():
        if "_leanmoe" in block.__dict__:
            del block.forward  # the instance attribute; the class's forward shows through again
            del block._leanmoe
            for attr in ("leanmoe_aux_loss", "leanmoe_z_loss", "leanmoe_stats", "leanmoe_router_logits"):
                block.__dict__.pop(attr, None)
            count += 1
    return count


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """transformers' activation checkpointing, non-reentrant, under the name the installed
    transformers has: activation_checkpointing_enable (gradient_checkpointing_enable, its former
    name, warns that transformers 6 removes it) or, on older versions, gradient_checkpointing_enable.
    With leanmoe's in-backward updates each block's forward is recomputed inside backward before its
    experts are updated, so the recomputation sees the step's weights."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def is_applied(model: torch.nn.Module) -> bool:
    return any("_leanmoe" in m.__dict__ for m in model.modules())


def _leanmoe_blocks(model):
    return [b for b in model.modules() if "_leanmoe" in b.__dict__]


def aux_loss(model: torch.nn.Module, z_loss_coef: float = 0.0, formulation: str = "leanmoe") -> torch.Tensor:
    """The last forward's load-balancing loss of the leanmoe blocks (+ z_loss_coef * their z-losses).
    formulation="leanmoe": the sum over blocks of E * sum_e f_e * P_e with f_e = count / (T*K).
    formulation="transformers": load_balancing_loss_func's value for the same routing (counts / T,
    pooled over blocks; no attention mask), from router logits the forward recorded (see apply)."""
    fn = "leanmoe.hf.aux_loss"
    if formulation not in ("leanmoe", "transformers"):
        raise ValueError(f"{fn}: argument 'formulation': must be 'leanmoe' or 'transformers', got {formulation!r}")
    blocks = [b for b in model.modules() if "leanmoe_aux_loss" in b.__dict__]
    if not blocks:
        raise ValueError(f"{fn}: argument 'model': no leanmoe block has run a forward yet")
    z = sum(b.leanmoe_z_loss for b in blocks) if z_loss_coef else 0.0
    if formulation == "leanmoe":
        return sum(b.leanmoe_aux_loss for b in blocks) + z_loss_coef * z
    if any("leanmoe_router_logits" not in b.__dict__ for b in blocks):
        raise ValueError(f"{fn}: argument 'formulation': 'transformers' needs the router logits of the last "
                         "forward: run it with output_router_logits=True or apply(model, router_logits=True)")
    return transformers_aux_loss([b.leanmoe_router_logits for b in blocks],
                                 [getattr(b, b._leanmoe.router_attr).top_k for b in blocks]) + z_loss_coef * z


def transformers_aux_loss(router_logits: List[torch.Tensor], top_k: List[int]) -> torch.Tensor:
    """load_balancing_loss_func without attention mask, written out: p = softmax of each layer's
    logits [T, E]; f_e = (top-K count of e) / T and P_e = mean p_e, both pooled over the layers'
    tokens; E * sum_e f_e * P_e."""
    E = router_logits[0].shape[-1]
    device = router_logits[0].device
    counts = torch.zeros(E, dtype=torch.float32, device=device)
    prob_sum = torch.zeros(E, dtype=torch.float32, device=device)
    tokens = 0
    for logits, k in zip(router_logits, top_k):
        p = torch.softmax(logits.to(device).float(), dim=-1)
        chosen = torch.topk(p, k, dim=-1).indices.reshape(-1)
        counts = counts.scatter_add(0, chosen, torch.ones_like(chosen, dtype=torch.float32))
        prob_sum = prob_sum + p.sum(0)
        tokens += p.shape[0]
    return E * torch.sum((counts / tokens) * (prob_sum / tokens))


def router_stats(model: torch.nn.Module) -> List[Optional[RouterStats]]:
    """The last forward's RouterStats of every leanmoe block, in module order (apply(model,
    return_stats=True)); device tensors, nothing synchronised. None for a block that has not run."""
    blocks = _leanmoe_blocks(model)
    if not blocks or not all(b._leanmoe.return_stats for b in blocks):
        raise ValueError("leanmoe.hf.router_stats: argument 'model': needs leanmoe.hf.apply(model, return_stats=True)")
    return [b.__dict__.get("leanmoe_stats") for b in blocks]
