"""Held-out curves from a run's metrics records, and the one plot that compares runs by them: held-out reward
(solid) and exact success (dashed) against training samples and against wall time, a colour per run. Here,
below both `python -m ops compare` and `python -m evals.es_vs_grpo` (neither may import the other), next to the
records the trainer writes.

The x coordinate of an evaluation is the number of training attempts the updates up to its version consumed
(its version's `samples`, which every version's metrics carry: trainer/loop.py `_publish`); version 0 is at 0,
and a version whose record lacks it (written by a trainer from before ES versions carried it) is at None. Its
wall time is the evaluation record's `time` less the trainer's start (run.json), where both are known.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streams.run_dir import newest_update, update_records
from trainer.plots import pyplot, save

SAMPLES_LABEL = "training samples (generated attempts used by updates)"
WALL_LABEL = "wall time (minutes since the trainer started)"


def curve(records: list[dict[str, Any]], started: float | None = None) -> list[dict[str, Any]]:
    """Held-out points in version order: version, samples, held-out reward and exact, problems, and `wall_s`
    (None where the start or the record's time is unknown)."""
    at: dict[int, int | None] = {0: 0}
    for r in update_records(records):
        at[int(r["version"])] = r.get("samples")
    points = []
    for r in sorted((r for r in records if r.get("eval")), key=lambda r: r["version"]):
        v = int(r["version"])
        wall = r["time"] - started if started is not None and "time" in r else None
        points.append(
            {
                "version": v,
                "samples": at.get(v),
                "held_out_reward": r["held_out_reward"],
                "held_out_exact": r["held_out_exact"],
                "problems": r.get("problems"),
                "wall_s": None if wall is None else round(wall, 1),
            }
        )
    return points


def samples_used(records: list[dict[str, Any]]) -> int | None:
    """Training attempts consumed by the run's updates (the last version's x): 0 before the first, None where
    its record does not say."""
    newest = newest_update(update_records(records))
    return 0 if newest is None else newest.get("samples")


def plot_runs(
    runs: list[dict[str, Any]], path: Path, title: str, budget: int | None = None, minutes: float | None = None
) -> Path | None:
    """One figure, two panels: held-out reward (solid, o) and exact success (dashed, ^) of each run against
    training samples (left) and wall time (right). `runs`: [{"label", "curve", "color" (optional)}].
    `budget`: a dotted line at that many samples; `minutes`, at that wall time. None where matplotlib is missing."""
    if (plt := pyplot()) is None:
        return None
    fig, (by_samples, by_time) = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    for i, run in enumerate(runs):
        color = run.get("color") or f"C{i % 10}"
        for ax, key, scale in ((by_samples, "samples", 1.0), (by_time, "wall_s", 1 / 60)):
            pts = [p for p in run["curve"] if p.get(key) is not None]
            x = [p[key] * scale for p in pts]
            ax.plot(
                x, [p["held_out_reward"] for p in pts], marker="o", color=color, label=f"{run['label']} held-out reward"
            )
            ax.plot(
                x,
                [p["held_out_exact"] for p in pts],
                marker="^",
                linestyle="--",
                color=color,
                label=f"{run['label']} held-out exact success",
            )
    if budget is not None:
        by_samples.axvline(budget, color="grey", linewidth=0.8, linestyle=":")
    if minutes is not None:
        by_time.axvline(minutes, color="grey", linewidth=0.8, linestyle=":")
    by_samples.set_xlabel(SAMPLES_LABEL)
    by_time.set_xlabel(WALL_LABEL)
    by_samples.set_ylabel("held-out reward (solid) / exact success (dashed)")
    for ax in (by_samples, by_time):
        ax.grid(alpha=0.3)
    by_samples.legend(fontsize=7)
    fig.suptitle(title)
    return save(fig, path)
