"""Every MoE family of the installed transformers against experts_implementation="leanmoe".

Discovers at run time each family whose experts class is decorated with transformers'
``use_experts_implementation``, builds a tiny random model of it from its config class's defaults
(every size field shrunk, 2 layers with at least one MoE layer, 8 experts, top-2), and runs eager
and leanmoe experts on the same weights (fp32, CPU, forward + backward). Each family ends as one of
- "match": logits, loss and every gradient as eager's (norm-wise relative 1e-5; a gradient that
  fp32 itself cannot get that close, such as a linear attention's A_log whose sum cancels, passes
  when leanmoe is as close to an fp64 eager run as transformers' own fp32 experts are: within
  max(1e-5, 2x the largest error of eager, batched_mm and grouped_mm; one run's error is a noisy
  measure of fp32's: DeepSeek-V4's hc_head.hc_base is 7.6e-6 from fp64 under eager, 1.6e-5 under
  batched_mm)),
- "refused": leanmoe raised NotImplementedError/ValueError naming the model and the feature,
- "not constructible": transformers itself builds or runs no tiny model (its own eager forward fails),
- "not located": no model class holding the experts was found,
- "FAIL": anything else (a mismatch, another exception): a leanmoe bug.

``python hf_family_sweep.py`` prints the markdown table (docs/DESIGN.md keeps one);
test_hf_all_families.py asserts that no family fails.
"""
import copy
import dataclasses
import importlib
import inspect
import os
import re
import sys
from typing import Optional

import torch

from hf_common import experts_modules, rel, run

B, S, VOCAB = 2, 16, 256
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 64, 4, 2, 16
EXPERTS, TOP_K, N_FF = 8, 2, 32
MOE_WORDS = ("sparse", "moe")  # the MoE entries of a layer-kind list (mlp_layer_types, layers_block_type)

# field name -> tiny value (exact names first, then the patterns below, first match wins)
EXACT = {
    "num_experts": EXPERTS, "num_local_experts": EXPERTS, "n_routed_experts": EXPERTS, "moe_num_experts": EXPERTS,
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": 2, "num_layers": 2,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
    "num_experts_per_tok": TOP_K, "num_experts_per_token": TOP_K, "top_k_experts": TOP_K, "moe_k": TOP_K,
    "moe_topk": TOP_K, "top_k": TOP_K,
    "n_shared_experts": 1, "moe_num_shared_experts": 1, "num_shared_experts": 1, "zero_expert_num": 2,
    "first_k_dense_replace": 0, "moe_layer_start_index": 0, "moe_layer_end_index": 1, "moe_layer_interval": 1,
    "decoder_sparse_step": 1, "max_window_layers": 2, "mlp_only_layers": [], "num_dense_layers": 0,
    "enable_moe_block": True, "attn_layer_period": 2, "attn_layer_offset": 0,
    "kv_lora_rank": 16, "q_lora_rank": 24, "o_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": HEAD_DIM, "qk_head_dim": 16, "rotary_dim": 8,
    "sliding_window": 8, "sliding_window_size": 8,
    "index_topk": 16, "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM,
    "indexer_budget": 8, "indexer_compress_ratio": 4, "index_n_heads": 2, "index_num_heads": 2,
    "index_head_dim": HEAD_DIM,
    "linear_num_heads": HEADS, "linear_num_key_heads": 2, "linear_num_value_heads": HEADS,
    "mamba_num_heads": HEADS, "mamba_n_heads": HEADS, "mamba_head_dim": HEAD_DIM, "mamba_d_head": HEAD_DIM,
    "ssm_state_size": 16, "mamba_d_state": 16, "mamba_dt_rank": 8, "n_groups": 1,
    "swa_num_attention_heads": HEADS, "swa_num_key_value_heads": KV_HEADS,
    "unpadded_vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 16,
    "router_hidden_size": 32, "num_sliding_attention_heads": HEADS, "query_pre_attn_scalar": HEAD_DIM,
}
# fields whose default None means "unset" (the model then fails to build) rather than "absent"
FILL_NONE = re.compile(r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_experts_per_tok|"
                       r"top_k_experts|moe_intermediate_size|head_dim|indexer_\w+)$")
