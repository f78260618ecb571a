"""Evaluations: the policy of a version, greedy, on the held-out split, as orders the run follows like others.

An evaluation's work id is `eval-v<version>` for its first try and `eval-v<version>-r<try>` for the next ones:
a lost evaluation is issued again under a new work id (the generators' markers would drop the same one as a
repeat), up to `EVAL_TRIES` times. Its result is one record in metrics.jsonl (`"eval": true`): the means
(Countdown's credit by part too, `held_out_parts`), and for the comparison of the first and last evaluation
(streams/learned.py) each problem's reward and the problems solved; the run's checkpoint keeps the means
only (a record a problem in a state written every few seconds would grow with the run). When it lands the
console says so in one line (`announce`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streams.theorems import Theorem
from trainer.orders import Order, mean_parts

if TYPE_CHECKING:
    from trainer.metrics import MetricsSink
    from trainer.run_state import RunState

EVAL_TRIES = 3  # an evaluation order lost this many times is given up (counted: evals_lost)


def eval_order(version: int, held_out: list[Theorem], work_id: str | None = None) -> Order:
    """The evaluation of `version` on `held_out`; `work_id` names a try after the first."""
    ids = [t.theorem_id for t in held_out]
    return Order(work_id or f"eval-v{version}", version, 0, 1, ids, issued_at=time.time())


def next_try(lost: Order) -> str | None:
    """The work id of the try after `lost`, None once `EVAL_TRIES` were lost."""
    tries = int(lost.work_id.rsplit("-r", 1)[1]) + 1 if "-r" in lost.work_id else 1
    return f"eval-v{lost.center}-r{tries}" if tries < EVAL_TRIES else None


def result(done: Order) -> dict[str, Any]:
    """A complete evaluation's result: mean reward and exact success over the held-out problems, and for
    Countdown the mean credit by part (`held_out_parts`)."""
    out = {
        "version": done.center,
        "held_out_reward": round(done.score, 6),
        "held_out_exact": round(done.proved / max(1, done.expected), 6),
        "problems": done.expected,
    }
    return out | ({"held_out_parts": parts} if (parts := mean_parts([done])) else {})


def record(result: dict[str, Any], done: Order | None = None) -> dict[str, Any]:
    """The evaluation's line in metrics.jsonl; with its order `done`, also the seconds from its issue to now
    (`took_s`: what the ETA counts for the final evaluation) and its figures by problem (`problem_rewards`,
    `problems_solved`), which a record backfilled from the checkpoint lacks."""
    now = time.time()
    line = {"eval": True, **result, "time": now}
    if done is not None and done.issued_at:
        line["took_s"] = round(now - done.issued_at, 1)
    if done is not None and done.by_theorem:
        line["problem_rewards"] = {t: r for t, (r, _) in sorted(done.by_theorem.items())}
        line["problems_solved"] = sorted(t for t, (_, proved) in done.by_theorem.items() if proved)
    return line


def landed(result: dict[str, Any], first: dict[str, Any] | None) -> str:
    """The line the console prints when an evaluation lands: `held-out v4: reward 0.128, 1/32 solved (+0.041
    vs v0)`."""
    solved = round(result["held_out_exact"] * result["problems"])
    line = (
        f"held-out v{result['version']}: reward {result['held_out_reward']:.3f}, {solved}/{result['problems']} solved"
    )
    if first is not None and first["version"] != result["version"]:
        line += f" ({result['held_out_reward'] - first['held_out_reward']:+.3f} vs v{first['version']})"
    return line


class Evaluations:
    """Which versions a run evaluates, and the results of those done, each written to metrics.jsonl once."""

    def __init__(
        self, theorems: list[Theorem], sink: MetricsSink, announce: Callable[[str, float | None], None] | None = None
    ) -> None:
        self.theorems = theorems
        self.sink = sink
        self.announce = announce or (lambda line, took_s: None)  # (the landed line, seconds from issue to landing)
        # not checkpointed: the evaluations metrics.jsonl holds a line for (read back at a resume), so that one
        # written before a kill that the checkpoint missed is not written a second time when it is redone
        self.in_jsonl: set[int] = set()

    def wanted(self, state: RunState, version: int) -> bool:
        """`version` has no evaluation yet, done or in flight: a second order would carry the same work id,
        which the generators drop as a repeat, and the run would wait for its rewards until the deadline."""
        in_flight = any(o.center == version for o in state.evals.values())
        return bool(self.theorems) and version not in state.eval_results and not in_flight

    def collect(self, state: RunState) -> None:
        """Move the complete evaluations of `state` to its results, and their records to metrics.jsonl."""
        for work_id, o in list(state.evals.items()):
            if o.complete:
                state.eval_results[o.center] = done = result(o)
                line = record(done, o)
                if o.center not in self.in_jsonl:  # written before a kill, and redone since: once
                    self.sink.write(line)
                    self.in_jsonl.add(o.center)
                del state.evals[work_id]
                first = state.eval_results[min(state.eval_results)]
                self.announce(landed(done, first), line.get("took_s"))
