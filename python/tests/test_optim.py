"""leanmoe.optim.ExpertAdamW: in-backward expert updates, bitwise equal to the standard path."""
import contextlib
import copy
import io

import pytest
import torch
from torch import nn

import leanmoe
from conftest import skip_unsupported
from leanmoe.optim import ExpertAdamW, dense_parameters, expert_parameters


class Net(nn.Module):
    """Dense input projection, then residual MoE layers of different shapes."""

    def __init__(self, dtype=torch.float32, device="cpu"):
        super().__init__()
        f = dict(dtype=dtype, device=device)
        # CUDA expert GEMMs need d, n multiples of 64; the CPU runs small widths.
        d, ns = (128, (64, 128, 64)) if device == "cuda" else (32, (16, 24, 8))
        self.d = d
        self.inp = nn.Linear(d, d, **f)
        self.moes = nn.ModuleList([
            leanmoe.MoE(d, ns[0], 6, 2, **f),
            leanmoe.MoE(d, ns[1], 4, 1, router="topk_then_softmax", **f),
            leanmoe.MoE(d, ns[2], 8, 3, routing="token_rounding", tile=4, norm_topk_prob=True, **f),
        ])

    def forward(self, x):
        h = self.inp(x)
        aux = 0.0
        for m in self.moes:
            o = m(h)
            h = h + o.output
            aux = aux + o.aux_loss + 0.1 * o.z_loss
        return h.float().square().mean() + 0.01 * aux


def train(model, in_backward, steps, dtype, device, expert_opt=None, dense_opt=None, sched=None, start=0,
          update="torch"):
    expert_opt = expert_opt or ExpertAdamW(expert_parameters(model), lr=1e-2, weight_decay=0.1,
                                           in_backward=in_backward, update=update)
    dense_opt = dense_opt or torch.optim.AdamW(dense_parameters(model), lr=1e-2)
    sched = sched or torch.optim.lr_scheduler.StepLR(expert_opt, step_size=3, gamma=0.5)
    for s in range(start, start + steps):
        g = torch.Generator().manual_seed(100 + s)
        x = torch.randn(40, model.d, generator=g).to(dtype).to(device)
        loss = model(x)
        loss.backward()
        if in_backward:
            assert all(p.grad is None for p in expert_parameters(model)), "expert gradients reached .grad"
        torch.nn.utils.clip_grad_norm_(dense_parameters(model), 0.5)
        expert_opt.step()
        dense_opt.step()
        sched.step()
        expert_opt.zero_grad()
        dense_opt.zero_grad()
    return expert_opt, dense_opt, sched


def assert_bitwise(a, b):
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), f"parameter {na} differs"