# Families whose default config builds or runs no model (a field left None that the model reads,
# all-linear-attention layers that the mask code rejects, an mrope_section the model defaults to for
# 128-wide heads), or whose config validation rejects top-2.
OVERRIDES = {
    "deepseek_ocr2": dict(mlp_layer_types=["dense", "sparse"]),
    "dots1": dict(n_shared_experts=1),
    "ernie4_5_vl_moe": dict(rope_parameters=dict(rope_type="default", rope_theta=500000.0, mrope_section=[3, 3, 2])),
    "glm4v_moe": dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                                           mrope_section=[2, 1, 1])),
    "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"]),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"]),
    "step3p7": dict(sliding_window=EXACT["sliding_window"]),
    "zaya": dict(num_experts_per_tok=1),  # "ZAYA currently supports num_experts_per_tok=1 only"
}
PATTERNS = [  # (regex on the field name, tiny value) for ints larger than the value
    (r"(intermediate_size|ffn_hidden_size|moe_hidden_size|share_expert_dim|expert_dim)$", N_FF),
    (r"head_dim$", HEAD_DIM),
    (r"(_rank|lowrank)$", 16),
    (r"(_heads)$", HEADS),
    (r"(_embed_dim|_hidden_size)$", 32),
]


@dataclasses.dataclass
class Family:
    name: str  # the models/ folder (the model_type for most)
    experts: list  # decorated experts class names
    model_class: Optional[type] = None
    config_class: Optional[type] = None
    error: str = ""  # why the family was not located


def discover():
    """Every family of the installed transformers with decorated experts, in folder order."""
    import transformers.models as models
    root = os.path.dirname(models.__file__)
    families = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, f"modeling_{name}.py")
        try:
            with open(path) as f:
                source = f.read()
        except OSError:
            continue
        if "@use_experts_implementation" not in source:
            continue
        try:
            module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except Exception as e:  # noqa: BLE001 (an optional dependency missing, say: reported, not failed)
            families.append(Family(name, [], error=f"import failed: {type(e).__name__}: {e}"))
            continue
        classes = {n: c for n, c in vars(module).items() if inspect.isclass(c) and c.__module__ == module.__name__}
        # the class after each decorator in the source (any transformers version), and the classes
        # whose forward is the decorator's (one defined elsewhere and decorated here, say)
        decorated = [re.search(r"\nclass (\w+)", source[m.end():]) for m in
                     re.finditer(r"@use_experts_implementation", source)]
        experts = sorted({m.group(1) for m in decorated if m and m.group(1) in classes} |
                         {n for n, c in classes.items() if _decorated(c)})
        if not experts:
            continue
        model_class = _model_class(classes)
        families.append(Family(name, experts, model_class, getattr(model_class, "config_class", None),
                               "" if model_class else "no CausalLM / TextModel / Model class with a config"))
    return families


def _decorated(cls):
    # use_experts_implementation's forward closes over the experts interface it dispatches through.
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    return code is not None and "experts_interface" in code.co_freevars


def _model_class(classes):
    """The family's causal LM, else its text model (multimodal families), else its base model."""
    def with_config(suffix):
        return [c for n, c in classes.items() if n.endswith(suffix) and not n.endswith("PreTrainedModel")
                and getattr(c, "config_class", None) is not None and not getattr(c.config_class, "sub_configs", None)]
    for suffix in ("ForCausalLM", "TextModel", "Model"):
        found = with_config(suffix)
        if found:
            return found[0]
    return None


