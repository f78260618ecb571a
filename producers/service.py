"""The generator service: work orders in, proof attempts out, through the one consumer runtime.

One `Consumer` reads `{ps:R}:work` in group `generators`, one order at a time. For each order the handler

1. skips it, counted, when the trainer cancelled it (its done marker is set) or the newest policy is past
   its staleness bound (nobody will use it: dead-lettered as `skipped: stale ...`, so the trainer knows);
2. waits (bounded) for the policy version the order names, then puts that policy in the engine: the ES
   member around its center, or the GRPO weights (digest checked);
3. builds the prompts from the canonical theorem records, generates `samples_per_theorem` samples per
   theorem in one engine call, extracts each attempt, and returns the attempts.

An ES order may carry several members (`members`, trainer/es.py): low-rank ones are generated together in
one engine call (`es_members`: the center in the weights, each member's rows with its own low-rank term),
full-rank ones in turn (each written in); a member the trainer has cut since is left out. Their attempts
carry each member's own work id.

The runtime publishes the attempts and acks the order in one script guarded by the order's marker, so a
killed generator's order, reclaimed by another, publishes its attempts once: attempt ids are
`<work_id>:<theorem index>:<sample>`, and the sampling seed derives from the work id. Before taking an order
the service waits while the verifiers owe more than `max_outstanding` attempts (the wire's backpressure).
Generation runs in a thread, so the event loop keeps reading the policy stream and reporting.

An engine failure is the infrastructure's, not the order's: the order is handed back and retried, and on its
last allowed delivery dead-lettered as `infrastructure: generator <name>: <error>`. A generator whose engine
fails `GIVE_UP_AFTER` different orders in a row with the same error (a device mix-up, a broken install:
every later order would fail the same way) stops with that error instead of dead-lettering the whole run;
the local pipeline stops with it (trainer/local.py), a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import time

import structlog
from redis.asyncio import Redis

from producers.config import GeneratorSettings
from producers.engine import Engine, Sample, Sampling, in_engine_thread, members_written
from producers.policy import PolicyFollower, PolicyMismatch
from streams import role_stats
from streams.codec import pack_float32, pack_int32
from streams.keys import GENERATORS, VERIFIERS, Keys
from streams.publisher import Publisher
from streams.role_stats import GeneratorStats
from streams.runtime import Consumer, ConsumerSettings, Delivery, Infrastructure, Poison, Skip
from streams.schema import Attempt, Member, WorkOrder
from streams.theorems import Theorem
from tasks import prompts
from weights.es import device_type

log = structlog.get_logger("producers.service")


# Errors after which an engine serves nothing again (vLLM's engine core process is gone: killed, stalled
# past its timeouts, out of memory); by name, so that importing vLLM stays optional.
ENGINE_DEAD = {"EngineDeadError"}
GIVE_UP_AFTER = 3  # different orders failed in a row by the engine with the same error: stop serving


class WrongNoiseDevice(RuntimeError):
    """This generator draws ES noise on another device type than the run's: it must not serve the run."""


class PolicyNotYetAnnounced(RuntimeError):
    """Transient: the order names a version this generator has not seen yet; it is retried later."""


