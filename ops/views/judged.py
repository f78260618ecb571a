"""Judged samples picked by what a user asks (verdict, version, kind, theorem, a regex over the text) and joined
with their problem, the canonical record in `{ps:R}:theorems` the verifier judged them against: what
`python -m ops samples` and `ops theorem` print (commands below) and the dashboard shows."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from ops.views import text
from ops.views.dlq import OpsError
from streams import samples
from streams.connect import connect
from streams.keys import Keys
from streams.run_redis import NoRunData, reopen
from streams.schema import SchemaError
from streams.theorems import Theorem

KINDS = ("all", "train", "eval")
VERDICTS = ("proved", "rejected", "timeout")


@dataclass(frozen=True)
class Filters:
    """Which samples to show; None (or "all") lets every value through. `text`: a regular expression searched
    in the model's text, the proof it was judged by and the checker's message."""

    version: int | None = None
    verdict: str | None = None
    theorem: str | None = None
    kind: str = "all"
    text: re.Pattern[str] | None = None

    def matches(self, s: dict[str, Any]) -> bool:
        found = self.text is None or any(self.text.search(s.get(k) or "") for k in ("text", "proof", "detail"))
        return (
            found
            and (self.version is None or s["policy_version"] == self.version)
            and (self.verdict is None or s["verdict"] == self.verdict)
            and (self.theorem is None or s["theorem_id"] == self.theorem)
            and (self.kind == "all" or s["eval"] == (self.kind == "eval"))
        )


def regex(value: str) -> re.Pattern[str]:
    """A `--text` pattern, or ValueError saying why it is not one."""
    try:
        return re.compile(value)
    except re.error as e:
        raise ValueError(f"{value!r} is not a regular expression: {e}") from e


def pick(found: Iterable[dict[str, Any]], filters: Filters, count: int) -> tuple[int, list[dict[str, Any]]]:
    """(how many samples match, the newest `count` of them, oldest first)."""
    matched = [s for s in found if filters.matches(s)]
    return len(matched), (matched[-count:] if count > 0 else [])


async def problems(redis: Redis, keys: Keys, theorem_ids: Iterable[str]) -> dict[str, dict[str, Any] | None]:
    """The run's canonical record of each theorem id (None: not registered, or unreadable), as plain data."""
    ids = sorted(set(theorem_ids))
    if not ids:
        return {}
    out: dict[str, dict[str, Any] | None] = {}
    for theorem_id, raw in zip(ids, await redis.hmget(keys.theorems, ids), strict=True):
        try:
            out[theorem_id] = None if raw is None else dataclasses.asdict(Theorem.decode(raw))
        except SchemaError:
            out[theorem_id] = None
    return out


async def with_problems(redis: Redis, keys: Keys, shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples, each with `problem`: its theorem's canonical record (None where the run has none)."""
    found = await problems(redis, keys, (s["theorem_id"] for s in shown))
    return [{**s, "problem": found.get(s["theorem_id"])} for s in shown]


# -- the commands ---------------------------------------------------------------------------------------

SCAN_REWARDS = 10_000  # `samples` from Redis: the newest rewards the filters look through


def _filters(args: argparse.Namespace) -> Filters:
    return Filters(args.version, args.verdict, args.theorem, args.kind, args.text)


def _show_samples(args: argparse.Namespace, matched: int, shown: list[dict[str, Any]], source: str) -> int:
    text.emit(args, {"source": source, "matched": matched, "shown": len(shown), "samples": shown}, text.samples)
    return 0


async def cmd_samples(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    """The newest judged attempts still in the streams (their history_s), joined with their text and problem."""
    matched, shown = pick(await samples.from_redis(redis, keys, SCAN_REWARDS), _filters(args), args.count)
    shown = await with_problems(redis, keys, shown)
    return _show_samples(args, matched, shown, f"the newest {SCAN_REWARDS} rewards of {keys.rewards}")


def samples_from_run_dir(args: argparse.Namespace) -> int:
    """The run's traces: every sample it read, from its directory's files; their problems from a copy of its
    Redis data, where the directory has it (streams/run_redis.py)."""
    run_dir = Path(args.run_dir).expanduser()
    if not (run_dir / samples.FOLDER).is_dir():
        return text.fail(
            f"{run_dir} has no traces ({run_dir / samples.FOLDER}): not a run directory, or a run from "
            "before traces were kept",
            2,
        )
    matched, shown = pick(samples.read_dir(run_dir, args.version), _filters(args), args.count)
    try:
        with reopen(run_dir) as run:
            keys = Keys(getattr(args, "run", None) or run.only_run() or "default")
            shown = asyncio.run(_problems_at(run.url, keys, shown))
    except NoRunData:  # no Redis data (a run against another Redis), or the run is going: no problems shown
        pass
    return _show_samples(args, matched, shown, f"traces in {run_dir / samples.FOLDER}")


async def _problems_at(url: str, keys: Keys, shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    redis = connect(url)
    try:
        return await with_problems(redis, keys, shown)
    finally:
        await redis.aclose()


async def cmd_theorem(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    """One problem of the run, as the verifier judges attempts at it."""
    found = (await problems(redis, keys, [args.id]))[args.id]
    if found is None:
        held = await redis.hlen(keys.theorems)
        some = [k.decode() for k in (await redis.hscan(keys.theorems, count=5))[1]][:3]
        raise OpsError(
            f"run {keys.run!r} has no theorem {args.id!r} in {keys.theorems} ({held} problems"
            + (f", e.g. {', '.join(some)})" if some else ")")
        )
    text.emit(args, found, text.theorem)
    return 0
