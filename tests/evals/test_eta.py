"""evals/eta.py: the estimate after the first version and the ETA after each later one, from the versions a
trainer wrote to its metrics.jsonl, with a clock the test sets (so every figure is worked out by hand); and
`run_one` calls the tick while the trainer runs (a real subprocess that waits for what the tick does)."""

from __future__ import annotations

import io
import json
import sys
import time

from evals import runner
from evals.eta import Eta


def _version(run_dir, v: int) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"version": v, "algo": "es", "attempts": 64}) + "\n")
        f.write(json.dumps({"eval": True, "version": v, "held_out_reward": 0.1, "held_out_exact": 0.0}) + "\n")


def test_an_estimate_after_the_first_version_then_the_eta_version_by_version(tmp_path):
    now = [1000.0]
    out = io.StringIO()
    eta = Eta("sweep", 12, clock=lambda: now[0], wall=lambda: 0.0, out=out)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    eta.start(first)
    assert eta.tick() is None  # nothing done yet: nothing to go by
    now[0] = 1050.0
    _version(first, 1)
    at = time.strftime("%H:%M", time.localtime(50 * 11))  # 11 versions left at 50 s each, from wall time 0
    assert (
        eta.tick() == f"sweep: estimate from the first version (50 s): 12 versions, about 10 min 00 s in all, "
        f"done about {at}"
    )
    assert eta.tick() is None  # no new version: no new line
    now[0] = 1090.0
    _version(first, 2)
    eta.done()
    eta.start(second)  # the next run: its versions add to the first's
    now[0] = 1150.0
    _version(second, 1)
    at = time.strftime("%H:%M", time.localtime(50 * 9))  # 3 done in 150 s: 50 s each, 9 left
    assert eta.tick() == f"sweep: 3/12 versions in 2 min 30 s, ETA 7 min 30 s (about {at})"
    assert out.getvalue().count("\n") == 2


def test_run_one_ticks_while_the_trainer_runs(tmp_path):
    flag = tmp_path / "ticked"
    waits_for_a_tick = f"import pathlib, time\nwhile not pathlib.Path({str(flag)!r}).exists(): time.sleep(0.01)"
    ticks = []

    def tick() -> None:
        ticks.append(1)
        flag.touch()

    code, _ = runner.run_one([sys.executable, "-c", waits_for_a_tick], {}, tmp_path / "log", tick=tick, every_s=0.05)
    assert code == 0 and ticks  # the child could only end after a tick made its file
