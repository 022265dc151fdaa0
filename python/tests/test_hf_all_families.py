"""Every MoE family of the installed transformers (experts decorated with use_experts_implementation,
found at run time, so that a new transformers release is checked as it is installed) against
experts_implementation="leanmoe": it matches eager (logits, loss, every gradient; fp32, CPU) or
leanmoe refuses it with an error naming the model and the feature. A family whose tiny model
transformers itself cannot build or run is skipped, saying why. See hf_family_sweep.py; the
terminal summary lists every family that is not a match."""
import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.integrations.moe")

import leanmoe.hf  # noqa: E402,F401 (registers "leanmoe")
import hf_family_sweep  # noqa: E402

FAMILIES = hf_family_sweep.discover()


def test_discovery_finds_the_known_families():
    names = {f.name for f in FAMILIES}
    assert {"mixtral", "olmoe", "qwen3_moe", "gpt_oss"} <= names, sorted(names)
    assert all(f.model_class is not None for f in FAMILIES if f.name in ("mixtral", "olmoe", "qwen3_moe", "gpt_oss"))


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_family_matches_eager_or_is_refused_by_name(family):
    outcome, detail = hf_family_sweep.check(family)
    hf_family_sweep.RESULTS.append((family, (outcome, detail)))
    if outcome in ("not constructible", "not located"):
        pytest.skip(f"transformers {transformers.__version__}: {family.name}: {outcome}: {detail}")
    assert outcome in ("match", "refused"), f"{family.name}: {detail}"