@pytest.mark.parametrize("update", ["torch", "leanmoe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_backward_equals_standard_bitwise(dtype, update, device):
    skip_unsupported(device, dtype)
    torch.manual_seed(0)
    standard = Net(dtype=dtype, device=device)
    inb = copy.deepcopy(standard)
    opt_s, _, _ = train(standard, False, 10, dtype, device, update=update)
    opt_i, _, _ = train(inb, True, 10, dtype, device, update=update)
    assert_bitwise(standard, inb)
    for ps, pi in zip(expert_parameters(standard), expert_parameters(inb)):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt_s.state[ps][key], opt_i.state[pi][key]), key
    opt_i.release()


def test_standard_equals_torch_fused_adamw(device):
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ours = Net(dtype=dtype, device=device)
    theirs = copy.deepcopy(ours)
    train(ours, False, 5, dtype, device)
    opt = torch.optim.AdamW(expert_parameters(theirs), lr=1e-2, weight_decay=0.1, fused=True)
    train(theirs, False, 5, dtype, device, expert_opt=opt)
    assert_bitwise(ours, theirs)


@pytest.mark.parametrize("update", ["torch", "leanmoe"])
def test_state_dict_round_trip_and_schedule(update, device):
    torch.manual_seed(0)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    straight = Net(dtype=dt, device=device)
    resumed = copy.deepcopy(straight)
    opt_a, dense_a, sched_a = train(straight, True, 6, dt, device, update=update)
    opt_a.release()

    e1, d1, s1 = train(resumed, True, 3, dt, device, update=update)
    buf = io.BytesIO()
    torch.save({"model": resumed.state_dict(), "experts": e1.state_dict(), "dense": d1.state_dict(),
                "sched": s1.state_dict()}, buf)
    e1.release()
    buf.seek(0)
    ckpt = torch.load(buf)
    fresh = Net(dtype=dt, device=device)
    fresh.load_state_dict(ckpt["model"])
    e2 = ExpertAdamW(expert_parameters(fresh), lr=1e-2, weight_decay=0.1, in_backward=True, update=update)
    e2.load_state_dict(ckpt["experts"])
    d2 = torch.optim.AdamW(dense_parameters(fresh), lr=1e-2)
    d2.load_state_dict(ckpt["dense"])
    s2 = torch.optim.lr_scheduler.StepLR(e2, step_size=3, gamma=0.5)
    s2.load_state_dict(ckpt["sched"])
    assert e2.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5)
    train(fresh, True, 3, dt, device, e2, d2, s2, start=3)
    assert_bitwise(straight, fresh)
    e2.release()


def test_gradient_accumulation_is_refused(device):
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    model = Net(dtype=dt, device=device)
    opt = ExpertAdamW(expert_parameters(model), in_backward=True)
    x = torch.randn(16, model.d, device=device, dtype=dt)
    model(x).backward()
    with pytest.raises(RuntimeError, match="gradient accumulation"):
        model(x).backward()  # a second micro-batch before step()
    opt.step()
    model(x).backward()  # fine after step()
    opt.step()
    opt.release()


def test_a_layer_called_twice_in_one_step_is_refused_by_name():
    """One layer called twice before backward (weights shared between positions): the second call's
    backward reads weights the first one updated; the refusal names this case, not only micro-batches."""
    m = leanmoe.MoE(32, 16, 4, 2)
    opt = ExpertAdamW([m.gate_up_proj, m.down_proj], in_backward=True)
    x = torch.randn(8, 32)
    with pytest.raises(RuntimeError, match="a layer called more than once per step"):
        m(m(x).output).output.sum().backward()
    opt.release()


def test_checkpointed_recomputation_is_refused(device):
    dt, (d, n) = (torch.bfloat16, (128, 64)) if device == "cuda" else (torch.float32, (32, 16))
    m = leanmoe.MoE(d, n, 4, 2, device=device, dtype=dt)
    opt = ExpertAdamW([m.gate_up_proj, m.down_proj], in_backward=True)
    x = torch.randn(8, d, device=device, dtype=dt, requires_grad=True)
    y = torch.utils.checkpoint.checkpoint(lambda t: m(t).output, x, use_reentrant=False)
    # The recomputation in backward runs after... no update yet (only one layer), so it passes;
    # a second use of the same layer in one step must be refused instead.
    y.sum().backward()
    with pytest.raises(RuntimeError, match="optimizer.step"):
        m(x).output.sum().backward()
    opt.release()


@pytest.mark.parametrize("frozen", [("gate_up_proj", "down_proj"), ("down_proj",)])
@pytest.mark.parametrize("precision", ["storage", "fp8"])
def test_frozen_experts_are_not_updated(frozen, precision):
    """requires_grad=False expert weights (frozen, e.g. to fine-tune the router only) get no update from
    an in-backward ExpertAdamW, as from the standard one (no gradient); the others train as in the
    standard mode, bit for bit."""
    torch.manual_seed(0)
    layers = [leanmoe.MoE(128, 128, 4, 2, precision=precision, dtype=torch.bfloat16) for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    before = copy.deepcopy(layers[0])
    opts = [ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2, in_backward=mode)
            for m, mode in zip(layers, (False, True))]
    for m in layers:
        for name in frozen:
            getattr(m, name).requires_grad_(False)
    for step in range(2):
        x = torch.randn(20, 128, generator=torch.Generator().manual_seed(step)).bfloat16().requires_grad_()
        for m, opt in zip(layers, opts):
            m(x).output.float().square().mean().backward()
            opt.step()
            opt.zero_grad()
    for name in ("gate_up_proj", "down_proj"):
        a = getattr(layers[1], name)
        assert torch.equal(a, getattr(layers[0], name)), f"{name}: in-backward differs from standard"
        assert torch.equal(a, getattr(before, name)) == (name in frozen), name
    opts[1].release()


