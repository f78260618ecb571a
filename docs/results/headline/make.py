"""The README's headline picture: held-out reward and exact success against training samples, ES (the `cpu`
preset: 8 members x 16 problems, greedy) and GRPO at today's defaults (T=0.7, group 8, batch 8, lr 1e-5), three
seeds each, 1,024 samples, the 135M default model on Countdown. Drawn from the runs' own files in docs/results
(compare-countdown-1024 for ES, sweep-grpo/t07 for GRPO), by `python docs/results/headline/make.py`."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from streams.run_dir import read_records  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1]
RUNS = {
    "ES": [RESULTS / f"compare-countdown-1024/seed{k}/es" for k in range(3)],
    "GRPO (T=0.7)": [RESULTS / f"sweep-grpo/t07/cells/grpo-lr1e-05-g8-t0.7-b8-easy-n256-seed{k}" for k in range(3)],
}
COLORS = {"ES": "tab:blue", "GRPO (T=0.7)": "tab:red"}


def curve(run_dir: Path) -> list[tuple[float, float, float]]:
    """(samples, held-out reward, held-out exact) of each evaluation, from metrics.jsonl."""
    records = read_records(run_dir)
    samples, points = {0: 0}, []
    for r in records:
        if not r.get("eval") and "samples" in r:
            samples[int(r["version"])] = r["samples"]
    for r in records:
        if r.get("eval"):
            points.append((samples.get(int(r["version"]), 0), r["held_out_reward"], r["held_out_exact"]))
    return sorted(points)


def main() -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for algo, dirs in RUNS.items():
        for k, run_dir in enumerate(dirs):
            xs, reward, exact = zip(*curve(run_dir), strict=True)
            label = f"{algo}, held-out reward" if k == 0 else None
            ax.plot(xs, reward, "-o", color=COLORS[algo], alpha=0.8, label=label)
            label = f"{algo}, exact success" if k == 0 else None
            ax.plot(xs, exact, "--^", color=COLORS[algo], alpha=0.8, label=label)
    ax.set_xlabel("training samples (generated attempts used by updates)")
    ax.set_ylabel("held-out reward (solid) / exact success (dashed)")
    ax.set_title(
        "Countdown, SmolLM2-135M, 1,024 samples, 3 seeds each:\nES (cpu preset) against GRPO at today's defaults"
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(__file__).with_name("es-vs-grpo.png"), dpi=110)


if __name__ == "__main__":
    main()
