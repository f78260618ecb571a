"""A run's own plots, drawn from its metrics.jsonl at the end (streams/run_dir.py PLOTS), and each figure's
colour, which the dashboard takes from here too (ops/views/dashboard.py): one figure, one colour, everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from streams.run_dir import eval_records, update_records
from trainer.plots import pyplot, save

# matplotlib's tab10, the colours its default cycle gave these figures
COLORS = {
    "reward_mean": "#1f77b4",
    "pass_rate": "#ff7f0e",
    "held_out_reward": "#2ca02c",
    "held_out_exact": "#d62728",
    "rewards_per_s": "#1f77b4",
    "generator_tokens_per_s": "#ff7f0e",
    # Countdown's credit by part (tasks/countdown_check.py PARTS): the rest of tab10, one colour a part
    "format": "#9467bd",
    "expression": "#8c564b",
    "numbers": "#e377c2",
    "closeness": "#7f7f7f",
    "solved": "#17becf",
}
log = structlog.get_logger("trainer.run_plots")


def draw(run_dir: Path, records: list[dict[str, Any]]) -> list[Path]:
    """reward.png, staleness.png, throughput.png in `run_dir`, from its metrics `records`, and parts.png where
    they carry Countdown's credit by part. [] when matplotlib is missing."""
    if (plt := pyplot()) is None:
        log.warning("no_plots", reason="matplotlib is not installed")
        return []
    updates = update_records(records)
    evals = eval_records(records)
    out = []

    fig, ax = plt.subplots(figsize=(7, 4))
    if updates:
        v = [r["version"] for r in updates]
        ax.plot(
            v,
            [r["reward_mean"] for r in updates],
            marker="o",
            color=COLORS["reward_mean"],
            label="members' mean reward (train)",
        )
        ax.plot(
            v,
            [r["pass_rate"] for r in updates],
            marker=".",
            color=COLORS["pass_rate"],
            label="members' exact success (train)",
        )
    if evals:
        ax.plot(
            [r["version"] for r in evals],
            [r["held_out_reward"] for r in evals],
            marker="s",
            color=COLORS["held_out_reward"],
            label="held-out reward (greedy center)",
        )
        ax.plot(
            [r["version"] for r in evals],
            [r["held_out_exact"] for r in evals],
            marker="^",
            color=COLORS["held_out_exact"],
            label="held-out exact success (greedy center)",
        )
    ax.set_xlabel("policy version")
    ax.set_ylabel("reward")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    out.append(save(fig, run_dir / "reward.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    lags = sorted({int(k) for r in updates for k in r.get("staleness", {})})
    bottom = [0] * len(updates)
    for lag in lags:
        counts = [r.get("staleness", {}).get(str(lag), 0) for r in updates]
        ax.bar([r["version"] for r in updates], counts, bottom=bottom, label=f"{lag} version(s) old")
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set_xlabel("policy version")
    ax.set_ylabel("members used")
    ax.set_title("staleness of the members each update used")
    if lags:
        ax.legend(fontsize=8)
    out.append(save(fig, run_dir / "staleness.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    if updates:
        v = [r["version"] for r in updates]
        ax.plot(
            v,
            [r.get("rewards_per_s", 0) for r in updates],
            marker="o",
            color=COLORS["rewards_per_s"],
            label="rewards/s",
        )
        if any("generator_tokens_per_s" in r for r in updates):
            ax2 = ax.twinx()
            ax2.plot(
                v,
                [r.get("generator_tokens_per_s", 0) for r in updates],
                marker=".",
                color=COLORS["generator_tokens_per_s"],
                label="generated tokens/s",
            )
            ax2.set_ylabel("tokens/s")
            ax2.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("policy version")
    ax.set_ylabel("rewards/s")
    ax.legend(loc="upper left", fontsize=8)
    out.append(save(fig, run_dir / "throughput.png"))
    if parts := draw_parts(plt, updates, evals):
        out.append(save(parts, run_dir / "parts.png"))
    return out


def draw_parts(plt: Any, updates: list[dict[str, Any]], evals: list[dict[str, Any]]) -> Any | None:
    """Countdown's credit by part against the version (what a run learned: the tags, the numbers, the answer),
    held-out on the left (each evaluation's `held_out_parts`), training on the right (each update's `parts`,
    over the attempts it used). None where no record has parts (a Lean run, runs from before parts were kept)."""
    panels = [
        ("held-out (greedy center)", [(r["version"], r["held_out_parts"]) for r in evals if r.get("held_out_parts")]),
        ("training (attempts used)", [(r["version"], r["parts"]) for r in updates if r.get("parts")]),
    ]
    if not any(points for _, points in panels):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (title, points) in zip(axes, panels, strict=True):
        names = [n for n in COLORS if any(n in p for _, p in points)]  # the parts in COLORS' order
        for name in names:
            kept = [(v, p[name]) for v, p in points if name in p]
            ax.plot([v for v, _ in kept], [x for _, x in kept], marker="o", color=COLORS[name], label=name)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("policy version")
        ax.grid(alpha=0.3)
        if names:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("mean credit (1: every attempt earned the part)")
    return fig
