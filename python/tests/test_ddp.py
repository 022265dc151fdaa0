"""A model holding leanmoe layers under DistributedDataParallel (2 CPU processes, gloo): expert
gradients must be averaged across ranks before any update, so an in-backward ExpertAdamW (which
would step each rank's weights with its own gradient inside backward) takes the standard path
there, and training matches DDP with the standard optimizer bit for bit on every rank."""
import datetime
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from test_ep_dist import _free_port, _leave_worker

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")

P, STEPS = 2, 3


def _worker(rank, port, result_dir, in_backward, find_unused, no_sync):
    import warnings

    import leanmoe
    from leanmoe.optim import ExpertAdamW, dense_parameters, expert_parameters

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P,
                            timeout=datetime.timedelta(seconds=60))  # a hung peer fails the test
    try:
        torch.manual_seed(0)  # the same initial weights on every rank
        net = torch.nn.ModuleDict({"inp": torch.nn.Linear(32, 32), "moe": leanmoe.MoE(32, 16, 4, 2)})
        outside = leanmoe.MoE(32, 16, 4, 2)  # called in the DDP forward, not DDP's: its own in-backward updates
        outside_opt = ExpertAdamW(expert_parameters(outside), lr=1e-2)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, x):
                o = self.net["moe"](self.net["inp"](x))
                return o.output.square().mean() + 0.01 * o.aux_loss + outside(x).output.square().mean()

        model = torch.nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=find_unused)
        experts = ExpertAdamW(expert_parameters(model), lr=1e-2, in_backward=in_backward)
        dense = torch.optim.AdamW(dense_parameters(model), lr=1e-2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(STEPS):
                g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batch
                if no_sync:  # two micro-batches, gradients synchronised in the second backward
                    with model.no_sync():
                        model(torch.randn(8, 32, generator=g)).backward()
                    outside_opt.step()
                model(torch.randn(8, 32, generator=g)).backward()
                assert outside.gate_up_proj.grad is None and outside.down_proj.grad is None
                outside_opt.step()
                experts.step()
                dense.step()
                experts.zero_grad()
                dense.zero_grad()
        result = {name: p.detach().clone() for name, p in net.named_parameters()}
        result["warnings"] = [str(w.message) for w in caught if "DistributedDataParallel" in str(w.message)]
        torch.save(result, os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    _leave_worker()


def _train(in_backward, find_unused=False, no_sync=False):
    with tempfile.TemporaryDirectory() as result_dir:
        mp.spawn(_worker, args=(_free_port(), result_dir, in_backward, find_unused, no_sync), nprocs=P)
        return [torch.load(os.path.join(result_dir, f"rank{r}.pt")) for r in range(P)]


@pytest.mark.parametrize("find_unused, no_sync", [(False, False), (True, False), (False, True)])
def test_in_backward_under_ddp_matches_standard_on_every_rank(find_unused, no_sync):
    standard = _train(False, find_unused, no_sync)
    in_backward = _train(True, find_unused, no_sync)
    for name in ("moe.gate_up_proj", "moe.down_proj", "moe.router.weight", "inp.weight"):
        assert torch.equal(standard[0][name], standard[1][name]), f"{name}: ranks differ (standard)"
        assert torch.equal(in_backward[0][name], in_backward[1][name]), f"{name}: ranks diverged (in-backward)"
        assert torch.equal(standard[0][name], in_backward[0][name]), f"{name}: in-backward differs from standard"
    assert in_backward[0]["warnings"], "the fallback to the standard path must be said"
    assert not standard[0]["warnings"]
