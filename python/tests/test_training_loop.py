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
    saved = torch.ops.leanmoe.moe_forward(x, wr, w1, w2, K, "softmax_then_topk", False, "token_rounding", tile, mode,
                                          "storage")
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


# ---- empty and degenerate inputs (item 7) ----
@pytest.mark.parametrize("routing", ["topk", "token_rounding"])
def test_zero_tokens(routing, device):
    """T = 0 (an expert-parallel rank or a packed batch with no tokens): empty output, losses 0,
    dx empty, weight gradients exactly 0; the in-backward path too."""
    (d, n), E, K = widths(device), 6, 2
    dtype = _dtype(device)
    _, wr, w1, w2 = make_layer(4, d, n, E, dtype, device)
    x = torch.zeros(2, 0, d, dtype=dtype, device=device, requires_grad=True)
    out, aux, zl = leanmoe.moe(x, wr, w1, w2, K, routing=routing, tile=4)
    assert out.shape == (2, 0, d) and aux.item() == 0 and zl.item() == 0
    (out.sum() + aux + zl).backward()
    assert x.grad.shape == x.shape
    for t in (wr, w1, w2):
        assert torch.equal(t.grad, torch.zeros_like(t)), "a weight gradient is not exactly 0"
    m = leanmoe.MoE(d, n, E, K, routing=routing, tile=4, device=device, dtype=dtype)
    opt = leanmoe.optim.ExpertAdamW([m.gate_up_proj, m.down_proj], lr=0.1, weight_decay=0.0)
    before = m.gate_up_proj.detach().clone()
    m(torch.zeros(0, d, dtype=dtype, device=device, requires_grad=True)).output.sum().backward()
    opt.step()
    assert torch.equal(m.gate_up_proj, before), "a zero gradient with no weight decay moves nothing"
    assert int(opt.state[m.gate_up_proj]["step"]) == 1


def test_bad_arguments_name_the_argument_and_the_rule():
    x, wr, w1, w2 = make_layer(8, 16, 8, 4, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"argument 'top_k': must be an int in 1\.\.E = 4, got -1"):
        leanmoe.moe(x, wr, w1, w2, -1)
    with pytest.raises(ValueError, match="argument 'top_k'"):
        leanmoe.moe(x, wr, w1, w2, 5)
    with pytest.raises(ValueError, match="argument 'tile': must be an int > 0"):
        leanmoe.moe(x, wr, w1, w2, 2, routing="token_rounding", tile=0)
    # The operator itself checks the config before sizing any tensor from it.
    with pytest.raises(ValueError, match="cfg.K must be > 0"):
        torch.ops.leanmoe.moe_forward(x, wr, w1, w2, -1, "softmax_then_topk", False, "topk", 128, "nearest", "storage")
    # dtype: the valid storage dtypes only (int32 is for routing arrays, not for x).
    with pytest.raises(ValueError,
                       match=r"argument 'x': dtype must be torch.bfloat16 or torch.float32.*got torch.int32"):
        leanmoe.moe(x.int(), wr, w1, w2, 2)
    with pytest.raises(ValueError, match="float64 is not offered"):
        leanmoe.moe(x.double(), wr.double(), w1.double(), w2.double(), 2)
    with pytest.raises(ValueError, match=r"argument 'x': dtype must be bfloat16 or float32, got Half"):
        torch.ops.leanmoe.moe_forward(x.half(), wr, w1, w2, 2, "softmax_then_topk", False, "topk", 128, "nearest",
                                      "storage")


def test_module_refuses_bad_construction_arguments():
    with pytest.raises(ValueError, match=r"argument 'dtype': must be torch.bfloat16 or torch.float32.*torch.float16"):
        leanmoe.MoE(16, 8, 4, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="float64 is not offered"):
        leanmoe.MoE(16, 8, 4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="argument 'router'"):
        leanmoe.MoE(16, 8, 4, 2, router="softmax")
    with pytest.raises(ValueError, match="argument 'routing'"):
        leanmoe.MoE(16, 8, 4, 2, routing="rounding")
    with pytest.raises(ValueError, match="argument 'rounding_mode'"):
        leanmoe.MoE(16, 8, 4, 2, routing="token_rounding", rounding_mode="ceil")
    with pytest.raises(ValueError, match="argument 'tile'"):
        leanmoe.MoE(16, 8, 4, 2, routing="token_rounding", tile=-4)
    with pytest.raises(ValueError, match="argument 'd'"):
        leanmoe.MoE(0, 8, 4, 2)


