"""leanmoe.MoE: the MoE layer as an nn.Module with the transformers v5 parameter names and layout."""
import math

import torch
from torch import nn

from .functional import MoEOutput, moe, routing_for_call


class MoE(nn.Module):
    """A Mixture-of-Experts layer with SwiGLU experts.

    Parameters (HF transformers v5 names and layout, so checkpoints load without copies):
      router.weight  [E, d]
      gate_up_proj   [E, 2n, d]   rows 0..n-1 gate, rows n..2n-1 up
      down_proj      [E, d, n]
    forward(x [..., d]) -> MoEOutput(output [..., d], aux_loss, z_loss); the losses are unscaled
    (a trainer adds coef * loss).

    routing="token_rounding" applies to training forwards only: in eval mode, under
    torch.no_grad() or torch.inference_mode() the layer routes with ``inference_routing``
    ("topk" by default, SPEC §5; "token_rounding" to round there too).
    """

    def __init__(self, d, n, E, K, router="softmax_then_topk", routing="topk", *, norm_topk_prob=False, tile=128,
                 rounding_mode="nearest", inference_routing="topk", device=None, dtype=None):
        super().__init__()
        if not 0 < K <= E:
            raise ValueError(f"leanmoe.MoE: argument 'K': must be in 1..E = {E}, got {K}")
        self.d, self.n, self.E, self.K = d, n, E, K
        self.router_convention, self.routing = router, routing
        self.norm_topk_prob, self.tile, self.rounding_mode = norm_topk_prob, tile, rounding_mode
        routing_for_call(routing, inference_routing, True)  # validates inference_routing
        self.inference_routing = inference_routing
        factory = dict(device=device, dtype=dtype)
        self.router = nn.Linear(d, E, bias=False, **factory)
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * n, d, **factory))
        self.down_proj = nn.Parameter(torch.empty(E, d, n, **factory))
        self.reset_parameters()

    def reset_parameters(self):
        # N(0, 1/fan_in) for every matrix, so activations keep their scale through the layer.
        with torch.no_grad():
            self.router.weight.normal_(0, 1 / math.sqrt(self.d))
            self.gate_up_proj.normal_(0, 1 / math.sqrt(self.d))
            self.down_proj.normal_(0, 1 / math.sqrt(self.n))

    def forward(self, x) -> MoEOutput:
        routing = routing_for_call(self.routing, self.inference_routing, self.training)
        return moe(x, self.router.weight, self.gate_up_proj, self.down_proj, self.K, router=self.router_convention,
                   norm_topk_prob=self.norm_topk_prob, routing=routing, tile=self.tile,
                   rounding_mode=self.rounding_mode)

    def extra_repr(self):
        return (f"d={self.d}, n={self.n}, E={self.E}, K={self.K}, router={self.router_convention}, "
                f"routing={self.routing}" + (f", tile={self.tile}" if self.routing == "token_rounding" else ""))
