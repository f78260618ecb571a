"""The plots of the experiments (evals/es_vs_grpo_report.py, evals/sweep.py): held-out reward against training
samples, one line per algorithm or configuration, the mean of its seeds with their min-max band. Drawn with the
project's one pyplot loader and PNG saver (trainer/plots.py)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from trainer.curves import SAMPLES_LABEL
from trainer.plots import save


def mean_band(ax: Any, curves: list[list[dict[str, Any]]], label: str, color: str | None = None) -> None:
    """The mean held-out reward of several runs' curves (points with `samples`), and their min-max band where
    there are several; cut to the shortest curve."""
    curves = [[p for p in c if p["samples"] is not None] for c in curves]
    n = min(len(c) for c in curves)
    x = [statistics.fmean(c[i]["samples"] for c in curves) for i in range(n)]
    ys = [[c[i]["held_out_reward"] for c in curves] for i in range(n)]
    (line,) = ax.plot(x, [statistics.fmean(y) for y in ys], marker="o", color=color, label=label)
    if len(curves) > 1:
        ax.fill_between(x, [min(y) for y in ys], [max(y) for y in ys], color=line.get_color(), alpha=0.15)


def finish(fig: Any, ax: Any, path: Path, title: str, ylabel: str, legend_size: int = 8) -> Path:
    """Label the axes (training samples across), title, grid and legend, then write the PNG (trainer/plots.py)."""
    ax.set_xlabel(SAMPLES_LABEL)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    return save(fig, path)
