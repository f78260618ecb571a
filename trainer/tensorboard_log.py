"""TensorBoard scalars in `<run dir>/tensorboard`, when TensorBoard (and torch, whose writer it uses) is
installed: every number of every metrics.jsonl record, step = version (trainer/trackers.py `tracked`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from streams.run_dir import TENSORBOARD
from trainer.trackers import CAUGHT_UP_BY, log_missing


def tensorboard(run_dir: Path) -> TensorBoardLog | None:
    """TensorBoard scalars in `run_dir/tensorboard`, or None when TensorBoard (or torch) is not installed."""
    if importlib.util.find_spec("tensorboard") is None or importlib.util.find_spec("torch") is None:
        return None
    return TensorBoardLog(run_dir / TENSORBOARD)


class TensorBoardLog:
    """`log(metrics, step)` as TensorBoard scalars (torch's SummaryWriter: an event file per trainer start)."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # torch: heavy, and only here

        self.folder = folder
        self.writer = SummaryWriter(str(folder))

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def catch_up(self, records: list[dict[str, Any]]) -> int:
        """Log the records the event files lack (as MLflowRun.catch_up: by `reward_mean` or
        `eval/held_out_reward` at the record's version), read with TensorBoard's own reader; how many."""
        from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

        events = EventAccumulator(str(self.folder), size_guidance={SCALARS: 0})  # 0: every step, not a sample
        events.Reload()
        tags = set(events.Tags()["scalars"])
        logged = {key: {e.step for e in events.Scalars(key)} if key in tags else set() for key in CAUGHT_UP_BY}
        return log_missing(self, records, logged)