def sampling_seed(work_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(work_id.encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF


class GeneratorService:
    def __init__(self, settings: GeneratorSettings, redis: Redis, engine: Engine) -> None:
        self.settings = settings
        self.redis = redis
        self.engine = engine
        self.keys = Keys(settings.run)
        self.name = settings.consumer_name
        self.policy = PolicyFollower(redis, self.keys, engine)
        self.publisher = Publisher(redis, self.keys, group=VERIFIERS, max_outstanding=settings.max_outstanding)
        self.consumer: Consumer[WorkOrder] = Consumer(
            redis,
            self.keys,
            message_type=WorkOrder,
            group=GENERATORS,
            name=self.name,
            handler=self.handle,
            output=Attempt,
            settings=ConsumerSettings(
                batch_size=1,  # an order is seconds of work: reading more would hoard what others could do
                block_ms=1000,
                claim_idle_ms=settings.claim_idle_ms,
                max_deliveries=settings.max_deliveries,
                settle_replicas=settings.settle_replicas,
                settle_wait_ms=settings.settle_wait_ms,
            ),
            gate=self._room,
        )
        counted = ("orders", "attempts", "stale_skipped", "settled_skipped", "policy_errors", "engine_errors")
        self.counts = dict.fromkeys((*counted, "members", "members_cut_skipped"), 0)
        self.started = time.monotonic()
        self.busy_s = 0.0
        self.holding = False  # waiting for the verifiers to catch up
        self.stop = asyncio.Event()
        self.fatal = ""  # why this generator stopped itself (the process exits 1 with it)
        self.noise_checked = False
        self._failing: dict[str, str] = {}  # work id -> the engine's error, for the orders failed since a success

    def _give_up(self, reason: str) -> None:
        """Stop serving for good: the order in hand goes back to the group, the process exits 1 with `reason`."""
        self.fatal = reason
        log.error("generator_gives_up", reason=reason)
        self.stop.set()

    async def _check_noise_device(self) -> None:
        """ES noise is a pure function of (seed, tensor, device type): torch's CUDA and CPU generators draw
        different numbers from one seed, so a CUDA generator and a CPU generator would score members of two
        different centers. The first generator to serve an ES order names the run's device type
        (`{ps:R}:es_noise`); one on another type stops, leaving the order for the others."""
        if self.noise_checked:
            return
        mine = device_type(self.engine.device)
        await self.redis.set(self.keys.es_noise, mine, nx=True)
        theirs = (await self.redis.get(self.keys.es_noise) or b"").decode()
        if theirs != mine:
            self._give_up(
                f"run {self.settings.run} draws its ES noise on {theirs} (its first generator's device); "
                f"this generator is on {mine}, where the same seeds give other noise: start it with "
                f"--device {theirs}, or serve this run only from {mine} generators in a new run"
            )
            raise WrongNoiseDevice(self.fatal)  # transient: the order stays pending for another generator
        self.noise_checked = True

    async def _room(self) -> None:
        """The consumer's gate: take no order while the verifiers owe `max_outstanding` attempts or more."""
        if await self.publisher.outstanding(self.keys.attempts) < self.settings.max_outstanding:
            return
        self.holding = True
        started = time.monotonic()
        try:
            while not self.stop.is_set():
                if await self.publisher.outstanding(self.keys.attempts) < self.settings.max_outstanding:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.publisher.poll_ms / 1000)
        finally:
            self.holding = False
            self.publisher.held_s += time.monotonic() - started

    # -- one work order --------------------------------------------------------------------------------

    async def handle(self, delivery: Delivery[WorkOrder]) -> list[Attempt]:
        order = delivery.message
        if await self.redis.exists(self.keys.done(order.dedup_id)):
            # settled already (a restarted trainer published it again, or its settle landed before an outage
            # hid the reply: its attempts exist), or cancelled by the trainer (it cut the order's member or
            # group): the runtime acks it without publishing anything
            self.counts["settled_skipped"] += 1
            log.info("settled_order_skipped", work_id=order.work_id)
            return []
        if order.members:
            markers = [self.keys.done(WorkOrder.dedup_for(m["work_id"])) for m in order.members]
            cancelled = await self.redis.mget(markers)  # the trainer cut these members since
            live = [m for m, c in zip(order.members, cancelled, strict=True) if c is None]
            if not live:
                self.counts["settled_skipped"] += 1
                log.info("settled_order_skipped", work_id=order.work_id, members=len(order.members))
                return []
            self.counts["members_cut_skipped"] += len(order.members) - len(live)
            order = dataclasses.replace(order, members=live)
        await self.policy.poll()
        if order.max_staleness is not None and self.policy.latest - order.policy_version > order.max_staleness:
            self.counts["stale_skipped"] += 1
            raise Skip(
                f"stale: policy version {order.policy_version}, newest {self.policy.latest}, "
                f"bound {order.max_staleness}"
            )
        if self.policy.latest < order.policy_version and not await self.policy.wait_for(
            order.policy_version, self.settings.policy_wait_s
        ):
            raise PolicyNotYetAnnounced(f"policy version {order.policy_version} not announced yet")
        if order.algo == "es":
            await self._check_noise_device()
        theorems = await self._theorems(order)
        try:
            sampling = Sampling.from_order(
                order.sampling, order.samples_per_theorem, sampling_seed(order.work_id), order.algo == "grpo"
            )
        except ValueError as e:
            raise Poison(f"work order {order.work_id}: {e}") from e
        started = time.monotonic()
        try:
            attempts = await in_engine_thread(self._generate, order, theorems, sampling)
        except PolicyMismatch as e:
            self.counts["policy_errors"] += 1
            raise Poison(str(e)) from e
        except LookupError:  # ES steps of the order's version not received yet: the follower catches up
            raise
        except Exception as e:
            raise self._engine_failed(delivery, e) from e
        self._failing.clear()
        self.busy_s += time.monotonic() - started
        self.counts["orders"] += 1
        self.counts["attempts"] += len(attempts)
        return attempts

    def _engine_failed(self, delivery: Delivery[WorkOrder], e: Exception) -> Exception:
        """What to raise for an order the engine failed: the error itself (transient: the order is handed back
        for another, or this, generator), or on its last allowed delivery an `Infrastructure` dead letter. A
        dead engine, or the same error on `GIVE_UP_AFTER` different orders in a row, also stops this generator:
        every later order would fail the same way."""
        error = f"{type(e).__name__}: {e}"
        self.counts["engine_errors"] += 1
        log.error("engine_failed", work_id=delivery.message.work_id, deliveries=delivery.deliveries, error=error[:2000])
        self._failing[delivery.message.work_id] = error
        if type(e).__name__ in ENGINE_DEAD:
            self._give_up(f"the {self.engine.name} engine died ({error}); restart the generator")
        elif len(self._failing) >= GIVE_UP_AFTER and len(set(self._failing.values())) == 1:
            self._give_up(
                f"the {self.engine.name} engine failed {len(self._failing)} orders in a row with the same "
                f"error: {error[:1000]}"
            )
        if delivery.deliveries >= self.settings.max_deliveries:
            return Infrastructure(f"generator {self.name}: {error[:1000]}")
        return e

    async def _theorems(self, order: WorkOrder) -> list[Theorem]:
        if not order.theorem_ids:
            raise Poison(f"work order {order.work_id} names no theorems")
        raw = await self.redis.hmget(self.keys.theorems, order.theorem_ids)
        missing = [t for t, r in zip(order.theorem_ids, raw, strict=True) if r is None]
        if missing:
            raise Poison(f"unknown theorem ids {missing[:5]} (not in {self.keys.theorems})")
        return [Theorem.decode(r) for r in raw]

    def _generate(self, order: WorkOrder, theorems: list[Theorem], sampling: Sampling) -> list[Attempt]:
        """Runs in the generation thread: policy in place, one engine call (a bundle of full-rank members: one
        a member), attempts out."""
        tokenizer = self.engine.tokenizer
        prompt_ids = [prompts.tokenize(tokenizer, prompts.messages(t, self.settings.prompt_format)) for t in theorems]
        started = time.monotonic()
        if order.members:
            members = [(str(m["work_id"]), Member(int(m["seed"]), int(m["sign"]))) for m in order.members]
            outputs = self._members(order, [m for _, m in members], prompt_ids, sampling)
        else:
            if order.algo == "es":
                m = order.member
                self.engine.es_use(
                    order.policy_version, m.seed if m else None, m.sign if m else 1, order.sigma, order.rank
                )
            else:
                self.policy.load_grpo(order.policy_version, self.engine.model_path)
            members, outputs = [(order.work_id, order.member)], [self.engine.generate(prompt_ids, sampling)]
        gen_ms = (time.monotonic() - started) * 1000 / max(1, len(members) * len(theorems) * sampling.n)
        self.counts["members"] += len(members) if order.algo == "es" and order.sigma else 0
        return [
            attempt
            for (work_id, member), rows in zip(members, outputs, strict=True)
            for attempt in self._attempts(order, work_id, member, theorems, prompt_ids, rows, gen_ms)
        ]

    def _members(
        self, order: WorkOrder, members: list[Member], prompt_ids: list[list[int]], sampling: Sampling
    ) -> list[list[list[Sample]]]:
        """[member][prompt][sample] of an ES bundle: low-rank members in one engine call, full-rank ones in turn."""
        pairs = [(m.seed, m.sign) for m in members]
        batched = self.engine.es_members if order.rank else functools.partial(members_written, self.engine)
        return batched(order.policy_version, pairs, order.sigma, order.rank, prompt_ids, sampling)

    def _attempts(
        self,
        order: WorkOrder,
        work_id: str,
        member: Member | None,
        theorems: list[Theorem],
        prompt_ids: list[list[int]],
        outputs: list[list[Sample]],
        gen_ms: float,
    ) -> list[Attempt]:
        """The attempts of one member's (or a GRPO group's, an evaluation's) samples, ids from its work id."""
        attempts = []
        for i, (theorem, samples, ids) in enumerate(zip(theorems, outputs, prompt_ids, strict=True)):
            for k, sample in enumerate(samples):
                grpo = order.algo == "grpo"
                proof = prompts.extract(theorem.task, sample.text, self.settings.prompt_format)
                attempts.append(
                    Attempt(
                        attempt_id=f"{work_id}:{i}:{k}",
                        work_id=work_id,
                        theorem_id=theorem.theorem_id,
                        policy_version=order.policy_version,
                        sample_index=k,
                        proof=proof,
                        task=theorem.task,
                        member=member,
                        num_tokens=len(sample.token_ids),
                        gen_ms=round(gen_ms, 1),
                        token_ids=pack_int32(sample.token_ids) if grpo else b"",
                        logprobs=pack_float32(sample.logprobs or []) if grpo else b"",
                        prompt_ids=pack_int32(ids) if grpo else b"",
                        text="" if sample.text == proof else sample.text,
                    )
                )
        return attempts

    # -- running ---------------------------------------------------------------------------------------

    def figures(self) -> GeneratorStats:
        """This generator's figures as `{ps:R}:generator_stats` holds them (streams/role_stats.py)."""
        uptime = time.monotonic() - self.started
        return {
            "name": self.name,
            "engine": self.engine.name,
            "policy_latest": self.policy.latest,
            "policy_rewinds": self.policy.rewinds,  # a failover rewrote the history under it (producers/policy.py)
            "fatal": self.fatal,  # why it stopped serving (the trainer's progress watch names it)
            **self.counts,
            **{f"wire_{k}": v for k, v in vars(self.consumer.stats).items()},
            "held_for_room_s": round(self.publisher.held_s, 2),
            "busy_share": round(self.busy_s / uptime, 3) if uptime else 0.0,
            "engine_stats": self.engine.stats.as_dict(),
            "reported_ms": int(time.time() * 1000),
        }

    async def report(self) -> None:
        await role_stats.publish_generator(self.redis, self.keys, self.name, self.figures())

    async def run(self, stop: asyncio.Event) -> None:
        self.stop = stop
        log.info("generator_started", name=self.name, engine=self.engine.name, model=str(self.engine.model_path))
        await self.consumer.ensure_group()
        reporter = asyncio.create_task(self._report_loop(stop))
        try:
            await self.consumer.run(stop)
        finally:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
            try:
                await self.report()
            except Exception as e:  # Redis gone at shutdown: the figures are only figures
                log.warning("final_report_failed", error=str(e))
            log.info("generator_stopped", name=self.name, **self.counts)

    async def _report_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.report()
            except Exception as e:
                log.warning("report_failed", error=str(e))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.report_every_s)
