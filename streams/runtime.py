"""The one consumer-group runtime every role's consumer runs on.

Delivery is at least once, the effect exactly once (DESIGN.md, "The wire"):
- new entries come from XREADGROUP `>` in batches; each is decoded and handed to the handler, which returns
  the result messages; results are published and inputs acked by one Lua script per batch (`settle.py`);
- while `run` is handling a batch, a background task claims the batch's entries again to this consumer
  every `claim_refresh_ms` (`claims.py`: only those it still owns), so however long a handler takes, its
  entries stay fresh; an entry idle past `claim_idle_ms` therefore belongs to a consumer that is dead or
  stalled (SIGSTOP, swap, a long GC pause), and a live one takes it over with XAUTOCLAIM; its delivery
  count is read from XPENDING first, an entry over the limit goes to the dead letters, and the rest are
  processed one at a time so a poison entry cannot drag batch neighbours with it;
- a consumer that wakes from a stall settles what it finished (the settle script publishes nothing for an
  entry another consumer settled first, and the done marker lets one result through in any order), but
  never refreshes or releases an entry another consumer has reclaimed meanwhile;
- a `Poison` from the handler, or an entry that cannot be decoded, is dead-lettered at once (redelivery
  would fail the same way); any other handler exception is transient: the entry stays pending and is
  released for a retry after `retry_delay_ms`;
- on stop, the entry in hand is finished, settled, and the rest of the batch released to other consumers;
- a role may give a batch handler instead (one call per batch, one outcome per entry; see `Consumer`).

Redis connection errors are not the input's fault: `run` logs them, backs off and goes on; nothing is
acked that was not settled, so a restarted Redis costs time, never entries. (A Redis outage longer than
`claim_idle_ms` leaves every held entry overdue when it comes back: another consumer may then take one over
before its owner's next refresh, which costs a duplicate check, never a duplicate result.)

One file, over 400 lines, because it is one loop: reading, claiming, settling and handing back an entry
share the consumer's state and its one guarantee (exactly-once effect); split, each part would need the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic

import structlog
from redis import exceptions as rx
from redis.asyncio import Redis

from streams.claims import Claims
from streams.codec import decoder
from streams.groups import id_order
from streams.keys import Keys
from streams.schema import DeadLetter, M, Message, SchemaError, fast_init
from streams.sentinel import MasterReplaced
from streams.settle import Settled, Settlement, Settler

log = structlog.get_logger("streams.runtime")

_MAX_CLAIM_SCANS = 200  # XAUTOCLAIM calls per reclaim pass: 2,000 pending entries examined at most


class Poison(Exception):
    """Raised by a handler when the input itself is bad and will fail the same way on every delivery."""

    kind = "poison"  # the dead letter's reason starts with it


class Infrastructure(Poison):
    """Raised by a handler on the last delivery it allows an entry whose handling failed every time for a reason
    outside the entry (a sandbox that cannot start, an engine that fails): dead-lettered at once as
    `infrastructure: <cause>`, so that the dead letter blames the infrastructure, not the input, and says why."""

    kind = "infrastructure"


class Skip(Poison):
    """Raised by a handler for an input that is fine but no longer wanted (a work order past its staleness
    bound): dead-lettered at once as `skipped: <why>`, so whoever waits for its results learns that none come."""

    kind = "skipped"


@fast_init  # one per entry on the hot path
@dataclass(frozen=True, slots=True)
class Delivery(Generic[M]):
    entry_id: bytes
    message: M
    deliveries: int  # 1 on first delivery; from Redis's own counter (XPENDING), never from memory


Handler = Callable[[Delivery[M]], Awaitable[Sequence[Message]]]
_REDIS_UNAVAILABLE = (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, rx.OutOfMemoryError, rx.ReadOnlyError)

# One call for a whole batch: one outcome per delivery, in order: its results, or the exception it failed
# with (a Poison: dead letter; any other Exception: transient). See Consumer.
BatchHandler = Callable[[list[Delivery[M]]], Awaitable[Sequence[Sequence[Message] | Exception]]]


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    batch_size: int = 64
    block_ms: int = 500
    # A pending entry idle this long is another consumer's to take. Live consumers refresh what they hold
    # every `claim_refresh_ms` (`Consumer.run`), so this bounds how long a dead or stalled consumer's work
    # waits, whatever a handler may take: a few refresh periods, not the longest legitimate handling.
    claim_idle_ms: int = 25_000
    claim_refresh_ms: int | None = None  # None: a fifth of claim_idle_ms (5 s with the default)
    claim_every_ms: int = 1_000  # how often to look for entries to reclaim when new ones keep coming
    max_deliveries: int = 5
    retry_delay_ms: int = 1_000  # a transiently failed entry becomes claimable again after this
    dedup_ttl_s: int = 7 * 24 * 3600  # idempotency markers outlive any redelivery of their input
    flush_ms: int = 50  # settle outcomes at least this often while a slow batch is in hand
    # WAIT after each settle (streams/settle.py, "Replicas"): None waits for one replica when the master has
    # one in sync, 0 never waits; `settle_wait_ms` bounds each wait.
    settle_replicas: int | None = None
    settle_wait_ms: int = 500

    def __post_init__(self) -> None:
        if self.claim_refresh_ms is None:  # a frozen dataclass sets its derived default this way
            object.__setattr__(self, "claim_refresh_ms", max(1, self.claim_idle_ms // 5))
        if self.retry_delay_ms > self.claim_idle_ms:
            raise ValueError("retry_delay_ms must not exceed claim_idle_ms")
        if not 0 < self.claim_refresh_ms * 3 <= self.claim_idle_ms:
            # Several refreshes must fit in the deadline: one late refresh (a busy loop, a slow Redis round
            # trip) must not hand a live consumer's entry to another.
            raise ValueError(
                f"claim_refresh_ms ({self.claim_refresh_ms}) must be positive and at most a third of "
                f"claim_idle_ms ({self.claim_idle_ms}); leave it unset for a fifth"
            )
        if self.batch_size < 1 or self.max_deliveries < 1:
            raise ValueError("batch_size and max_deliveries must be at least 1")
        if (self.settle_replicas or 0) < 0 or self.settle_wait_ms < 1:  # WAIT's timeout 0 would wait forever
            raise ValueError("settle_replicas must be at least 0 (or None) and settle_wait_ms at least 1")


@dataclass
class Stats:
    processed: int = 0
    published: int = 0
    duplicates: int = 0
    dead: int = 0
    transient_failures: int = 0
    reclaimed: int = 0
    released: int = 0
    claims_lost: int = 0  # entries in hand that another consumer reclaimed (this one stalled past the deadline)
    outages: int = 0  # times the loop found Redis unavailable and waited for it
    handed_back: int = 0  # entries still ours after an outage, handed back so they are taken again at once
    settle_unreplicated: int = 0  # settles whose WAIT got fewer replicas than asked: on the master only


class Consumer(Generic[M]):
    """Reads `message_type`'s stream in group `group` as `name`, writes results to `output`.

    The handler is either `handler`, called once per entry, or `batch_handler`, called once per batch
    with the deliveries of every entry that decoded (under the delivery limit) and returning one outcome
    per delivery, in order: the results, or the exception that entry failed with (a `Poison` goes to the
    dead letters, any other Exception is transient). An exception the batch handler raises is the outcome
    of every delivery in the call, except that a `Poison` raised for several is taken as transient: which
    one is bad is unknown, and redelivered entries come back one at a time, where it is found. Redelivered
    (reclaimed) entries always come one at a time, to either kind. A batch call is one unit for `stop`
    (checked before it) and for settling (once after it; `flush_ms` does not apply).

    No role uses `batch_handler` today: the verifier, which judges Countdown answers in batches, keeps the
    per-entry handler and batches inside it (its `prefetch` hook and `check_many`) so that each attempt keeps
    its own outcome and timing. It stays for consumers whose work only makes sense as one call (a batched
    model call per read), and `ops bench wire --handler batch` measures what the per-entry calls cost against
    it; its rules are tested in tests/streams/test_runtime.py.
    """

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        *,
        message_type: type[M],
        group: str,
        name: str,
        handler: Handler[M] | None = None,
        output: type[Message] | None = None,
        settings: ConsumerSettings | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
        batch_handler: BatchHandler[M] | None = None,
        prefetch: Callable[[list[M]], Awaitable[None]] | None = None,
    ) -> None:
        if (handler is None) == (batch_handler is None):
            raise ValueError("give a consumer exactly one of handler and batch_handler")
        self.redis = redis
        self.keys = keys
        self.message_type = message_type
        self._decode = decoder(message_type)
        self.source = keys.stream(message_type.stream)
        self.group = group
        self.name = name
        self.handler = handler
        self.batch_handler = batch_handler
        # Called with a batch's messages before `handler` takes them one by one: what the handler would ask
        # Redis per entry (the verifier's verdict cache) it can look up for the whole batch in one round trip.
        self.prefetch = prefetch
        self.output_type = output
        # A consumer with no results still needs a key for the script; nothing is ever written to it.
        self.output = keys.stream(output.stream) if output else self.source
        self.settings = settings or ConsumerSettings()
        # Awaited before taking anything: a role whose output stream is full (the generator, under its
        # attempts' backpressure) holds back here instead of holding entries it cannot yet publish for.
        self.gate = gate
        self.stats = Stats()
        self._settle = Settler(redis, self.settings.settle_replicas, self.settings.settle_wait_ms)
        self._unreplicated_logged = 0.0
        self._claims = Claims(redis, self.source, group, name)
        self._held: list = []  # the batch in hand, (entry id, fields, deliveries) each: what `run` refreshes
        self._gone: set[bytes] = set()  # of the batch in hand, those no longer ours: settled, released, taken
        # A refresh and a release of the same entry must not cross: a refresh landing after the release would
        # reset the idle time the release backdated, and the entry would wait a whole deadline for nothing.
        self._claims_lock = asyncio.Lock()
        self._claim_cursor = b"0-0"
        self._next_claim = 0.0

    async def ensure_group(self) -> None:
        await ensure_group(self.redis, self.source, self.group)

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set. Survives Redis restarts; only a bug escapes.

        Refreshes the claim on the batch in hand from a background task for as long as it runs, the
        drain after `stop` included (`run_once` alone does not: a test drives it to play a stalled owner)."""
        finished = asyncio.Event()
        refresher = asyncio.create_task(self._keep_claims(finished), name=f"{self.name}-claims")
        try:
            await self._run(stop, refresher)
        finally:
            finished.set()
            await refresher

    async def _run(self, stop: asyncio.Event, refresher: asyncio.Task) -> None:
        backoff_s, recovering = 0.05, False
        while not stop.is_set():
            try:
                await self.ensure_group()
                if recovering:
                    await self._hand_back_mine()
                    recovering = False
                while not stop.is_set():
                    await self.run_once(stop)
                    backoff_s = 0.05
                    if refresher.done():  # it only ends early on a bug: without it, claims would lapse
                        refresher.result()
            except _REDIS_UNAVAILABLE as e:
                # Redis is down, loading its AOF, full (maxmemory with noeviction refuses writes until the
                # trimming of acked history or an operator frees memory) or a replica after a failover.
                # Whatever we held stays pending and is settled later.
                log.warning("redis_unavailable", consumer=self.name, error=str(e), retry_s=backoff_s)
                self.stats.outages += 1
                recovering = True
                await sleep_or_stop(stop, backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)

    async def _keep_claims(self, finished: asyncio.Event) -> None:
        """Every `claim_refresh_ms`, claim the batch in hand again, so no live consumer's entry goes idle."""
        period_s = self.settings.claim_refresh_ms / 1000
        while not finished.is_set():
            await sleep_or_stop(finished, period_s)
            async with self._claims_lock:
                batch, gone = self._held, self._gone
                held = [entry[0] for entry in batch if entry[0] not in gone]
                if not held or finished.is_set():
                    continue
                try:
                    kept = await self._claims.refresh(held)
                except _REDIS_UNAVAILABLE as e:  # the main loop has its own backoff; try again next period
                    log.warning("claim_refresh_failed", consumer=self.name, error=str(e))
                    continue
            if len(kept) == len(held) or self._held is not batch:
                continue
            # Not ours any more: settled by us (a mid-batch flush), or reclaimed by another consumer while this
            # one was stalled past the deadline. Neither is refreshed again; only the second is worth a line.
            dropped = set(held) - set(kept)
            gone.update(dropped)
            taken = await self._reclaimed_by_others(dropped)
            if taken:
                self.stats.claims_lost += len(taken)
                log.warning("claims_lost", consumer=self.name, stream=self.source, count=len(taken),
                            entry_ids=[e.decode() for e in taken[:10]])  # fmt: skip

    async def _reclaimed_by_others(self, ids: set[bytes]) -> list[bytes]:
        """Which of `ids` are still pending in the group, hence owned by another consumer."""
        out = []
        for eid in sorted(ids, key=id_order):
            if await self.redis.xpending_range(self.source, self.group, min=eid, max=eid, count=1):
                out.append(eid)
        return out

    async def run_once(self, stop: asyncio.Event | None = None) -> int:
        """One iteration: reclaim what is overdue, else read new entries; handle and settle them."""
        stop = stop or asyncio.Event()
        if self.gate is not None:
            await self.gate()  # returns early once `stop` is set: the gate's owner watches the same event
            if stop.is_set():
                return 0
        now = time.monotonic()
        if now >= self._next_claim:
            self._next_claim = now + self.settings.claim_every_ms / 1000
            handled = await self._reclaim_one_by_one(stop)
            if handled:
                return handled
        entries = await self._read_new()
        if not entries:
            # Nothing new: look for overdue entries again on the next iteration.
            self._next_claim = 0.0
            return 0
        return await self._handle_batch([(eid, f, 1) for eid, f in entries], stop)

    # -- reading -------------------------------------------------------------------------------------

    async def _read_new(self) -> list[tuple[bytes, dict[bytes, bytes]]]:
        reply = await self.redis.xreadgroup(
            self.group, self.name, {self.source: ">"}, count=self.settings.batch_size, block=self.settings.block_ms
        )
        return reply[0][1] if reply else []

    async def _reclaim(self, count: int) -> list[tuple[bytes, dict[bytes, bytes], int]]:
        """Take over entries idle past the deadline; return them with their delivery counts."""
        reply = await self.redis.xautoclaim(
            self.source,
            self.group,
            self.name,
            min_idle_time=self.settings.claim_idle_ms,
            start_id=self._claim_cursor,
            count=count,
        )
        self._claim_cursor = reply[0]
        entries = [(eid, fields) for eid, fields in reply[1] if fields is not None]
        if len(entries) < len(reply[1]):
            await self._ack_vanished({eid for eid, _ in entries})
        if not entries:
            return []
        counts = await self._delivery_counts([eid for eid, _ in entries])
        self.stats.reclaimed += len(entries)
        log.info("reclaimed", consumer=self.name, stream=self.source, count=len(entries))
        return [(eid, fields, counts.get(eid, 1)) for eid, fields in entries]

    async def _ack_vanished(self, present: set[bytes]) -> None:
        """Redis 6.2 returns claimed entries that were deleted meanwhile as bare nils, ids lost, and keeps
        them pending forever (7.x drops them from the PEL itself). Find ours that no longer exist; ack them."""
        rows = await self.redis.xpending_range(
            self.source, self.group, min="-", max="+", count=10 * self.settings.batch_size, consumername=self.name
        )
        for row in rows:
            eid = row["message_id"]
            if eid not in present and not await self.redis.xrange(self.source, eid, eid):
                await self.redis.xack(self.source, self.group, eid)

    async def _delivery_counts(self, ids: list[bytes]) -> dict[bytes, int]:
        rows = await self.redis.xpending_range(
            self.source, self.group, min=min(ids, key=id_order), max=max(ids, key=id_order),
            count=len(ids) + 1000, consumername=self.name,
        )  # fmt: skip
        wanted = set(ids)
        return {r["message_id"]: r["times_delivered"] for r in rows if r["message_id"] in wanted}

    # -- handling ------------------------------------------------------------------------------------

    async def _reclaim_one_by_one(self, stop: asyncio.Event) -> int:
        """Take over overdue entries one at a time, each settled before the next is claimed.

        Claiming a batch would bump every entry's delivery count at once: if the first one kills the
        consumer, its neighbours would inherit the deliveries and follow it to the dead letters.
        """
        handled = scans = 0
        # XAUTOCLAIM with COUNT 1 examines at most 10 pending entries per call: keep scanning (bounded) until
        # the cursor wraps, so an overdue entry deep in a long pending list is found in one iteration.
        while handled < self.settings.batch_size and scans < _MAX_CLAIM_SCANS and not stop.is_set():
            scans += 1
            claimed = await self._reclaim(count=1)
            if claimed:
                handled += await self._handle_batch(claimed, stop)
            elif self._claim_cursor == b"0-0":
                break
        return handled

    async def _handle_batch(self, entries: list, stop: asyncio.Event) -> int:
        """Handle and settle `entries`, each (entry id, fields, deliveries); on stop, release the rest."""
        self._held = entries
        if self._gone:
            self._gone = set()
        try:
            if self.batch_handler is not None:
                return await self._handle_batch_at_once(entries, stop)
            return await self._handle_one_by_one(entries, stop)
        finally:
            self._held = []

    async def _handle_one_by_one(self, entries: list, stop: asyncio.Event) -> int:
        s = self._settlement()
        monotonic = time.monotonic
        flush_s = self.settings.flush_ms / 1000
        flush_at = monotonic() + flush_s
        failed: list = []
        handler, output_type, stats = self.handler, self.output_type, self.stats
        messages = None
        if self.prefetch is not None:  # admitted up front (a bad entry is a dead letter in `s` now)
            messages = [self._admit(s, entry) for entry in entries]
            await self.prefetch([m for m in messages if m is not None])
        for i, entry in enumerate(entries):
            if stop.is_set():
                admitted = messages[i:] if messages is not None else [True] * (len(entries) - i)
                await self._release([e for e, m in zip(entries[i:], admitted, strict=True) if m is not None])
                break
            stats.processed += 1
            entry_id, _fields, deliveries = entry
            message = self._admit(s, entry) if messages is None else messages[i]
            if message is not None:
                try:
                    results = await handler(Delivery(entry_id, message, deliveries))
                except Poison as e:
                    s.dead(entry_id, self._letter(entry, f"{e.kind}: {e}"))
                except Exception as e:  # noqa: BLE001 - transient by classification: left pending, retried, counted
                    self._failed(entry, e, failed)
                else:
                    for r in results:  # a handler bug, not the input's fault: let it escape
                        if type(r) is not output_type:
                            self._wrong_type(r)
                    s.results(entry_id, message.dedup_id, results)
            if monotonic() >= flush_at and len(s):
                await self._flush(s)
                s = self._settlement()
                flush_at = monotonic() + flush_s
        await self._flush(s)
        if failed:
            await self._release(failed, after_ms=self.settings.retry_delay_ms, counted=True)
        return len(entries)

    async def _handle_batch_at_once(self, entries: list, stop: asyncio.Event) -> int:
        """`_handle_batch` for a batch handler: one call for every entry that decoded, then one settle."""
        if stop.is_set():
            await self._release(entries)
            return len(entries)
        s = self._settlement()
        taken, deliveries = [], []
        for entry in entries:
            message = self._admit(s, entry)
            if message is not None:
                taken.append(entry)
                deliveries.append(Delivery(entry[0], message, entry[2]))
        self.stats.processed += len(entries)
        failed: list = []
        if deliveries:
            try:
                outcomes = await self.batch_handler(deliveries)
            except Exception as e:  # noqa: BLE001 - the call failed as a whole: see Consumer's docstring
                if len(taken) > 1 and isinstance(e, Poison):
                    e = RuntimeError(f"Poison raised for a batch of {len(taken)}: {e}")  # whose? retried alone
                outcomes = [e] * len(taken)
            if len(outcomes) != len(taken):  # a handler bug: let it escape, nothing is acked
                raise TypeError(f"batch handler returned {len(outcomes)} outcomes for {len(taken)} deliveries")
            output_type = self.output_type
            for entry, d, outcome in zip(taken, deliveries, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    if isinstance(outcome, Poison):
                        s.dead(d.entry_id, self._letter(entry, f"{outcome.kind}: {outcome}"))
                    else:
                        self._failed(entry, outcome, failed)
                    continue
                for r in outcome:
                    if type(r) is not output_type:
                        self._wrong_type(r)
                s.results(d.entry_id, d.message.dedup_id, outcome)
        await self._flush(s)
        if failed:
            await self._release(failed, after_ms=self.settings.retry_delay_ms, counted=True)
        return len(entries)

    def _admit(self, s: Settlement, entry: tuple) -> M | None:
        """The entry's message, or None once it is in `s` as a dead letter (too many deliveries, or bytes
        that cannot be decoded). Never raises for anything the input did."""
        entry_id, fields, deliveries = entry
        if deliveries > self.settings.max_deliveries:
            reason = f"delivered {deliveries} times (max {self.settings.max_deliveries})"
            s.dead(entry_id, self._letter(entry, reason))
            return None
        try:
            return self._decode(fields)
        except SchemaError as e:
            s.dead(entry_id, self._letter(entry, f"schema: {e}"))
            return None

    def _failed(self, entry: tuple, e: Exception, failed: list) -> None:
        entry_id, _fields, deliveries = entry
        self.stats.transient_failures += 1
        log.warning(
            "handler_failed", consumer=self.name, entry_id=entry_id.decode(), deliveries=deliveries,
            error=f"{type(e).__name__}: {e}",
        )  # fmt: skip
        failed.append(entry)

    def _wrong_type(self, r: object) -> None:
        raise TypeError(f"handler returned {type(r).__name__}; this consumer writes {self.output_type}")

    def _letter(self, entry: tuple, reason: str) -> DeadLetter:
        entry_id, fields, deliveries = entry
        log.warning("dead_letter", consumer=self.name, stream=self.source, entry_id=entry_id.decode(), reason=reason)
        return DeadLetter(
            source=self.source, group=self.group, original_id=entry_id.decode(), deliveries=deliveries,
            reason=reason, consumer=self.name, failed_ms=int(time.time() * 1000), original=dict(fields),
        )  # fmt: skip

    def _settlement(self) -> Settlement:
        return Settlement(self.keys, self.source, self.output, self.group, self.settings.dedup_ttl_s)

    async def _flush(self, s: Settlement) -> Settled:
        settled = await self._settle(s)
        self.stats.published += settled.published
        self.stats.duplicates += settled.duplicates
        self.stats.dead += settled.dead
        if settled.unreplicated:
            self._unreplicated(settled)
        if await self._settle.replication.deposed():
            # The split brain (streams.sentinel `deposed`): this settle, and those since the master lost its
            # replica, went to a master the sentinels have replaced and will be thrown away with its data. As
            # after any outage, what we hold is taken again from the new master (at once: `deposed` dropped
            # the old connections); the handler's work on it is redone, never counted twice.
            raise MasterReplaced(f"{self.name}: settled on a master the sentinels have replaced")
        return settled

    def _unreplicated(self, settled: Settled) -> None:
        """Counted every time, logged at most every 10 s: a replica that is away makes every batch short."""
        self.stats.settle_unreplicated += 1
        now = time.monotonic()
        if now - self._unreplicated_logged >= 10:
            self._unreplicated_logged = now
            log.warning("settle_unreplicated", consumer=self.name, stream=self.source, published=settled.published,
                        total=self.stats.settle_unreplicated, wait_ms=self.settings.settle_wait_ms)  # fmt: skip

    async def _hand_back_mine(self) -> None:
        """After an outage: what is still pending under our name (a batch whose settle failed when Redis
        went away, or its release) is handed back at once, with the delivery the outage cost it given back
        (it is not the entry's fault), so it is taken again now, by us or another consumer, instead of
        after `claim_idle_ms`. Its marker, if the settle did land, makes a second handling a no-op."""
        rows = await self.redis.xpending_range(self.source, self.group, min="-", max="+", count=10_000,
                                               consumername=self.name)  # fmt: skip
        if rows:
            await self._release([(row["message_id"], None, row["times_delivered"]) for row in rows])
            self.stats.handed_back += len(rows)
            self._next_claim = 0.0
            log.info("handed_back_after_outage", consumer=self.name, entries=len(rows))

    async def _release(self, entries: list, after_ms: int = 0, counted: bool = False) -> None:
        """Hand entries back without acking them: make them claimable by any consumer in `after_ms`.

        XCLAIM to ourselves with IDLE backdated, only for entries still ours (`claims.py`: after a stall,
        another consumer may hold them now). An entry we never started (`counted=False`) gets its delivery
        count restored with RETRYCOUNT, so a graceful shutdown costs it no delivery; a failed one keeps the
        delivery it used. There is no "nack" in Redis Streams; this is its honest equivalent.
        """
        back = 0 if counted else 1
        async with self._claims_lock:
            self._gone.update(entry_id for entry_id, _fields, _deliveries in entries)
            released = await self._claims.release(
                [(entry_id, deliveries - back) for entry_id, _fields, deliveries in entries],
                idle_ms=self.settings.claim_idle_ms - after_ms,
            )  # fmt: skip
        self.stats.released += released


async def ensure_group(redis: Redis, stream: str, group: str) -> None:
    """Create `group` on `stream` (and the stream) reading from the start; an existing group is fine."""
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except rx.ResponseError as e:
        if "BUSYGROUP" not in str(e):  # BUSYGROUP: the group exists already, which is what we want
            raise


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `stop` is set meanwhile (a backoff that a shutdown cuts short)."""
    with contextlib.suppress(TimeoutError):  # the timeout is the normal way out: the backoff elapsed
        await asyncio.wait_for(stop.wait(), timeout=seconds)
