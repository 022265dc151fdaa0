"""leanmoe.MoE: the MoE layer as an nn.Module with the transformers v5 parameter names and layout."""
import math
from typing import Optional, Union

import torch
from torch import nn

from . import _fp8_codes
from ._ops import PRECISIONS
from .functional import (ROUNDING_MODES, ROUTERS, ROUTINGS, STORAGE_DTYPES, _WHY_NOT_F64, MoEOutput,
                         MoEOutputWithStats, _check_fp8_widths, moe, routing_for_call)


def _choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"leanmoe.MoE: argument '{name}': must be one of {allowed}, got {value!r}")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"leanmoe.MoE: argument '{name}': must be an int > 0, got {value!r}")


class MoE(nn.Module):
    """A Mixture-of-Experts layer with SwiGLU experts.

    Parameters (HF transformers v5 names and layout, so checkpoints load without copies):
      router.weight  [E, d]
      gate_up_proj   [E, 2n, d]   rows 0..n-1 gate, rows n..2n-1 up
      down_proj      [E, d, n]
    forward(x [..., d]) -> MoEOutput(output [..., d], aux_loss, z_loss); the losses are unscaled
    (a trainer adds coef * loss). With return_stats=True: MoEOutputWithStats, whose ``stats``
    (leanmoe.RouterStats) has per-expert rows and top-K counts, the pairs token rounding dropped or
    added and the tokens left without an expert, as device tensors (no host synchronisation).

    routing="token_rounding" applies to training forwards only: in eval mode, under
    torch.no_grad() or torch.inference_mode() the layer routes with ``inference_routing``
    ("topk" by default, docs/SPEC.md §5; "token_rounding" to round there too).

    precision="fp8" runs the up, down, dH and dX expert GEMMs on e4m3 operands with block scales
    (dtype=torch.bfloat16, d and n multiples of 128; docs/DESIGN.md "FP8"). With fp8_weight_codes
    (the default) the layer keeps its weights' FP8 codes in buffers (``gate_up_proj_fp8``, ...; the
    bf16 weights' bytes again, not in state_dict) and no forward or backward quantizes a weight:
    leanmoe.optim.ExpertAdamW rewrites them in its update pass, and the layer writes them again
    before a call when the weights changed otherwise (load_state_dict, in-place edits, another
    optimizer, .to(); writes through ``.data`` are not seen: call ``refresh_fp8_codes()``). Under
    torch.compile the layer quantizes the weights per call. fp8_weight_codes=False: every call
    quantizes the weights (the same codes, bit for bit; no buffers). ExpertAdamW steps the expert
    weights of an fp8 layer with leanmoe's fused update either way (python/README.md "FP8").

    A transformers MoE block's state_dict (keys ``gate.weight`` or ``router.weight``,
    ``experts.gate_up_proj``, ``experts.down_proj``) loads directly; ``MoE.from_hf_block(block)``
    builds the matching layer (convention, K, norm_topk_prob) with a copy of the block's weights.
    """

    def __init__(self, d: int, n: int, E: int, K: int, router: str = "softmax_then_topk", routing: str = "topk", *,
                 norm_topk_prob: bool = False, tile: int = 128, rounding_mode: str = "nearest",
                 inference_routing: str = "topk", return_stats: bool = False, precision: str = "storage",
                 fp8_weight_codes: bool = True, device: Optional[Union[torch.device, str]] = None,
                 dtype: Optional[torch.dtype] = None):
        super().__init__()
        for name, value in (("d", d), ("n", n), ("E", E), ("K", K), ("tile", tile)):
            _positive_int(name, value)
        if not 0 < K <= E:
            raise ValueError(f"leanmoe.MoE: argument 'K': must be in 1..E = {E}, got {K}")
        _choice("router", router, ROUTERS)
        _choice("routing", routing, ROUTINGS)
        _choice("rounding_mode", rounding_mode, ROUNDING_MODES)
        _choice("inference_routing", inference_routing, ROUTINGS)
        if dtype is not None and dtype not in STORAGE_DTYPES:
            why = f" ({_WHY_NOT_F64})" if dtype == torch.float64 else ""
            raise ValueError(f"leanmoe.MoE: argument 'dtype': must be torch.bfloat16 or torch.float32{why}, "
                             f"got {dtype}")
        self.d, self.n, self.E, self.K = d, n, E, K
        self.router_convention, self.routing = router, routing
        self.norm_topk_prob, self.tile, self.rounding_mode = bool(norm_topk_prob), tile, rounding_mode
        self.inference_routing, self.return_stats = inference_routing, bool(return_stats)
        self.precision = precision
        factory = dict(device=device, dtype=dtype)
        self.router = nn.Linear(d, E, bias=False, **factory)
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * n, d, **factory))
        self.down_proj = nn.Parameter(torch.empty(E, d, n, **factory))
        self.reset_parameters()
        self._register_load_state_dict_pre_hook(_rename_hf_block_keys)
        self.fp8_weight_codes = bool(fp8_weight_codes)
        if precision == "fp8":
            _fp8_codes.register(self)

    @property
    def precision(self) -> str:
        return self._precision

    @precision.setter
    def precision(self, value: str) -> None:
        # May change after construction (examples/train_lm.py validates in the other precision): the
        # code buffers are set up when the layer first becomes fp8.
        _choice("precision", value, PRECISIONS)
        _check_fp8_widths("leanmoe.MoE", value, self.d, self.n)
        self._precision = value
        if value == "fp8" and "_fp8_stamps" not in self.__dict__:
            self._fp8_stamps = _fp8_codes.Stamps()  # weight name -> what its codes were written from
            for name in _fp8_codes.EXPERT_WEIGHTS:
                for suffix in _fp8_codes.CODE_BUFFERS:  # allocated at first use, on the weights' device
                    self.register_buffer(f"{name}_{suffix}", None, persistent=False)

    def reset_parameters(self) -> None:
        # N(0, 1/fan_in) for every matrix, so activations keep their scale through the layer.
        with torch.no_grad():
            self.router.weight.normal_(0, 1 / math.sqrt(self.d))
            self.gate_up_proj.normal_(0, 1 / math.sqrt(self.d))
            self.down_proj.normal_(0, 1 / math.sqrt(self.n))

    def forward(self, x: torch.Tensor) -> Union[MoEOutput, MoEOutputWithStats]:
        routing = routing_for_call(self.routing, self.inference_routing, self.training)
        fp8_weights = _fp8_codes.codes_for_call(self) if self.precision == "fp8" else None
        return moe(x, self.router.weight, self.gate_up_proj, self.down_proj, self.K, router=self.router_convention,
                   norm_topk_prob=self.norm_topk_prob, routing=routing, tile=self.tile,
                   rounding_mode=self.rounding_mode, return_stats=self.return_stats, precision=self.precision,
                   _fp8_weights=fp8_weights)

    def refresh_fp8_codes(self) -> None:
        """Writes the FP8 codes of the current weights now (precision="fp8" with fp8_weight_codes).
        Needed only after a write torch's version counter does not see (through ``weight.data``, or
        outside torch); every other change of the weights is found before the next call."""
        if self.precision == "fp8":
            _fp8_codes.refresh(self)

    @classmethod
    def from_hf_block(cls, block: nn.Module, **kwargs) -> "MoE":
        """A leanmoe.MoE computing what a transformers v5 MoE block (OlmoeSparseMoeBlock,
        Qwen3MoeSparseMoeBlock, GraniteMoeMoE, MixtralSparseMoeBlock: leanmoe.hf.SUPPORTED_BLOCKS)
        computes, on the block's device and dtype, with a copy of its weights (Mixtral's training-time
        router jitter is not part of the layer). kwargs (routing, tile, rounding_mode, precision,
        fp8_weight_codes, inference_routing, return_stats) go to the constructor."""
        from .hf import block_spec  # late import: hf imports functional

        spec = block_spec(block, "leanmoe.MoE.from_hf_block")
        w1 = block.experts.gate_up_proj
        E, two_n, d = w1.shape
        layer = cls(d, two_n // 2, E, spec.top_k, router=spec.convention, norm_topk_prob=spec.norm_topk_prob,
                    device=w1.device, dtype=w1.dtype, **kwargs)
        layer.load_state_dict(block.state_dict())
        return layer

    def extra_repr(self) -> str:
        s = (f"d={self.d}, n={self.n}, E={self.E}, K={self.K}, router={self.router_convention}, "
             f"norm_topk_prob={self.norm_topk_prob}, routing={self.routing}")
        if self.routing == "token_rounding":
            s += f", tile={self.tile}, rounding_mode={self.rounding_mode}, inference_routing={self.inference_routing}"
        if self.precision != "storage":
            s += f", precision={self.precision}"
            if not self.fp8_weight_codes:
                s += ", fp8_weight_codes=False"
        return s


# A transformers block's keys -> this module's (the router is `gate` in OLMoE and Qwen3-MoE, `router`
# in GraniteMoe; the experts live in an `experts` submodule).
_HF_BLOCK_KEYS = {"gate.weight": "router.weight", "experts.gate_up_proj": "gate_up_proj",
                  "experts.down_proj": "down_proj"}


def _rename_hf_block_keys(state_dict, prefix, *args):
    for hf_key, key in _HF_BLOCK_KEYS.items():
        if prefix + hf_key in state_dict and prefix + key not in state_dict:
            state_dict[prefix + key] = state_dict.pop(prefix + hf_key)
