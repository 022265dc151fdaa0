"""examples/finetune_olmoe.py runs end to end (tiny config, CPU) and both modes print the same losses,
in fp32 and with the expert GEMMs in FP8 (bf16)."""
import os
import re
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "finetune_olmoe.py")


@pytest.mark.parametrize("flags", [[], ["--precision", "fp8", "--dtype", "bfloat16"]])
def test_example_runs_and_modes_agree(flags):
    out = subprocess.run([sys.executable, EXAMPLE, "--steps", "3", "--seq", "32", *flags], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    losses = {m: re.findall(rf"\[{m}\] step +\d+ +loss ([\d.]+)", out.stdout) for m in ("standard", "in_backward")}
    assert len(losses["standard"]) == 3 and losses["standard"] == losses["in_backward"]
    assert "tokens/s" in out.stdout and "peak memory" in out.stdout
