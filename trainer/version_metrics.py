"""The metrics every version carries, ES and GRPO alike, as pure functions of what the update used.

`version_metrics` builds the record that goes to `{ps:R}:metrics` and metrics.jsonl, in this order of keys:
`version`, `algo`, `reward_mean` and `pass_rate` over the attempts used, `attempts` (used by this update),
`samples` (training attempts consumed by the updates so far, with or without a version: the run's x axis),
`stale_dropped`, `staleness` (orders used by their lag, trainer/orders.py `staleness`: {"0": n, ...}, 0 for
the newest version), the verdicts of the rewards read since the last update, rewards read per second,
seconds since the last update and, for Countdown, `parts`: the mean credit by part over the attempts used
(format, expression, numbers, closeness, solved: tasks/countdown_check.py); then the algorithm's own
figures; then `health_figures` (orders in flight, the age of the oldest, evaluations in flight, the orders
lost so far by outcome) and `time`. The pipeline's figures (trainer/pipeline_figures.py) follow.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

from trainer.orders import Order, mean_parts, staleness


def version_metrics(
    version: int,
    algo: str,
    stepped_from: int,
    used: list[Order],
    stale: list[Order],
    samples: int,
    read: Mapping[str, int],
    elapsed_s: float,
) -> dict[str, Any]:
    """The common figures of version `version`, made by an update from version `stepped_from` with the orders
    `used` (dropping `stale`), `elapsed_s` after the last update, the rewards `read` since then by verdict;
    `samples` counts this update's attempts already."""
    attempts = sum(len(o.rewards) for o in used)
    return {
        "version": version,
        "algo": algo,
        "reward_mean": round(sum(sum(o.rewards.values()) for o in used) / max(1, attempts), 6),
        "pass_rate": round(sum(o.proved for o in used) / max(1, attempts), 6),
        "attempts": attempts,
        "samples": samples,
        "stale_dropped": len(stale),
        "staleness": dict(collections.Counter(str(staleness(stepped_from, o.center)) for o in used)),
        "verdicts": dict(read),
        "rewards_per_s": round(sum(read.values()) / max(elapsed_s, 1e-9), 2),
        "update_s": round(elapsed_s, 2),
        **({"parts": parts} if (parts := mean_parts(used)) else {}),
    }


def health_figures(
    running: Iterable[Order], evals_in_flight: int, counts: Mapping[str, int], now: float
) -> dict[str, Any]:
    """Orders in flight (`running`: issued, not yet usable) and the age of the oldest at `now` (a Unix time),
    evaluations in flight, and the orders lost so far by outcome (`cut_<why>`, `evals_reissued`, `evals_lost`)."""
    running = list(running)
    oldest = min((o.issued_at for o in running if o.issued_at), default=None)
    return {
        "in_flight": len(running),
        "oldest_in_flight_s": round(now - oldest, 1) if oldest else None,
        "evals_in_flight": evals_in_flight,
        **{k: v for k, v in counts.items() if k.startswith(("cut_", "evals_"))},
    }
