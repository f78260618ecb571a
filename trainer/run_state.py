"""The trainer's checkpoint: what a run remembers across a restart, its format, and how it is written.

The checkpoint is one JSON document in the hash `{ps:R}:trainer`, field `state`. Its keys, their order and
the order records' keys (trainer/orders.py `Order.to_dict`) are the format: a run checkpointed by an older
trainer resumes, and is written back byte for byte (tests/trainer/test_state_format.py). An algorithm appends
its own keys after these (`config`; GRPO's `checkpoint` before it), written for people and for its own resume.

It is written in one MULTI with the stream entries of the version it completes (the policy, the metrics), so
a restart never sees one without the others; with a replica, WAIT follows on the same connection. Only then
are the entries the run read since the last checkpoint acked (`Checkpointer`): a trainer killed in between
reads them again from its pending list.

The run's reads are here too (`read_group`), because what they return is what the checkpoint acks: entries
of the run's streams in group `trainer`, new ones or, at a resume, those read before and never acked. This is
not streams.runtime's Consumer, which settles each entry as its handler returns.
"""

from __future__ import annotations

import collections
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from streams.cluster import slot_pipeline, transaction
from streams.keys import TRAINER
from streams.run_dir import update_records
from streams.schema import Reward
from streams.sentinel import MasterReplaced
from streams.settle import Replication
from trainer.orders import Order

STATE_FIELD = "state"  # the field of `{ps:R}:trainer` that holds the checkpoint
FINISHED_BEFORE = 3  # python -m trainer's exit status when the run id names a finished run
log = structlog.get_logger("trainer.run_state")

READ_COUNT = 500  # entries a stream read takes at once
Entries = list[tuple[bytes, dict[bytes, bytes]]]


class RunMismatch(RuntimeError):
    """The run directory and the Redis it was given do not describe the same run."""


class RunFinished(RuntimeError):
    """The run id names a finished run: resuming it would do nothing, silently."""


class RunState:
    """What the checkpoint holds: the version, the orders in flight, the evaluations and the counts."""

    algo = ""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.version = 0
        self.next_index: dict[int, int] = collections.defaultdict(int)  # the next order index, by version
        self.orders: dict[str, Order] = {}  # training orders in flight (ES members, GRPO groups), by work id
        self.evals: dict[str, Order] = {}  # evaluation orders in flight
        self.eval_results: dict[int, dict[str, Any]] = {}
        self.eval_ids: list[str] = []  # the held-out split as evaluated: what evals.passk checks against
        self.counts: collections.Counter[str] = collections.Counter()
        self.finished = False  # the run reached `iterations` and its last evaluation

    def state(self) -> dict[str, Any]:
        return {
            "algo": self.algo,
            "version": self.version,
            "next_index": {str(k): v for k, v in self.next_index.items()},
            "members": [o.to_dict() for o in self.orders.values()],  # the format's name for orders: old runs resume
            "evals": [o.to_dict() for o in self.evals.values()],
            "eval_results": {str(k): v for k, v in self.eval_results.items()},
            "eval_ids": self.eval_ids,
            "counts": dict(self.counts),
            "finished": self.finished,
        }

    def _load(self, doc: dict[str, Any]) -> None:
        if doc.get("algo") != self.algo:
            raise RuntimeError(
                f"run {self.run_id!r} holds a {doc.get('algo')} checkpoint, not {self.algo}: use another run id"
            )
        self.version = int(doc["version"])
        self.next_index.update({int(k): int(v) for k, v in doc["next_index"].items()})
        self.orders = {o["work_id"]: Order.from_dict(o) for o in doc["members"]}
        self.evals = {o["work_id"]: Order.from_dict(o) for o in doc["evals"]}
        self.eval_results = {int(k): v for k, v in doc["eval_results"].items()}
        self.eval_ids = list(doc.get("eval_ids", []))
        self.counts.update(doc["counts"])
        self.finished = bool(doc.get("finished"))

    def add(self, reward: Reward) -> str:
        """Add `reward` to its order by attempt id. Where it changes nothing, what it was: `late_rewards` (its
        order was used in an update, or dropped) or `duplicate_rewards` (a reward seen twice counts once)."""
        order = self.orders.get(reward.work_id) or self.evals.get(reward.work_id)
        if order is None:
            return "late_rewards"
        if reward.attempt_id in order.rewards:
            return "duplicate_rewards"
        order.rewards[reward.attempt_id] = reward.reward
        order.proved += reward.verdict == "proved"
        order.add_parts(reward.parts)
        if order.is_eval:
            order.by_theorem[reward.theorem_id] = [reward.reward, int(reward.verdict == "proved")]
        return ""

    def resuming(self, iterations: int) -> str:
        """What a trainer resuming the loaded run until `iterations` says; RunFinished where the run finished at
        `iterations` or later: resuming it would do nothing."""
        if self.finished and self.version >= iterations:
            raise RunFinished(
                f"run {self.run_id!r} finished at version {self.version} ({self.counts['samples']} training "
                f"samples); nothing to resume. Use a new --run for a new run, or --iterations N with "
                f"N > {self.version} to continue this one"
            )
        what = "continuing the finished" if self.finished else "resuming"
        return (
            f"trainer: {what} run {self.run_id!r} at version {self.version} of {iterations} ({self.counts['samples']} "
            f"training samples so far, {len(self.orders)} in flight)"
        )


