"""arq entry point: `arq workers.verifier` starts a verifier pool worker; `arq workers.verifier --check`
answers its health check.

arq reads the settings class's own `__dict__` (inherited attributes are ignored) and keeps only names of
`arq.worker.Worker` parameters, so `verifier` is a plain class with every setting spelt out, and this
module keeps no other globals named like Worker parameters. Settings come from the TOML file
($PROOFSTREAM_CONFIG, table [verifier]) and PROOFSTREAM_* variables; arq owns the command line.

Redis restarts. The consumer tasks ride out an outage themselves (streams.runtime); arq's own loop does not:
its first failed command (worker.py `_poll_iteration`'s ZRANGEBYSCORE, the health check's PSETEX, a cron
job's enqueue or bookkeeping) ends `Worker.main`, and `Worker.close` then fails on the same dead Redis before
it reaches `on_shutdown`: exit 1, no drain. arq passes `RedisSettings.retry` and `retry_on_error` to redis-py
(connections.py `create_pool`), whose client retries every command and reconnect through them; the policy is
streams.ride_out's: no retry while arq starts (arq's own conn_retries decide), retry for as long as it
takes once the worker is up, and for at most STOP_GRACE_S once it stops.

Redis Sentinel. With a `redis+sentinel://` URL arq gets `RedisSettings(host=[sentinels], sentinel=True,
sentinel_master=service)`, which its `--check` uses as is (`create_pool` asks the sentinels for the master).
The worker itself gets its pool from here (`redis_pool`, a Worker parameter): arq's `create_pool` builds a
sentinel client from `Sentinel(sentinels=..., ssl=...)` and db/username/password only, dropping `retry` and
`retry_on_error` (arq 0.28 connections.py), so its pool would give up at the first command of a failover and
end the worker. Ours is streams.sentinel's client of the master with the same ride-out policy, whose
connections ask the sentinels again on every reconnect; arq's patience at the start (conn_retries) becomes
the policy's `start_within`. arq's `Sentinel` gets no sentinel_kwargs, so it cannot AUTH to sentinels that
have a password: with a `sentinel_password` in the URL, `--check` gets the master's address instead, asked of
the sentinels here when the module is imported (each `--check` is a new process: the master of that moment).

Shutdown. After the start, SIGTERM and SIGINT come here rather than to arq's handler, which would cancel the
main loop and leave the drain to `Worker.close`, behind a Redis call. Here the pool drains first (bounded:
VerifierService.stop), then arq's own `handle_sig` stops the loop and `close` follows. If Redis is still down
by then, arq's pool is closed and let go of: `close` returns at once without one (worker.py `close`), the
health key expires by itself, and the worker exits 0 having drained. arq has no hook for this: the CLI always
builds `arq.worker.Worker` (a settings class cannot name a subclass) and `on_stop` is not a parameter, so the
worker is found from `on_startup` (`_arq_worker`) and its `_pool` dropped by hand, and the drain waits for the
worker's running job tasks (`Worker.tasks`) before arq's stop would cancel them: the places that rely on arq
0.28's insides, checked at every start and by tests/test_workers_redis_restart.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sys

import structlog
from arq import cron
from arq.connections import ArqRedis, RedisSettings
from arq.version import VERSION as ARQ_VERSION
from arq.worker import Worker
from redis.exceptions import RedisError, ResponseError

from consumers.service import VerifierService
from streams import logs, sentinel
from streams.cluster import is_cluster_url, slot_master_url
from streams.connect import HiredisSentinelConnection, shown_url
from streams.keys import Keys
from streams.ride_out import UNAVAILABLE, RideOut
from streams.settings import SettingsError
from verifier_pool.config import VerifierSettings

log = structlog.get_logger("workers")

STOP_GRACE_S = 5.0  # a stopping worker waits this long for Redis to come back before it lets go of it
_RETRY = RideOut(client="arq")  # arq's pool's policy: starting, then riding out, then stopping (streams.ride_out)


def _load() -> VerifierSettings:
    try:
        settings = VerifierSettings.load()
    except SettingsError as e:
        sys.exit(f"proofstream verifier: {e}")
    if not settings.redis_url:
        sys.exit("proofstream verifier: set PROOFSTREAM_REDIS_URL (or redis_url in the TOML file) to the run's Redis")
    return settings


_SETTINGS = _load()


def _unreachable_redis_in_one_line(kind: type[BaseException], error: BaseException, tb) -> None:
    """arq's CLI owns the process (`arq workers.verifier [--check]`): a Redis it cannot reach at the start, once
    its own retries are spent (arq.connections `create_pool`), escapes as a traceback. Say it in one line
    instead; the exit status stays 1. Any other uncaught error keeps Python's traceback."""
    if isinstance(error, UNAVAILABLE) and not isinstance(error, FileNotFoundError | PermissionError):
        print(
            f"arq workers.verifier: cannot reach Redis at {shown_url(_SETTINGS.redis_url)} "
            f"({kind.__name__}: {error}). Start it, or set PROOFSTREAM_REDIS_URL to the run's Redis",
            file=sys.stderr,
        )
        return
    if isinstance(error, ResponseError) and str(error).startswith(("MOVED", "ASK ")):
        print(
            f"arq workers.verifier: the run's slot moved to another master of the cluster ({error}); start the "
            "worker again: it connects to the new one",
            file=sys.stderr,
        )
        return
    sys.__excepthook__(kind, error, tb)


