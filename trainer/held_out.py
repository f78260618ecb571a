"""Evaluations: the policy of a version, greedy, on the held-out split, as orders the run follows like others.

An evaluation's work id is `eval-v<version>` for its first try and `eval-v<version>-r<try>` for the next ones:
a lost evaluation is issued again under a new work id (the generators' markers would drop the same one as a
repeat), up to `EVAL_TRIES` times. Its result is one record in metrics.jsonl (`"eval": true`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from streams.theorems import Theorem
from trainer.orders import Order

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
    """A complete evaluation's result: mean reward and exact success over the held-out problems."""
    return {
        "version": done.center,
        "held_out_reward": round(done.score, 6),
        "held_out_exact": round(done.proved / max(1, done.expected), 6),
        "problems": done.expected,
    }


def record(result: dict[str, Any]) -> dict[str, Any]:
    """The evaluation's line in metrics.jsonl."""
    return {"eval": True, **result, "time": time.time()}


class Evaluations:
    """Which versions a run evaluates, and the results of those done, each written to metrics.jsonl once."""

    def __init__(self, theorems: list[Theorem], sink: MetricsSink) -> None:
        self.theorems = theorems
        self.sink = sink
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
                if o.center not in self.in_jsonl:  # written before a kill, and redone since: once
                    self.sink.write(record(done))
                    self.in_jsonl.add(o.center)
                del state.evals[work_id]