@pytest.mark.filterwarnings("ignore:Input #.*double precision")
def test_gradcheck_in_float32():
    """No float64 path (the backends compute in fp32): gradcheck runs in float32 with a step and
    tolerances sized for fp32 (python/README.md 'Gradient checks'). Top-K with margins between
    the logits, so a step of 1e-2 moves no token to another expert."""
    T, d, n, E, K = 6, 8, 4, 4, 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, d, generator=g)
    wr = torch.zeros(E, d)
    wr[:, 0] = torch.tensor([3.0, 1.0, -1.0, -3.0])  # x[:, 0] = 1: logits 3, 1, -1, -3 (+ nothing else)
    x[:, 0] = 1.0
    w1 = torch.randn(E, 2 * n, d, generator=g) / d ** 0.5
    w2 = torch.randn(E, d, n, generator=g) / n ** 0.5
    inputs = [t.requires_grad_() for t in (x, w1, w2)]
    f = lambda x, w1, w2: leanmoe.moe(x, wr, w1, w2, K).output  # noqa: E731
    assert torch.autograd.gradcheck(f, inputs, eps=1e-2, atol=2e-3, rtol=2e-2, nondet_tol=1e-5)


# ---- double backward (item 3) ----
@pytest.mark.parametrize("in_backward", [False, True])
def test_double_backward_raises_clearly(in_backward, device):
    """First-order gradients under create_graph=True are the usual ones; differentiating them again
    raises a leanmoe error (it used to give silent zeros)."""
    m = _layer(device, routing="topk")
    opt = leanmoe.optim.ExpertAdamW([m.gate_up_proj, m.down_proj], in_backward=True) if in_backward else None
    x = torch.randn(12, m.d, device=device, dtype=_dtype(device), requires_grad=True)
    out = m(x).output
    (gx,) = torch.autograd.grad(out.float().square().sum(), x, create_graph=True)
    with torch.no_grad():
        x2 = x.detach().clone().requires_grad_()
    if opt is None:  # the same first-order gradient as without create_graph
        (plain,) = torch.autograd.grad(m(x2).output.float().square().sum(), x2)
        assert torch.equal(gx.detach(), plain)
    with pytest.raises(RuntimeError, match="no second derivative"):
        gx.float().sum().backward()
    if opt is not None:
        opt.release()


# ---- autocast (item 6) ----
def test_autocast_follows_like_f_linear():
    """Under torch.autocast(bfloat16) fp32 inputs and weights are cast to bf16 for the layer (the
    output is bf16, equal to the layer run on bf16 copies) and the fp32 weights get fp32 gradients."""
    m = leanmoe.MoE(32, 16, 4, 2)
    x = torch.randn(10, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x)
    assert out.output.dtype == torch.bfloat16
    want = leanmoe.moe(x.detach().bfloat16(), m.router.weight.detach().bfloat16(),
                       m.gate_up_proj.detach().bfloat16(), m.down_proj.detach().bfloat16(), 2)
    assert torch.equal(out.output, want.output)
    out.output.float().sum().backward()
    assert m.gate_up_proj.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    with pytest.raises(ValueError, match="autocast dtype must be torch.bfloat16"):
        with torch.autocast("cpu", dtype=torch.float16):
            m(x)