def _tiny(name, value, layers):
    """The tiny value of one config field (value: its default), or the default itself."""
    if value is None and not FILL_NONE.match(name) or isinstance(value, bool) and name not in EXACT:
        return value
    if re.search(r"dropout", name) and isinstance(value, float):
        return 0.0
    if name.endswith("token_id"):
        return [v if v < VOCAB else VOCAB - 1 for v in value] if isinstance(value, list) else \
            (value if not isinstance(value, int) or value < VOCAB else VOCAB - 1)
    if value == 0 and not isinstance(value, bool):  # 0 means "none" (no RoPE part, no dense layer)
        return value
    if name in EXACT and not (isinstance(value, list) and not isinstance(EXACT[name], list)):
        return EXACT[name]
    if isinstance(value, list) and layers and len(value) == layers:
        return _two_layers(value)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value) and \
            any(v in MOE_WORDS for v in value):
        return _two_layers(value)  # a block pattern (nemotron_h's layers_block_type)
    if name == "per_layer_config" and isinstance(value, dict):
        return {k: {f: _tiny(f, v, layers) for f, v in d.items()} for k, d in value.items()
                if k.isdigit() and int(k) < 2}
    for pattern, tiny in PATTERNS:
        if re.search(pattern, name):
            if value is None or isinstance(value, int) and value > tiny:
                return tiny
            if isinstance(value, list) and all(isinstance(v, int) for v in value):
                return [min(v, tiny) for v in value]
    return value


def _two_layers(kinds):
    """Two layers of a per-layer list: one MoE layer at least (a non-MoE one first when there is one),
    else the first two distinct kinds (sliding and full attention, say)."""
    if all(isinstance(v, str) for v in kinds):
        moe = [v for v in kinds if v in MOE_WORDS]
        if moe:  # with an attention layer when there is one (a hybrid model needs one for its mask)
            other = sorted((v for v in kinds if v not in MOE_WORDS),
                           key=lambda v: "attention" not in v or "linear" in v)
            return [other[0] if other else moe[0], moe[0]]
        second = next((v for v in kinds if v != kinds[0]), kinds[1] if len(kinds) > 1 else kinds[0])
        return [kinds[0], second]
    return list(kinds[:2])


def tiny_config(config_class, family=""):
    """The config class's defaults with every size field shrunk (see EXACT and PATTERNS)."""
    defaults = config_class().to_dict()
    layers = defaults.get("num_hidden_layers", defaults.get("num_layers"))
    kwargs = {}
    for name, value in defaults.items():
        tiny = _tiny(name, value, layers)
        if tiny != value:
            kwargs[name] = tiny
    if (defaults.get("n_group") or defaults.get("num_expert_group") or 1) > 1:
        # group-limited top-K: 2 groups of 4 experts, 1 group kept
        kwargs.update(n_group=2, topk_group=1)
    if defaults.get("num_key_value_heads") == defaults.get("num_attention_heads"):  # MHA (MLA) stays MHA
        kwargs["num_key_value_heads"] = HEADS
    if "qk_head_dim" in defaults and "qk_nope_head_dim" in defaults:
        kwargs["qk_head_dim"] = kwargs.get("qk_nope_head_dim", 8) + kwargs.get("qk_rope_head_dim", 8)
    rope = "qk_rope_head_dim" if defaults.get("qk_rope_head_dim") else "head_dim"
    if rope == "qk_rope_head_dim" and defaults.get("head_dim") == defaults[rope]:  # MLA: head_dim is the rope part
        kwargs["head_dim"] = kwargs[rope]
    if defaults.get(rope) and isinstance(defaults.get("rope_parameters"), dict):
        kwargs["rope_parameters"] = _scaled_mrope(defaults["rope_parameters"], kwargs[rope] / defaults[rope])
    kinds = [k for k in kwargs.get("layer_types") or defaults.get("layer_types") or [] if isinstance(k, str)]
    if any("sliding" in k for k in kinds) and defaults.get("sliding_window") is None:
        kwargs["sliding_window"] = EXACT["sliding_window"]
    if "mamba_d_head" in defaults and "mamba_expand" in defaults:  # heads x head dim = expand x hidden
        kwargs["mamba_n_heads"] = defaults["mamba_expand"] * HIDDEN // HEAD_DIM
    kwargs.update(OVERRIDES.get(family, {}))
    return config_class(**kwargs)


