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
block is replaced. Consequence: the router's logits are not recorded (output_router_logits), and
transformers' own load-balancing loss sees none; use leanmoe.hf.aux_loss(model) instead (the
per-layer loss E·Σ f_e·P_e, summed over layers).
"""
import types

import torch

from .functional import moe, routing_for_call

# block class name -> (router attribute, router convention)
SUPPORTED_BLOCKS = {
    "OlmoeSparseMoeBlock": ("gate", "softmax_then_topk"),
    "Qwen3MoeSparseMoeBlock": ("gate", "softmax_then_topk"),
    "GraniteMoeMoE": ("router", "topk_then_softmax"),
}


class _Settings(types.SimpleNamespace):
    pass


def _leanmoe_block_forward(self, hidden_states):
    s = self._leanmoe
    router = getattr(self, s.router_attr)
    routing = routing_for_call(s.routing, s.inference_routing, self.training)
    out = moe(hidden_states, router.weight, self.experts.gate_up_proj, self.experts.down_proj, router.top_k,
              router=s.convention, norm_topk_prob=bool(getattr(router, "norm_topk_prob", False)), routing=routing,
              tile=s.tile, rounding_mode=s.rounding_mode)
    self.leanmoe_aux_loss, self.leanmoe_z_loss = out.aux_loss, out.z_loss
    return out.output


def _check_swiglu(name, block):
    act = getattr(block.experts, "act_fn", None)
    probe = torch.linspace(-4, 4, 17)
    if act is None or not torch.allclose(act(probe), torch.nn.functional.silu(probe)):
        raise ValueError(f"leanmoe.hf.apply: block '{name}': experts activation must be SiLU (SwiGLU experts), "
                         f"got {type(act).__name__}")


def apply(model: torch.nn.Module, routing="topk", tile=128, rounding_mode="nearest",
          inference_routing="topk") -> int:
    """Runs every supported MoE block of `model` through leanmoe. Returns the number of blocks.
    routing="token_rounding" is for training (SPEC §5): a block in eval mode, or a forward under
    torch.no_grad() / torch.inference_mode(), routes with `inference_routing` (plain top-K by
    default; "token_rounding" to round there too)."""
    routing_for_call(routing, inference_routing, True)  # validates inference_routing
    count = 0
    for name, block in model.named_modules():
        spec = SUPPORTED_BLOCKS.get(type(block).__name__)
        if spec is None:
            continue
        _check_swiglu(name, block)
        block._leanmoe = _Settings(router_attr=spec[0], convention=spec[1], routing=routing, tile=tile,
                                   rounding_mode=rounding_mode, inference_routing=inference_routing)
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
            for attr in ("leanmoe_aux_loss", "leanmoe_z_loss"):
                block.__dict__.pop(attr, None)
            count += 1
    return count


def is_applied(model: torch.nn.Module) -> bool:
    return any("_leanmoe" in m.__dict__ for m in model.modules())


def aux_loss(model: torch.nn.Module, z_loss_coef: float = 0.0) -> torch.Tensor:
    """Sum over leanmoe blocks of the last forward's load-balancing loss (+ z_loss_coef * z-loss)."""
    total = None
    for block in model.modules():
        if "leanmoe_aux_loss" in block.__dict__:
            term = block.leanmoe_aux_loss + z_loss_coef * block.leanmoe_z_loss
            total = term if total is None else total + term
    if total is None:
        raise ValueError("leanmoe.hf.aux_loss: argument 'model': no leanmoe block has run a forward yet")
    return total
