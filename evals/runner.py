"""Running trainers for an experiment (`python -m evals.es_vs_grpo`, `python -m evals.sweep`): a budget of
training samples becomes whole versions (`plan`), a `python -m trainer` runs as a child process to its end while
the ETA ticks (`run_one`), and what it left in its run directory is read back (`outcome`, `endpoints`).

A version costs population x batch samples in ES (every member answers the version's batch once) and
batch x group_size in GRPO (G samples of each of `batch` theorems), so a budget of N samples buys
N // that versions; the remainder is not spent. Each run evaluates its policy (greedy, on the held-out split)
at version 0, every `iterations // eval_points` versions and at the end, so each curve has several points.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.embedded import die_with_parent
from streams.run_dir import INFO, REPORT, read_json, read_records
from trainer.curves import curve, samples_used

ROOT = Path(__file__).resolve().parents[1]
INTERRUPTED = (130, -2, -15)  # python -m trainer's exit after SIGINT/SIGTERM, or killed by either signal
TICK_S = 10.0  # how often a running trainer's progress is read for the ETA


@dataclass(frozen=True)
class Plan:
    """One algorithm's run: how many samples a version costs, how many versions the budget buys."""

    algo: str
    samples_per_version: int
    iterations: int
    eval_every: int
    flags: tuple[str, ...]  # the algorithm's own trainer flags
    # a wall-clock comparison (evals/es_vs_grpo.py --wall-clock): the run's budget in minutes, and the engine
    # and generator precision chosen for the algorithm (None: the comparison's common ones)
    minutes: float | None = None
    engine: str | None = None
    gen_dtype: str | None = None

    @property
    def samples(self) -> int:
        return self.samples_per_version * self.iterations


def samples_per_version(algo: str, *, population: int = 0, batch: int, group_size: int = 0) -> int:
    """ES: every one of `population` members answers the version's `batch` problems once.
    GRPO: `group_size` samples of each of `batch` theorems."""
    if algo in ("es", "es-lowrank"):
        return population * batch
    if algo == "grpo":
        return batch * group_size
    raise ValueError(f"unknown algo {algo!r}")


WALL_CLOCK_CAP = 100_000  # a wall-clock run's `iterations`: a cap its budget reaches first


def wall_clock_plan(
    algo: str,
    minutes: float,
    per_version: int,
    eval_points: int,
    flags: tuple[str, ...] = (),
    engine: str | None = None,
    gen_dtype: str | None = None,
) -> Plan:
    """A run for `minutes` of wall-clock (`--max-minutes`: the version under way when they run out is finished,
    then the final evaluation), evaluated at version 0, after the first version `minutes / eval_points`
    minutes after the last evaluation (`--eval-every-minutes`) and at the end; `engine` and `gen_dtype` its own."""
    if minutes <= 0:
        raise ValueError("a wall-clock budget must be more than 0 minutes")
    if per_version < 1:
        raise ValueError("a version must cost at least one sample")
    every = round(minutes / max(1, eval_points), 3)
    timed = ("--max-minutes", str(minutes), "--eval-every-minutes", str(every))
    engine_flags = ("--engine", engine) if engine else ()
    return Plan(algo, per_version, WALL_CLOCK_CAP, 0, (*flags, *timed, *engine_flags), minutes, engine, gen_dtype)


def plan(algo: str, budget: int, per_version: int, eval_points: int, flags: tuple[str, ...] = ()) -> Plan:
    """Iterations = budget // per_version (the remainder is not spent); evaluation every
    iterations // eval_points versions (at least 1), plus version 0 and the last."""
    if per_version < 1:
        raise ValueError("a version must cost at least one sample")
    if budget < per_version:
        raise ValueError(f"{algo}: a budget of {budget} samples buys no version at {per_version} samples a version")
    iterations = budget // per_version
    return Plan(algo, per_version, iterations, max(1, iterations // max(1, eval_points)), flags)


def run_one(
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    tick: Callable[[], object] | None = None,
    every_s: float = TICK_S,
) -> tuple[int, float]:
    """Run one trainer to the end, its output in `log_path`, calling `tick` every `every_s` while it runs (the
    ETA, evals/eta.py). (exit status, wall seconds). A SIGTERM to this process is passed on to the trainer,
    which stops its pipeline and exits 130; if this process dies, the kernel sends the trainer SIGTERM
    (PR_SET_PDEATHSIG), so no trainer is left running without it."""
    started = time.monotonic()
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
        previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
        try:
            code = _wait(proc, tick, every_s)
        except KeyboardInterrupt:  # the trainer got the Ctrl-C too (same process group): let it stop its pipeline
            code = proc.wait()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
    return code, round(time.monotonic() - started, 1)


def _wait(proc: subprocess.Popen, tick: Callable[[], object] | None, every_s: float) -> int:
    while True:
        try:
            return proc.wait(timeout=every_s if tick else None)
        except subprocess.TimeoutExpired:  # still running: time to say how far the job is
            tick()


def outcome(run_dir: Path, wall_clock: bool = True) -> dict[str, Any]:
    """What a finished (or stopped) run left: its versions, the trainer's own wall time and counts (report.json),
    the training samples its updates used and its held-out curve (metrics.jsonl; `wall_clock`: each point's
    `wall_s` from the trainer's start in run.json, else None)."""
    records = read_records(run_dir)
    report = read_json(run_dir / REPORT) or {}
    started = (read_json(run_dir / INFO) or {}).get("started") if wall_clock else None
    return {
        "versions": report.get("version"),
        "trainer_wall_s": report.get("wall_s"),
        "counts": report.get("counts", {}),
        "samples_used": samples_used(records),
        "curve": curve(records, started),
    }


def endpoints(points: list[dict[str, Any]]) -> dict[str, Any]:
    """A curve's held-out reward and exact success at its first and last evaluation, and the reward's gain
    between them (None where the curve has no evaluation)."""
    first, last = (points[0], points[-1]) if points else ({}, {})
    start, end = first.get("held_out_reward"), last.get("held_out_reward")
    return {
        "reward_start": start,
        "reward_end": end,
        "gain": None if start is None or end is None else end - start,
        "exact_start": first.get("held_out_exact"),
        "exact_end": last.get("held_out_exact"),
    }
