"""Evaluations: the policy of a version, greedy, on the held-out split, as orders the run follows like others.

An evaluation's work id is `eval-v<version>` for its first try and `eval-v<version>-r<try>` for the next ones:
a lost evaluation is issued again under a new work id (the generators' markers would drop the same one as a
repeat), up to `EVAL_TRIES` times. Its result is one record in metrics.jsonl (`"eval": true`).
"""

from __future__ import annotations

import time
from typing import Any

from streams.theorems import Theorem
from trainer.orders import Order

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
