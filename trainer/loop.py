"""The loop every algorithm shares: orders written ahead, rewards and dead letters read, updates checkpointed.

`Run` holds the run's orders (`Order`, trainer/orders.py: an ES member, a GRPO group, an evaluation) and
drives them; an algorithm (trainer/es.py, trainer/grpo.py) says what its orders are, when an update is ready,
and what the update publishes. The loop, until `iterations` versions exist:

1. **Top up.** Keep the algorithm's number of orders in flight (issued, not yet fully rewarded) around the
   newest version, so generators never wait for an update (at quorum 1: exactly that many a version, in
   lockstep). Orders are written to the checkpoint before their work orders are published (write-ahead);
   their work ids are pure functions of (run, version, index), so a restarted trainer re-publishes the same
   orders and the generators' markers make the repeats no-ops.
2. **Collect.** Read `{ps:R}:rewards` in group `trainer`; add each reward to its order by attempt id (a
   reward seen twice counts once). Rewards are acked only after a checkpoint holding them is written: a
   trainer killed in between re-reads them from its pending list.
3. **Update.** When a quorum of the orders has reported (or at the deadline), the algorithm's update runs
   and publishes; the policy entry, the checkpoint and the version's metrics are written in one MULTI, so a
   restart never sees one without the others.

Evaluation orders (`eval-v<version>`: the center, greedy, on the held-out split) go through the same
pipeline every `eval_every` versions and at the end.

Every order ends in an outcome the trainer sees, so none holds a slot for good (`_lose`): its rewards; a
dead letter naming it (the trainer reads `{ps:R}:dlq` in its group too: a work order given up on, a stale
order a generator skipped, an attempt or reward given up on); the staleness bound passing it (an order of a
version more than `max_staleness` versions old can no longer be used: generators skip it by the same rule);
or `order_timeout_s` passing with it unanswered (a generator died with it in hand and none reclaimed it). A
lost member or group is cut, counted (`cut_<why>`), and its order cancelled (its done marker set, so a
generator that takes it later skips it); top-up then issues a new one in its place. A lost evaluation is
issued again under a new work id, up to `EVAL_TRIES` times.

After each update, and at the end, the rewards and work orders that every group has acked and that are
older than `history_s` are trimmed from their streams (`streams.groups.trim_acked`): a long run's Redis
holds what is in flight plus the last hour, not every attempt's reward since the start.

Every reward read is also written to the run's traces, `<run dir>/samples/v<version>.jsonl.gz`, with its
attempt's text (streams.samples; `python -m ops samples` reads them).

One cohesive thing past 400 lines: the write-ahead orders, the reads, the checkpoint that acks what it
holds and the cuts all keep one invariant together (no reward lost or counted twice across a SIGKILL), and
splitting them would spread that invariant over files.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from streams import samples
from streams.cluster import slot_pipeline, transaction
from streams.codec import decode, encode
from streams.groups import trim_acked
from streams.keys import GENERATORS, TRAINER, Keys
from streams.runtime import ensure_group
from streams.schema import DeadLetter, PolicyUpdate, Reward, SchemaError, WorkOrder
from streams.sentinel import MasterReplaced
from streams.settle import Replication
from streams.theorems import Theorem, register
from trainer.config import TrainerSettings
from trainer.metrics import MetricsSink, update_records
from trainer.orders import Order, letter_work_ids, staleness
from trainer.progress import ProgressWatch

log = structlog.get_logger("trainer.loop")

STATE_FIELD = "state"


FINISHED_BEFORE = 3  # python -m trainer's exit status when the run id names a finished run


class RunMismatch(RuntimeError):
    """The run directory and the Redis it was given do not describe the same run."""


class RunFinished(RuntimeError):
    """The run id names a finished run: resuming it would do nothing, silently."""


class NoProgress(RuntimeError):
    """The local pipeline's run can make no progress (trainer/progress.py): the message says why."""