def check_fresh(run_id: str, run_dir: Path, records: list[dict[str, Any]]) -> None:
    """RunMismatch where a run without a checkpoint has versions in its run directory's metrics `records`."""
    if done := max((int(r["version"]) for r in update_records(records)), default=0):
        raise RunMismatch(
            f"{run_dir} holds run {run_id!r} up to version {done} (metrics.jsonl), but this Redis has no state "
            "for it: the run's Redis data is gone, or this is another Redis. Point the trainer at that run's "
            "Redis, or start over in a new --run-dir (or delete this one)"
        )


async def write(redis: Redis, key: str, state: bytes, extra: tuple[tuple[str, dict[bytes, bytes]], ...]) -> None:
    """The checkpoint `state` in hash `key`, and the stream entries `extra`, in one MULTI (one Redis, or the
    run's slot of a cluster)."""
    async with transaction(redis, key) as pipe:
        for stream, fields in extra:
            pipe.xadd(stream, fields)
        pipe.hset(key, STATE_FIELD, state)
        await pipe.execute()


async def write_and_wait(
    redis: Redis,
    key: str,
    state: bytes,
    extra: tuple[tuple[str, dict[bytes, bytes]], ...],
    replicas: int,
    wait_ms: int,
) -> int:
    """As `write`, then WAIT for `replicas`; how many replicas acknowledged it.

    MULTI ... EXEC, WAIT as one pipeline without redis-py's own transaction (which allows nothing after its
    EXEC): one connection for both, as WAIT needs (it counts the replicas that have this connection's writes;
    on a cluster, to the master of the run's slot). A queueing error aborts the EXEC (EXECABORT, raised; on a
    cluster a moved slot is SlotMoved, an outage); an error inside EXEC is raised too."""
    async with slot_pipeline(redis, key) as pipe:
        pipe.execute_command("MULTI")
        for stream, fields in extra:
            pipe.xadd(stream, fields)
        pipe.hset(key, STATE_FIELD, state)
        pipe.execute_command("EXEC")
        pipe.wait(replicas, wait_ms)
        *_, applied, acked = await pipe.execute()
    for result in applied:
        if isinstance(result, Exception):
            raise result
    return acked


class Checkpointer:
    """Writes a run's checkpoint, then acks the entries read since the last one (`unacked`, by stream).

    With a replica (streams.settle's `Replication`: the settle's rule and settings), the MULTI is followed by
    WAIT on the same connection, in one round trip, so that what comes after (the acks, the version's line in
    metrics.jsonl, the next orders) comes after a checkpoint that survives a failover. A WAIT that falls short
    is counted (`checkpoint_unreplicated`) and the run goes on: if the master then dies before the replica has
    it, the trainer sees the outage, rebuilds from the new master's state (`fresh_run` in trainer/__main__.py)
    and redoes the lost version, whose line metrics.jsonl may then hold twice."""

    def __init__(self, redis: Redis, key: str, streams: list[str], replicas: int | None, wait_ms: int) -> None:
        self.redis, self.key = redis, key
        self.unacked: dict[str, list[bytes]] = {stream: [] for stream in streams}
        self.replication = Replication(redis, replicas, wait_ms)
        self.written_at = 0.0  # monotonic time of the last checkpoint

    async def write(
        self, state: dict[str, Any], extra: tuple[tuple[str, dict[bytes, bytes]], ...], counts: Counter
    ) -> None:
        """Write `state` (plus the stream entries `extra`), then ack what it holds."""
        doc, replicas = orjson.dumps(state), await self.replication.wanted(self.key)
        if replicas:
            acked = await write_and_wait(self.redis, self.key, doc, extra, replicas, self.replication.wait_ms)
            if acked < replicas:
                self.replication.fell_short()
                counts["checkpoint_unreplicated"] += 1
                log.warning("checkpoint_unreplicated", version=state["version"], replicas=acked, wanted=replicas)
        else:
            await write(self.redis, self.key, doc, extra)
        if await self.replication.deposed():
            # Split brain: a paused old master took this checkpoint and will lose it when it is demoted. Going on
            # would build versions (the run's end too) on it; as an outage, the run is rebuilt from the new one.
            raise MasterReplaced(f"checkpoint of version {state['version']} went to a replaced master")
        for stream, ids in self.unacked.items():
            if ids:
                await self.redis.xack(stream, TRAINER, *ids)
                ids.clear()
        self.written_at = time.monotonic()

    def due(self, every_s: float) -> bool:
        """Entries wait for their ack and the last checkpoint is older than `every_s`."""
        return any(self.unacked.values()) and time.monotonic() - self.written_at > every_s


async def read_group(
    redis: Redis, consumer: str, streams: list[str], *, pending: bool, block_ms: int | None = None
) -> AsyncIterator[dict[str, Entries]]:
    """Entries of `streams` read in group `trainer`, one reply at a time ({stream: entries}, every stream
    named): new ones (one read, blocking up to `block_ms`), or with `pending` those read before and never acked
    (paged through the pending list to its end)."""
    starts: dict[str, str | bytes] = {stream: "0" if pending else ">" for stream in streams}
    while starts:
        block = None if pending else block_ms
        reply = await redis.xreadgroup(TRAINER, consumer, starts, count=READ_COUNT, block=block)
        got = {(s.decode() if isinstance(s, bytes) else s): entries for s, entries in reply or []}
        batch = {stream: got.get(stream, []) for stream in starts}
        yield batch
        for stream, entries in batch.items():
            if pending and entries:
                starts[stream] = entries[-1][0]
            else:
                del starts[stream]
