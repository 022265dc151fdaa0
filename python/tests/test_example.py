"""examples/finetune_olmoe.py runs end to end (tiny config, CPU) and both modes print the same losses,
in fp32 and with the expert GEMMs in FP8 (bf16 by default with fp8); bad flags are usage errors."""
import os
import re
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "finetune_olmoe.py")


@pytest.mark.parametrize("flags", [[], ["--precision", "fp8"]])
def test_example_runs_and_modes_agree(flags):
    out = subprocess.run([sys.executable, EXAMPLE, "--steps", "3", "--seq", "32", *flags], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    losses = {m: re.findall(rf"\[{m}\] step +\d+ +loss ([\d.]+)", out.stdout) for m in ("standard", "in_backward")}
    assert len(losses["standard"]) == 3 and losses["standard"] == losses["in_backward"]
    assert "tokens/s" in out.stdout and "peak memory" in out.stdout


# A misspelt mode ("in-backward", train_lm.py's spelling) trained the standard way under that name and
# then crashed on a KeyError; --steps 0 crashed on an unbound loss, --batch/--seq 0 inside the model.
@pytest.mark.parametrize("flags, argument", [
    (["--modes", "standard,in-backward"], "--modes"),
    (["--modes", ""], "--modes"),
    (["--steps", "0"], "--steps"),
    (["--batch", "0"], "--batch"),
    (["--seq", "-1"], "--seq"),
])
def test_example_refuses_bad_flags(flags, argument):
    out = subprocess.run([sys.executable, EXAMPLE, "--steps", "1", "--seq", "16", *flags], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2, (out.returncode, out.stdout[-500:], out.stderr[-2000:])
    assert f"argument {argument}" in out.stderr and "Traceback" not in out.stderr and "step" not in out.stdout


TRAIN_LM = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_lm.py")


# train_lm.py --runs fp8 on the CPU preset (fp32, d 64) built the corpus and the model, then died in
# leanmoe.MoE with a traceback; its flag rules are checked first, like the others (no corpus read).
@pytest.mark.parametrize("flags, rule", [
    (["--d", "128", "--n", "128"], "--dtype bfloat16"),
    (["--dtype", "bfloat16", "--d", "128", "--n", "96"], "--n"),
])
def test_train_lm_refuses_fp8_without_its_rules(tmp_path, flags, rule):
    out = subprocess.run([sys.executable, TRAIN_LM, "--device", "cpu", "--runs", "topk,fp8", "--steps", "2",
                          "--out", str(tmp_path), *flags], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "argument --runs: fp8" in out.stderr and rule in out.stderr and "data:" not in out.stdout, out.stderr