def _scaled_mrope(rope, scale):
    """rope_parameters with every mrope_section (sections of head_dim / 2 rotary pairs) scaled."""
    if not isinstance(rope, dict):
        return rope
    out = {k: _scaled_mrope(v, scale) for k, v in rope.items()}
    section = rope.get("mrope_section")
    if isinstance(section, list) and section:
        total = max(len(section), round(sum(section) * scale))
        scaled = [max(1, int(v * scale)) for v in section]
        scaled[0] += total - sum(scaled)
        out["mrope_section"] = scaled
    return out


def build(family: Family, seed=0):
    """A tiny fp32 model of the family with eager attention and experts."""
    config = tiny_config(family.config_class, family.name)
    torch.manual_seed(seed)
    model = family.model_class._from_config(config, attn_implementation="eager", experts_implementation="eager")
    return model.float().train()


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (B, S), generator=g)
    return dict(input_ids=ids, labels=ids)


def forward_backward(model, b):
    """run() of test_hf_experts for a causal LM; a base/text model (no loss) gets the mean squared
    distance of its last hidden state to a fixed random target as its loss."""
    if "labels" in inspect.signature(model.forward).parameters:
        out = run(model, b)
        return out.logits, out.loss
    torch.manual_seed(0)
    kwargs = dict(output_router_logits=True) if hasattr(model.config, "output_router_logits") else {}
    hidden = model(input_ids=b["input_ids"], **kwargs).last_hidden_state
    g = torch.Generator().manual_seed(1)
    loss = (hidden - torch.randn(hidden.shape, generator=g)).square().mean()
    loss.backward()
    return hidden, loss


TOLERANCE = 1e-5  # test_hf_experts' fp32 bound
REFUSAL = re.compile(r"has_post_expert_norm|post-expert norm|activation|multiple of|layout|bias|dtype")


def check(family: Family):
    """(outcome, detail) of one family: see the module docstring."""
    if family.model_class is None:
        return "not located", family.error
    b = batch()
    try:
        eager = build(family)
        ours = copy.deepcopy(eager)
        logits_e, loss_e = forward_backward(eager, b)
    except Exception as e:  # noqa: BLE001 (transformers' side: reported, not a leanmoe failure)
        return "not constructible", f"{type(e).__name__}: {_first_line(e)}"
    if not experts_modules(eager):
        return "not constructible", "the tiny model has no experts module"
    ours.set_experts_implementation("leanmoe")
    called = []
    for m in experts_modules(ours):
        m.register_forward_pre_hook(lambda mod, args: called.append(mod))
    try:
        logits_o, loss_o = forward_backward(ours, b)
    except (NotImplementedError, ValueError) as e:
        message = str(e)
        names = {type(m).__name__ for m in experts_modules(ours)} | {str(ours.config.model_type)}
        feature = REFUSAL.search(message)
        if any(n in message for n in names) and feature:  # the table keeps what follows the model's name
            message = re.sub(r"^leanmoe experts implementation: \w+ \([^)]*\)( on [^:]*)?: ", "", message)
            return "refused", _first_line(re.sub(r" \((swiglu|gelu)[^)]*\)\. Use another .*$", "", message))
        return "FAIL", f"a refusal that names no model or feature: {type(e).__name__}: {_first_line(e)}"
    except Exception as e:  # noqa: BLE001
        return "FAIL", f"{type(e).__name__}: {_first_line(e)}"
    if not called:
        return "FAIL", "no experts module ran"
    if any("_leanmoe_experts_spec" not in m.__dict__ for m in called):
        return "FAIL", "an experts module ran without leanmoe"
    errors = {"logits": rel(logits_o, logits_e), "loss": rel(loss_o, loss_e)}
    grads_e = dict(eager.named_parameters())
    for name, p in ours.named_parameters():
        ge = grads_e[name].grad
        if ge is None:
            if p.grad is not None and p.grad.abs().max() > 0:
                return "FAIL", f"{name}: a gradient eager does not have"
            continue
        if p.grad is None:
            return "FAIL", f"{name}: no gradient"
        errors[name] = rel(p.grad, ge)
    worse = [name for name, error in errors.items() if error >= TOLERANCE]
    if "logits" in worse or "loss" in worse:
        return "FAIL", f"mismatch: {worse[0]} relative error {errors[worse[0]]:.2e}"
    if worse:  # gradients fp32 cannot pin down: as close to fp64 as transformers' fp32 experts?
        fp64 = copy.deepcopy(eager).double()
        fp64.zero_grad()
        forward_backward(fp64, b)
        truth, ours_p = dict(fp64.named_parameters()), dict(ours.named_parameters())
        fp32_runs = [grads_e] + _other_fp32_experts_grads(eager, b)
        for name in worse:
            bound = max([TOLERANCE] + [2 * rel(grads[name].grad, truth[name].grad) for grads in fp32_runs])
            to_fp64 = rel(ours_p[name].grad, truth[name].grad)
            if to_fp64 > bound:
                return "FAIL", (f"mismatch: {name} relative error {errors[name]:.2e} "
                                f"(to fp64 {to_fp64:.2e} > {bound:.2e})")
            errors.pop(name)
    spec = leanmoe_spec(called[0])
    short = ", ".join(".".join(n.split(".")[-2:]) for n in worse)
    against = f"; {short} gradients as close to fp64 as transformers'" if worse else ""
    return "match", f"{spec}; {len(set(map(id, called)))} MoE layer(s); max error {max(errors.values()):.1e}{against}"


