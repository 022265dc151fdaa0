"""Puts leanmoe under the MoE blocks of transformers v5 OLMoE, Qwen3-MoE and GraniteMoE models.

    n = leanmoe.hf.apply(model)          # every supported MoE block now runs leanmoe
    loss = model(**batch).loss + coef * leanmoe.hf.aux_loss(model)
    leanmoe.hf.remove(model)             # back to the transformers implementation

How: module replacement at the level of the block's forward. The block object, its router and
its experts stay in the model with the same Parameter objects (no copies, state_dict keys
unchanged); only the block's forward is swapped for one call of leanmoe.moe over
router.weight [E, d], experts.gate_up_proj [E, 2n, d] and experts.down_proj [E, d, n].
Why not a registered experts implementation (transformers' ALL_EXPERTS_FUNCTIONS): that seam
hands the experts a routing already computed by the transformers router (top_k_index,
top_k_weights), while leanmoe fuses routing, experts and the router backward into one operator
(SPEC §3-§4: it never materialises the per-pair gate tensor autograd would need). So the whole
block is replaced.

Two load-balancing losses (both unscaled; a trainer multiplies by its coefficient):
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

from .functional import RouterStats, moe, routing_for_call

# block class name -> (router attribute, router convention)
SUPPORTED_BLOCKS = {
    "OlmoeSparseMoeBlock": ("gate", "softmax_then_topk"),
    "Qwen3MoeSparseMoeBlock": ("gate", "softmax_then_topk"),
    "GraniteMoeMoE": ("router", "topk_then_softmax"),
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
    routing = routing_for_call(s.routing, s.inference_routing, self.training)
    out = moe(hidden_states, router.weight, self.experts.gate_up_proj, self.experts.down_proj, router.top_k,
              router=s.convention, norm_topk_prob=bool(getattr(router, "norm_topk_prob", False)), routing=routing,
              tile=s.tile, rounding_mode=s.rounding_mode, return_stats=s.return_stats)
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
                         f"got {type(act).__name__}")
    # transformers >= 5.2x describes its experts' layout; leanmoe takes the concatenated [gate; up]
    # SwiGLU layout of SPEC §2 without biases.
    layout = dict(has_gate=True, has_bias=False, is_transposed=False, is_concatenated=True)
    for attr, want in layout.items():
        if getattr(block.experts, attr, want) != want:
            raise ValueError(f"{fn}: block '{name}': experts.{attr} must be {want} (leanmoe's expert layout), "
                             f"got {getattr(block.experts, attr)}")


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
          inference_routing: str = "topk", *, router_logits: bool = False, return_stats: bool = False) -> int:
    """Runs every supported MoE block of `model` through leanmoe. Returns the number of blocks.
    routing="token_rounding" is for training (SPEC §5): a block in eval mode, or a forward under
    torch.no_grad() / torch.inference_mode(), routes with `inference_routing` (plain top-K by
    default; "token_rounding" to round there too).
    router_logits: record every forward's router logits (for aux_loss(formulation="transformers"));
    without it they are computed only when the forward asks for them (output_router_logits).
    return_stats: each forward's RouterStats per block, read with router_stats(model)."""
    routing_for_call(routing, inference_routing, True)  # validates inference_routing
    count = 0
    for name, block in model.named_modules():
        spec = SUPPORTED_BLOCKS.get(type(block).__name__)
        if spec is None:
            continue
        _check_swiglu("leanmoe.hf.apply", name, block)
        block._leanmoe = _Settings(router_attr=spec[0], convention=spec[1], routing=routing, tile=tile,
                                   rounding_mode=rounding_mode, inference_routing=inference_routing,
                                   router_logits=bool(router_logits), return_stats=bool(return_stats))
        block.forward = types.MethodType(_leanmoe_block_forward, block)
        count += 1
    if count == 0:
        raise ValueError("leanmoe.hf.apply: argument 'model': no supported MoE block found (supported: "
                         + ", ".join(SUPPORTED_BLOCKS) + ")")
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
