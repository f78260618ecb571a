"""What a user watches: per-version metrics as JSONL in the run directory (the same objects go to the
`{ps:R}:metrics` stream, which `python -m ops tail metrics --follow` shows live), pipeline figures read
from the workers' stats hashes, PNG plots at the end, and MLflow or TensorBoard when installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from streams import letters
from streams.groups import group_states
from streams.keys import GENERATORS, VERIFIERS, Keys

DLQ_SCAN = 1_000  # the newest dead letters counted by reason in each version's metrics (the total is XLEN)
log = structlog.get_logger("trainer.metrics")


class MetricsSink:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._tracker = _tracker(run_dir)

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "ab") as handle:
            handle.write(orjson.dumps(record) + b"\n")
        if self._tracker is not None:
            step = int(record.get("version", 0))
            numbers = {
                k: float(v)
                for k, v in record.items()
                if isinstance(v, int | float) and not isinstance(v, bool) and k not in ("version", "time")
            }
            prefix = "eval/" if record.get("eval") else ""
            self._tracker({prefix + k: v for k, v in numbers.items()}, step)

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [orjson.loads(line) for line in self.path.read_bytes().splitlines() if line.strip()]

    async def pipeline_figures(self, redis: Redis, keys: Keys) -> dict[str, Any]:
        """Lags, the oldest pending entry of each group, dead letters by reason, verifier utilization and generator
        throughput, as the workers last reported."""
        out: dict[str, Any] = {"dead_letters": await redis.xlen(keys.dlq),
                               "dead_letters_by_reason": await letters.by_reason(redis, keys, DLQ_SCAN)}  # fmt: skip
        idle: dict[str, int | None] = {}
        for name, stream in keys.streams().items():
            for g in await group_states(redis, stream):
                idle[f"{name}/{g.name}"] = g.oldest_pending_idle_ms
                if (name, g.name) in (("work", GENERATORS), ("attempts", VERIFIERS)):
                    out[f"{name}_outstanding"] = g.outstanding
        out["oldest_pending_idle_ms"] = idle
        verifiers = [orjson.loads(v) for v in (await redis.hvals(keys.verifier_stats))]
        if verifiers:
            out["verifier_utilization"] = round(sum(v.get("utilization", 0.0) for v in verifiers) / len(verifiers), 4)
        generators = [orjson.loads(v) for v in (await redis.hvals(keys.generator_stats))]
        if generators:
            out["generator_tokens_per_s"] = round(
                sum(g.get("engine_stats", {}).get("tokens_per_s", 0.0) for g in generators), 1
            )
            out["generator_busy_share"] = round(sum(g.get("busy_share", 0.0) for g in generators) / len(generators), 3)
            out["stale_orders_skipped"] = sum(g.get("stale_skipped", 0) for g in generators)
        return out

    def plots(self) -> list[Path]:
        """reward.png, staleness.png, throughput.png from metrics.jsonl. [] when matplotlib is missing."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log.warning("no_plots", reason="matplotlib is not installed")
            return []
        records = self.records()
        updates = [r for r in records if not r.get("eval") and "version" in r]
        evals = [r for r in records if r.get("eval")]
        out = []

        fig, ax = plt.subplots(figsize=(7, 4))
        if updates:
            v = [r["version"] for r in updates]
            ax.plot(v, [r["reward_mean"] for r in updates], marker="o", label="members' mean reward (train)")
            ax.plot(v, [r["pass_rate"] for r in updates], marker=".", label="members' exact success (train)")
        if evals:
            ax.plot([r["version"] for r in evals], [r["held_out_reward"] for r in evals], marker="s",
                    label="held-out reward (greedy center)")  # fmt: skip
            ax.plot([r["version"] for r in evals], [r["held_out_exact"] for r in evals], marker="^",
                    label="held-out exact success (greedy center)")  # fmt: skip
        ax.set_xlabel("policy version")
        ax.set_ylabel("reward")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        out.append(_save(fig, self.run_dir / "reward.png"))

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
        out.append(_save(fig, self.run_dir / "staleness.png"))

        fig, ax = plt.subplots(figsize=(7, 4))
        if updates:
            v = [r["version"] for r in updates]
            ax.plot(v, [r.get("rewards_per_s", 0) for r in updates], marker="o", label="rewards/s")
            if any("generator_tokens_per_s" in r for r in updates):
                ax2 = ax.twinx()
                ax2.plot(v, [r.get("generator_tokens_per_s", 0) for r in updates], color="tab:orange", marker=".",
                         label="generated tokens/s")  # fmt: skip
                ax2.set_ylabel("tokens/s")
                ax2.legend(loc="lower right", fontsize=8)
        ax.set_xlabel("policy version")
        ax.set_ylabel("rewards/s")
        ax.legend(loc="upper left", fontsize=8)
        out.append(_save(fig, self.run_dir / "throughput.png"))
        return out


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _tracker(run_dir: Path):
    """A `log(metrics, step)` for MLflow or TensorBoard when one is installed, else None."""
    if importlib.util.find_spec("mlflow") is not None:
        import mlflow

        mlflow.set_tracking_uri(f"file:{(run_dir / 'mlruns').resolve()}")
        mlflow.start_run(run_name=run_dir.name)
        return lambda metrics, step: mlflow.log_metrics(metrics, step=step)
    if importlib.util.find_spec("tensorboard") is not None and importlib.util.find_spec("torch") is not None:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run_dir / "tensorboard"))

        def log_tb(metrics: dict[str, float], step: int) -> None:
            for k, v in metrics.items():
                writer.add_scalar(k, v, step)
            writer.flush()

        return log_tb
    return None