def test_an_optimizer_over_the_trainable_expert_weight_only():
    """down_proj frozen and left out of the in-backward ExpertAdamW, which holds gate_up_proj only: the
    layer trains gate_up_proj (from .grad, in step()) instead of refusing the pair's ownership."""
    torch.manual_seed(0)
    m = leanmoe.MoE(32, 16, 4, 2)
    m.down_proj.requires_grad_(False)
    frozen, before = m.down_proj.detach().clone(), m.gate_up_proj.detach().clone()
    opt = ExpertAdamW([m.gate_up_proj], lr=1e-2, in_backward=True)
    m(torch.randn(8, 32)).output.square().sum().backward()
    opt.step()
    assert torch.equal(m.down_proj, frozen) and not torch.equal(m.gate_up_proj, before)
    opt.release()


@pytest.mark.parametrize("precision", ["storage", "fp8"])
def test_gradients_not_asked_for_are_not_updates(precision):
    """torch.autograd.grad(loss, x) (a gradient penalty, a saliency map) and backward(inputs=[x]) ask for
    no expert gradient: an in-backward ExpertAdamW leaves the weights alone (the standard backward runs,
    the same dx); autograd.grad(loss, weights) returns their gradients; training goes on after."""
    torch.manual_seed(0)
    m = leanmoe.MoE(128, 128, 4, 2, precision=precision, dtype=torch.bfloat16)
    reference = copy.deepcopy(m)
    opt = ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2, in_backward=True)
    x = torch.randn(20, 128, dtype=torch.bfloat16, requires_grad=True)
    experts = ("gate_up_proj", "down_proj")
    want = torch.autograd.grad(reference(x).output.float().square().sum(),
                               [x] + [getattr(reference, name) for name in experts])
    got = [torch.autograd.grad(m(x).output.float().square().sum(), x)[0]]
    m(x).output.float().square().sum().backward(inputs=[x])
    assert torch.equal(x.grad, want[0])
    got += torch.autograd.grad(m(x).output.float().square().sum(), [getattr(m, name) for name in experts])
    for name, a, b in zip(("dx",) + experts, got, want):
        assert torch.equal(a, b), name
    for name in experts:
        assert torch.equal(getattr(m, name), getattr(reference, name)), f"{name} was updated"
        assert getattr(m, name).grad is None
    m(x).output.float().square().sum().backward()  # a training step: updated in backward
    assert not torch.equal(m.down_proj, reference.down_proj)
    opt.step()
    opt.release()
    # The routing given by the caller (the transformers experts' path), likewise.
    w1, w2 = (torch.nn.Parameter(getattr(reference, name).detach().clone()) for name in experts)
    opt = ExpertAdamW([w1, w2], lr=1e-2, in_backward=True)
    ids, gates = torch.randint(0, 4, (20, 2)), torch.rand(20, 2)
    dx = [torch.autograd.grad(leanmoe.moe_routed(x, ids, gates, a, b, precision=precision).float().square().sum(),
                              x)[0] for a, b in ((w1, w2), (w1.detach(), w2.detach()))]
    assert torch.equal(dx[0], dx[1])
    assert torch.equal(w1, reference.gate_up_proj) and torch.equal(w2, reference.down_proj)
    opt.release()


