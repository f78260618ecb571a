"""How long a comparison or a sweep will take, said up front and as it goes.

Both run `python -m trainer` subprocesses one after another, each for a known number of versions. While one
runs, `Eta.tick` reads its run directory's metrics.jsonl: once the first version of the whole job is done it
prints an estimate (that version's time, start-up and first evaluation included, times the versions of the
whole job), and after each later version the versions done, the time so far and the time left at the mean
pace so far. The pace is per version because a version's cost is what the job is planned in (`--budget`,
`--samples`, `--iterations`); runs of another algorithm or population cost more or less a version, so the
ETA is an estimate, corrected version by version.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from streams.run_dir import read_records, update_records
from trainer.result import duration


class Eta:
    """`start(run_dir)` before each trainer, `tick()` while it runs (evals.runner.run_one calls it), `done()`
    after it; `total`: the versions of every run the job will make."""

    def __init__(
        self,
        who: str,
        total: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        out: TextIO | None = None,
    ) -> None:
        self.who, self.total, self.clock, self.wall, self.out = who, total, clock, wall, out
        self.started = clock()
        self.finished_versions = 0  # versions of the runs already over
        self.run_dir: Path | None = None
        self.shown = -1  # versions done at the last line printed

    def start(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def done(self) -> None:
        self.finished_versions += self._current()
        self.run_dir = None

    def _current(self) -> int:
        if self.run_dir is None:
            return 0
        return len({int(r["version"]) for r in update_records(read_records(self.run_dir))})

    def tick(self) -> str | None:
        """The line for the versions done since the last tick (printed), or None when none were."""
        done = self.finished_versions + self._current()
        if done == self.shown or done == 0:
            return None
        self.shown = done
        elapsed = self.clock() - self.started
        left = elapsed / done * max(0, self.total - done)
        at = time.strftime("%H:%M", time.localtime(self.wall() + left))
        if done == 1:
            line = (
                f"{self.who}: estimate from the first version ({duration(elapsed)}): {self.total} versions, about "
                f"{duration(elapsed * self.total)} in all, done about {at}"
            )
        else:
            line = f"{self.who}: {done}/{self.total} versions in {duration(elapsed)}, ETA {duration(left)} (about {at})"
        print(line, file=self.out or sys.stderr, flush=True)
        return line
