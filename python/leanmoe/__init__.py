"""leanmoe for PyTorch: a memory-lean Mixture-of-Experts layer (fused routing with top-K or
token-rounding, or routing given by the caller; gated or plain experts, biases, every weight
layout) with in-backward expert updates (leanmoe.optim) and a bridge to transformers v5 MoE
models (leanmoe.hf: the "leanmoe" experts implementation, and the fused-router block)."""
from importlib import metadata as _metadata

import torch  # noqa: F401  (loads torch's libraries before the extension)

from . import _ops
from ._ops import cuda_available, max_routed_rows
from .functional import MoEOutput, MoEOutputWithStats, RouterStats, moe, moe_routed
from .module import MoE
from . import optim

__all__ = ["MoE", "MoEOutput", "MoEOutputWithStats", "RouterStats", "moe", "moe_routed", "optim", "cuda_available",
           "max_routed_rows"]
__version__ = _metadata.version("leanmoe")  # pyproject.toml's