@pytest.mark.parametrize("in_backward", [False, True])
@pytest.mark.parametrize("precision", ["storage", "fp8"])
def test_master_follows_weights_changed_outside_the_optimizer(in_backward, precision):
    """master_weights=True: weights changed after the first step outside the optimizer (the model's
    load_state_dict, an edit under no_grad) are where the next update starts, as without a master
    copy (which would otherwise store its stale values back into them)."""
    torch.manual_seed(0)
    m, other = (leanmoe.MoE(128, 128, 4, 2, precision=precision, dtype=torch.bfloat16) for _ in range(2))
    opt = ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2, weight_decay=0.0, in_backward=in_backward,
                      master_weights=True)
    x = torch.randn(20, 128, dtype=torch.bfloat16)

    def step():
        m(x).output.float().square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    m.load_state_dict(other.state_dict())
    step()  # an AdamW step moves each weight by about lr = 1e-2; the weights themselves are ~0.1
    assert (m.down_proj.float() - other.down_proj.float()).abs().max() < 2e-2
    with torch.no_grad():
        m.gate_up_proj.zero_()
    step()
    assert m.gate_up_proj.float().abs().max() < 2e-2
    # Converted to float, edited there, and back: new storages, possibly at the freed ones' addresses
    # with the same version counters (the optimizer's stamp names the storage, not its address).
    m.float()
    with torch.no_grad():
        m.down_proj.fill_(0.5)
    m.bfloat16()
    step()
    assert (m.down_proj.float() - 0.5).abs().max() < 2e-2
    for p in (m.gate_up_proj, m.down_proj):
        assert torch.equal(opt.state[p]["master"].bfloat16(), p)
    opt.release()


def test_update_argument_is_checked():
    m = leanmoe.MoE(32, 16, 4, 2)
    with pytest.raises(ValueError, match="argument 'update': must be 'torch' or 'leanmoe', got 'fused'"):
        ExpertAdamW([m.gate_up_proj, m.down_proj], update="fused")


def bf16_and_fp8_layers(device):
    torch.manual_seed(0)
    bf16 = leanmoe.MoE(128, 128, 4, 2, device=device, dtype=torch.bfloat16)
    fp8 = leanmoe.MoE(128, 128, 4, 2, precision="fp8", device=device, dtype=torch.bfloat16)
    fp8.load_state_dict(bf16.state_dict())
    return bf16, fp8


def step_with_grads(layers_and_opts, steps):
    """Hands every layer the same random expert gradients, then steps its optimizer."""
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        grads = [torch.randn(p.shape, generator=g) for p in (layers_and_opts[0][0].gate_up_proj,
                                                             layers_and_opts[0][0].down_proj)]
        for m, opt in layers_and_opts:
            for p, grad in zip((m.gate_up_proj, m.down_proj), grads):
                p.grad = grad.to(p)
            opt.step()
            opt.zero_grad()


def test_update_leanmoe_is_the_fp8_layers_update(device):
    """update='leanmoe' steps a bf16 layer's experts with the update an fp8 layer's take: the same
    weights and state bit for bit (the in-backward mode equals this one: the tests above)."""
    bf16, fp8 = bf16_and_fp8_layers(device)
    ours = ExpertAdamW([bf16.gate_up_proj, bf16.down_proj], lr=1e-2, weight_decay=0.1, in_backward=False,
                       update="leanmoe")
    fp8_opt = ExpertAdamW([fp8.gate_up_proj, fp8.down_proj], lr=1e-2, weight_decay=0.1, in_backward=False)
    step_with_grads([(bf16, ours), (fp8, fp8_opt)], 4)
    for name in ("gate_up_proj", "down_proj"):
        p, q = getattr(bf16, name), getattr(fp8, name)
        assert torch.equal(p, q), name
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(ours.state[p][key], fp8_opt.state[q][key]), key
        assert ours.state[p]["step"].device.type == "cpu"
        assert ours.state[p]["exp_avg"].dtype == torch.bfloat16


