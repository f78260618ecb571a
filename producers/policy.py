"""Following `{ps:R}:policy`: every generator reads the whole stream (no consumer group: each needs every
version), hands ES history to its engine, and loads GRPO weights when an order needs them.

ES: entry v carries the step that made version v from v-1. A generator that starts late reads the history
from the first entry and rebuilds any center from the base (or a snapshot) by replay, bit for bit the
center a generator that followed every version holds.

GRPO: entry v names a safetensors folder and its digest. The folder is loaded between work orders, and only
after its digest is recomputed and matches; a mismatch is `PolicyMismatch`, never a silent load.
"""

from __future__ import annotations

import time
from pathlib import Path

import structlog
from redis.asyncio import Redis

from producers.engine import Engine, in_engine_thread
from streams.codec import decode
from streams.keys import Keys
from streams.schema import PolicyUpdate, SchemaError
from weights.model import weights_digest

log = structlog.get_logger("producers.policy")


class PolicyMismatch(RuntimeError):
    """Announced weights are missing, unreadable or not the bytes their digest names."""


class PolicyFollower:
    def __init__(self, redis: Redis, keys: Keys, engine: Engine) -> None:
        self.redis = redis
        self.keys = keys
        self.engine = engine
        self.last_id = b"0-0"
        self.latest = 0  # newest version announced
        self.grpo: dict[int, PolicyUpdate] = {}
        self.grpo_loaded = 0  # version whose weights the engine holds (0: the base model)

    async def poll(self, block_ms: int | None = None) -> int:
        """Read announcements past the last one seen; returns how many arrived."""
        reply = await self.redis.xread({self.keys.policy: self.last_id}, count=1000, block=block_ms)
        seen = 0
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                self.last_id = entry_id
                try:
                    update = decode(PolicyUpdate, fields)
                except SchemaError as e:  # a policy entry nobody can read stops the run for everyone
                    raise PolicyMismatch(f"policy entry {entry_id.decode()} cannot be read: {e}") from e
                await self.take(update)
                seen += 1
        return seen

    async def take(self, update: PolicyUpdate) -> None:
        """Follow one announcement: what `poll` does with each entry it reads, and what a reader of the policy
        stream itself hands over (pass@k, rebuilding one version)."""
        if update.algo == "es":
            if update.es_step is None:
                raise PolicyMismatch(f"ES policy version {update.policy_version} carries no es_step")
            await in_engine_thread(self.engine.es_add_step, update.policy_version, update.es_step)
        else:
            self.grpo[update.policy_version] = update
        self.latest = max(self.latest, update.policy_version)

    async def wait_for(self, version: int, wait_s: float) -> bool:
        """Poll until `version` has been announced, at most `wait_s`. True when it has."""
        deadline = time.monotonic() + wait_s
        await self.poll()
        while self.latest < version:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await self.poll(block_ms=max(1, int(min(left, 1.0) * 1000)))
        return True

    def load_grpo(self, version: int, base: Path) -> bool:
        """Make the engine hold GRPO version `version` (0: the base model). Runs in the generation thread,
        between orders. Returns True if weights were loaded."""
        if version == self.grpo_loaded:
            return False
        if version == 0:
            folder = base
        else:
            update = self.grpo.get(version)
            if update is None:
                raise PolicyMismatch(f"GRPO policy version {version} was never announced")
            folder = Path(update.weights_path)
            try:
                found = weights_digest(folder)
            except OSError as e:
                raise PolicyMismatch(f"GRPO version {version}: weights at {folder} cannot be read: {e}") from e
            if found != update.digest:
                raise PolicyMismatch(
                    f"GRPO version {version}: weights at {folder} have digest {found}, but the policy stream "
                    f"announced {update.digest}; the folder was changed or is incomplete, refusing to load it"
                )
        self.engine.load_weights(folder)
        self.grpo_loaded = version
        log.info("grpo_weights_loaded", version=version, path=str(folder))
        return True
