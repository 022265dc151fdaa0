"""leanmoe.ep under torch.distributed: 2 CPU processes (gloo) against one process running
leanmoe.MoE on the same weights and the concatenated batch."""
import datetime
import os
import socket
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")

P, T_PER_RANK, d, n, E, K = 2, 24, 32, 16, 8, 2
# fp32 storage, fp32 accumulation on both sides; EP sums every expert's rows in the single-rank
# order (docs/ep.md) but BLAS chooses kernels by shape (router GEMM over 24 vs 48 rows) and
# d_router is summed per rank then across ranks: differences are a few ulps of sums over <= 48
# terms of O(1) values, ~1e-6 relative; 1e-5 relative with an absolute floor leaves 10x margin.
RTOL, ATOL = 1e-5, 1e-5


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _leave_worker():
    """Ends an mp.spawn worker whose results are saved and whose process group is destroyed. With
    torch 2.15 a gloo rank sometimes aborts at interpreter exit after both ("terminate called without
    an active exception", no Python frame; 1 run in ~5 of test_ddp.py after test_compile.py), which
    fails the spawn though the results are on disk; so the worker leaves without that teardown.
    A worker that fails before it is called still fails."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# precision="fp8" (bfloat16, d and n multiples of 128); T = 2 * 37 tokens, not a multiple of 128.
FP8 = dict(d=128, n=128, T_PER_RANK=37, precision="fp8", dtype=torch.bfloat16)


def _weights_and_batch(d=d, n=n, T_PER_RANK=T_PER_RANK, dtype=torch.float32, **_):
    g = torch.Generator().manual_seed(7)
    router = torch.randn(E, d, generator=g) / d ** 0.5
    gate_up = torch.randn(E, 2 * n, d, generator=g) / d ** 0.5
    down = torch.randn(E, d, n, generator=g) / n ** 0.5
    x = torch.randn(P * T_PER_RANK, d, generator=g)
    d_out = torch.randn(P * T_PER_RANK, d, generator=g)
    return [t.to(dtype) for t in (router, gate_up, down, x, d_out)]


def _worker(rank, port, result_dir, router_convention, shape=None):
    import leanmoe.ep

    shape = shape or {}
    T_r = shape.get("T_PER_RANK", T_PER_RANK)
    tokens = shape.get("tokens", (T_r,) * P)  # this rank's rows of the batch, in rank order
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P,
                            timeout=datetime.timedelta(seconds=60))  # a hung peer fails the test
    try:
        router, gate_up, down, x, d_out = _weights_and_batch(**shape)
        moe = leanmoe.ep.ExpertParallelMoE(shape.get("d", d), shape.get("n", n), E, K, router=router_convention,
                                           precision=shape.get("precision", "storage"), dtype=shape.get("dtype"))
        moe.load_global_weights(router, gate_up, down)
        rows = slice(sum(tokens[:rank]), sum(tokens[:rank + 1]))
        x_r = x[rows].clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=shape.get("autocast", False)):
            out = moe(x_r)
        out.backward(d_out[rows])
        norm = leanmoe.ep.global_grad_norm([moe.gate_up_proj, moe.down_proj], [moe.router.weight])
        result = dict(out=out.detach(), dx=x_r.grad, d_router=moe.router.weight.grad.clone(),
                      d_gate_up=moe.gate_up_proj.grad.clone(), d_down=moe.down_proj.grad.clone(), norm=norm,
                      first=moe.first_expert, El=moe.local_experts)
        result["clip_norm"] = leanmoe.ep.clip_grad_norm_(moe, max_norm=0.5 * norm.item())
        result["clipped_d_down"] = moe.down_proj.grad
        torch.save(result, os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    _leave_worker()


# (24, 0): a rank without tokens (an uneven last batch) still serves its experts and joins every
# collective; the reference is rank 0's batch alone.
@pytest.mark.parametrize("router_convention, tokens", [("softmax_then_topk", (24, 24)), ("topk_then_softmax", (24, 24)),
                                                      ("softmax_then_topk", (24, 0))])
def test_ep_matches_single_process(router_convention, tokens):
    import leanmoe

    with tempfile.TemporaryDirectory() as result_dir:
        mp.spawn(_worker, args=(_free_port(), result_dir, router_convention, dict(tokens=tokens)), nprocs=P,
                 join=True)
        results = [torch.load(os.path.join(result_dir, f"rank{r}.pt")) for r in range(P)]

    router, gate_up, down, x, d_out = _weights_and_batch()
    x, d_out = x[:sum(tokens)], d_out[:sum(tokens)]
    ref = leanmoe.MoE(d, n, E, K, router=router_convention)
    with torch.no_grad():
        ref.router.weight.copy_(router)
        ref.gate_up_proj.copy_(gate_up)
        ref.down_proj.copy_(down)
    x = x.requires_grad_()
    out = ref(x).output
    out.backward(d_out)
    ref_norm = torch.cat([p.grad.flatten() for p in ref.parameters()]).norm()
    ref_grads = {name: p.grad.clone() for name, p in ref.named_parameters()}
    torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=0.5 * ref_norm.item())

    def close(actual, expected):
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)

    close(torch.cat([r["out"] for r in results]), out.detach())
    close(torch.cat([r["dx"] for r in results]), x.grad)
    for r in results:
        s = slice(r["first"], r["first"] + r["El"])
        close(r["d_router"], ref_grads["router.weight"])  # all-reduced: the whole batch's gradient on every rank
        close(r["d_gate_up"], ref_grads["gate_up_proj"][s])
        close(r["d_down"], ref_grads["down_proj"][s])
        close(r["norm"], ref_norm)
        close(r["clip_norm"], ref_norm)
        close(r["clipped_d_down"], ref.down_proj.grad[s])  # the same scale on every rank as on one
    assert results[0]["first"] == 0 and results[1]["first"] == E // P


@pytest.mark.parametrize("autocast", [False, True])
def test_ep_fp8_matches_single_process(autocast):
    """precision="fp8": both sides quantize the same token rows and expert blocks (docs/ep.md), so
    EP equals one process in FP8 up to what bf16 storage alone allows: gates differing in the last
    fp32 bit (the router GEMM's shape) can flip a bf16 rounding, and d_router is rounded to bf16 on
    each rank before the all-reduce. Norm-wise 1e-2 (tests/test_ep.cpp measures <= 2.4e-3, d_router;
    the expert gradients bitwise); FP8 against bf16 is several percent off, checked too.
    autocast: an fp32 EP layer under torch.autocast to bf16 follows it as leanmoe.MoE does (x and the
    weights cast to bf16 for the call: the same bf16 values as the one-process layer's)."""
    import leanmoe

    shape = dict(FP8, dtype=torch.float32, autocast=True) if autocast else FP8
    with tempfile.TemporaryDirectory() as result_dir:
        mp.spawn(_worker, args=(_free_port(), result_dir, "softmax_then_topk", shape), nprocs=P, join=True)
        results = [torch.load(os.path.join(result_dir, f"rank{r}.pt")) for r in range(P)]

    router, gate_up, down, x, d_out = _weights_and_batch(**FP8)

    def single(precision):
        ref = leanmoe.MoE(FP8["d"], FP8["n"], E, K, precision=precision, dtype=torch.bfloat16)
        with torch.no_grad():
            ref.router.weight.copy_(router)
            ref.gate_up_proj.copy_(gate_up)
            ref.down_proj.copy_(down)
        xr = x.clone().requires_grad_()
        out = ref(xr).output
        out.backward(d_out)
        return out.detach(), xr.grad, {name: p.grad for name, p in ref.named_parameters()}

    out, dx, grads = single("fp8")

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    assert rel(torch.cat([r["out"] for r in results]), out) < 1e-2
    assert rel(torch.cat([r["dx"] for r in results]), dx) < 1e-2
    for r in results:
        s = slice(r["first"], r["first"] + r["El"])
        assert rel(r["d_router"], grads["router.weight"]) < 1e-2
        assert rel(r["d_gate_up"], grads["gate_up_proj"][s]) < 1e-2
        assert rel(r["d_down"], grads["down_proj"][s]) < 1e-2
    out_bf16, dx_bf16, _ = single("storage")
    assert rel(torch.cat([r["out"] for r in results]), out_bf16) > 1e-2
    assert rel(torch.cat([r["dx"] for r in results]), dx_bf16) > 1e-2


def test_ep_layer_arguments_are_checked_at_construction():
    """What the layer could never run is refused by its constructor, by name (no process group needed:
    checked before the group is read), as leanmoe.MoE's."""
    import leanmoe.ep

    with pytest.raises(ValueError, match=r"ExpertParallelMoE: argument 'precision': must be one of \('storage', "
                                         r"'fp8'\), got 'FP8'"):
        leanmoe.ep.ExpertParallelMoE(128, 128, 4, 2, precision="FP8")
    with pytest.raises(ValueError, match=r"ExpertParallelMoE: argument 'd': must be a multiple of 128 with "
                                         r"precision='fp8'.*got 64"):
        leanmoe.ep.ExpertParallelMoE(64, 128, 4, 2, precision="fp8")


def test_ep_has_no_second_derivative_and_says_so():
    """As leanmoe.moe: a gradient taken with create_graph=True raises leanmoe's message when it is
    differentiated again (one rank: the layer's backward is the same for any number of ranks)."""
    import leanmoe.ep

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        m = leanmoe.ep.ExpertParallelMoE(d, n, E, K)
        x = torch.randn(6, d, requires_grad=True)
        g, = torch.autograd.grad(m(x).square().sum(), x, create_graph=True)
        with pytest.raises(RuntimeError, match="no second derivative"):
            g.sum().backward()
    finally:
        dist.destroy_process_group()