def test_autocast_with_in_backward_optimizer_takes_the_standard_path():
    m = leanmoe.MoE(32, 16, 4, 2)
    opt = leanmoe.optim.ExpertAdamW([m.gate_up_proj, m.down_proj], in_backward=True)
    x = torch.randn(10, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.warns(UserWarning, match="standard path"):
        out = m(x)
    out.output.float().sum().backward()
    assert m.gate_up_proj.grad is not None  # reaches .grad, step() applies it
    before = m.gate_up_proj.detach().clone()
    opt.step()
    assert not torch.equal(m.gate_up_proj, before)
    opt.release()


# ---- router statistics (item 8) ----
@pytest.mark.parametrize("mode", ["nearest", "up", "down"])
def test_router_stats(mode, device):
    (d, n), T, E, K, tile = widths(device), 70, 6, 2, 8
    dtype = _dtype(device)
    x, wr, w1, w2 = make_layer(T, d, n, E, dtype, device, seed=3)
    out = leanmoe.moe(x, wr, w1, w2, K, routing="token_rounding", tile=tile, rounding_mode=mode, return_stats=True)
    s = out.stats
    *_, keep = moe_reference(*(t.detach().float().cpu() for t in (x, wr, w1, w2)), K, routing="token_rounding",
                             tile=tile, rounding_mode=mode)
    chosen = torch.zeros(T, E, dtype=torch.bool)
    logits = x.detach().float().cpu() @ wr.detach().float().cpu().t()
    chosen[torch.arange(T)[:, None], torch.topk(logits, K).indices] = True
    assert s.tokens == T
    assert s.expert_rows.tolist() == keep.sum(0).tolist()
    assert s.topk_counts.tolist() == chosen.sum(0).tolist()
    assert int(s.dropped_pairs) == int((chosen & ~keep).sum())
    assert int(s.added_pairs) == int((keep & ~chosen).sum())
    assert int(s.tokens_without_expert) == int((keep.sum(1) == 0).sum())
    assert s.expert_rows.device == x.device  # device tensors: nothing synchronised
    # The module: return_stats=True on construction.
    m = leanmoe.MoE(d, n, E, K, routing="token_rounding", tile=tile, rounding_mode=mode, return_stats=True,
                    device=device, dtype=dtype)
    assert m(x).stats.expert_rows.sum() > 0


# ---- optimizer arguments and master weights (item 9) ----
@pytest.mark.parametrize("kwargs,arg", [(dict(betas=(1.5, 0.9)), "betas"), (dict(betas=(0.9, -0.1)), "betas"),
                                        (dict(betas=(0.9, 1.0)), "betas"), (dict(eps=-1.0), "eps"),
                                        (dict(lr=-1e-3), "lr"), (dict(weight_decay=-0.1), "weight_decay")])
def test_expert_adamw_validates_like_torch(kwargs, arg):
    p = torch.nn.Parameter(torch.zeros(2, 4, 4))
    with pytest.raises(ValueError):
        torch.optim.AdamW([p], **kwargs)  # torch refuses these too
    with pytest.raises(ValueError, match=f"argument '{arg}'"):
        leanmoe.optim.ExpertAdamW([p], in_backward=False, **kwargs)
    opt = leanmoe.optim.ExpertAdamW([p], in_backward=False)
    with pytest.raises(ValueError, match=f"argument '{arg}'"):
        opt.add_param_group(dict(params=[torch.nn.Parameter(torch.zeros(2, 4, 4))], **kwargs))


def _master_run(in_backward, steps=4, lr=1e-5):
    torch.manual_seed(0)
    m = leanmoe.MoE(32, 16, 4, 2, dtype=torch.bfloat16)
    with torch.no_grad():
        m.gate_up_proj.fill_(0.1)  # an update of lr * 1 is far below a bf16 ulp of 0.1 (2^-11)
    opt = leanmoe.optim.ExpertAdamW([m.gate_up_proj, m.down_proj], lr=lr, weight_decay=0.0,
                                    in_backward=in_backward, master_weights=True)
    grads = []
    for s in range(steps):
        x = torch.randn(24, 32, generator=torch.Generator().manual_seed(s)).bfloat16()
        m(x).output.float().square().sum().backward()
        if not in_backward:
            grads.append([m.gate_up_proj.grad.clone(), m.down_proj.grad.clone()])
        opt.step()
        opt.zero_grad()
    return m, opt, grads


def test_master_weights_accumulate_small_updates_and_stay_bitwise():
    standard, opt_s, grads = _master_run(False)
    inb, opt_i, _ = _master_run(True)
    for a, b in ((standard.gate_up_proj, inb.gate_up_proj), (standard.down_proj, inb.down_proj)):
        assert torch.equal(a, b)
        for key in ("step", "exp_avg", "exp_avg_sq", "master"):
            assert torch.equal(opt_s.state[a][key], opt_i.state[b][key]), key
    master = opt_s.state[standard.gate_up_proj]["master"]
    assert master.dtype == torch.float32 and not torch.equal(master, torch.full_like(master, 0.1).bfloat16().float())
    # = torch.optim.AdamW(fused=True) over fp32 copies fed the bf16 gradients upcast, rounded to bf16.
    torch.manual_seed(0)
    ref = leanmoe.MoE(32, 16, 4, 2, dtype=torch.bfloat16)
    with torch.no_grad():
        ref.gate_up_proj.fill_(0.1)
    fp32 = [torch.nn.Parameter(t.detach().float()) for t in (ref.gate_up_proj, ref.down_proj)]
    torch_opt = torch.optim.AdamW(fp32, lr=1e-5, weight_decay=0.0, fused=True)
    for g1, g2 in grads:
        fp32[0].grad, fp32[1].grad = g1.float(), g2.float()
        torch_opt.step()
    assert torch.equal(fp32[0].detach(), master)
    assert torch.equal(fp32[0].detach().bfloat16(), standard.gate_up_proj.detach())
    # Without master weights the same steps round away entirely on the all-0.1 tensor.
    torch.manual_seed(0)
    plain = leanmoe.MoE(32, 16, 4, 2, dtype=torch.bfloat16)
    with torch.no_grad():
        plain.gate_up_proj.fill_(0.1)
    opt_p = leanmoe.optim.ExpertAdamW([plain.gate_up_proj, plain.down_proj], lr=1e-5, weight_decay=0.0,
                                      in_backward=True)
    for s in range(4):
        x = torch.randn(24, 32, generator=torch.Generator().manual_seed(s)).bfloat16()
        plain(x).output.float().square().sum().backward()
        opt_p.step()
    assert torch.equal(plain.gate_up_proj, torch.full_like(plain.gate_up_proj, 0.1))
    for o in (opt_i, opt_p):
        o.release()


def test_master_weights_survive_a_state_dict_round_trip():
    m, opt, _ = _master_run(True, steps=2)
    sd = opt.state_dict()
    fresh = copy.deepcopy(m)
    opt2 = leanmoe.optim.ExpertAdamW([fresh.gate_up_proj, fresh.down_proj], lr=1e-5, weight_decay=0.0,
                                     master_weights=True)
    opt2.load_state_dict(sd)
    for a, b in ((m.gate_up_proj, fresh.gate_up_proj), (m.down_proj, fresh.down_proj)):
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert opt2.state[b][key].dtype == torch.float32, key
            assert torch.equal(opt2.state[b][key], opt.state[a][key]), key
    opt2.release()


# ---- in-backward optimizer lifetime (item 2) ----
def _one_step(m, opt, seed=0):
    x = torch.randn(16, m.d, generator=torch.Generator().manual_seed(seed))
    m(x).output.square().sum().backward()
    opt.step()


def test_deleted_optimizer_stops_updating_and_a_new_one_takes_over():
    import gc
    m = leanmoe.MoE(32, 16, 4, 2)
    opt = leanmoe.optim.ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2)
    _one_step(m, opt)
    del opt
    gc.collect()
    before = m.gate_up_proj.detach().clone()
    x = torch.randn(16, 32)
    m(x).output.square().sum().backward()  # no optimizer: the standard path, gradients in .grad
    assert torch.equal(m.gate_up_proj, before) and m.gate_up_proj.grad is not None
    m.zero_grad(set_to_none=True)
    # Resume flow: an optimizer for the same parameters while an older one is still alive.
    old = leanmoe.optim.ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2)
    new = leanmoe.optim.ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2)
    new.load_state_dict(old.state_dict())
    _one_step(m, new)
    assert int(new.state[m.gate_up_proj]["step"]) == 1 and m.gate_up_proj not in old.state
    new.release()


