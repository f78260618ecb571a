"""What `python -m evals.sweep` writes in its folder, after every cell: `sweep.csv` (a row per cell), `sweep.md`
(per configuration over its seeds: held-out reward at the start and the end, the gain's mean and spread, exact
success, samples, wall time), `sweep.json` (every cell's result) and `sweep.png` (held-out reward against
training samples, a line per configuration: the mean over seeds, the band their min-max)."""

from __future__ import annotations

import csv
import io
import itertools
import statistics
from pathlib import Path
from typing import Any

import orjson

from evals import plots
from evals.runner import endpoints
from evals.sweep_grid import GRID
from trainer.plots import pyplot
from trainer.result import duration

CSV_COLUMNS = (
    "key",
    "config",
    "algo",
    *GRID,
    "seed",
    "returncode",
    "versions",
    "samples_used",
    "reward_start",
    "reward_end",
    "gain",
    "exact_start",
    "exact_end",
    "wall_s",
    "run",
)


def row(result: dict[str, Any]) -> dict[str, Any]:
    c, ends = result["cell"], endpoints(result["curve"])
    return {
        "key": c["key"],
        "config": c["config"],
        "algo": c.get("algo", "es"),
        **{k: c.get(k) for k in GRID},
        "seed": c["seed"],
        "returncode": result["returncode"],
        "versions": result["versions"],
        "samples_used": result["samples_used"],
        **ends,
        "gain": None if ends["gain"] is None else round(ends["gain"], 6),
        "wall_s": result["wall_s"],
        "run": result["run"],
    }


def to_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def markdown(rows: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    """Per configuration, over its seeds: mean ± sample standard deviation (n-1)."""
    lines = [
        f"# Sweep: {settings['out']}",
        "",
        "Held-out: greedy decoding of the policy (the ES center) on the held-out split; reward is the "
        "verifier's shaped credit, exact the share solved. gain = end - start, per seed, then mean ± std over "
        "seeds.",
        "",
        "| configuration | seeds | reward start | reward end | gain | exact end | versions | samples | wall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, group in itertools.groupby(
        sorted(rows, key=lambda r: (r["config"], r["seed"])), key=lambda r: r["config"]
    ):
        group = [r for r in group if r["returncode"] == 0]
        if not group:
            continue
        pick = [r for r in group if r["gain"] is not None]
        lines.append(
            f"| {config} | {len(group)} | {_spread([r['reward_start'] for r in pick])} | "
            f"{_spread([r['reward_end'] for r in pick])} | {_spread([r['gain'] for r in pick])} | "
            f"{_spread([r['exact_end'] for r in pick if r['exact_end'] is not None])} | "
            f"{max((r['versions'] or 0) for r in group)} | {max((r['samples_used'] or 0) for r in group)} | "
            f"{duration(statistics.fmean(r['wall_s'] for r in group))} |"
        )
    lines += ["", "Command: `python -m evals.sweep " + " ".join(settings["argv"]) + "`", ""]
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> Path | None:
    if (plt := pyplot()) is None:
        return None
    by_config: dict[str, list[list[dict[str, Any]]]] = {}
    for r in results:
        if r["returncode"] == 0 and r["curve"]:
            by_config.setdefault(r["cell"]["config"], []).append(r["curve"])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for config, curves in sorted(by_config.items()):
        plots.mean_band(ax, curves, f"{config} ({len(curves)} seeds)")
    title = "Sweep: mean over seeds, band = min-max"
    return plots.finish(fig, ax, path, title, "held-out reward (shaped, greedy)", legend_size=7)


def write(out: Path, results: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    rows = [row(r) for r in results]
    (out / "sweep.csv").write_text(to_csv(rows))
    (out / "sweep.md").write_text(markdown(rows, settings))
    (out / "sweep.json").write_bytes(orjson.dumps({"settings": settings, "cells": results}, option=orjson.OPT_INDENT_2))
    plot(results, out / "sweep.png")
