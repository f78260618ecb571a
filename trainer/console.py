"""What a person watching the trainer reads on stderr: where the run is, its ETA, each held-out evaluation as it
lands, and the log lines, never two of them on one line.

- On a terminal: a progress bar of the versions that stays on the bottom line; every other line written to
  stderr while it shows (structlog's JSON events, `print(..., file=sys.stderr)`) goes above it (`_AboveBar`
  stands in for sys.stderr and writes each whole line through `tqdm.write`, which clears the bar, writes the
  line and draws the bar again).
- Elsewhere (a file, a pipe, CI): no bar, whose carriage returns would glue it to the next log line; one plain
  line a version instead.

The ETA is the versions left at this trainer's mean time a version, plus the final evaluation, which starts
after the last version: as long as the newest evaluation took from its issue to its landing (the first one,
at version 0, lands during the first versions).
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from tqdm import tqdm

from trainer.result import duration, within_budget

BAR = "{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed} elapsed{postfix}"


class _AboveBar:
    """sys.stderr while the bar shows: whole lines go above the bar (tqdm.write), a partial one waits for its
    end. Text only (no `buffer`), so structlog's writer (streams/logs.py) hands it text too."""

    def __init__(self, real: IO[str]) -> None:
        self.real = real
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            tqdm.write(line, file=self.real)
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def isatty(self) -> bool:
        return self.real.isatty()

    def fileno(self) -> int:
        return self.real.fileno()

    def close_line(self) -> None:
        if self.pending:
            tqdm.write(self.pending, file=self.real)
            self.pending = ""


class Console:
    """The versions as they come (`console(version)`; `console(None)` at the end), evaluations as they land
    (`evaluated`). `final_evaluation`: the run ends with an evaluation (eval_every > 0), which the ETA counts.
    `ends_at`: the monotonic time a wall-clock budget (`max_minutes`) runs out: the ETA is then at most what is
    left of it and one version (the one under way when it runs out is finished)."""

    def __init__(
        self,
        total: int,
        final_evaluation: bool = True,
        stream: IO[str] | None = None,
        ends_at: float | None = None,
    ) -> None:
        self.ends_at = ends_at
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.final_evaluation = total, final_evaluation
        self.eval_s: float | None = None  # the newest evaluation's time from issue to landing
        self.start: tuple[int, float] | None = None  # (version, monotonic time) where this trainer began counting
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bar: tqdm | None = None
        self._above: _AboveBar | None = None
        self._saved_stderr: Any = None

    # -- what the run calls ----------------------------------------------------------------------------

    def __call__(self, version: int | None) -> None:
        if version is None:
            self.close()
        elif self.start is None:
            self.start = (version, time.monotonic())
            self._begin(version)
        else:
            self._version(version)

    def evaluated(self, line: str, took_s: float | None) -> None:
        """An evaluation landed: its line (trainer/held_out.py `landed`), above the bar or on a line of its own."""
        if took_s:
            self.eval_s = took_s
        self.say(f"trainer: {line}")

    def say(self, line: str) -> None:
        print(line, file=sys.stderr if self._above is not None else self.stream, flush=True)

    # -- the ETA ---------------------------------------------------------------------------------------

    def eta(self, version: int, now: float) -> str:
        """`ETA 12 min 05 s with the final evaluation (2 min 33 s a version)`, or what is not known yet."""
        first_version, first_t = self.start
        if version >= self.total:
            return f"the final evaluation, about {duration(self.eval_s)}" if self.final_evaluation else "done"
        if version <= first_version:
            return "ETA after the first version"
        per_version = (now - first_t) / (version - first_version)
        left = within_budget(per_version * (self.total - version), per_version, now, self.ends_at)
        if not self.final_evaluation:
            return f"ETA {duration(left)} ({duration(per_version)} a version)"
        if self.eval_s is None:
            return f"ETA {duration(left)} and the final evaluation ({duration(per_version)} a version)"
        return f"ETA {duration(left + self.eval_s)} with the final evaluation ({duration(per_version)} a version)"

    # -- drawing ----------------------------------------------------------------------------------------

    def _begin(self, version: int) -> None:
        if not self.tty:
            self.say(f"trainer: {self._version_of(version)}; {self.eta(version, time.monotonic())}")
            return
        self.bar = tqdm(
            total=None if self.ends_at is not None else self.total,
            initial=version,
            desc="policy versions",
            unit="version",
            file=self.stream,
            bar_format=BAR,
            mininterval=0,  # a version is minutes apart: draw each one
        )
        self.bar.set_postfix_str(self.eta(version, time.monotonic()))
        self._above, self._saved_stderr = _AboveBar(self.stream), sys.stderr
        sys.stderr = self._above

    def _version_of(self, version: int) -> str:
        """`version 3 of 8`; under a wall-clock budget the count is a cap the budget reaches first: `version 3`."""
        return f"version {version}" if self.ends_at is not None else f"version {version} of {self.total}"

    def _version(self, version: int) -> None:
        now = time.monotonic()
        if self.bar is None:
            elapsed = duration(now - self.start[1])
            self.say(f"trainer: {self._version_of(version)} after {elapsed}; {self.eta(version, now)}")
            return
        self.bar.set_postfix_str(self.eta(version, now), refresh=False)
        self.bar.update(version - self.bar.n)

    def close(self) -> None:
        if self._above is not None:
            self._above.close_line()
            sys.stderr, self._above = self._saved_stderr, None
        if self.bar is not None:
            self.bar.set_postfix_str("", refresh=False)  # its ETA is over: the bar ends with the time it took
            self.bar.close()
            self.bar = None