def test_stale_grad_gets_one_clear_error():
    m = leanmoe.MoE(32, 16, 4, 2)
    x = torch.randn(16, 32)
    m(x).output.sum().backward()  # a backward before the optimizer existed: expert .grad set
    opt = leanmoe.optim.ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2)
    before = m.gate_up_proj.detach().clone()
    with pytest.raises(RuntimeError, match=r"has a \.grad .*zero_grad"):
        m(x)
    assert torch.equal(m.gate_up_proj, before)  # refused before anything changed
    opt.zero_grad()
    _one_step(m, opt)  # then it trains normally
    assert not torch.equal(m.gate_up_proj, before)
    _one_step(m, opt, seed=1)
    opt.release()


# ---- transformers' aux loss (item 4), stats through leanmoe.hf (item 8), checkpoints (item 10) ----
HF_KINDS = ["olmoe", "qwen3_moe", "granitemoe", "mixtral"]  # test_hf.KINDS (that module needs transformers)


@pytest.mark.parametrize("kind", HF_KINDS)
def test_transformers_aux_loss_is_transformers_value(kind):
    """With output_router_logits=True the block runs the model's router too, so transformers records
    the logits: the model's own aux_loss, and the loss it adds with router_aux_loss_coef, equal
    transformers' for the same routing, gradients included (fp32); leanmoe.hf.aux_loss(formulation=
    "transformers") gives the same value. Without router logits the router module is not run."""
    pytest.importorskip("transformers")
    import leanmoe.hf
    from test_hf import batch, tiny
    model = tiny(kind)
    model.config.router_aux_loss_coef = 0.5
    reference = copy.deepcopy(model)
    b = batch("cpu")
    try:
        want = reference(**b, output_router_logits=True)
    except AttributeError as e:  # transformers 5.17's GraniteMoe records no router logits (aux_loss = int 0)
        pytest.skip(f"this transformers cannot compute its own aux loss for {kind}: {e}")
    want.loss.backward()
    leanmoe.hf.apply(model)
    got = model(**b, output_router_logits=True)
    got.loss.backward()
    assert len(got.router_logits) == model.config.num_hidden_layers
    torch.testing.assert_close(got.aux_loss, want.aux_loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-4, atol=0)
    torch.testing.assert_close(leanmoe.hf.aux_loss(model, formulation="transformers"), want.aux_loss, rtol=1e-5,
                               atol=0)
    ref_grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        err = (p.grad - ref_grads[name].grad).abs().max() / ref_grads[name].grad.abs().max().clamp_min(1e-8)
        assert err < 1e-4, f"{name}: relative error {err:.2e}"
    # leanmoe's own formulation is per layer K times smaller (f_e = count / (T*K)), summed over layers.
    K = model.config.num_experts_per_tok
    per_layer = [leanmoe.hf.transformers_aux_loss([blk.leanmoe_router_logits], [K])
                 for blk in model.modules() if "leanmoe_router_logits" in blk.__dict__]
    torch.testing.assert_close(leanmoe.hf.aux_loss(model), sum(per_layer) / K, rtol=1e-5, atol=0)
    with torch.no_grad():
        calls = []
        router = next(m for m in model.modules() if type(m).__name__.endswith("TopKRouter"))
        handle = router.register_forward_hook(lambda *a: calls.append(1))
        model(**b)
        handle.remove()
    assert not calls


