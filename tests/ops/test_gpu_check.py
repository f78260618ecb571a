"""`python -m ops.gpu_check --full` (ops/gpu/full.py): it refuses to measure a GPU that is not there, and what
it records of a run is read from the run's own files. (The whole check runs on a GPU box, or rehearsed with
`--device cpu`: docs/results/gpu/.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.gpu.full import run_figures

ROOT = Path(__file__).resolve().parents[2]


def test_without_a_gpu_the_full_check_refuses_with_the_reason_and_writes_nothing(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the check would run")
    done = subprocess.run(
        [sys.executable, "-m", "ops.gpu_check", "--full", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "sees no CUDA device" in done.stderr and "--device cpu` rehearses it" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_runs_figures_come_from_its_report_and_metrics(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"version": 2, "wall_s": 301.4, "counts": {"samples": 128}}))
    lines = [
        {"eval": True, "version": 0, "held_out_reward": 0.09, "held_out_exact": 0.0, "problems": 32},
        {"version": 1, "step_s": 4.0, "generator_tokens_per_s": 100.0, "generator_busy_share": 0.5},
        {
            "version": 2,
            "step_s": 2.0,
            "generator_tokens_per_s": 120.5,
            "generator_busy_share": 0.75,
            "verifier_utilization": 0.1,
            "dead_letters": 0,
        },
        {"eval": True, "version": 2, "held_out_reward": 0.3, "held_out_exact": 0.125, "problems": 32},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert run_figures(tmp_path, 999.0) == {
        "versions": 2,
        "samples": 128,
        "wall_s": 301.4,
        "held_out_start": {"version": 0, "reward": 0.09, "exact": 0.0},
        "held_out_end": {"version": 2, "reward": 0.3, "exact": 0.125},
        "generator_tokens_per_s": 120.5,
        "generator_busy": 0.75,  # the engine's own, as its last report says
        "verifier_utilization": 0.1,
        "dead_letters": 0,
        "step_s": 3.0,  # the median step
    }
