"""examples/train_lm.py at CPU size (2 layers, d 64, E 8, K 2, a 1.5 MB sample of site-packages'
Python files): the validation loss falls, in-backward updates stay bitwise equal to standard
training after every step, and a run resumed from a checkpoint, in the same process and in a new
one, ends bitwise equal to the uninterrupted run."""
import importlib.util
import json
import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_lm.py")
STEPS = 300


def train_lm(*args):
    # One thread: the ops are tiny, and OpenMP's spin-waiting makes two threads on a busy 2-core
    # machine many times slower than one.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, EXAMPLE, "--device", "cpu", *args], capture_output=True, text=True,
                         timeout=900, env=env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return out.stdout


def load(folder, name):
    with open(os.path.join(folder, f"run_{name}.json")) as f:
        return json.load(f)


def test_train_lm_learns_and_its_checks_pass(tmp_path):
    out = str(tmp_path / "out")
    log = train_lm("--steps", str(STEPS), "--runs", "topk,tr-nearest,in-backward", "--check-inbackward", str(STEPS),
                   "--check-resume", "50", "--save-every", "150", "--out", out)
    runs = {name: load(out, name) for name in ("topk", "tr-nearest", "in-backward")}
    for name, r in runs.items():
        assert len(r["train_loss"]) == STEPS and len(r["val"]) == 11, name
        first, last = r["val"][0][2], r["final_val_loss"]
        assert last < first - 1.0, f"{name}: validation loss {first:.3f} -> {last:.3f}"
        assert r["tokens_per_s"] > 0 and r["step_ms_median"] > 0 and r["peak_gib"] > 0
    topk, inb = runs["topk"], runs["in-backward"]
    assert runs["tr-nearest"]["routing"] == "token_rounding" and runs["tr-nearest"]["eval_routing"] == "topk"
    # Routing statistics of the training steps at the validation points: top-K moves nothing; nearest
    # rounding moves each expert's count by at most tile/2, so at most E * tile/2 of the T*K pairs.
    for name, r in runs.items():
        stats = [s for _, s in r["routing_stats"]]
        assert len(stats) == 10, name
        for s in stats:
            assert s["rows_per_expert"] == 8 * 64 * 2 / 8 and 0 <= s["f_min"] <= s["f_max"] <= 8 * 64, s
            moved = s["dropped_max"] + s["added_max"]
            assert 0 <= moved <= (0 if r["routing"] == "topk" else 8 * 16 / 2 / (8 * 64 * 2)), s
    assert sum(s["dropped"] + s["added"] for _, s in runs["tr-nearest"]["routing_stats"]) > 0
    assert "final_val_loss_train_routing" not in topk
    assert abs(runs["tr-nearest"]["final_val_loss_train_routing"] - runs["tr-nearest"]["final_val_loss"]) < 0.5

    check = inb["checks"]["in_backward_bitwise"]
    assert check["passed"] and check["steps"] == STEPS, check
    resume = topk["checks"]["resume"]
    assert resume["passed"] and resume["resumed_at"] == STEPS - 50, resume
    # Separate runs, same seed and batches: the in-backward run ends where the top-K run ends.
    assert inb["param_digest"] == topk["param_digest"] and inb["train_loss"] == topk["train_loss"]

    report = open(os.path.join(out, "results.md")).read()
    assert "| tr-nearest |" in report
    # The 0.02-nat bar is issue 15's, for the full-size run on a GPU. At this size the final validation
    # loss moves with the seed by more than that (top-K 4.79 / 4.90 / 4.80 at seeds 0-2, token
    # rounding's difference +0.017 / +0.047 / -0.033; and seed 0's difference exceeded 0.02 on another
    # machine's CPU). So here: the report's verdict agrees with the runs' numbers, and the difference
    # stays under 0.1 nats, twice the largest of those three.
    dv = runs["tr-nearest"]["final_val_loss"] - topk["final_val_loss"]
    assert abs(dv) < 0.1, dv
    verdict = "PASS" if abs(dv) <= 0.02 else "FAIL"
    assert f"- tr-nearest: |Δ val loss| {abs(dv):.4f} {'<=' if verdict == 'PASS' else '>'} 0.02 nats: {verdict}" in report
    checks = [line for line in report.splitlines() if line.startswith("- ") and "Δ val loss" not in line]
    assert sum("PASS" in line for line in checks) >= 2 and not any("FAIL" in line for line in checks), checks
    assert "FAILED" not in log

    # A new process resumes the in-backward run from its step-150 checkpoint (ExpertAdamW's state
    # restored, updates again inside backward) and ends bitwise where the uninterrupted run ended.
    resumed_out = str(tmp_path / "resumed")
    train_lm("--resume", os.path.join(out, "checkpoints", "in-backward-step150.pt"), "--out", resumed_out)
    resumed = load(resumed_out, "in-backward")
    assert resumed["param_digest"] == inb["param_digest"]
    assert resumed["optimizer_digest"] == inb["optimizer_digest"]
    assert resumed["train_loss"] == inb["train_loss"] and resumed["val"] == inb["val"]

    # The report again from the JSON alone.
    plot = os.path.join(out, "val_loss.png")
    assert os.path.exists(plot) == (importlib.util.find_spec("matplotlib") is not None)
    for f in (os.path.join(out, "results.md"), plot):
        if os.path.exists(f):
            os.remove(f)
    subprocess.run([sys.executable, EXAMPLE, "--plot-only", out], check=True, capture_output=True, timeout=300)
    assert open(os.path.join(out, "results.md")).read() == report
    assert os.path.exists(plot) == (importlib.util.find_spec("matplotlib") is not None)


def test_train_lm_fp8_run_learns_and_is_judged_against_topk(tmp_path):
    """The fp8 run (leanmoe.MoE precision="fp8") at widths FP8 takes (d, n multiples of 128): it
    learns, it is not the bf16 run under another name, and results.md judges it against top-K."""
    out = str(tmp_path / "out")
    train_lm("--steps", "40", "--runs", "topk,fp8", "--d", "128", "--n", "128", "--heads", "4", "--dtype", "bfloat16",
             "--out", out)
    topk, fp8 = load(out, "topk"), load(out, "fp8")
    assert fp8["precision"] == "fp8" and topk["precision"] == "storage"
    assert fp8["final_val_loss"] < fp8["val"][0][2] - 0.5
    assert fp8["train_loss"] != topk["train_loss"]  # e4m3 operands change the losses, slightly
    assert abs(fp8["final_val_loss"] - topk["final_val_loss"]) < 0.2
    # Each final model validated in the other precision: the GEMMs change the loss, a little.
    assert fp8["final_val_loss_other_precision"][0] == "storage" and topk["final_val_loss_other_precision"][0] == "fp8"
    for r in (topk, fp8):
        assert 0 < abs(r["final_val_loss_other_precision"][1] - r["final_val_loss"]) < 0.1
    with open(os.path.join(out, "results.md")) as f:
        text = f.read()
    assert "- fp8: |Δ val loss|" in text and "- fp8: the final model validated with its expert GEMMs in storage" in text