def _other_fp32_experts_grads(eager, b):
    """The parameters, with gradients, of `eager` run again under transformers' other experts
    implementations (batched_mm, grouped_mm; those it refuses or fails are left out)."""
    runs = []
    for implementation in ("batched_mm", "grouped_mm"):
        model = copy.deepcopy(eager)
        model.zero_grad()
        try:
            model.set_experts_implementation(implementation)
            forward_backward(model, b)
        except Exception:  # noqa: BLE001 (an implementation this transformers or family lacks)
            continue
        runs.append(dict(model.named_parameters()))
    return runs


def leanmoe_spec(module):
    s = module.__dict__["_leanmoe_experts_spec"]
    flags = [f for f in ("interleaved", "transposed", "bias") if getattr(s, f)] + ([] if s.gated else ["no gate"])
    flags += ["post-expert norm"] if s.post_norm else []
    if s.activation == "swiglu_clamped":  # gpt-oss's (alpha 1.702, up offset 1) or DeepSeek-V4's (1, 0)
        flags.insert(0, f"alpha {s.act_alpha:g}, limit {s.act_limit:g}, up offset {s.act_up_offset:g}")
    if s.activation == "swiglu_softcapped":  # Inkling2's
        flags.insert(0, f"gate cap {s.act_alpha:g}, up cap {s.act_limit:g}")
    return s.activation + (f" ({', '.join(flags)})" if flags else "")


def _first_line(e):
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


def table(results):
    import transformers
    counts = {}
    for _, (outcome, _) in results:
        counts[outcome] = counts.get(outcome, 0) + 1
    lines = [f"transformers {transformers.__version__}, torch {torch.__version__}, CPU: "
             + ", ".join(f"{n} {k}" for k, n in counts.items()), "",
             "| family | outcome | detail |", "|---|---|---|"]
    for family, (outcome, detail) in results:
        lines.append(f"| {family.name} | {outcome} | {detail.replace('|', '/')} |")
    return "\n".join(lines)


RESULTS = []  # (family, (outcome, detail)) of the families test_hf_all_families.py checked


def main():
    import leanmoe.hf  # noqa: F401 (registers "leanmoe")
    results = []
    for family in discover():
        results.append((family, check(family)))
        print(family.name, *results[-1][1], sep=" | ", file=sys.stderr, flush=True)
    print(table(results))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
