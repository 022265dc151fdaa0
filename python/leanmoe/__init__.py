"""leanmoe for PyTorch: a memory-lean Mixture-of-Experts layer (fused routing, SwiGLU experts,
top-K or token-rounding routing) with in-backward expert updates (leanmoe.optim) and a bridge to
transformers v5 MoE models (leanmoe.hf)."""
import torch  # noqa: F401  (loads torch's libraries before the extension)

from . import _ops
from ._ops import cuda_available, max_routed_rows
from .functional import MoEOutput, MoEOutputWithStats, RouterStats, moe
from .module import MoE
from . import optim

__all__ = ["MoE", "MoEOutput", "MoEOutputWithStats", "RouterStats", "moe", "optim", "cuda_available",
           "max_routed_rows"]
__version__ = "0.1.0"
