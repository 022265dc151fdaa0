"""What the training examples share: leanmoe's two optimizers driven as one, and peak memory.

MoEOptimizers(model, lr, schedule, in_backward=...) holds
- leanmoe.optim.ExpertAdamW over the batched expert tensors (gate_up_proj, down_proj of every
  layer), stepped inside backward when in_backward=True;
- torch.optim.AdamW over every other ("dense") parameter, weight decay on matrices only;
- one LR schedule (a factor of the step index, for torch's LambdaLR) for both.
step() clips the dense gradients by their global norm, then steps both optimizers and the
schedule. Expert gradients are never clipped: with in-backward updates they are applied and
freed before the global norm is known (docs/SPEC.md §6), and the standard mode does the same so that the
two modes stay bitwise identical.
"""
import resource

import torch

from leanmoe.optim import ExpertAdamW, dense_parameters, expert_parameters


class MoEOptimizers:
    def __init__(self, model, lr, schedule, *, in_backward, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8,
                 clip=1.0, fused=False):
        self.dense_params = dense_parameters(model)
        decay = [p for p in self.dense_params if p.dim() >= 2]
        no_decay = [p for p in self.dense_params if p.dim() < 2]  # norm gains
        self.experts = ExpertAdamW(expert_parameters(model), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                   in_backward=in_backward)
        self.dense = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                        {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas, eps=eps,
                                       fused=fused)
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in (self.experts, self.dense)]
        self.clip = clip

    def step(self):
        """Ends a training step (after loss.backward()). Returns the dense gradients' norm before clipping."""
        norm = torch.nn.utils.clip_grad_norm_(self.dense_params, self.clip if self.clip else float("inf"))
        self.experts.step()
        self.dense.step()
        for s in self.schedulers:
            s.step()
        self.experts.zero_grad(set_to_none=True)
        self.dense.zero_grad(set_to_none=True)
        return norm

    @property
    def lr(self):
        return self.dense.param_groups[0]["lr"]

    def state_dict(self):
        return {"experts": self.experts.state_dict(), "dense": self.dense.state_dict(),
                "schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state):
        self.experts.load_state_dict(state["experts"])
        self.dense.load_state_dict(state["dense"])
        for s, sd in zip(self.schedulers, state["schedulers"]):
            s.load_state_dict(sd)

    def release(self):
        """Ends in-backward updates of this model's expert tensors (another optimizer may take them)."""
        self.experts.release()


def reset_peak_memory(device):
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib(device):
    """CUDA: peak allocated since reset_peak_memory. CPU: the process's resident high-water mark (not resettable)."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
