"""`python -m ops.gpu_check --experiment` (ops/gpu/experiment.py): the sizing against figures worked out by hand,
the probe's figures from a run directory's files, and the refusal without a GPU. The command itself was
rehearsed end to end with `--device cpu` (docs/results/gpu-rehearsal-cpu/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.gpu.experiment import Floors, Probe, Shape, eval_every, partial, probe_figures, size

ROOT = Path(__file__).resolve().parents[2]
TARGET = Shape(population=32, batch=64, versions=100, held_out=128, evals=5)


def test_on_a_fast_device_the_targets_fit_and_evaluations_spread_over_the_versions():
    # 2.048 s a version of 2,048 rows: 0.001 s a row; 300 s less 30 s of start-up; 5 x 128 rows of evaluation
    sized = size(5, TARGET, Probe(32, 64, startup_s=30, version_s=2.048))
    assert sized["shape"] == {"population": 32, "batch": 64, "versions": 100, "held_out": 128, "evals": 5}
    assert sized["eval_every"] == 25  # evaluations at 0, 25, 50, 75, 100
    assert sized["expected_s"] == pytest.approx(30 + 0.64 + 100 * 2.048, abs=0.05) and sized["fits"]
    assert sized["why"] == ["the targets fit"]


def test_a_slower_device_keeps_the_shape_and_gets_the_versions_the_time_buys():
    # 4 s a version: 260 s left after start-up, 1.25 s of evaluations, (260 - 1.25) // 4 = 64 versions
    sized = size(5, TARGET, Probe(32, 64, startup_s=40, version_s=4.0))
    assert (sized["shape"]["population"], sized["shape"]["batch"], sized["shape"]["versions"]) == (32, 64, 64)
    assert sized["eval_every"] == 16 and sized["why"] == ["100 versions -> 64: what the time buys"]


def test_below_the_fewest_versions_the_problems_a_member_halve_first():
    # 0.02 s a row: 32 x 64 costs 40.96 s a version, 7 in (300 - 12.8) s; 32 x 32 costs 20.48 s, 14 versions
    sized = size(5, TARGET, Probe(32, 64, startup_s=0, version_s=40.96))
    assert (sized["shape"]["population"], sized["shape"]["batch"], sized["shape"]["versions"]) == (32, 32, 14)
    assert sized["why"] == ["32 x 64 -> 32 x 32: 10 versions at least"]


def test_on_a_gpu_the_shape_stays_and_gets_the_versions_the_time_buys_however_few():
    # the H200's probe (docs/results/gpu/): 28.166 s a version of 32 x 64, start-up 0; 3 minutes. Held-out:
    # 5 x 128 rows at 28.166 / 2048 s = 8.80 s, within a quarter of 180 s. (180 - 8.80) // 28.166 = 6
    # versions at 32 x 64: halving the problems would not buy more there, where a version's cost does not
    # follow its rows (32 x 32 took 18-42 s a version)
    sized = size(3, TARGET, Probe(32, 64, startup_s=0, version_s=28.166), follows_rows=False)
    assert sized["shape"] == {"population": 32, "batch": 64, "versions": 6, "held_out": 128, "evals": 5}
    assert sized["version_s"] == 28.166 and sized["fits"]
    assert sized["why"] == [
        "100 versions -> 6: what the time buys",
        "shape kept below 10 versions: on a GPU a version's cost does not follow its rows",
    ]


def test_on_a_cpu_held_out_then_problems_then_population_shrink_to_their_floors():
    # probe 4 x 8 at 32 s a version: 1 s a row; 180 s less 60 s of start-up leaves 120 s. Held-out: 5
    # evaluations of 128, 64, 32 rows all take more than a quarter (30 s); 16 is the floor (80 s). 40 s train:
    # no version at 32 x 64 down to 32 x 4, nor at 16 x 4 (64 s), 8 x 4: 1 version, 4 x 4 (16 s): 2
    sized = size(3, TARGET, Probe(4, 8, startup_s=60, version_s=32))
    assert sized["shape"] == {"population": 4, "batch": 4, "versions": 2, "held_out": 16, "evals": 5}
    assert sized["eval_s"] == 16 and sized["version_s"] == 16 and sized["expected_s"] == 172 and sized["fits"]
    assert sized["why"] == [
        "held-out 128 -> 16: 5 evaluations within a quarter of the time",
        "32 x 64 -> 4 x 4: 10 versions at least",
    ]
    # floors of its own: it stops there, one version at least even where none fits
    tight = size(3, TARGET, Probe(4, 8, startup_s=170, version_s=32), Floors(held_out=8, batch=8, population=8))
    assert tight["shape"]["versions"] == 1 and not tight["fits"] and tight["shape"]["batch"] == 8


def test_evaluations_are_version_0_every_kth_and_the_last_at_most_the_number_asked():
    assert [eval_every(v, 5) for v in (100, 64, 8, 7, 2, 1)] == [25, 16, 2, 2, 1, 1]
    for versions in range(1, 120):
        k = eval_every(versions, 5)
        evaluated = {0, versions} | set(range(k, versions + 1, k))
        assert len(evaluated) <= 5 or k == 1


def test_the_probes_figures_come_from_its_start_and_its_versions_times(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"started": 1000.0}))
    records = [{"version": v, "algo": "es", "attempts": 32, "samples": 32 * v, "time": t} for v, t in
               ((2, 1060.0), (1, 1050.0), (3, 1072.0))]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    probe = probe_figures(tmp_path, 4, 8)
    # versions 10 s and 12 s apart: 11 s a version (the median); the first at 50 s, less a version: 39 s
    assert (probe.version_s, probe.startup_s) == (11.0, 39.0) and probe.row_s == pytest.approx(11 / 32)
    (tmp_path / "metrics.jsonl").write_text(json.dumps(records[1]) + "\n")
    with pytest.raises(RuntimeError, match="fewer than two versions"):
        probe_figures(tmp_path, 4, 8)


def test_a_failed_run_keeps_the_curve_and_samples_its_metrics_hold(tmp_path):
    """A run killed mid-way wrote no report, but its metrics.jsonl holds its evaluations so far: the JSON keeps
    them (marked partial) beside the error, and a run that wrote nothing keeps nothing."""
    (tmp_path / "run.json").write_text(json.dumps({"started": 1000.0}))
    records = [
        {"version": 0, "eval": True, "held_out_reward": 0.25, "held_out_exact": 0.125, "problems": 16, "time": 1010.0},
        {"version": 1, "algo": "grpo", "attempts": 48, "samples": 48, "time": 1200.0},
        {"version": 1, "eval": True, "held_out_reward": 0.5, "held_out_exact": 0.25, "problems": 16, "time": 1230.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    kept = partial(tmp_path, ["--algo", "grpo"])
    assert (kept["partial"], kept["samples"], kept["command"]) == (True, 48, "python -m trainer --algo grpo")
    assert [(p["version"], p["samples"], p["held_out_reward"], p["wall_s"]) for p in kept["curve"]] == [
        (0, 0, 0.25, 10.0),
        (1, 48, 0.5, 230.0),
    ]
    assert partial(tmp_path / "nothing", ["--algo", "grpo"]) is None


def test_without_a_gpu_the_experiment_refuses_with_the_reason_and_writes_nothing(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the experiment would run")
    argv = [sys.executable, "-m", "ops.gpu_check", "--experiment", "--out", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert "sees no CUDA device" in done.stderr and "--device cpu` rehearses it" in done.stderr
    assert list(tmp_path.iterdir()) == []
