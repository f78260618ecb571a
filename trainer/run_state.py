"""The trainer's checkpoint: what a run remembers across a restart, its format, and how it is written.

The checkpoint is one JSON document in the hash `{ps:R}:trainer`, field `state`. Its keys, their order and
the order records' keys (trainer/orders.py `Order.to_dict`) are the format: a run checkpointed by an older
trainer resumes, and is written back byte for byte (tests/trainer/test_state_format.py). An algorithm appends
its own keys after these (`config`; GRPO's `checkpoint` before it), written for people and for its own resume.

It is written in one MULTI with the stream entries of the version it completes (the policy, the metrics), so
a restart never sees one without the others; with a replica, WAIT follows on the same connection.
"""

from __future__ import annotations

import collections
from typing import Any

from redis.asyncio import Redis

from streams.cluster import slot_pipeline, transaction
from trainer.orders import Order

STATE_FIELD = "state"  # the field of `{ps:R}:trainer` that holds the checkpoint


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
