"""The run's traces: every reward the trainer reads, with its attempt's text, in
`<run dir>/samples/v<version>.jsonl.gz` (streams.samples; `python -m ops samples` reads them)."""

from __future__ import annotations

import collections
from collections import Counter
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from streams import samples
from streams.keys import Keys
from streams.schema import Reward


async def trace(redis: Redis, keys: Keys, run_dir: Path, read: list[tuple[bytes, Reward]], counts: Counter) -> None:
    """Append the samples of the rewards `read` ((entry id, reward)) to the run's traces, a file a version: the
    attempts' text comes from the attempts stream, one round trip for the lot. Counted in `counts`:
    `traced_samples`, `traced_without_text` (the attempt was trimmed), `trace_bytes`."""
    if not read:
        return
    attempts = await samples.attempts_of(redis, keys, (r for _, r in read))
    by_version: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for entry_id, r in read:
        attempt = attempts.get(r.attempt_id)
        by_version[r.policy_version].append(samples.sample(r, entry_id, attempt))
        counts["traced_without_text"] += attempt is None
    for version, found in by_version.items():
        counts["trace_bytes"] += samples.append(samples.file_for(run_dir, version), found)
    counts["traced_samples"] += len(read)
