"""A finished or live run, opened for reading: its settings, its Redis, and what that Redis holds (the policy
versions, the held-out split it registered). Read by `python -m evals.passk`.

- **The settings.** A finished run's `report.json` holds the settings it trained with; they are the run's,
  and a flag that contradicts one of them where it defines the run (`RUN_FIELDS`) is refused rather than
  silently evaluating other problems or another model. Without a report (the run is live or was killed),
  the flags/config are used as given.
- **The Redis.** `--redis-url` (or the report's URL): that Redis. Otherwise the run's embedded Redis, opened
  from its directory (streams/run_redis.py): the run's own server while it is going, else a private server on
  a copy of its data, gone at the end. Nothing is written to a run's Redis or its directory.
- **The held-out split.** Exactly the trainer's: `load_theorems(settings)`'s second part, checked record by
  record against the canonical records the run registered in `{ps:R}:theorems` and against the ids its
  checkpoint says it evaluated, so settings that are not the run's fail instead of evaluating other problems.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from streams.codec import decode
from streams.keys import Keys
from streams.run_dir import REDIS, REPORT
from streams.run_redis import NoRunData, reopen
from streams.schema import PolicyUpdate, SchemaError
from streams.theorems import Theorem
from tasks.problems import DataError
from trainer.config import TrainerSettings
from trainer.data import load_theorems

# What defines a run: a flag that contradicts the finished run's report on one of these is refused.
RUN_FIELDS = ("run", "algo", "task", "seed", "dataset", "problems", "held_out", "curriculum", "model", "prompt_format")


class EvalError(Exception):
    """Input the eval cannot work with (unknown run or version, bad k, weights not as announced): exit 2."""


# -------------------------------------------------------------------------------------------- settings


def run_settings(cli: TrainerSettings, run_dir: Path) -> tuple[TrainerSettings, str]:
    """The run's settings and where they came from: the finished run's report.json, else the flags/config."""
    report = run_dir / REPORT
    if not report.is_file():
        return cli, f"the flags/config ({report} does not exist: the run has not finished)"
    try:
        doc = orjson.loads(report.read_bytes())["settings"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise EvalError(f"{report} cannot be read as a trainer report: {e}") from e
    given = cli.model_fields_set
    conflicts = [
        f"{f} = {getattr(cli, f)!r} (the run has {doc.get(f)!r})"
        for f in RUN_FIELDS
        if f in given and getattr(cli, f) != doc.get(f)
    ]
    if conflicts:
        raise EvalError(
            f"{report} is the run's own record, and the flags/config/env contradict it: "
            f"{'; '.join(conflicts)}. Drop those settings to evaluate this run."
        )
    try:
        settings = TrainerSettings.model_validate(
            {**doc, **{f: getattr(cli, f) for f in given}, "run_dir": str(run_dir)}
        )
    except ValidationError as e:
        raise EvalError(f"{report}: settings this build cannot use: {e}") from e
    return settings, f"{report} (the finished run's settings)"


# ----------------------------------------------------------------------------------------------- Redis


@contextlib.contextmanager
def run_redis(settings: TrainerSettings, run_dir: Path) -> Iterator[tuple[str, str]]:
    """Yields (url, how): `--redis-url`'s Redis, else the run's own (streams/run_redis.py): its server while the
    run is going, else a served copy of its data."""
    if settings.redis_url:
        yield settings.redis_url, f"the Redis at {settings.redis_url}"
        return
    if not run_dir.is_dir():
        raise EvalError(
            f"no run {settings.run!r}: {run_dir} does not exist. Name the run directory "
            f"(--run-dir, or --run for runs/<run>), or pass --redis-url for a run whose Redis is "
            f"elsewhere"
        )
    with contextlib.ExitStack() as stack:
        try:
            run = stack.enter_context(reopen(run_dir, live=True))
        except NoRunData as e:
            raise EvalError(str(e)) from e
        if run.copy:
            yield run.url, f"a copy of the run's embedded Redis data ({run_dir / REDIS}), served for this read"
        else:
            yield run.url, f"the run's embedded Redis, still running, at {run.url}"


# ---------------------------------------------------------------------------------- what the Redis holds


@dataclass
class RunView:
    """What the eval reads from the run's Redis."""

    algo: str
    held_out: list[Theorem]
    updates: list[PolicyUpdate]  # policy entries of versions 1..V, stream order
    version: int
    versions: list[int]
    on_disk: list[int]  # GRPO: versions whose weights folder still exists (0: the base)

    def entry(self) -> PolicyUpdate:
        """The policy entry of version V (the last one, as a generator's follower keeps it)."""
        return [u for u in self.updates if u.policy_version == self.version][-1]


