"""Samples: a judged attempt joined with its verdict, as a run's traces keep it and `python -m ops samples`
shows it.

A sample is one JSON object: the attempt (ids, theorem, policy version, member or group, the model's whole
text and the proof extracted from it, tokens, generation time) and its reward (verdict, sub-reason, reward,
the checker's message, verify time, the sandbox that judged it, whether it came from the cache, when).
The reward names its attempt's entry (`Reward.attempt_entry`); attempts stay in `{ps:R}:attempts` for the
verifiers' `history_s`, so a reward whose attempt is gone gives a sample without text (`text_missing`). Text
and proof are kept up to MAX_TEXT_CHARS each (`cut_chars` then gives their whole lengths).

On disk (trainer.traces): `<run dir>/samples/v<version>.jsonl.gz`, one sample a line, each append its own
gzip member, so a file cut short by a kill loses at most its last append (`read_file` skips an unfinished
member). Readers keep the first sample of an attempt id (a restarted trainer reads again the rewards it had
not acked).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio import Redis

from streams import run_dir
from streams.codec import decode
from streams.keys import Keys
from streams.schema import Attempt, Reward, SchemaError

FOLDER = run_dir.SAMPLES
# A sample keeps at most this much of the model's text and of the proof (a completion of the default model is
# ~0.3 KB, a Lean prover's a few KB): an attempt of megabytes costs its trace no more than this.
MAX_TEXT_CHARS = 64 * 1024


def sample(reward: Reward, reward_entry: bytes | str, attempt: Attempt | None) -> dict[str, Any]:
    """The sample of `reward` (and its attempt, None when it is no longer in the stream)."""
    entry = reward_entry.decode() if isinstance(reward_entry, bytes) else reward_entry
    out: dict[str, Any] = {
        "attempt_id": reward.attempt_id,
        "work_id": reward.work_id,
        "eval": reward.work_id.startswith("eval-"),
        "theorem_id": reward.theorem_id,
        "policy_version": reward.policy_version,
        "member": None if reward.member is None else [reward.member.seed, reward.member.sign],
        "sample_index": reward.sample_index,
        "verdict": reward.verdict,
        "reason": reward.reason,
        "reward": reward.reward,
        "detail": reward.detail,
        "verify_ms": reward.verify_ms,
        "sandbox_id": reward.sandbox_id,
        "cached": reward.cached,
        "judged_ms": int(entry.split("-", 1)[0]),
    }
    if reward.parts:  # Countdown's credit by part (tasks/countdown.py verdict_parts); Lean has none
        out["parts"] = dict(reward.parts)
    if attempt is None:
        return out | {"text_missing": True}
    text = attempt.text or attempt.proof
    out |= {
        "task": attempt.task,
        "text": text[:MAX_TEXT_CHARS],
        "proof": attempt.proof[:MAX_TEXT_CHARS],
        "num_tokens": attempt.num_tokens,
        "gen_ms": attempt.gen_ms,
    }
    if len(text) > MAX_TEXT_CHARS or len(attempt.proof) > MAX_TEXT_CHARS:
        out["cut_chars"] = {"text": len(text), "proof": len(attempt.proof)}  # the whole lengths
    return out


async def attempts_of(redis: Redis, keys: Keys, rewards: Iterable[Reward]) -> dict[str, Attempt]:
    """The attempts the rewards name that are still in the stream (one round trip), by attempt id."""
    wanted = [r for r in rewards if r.attempt_entry]
    if not wanted:
        return {}
    async with redis.pipeline(transaction=False) as pipe:
        for r in wanted:
            pipe.xrange(keys.attempts, r.attempt_entry, r.attempt_entry)
        replies = await pipe.execute()
    found: dict[str, Attempt] = {}
    for r, entries in zip(wanted, replies, strict=True):
        for _id, fields in entries:
            try:
                attempt = decode(Attempt, fields)
            except SchemaError:
                continue
            if attempt.attempt_id == r.attempt_id:  # an entry id is the stream's: check it is this attempt
                found[r.attempt_id] = attempt
    return found


def file_for(run_dir: Path, version: int) -> Path:
    return run_dir / FOLDER / f"v{version:06d}.jsonl.gz"


def append(path: Path, samples: list[dict[str, Any]]) -> int:
    """Append `samples` to `path` as one gzip member; the bytes written."""
    data = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip member
    member = data.compress(b"".join(orjson.dumps(s) + b"\n" for s in samples)) + data.flush()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(member)
    return len(member)


def read_file(path: Path) -> Iterator[dict[str, Any]]:
    """The samples of one file, member by member; an unfinished last member (a kill mid-append) is skipped."""
    data = path.read_bytes()
    while data:
        member = zlib.decompressobj(31)
        try:
            text = member.decompress(data)
        except zlib.error:
            return  # not gzip from here on: what follows was never a finished append
        if not member.eof:
            return
        for line in text.splitlines():
            yield orjson.loads(line)
        data = member.unused_data


def read_dir(run_dir: Path, version: int | None = None) -> Iterator[dict[str, Any]]:
    """Every sample of a run directory (or of one policy version), in version order, each attempt once."""
    paths = [file_for(run_dir, version)] if version is not None else sorted((run_dir / FOLDER).glob("v*.jsonl.gz"))
    seen: set[str] = set()
    for path in paths:
        if not path.is_file():
            continue
        for s in read_file(path):
            if s["attempt_id"] not in seen:
                seen.add(s["attempt_id"])
                yield s


async def from_redis(redis: Redis, keys: Keys, newest: int) -> list[dict[str, Any]]:
    """The samples of the newest `newest` rewards still in the run's stream, oldest first."""
    rewards: list[tuple[bytes, Reward]] = []
    for entry_id, fields in reversed(await redis.xrevrange(keys.rewards, count=newest)):
        try:
            rewards.append((entry_id, decode(Reward, fields)))
        except SchemaError:
            continue
    attempts = await attempts_of(redis, keys, (r for _, r in rewards))
    return [sample(r, entry_id, attempts.get(r.attempt_id)) for entry_id, r in rewards]