sys.excepthook = _unreachable_redis_in_one_line


async def _startup(ctx: dict) -> None:
    logs.configure(_SETTINGS.log_level)
    service = VerifierService(_SETTINGS, _SETTINGS.redis_url)
    ctx["service"] = service
    await service.start()
    # Only now: a signal during the start goes to arq's handler, whose close() must not wait for Redis.
    worker = _arq_worker(ctx)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, ctx, worker, sig)
    _RETRY.ride_out()


def _arq_worker(ctx: dict) -> Worker:
    """The arq Worker running this process. arq gives `on_startup` only its ctx, but awaits it from inside
    `Worker.main` (worker.py, `await self.on_startup(self.ctx)`), so the current task's coroutine is that
    method's and its `self` is the worker."""
    frame = getattr(asyncio.current_task().get_coro(), "cr_frame", None)
    worker = frame.f_locals.get("self") if frame is not None else None
    if not isinstance(worker, Worker) or worker.ctx is not ctx or not isinstance(getattr(worker, "tasks", None), dict):
        raise RuntimeError(
            f"workers.verifier: arq {ARQ_VERSION} does not run on_startup inside Worker.main as "
            "0.28.0 does; its shutdown handling must be revisited for this version"
        )
    return worker


def _on_signal(ctx: dict, worker: Worker, sig: signal.Signals) -> None:
    if "drain" in ctx:
        return  # a second signal: the drain under way is bounded already
    log.info("verifier_stopping", signal=sig.name)
    ctx["drain"] = asyncio.create_task(_drain_then_stop(ctx, worker, sig), name="drain")


async def _drain_then_stop(ctx: dict, worker: Worker, sig: signal.Signals) -> None:
    # arq's loop keeps riding out an outage meanwhile: it must end by our cancel, not by its own error.
    try:
        await ctx["service"].stop()
        try:
            await asyncio.wait_for(worker.pool.ping(), STOP_GRACE_S)  # a Redis that is restarting: wait a little
        except TimeoutError:
            # arq's close() would delete its health key first (worker.py `close`), fail on the dead Redis,
            # skip on_shutdown and exit 1. Without a pool it returns at once; the key expires by itself.
            log.warning(
                "redis_unreachable_at_stop", waited_s=STOP_GRACE_S, health_key_expires_s=verifier.health_check_interval
            )
            await worker.pool.aclose()
            worker._pool = None
    finally:
        # A cron job (`_report`, `_sweep`) started just before the signal: let it end (it returns at once now
        # that "drain" is set). arq's handle_sig would cancel it, and close() gathers its job tasks without
        # return_exceptions (worker.py `close`): the cancelled task's CancelledError ended the worker with exit
        # 1 and a traceback (seen once in tests/test_workers_redis_restart.py: SIGTERM at the :00 report).
        ongoing = [task for task in worker.tasks.values() if not task.done()]
        if ongoing:
            await asyncio.wait(ongoing, timeout=STOP_GRACE_S)
        _RETRY.stop_within(STOP_GRACE_S)  # close()'s own calls, should Redis go away now: bounded
        worker.handle_sig(sig)  # arq's own stop: cancels its job tasks and main loop; close() follows


async def _shutdown(ctx: dict) -> None:
    if "drain" in ctx:
        await ctx["drain"]  # done already (it stopped the loop): re-raises a failed drain
    elif "service" in ctx:  # stopped during the start, by arq's own signal handler
        await ctx["service"].stop()


async def _sweep(ctx: dict) -> None:
    """Dead letters no live consumer would reach, dead consumers, acked history."""
    if "drain" in ctx:
        return  # stopping: the service's clients are closed or closing
    try:
        await ctx["service"].sweep()
    except UNAVAILABLE as e:  # Redis went away mid-sweep: the next tick sweeps (arq would log a failed job)
        log.warning("sweep_skipped", error=str(e))


async def _report(ctx: dict) -> None:
    if "drain" in ctx:
        return  # stopping: the drain reports last
    try:
        await ctx["service"].report()
    except UNAVAILABLE as e:  # the next tick reports
        log.warning("report_skipped", error=str(e))