async def find_run(redis: Redis, settings: TrainerSettings) -> TrainerSettings:
    """The settings with the run id whose checkpoint this Redis holds: the one named, or, when none was named
    and the Redis holds exactly one run (a local run's embedded Redis), that one."""
    try:
        if await redis.hexists(Keys(settings.run).trainer_state, "state"):
            return settings
        found = sorted({key.decode()[4:-9] async for key in redis.scan_iter(match="{ps:*}:trainer", count=1000)})
    except RedisError as e:
        raise EvalError(f"cannot read the run's Redis: {e}") from e
    if len(found) == 1 and "run" not in settings.model_fields_set:
        return settings.model_copy(update={"run": found[0]})
    holds = f"it holds run(s) {', '.join(repr(r) for r in found)}" if found else "it holds no run"
    raise EvalError(
        f"run {settings.run!r} has no trainer checkpoint ({Keys(settings.run).trainer_state}) in this "
        f"Redis; {holds}. Pass --run NAME"
    )


async def read_run(redis: Redis, settings: TrainerSettings, version: int | None, limit: int | None) -> RunView:
    """The run's policy up to `version` (None: the newest) and its held-out split (the first `limit` problems)."""
    keys = Keys(settings.run)
    try:
        state = orjson.loads(await redis.hget(keys.trainer_state, "state"))
    except orjson.JSONDecodeError as e:
        raise EvalError(f"the run's checkpoint {keys.trainer_state} cannot be read: {e}") from e
    algo = state.get("algo")
    if algo != settings.algo and "algo" in settings.model_fields_set:
        raise EvalError(f"run {settings.run!r} was trained with algo {algo!r}, not {settings.algo!r}")
    updates = await _policy(redis, keys, algo)
    versions = sorted({0} | {u.policy_version for u in updates})
    version = versions[-1] if version is None else version
    if version not in versions:
        raise EvalError(
            f"version {version} does not exist in run {settings.run!r}: it has version(s) "
            f"{ranges(versions)} (0 is the base model)"
        )
    missing = [v for v in range(1, version + 1) if v not in versions]
    if algo == "es" and missing:
        raise EvalError(
            f"ES version {version} is the base plus the steps of versions 1..{version}; the policy "
            f"stream lacks {ranges(missing)}"
        )
    held_out = await _held_out(redis, keys, settings, state, limit)
    on_disk = sorted({0} | {u.policy_version for u in updates if algo == "grpo" and Path(u.weights_path).is_dir()})
    return RunView(algo, held_out, [u for u in updates if u.policy_version <= version], version, versions, on_disk)


async def _policy(redis: Redis, keys: Keys, algo: str) -> list[PolicyUpdate]:
    out = []
    for entry_id, fields in await redis.xrange(keys.policy):  # ~200 bytes a version: read it whole
        try:
            update = decode(PolicyUpdate, fields)
        except SchemaError as e:
            raise EvalError(f"policy entry {entry_id.decode()} of {keys.policy} cannot be read: {e}") from e
        if update.algo != algo:
            raise EvalError(f"policy entry {entry_id.decode()} is {update.algo}, in a {algo} run")
        out.append(update)
    return out


async def _held_out(
    redis: Redis, keys: Keys, settings: TrainerSettings, state: dict[str, Any], limit: int | None
) -> list[Theorem]:
    try:
        _, held = load_theorems(settings)  # the trainer's own split, not a copy of it
    except (DataError, ValueError, OSError) as e:
        raise EvalError(f"the run's problems cannot be loaded: {e}") from e
    if not held:
        raise EvalError(f"run {settings.run!r} has no held-out split (held_out = {settings.held_out} of its problems)")
    not_the_runs = (
        "these settings (seed, problems, held_out, curriculum, dataset) are not the run's; pass its "
        "--config or the flags it was started with"
    )
    raw = await redis.hmget(keys.theorems, [t.theorem_id for t in held])
    for theorem, record in zip(held, raw, strict=True):
        try:
            registered = None if record is None else Theorem.decode(record)
        except SchemaError as e:
            raise EvalError(f"the run's record of {theorem.theorem_id!r} cannot be read: {e}") from e
        if registered != theorem:
            problem = "is not registered" if registered is None else "differs from the one registered"
            raise EvalError(f"held-out problem {theorem.theorem_id!r} {problem} in {keys.theorems}: {not_the_runs}")
    ids = state.get("eval_ids")  # what the run itself evaluated (its checkpoint); absent if it never did
    if ids and ids != [t.theorem_id for t in held]:
        raise EvalError(
            f"the trainer evaluated {len(ids)} problems {ids[:3]}..., these settings give {len(held)} "
            f"problems {[t.theorem_id for t in held[:3]]}...: {not_the_runs}"
        )
    return held[:limit] if limit else held


def ranges(values: list[int]) -> str:
    """Sorted versions as runs: [0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(v) if v == start else f"{start}-{v}")
            start = None
    return ", ".join(out)