def test_update_leanmoe_tracks_torch_fused_adamw(device):
    """update='leanmoe' against torch's fused AdamW (the default) over the same bf16 experts: the same
    formula rounded differently (docs/optim.md): within bf16 rounding, most weights bitwise equal."""
    a, _ = bf16_and_fp8_layers(device)
    b = copy.deepcopy(a)
    hyper = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, in_backward=False)
    opts = [(a, ExpertAdamW([a.gate_up_proj, a.down_proj], update="leanmoe", **hyper)),
            (b, ExpertAdamW([b.gate_up_proj, b.down_proj], **hyper))]
    step_with_grads(opts, 5)
    for name in ("gate_up_proj", "down_proj"):
        p, q = getattr(a, name).detach().float(), getattr(b, name).detach().float()
        # one bf16 ulp of the tensor's largest value bounds a value rounded the other way
        torch.testing.assert_close(p, q, rtol=2 ** -7, atol=2 ** -7 * q.abs().max().item(), msg=name)
        equal = (p == q).float().mean().item()
        assert 0.98 < equal, f"{name}: {equal:.4f} of the weights bitwise equal to torch's"


def test_grad_scaler_with_in_backward_updates_is_refused_by_name():
    """torch.amp.GradScaler unscales .grad and skips a step with inf/nan before optimizer.step(): an
    in-backward update has already run on the scaled gradient by then. Refused at scaler.step() by
    name (not GradScaler's bare 'No inf checks were recorded'), also after an explicit unscale_()
    (for clipping); the standard mode is honored."""
    for in_backward, unscale_first in ((False, False), (False, True), (True, False), (True, True)):
        torch.manual_seed(0)
        m = leanmoe.MoE(32, 16, 4, 2)
        opt = ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2, in_backward=in_backward)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
        x = torch.randn(8, 32)
        x[0, 0] = float("inf")  # an overflow: GradScaler must skip this step
        before = [p.detach().clone() for p in (m.gate_up_proj, m.down_proj)]
        scaler.scale(m(x).output.square().sum()).backward()
        if unscale_first:
            scaler.unscale_(opt)
        if not in_backward:
            scaler.step(opt)
            scaler.update()
            assert all(torch.equal(b, p) for b, p in zip(before, (m.gate_up_proj, m.down_proj)))
            continue
        with pytest.raises(RuntimeError, match="GradScaler.*in_backward=False"):
            scaler.step(opt)
        opt.release()


@pytest.mark.parametrize("group, arg", [(dict(lr=-1.0), "lr"), (dict(betas=(0.9, 1.5)), "betas"),
                                        (dict(dtype=torch.float16), "params")])
def test_a_refused_param_group_is_not_added(group, arg):
    """add_param_group raising ValueError leaves the optimizer as it was: a caller that catches the
    error (a notebook, a config retry) must not step the refused tensors with the refused values."""
    m = leanmoe.MoE(32, 16, 4, 2)
    opt = ExpertAdamW([m.gate_up_proj], lr=1e-2)
    p = torch.nn.Parameter(torch.zeros(2, dtype=group.pop("dtype"))) if "dtype" in group else m.down_proj
    with pytest.raises(ValueError, match=f"argument '{arg}'"):
        opt.add_param_group({"params": [p], **group})
    assert len(opt.param_groups) == 1 and [id(q) for q in opt.param_groups[0]["params"]] == [id(m.gate_up_proj)]
    opt.add_param_group({"params": [m.down_proj]})  # the corrected group is taken
    m(torch.randn(8, 32)).output.square().sum().backward()  # both in-backward: the layer's hypers must agree
    opt.release()