def _cluster_redis_settings(url: str, prefix: str) -> RedisSettings:
    """arq's Redis for a `redis+cluster://` URL: a plain connection to the master that serves the run's slot.

    arq 0.28 cannot use a cluster client (ArqRedis subclasses redis.asyncio.Redis, and it WATCHes and MULTIs
    its own keys, worker.py `start_jobs`, `finish_job`), but every key it touches for this worker can be on
    the run's slot, and then one master holds them all: the queue `{ps:R}:arq` and its health key (queue name
    + ':health-check'), the job, in-progress, retry and result keys `arq:<kind>:<job id>` of the cron jobs,
    whose ids are `<cron name>:<ms>` (worker.py `run_cron`, unique=True) with names carrying the hash tag
    (`verifier.cron_jobs`), and the abort set: `arq:abort` (constants.py), which `finish_job` and
    `finish_failed_job` ZREM in the same MULTI as the job's keys, a CROSSSLOT error on a cluster; it is moved
    onto the slot here, through the module global worker.py reads at each call (checked: arq 0.28's name).
    tests/test_cluster_run.py lists the keys arq left on a real cluster and checks each one's slot.

    The master is asked for once, at the start. If the slot moves (resharding, a failover to a replica) the
    old address answers MOVED or nothing: arq's loop ends on the MOVED (a ResponseError; exit 1, said in
    one line by `_unreachable_redis_in_one_line`; arq's `close` fails on the same MOVED before on_shutdown, so
    no drain: what the pool held is reclaimed after claim_idle_ms, as after a crash) or rides out the dead
    address while `--check`, asked of the new master, fails: either way the worker is restarted and finds
    the new master. tests/test_cluster_run.py reshards a live worker's slot away. The consumer tasks
    themselves are on a cluster client and follow the slot (streams/cluster.py)."""
    import arq.worker  # noqa: PLC0415 - its module global, read by finish_job at each call

    if arq.worker.abort_jobs_ss != "arq:abort":
        raise RuntimeError(
            f"workers.verifier: arq {ARQ_VERSION} names its abort set {arq.worker.abort_jobs_ss!r}, "
            "not 'arq:abort' as 0.28.0 does; its keys on a cluster must be revisited"
        )
    arq.worker.abort_jobs_ss = f"{prefix}:arq:abort"
    try:
        master = slot_master_url(url, prefix)
    except RedisError as e:
        sys.exit(f"proofstream verifier: cannot reach the Redis Cluster at {shown_url(url)}: {e}")
    return RedisSettings.from_dsn(master)


def _redis_settings(url: str) -> RedisSettings:
    """arq's settings for `url`, with the ride-out policy (which its sentinel branch ignores: module docstring).
    A cluster URL names the master of the run's slot (`_cluster_redis_settings`)."""
    if is_cluster_url(url):
        return dataclasses.replace(
            _cluster_redis_settings(url, _PREFIX), retry=_RETRY, retry_on_error=list(UNAVAILABLE)
        )
    if not sentinel.is_sentinel(url):
        return dataclasses.replace(RedisSettings.from_dsn(url), retry=_RETRY, retry_on_error=list(UNAVAILABLE))
    parsed = sentinel.parse(url)
    common = {
        "database": parsed.db,
        "username": parsed.username,
        "password": parsed.password,
        "retry": _RETRY,
        "retry_on_error": list(UNAVAILABLE),
    }
    if parsed.options.get("sentinel_password"):  # arq cannot AUTH to these sentinels (module docstring)
        try:
            host, port = sentinel.master_address_sync(url, RedisSettings.conn_timeout)
            return RedisSettings(host=host, port=port, **common)
        except RedisError:
            pass  # no sentinel answers now: arq's own branch fails `--check` as it would
    return RedisSettings(host=parsed.sentinels, sentinel=True, sentinel_master=parsed.service, **common)


def _sentinel_pool(url: str, settings: RedisSettings, queue_name: str) -> ArqRedis | None:
    """For a sentinel URL, the worker's pool (module docstring); None lets arq build its own."""
    if not sentinel.is_sentinel(url):
        return None
    _RETRY.start_within(settings.conn_retries * (settings.conn_retry_delay + settings.conn_timeout))
    pool = sentinel.master(
        url,
        connection_class=HiredisSentinelConnection,
        redis_class=ArqRedis,
        socket_connect_timeout=settings.conn_timeout,
        retry=_RETRY,
        retry_on_error=list(UNAVAILABLE),
    )
    pool.default_queue_name = queue_name  # as create_pool sets it from the Worker's queue_name
    return pool


_PREFIX = Keys(_SETTINGS.run).prefix  # the run's hash tag, `{ps:R}`
_REDIS_SETTINGS = _redis_settings(_SETTINGS.redis_url)
_QUEUE = f"{_PREFIX}:arq"  # per run, so `--check` reads this run's health key


class verifier:  # noqa: N801 - the name users type: `arq workers.verifier`
    redis_settings = _REDIS_SETTINGS
    redis_pool = _sentinel_pool(_SETTINGS.redis_url, _REDIS_SETTINGS, _QUEUE)
    queue_name = _QUEUE
    on_startup = _startup
    on_shutdown = _shutdown
    cron_jobs = [
        # Named with the run's hash tag: their job keys land on the run's slot (`_cluster_redis_settings`).
        cron(
            _sweep,
            name=f"{_PREFIX}:sweep",
            second=set(range(0, 60, _SETTINGS.sweep_every_s)),
            run_at_startup=False,
            unique=True,
        ),
        cron(_report, name=f"{_PREFIX}:report", second={0, 30}, run_at_startup=False, unique=True),
    ]
    health_check_interval = 10
    handle_signals = True
