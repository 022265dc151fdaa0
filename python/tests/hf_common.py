"""Helpers shared by the transformers tests (test_hf_experts.py, hf_family_sweep.py)."""
import torch


def run(model, b, seed=0):
    """Forward + backward of the loss, with the model's router logits (its load-balancing loss) when it has them."""
    torch.manual_seed(seed)  # Phi-MoE's sparsemixer and router jitter draw random numbers in training
    kwargs = dict(output_router_logits=True) if hasattr(model.config, "output_router_logits") else {}
    out = model(**b, **kwargs)
    out.loss.backward()
    return out


def rel(a, b):
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "down_proj")]
