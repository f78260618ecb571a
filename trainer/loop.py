"""The loop every algorithm shares: orders written ahead, rewards and dead letters read, updates checkpointed.

`Run` holds the run's orders (trainer/orders.py `Order`: an ES member, a GRPO group, an evaluation); an
algorithm (trainer/es.py, trainer/grpo.py) says what its orders are, when an update is ready and what it
publishes. Until `iterations` versions exist (or, with `max_minutes`, until the version under way when the
wall-clock budget runs out is made):

1. **Top up.** Keep the algorithm's number of orders in flight around the newest version. Orders are written
   to the checkpoint before their work orders are published (write-ahead); work ids are pure functions of
   (run, version, index), so a restarted trainer re-publishes the same orders and the generators' markers
   make the repeats no-ops.
2. **Collect.** Read `{ps:R}:rewards` in group `trainer` and add each reward to its order (once). Rewards are
   acked only after a checkpoint holding them is written: a trainer killed in between re-reads them.
3. **Update.** When a quorum of the orders has reported (or at the deadline), the algorithm's update runs;
   the policy entry, the checkpoint and the version's metrics are written in one MULTI.

Every order ends in an outcome the trainer sees (`_lose`): its rewards; a dead letter naming it; the
staleness bound or `order_timeout_s` passing it (trainer/orders.py `expired`). A lost member or group is
cut, counted (`cut_<why>`) and cancelled (its done marker set), and top-up issues another; a lost evaluation
is asked again. After each update what every group has acked, older than `history_s`, is trimmed.

This module keeps one invariant, no reward lost or counted twice across a SIGKILL: the write-ahead orders,
the reads, the checkpoint before the acks, the cuts. Around it, each in its own module: the checkpoint's
format, writes and reads (trainer/run_state.py), evaluations (held_out.py), a
version's metrics (version_metrics.py), the stall watch (progress.py), traces (traces.py) and the metrics a
kill left in Redis only (backfill.py).
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from streams.codec import decode, encode
from streams.groups import trim_acked
from streams.keys import GENERATORS, TRAINER, Keys
from streams.letters import letter
from streams.runtime import ensure_group
from streams.schema import PolicyUpdate, Reward, SchemaError, WorkOrder
from streams.theorems import Theorem, register
from trainer.backfill import backfill
from trainer.config import TrainerSettings
from trainer.held_out import Evaluations, eval_order, next_try
from trainer.metrics import MetricsSink
from trainer.orders import Order, at_quorum, expired, letter_losses, room, work_order
from trainer.pipeline_figures import pipeline_figures
from trainer.progress import ProgressWatch
from trainer.run_state import STATE_FIELD, Checkpointer, Entries, RunState, check_fresh, read_group
from trainer.traces import trace
from trainer.version_metrics import health_figures, version_metrics

log = structlog.get_logger("trainer.loop")

CHECKPOINT_EVERY_S = 2.0
CANCEL_TTL_S = 7 * 24 * 3600  # a cancelled order's done marker lives as long as the runtime's own markers


class Run(RunState):
    """What every algorithm's run shares: orders, rewards, checkpoint, evaluation, the loop.

    An algorithm subclasses it with `algo`, `top_up` (how it issues orders: `_issue` with its new orders),
    `_ready` (when an update can happen, usually `_ready_at_quorum`) and `update` (the step, published through
    `_publish`). ES also says how its orders go out (`work_orders`); GRPO which orders are usable (`_usable`),
    the stream it reads besides (`takers`) and what it lets go of when an order leaves (`_settled`)."""

    def __init__(
        self,
        settings: TrainerSettings,
        redis: Redis,
        train: list[Theorem],
        held_out: list[Theorem],
        sink: MetricsSink,
        progress: Callable[[int | None], None] | None = None,
    ) -> None:
        super().__init__(settings.run)
        self.settings, self.redis, self.keys = settings, redis, Keys(settings.run)
        self.train, self.held_out, self.sink = train, held_out, sink
        self.progress = progress or (lambda version: None)
        self.consumer = "trainer"
        self.last_update = time.monotonic()
        # what the run reads in group `trainer`, by stream (rewards and dead letters: acked by a checkpoint)
        self.takers: dict[str, Callable[[Entries], Awaitable[None]]] = {
            self.keys.rewards: self._take_rewards,
            self.keys.dlq: self._take_letters,
        }
        acked_later, replicas = [self.keys.rewards, self.keys.dlq], settings.settle_replicas
        self.checkpointer = Checkpointer(redis, self.keys.trainer_state, acked_later, replicas, settings.settle_wait_ms)
        # the console (trainer/console.py) also prints each evaluation as it lands; a bare callable does not
        self.evaluations = Evaluations(held_out, sink, getattr(progress, "evaluated", None))
        self.watch = ProgressWatch(settings.stall_timeout_s, local=not settings.redis_url)
        self._watching_since = time.time()  # an order's timeout counts from here at the earliest
        self._verdicts: collections.Counter[str] = collections.Counter()  # of the rewards read since the update
        self._traced: list[tuple[bytes, Reward]] = []  # rewards read, not yet written to the run's traces
        # the wall-clock budget (`max_minutes`) counts from here, or from the trainer's start where it says
        # (trainer/__main__.py sets it); `time_up`: the budget ended the loop
        self.started_at, self.time_up = time.time(), False
        self._last_eval_at = self.started_at  # when the last evaluation was issued (`eval_every_minutes`)

    # -- checkpoint ------------------------------------------------------------------------------------

    async def resume(self) -> bool:
        """Load the checkpoint if the run has one; re-publish the orders still in flight. True if resumed."""
        raw = await self.redis.hget(self.keys.trainer_state, STATE_FIELD)
        for stream in self.takers:
            await ensure_group(self.redis, stream, TRAINER)
        await ensure_group(self.redis, self.keys.work, GENERATORS)
        if raw is None:
            check_fresh(self.settings.run, self.sink.run_dir, self.sink.records())
            await register(self.redis, self.keys, self.train + self.held_out)
            return False
        self._load(orjson.loads(raw))
        print(self.resuming(self.settings.iterations), file=sys.stderr)
        self.finished = False
        self.counts["resumes"] += 1
        self.evaluations.in_jsonl = await backfill(self.redis, self.keys, self.sink, self.eval_results, self.counts)
        # Orders written ahead but maybe never published: publish again (the generators' markers dedup).
        await self._publish_orders([*self.orders.values(), *self.evals.values()])
        await self.poll(block_ms=None, pending=True)  # what was read before the crash, never acked
        await self.checkpoint()  # the resume is counted even if this trainer dies before its first update
        log.info("trainer_resumed", version=self.version, members=len(self.orders), evals=len(self.evals))
        return True

    async def checkpoint(self, *extra: tuple[str, dict[bytes, bytes]]) -> None:
        """Write the state (plus `extra` stream entries) in one MULTI, then ack the entries it holds
        (trainer/run_state.py `Checkpointer`: with a replica, only once it has the checkpoint)."""
        await self.checkpointer.write(self.state(), extra, self.counts)

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
        self.next_index[center] += want
        await self._write_ahead(new, self.orders)
        self.counts[counter] += len(new)
        return len(new)

    async def _write_ahead(self, orders: list[Order], into: dict[str, Order]) -> None:
        """Add `orders` to the run (`into`: its orders or its evaluations) and checkpoint them, then publish
        their work orders: a restarted trainer re-publishes what it finds in the checkpoint."""
        into.update((o.work_id, o) for o in orders)
        await self.checkpoint()
        await self._publish_orders(orders)

    async def _publish_orders(self, orders: list[Order]) -> None:
        if not orders:
            return
        works = self.work_orders(orders)
        async with self.redis.pipeline(transaction=False) as pipe:
            for work in works:
                pipe.xadd(self.keys.work, encode(work))
            await pipe.execute()
        self.counts["work_orders"] += len(works)  # engine calls asked for: beside members_issued, how they bundled

    def work_orders(self, orders: list[Order]) -> list[WorkOrder]:
        """The work orders that ask for `orders` (trainer/orders.py `work_order`): one each, at the run's
        temperature (ES bundles members)."""
        return [work_order(o, self.algo, self.settings, self.settings.temperature) for o in orders]

    def _room(self, size: int) -> int:
        """How many orders top-up may issue around the newest version so that `size` are out (trainer/orders.py
        `room`)."""
        return room(size, self.orders.values(), self.version, self.settings.quorum, self._usable)

    def _usable(self, order: Order) -> bool:
        """Complete (GRPO: with its samples): the next update decides about it."""
        return order.complete

    async def _settled(self, orders: list[Order]) -> None:
        """`orders` left the run (used, dropped or lost): what an algorithm keeps for them can go."""

    # -- the update --------------------------------------------------------------------------------------

    async def top_up(self) -> int:
        raise NotImplementedError

    def _ready(self) -> Any:
        """What the next update needs, when it can happen now; else None."""
        raise NotImplementedError

    def _ready_at_quorum(self, size: int, at_least: int) -> list[Order] | None:
        """The usable orders once they make an update (trainer/orders.py `at_quorum`: a quorum of `size`, or
        `deadline_s` passed with at least `at_least`); else None."""
        usable = [o for o in self.orders.values() if self._usable(o)]
        s, waited_s = self.settings, time.monotonic() - self.last_update
        why = at_quorum(usable, size, at_least, self.version, s.max_staleness, s.quorum, waited_s > s.deadline_s)
        if why == "deadline":
            self.counts["deadline_updates"] += 1
        return usable if why else None

    async def update(self, ready: Any) -> dict[str, Any] | None:
        """The step from `ready`, ended by `_publish`: the version's metrics, or None where it made no version."""
        raise NotImplementedError

    async def _publish(
        self, policy: PolicyUpdate | None, used: list[Order], stale: list[Order], own: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The end of every update: settle the orders it used (`used`) and dropped as too stale (`stale`), and
        write the new version (`policy`; None: the step made none) with its metrics (trainer/version_metrics.py,
        then the algorithm's `own`, the orders' health and the pipeline's figures) and the checkpoint in one
        MULTI. Returns the version's metrics, None without a version."""
        self.counts["samples"] += sum(len(o.rewards) for o in used)
        for o in [*used, *stale]:
            del self.orders[o.work_id]
        now = time.monotonic()
        metrics, extra = None, []
        if policy is not None:
            v, samples, elapsed_s = policy.policy_version, self.counts["samples"], now - self.last_update
            common = version_metrics(v, self.algo, self.version, used, stale, samples, self._verdicts, elapsed_s)
            running = [o for o in self.orders.values() if not self._usable(o)]
            health = health_figures(running, len(self.evals), self.counts, time.time())
            metrics = {**common, **own, **health, "time": time.time()}
            metrics.update(await pipeline_figures(self.redis, self.keys))
            extra = [
                (self.keys.policy, encode(policy)),
                (self.keys.metrics, {b"v": b"1", b"json": orjson.dumps(metrics)}),
            ]
            self.version = policy.policy_version
        self._verdicts.clear()
        self.last_update = now
        await self.checkpoint(*extra)
        await self._settled([*used, *stale])
        if metrics is not None:
            self.sink.write(metrics)
            shown = ("version", "reward_mean", "pass_rate", "attempts", "samples")
            log.info(f"{self.algo}_update", **{k: metrics[k] for k in shown})
        return metrics

    # -- reads -------------------------------------------------------------------------------------------

    async def poll(self, block_ms: int | None, pending: bool = False) -> None:
        """Read what the run reads (`takers`: rewards and dead letters; GRPO also attempts): new entries or, with
        `pending`, those read before and never acked; then write the rewards read to the run's traces."""
        streams = list(self.takers)
        async for batch in read_group(self.redis, self.consumer, streams, pending=pending, block_ms=block_ms):
            for stream, entries in batch.items():
                await self.takers[stream](entries)
            traced, self._traced = self._traced, []
            await trace(self.redis, self.keys, self.sink.run_dir, traced, self.counts)

    async def _take_rewards(self, entries: Entries) -> None:
        """Add each reward to its order (RunState.add), to be acked by the next checkpoint."""
        for entry_id, fields in entries:
            self.checkpointer.unacked[self.keys.rewards].append(entry_id)
            try:
                reward = decode(Reward, fields)
            except SchemaError as e:
                await self._dead_letter(entry_id, fields, str(e))
                continue
            self._traced.append((entry_id, reward))
            self.watch.saw_progress()
            if ignored := self.add(reward):
                self.counts[ignored] += 1
            else:
                self._verdicts[reward.verdict] += 1

    async def _dead_letter(self, entry_id: bytes, fields: dict[bytes, bytes], why: str) -> None:
        """A reward the trainer cannot read goes to the dead letters, counted (`bad_rewards`)."""
        dead = letter(self.keys.rewards, TRAINER, self.consumer, entry_id, fields, 1, why)
        await self.redis.xadd(self.keys.dlq, encode(dead))
        self.counts["bad_rewards"] += 1

    # -- lost outcomes -----------------------------------------------------------------------------------

    async def _take_letters(self, entries: Entries) -> None:
        """Dead letters: one that names an order in flight says that order will never complete."""
        for entry_id, fields in entries:
            self.checkpointer.unacked[self.keys.dlq].append(entry_id)
            why, reason, work_ids = letter_losses(fields)
            self.watch.saw_letter(reason)
            for work_id in work_ids:
                if order := self.orders.get(work_id) or self.evals.get(work_id):
                    await self._lose(order, why, reason)

    async def _expire(self) -> None:
        """Cut what can no longer be used (trainer/orders.py `expired`): stale, or unanswered for too long."""
        running = [o for o in self.orders.values() if not self._usable(o)]
        evals = [o for o in self.evals.values() if not self._usable(o)]
        s, since = self.settings, self._watching_since
        lost = expired(running, evals, self.version, s.max_staleness, s.order_timeout_s, since, time.time())
        for o, why, detail in lost:
            await self._lose(o, why, detail)

    async def _lose(self, order: Order, why: str, detail: str) -> None:
        """`order` ends without its rewards: cut it (top-up issues another in its place) or, for an
        evaluation, ask again. The order is cancelled: a generator that takes it later skips it unserved."""
        if self.orders.pop(order.work_id, None) is not None:
            self.counts[f"cut_{why}"] += 1
            await self._settled([order])
        elif self.evals.pop(order.work_id, None) is not None:
            if retry := next_try(order):
                self.counts["evals_reissued"] += 1
                await self.issue_eval(order.center, retry)
            else:
                self.counts["evals_lost"] += 1
        else:
            return
        log.warning("order_lost", work_id=order.work_id, why=why, detail=detail[:200])
        await self.redis.set(self.keys.done(WorkOrder.dedup_for(order.work_id)), b"cancelled", nx=True, ex=CANCEL_TTL_S)

    # -- evaluations (trainer/held_out.py) ---------------------------------------------------------------

    async def issue_eval(self, version: int, retry: str | None = None) -> None:
        """Evaluate `version` on the held-out split, once (a GRPO step without signal keeps the version; the end
        of a run asks for the last version again), or again under the work id `retry` after a lost one."""
        if retry or self.evaluations.wanted(self, version):
            if not retry:
                self._last_eval_at = time.time()
            order = eval_order(version, self.held_out, retry)
            self.eval_ids = order.theorem_ids
            await self._write_ahead([order], self.evals)

    # -- the loop ----------------------------------------------------------------------------------------

    def _time_up(self) -> bool:
        """The run's wall-clock budget (`max_minutes`, counted from the trainer's start) is spent."""
        budget = self.settings.max_minutes
        return bool(budget) and time.time() - self.started_at >= 60 * budget

    def _eval_due(self) -> bool:
        """An evaluation of the version just made is due: every `eval_every` versions, or `eval_every_minutes`
        after the last one was issued."""
        s = self.settings
        if s.eval_every and self.version % s.eval_every == 0:
            return True
        return bool(s.eval_every_minutes) and time.time() - self._last_eval_at >= 60 * s.eval_every_minutes

    async def run(self, stop: asyncio.Event) -> dict[str, Any]:
        await self.resume()
        await self.redis.delete(self.keys.trainer_alert)  # a stalled trainer's, killed before progress resumed
        if self.settings.evaluates and self.version == 0:
            await self.issue_eval(0)
        self.progress(self.version)
        while not stop.is_set() and self.version < self.settings.iterations and not self.time_up:
            await self.top_up()
            await self.poll(block_ms=500)
            self.evaluations.collect(self)
            await self._expire()
            await self.watch.watch(self.redis, self.keys, self.version)
            ready = self._ready()
            if ready is not None:
                await self.update(ready)
                self.watch.saw_progress()
                await self.trim_history()
                if self.settings.evaluates and self._eval_due():
                    await self.issue_eval(self.version)
                self.progress(self.version)
                # the budget is looked at once a version is made: the version under way when it ran out is finished
                if self._time_up():
                    self.time_up = True
                    log.info("time_budget_spent", version=self.version, max_minutes=self.settings.max_minutes)
            elif self.checkpointer.due(CHECKPOINT_EVERY_S):
                await self.checkpoint()
        if not stop.is_set() and self.settings.evaluates:
            await self.issue_eval(self.version)
            deadline = time.monotonic() + self.settings.deadline_s
            while self.evals and not stop.is_set() and time.monotonic() < deadline:
                await self.poll(block_ms=500)
                self.evaluations.collect(self)
                await self._expire()
        self.finished = not stop.is_set() and (self.version >= self.settings.iterations or self.time_up)
        await self.watch.clear(self.redis, self.keys)
        await self.checkpoint()
        await self.trim_history()
        summary = {"version": self.version, "counts": dict(self.counts), "evals": self.eval_results}
        return summary | ({"time_up": True} if self.time_up else {})
