"""Following `{ps:R}:policy`: every generator reads the whole stream (no consumer group: each needs every
version), hands ES history to its engine, and loads GRPO weights when an order needs them.

ES: entry v carries the step that made version v from v-1. A generator that starts late reads the history
from the first entry and rebuilds any center from the base (or a snapshot) by replay, bit for bit the
center a generator that followed every version holds.

GRPO: entry v names a safetensors folder and its digest. The folder is loaded between work orders, and only
after its digest is recomputed and matches; a mismatch is `PolicyMismatch`, never a silent load.

A history rewritten by a failover. The trainer writes entry v in its checkpoint's MULTI and waits for a
replica; one that did not get it in time and is then promoted lacks entry v (and whatever came after), and
the trainer, rebuilt from the new master, makes version v again, maybe from other rewards. A generator may
have read the lost entry from the old master. So the stream on the current master is the truth: before each
read the follower checks that the stream does not end before the last entry it read (an entry id is the
master's clock, so the new v may even sort before the lost one), and an announcement of a version it already
holds means the history was rewritten from that version on. Either way it forgets the versions after the
point where the stream still agrees with it (`es_forget_after`; GRPO: the announcements, and the weights
loaded from them) and follows the new entries; `rewinds` counts it. Before this, a rewritten ES version
raised once ("conflicting ES steps"), the read position had moved past it, and the generator went on
sampling the lost center for the new version's orders.
"""

from __future__ import annotations

import time
from pathlib import Path

import structlog
from redis.asyncio import Redis

from producers.engine import Engine, in_engine_thread
from streams.codec import decode
from streams.groups import id_order
from streams.keys import Keys
from streams.schema import PolicyUpdate, SchemaError
from weights.model import weights_digest

log = structlog.get_logger("producers.policy")


class PolicyMismatch(RuntimeError):
    """Announced weights are missing, unreadable or not the bytes their digest names."""


def checked_grpo_folder(update: PolicyUpdate) -> Path:
    """The weights folder a GRPO policy entry names, once its bytes are the digest the entry announced;
    PolicyMismatch where it cannot be read or differs (changed or incomplete: never loaded)."""
    folder = Path(update.weights_path)
    try:
        found = weights_digest(folder)
    except OSError as e:
        raise PolicyMismatch(f"GRPO version {update.policy_version}: weights at {folder} cannot be read: {e}") from e
    if found != update.digest:
        raise PolicyMismatch(
            f"GRPO version {update.policy_version}: weights at {folder} have digest {found}, but the policy stream "
            f"announced {update.digest}; the folder was changed or is incomplete, refusing to load it"
        )
    return folder


class PolicyFollower:
    def __init__(self, redis: Redis, keys: Keys, engine: Engine) -> None:
        self.redis = redis
        self.keys = keys
        self.engine = engine
        self.last_id = b"0-0"
        self.latest = 0  # newest version announced
        self.grpo: dict[int, PolicyUpdate] = {}
        self.grpo_loaded = 0  # version whose weights the engine holds (0: the base model)
        self.read: dict[bytes, int] = {}  # id -> version of each entry `poll` read
        self.rewinds = 0  # times the stream's history was rewritten under this follower (docstring)

    async def poll(self, block_ms: int | None = None) -> int:
        """Read announcements past the last one seen; returns how many arrived."""
        await self._check_stream_end()
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
                self.read[entry_id] = update.policy_version
                seen += 1
        return seen

    async def _check_stream_end(self) -> None:
        """A stream that now ends before the last entry read lost its tail in a failover, and may hold new
        entries that sort before that one: go back to the newest entry of the stream this follower read (the
        replica kept the ids it got), forget the versions after it, and read on from there."""
        if self.last_id == b"0-0":
            return
        last = await self.redis.xrevrange(self.keys.policy, count=1)
        end = last[0][0] if last else b"0-0"
        if id_order(end) >= id_order(self.last_id):
            return
        kept, position, before = 0, b"0-0", b"+"
        while page := await self.redis.xrevrange(self.keys.policy, max=before, count=100):
            found = next((entry_id for entry_id, _ in page if entry_id in self.read), None)
            if found is not None:
                kept, position = self.read[found], found
                break
            before = b"(" + page[-1][0]
        await self._forget_after(kept, f"the stream ends at {end.decode()}, before entry {self.last_id.decode()}")
        self.last_id = position

    async def _forget_after(self, version: int, why: str) -> None:
        lost = list(range(version + 1, self.latest + 1))
        log.warning("policy_history_rewritten", kept=version, forgotten=lost, why=why)
        await in_engine_thread(self.engine.es_forget_after, version)
        self.read = {entry_id: v for entry_id, v in self.read.items() if v <= version}
        self.grpo = {v: u for v, u in self.grpo.items() if v <= version}
        if self.grpo_loaded > version:
            self.grpo_loaded = -1  # weights of a lost version: the next GRPO order loads its own
        self.latest = min(self.latest, version)
        self.rewinds += 1

    async def take(self, update: PolicyUpdate) -> None:
        """Follow one announcement: what `poll` does with each entry it reads, and what a reader of the policy
        stream itself hands over (pass@k, rebuilding one version)."""
        # The trainer announces versions in order, each once: one not past the newest was made again after a
        # failover lost it (docstring).
        if update.policy_version <= self.latest:
            await self._forget_after(update.policy_version - 1, f"version {update.policy_version} announced again")
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
            folder = checked_grpo_folder(update)
        self.engine.load_weights(folder)
        self.grpo_loaded = version
        log.info("grpo_weights_loaded", version=version, path=str(folder))
        return True