def test_transformers_aux_loss_needs_recorded_logits():
    pytest.importorskip("transformers")
    import leanmoe.hf
    from test_hf import batch, tiny
    model = tiny("olmoe")
    leanmoe.hf.apply(model)
    model(**batch("cpu"))
    with pytest.raises(ValueError, match="output_router_logits=True or apply"):
        leanmoe.hf.aux_loss(model, formulation="transformers")
    leanmoe.hf.remove(model)
    leanmoe.hf.apply(model, router_logits=True)
    model(**batch("cpu"))
    assert leanmoe.hf.aux_loss(model, formulation="transformers").dim() == 0


def test_hf_router_stats():
    pytest.importorskip("transformers")
    import leanmoe.hf
    from test_hf import batch, tiny
    model = tiny("olmoe")
    leanmoe.hf.apply(model, routing="token_rounding", tile=8, return_stats=True)
    b = batch("cpu")
    model(**b)
    stats = leanmoe.hf.router_stats(model)
    assert len(stats) == 2
    T = b["input_ids"].numel()
    for s in stats:
        assert s.tokens == T and int(s.topk_counts.sum()) == T * 2
        assert int(s.expert_rows.sum()) == T * 2 + int(s.added_pairs) - int(s.dropped_pairs)


@pytest.mark.parametrize("kind", HF_KINDS)
def test_module_from_hf_block_and_its_state_dict(kind):
    pytest.importorskip("transformers")
    import leanmoe.hf
    from test_hf import tiny
    model = tiny(kind)
    block = next(m for m in model.modules() if type(m).__name__ in leanmoe.hf.SUPPORTED_BLOCKS)
    layer = leanmoe.MoE.from_hf_block(block)
    spec = leanmoe.hf.block_spec(block)
    assert (layer.K, layer.router_convention, layer.norm_topk_prob) == (spec.top_k, spec.convention,
                                                                        spec.norm_topk_prob)
    x = torch.randn(2, 5, layer.d)
    torch.testing.assert_close(layer(x).output, block(x), rtol=1e-4, atol=1e-5)
    # A plain leanmoe.MoE loads the block's state_dict keys (gate.weight / router.weight, experts.*).
    other = leanmoe.MoE(layer.d, layer.n, layer.E, layer.K, router=spec.convention, norm_topk_prob=spec.norm_topk_prob)
    other.load_state_dict(block.state_dict())
    assert torch.equal(other(x).output, layer(x).output)
    r = repr(layer)
    assert "norm_topk_prob=" in r
    tr = leanmoe.MoE(16, 8, 4, 2, routing="token_rounding", rounding_mode="up")
    assert "rounding_mode=up" in repr(tr) and "tile=128" in repr(tr)
    with pytest.raises(ValueError, match="argument 'block'"):
        leanmoe.MoE.from_hf_block(torch.nn.Linear(2, 2))


