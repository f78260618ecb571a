"""The one consumer-group runtime every role's consumer runs on.

Delivery is at least once, the effect exactly once (DESIGN.md, "The wire"):
- new entries come from XREADGROUP `>` in batches; each is decoded and handed to the handler, which returns
  the result messages; results are published and inputs acked by one Lua script per batch (`settle.py`);
- while `run` is handling a batch, a background task claims the batch's entries again to this consumer
  every `claim_refresh_ms` (`claims.py`: only those it still owns), so however long a handler takes, its
  entries stay fresh; an entry idle past `claim_idle_ms` therefore belongs to a consumer that is dead or
  stalled (SIGSTOP, swap, a long GC pause), and a live one takes it over (`reclaim.py`: XAUTOCLAIM, one
  entry at a time, with its delivery count from XPENDING); an entry over `max_deliveries` goes to the dead
  letters;
- a consumer that wakes from a stall settles what it finished (the settle script publishes nothing for an
  entry another consumer settled first, and the done marker lets one result through in any order), but
  never refreshes or releases an entry another consumer has reclaimed meanwhile;
- a `Poison` from the handler, or an entry that cannot be decoded, is dead-lettered at once (redelivery
  would fail the same way); any other handler exception is transient: the entry stays pending and is
  released for a retry after `retry_delay_ms`;
- on stop, the entry in hand is finished, settled, and the rest of the batch released to other consumers.

Redis connection errors are not the input's fault: `run` logs them, backs off and goes on; nothing is
acked that was not settled, so a restarted Redis costs time, never entries. (A Redis outage longer than
`claim_idle_ms` leaves every held entry overdue when it comes back: another consumer may then take one over
before its owner's next refresh, which costs a duplicate check, never a duplicate result.)
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

from streams.claims import Entry, Hold
from streams.codec import decoder
from streams.keys import Keys
from streams.letters import letter, too_often
from streams.reclaim import Reclaim
from streams.schema import DeadLetter, M, Message, SchemaError, fast_init
from streams.sentinel import MasterReplaced
from streams.settle import Settled, Settlement, Settler

log = structlog.get_logger("streams.runtime")


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
    """Reads `message_type`'s stream in group `group` as `name`, hands each entry to `handler`, writes the
    results to `output` (none: a consumer without results, the trainer's shape)."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        *,
        message_type: type[M],
        group: str,
        name: str,
        handler: Handler[M],
        output: type[Message] | None = None,
        settings: ConsumerSettings | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
        prefetch: Callable[[list[M]], Awaitable[None]] | None = None,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.message_type = message_type
        self._decode = decoder(message_type)
        self.source = keys.stream(message_type.stream)
        self.group = group
        self.name = name
        self.handler = handler
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
        s = self.settings
        self._settle = Settler(redis, s.settle_replicas, s.settle_wait_ms)
        self._unreplicated_logged = 0.0
        self._hold = Hold(redis, self.source, group, name, idle_ms=s.claim_idle_ms)
        self._reclaim = Reclaim(
            redis, self.source, group, name, idle_ms=s.claim_idle_ms, every_ms=s.claim_every_ms, page=10 * s.batch_size
        )

    async def ensure_group(self) -> None:
        await ensure_group(self.redis, self.source, self.group)

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set. Survives Redis restarts; only a bug escapes.

        Refreshes the claim on the batch in hand from a background task for as long as it runs, the
        drain after `stop` included (`run_once` alone does not: a test drives it to play a stalled owner)."""
        finished = asyncio.Event()
        keeper = asyncio.create_task(self._keep_claims(finished), name=f"{self.name}-claims")
        try:
            await self._run(stop, keeper)
        finally:
            finished.set()
            await keeper

    async def _run(self, stop: asyncio.Event, keeper: asyncio.Task) -> None:
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
                    if keeper.done():  # it only ends early on a bug: without it, claims would lapse
                        keeper.result()
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
            if finished.is_set():
                break
            try:
                self.stats.claims_lost += await self._hold.refresh()
            except _REDIS_UNAVAILABLE as e:  # the main loop has its own backoff; try again next period
                log.warning("claim_refresh_failed", consumer=self.name, error=str(e))

    async def run_once(self, stop: asyncio.Event | None = None) -> int:
        """One iteration: reclaim what is overdue, else read new entries; handle and settle them."""
        stop = stop or asyncio.Event()
        if self.gate is not None:
            await self.gate()  # returns early once `stop` is set: the gate's owner watches the same event
            if stop.is_set():
                return 0
        if self._reclaim.due():
            handled = await self._handle_overdue(stop)
            if handled:
                return handled
        reply = await self.redis.xreadgroup(
            self.group, self.name, {self.source: ">"}, count=self.settings.batch_size, block=self.settings.block_ms
        )
        if not reply:
            self._reclaim.soon()  # nothing new: look for overdue entries again on the next iteration
            return 0
        return await self._handle([(eid, fields, 1) for eid, fields in reply[0][1]], stop)

    async def _handle_overdue(self, stop: asyncio.Event) -> int:
        """Take over overdue entries one at a time (streams/reclaim.py), each settled before the next is claimed."""
        handled = 0
        async with contextlib.aclosing(self._reclaim.one_by_one(stop, self.settings.batch_size)) as overdue:
            async for entry in overdue:
                self.stats.reclaimed += 1
                handled += await self._handle([entry], stop)
        return handled

    async def _handle(self, entries: list[Entry], stop: asyncio.Event) -> int:
        """Handle and settle `entries`, the batch in hand, one by one; on stop, release the rest."""
        with self._hold.holding(entries):
            s = self._settlement()
            monotonic = time.monotonic
            flush_s = self.settings.flush_ms / 1000
            flush_at = monotonic() + flush_s
            failed: list[Entry] = []
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
                                raise TypeError(
                                    f"handler returned {type(r).__name__}; this consumer writes {output_type}"
                                )
                        s.results(entry_id, message.dedup_id, results)
                if monotonic() >= flush_at and len(s):
                    await self._flush(s)
                    s = self._settlement()
                    flush_at = monotonic() + flush_s
            await self._flush(s)
            if failed:
                await self._release(failed, after_ms=self.settings.retry_delay_ms, counted=True)
        return len(entries)

    def _admit(self, s: Settlement, entry: Entry) -> M | None:
        """The entry's message, or None once it is in `s` as a dead letter (too many deliveries, or bytes
        that cannot be decoded). Never raises for anything the input did."""
        entry_id, fields, deliveries = entry
        if deliveries > self.settings.max_deliveries:
            s.dead(entry_id, self._letter(entry, too_often(deliveries, self.settings.max_deliveries)))
            return None
        try:
            return self._decode(fields)
        except SchemaError as e:
            s.dead(entry_id, self._letter(entry, f"schema: {e}"))
            return None

    def _failed(self, entry: Entry, e: Exception, failed: list[Entry]) -> None:
        entry_id, _fields, deliveries = entry
        self.stats.transient_failures += 1
        error = f"{type(e).__name__}: {e}"
        log.warning(
            "handler_failed", consumer=self.name, entry_id=entry_id.decode(), deliveries=deliveries, error=error
        )
        failed.append(entry)

    def _letter(self, entry: Entry, reason: str) -> DeadLetter:
        entry_id, fields, deliveries = entry
        log.warning("dead_letter", consumer=self.name, stream=self.source, entry_id=entry_id.decode(), reason=reason)
        return letter(self.source, self.group, self.name, entry_id, fields, deliveries, reason)

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
            # the connections to the replaced master); the handler's work on it is redone, never counted twice.
            raise MasterReplaced(f"{self.name}: settled on a master the sentinels have replaced")
        return settled

    def _unreplicated(self, settled: Settled) -> None:
        """Counted every time, logged at most every 10 s: a replica that is away makes every batch short."""
        self.stats.settle_unreplicated += 1
        now = time.monotonic()
        if now - self._unreplicated_logged >= 10:
            self._unreplicated_logged = now
            log.warning(
                "settle_unreplicated",
                consumer=self.name,
                stream=self.source,
                published=settled.published,
                total=self.stats.settle_unreplicated,
                wait_ms=self.settings.settle_wait_ms,
            )

    async def _hand_back_mine(self) -> None:
        """After an outage: what is still pending under our name (a batch whose settle failed when Redis
        went away, or its release) is handed back at once, with the delivery the outage cost it given back
        (it is not the entry's fault), so it is taken again now, by us or another consumer, instead of
        after `claim_idle_ms`. Its marker, if the settle did land, makes a second handling a no-op."""
        mine = await self._hold.pending_here()
        if mine:
            await self._release(mine)
            self.stats.handed_back += len(mine)
            self._reclaim.soon()
            log.info("handed_back_after_outage", consumer=self.name, entries=len(mine))

    async def _release(self, entries: list[Entry], after_ms: int = 0, counted: bool = False) -> None:
        """Hand entries back without acking them (streams/claims.py `Hold.release`): claimable by any consumer
        in `after_ms`; a failed entry (`counted`) keeps the delivery it used, one never started gets it back."""
        self.stats.released += await self._hold.release(entries, after_ms=after_ms, counted=counted)


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
