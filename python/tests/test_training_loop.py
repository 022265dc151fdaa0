"""What a training loop sends the layer (issue 14): token rounding with few tokens and in eval mode,
empty batches, bad arguments, autocast, double backward, optimizer lifetime and arguments, the
transformers aux loss, router statistics and checkpoints from transformers blocks."""
import copy

import pytest
import torch

import leanmoe
from conftest import widths
from reference import moe_reference
from test_ops import close, make_layer


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


# ---- token rounding (item 1) ----
@pytest.mark.parametrize("mode", ["nearest", "up", "down"])
def test_token_rounding_with_fewer_tokens_than_the_tile(mode, device):
    """T = 100 < tile = 128: the targets are 0 and T. 'up' never lowers a count (every chosen expert
    takes all T tokens), 'nearest' gives T to experts chosen by >= T/2 tokens, 'down' routes nothing.
    Output and gradients match the reference in each mode."""
    (d, n), T, E, K, tile = widths(device), 100, 4, 2, 128
    dtype = _dtype(device)
    x, wr, w1, w2 = make_layer(T, d, n, E, dtype, device, seed=4)
    cfg = dict(routing="token_rounding", tile=tile, rounding_mode=mode)
    saved = torch.ops.leanmoe.moe_forward(x, wr, w1, w2, K, "softmax_then_topk", False, "token_rounding", tile, mode)
    offsets = saved[7].cpu()
    counts = (offsets[1:] - offsets[:-1]).tolist()
    f = torch.bincount(saved[8].cpu().long().flatten(), minlength=E).tolist()
    want = {"up": [T if c > 0 else 0 for c in f], "nearest": [T if 2 * c >= T else 0 for c in f],
            "down": [0] * E}[mode]
    assert counts == want, (f, counts)
    out, aux, zl = leanmoe.moe(x, wr, w1, w2, K, **cfg)
    r_out, *_ = moe_reference(*(t.detach().float().cpu() for t in (x, wr, w1, w2)), K, **cfg)
    close(out, r_out, dtype, "output")
    if mode != "down":
        assert out.abs().sum() > 0, "the layer must not be zeroed"


def _layer(device, routing="token_rounding", **kw):
    (d, n) = widths(device)
    torch.manual_seed(0)
    return leanmoe.MoE(d, n, 8, 2, routing=routing, tile=128, rounding_mode="up", device=device,
                       dtype=_dtype(device), **kw)


def test_eval_and_no_grad_route_with_top_k(device):
    """Token rounding is a training-time routing: eval mode, no_grad and inference_mode give the
    plain top-K output; a training forward with autograd rounds (T = 50 < tile: 'up' gives every
    chosen expert all 50 tokens, which changes the output)."""
    m = _layer(device)
    topk = _layer(device, routing="topk")
    topk.load_state_dict(m.state_dict())
    x = torch.randn(50, m.d, device=device, dtype=_dtype(device))
    with torch.no_grad():
        want = topk(x).output
        assert torch.equal(m(x).output, want)  # training mode, no_grad
    with torch.inference_mode():
        assert torch.equal(m(x).output, want)
    m.eval()
    assert torch.equal(m(x).output, want)  # eval mode, grad enabled
    m.train()
    rounded = m(x).output
    assert not torch.equal(rounded.detach(), want)


def test_inference_routing_option_keeps_rounding(device):
    m = _layer(device, inference_routing="token_rounding")
    x = torch.randn(50, m.d, device=device, dtype=_dtype(device))
    train_out = m(x).output.detach()
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(x).output, train_out)
    with pytest.raises(ValueError, match="inference_routing"):
        _layer(device, inference_routing="sometimes")


def test_hf_apply_routes_with_top_k_in_eval(device):
    pytest.importorskip("transformers")
    import leanmoe.hf
    from test_hf import batch, tiny
    rounded = tiny("olmoe", dtype=_dtype(device), device=device)
    plain = copy.deepcopy(rounded)
    leanmoe.hf.apply(rounded, routing="token_rounding", tile=128, rounding_mode="up")
    leanmoe.hf.apply(plain)
    b = batch(device)
    rounded.eval(), plain.eval()
    assert torch.equal(rounded(**b).logits, plain(**b).logits)
    rounded.train(), plain.train()
    with torch.no_grad():
        assert torch.equal(rounded(**b).logits, plain(**b).logits)
    assert not torch.equal(rounded(**b).logits.detach(), plain(**b).logits.detach())
