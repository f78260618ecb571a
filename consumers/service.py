"""The verifier pool of one process: N slots of warm sandboxes, each fed by two consumer tasks.

A slot's sandboxes check one attempt at a time. Its two consumer tasks (each with its own Redis client)
take turns (`VerifyHandler.turn`): while one checks, the other stores its last verdict in the cache, settles
its attempt, reads the next and looks it up in the cache, so the sandbox starts its next check as soon as
the last one ends instead of after those four Redis round trips (~1 ms on a 2-core host: 5% of a 20 ms
check; `python -m ops bench pipeline`). The price: an attempt may wait for the check ahead of it in its
slot; its claim is refreshed meanwhile (streams.runtime), so the reclaim deadline need not allow for it.

`arq workers.verifier` runs `start` on startup, `sweep` and `report` as cron jobs and `stop` on SIGTERM;
tests and the local pipeline can run it directly. Stopping drains: each task finishes the attempt in hand,
settles it and releases the rest of its batch (streams.runtime).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable

import structlog

from consumers.verifier import VerifyHandler
from streams import role_stats, sweeps
from streams.connect import connect
from streams.keys import VERIFIERS, Keys
from streams.ride_out import UNAVAILABLE
from streams.role_stats import VerifierStats
from streams.runtime import Consumer, ConsumerSettings, ensure_group
from streams.schema import Attempt, Reward
from verifier_pool import docker_daemon
from verifier_pool.config import TASKS_PER_SLOT, VerifierSettings
from verifier_pool.pool import backends, make_checkers
from verifier_pool.sandbox import SandboxUnavailable

CheckersFor = Callable[[VerifierSettings, int], dict]

log = structlog.get_logger("consumers.service")


class VerifierService:
    def __init__(self, settings: VerifierSettings, redis_url: str, checkers_for: CheckersFor | None = None) -> None:
        """`checkers_for(settings, index)` builds slot `index`'s checkers, one per task kind; by default the
        sandboxes and checkers the settings name (verifier_pool.pool). A benchmark passes stand-ins."""
        self.settings = settings
        self.checkers_for = checkers_for
        self.redis_url = redis_url
        self.keys = Keys(settings.run)
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.consumer_settings = ConsumerSettings(
            batch_size=settings.batch_size,  # VerifierSettings.batch_size: why Lean reads one at a time
            block_ms=1000,
            claim_idle_ms=settings.claim_idle_ms,
            max_deliveries=settings.max_deliveries,
            settle_replicas=settings.settle_replicas,
            settle_wait_ms=settings.settle_wait_ms,
        )
        self.stop_event = asyncio.Event()
        self.consumers: list[Consumer] = []
        self.checkers: list[dict] = []
        self.tasks: list[asyncio.Task] = []
        self.started_at = time.monotonic()
        self.admin = connect(redis_url)
        self._start_failures: dict[str, str] = {}  # sandbox id -> why it could not start with the service

    async def start(self) -> None:
        """Start every sandbox (warm before the first attempt arrives), then the consumer tasks.

        A sandbox that cannot start does not stop the worker: it is logged (`sandbox_unavailable`), the
        health check turns red (`unavailable()`), and its slot's checks try to start it again, each failure
        a VerifierFault (the attempt is retried, dead-lettered with the reason after max_deliveries), so
        the slot recovers once the environment is fixed (the image built, the daemon back)."""
        await ensure_group(self.admin, self.keys.attempts, VERIFIERS)
        checkers_for = self.checkers_for or await self._configured_checkers()
        for i in range(self.settings.workers):
            checkers = checkers_for(self.settings, i)
            self.checkers.append(checkers)  # first: a start that fails part way leaves `stop` the ones that started
            # every start finished (none still under way for `stop` to miss) before a failure is raised
            started = await asyncio.gather(*(self._start_sandbox(c) for c in checkers.values()), return_exceptions=True)
            for failure in (s for s in started if isinstance(s, BaseException)):
                raise failure
            sandbox_ids = ",".join(c.sandbox.sandbox_id for c in checkers.values())
            turn = asyncio.Lock()
            for j in range(TASKS_PER_SLOT):
                # One connection, held: a pooled client checks a connection out and probes it for stray data
                # before every command (~25 us, a tenth of a Countdown check's CPU in the pool). The task and
                # its claim refresher (streams.runtime) share it, one command at a time.
                redis = connect(self.redis_url, single_connection_client=True)
                handler = VerifyHandler(
                    redis, self.keys, checkers, sandbox_ids, turn, max_deliveries=self.consumer_settings.max_deliveries
                )
                consumer = Consumer(
                    redis,
                    self.keys,
                    message_type=Attempt,
                    group=VERIFIERS,
                    name=f"{self.worker_id}-{i}.{j}",
                    handler=handler,
                    output=Reward,
                    settings=self.consumer_settings,
                    prefetch=handler.prefetch,
                )
                self.consumers.append(consumer)
                self.tasks.append(asyncio.create_task(consumer.run(self.stop_event), name=consumer.name))
        log.info(
            "verifier_pool_started",
            worker=self.worker_id,
            slots=len(self.checkers),
            consumers=len(self.tasks),
            tasks=self.settings.tasks,
            run=self.settings.run,
            sandboxes_unavailable=len(self.unavailable()),
        )
        await self.report()  # the health check's figures from the start, not from the first cron tick

    async def _start_sandbox(self, checker) -> None:
        sandbox = checker.sandbox
        try:
            await sandbox.start()
        except SandboxUnavailable as e:
            self._start_failures[sandbox.sandbox_id] = str(e)
            log.error(
                "sandbox_unavailable",
                sandbox_id=sandbox.sandbox_id,
                backend=sandbox.stats().backend,
                error=str(e)[:1000],
                worker=self.worker_id,
            )
        second_line = getattr(checker, "second_line", None)  # a Lean checker's (verifier_pool.lean_audit)
        if second_line is not None and second_line.audit is not None:
            await second_line.audit.probe()
        if second_line is not None and (why := second_line.unavailable):
            log.error("second_line_unavailable", sandbox_id=sandbox.sandbox_id, error=why[:1000], worker=self.worker_id)

    def unavailable(self) -> dict[str, str]:
        """Sandboxes that cannot start now, with why: those whose start at the service's start failed and
        that no check has started since, and those whose last (re)start in a check failed; and a Lean checker's
        second line (`<sandbox id>:second-line`) while none can confirm a proof (no audit program, or its
        sandbox cannot start), since every Lean proof is then `error`."""
        down = {}
        for checkers in self.checkers:
            for c in checkers.values():
                sandbox_id = c.sandbox.sandbox_id
                why = getattr(c, "unavailable", None)  # the checker's own record (verifier_pool.checkers)
                if why is None and c.sandbox.stats().starts == 0:
                    why = self._start_failures.get(sandbox_id)
                if why is not None:
                    down[sandbox_id] = why
                second_line = getattr(c, "second_line", None)  # no Lean `proved` can come through it: red too
                if second_line is not None and (why := second_line.unavailable):
                    down[f"{sandbox_id}:second-line"] = why
        return down

    async def stop(self, timeout_s: float | None = None) -> None:
        """Drain: tasks finish the attempt in hand (a slot's two, one after the other); then sandboxes are
        killed and clients closed."""
        self.stop_event.set()
        if self.tasks:
            timeout_s = timeout_s or TASKS_PER_SLOT * self.settings.proof_timeout_s + 10
            done, pending = await asyncio.wait(self.tasks, timeout=timeout_s)
            for t in pending:  # a check past its own timeout: its attempt stays pending for another worker
                t.cancel()
            for t in done:
                if t.exception():
                    log.error("consumer_failed", consumer=t.get_name(), error=repr(t.exception()))
        for checkers in self.checkers:
            await asyncio.gather(*(c.sandbox.kill() for c in checkers.values()), return_exceptions=True)
        for c in self.consumers:
            # The verdicts of a batch the stop cut short: lost with Redis down, costing a check later, never a reward.
            with contextlib.suppress(*UNAVAILABLE):
                await c.handler.store()
            await c.redis.aclose()
        try:
            await self.report()
        except UNAVAILABLE as e:  # Redis down at the stop: this worker's last figures are lost, not its drain
            log.warning("verifier_stats_not_reported", worker=self.worker_id, error=str(e))
        await self.admin.aclose()
        log.info("verifier_pool_stopped", worker=self.worker_id)

    async def _configured_checkers(self) -> CheckersFor:
        kinds = backends(self.settings)
        if "docker" in kinds.values():
            # Containers of a worker that died without cleaning up (their owner process is gone). Only owners
            # of this hostname: liveness can be proven only here, and a daemon shared through its socket also
            # runs the sandboxes of other workers (other verifier containers, other hosts, test runs).
            own_host = f"{socket.gethostname()}:"
            try:
                removed = await asyncio.to_thread(docker_daemon.remove_orphans, own_host)
            except SandboxUnavailable as e:  # no daemon now: its sandboxes cannot start either, which start() reports
                log.warning("orphan_sandboxes_not_removed", error=str(e)[:500])
                removed = []
            if removed:
                log.info("removed_orphan_sandboxes", count=len(removed))
        return lambda settings, index: make_checkers(settings, index, kinds)

    async def sweep(self) -> None:
        await sweeps.dead_letter_overdue(self.admin, self.keys, self.keys.attempts, VERIFIERS, self.consumer_settings)
        await sweeps.remove_idle_consumers(
            self.admin, self.keys.attempts, VERIFIERS, idle_ms=10 * self.settings.claim_idle_ms
        )
        await sweeps.trim(self.admin, self.keys.attempts, keep_s=self.settings.history_s)

    def stats(self) -> VerifierStats:
        """This worker's figures as `{ps:R}:verifier_stats` holds them (streams/role_stats.py)."""
        sandboxes = [c.sandbox.stats() for checkers in self.checkers for c in checkers.values()]
        processed = sum(c.stats.processed for c in self.consumers)
        busy_s = sum(c.handler.busy_s for c in self.consumers)
        wall_s = max(time.monotonic() - self.started_at, 1e-9) * max(len(self.checkers), 1)
        return {
            "worker": self.worker_id,
            "slots": len(self.checkers),
            "consumers": len(self.consumers),
            "processed": processed,
            "published": sum(c.stats.published for c in self.consumers),
            "dead_letters": sum(c.stats.dead for c in self.consumers),
            "transient_failures": sum(c.stats.transient_failures for c in self.consumers),
            "settle_unreplicated": sum(c.stats.settle_unreplicated for c in self.consumers),
            "utilization": round(busy_s / wall_s, 4),
            "sandboxes": len(sandboxes),
            "sandbox_starts": sum(s.starts for s in sandboxes),
            "sandbox_timeouts": sum(s.timeouts for s in sandboxes),
            "sandbox_crashes": sum(s.crashes for s in sandboxes),
            # The health check's (ops.health verifier): red while any sandbox of this worker cannot start.
            "sandboxes_unavailable": {k: v[:300] for k, v in self.unavailable().items()},
            "updated_ms": int(time.time() * 1000),
        }

    async def report(self) -> VerifierStats:
        """Publish this worker's figures to `{ps:R}:verifier_stats` (streams/role_stats.py)."""
        stats = self.stats()
        await role_stats.publish_verifier(self.admin, self.keys, self.worker_id, stats)
        log.info("verifier_pool_stats", **stats)
        return stats