@pytest.mark.parametrize("hook", ["register_hook", "register_post_accumulate_grad_hook"])
def test_gradient_hooks_on_expert_weights_see_the_gradient(hook, monkeypatch):
    """A hook on an expert weight (clamping its gradient, logging its norm, torch's optimizer-in-
    backward pattern) needs the gradient: with one, the layer takes the standard path (a warning says
    so) instead of updating in backward and calling the hook with None; training equals the
    standard run bit for bit."""
    monkeypatch.setattr(leanmoe.functional, "_warned", set())  # warned once per process
    torch.manual_seed(0)
    standard = leanmoe.MoE(32, 16, 4, 2)
    inb = copy.deepcopy(standard)
    for m, in_backward in ((standard, False), (inb, True)):
        opt = ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2, in_backward=in_backward)
        seen = []
        if hook == "register_hook":
            m.down_proj.register_hook(lambda g: seen.append(g) or g.clamp(-1e-3, 1e-3))
        else:
            m.down_proj.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.norm()))
        for step in range(2):
            torch.manual_seed(step)
            with pytest.warns(UserWarning, match="hook") if in_backward and step == 0 else contextlib.nullcontext():
                m(torch.randn(9, 32)).output.square().sum().backward()
            opt.step()
            opt.zero_grad()
        assert len(seen) == 2 and all(g is not None for g in seen)
        opt.release()
    assert_bitwise(standard, inb)


@pytest.mark.parametrize("update", ["torch", "leanmoe"])
def test_master_weights_follow_a_dtype_change_of_the_model(update):
    """ExpertAdamW(master_weights=True) over fp32 weights, then model.to(torch.bfloat16) (and back):
    the bf16 weights get a master copy of their current values (before: torch's kernel failed with
    'expected scalar type BFloat16 but found Float'), fp32 ones drop it; both modes stay bitwise equal."""
    torch.manual_seed(0)
    standard = leanmoe.MoE(32, 16, 4, 2)
    inb = copy.deepcopy(standard)
    for m, in_backward in ((standard, False), (inb, True)):
        opt = ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2, in_backward=in_backward, master_weights=True,
                          update=update)
        for step, dtype in enumerate((torch.float32, torch.float32, torch.bfloat16, torch.bfloat16, torch.float32)):
            m.to(dtype)
            torch.manual_seed(step)
            m(torch.randn(9, 32, dtype=dtype)).output.float().square().sum().backward()
            opt.step()
            opt.zero_grad()
            state = opt.state[m.down_proj]
            if dtype == torch.bfloat16:
                assert torch.equal(state["master"].to(dtype), m.down_proj)
                assert state["exp_avg"].dtype == torch.float32
            else:
                assert "master" not in state
        opt.release()
    assert_bitwise(standard, inb)


@pytest.mark.filterwarnings("ignore:leanmoe. torch.autocast casts the expert weights")
def test_grad_scaler_is_honored_when_nothing_was_updated_in_backward(monkeypatch):
    """An in-backward ExpertAdamW whose layers took the standard path (fp32 weights under bf16
    autocast here; DistributedDataParallel, gradient hooks) has only .grad to step: GradScaler's
    unscale and inf/nan skip are honored, bitwise equal to in_backward=False."""
    monkeypatch.setattr(leanmoe.functional, "_warned", set())
    torch.manual_seed(0)
    standard = leanmoe.MoE(32, 16, 4, 2)
    inb = copy.deepcopy(standard)
    for m, in_backward in ((standard, False), (inb, True)):
        opt = ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2, in_backward=in_backward)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        for step in range(4):
            torch.manual_seed(step)
            x = torch.randn(9, 32)
            if step == 1:
                x[0, 0] = float("inf")  # skipped
            before = [p.detach().clone() for p in (m.gate_up_proj, m.down_proj)]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = m(x).output.float().square().sum()
            scaler.scale(loss).backward()
            if step == 2:
                scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            unchanged = all(torch.equal(b, p) for b, p in zip(before, (m.gate_up_proj, m.down_proj)))
            assert unchanged == (step == 1)
        opt.release()
    assert_bitwise(standard, inb)