def test_package_is_typed():
    import importlib.resources
    assert (importlib.resources.files("leanmoe") / "py.typed").is_file()


@pytest.mark.parametrize("routed", [False, True])
@pytest.mark.parametrize("in_backward", [False, True])
def test_expert_weights_edited_between_forward_and_backward_are_refused(routed, in_backward):
    """An in-place edit of an expert weight after the forward (under no_grad: a clamp, a renorm, a
    load) makes its backward wrong: the standard path refuses it through autograd's version check,
    and the in-backward path, which keeps the weights outside the saved tensors, must refuse it too
    (before updating anything) instead of differentiating the edited weights."""
    torch.manual_seed(0)
    m = leanmoe.MoE(32, 16, 4, 2)
    opt = leanmoe.optim.ExpertAdamW([m.gate_up_proj, m.down_proj], in_backward=in_backward)
    x = torch.randn(8, 32)
    if routed:
        ids, w = torch.randint(0, 4, (8, 2)), torch.rand(8, 2)
        loss = leanmoe.moe_routed(x, ids, w, m.gate_up_proj, m.down_proj).square().sum()
    else:
        loss = m(x).output.square().sum()
    with torch.no_grad():
        m.down_proj.mul_(0.5)
    before = [p.detach().clone() for p in (m.gate_up_proj, m.down_proj)]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    assert all(torch.equal(b, p) for b, p in zip(before, (m.gate_up_proj, m.down_proj)))
    opt.release()
