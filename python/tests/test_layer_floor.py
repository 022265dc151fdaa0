"""dev/layer_floor.py: the grid read from tools/configs.cpp, the graph-replay times from a latest.md-
shaped file (the FP8 and eager tables not taken for them), and the floor's arithmetic on a row worked
by hand. CPU only, standard library."""
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "dev", "layer_floor.py")
spec = importlib.util.spec_from_file_location("layer_floor", SCRIPT)
layer_floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layer_floor)

LATEST = """# summary
## Against SonicMoE as CUDA-graph replays (kernel time: what a training step gets)

| config | leanmoe fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | SonicMoE fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd × | bwd × | fwd+bwd × |
|---|---|---|---|---|---|---|---|---|---|---|---|
| 7B-n256 | 1.305 | 2.344 | 355.4 | 395.7 | 1.214 | 2.313 | 382.0 | 401.0 | 0.93 | 0.99 | 0.97 |

## leanmoe FP8 beside leanmoe bf16 and SonicMoE bf16 (issue 16; CUDA-graph replays)

| config | d | n | FP8 fwd ms | FP8 bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd+bwd TFLOP/s | bf16 fwd ms | bf16 bwd ms | × bf16 fwd |
|---|---|---|---|---|---|---|---|---|---|---|
| 120B-n2048 | 4096 | 2048 | 8.186 | 19.296 | 805.9 | 683.8 | 720.1 | 11.507 | 23.409 | 1.41 |
| gpt-oss-20b | 2880 | 2880 | not applicable (d or n not a multiple of 128) | - | - | - | - | - | - | - |

## Against SonicMoE, eager (host launch path included)

| config | leanmoe fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | SonicMoE fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd × | bwd × | fwd+bwd × |
|---|---|---|---|---|---|---|---|---|---|---|---|
| 30B-n1024 | 6.138 | 12.185 | 537.4 | 541.4 | 6.846 | 12.244 | 481.8 | 538.8 | 1.12 | 1.00 | 1.04 |
"""


def test_grid_shapes_come_from_the_tools_grid():
    shapes = layer_floor.grid_shapes()
    assert shapes["120B-n2048"] == (32768, 4096, 2048, 64, 4)
    assert shapes["7B-n256"] == (24576, 1536, 256, 128, 8)
    assert len(shapes) >= 20


def test_graph_times_take_only_the_bf16_graph_table(tmp_path):
    path = tmp_path / "latest.md"
    path.write_text(LATEST)
    assert layer_floor.graph_times(str(path)) == {"7B-n256": (1.305, 2.344, 1.214, 2.313)}


def test_floor_of_a_row_worked_by_hand():
    # T 4, d 128, n 64, E 2, K 2: R 8, W 128. up: 2·8·128·128 FLOPs; bytes (X 4·128 + W1 2·128·128 +
    # H 8·128 + A 8·64)·2. At a peak of 1 FLOP/s against 1e9 B/s the FLOPs dominate every GEMM step,
    # the bytes the gather-sum.
    forward, backward = layer_floor.steps(4, 128, 64, 2, 2)
    assert [s[0] for s in forward] == ["up", "down", "gather-sum"]
    assert forward[0][1:] == (2 * 8 * 128 * 128, (4 * 128 + 2 * 128 * 128 + 8 * 128 + 8 * 64) * 2)
    assert forward[2][1:] == (0, (8 * 128 + 4 * 128) * 2)
    serial = layer_floor.floor_ms(forward, 1.0, 1e9, overlapped=False)
    gemm_flops = 2 * 8 * 128 * 128 + 2 * 8 * 64 * 128
    assert abs(serial - 1e3 * (gemm_flops + (8 * 128 + 4 * 128) * 2 / 1e9)) < 1e-6
    overlapped = layer_floor.floor_ms(forward, 1.0, 1e9, overlapped=True)
    assert abs(overlapped - 1e3 * gemm_flops) < 1e-6
    assert len(backward) == 5 and sum(s[1] for s in backward) == 2 * gemm_flops  # backward: twice the forward's GEMM FLOPs


def test_table_rows_against_the_bar(tmp_path):
    path = tmp_path / "latest.md"
    path.write_text(LATEST)
    out = subprocess.run([sys.executable, SCRIPT, "--latest", str(path)], capture_output=True, text=True, check=True)
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 7B-n256")]
    assert len(rows) == 2
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    floor, ours, theirs, bar = (float(c) for c in cells[2:6])
    assert abs(bar - theirs / 1.10) < 1e-3
    assert abs(float(cells[6]) - floor / ours) < 0.01 and float(cells[8]) > float(cells[7])


def test_fp8_times_and_floor(tmp_path):
    path = tmp_path / "latest.md"
    path.write_text(LATEST)
    # The FP8 table's numeric rows only (gpt-oss-20b's "not applicable" row left out).
    assert layer_floor.fp8_times(str(path)) == {"120B-n2048": (8.186, 19.296, 11.507, 23.409)}
    # In units u = 2·T·K·d·n FLOPs (down's): up 2u, down u, dH u, dX 2u in FP8 (6u), dW2 u and dW1 2u in
    # bf16 unless fp8_dw (3u). At peak 1 and an FP8 rate of 0.5 (FP8 at 1 FLOP/s too) all 9u cost the
    # same; at rate 1 the FP8 ones cost half.
    T, d, n, E, K = 4, 128, 64, 2, 2
    unit = 2 * T * K * d * n
    assert abs(layer_floor.fp8_floor_ms(T, d, n, E, K, 1.0, 0.5, False) - 1e3 * 9 * unit) < 1e-6
    assert abs(layer_floor.fp8_floor_ms(T, d, n, E, K, 1.0, 1.0, False) - 1e3 * (6 * unit / 2 + 3 * unit)) < 1e-6
    assert abs(layer_floor.fp8_floor_ms(T, d, n, E, K, 1.0, 1.0, True) - 1e3 * 9 * unit / 2) < 1e-6


def test_steps_print_each_step_floor_as_the_larger_time():
    out = subprocess.run([sys.executable, SCRIPT, "--steps", "7B-n256"], capture_output=True, text=True, check=True)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.stdout.splitlines()
            if line.startswith("| 7B-n256")]
    assert [r[1] for r in rows] == ["up", "down", "gather-sum", "dH", "dW2", "dx", "dW1", "dx gather-sum"]
    for r in rows:
        assert float(r[5]) == max(float(r[2]), float(r[3]))
    assert float(rows[2][2]) == 0  # the gather-sum has no GEMM FLOPs
