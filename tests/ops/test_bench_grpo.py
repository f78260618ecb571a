"""`python -m ops bench grpo` on the real default model at a tiny batch: it steps both precisions on the same
batch and reports what it timed. Its speed figures are measurements (docs/PERFORMANCE.md), so only their
arithmetic is asserted here; that the two precisions step alike is tests/trainer/test_grpo.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


@pytest.mark.slow  # minutes of real-model work: its file is handed out first (tests/conftest.py)
def test_the_bench_steps_both_precisions_and_writes_its_json(tmp_path):
    out = tmp_path / "grpo.json"
    argv = ["--groups", "1", "--group-size", "2", "--completion-tokens", "3", "--rounds", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "ops", "bench", "grpo", *argv, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == result
    assert (result["groups"], result["group_size"], result["completion_tokens"]) == (1, 2, 3)
    assert len(result["fp32_steps_s"]) == len(result["bf16_mixed_steps_s"]) == 1
    assert result["speedup"] == pytest.approx(result["fp32_step_s"] / result["bf16_mixed_step_s"], rel=0.02)
    assert 0 < result["grad_norm_rel_diff"] < 0.05  # two different computations of nearly the same gradient
    assert 50 < result["prompt_tokens"][0] < 400  # a real Countdown chat prompt under the model's template
