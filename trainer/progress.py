"""Whether a run can make progress, and if not, why: so that a run that cannot stops saying so, not churns.

Progress is a reward arriving (any verdict: a rejected proof is progress too) or a new policy version. A run
with none for `stall_timeout_s` is stalled when, besides, the infrastructure says why:

- dead letters whose reason is `infrastructure: ...` arrived within that window (a verifier that got no
  verdict on any delivery of an attempt; a generator whose engine failed an order on every delivery);
- every verifier that reported recently has none of its sandboxes started (`sandboxes_unavailable`, with
  the sandbox's own reason: no isolation tool the sandbox's uid can run, a missing image, ...);
- a generator reported that it stopped serving (`fatal`: its engine failed the same way on order after order).

A run that is merely slow (a model loading, Lean checks of a minute) has no such cause and is never called
stalled; nor is one that rides out a Redis restart or a crashed sandbox, since rewards resume. The local
pipeline (trainer/local.py) stops the run with the cause (exit 1); a trainer given `--redis-url` cannot
restart the roles it did not start, so it keeps going and raises the alarm instead: `{ps:R}:trainer_alert`
holds the cause while the run is stalled (`python -m ops run` and `python -m ops.health trainer` show it),
and is removed when progress resumes.
"""

from __future__ import annotations

import sys
import time

import orjson
import structlog
from redis.asyncio import Redis

from streams.keys import Keys

REPORT_FRESH_S = 90.0  # a verifier reports every 30 s: an older report is a worker that is gone
CHECK_EVERY_S = 5.0
log = structlog.get_logger("trainer.progress")


class NoProgress(RuntimeError):
    """The local pipeline's run can make no progress: the message says why."""


class ProgressWatch:
    """Fed by the run's reads (`saw_progress`, `saw_letter`); `check` answers the cause of a stall, or None;
    `watch` acts on it. `local`: the roles are the local pipeline's, so a stall stops the run (NoProgress);
    else it raises the alarm in `{ps:R}:trainer_alert`."""

    def __init__(self, stall_timeout_s: float, local: bool = True) -> None:
        self.stall_timeout_s = stall_timeout_s
        self.local = local
        self.last_progress = time.monotonic()
        self.letters: list[tuple[float, str]] = []  # (monotonic time, reason) of infrastructure dead letters
        self._checked = 0.0
        self.alerted = False  # `{ps:R}:trainer_alert` set by this trainer

    async def watch(self, redis: Redis, keys: Keys, version: int) -> None:
        """Stop a local run that can make no progress (NoProgress, with the cause); for one whose roles run
        elsewhere, set `{ps:R}:trainer_alert` while it is stalled and remove it once progress resumes."""
        cause = await self.check(redis, keys)
        if cause is None:
            if self.alerted and time.monotonic() - self.last_progress < self.stall_timeout_s:
                await redis.delete(keys.trainer_alert)
                self.alerted = False
                log.info("run_progressing_again", version=version)
            return
        if self.local:
            raise NoProgress(cause)
        if not self.alerted:
            log.error("run_stalled", version=version, cause=cause[:2000])
            print(f"trainer: {cause}; the roles run elsewhere: the run goes on once they can", file=sys.stderr)
        alert = {"cause": cause, "version": version, "since_ms": int(time.time() * 1000)}
        await redis.set(keys.trainer_alert, orjson.dumps(alert))
        self.alerted = True

    async def clear(self, redis: Redis, keys: Keys) -> None:
        """Remove this trainer's alert (the run ends)."""
        if self.alerted:
            await redis.delete(keys.trainer_alert)

    def saw_progress(self) -> None:
        self.last_progress = time.monotonic()

    def saw_letter(self, reason: str) -> None:
        if reason.startswith("infrastructure:"):
            self.letters.append((time.monotonic(), reason))

    async def check(self, redis: Redis, keys: Keys) -> str | None:
        """The cause when the run is stalled now (checked at most every CHECK_EVERY_S), else None."""
        now = time.monotonic()
        if self.stall_timeout_s <= 0 or now - self._checked < CHECK_EVERY_S:
            return None
        self._checked = now
        quiet_s = now - self.last_progress
        self.letters = [(t, r) for t, r in self.letters if now - t <= self.stall_timeout_s]
        if quiet_s < self.stall_timeout_s:
            return None
        cause = await self._cause(redis, keys)
        return f"no progress for {quiet_s:.0f} s: {cause}" if cause else None

    async def _cause(self, redis: Redis, keys: Keys) -> str | None:
        now_ms = time.time() * 1000
        verifiers = [orjson.loads(v) for v in (await redis.hgetall(keys.verifier_stats)).values()]
        fresh = [v for v in verifiers if now_ms - v.get("updated_ms", 0) <= REPORT_FRESH_S * 1000]
        if fresh and all(_none_started(v) for v in fresh):
            sandbox, why = next(iter(fresh[0]["sandboxes_unavailable"].items()))
            return f"no verifier can start a sandbox ({sandbox}: {why})"
        for name, raw in (await redis.hgetall(keys.generator_stats)).items():
            if fatal := orjson.loads(raw).get("fatal"):
                return f"generator {name.decode()} stopped: {fatal}"
        if self.letters:
            return f"{len(self.letters)} dead letters blame the infrastructure; the newest: {self.letters[-1][1]}"
        return None


def _none_started(report: dict) -> bool:
    down = [k for k in report.get("sandboxes_unavailable") or {} if not k.endswith(":second-line")]
    return bool(down) and len(down) >= report.get("sandboxes", len(down))
