import importlib.util
import os
import sys

import pytest

# The Python tests need torch (and the installed leanmoe package); without torch they are not collected.
if importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]
    torch = None
else:
    import torch

sys.path.insert(0, os.path.dirname(__file__))  # reference.py

DEVICES = ["cpu"] + (["cuda"] if torch is not None and torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    if request.param == "cuda":
        import leanmoe
        if not leanmoe.cuda_available():
            pytest.skip("leanmoe built without its CUDA backend")
    return request.param


def skip_unsupported(device, dtype):
    """The CUDA backend stores bf16 only (fp32 storage runs on the CPU backend)."""
    if device == "cuda" and dtype != torch.bfloat16:
        pytest.skip("the CUDA backend stores bf16 only")


def widths(device):
    """(d, n) for a test layer: the CUDA expert GEMMs need d and n to be multiples of 64."""
    return (128, 64) if device == "cuda" else (64, 32)


def pytest_terminal_summary(terminalreporter):
    """The outcome of every transformers family test_hf_all_families.py checked that is not a match."""
    sweep = sys.modules.get("hf_family_sweep")
    results = getattr(sweep, "RESULTS", None)
    if not results:
        return
    counts = {}
    for _, (outcome, _) in results:
        counts[outcome] = counts.get(outcome, 0) + 1
    terminalreporter.section("transformers MoE families on leanmoe")
    terminalreporter.line(", ".join(f"{n} {k}" for k, n in counts.items()))
    for family, (outcome, detail) in results:
        if outcome != "match":
            terminalreporter.line(f"{family.name}: {outcome}: {detail[:160]}")