CHECKPOINT_EVERY_S = 2.0
EVAL_TRIES = 3  # an evaluation order lost this many times is given up (counted: evals_lost)
CANCEL_TTL_S = 7 * 24 * 3600  # a cancelled order's done marker lives as long as the runtime's own markers
READ_COUNT = 500  # entries a stream read takes at once


class Run:
    """What every algorithm's run shares: state, checkpoint, orders, rewards, evaluation, the loop.

    An algorithm subclasses it with `algo`, `top_up` (how it issues orders: `_issue` with its `_new_order`),
    `_order_fields` and `_temperature` (what its work orders carry), `_ready` (when an update can happen,
    usually `_ready_at_quorum`) and `update` (the step, published through `_publish`)."""

    algo = ""

    def __init__(
        self,
        settings: TrainerSettings,
        redis: Redis,
        train: list[Theorem],
        held_out: list[Theorem],
        sink: MetricsSink,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.keys = Keys(settings.run)
        self.train = train
        self.held_out = held_out
        self.sink = sink
        self.progress = progress or (lambda version: None)
        self.consumer = "trainer"
        # checkpointed state
        self.version = 0
        self.next_index: dict[int, int] = collections.defaultdict(int)
        self.orders: dict[str, Order] = {}  # training orders in flight (ES members, GRPO groups), by work id
        self.evals: dict[str, Order] = {}  # evaluation orders in flight
        self.eval_results: dict[int, dict[str, Any]] = {}
        # not checkpointed: the evaluations metrics.jsonl holds a line for (read back at a resume), so that
        # one written before a kill that the checkpoint missed is not written a second time when it is redone
        self.evals_in_jsonl: set[int] = set()
        self.eval_ids: list[str] = []  # the held-out split as evaluated: what evals.passk checks against
        self.counts: collections.Counter[str] = collections.Counter()
        self.finished = False  # the run reached `iterations` and its last evaluation
        self.last_update = time.monotonic()
        # not checkpointed: rewards and dead letters read since the last checkpoint (entry ids to ack once it is
        # written, by stream)
        self._unacked: dict[str, list[bytes]] = {self.keys.rewards: [], self.keys.dlq: []}
        self._verdicts: collections.Counter[str] = collections.Counter()
        self._last_checkpoint = 0.0
        self._watching_since = time.time()  # an order's timeout counts from here at the earliest (see _expire)
        self._window_started = time.monotonic()
        self._window_rewards = 0
        self._traced: list[tuple[bytes, Reward]] = []  # rewards read, not yet written to the run's traces
        self._replication = Replication(redis, settings.settle_replicas, settings.settle_wait_ms)
        self.watch = ProgressWatch(settings.stall_timeout_s)
        self._alerted = False  # `{ps:R}:trainer_alert` set by this trainer (a --redis-url run's stall)

    # -- checkpoint ------------------------------------------------------------------------------------

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
                f"run {self.settings.run!r} holds a {doc.get('algo')} checkpoint, not {self.algo}: use another run id"
            )
        self.version = int(doc["version"])
        self.next_index.update({int(k): int(v) for k, v in doc["next_index"].items()})
        self.orders = {o["work_id"]: Order.from_dict(o) for o in doc["members"]}
        self.evals = {o["work_id"]: Order.from_dict(o) for o in doc["evals"]}
        self.eval_results = {int(k): v for k, v in doc["eval_results"].items()}
        self.eval_ids = list(doc.get("eval_ids", []))
        self.counts.update(doc["counts"])
        self.finished = bool(doc.get("finished"))

    async def resume(self) -> bool:
        """Load the checkpoint if the run has one; re-publish the orders still in flight. True if resumed."""
        raw = await self.redis.hget(self.keys.trainer_state, STATE_FIELD)
        await ensure_group(self.redis, self.keys.rewards, TRAINER)
        await ensure_group(self.redis, self.keys.dlq, TRAINER)
        await ensure_group(self.redis, self.keys.work, GENERATORS)
        if raw is None:
            done = max((int(r["version"]) for r in update_records(self.sink.records())), default=0)
            if done:
                raise RunMismatch(
                    f"{self.sink.run_dir} holds run {self.settings.run!r} up to version {done} (metrics.jsonl), "
                    "but this Redis has no state for it: the run's Redis data is gone, or this is another Redis. "
                    "Point the trainer at that run's Redis, or start over in a new --run-dir (or delete this one)"
                )
            await register(self.redis, self.keys, self.train + self.held_out)
            return False
        self._load(orjson.loads(raw))
        run, iterations = self.settings.run, self.settings.iterations
        if self.finished and self.version >= iterations:
            raise RunFinished(
                f"run {run!r} finished at version {self.version} ({self.counts['samples']} training samples); "
                f"nothing to resume. Use a new --run for a new run, or --iterations N with N > {self.version} "
                "to continue this one"
            )
        what = "continuing the finished" if self.finished else "resuming"
        print(f"trainer: {what} run {run!r} at version {self.version} of {iterations} ({self.counts['samples']} "
              f"training samples so far, {len(self.orders)} in flight)", file=sys.stderr)  # fmt: skip
        self.finished = False
        self.counts["resumes"] += 1
        await self._backfill_metrics()
        # Orders written ahead but maybe never published: publish again (the generators' markers dedup).
        await self._publish_orders([*self.orders.values(), *self.evals.values()])
        await self._read(block_ms=None, pending=True)  # rewards and dead letters read before the crash, never acked
        await self.checkpoint()  # the resume is counted even if this trainer dies before its first update
        log.info("trainer_resumed", version=self.version, members=len(self.orders), evals=len(self.evals))
        return True

    async def _backfill_metrics(self) -> None:
        """A trainer killed between a version's MULTI (policy, metrics stream, checkpoint) and its line in
        metrics.jsonl left that version in Redis only, and so out of the JSONL, TensorBoard and MLflow too;
        likewise an evaluation in the checkpoint. Write what the run directory lacks, from Redis."""
        records = self.sink.records()
        have = {int(r["version"]) for r in update_records(records)}
        for _, fields in await self.redis.xrange(self.keys.metrics):
            metrics = orjson.loads(fields[b"json"])
            if int(metrics["version"]) not in have:
                self.sink.write(metrics)
                self.counts["metrics_backfilled"] += 1
        self.evals_in_jsonl = {int(r["version"]) for r in records if r.get("eval")}
        for version, result in sorted(self.eval_results.items()):
            if version not in self.evals_in_jsonl:
                self.sink.write({"eval": True, **result, "time": time.time()})
                self.evals_in_jsonl.add(version)
                self.counts["metrics_backfilled"] += 1
        self.counts["metrics_backfilled"] += self.sink.catch_up()

    async def checkpoint(self, *extra: tuple[str, dict[bytes, bytes]]) -> None:
        """Write the state (plus `extra` stream entries) in one MULTI, then ack the rewards it holds.

        With a replica (streams.settle's `Replication`: the settle's rule and settings), the MULTI is followed
        by WAIT on the same connection, in one round trip, so that what comes after (the acks, the version's
        line in metrics.jsonl, the next orders) comes after a checkpoint that survives a failover. A WAIT that
        falls short is counted (`checkpoint_unreplicated`) and the run goes on: if the master then dies before
        the replica has it, the trainer sees the outage, rebuilds from the new master's state (`fresh_run` in
        trainer/__main__.py) and redoes the lost version, whose line metrics.jsonl may then hold twice."""
        replicas = await self._replication.wanted(self.keys.trainer_state)
        state = orjson.dumps(self.state())
        if not replicas:
            async with transaction(self.redis, self.keys.trainer_state) as pipe:  # one Redis or the run's slot
                for stream, fields in extra:
                    pipe.xadd(stream, fields)
                pipe.hset(self.keys.trainer_state, STATE_FIELD, state)
                await pipe.execute()
        else:
            await self._checkpoint_and_wait(extra, state, replicas)
        if await self._replication.deposed():
            # Split brain: a paused old master took this checkpoint and will lose it when it is demoted. Going on
            # would build versions (the run's end too) on it; as an outage, the run is rebuilt from the new one.
            raise MasterReplaced(f"checkpoint of version {self.version} went to a replaced master")
        for stream, ids in self._unacked.items():
            if ids:
                await self.redis.xack(stream, TRAINER, *ids)
                ids.clear()
        self._last_checkpoint = time.monotonic()

    async def _checkpoint_and_wait(self, extra: tuple, state: bytes, replicas: int) -> None:
        """MULTI ... EXEC, WAIT as one pipeline without redis-py's own transaction (which allows nothing after
        its EXEC): one connection for both, as WAIT needs (it counts the replicas that have this connection's
        writes; on a cluster, to the master of the run's slot). A queueing error aborts the EXEC (EXECABORT,
        raised; on a cluster a moved slot is SlotMoved, an outage); an error inside EXEC is raised too."""
        async with slot_pipeline(self.redis, self.keys.trainer_state) as pipe:
            pipe.execute_command("MULTI")
            for stream, fields in extra:
                pipe.xadd(stream, fields)
            pipe.hset(self.keys.trainer_state, STATE_FIELD, state)
            pipe.execute_command("EXEC")
            pipe.wait(replicas, self._replication.wait_ms)
            *_, applied, acked = await pipe.execute()
        for result in applied:
            if isinstance(result, Exception):
                raise result
        if acked < replicas:
            self._replication.fell_short()
            self.counts["checkpoint_unreplicated"] += 1
            log.warning("checkpoint_unreplicated", version=self.version, replicas=acked, wanted=replicas)

    async def trim_history(self) -> None:
        """Trim the rewards and work orders every group has acked, keeping the last `history_s` seconds."""
        for name, stream in (("rewards", self.keys.rewards), ("work", self.keys.work)):
            if trimmed := await trim_acked(self.redis, stream, keep_s=self.settings.history_s):
                self.counts[f"trimmed_{name}"] += trimmed

    # -- orders ------------------------------------------------------------------------------------------

    async def _issue(self, size: int, new_order: Callable[[int, int], Order], counter: str) -> int:
        """Issue orders around the newest version until `size` are out (`_room`); `new_order(version, index)`
        makes each. Returns how many were issued."""
        want = self._room(size)
        if want <= 0:
            return 0
        center, first = self.version, self.next_index[self.version]
        new = [new_order(center, index) for index in range(first, first + want)]
        for order in new:
            self.orders[order.work_id] = order
        self.next_index[center] += want
        await self.checkpoint()  # write-ahead: the orders exist before their work orders do
        await self._publish_orders(new)
        self.counts[counter] += len(new)
        return len(new)

    async def _publish_orders(self, orders: list[Order]) -> None:
        if not orders:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for work in self._work_orders(orders):
                pipe.xadd(self.keys.work, encode(work))
            await pipe.execute()

    def _work_orders(self, orders: list[Order]) -> list[WorkOrder]:
        """The work orders that ask for `orders`: one each (ES bundles members, trainer/es.py)."""
        return [self._work_order(order) for order in orders]

    def _work_order(self, order: Order) -> WorkOrder:
        """The work order of a member (ES), a group (GRPO) or an evaluation (greedy, no staleness bound)."""
        is_eval = order.is_eval
        return WorkOrder(
            work_id=order.work_id,
            policy_version=order.center,
            algo=self.algo,
            task=self.settings.task,
            theorem_ids=order.theorem_ids,
            sampling={
                "temperature": 0.0 if is_eval else self._temperature(),
                "max_new_tokens": self.settings.max_new_tokens,
            },
            issued_ms=int(time.time() * 1000),
            max_staleness=None if is_eval else self.settings.max_staleness,
            **self._order_fields(order, is_eval),
        )

    def _order_fields(self, order: Order, is_eval: bool) -> dict[str, Any]:
        """The algorithm's own work-order fields."""
        raise NotImplementedError

    def _temperature(self) -> float:
        """The sampling temperature of training work (evaluations are greedy)."""
        return self.settings.temperature

    async def top_up(self) -> int:
        raise NotImplementedError

    def _ready(self) -> Any:
        """What the next update needs, when it can happen now; else None."""
        raise NotImplementedError

    def _ready_at_quorum(self, size: int, at_least: int) -> list[Order] | None:
        """The usable orders, once a quorum of `size` of them is fresh (within `max_staleness`), or once
        `deadline_s` has passed since the last update with at least `at_least` fresh; else None."""
        usable = [o for o in self.orders.values() if self._usable(o)]
        fresh = sum(1 for o in usable if staleness(self.version, o.center) <= self.settings.max_staleness)
        if fresh >= max(at_least, round(self.settings.quorum * size)):
            return usable
        if fresh >= at_least and time.monotonic() - self.last_update > self.settings.deadline_s:
            self.counts["deadline_updates"] += 1
            return usable
        return None

    async def update(self, ready: Any) -> dict[str, Any] | None:
        """The step from `ready`, ended by `_publish`: the version's metrics, or None where it made no version."""
        raise NotImplementedError

    async def _publish(
        self, policy: PolicyUpdate | None, used: list[Order], stale: list[Order], own: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The end of every update: settle the orders it used (`used`) and dropped as too stale (`stale`), and
        write the new version (`policy`; None: the step made none) with its metrics and the checkpoint in one
        MULTI. Returns the version's metrics, None without a version.

        The metrics every algorithm's version carries, before its own (`own`): `reward_mean` and `pass_rate`
        over the attempts used, `attempts` (used by this update), `samples` (training attempts consumed by the
        updates so far, with or without a version: the run's x axis), `stale_dropped`, `staleness` (orders used
        by their lag, trainer/orders.py `staleness`: {"0": n, ...}, 0 for the newest version), the verdicts,
        rewards read per second and seconds since the last update, `health_figures`, and the pipeline's."""
        attempts = sum(len(o.rewards) for o in used)
        self.counts["samples"] += attempts
        for o in [*used, *stale]:
            del self.orders[o.work_id]
        now = time.monotonic()
        metrics, extra = None, []
        if policy is not None:
            metrics = {
                "version": policy.policy_version,
                "algo": self.algo,
                "reward_mean": round(sum(sum(o.rewards.values()) for o in used) / max(1, attempts), 6),
                "pass_rate": round(sum(o.proved for o in used) / max(1, attempts), 6),
                "attempts": attempts,
                "samples": self.counts["samples"],
                "stale_dropped": len(stale),
                "staleness": dict(collections.Counter(str(staleness(self.version, o.center)) for o in used)),
                "verdicts": dict(self._verdicts),
                "rewards_per_s": round(self._window_rewards / max(now - self._window_started, 1e-9), 2),
                "update_s": round(now - self.last_update, 2),
                **own,
                **self.health_figures(),
                "time": time.time(),
            }
            metrics.update(await self.sink.pipeline_figures(self.redis, self.keys))
            extra = [
                (self.keys.policy, encode(policy)),
                (self.keys.metrics, {b"v": b"1", b"json": orjson.dumps(metrics)}),
            ]
            self.version = policy.policy_version
        self._verdicts.clear()
        self._window_rewards, self._window_started, self.last_update = 0, now, now
        await self.checkpoint(*extra)
        if metrics is not None:
            self.sink.write(metrics)
            log.info(f"{self.algo}_update", **{k: metrics[k] for k in ("version", "reward_mean", "pass_rate",
                                                                        "attempts", "samples")})  # fmt: skip
        return metrics

    async def poll(self, block_ms: int) -> None:
        """Read what has arrived (rewards; GRPO also attempts)."""
        await self._read(block_ms=block_ms)

    # -- rewards -----------------------------------------------------------------------------------------

    async def _read_group(
        self, streams: list[str], *, pending: bool, block_ms: int | None = None
    ) -> AsyncIterator[dict[str, list[tuple[bytes, dict[bytes, bytes]]]]]:
        """Entries of `streams` read in group `trainer`, one reply at a time ({stream: entries}, every stream
        named): new ones (one read, blocking up to `block_ms`), or with `pending` those read before and never
        acked (paged through the pending list to its end).

        The trainer's one stream read (rewards and dead letters; GRPO also attempts). Not streams.runtime's
        Consumer: that one settles each entry as its handler returns, and the trainer acks an entry only once a
        checkpoint holds what it read from it (`checkpoint`), which may be many reads later."""
        starts: dict[str, str | bytes] = {stream: "0" if pending else ">" for stream in streams}
        while starts:
            reply = await self.redis.xreadgroup(TRAINER, self.consumer, starts, count=READ_COUNT,
                                                block=None if pending else block_ms)  # fmt: skip
            got = {(s.decode() if isinstance(s, bytes) else s): entries for s, entries in reply or []}
            batch = {stream: got.get(stream, []) for stream in starts}
            yield batch
            for stream, entries in batch.items():
                if pending and entries:
                    starts[stream] = entries[-1][0]
                else:
                    del starts[stream]

    async def _read(self, block_ms: int | None, pending: bool = False) -> int:
        """Read rewards and dead letters (new ones; or, with `pending`, those read before and never acked)."""
        seen = 0
        async for batch in self._read_group([self.keys.rewards, self.keys.dlq], pending=pending, block_ms=block_ms):
            for stream, entries in batch.items():
                take = self._take if stream == self.keys.rewards else self._take_letter
                for entry_id, fields in entries:
                    await take(entry_id, fields)
                seen += len(entries)
            await self._trace()
        return seen

    async def _trace(self) -> None:
        """Append the samples of the rewards just read to the run's traces (streams.samples), a file a version:
        the attempt's text comes from the attempts stream, one round trip for the lot."""
        traced, self._traced = self._traced, []
        if not traced:
            return
        attempts = await samples.attempts_of(self.redis, self.keys, (r for _, r in traced))
        by_version: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
        for entry_id, r in traced:
            attempt = attempts.get(r.attempt_id)
            by_version[r.policy_version].append(samples.sample(r, entry_id, attempt))
            self.counts["traced_without_text"] += attempt is None
        for version, found in by_version.items():
            self.counts["trace_bytes"] += samples.append(samples.file_for(self.sink.run_dir, version), found)
        self.counts["traced_samples"] += len(traced)

    async def _take(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        self._unacked[self.keys.rewards].append(entry_id)
        try:
            reward = decode(Reward, fields)
        except SchemaError as e:
            letter = DeadLetter(self.keys.rewards, TRAINER, entry_id.decode(), 1, str(e), self.consumer,
                                int(time.time() * 1000), dict(fields))  # fmt: skip
            await self.redis.xadd(self.keys.dlq, encode(letter))
            self.counts["bad_rewards"] += 1
            return
        self._traced.append((entry_id, reward))
        self.watch.saw_progress()
        order = self.orders.get(reward.work_id) or self.evals.get(reward.work_id)
        if order is None:  # an order already used in an update, or dropped: its late rewards change nothing
            self.counts["late_rewards"] += 1
            return
        if reward.attempt_id in order.rewards:
            self.counts["duplicate_rewards"] += 1
            return
        order.rewards[reward.attempt_id] = reward.reward
        order.proved += reward.verdict == "proved"
        self._verdicts[reward.verdict] += 1
        self._window_rewards += 1

    # -- lost outcomes -----------------------------------------------------------------------------------

    async def _take_letter(self, entry_id: bytes, fields: dict[bytes, bytes] | None) -> None:
        """A dead letter: if it names an order in flight (its own fields, or an attempt's or reward's), that
        order will never complete."""
        self._unacked[self.keys.dlq].append(entry_id)
        if not fields:  # deleted from the dead letters (`ops dlq purge`/`requeue`) after this trainer read it
            return
        try:
            letter = decode(DeadLetter, fields)
        except SchemaError:
            return
        self.watch.saw_letter(letter.reason)
        why = "skipped" if letter.reason.startswith("skipped") else "dead_letter"
        for work_id in letter_work_ids(letter.original):
            order = self.orders.get(work_id) or self.evals.get(work_id)
            if order is not None:
                await self._lose(order, why, letter.reason)

    async def _expire(self) -> None:
        """Cut what can no longer be used: orders of centers past the staleness bound (evaluations have
        none), and orders unanswered `order_timeout_s` after they were issued. A restarted trainer gives the
        orders it inherits the whole timeout again: their rewards may be waiting in the stream, unread while
        no trainer ran."""
        now, bound = time.time(), self.settings.max_staleness
        for o in list(self.orders.values()):
            if staleness(self.version, o.center) > bound and not self._usable(o):
                await self._lose(o, "stale", f"center {o.center}, now at version {self.version}")
        for o in [*self.orders.values(), *self.evals.values()]:
            waited = now - max(o.issued_at, self._watching_since)
            if waited > self.settings.order_timeout_s and not self._usable(o):
                await self._lose(o, "timeout", f"unanswered for {waited:.0f} s")

    def _usable(self, order: Order) -> bool:
        """Complete (GRPO: with its samples): the next update decides about it."""
        return order.complete

    def _room(self, size: int) -> int:
        """How many orders top-up may issue around the newest version so that `size` are out. At quorum 1 the
        run goes in lockstep: a version gets `size` orders and no more (a cut one is replaced), and its update
        uses all of them, so the steps do not depend on timing (issue 15's deterministic recovery). Below 1,
        orders finished early make room for new ones at once."""
        if self.settings.quorum >= 1:
            return size - sum(1 for o in self.orders.values() if o.center == self.version)
        return size - sum(1 for o in self.orders.values() if not self._usable(o))

    async def _lose(self, order: Order, why: str, detail: str) -> None:
        """`order` ends without its rewards: cut it (top-up issues another in its place) or, for an
        evaluation, ask again. The order is cancelled: a generator that takes it later skips it unserved."""
        if self.orders.pop(order.work_id, None) is not None:
            self.counts[f"cut_{why}"] += 1
        elif self.evals.pop(order.work_id, None) is not None:
            tries = int(order.work_id.rsplit("-r", 1)[1]) + 1 if "-r" in order.work_id else 1
            if tries < EVAL_TRIES:
                self.counts["evals_reissued"] += 1
                await self._issue_eval(order.center, f"eval-v{order.center}-r{tries}")
            else:
                self.counts["evals_lost"] += 1
        else:
            return
        log.warning("order_lost", work_id=order.work_id, why=why, detail=detail[:200])
        await self.redis.set(self.keys.done(WorkOrder.dedup_for(order.work_id)), b"cancelled", nx=True, ex=CANCEL_TTL_S)

    async def _watch_progress(self) -> None:
        """A run that can make no progress (trainer/progress.py): the local pipeline's stops with the cause; one
        whose roles run elsewhere says so in `{ps:R}:trainer_alert` until progress resumes."""
        cause = await self.watch.check(self.redis, self.keys)
        if cause is None:
            if self._alerted and time.monotonic() - self.watch.last_progress < self.watch.stall_timeout_s:
                await self.redis.delete(self.keys.trainer_alert)
                self._alerted = False
                log.info("run_progressing_again", version=self.version)
            return
        if not self.settings.redis_url:
            raise NoProgress(cause)
        if not self._alerted:
            log.error("run_stalled", version=self.version, cause=cause[:2000])
            print(f"trainer: {cause}; the roles run elsewhere: the run goes on once they can", file=sys.stderr)
        alert = {"cause": cause, "version": self.version, "since_ms": int(time.time() * 1000)}
        await self.redis.set(self.keys.trainer_alert, orjson.dumps(alert))
        self._alerted = True

    def health_figures(self) -> dict[str, Any]:
        """What each version's metrics carry besides the update: orders in flight and the age of the oldest,
        and the orders lost so far, by outcome (`cut_<why>`, `evals_reissued`, `evals_lost`)."""
        running = [o for o in self.orders.values() if not self._usable(o)]
        oldest = min((o.issued_at for o in running if o.issued_at), default=None)
        return {
            "in_flight": len(running),
            "oldest_in_flight_s": round(time.time() - oldest, 1) if oldest else None,
            "evals_in_flight": len(self.evals),
            **{k: v for k, v in self.counts.items() if k.startswith(("cut_", "evals_"))},
        }

    # -- evaluations -------------------------------------------------------------------------------------

    async def issue_eval(self, version: int) -> None:
        """Evaluate `version` on the held-out split, once: a second order would carry the same work id, which
        the generators drop as a repeat, and the run would wait for its rewards until the deadline (a GRPO
        step without signal keeps the version; the end of a run asks for the last version again)."""
        if not self.held_out or version in self.eval_results or any(o.center == version for o in self.evals.values()):
            return
        await self._issue_eval(version, f"eval-v{version}")

    async def _issue_eval(self, version: int, work_id: str) -> None:
        self.eval_ids = [t.theorem_id for t in self.held_out]
        order = Order(work_id, version, 0, 1, self.eval_ids, issued_at=time.time())
        self.evals[order.work_id] = order
        await self.checkpoint()
        await self._publish_orders([order])

    def _eval_done(self) -> None:
        for work_id, o in list(self.evals.items()):
            if o.complete:
                version = o.center
                result = {
                    "version": version,
                    "held_out_reward": round(o.score, 6),
                    "held_out_exact": round(o.proved / max(1, o.expected), 6),
                    "problems": o.expected,
                }
                self.eval_results[version] = result
                if version not in self.evals_in_jsonl:  # written before a kill, and redone since: once
                    self.sink.write({"eval": True, **result, "time": time.time()})
                    self.evals_in_jsonl.add(version)
                del self.evals[work_id]

    # -- the loop ----------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> dict[str, Any]:
        await self.resume()
        await self.redis.delete(self.keys.trainer_alert)  # a stalled trainer's, killed before progress resumed
        if self.settings.eval_every and self.version == 0:
            await self.issue_eval(0)
        self.progress(self.version)
        while not stop.is_set() and self.version < self.settings.iterations:
            await self.top_up()
            await self.poll(block_ms=500)
            self._eval_done()
            await self._expire()
            await self._watch_progress()
            ready = self._ready()
            if ready is not None:
                await self.update(ready)
                self.watch.saw_progress()
                await self.trim_history()
                if self.settings.eval_every and self.version % self.settings.eval_every == 0:
                    await self.issue_eval(self.version)
                self.progress(self.version)
            elif any(self._unacked.values()) and time.monotonic() - self._last_checkpoint > CHECKPOINT_EVERY_S:
                await self.checkpoint()
        if not stop.is_set() and self.settings.eval_every:
            await self.issue_eval(self.version)
            deadline = time.monotonic() + self.settings.deadline_s
            while self.evals and not stop.is_set() and time.monotonic() < deadline:
                await self.poll(block_ms=500)
                self._eval_done()
                await self._expire()
        self.finished = not stop.is_set() and self.version >= self.settings.iterations
        if self._alerted:
            await self.redis.delete(self.keys.trainer_alert)
        await self.checkpoint()
        await self.trim_history()
        return {"version": self.version, "counts": dict(self.counts), "evals": self.eval_results}
