"""bench/hf_step_bench.py's memory logic on the CPU: the phases train_step marks (the head_backward
window holds no expert gradient, the end of backward holds all of them in mode (l) and none in (i)),
PhaseMemory's per-phase windows, and the verdict on the in-backward saving."""
import os
import sys
import types

import pytest
import torch

pytest.importorskip("transformers.integrations.moe")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import hf_step_bench as bench  # noqa: E402
from leanmoe.optim import ExpertAdamW, expert_parameters  # noqa: E402

ARGS = types.SimpleNamespace(device="cpu", tiny=True, layers=0, seq=32, batch=2, aux_coef=0.0, grad_ckpt=False)


@pytest.mark.parametrize("mode", ["l", "i"])
def test_train_step_marks_each_phase_once_in_order(mode):
    model, _ = bench.build("qwen3_30b", mode, ARGS, torch.float32)
    optimizers, clipped = bench.make_optimizers(model, mode, ARGS)
    weights = [p for p in expert_parameters(model) if p.dim() == 3]
    ids = torch.randint(0, model.config.vocab_size, (ARGS.batch, ARGS.seq), generator=torch.Generator().manual_seed(0))
    seen = []

    def mark(phase):
        seen.append((phase, sum(p.grad is not None for p in weights)))

    for _ in range(2):
        bench.train_step(model, mode, ARGS, optimizers, clipped, ids, mark)
    with_grads = len(weights) if mode == "l" else 0  # (i): updated in backward, never in .grad
    assert seen == 2 * [("forward", 0), ("head_backward", 0), ("layers_backward", with_grads), ("optimizer", 0)]
    bench.train_step(model, mode, ARGS, optimizers, clipped, ids)  # no mark: no hook left behind
    assert len(seen) == 8
    for opt in optimizers:
        if isinstance(opt, ExpertAdamW):
            opt.release()


def test_phase_memory_keeps_each_phase_peak_and_end():
    state = dict(allocated=0, peak=0, resets=0)

    def reset():
        state["resets"] += 1
        state["peak"] = state["allocated"]

    memory = bench.PhaseMemory(lambda: state["allocated"], lambda: state["peak"], reset)
    gib = 2**30
    for step in range(2):  # (allocated at the phase's end, peak within it), step 1 lower except one
        for phase, end, peak in (("forward", 8, 15), ("head_backward", 4, 17 - step), ("layers_backward", 6 + step, 8),
                                 ("optimizer", 0, 6)):
            state["allocated"], state["peak"] = end * gib, max(state["peak"], peak * gib)
            memory(phase)
    assert state["resets"] == 8
    # The optimizer window of step 1 starts with 7 GiB allocated: its peak is that, not the 6 given.
    assert memory.peak == {"forward": 15, "head_backward": 17, "layers_backward": 8, "optimizer": 7}
    assert memory.end == {"forward": 8, "head_backward": 4, "layers_backward": 7, "optimizer": 0}
    assert memory.step_peak() == 17 and memory.peak_phase() == "head_backward"


def result(mode, peak, after_backward, layers_peak, phase="head_backward"):
    phases = dict(forward=15.0, head_backward=peak, layers_backward=layers_peak, optimizer=after_backward)
    return dict(mode=mode, experts="leanmoe", step_s=0.1, tokens_per_s=1.0, peak_gib=peak, resident_gib=17.5,
                peak_phase=phase, after_backward_gib=after_backward, phase_peak_gib=phases,
                phase_end_gib=dict(phases), expert_grad_gib=4.5, expert_grad_gib_not_held=3.75, losses=[12.3])


def test_verdict_judges_the_saving_at_the_end_of_backward():
    res = dict(g=result("g", 37.5, 24.0, 9.0), l=result("l", 35.0, 23.3, 25.5), i=result("i", 35.0, 18.8, 24.2))
    v = bench.verdict(res)
    assert v["saving_gib"] == 0.0 and v["peak_phase"] == "head_backward"
    assert v["end_saving_gib"] == pytest.approx(4.5) and v["expected_gib"] == 4.5 and v["saving_pass"]
    assert v["layers_saving_gib"] == pytest.approx(1.3)
    res["i"]["after_backward_gib"] = 23.3  # the expert gradients held after all: a failure
    assert not bench.verdict(res)["saving_pass"]
    res["verdict"] = bench.verdict(res)
    meta = dict(gpu="cpu", command="c", commit="x", date="d", torch="t", transformers="t", leanmoe="0", dtype="bf16")
    args = types.SimpleNamespace(batch=4, seq=2048, warmup=1, steps=3, repeat=1, aux_coef=0.0, grad_ckpt=False)
    table = bench.markdown(meta, {"qwen3_30b": res}, args)
    assert "| Qwen3-30B-A3B | i | leanmoe | 100.0 |" in table and "| head_backward | 0.00 | 1.30 | 0.00 | 4.50 |" in table
