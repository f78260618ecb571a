"""`python -m ops bench verifier`: the verifier pool on real sandboxes: throughput, utilization, restarts, cache.

The deployed pool (`consumers.service.VerifierService`: `--sandboxes` slots of warm sandboxes of `--backend`,
built by `verifier_pool.pool`, two consumer tasks each) runs in this process on a private Redis (or
`--redis-url`) and judges real Countdown attempts (`tasks.countdown.countdown_problems`, registered as the
trainer registers them; one attempt in four is the problem's solution, the rest wrong, every text distinct).
Each backlog is published in one MULTI/EXEC to the started, idle pool, so its consumers see all of it at
once and no sandbox waits for work; the clock starts when EXEC returns and stops when the backlog is gone:
when all but one attempt per consumer task are rewarded (until then every task had one to take).

1. checks: `--attempts` attempts.
   - `proofs_per_s`: rewards published in the window / its seconds.
   - `utilization`: the pool's own accounting: the seconds its sandboxes spent checking
     (`VerifyHandler.busy_s`) over sandboxes x window. `utilization_from_rewards`, from the wire: the
     window's rewards' `verify_ms` summed over the same; an upper bound, not a second measurement: a reward's
     `verify_ms` also counts its wait for the event loop once its check ended, which overlaps the slot's
     next check, so it can pass 1.
   The verdicts must be the solutions' (`proved` for exactly the correct attempts), or the bench fails.
   A task sends the cache misses of each read to its sandbox in one request (CountdownChecker.check_many), so
   `check_ms_mean` is a sandbox's time per answer within such a batch; `pool_cpu_share` is this process's
   CPU time over the window (of one core): near 1, the pool, not its sandboxes, limits the rate, and the
   sandboxes wait for it (utilization below 1).
2. cache: `--cache-hits` attempts, the first phase's again under new ids: every one a cache hit (cached=1
   and its first verdict, or the bench fails). `cache_hits_per_s` is measured as `proofs_per_s` is.
   `pool_cpu_us_per_reward`: this process's CPU time per reward in each window (the pool's own cost,
   whatever else the machine runs; Redis's CPU is not in it).
3. restarts: one sandbox built as the pool builds the Countdown checker's (backend, limits, uid, image) but
   running the synthetic REPL (ops/bench/synthetic_repl.py, a stand-in for the Lean REPL's protocol) is sent
   `--hangs` requests that never answer (`FIXTURE:hang`), each with a `--hang-timeout-ms` limit, and after
   each one a request the replacement answers. `restart_ms` runs from the moment the limit expired to that
   answer: detection, kill, start, handshake and one exchange. p50 and p90 are reported.

Last line of output: one JSON object (also written to `--out`, e.g. docs/results/bench-verifier-process.json).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import itertools
import os
import signal
import statistics
import time
from pathlib import Path

from redis.asyncio import Redis

from consumers.service import VerifierService
from ops.bench import common
from streams import logs
from streams.cluster import transaction
from streams.codec import decode, encode_flat
from streams.connect import connect
from streams.keys import Keys
from streams.schema import Attempt, Reward
from streams.theorems import register
from tasks.countdown import countdown_problems
from verifier_pool import docker_daemon, process
from verifier_pool.config import TASKS_PER_SLOT, VerifierSettings
from verifier_pool.pool import make_sandbox
from verifier_pool.repl import LEAN_HANDSHAKE
from verifier_pool.sandbox import SandboxTimeout
from verifier_pool.sandbox_config import CHECKER_IMAGE

SYNTHETIC_REPL = Path(__file__).with_name("synthetic_repl.py")  # stdlib only: it runs in any sandbox's Python
PROBLEMS = 256
POLL_S = 0.02  # how often the window's end is looked for: 0.1% of a 20 s window
READY_TIMEOUT_S = 60.0  # a replacement sandbox's first answer (a container start included)
# A model's answer: some reasoning, then the expression. The number makes every text, so every verdict, distinct.
THINKING = "Let me try combining the numbers two at a time and see which operations get closest. " * 3


# -- the work ------------------------------------------------------------------------------------------------


def attempts_for(n: int, run: str) -> tuple[list[Attempt], list]:
    """(attempts, problems): attempt i answers problem i mod PROBLEMS, with the solution when i % 4 == 0."""
    problems = countdown_problems(PROBLEMS, seed=0)
    out = []
    for i in range(n):
        p = problems[i % PROBLEMS]
        solution = problems.meta[p.theorem_id]["solution"]
        answer = solution if i % 4 == 0 else f"{solution} + {i % 7 + 1}"  # uses a number it was not given
        out.append(
            Attempt(
                attempt_id=f"{run}-{i}",
                work_id=f"{run}-w{i // 8}",
                theorem_id=p.theorem_id,
                policy_version=0,
                sample_index=i % 8,
                task="countdown",
                proof=f"<think>{THINKING}({i})</think>\n<answer>{answer}</answer>",
            )
        )
    return out, problems


async def publish_at_once(redis: Redis, keys: Keys, attempts: list[Attempt]) -> None:
    """XADD every attempt in one MULTI/EXEC: the pool's consumers, blocked on an empty stream, see the whole
    backlog at once, so none of it is consumed before the clock starts."""
    async with transaction(redis, keys.attempts) as pipe:
        for a in attempts:
            pipe.pipeline_execute_command(b"XADD", keys.attempts, b"*", *encode_flat(a))
        await pipe.execute()


# -- phases 1 and 2: the pool on a backlog -----------------------------------------------------------------


def _busy_s(service: VerifierService) -> float:
    return sum(c.handler.busy_s for c in service.consumers)


async def backlog(redis: Redis, service: VerifierService, attempts: list[Attempt], timeout_s: float) -> dict:
    """Publish `attempts` to the running, idle `service`, time it while the backlog lasts, then wait until
    all are rewarded. Returns the window's figures and the rewards of `attempts`."""
    keys = service.keys
    last = await redis.xrevrange(keys.rewards, count=1)
    before = await redis.xlen(keys.rewards)
    await publish_at_once(redis, keys, attempts)
    t0, cpu0, busy0, r0 = time.monotonic(), time.process_time(), _busy_s(service), await redis.xlen(keys.rewards)
    deadline = t0 + timeout_s
    # Once fewer than one attempt per consumer task is left unrewarded, some task may find nothing to read.
    r1 = await _until(redis, keys, before + len(attempts) - len(service.consumers), deadline)
    t1, cpu1, busy1 = time.monotonic(), time.process_time(), _busy_s(service)
    await _until(redis, keys, before + len(attempts), deadline)
    window, slots = t1 - t0, len(service.checkers)
    entries = await redis.xrange(keys.rewards, f"({last[0][0].decode()}" if last else "-", "+")
    rewards: list[Reward] = [decode(Reward, f) for _, f in entries]
    in_window = rewards[r0 - before : r1 - before]
    return {
        "window_s": window,
        "in_window": len(in_window),
        "per_s": len(in_window) / window,
        "cpu_us": (cpu1 - cpu0) * 1e6 / max(1, len(in_window)),
        "utilization": (busy1 - busy0) / (slots * window),
        "utilization_from_rewards": sum(r.verify_ms for r in in_window) / 1000 / (slots * window),
        "rewards": rewards,
    }


async def _until(redis: Redis, keys: Keys, count: int, deadline: float) -> int:
    """Poll the rewards stream's length until it reaches `count`; RuntimeError past the deadline or on a dead
    letter (the pool gave an attempt up: its figures would measure a failure)."""
    while True:
        async with redis.pipeline(transaction=False) as pipe:
            n, dead = await pipe.xlen(keys.rewards).xlen(keys.dlq).execute()
        if n >= count:
            return n
        if dead:
            raise RuntimeError(f"the pool dead-lettered attempts: see `python -m ops --run {keys.run} dlq list`")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count - n} of {count} rewards still missing at the deadline (--timeout-s)")
        await asyncio.sleep(POLL_S)


# -- phase 3: restarts -----------------------------------------------------------------------------------------


def hanging_sandbox(settings: VerifierSettings):
    """A sandbox built as the pool builds the Countdown checker's, running the synthetic REPL, which hangs on
    request."""
    model = make_sandbox(settings, "countdown", 0, settings.sandbox)
    # The interpreter the Countdown checker runs on (stdlib only, as the synthetic REPL is); the Lean REPL's
    # handshake.
    argv = (model.config.argv[0], "-c", SYNTHETIC_REPL.read_text())
    config = dataclasses.replace(model.config, argv=argv, handshake=LEAN_HANDSHAKE)
    return type(model)(config, sandbox_id=f"bench-restart-{os.getpid()}")


async def restarts(settings: VerifierSettings, hangs: int, timeout_s: float) -> list[float]:
    """Milliseconds from each hang's limit expiring to the replacement's first answer."""
    sandbox = hanging_sandbox(settings)
    samples = []
    try:
        await sandbox.start()
        for _ in range(hangs):
            starts = sandbox.stats().starts
            sent = time.monotonic()
            try:
                await sandbox.request({"cmd": "theorem hangs : True := by -- FIXTURE:hang"}, timeout_s)
                raise RuntimeError("the synthetic REPL answered a request it should hang on")
            except SandboxTimeout:
                pass
            reply = await sandbox.request({"cmd": "theorem ok : True := trivial"}, READY_TIMEOUT_S)
            answered = time.monotonic()
            if "env" not in reply or sandbox.stats().starts != starts + 1:
                raise RuntimeError(f"not a fresh checker's answer: {reply} after {sandbox.stats()}")
            samples.append((answered - sent - timeout_s) * 1000)
    finally:
        await sandbox.kill()
    return samples


# -- the whole bench -------------------------------------------------------------------------------------------


def _pct(xs: list[float], q: int) -> float:
    return round(statistics.quantiles(xs, n=100, method="inclusive")[q - 1], 1) if len(xs) > 1 else round(xs[0], 1)


async def bench(url: str, args: argparse.Namespace) -> dict:
    run = f"bench-verifier-{os.getpid()}-{int(time.time())}"
    settings = VerifierSettings(
        run=run,
        redis_url=url,
        concurrency=args.sandboxes,
        tasks=["countdown"],
        sandbox=args.backend,
        log_level=args.log_level,
    )
    keys, redis = Keys(run), connect(url)
    service = VerifierService(settings, url)
    try:
        attempts, problems = attempts_for(args.attempts, run)
        await register(redis, keys, list(problems))
        try:
            await service.start()
            checks = await backlog(redis, service, attempts, args.timeout_s)
            verdicts = {r.attempt_id: r.verdict for r in checks["rewards"]}
            expected = {a.attempt_id: "proved" if i % 4 == 0 else "rejected" for i, a in enumerate(attempts)}
            if verdicts != expected:
                wrong = [(k, v, verdicts.get(k)) for k, v in expected.items() if verdicts.get(k) != v][:3]
                raise RuntimeError(f"the pool's verdicts are not the solutions' (attempt, expected, got): {wrong}")
            again = [
                dataclasses.replace(attempts[i % len(attempts)], attempt_id=f"{run}-again-{i}")
                for i in range(args.cache_hits)
            ]
            expected = {b.attempt_id: expected[a.attempt_id] for a, b in zip(itertools.cycle(attempts), again)}
            cache = await backlog(redis, service, again, args.timeout_s)
            stats = service.stats()
            first = service.checkers[0]["countdown"].sandbox.stats()  # how it is isolated: tool, image, uid
        finally:
            await service.stop()
        misses = [r.attempt_id for r in cache["rewards"] if not r.cached or r.verdict != expected[r.attempt_id]]
        if misses:
            raise RuntimeError(f"{len(misses)} repeated attempts were not cache hits of their verdict: {misses[:3]}")
        restart_ms = await restarts(settings, args.hangs, args.hang_timeout_ms / 1000)
        version = (await redis.info("server"))["redis_version"]
    finally:
        await redis.aclose()
        await asyncio.to_thread(common.delete_run, url, run)
    return {
        "bench": "verifier",
        "backend": args.backend,
        "sandboxes": args.sandboxes,
        "consumer_tasks": args.sandboxes * TASKS_PER_SLOT,
        "attempts": args.attempts,
        "proofs_per_s": round(checks["per_s"], 1),
        "utilization": round(checks["utilization"], 4),
        "utilization_from_rewards": round(checks["utilization_from_rewards"], 4),
        "check_ms_mean": round(checks["utilization"] * args.sandboxes * 1000 / checks["per_s"], 3),
        "restart_ms_p50": _pct(restart_ms, 50),
        "restart_ms_p90": _pct(restart_ms, 90),
        "restart_ms": [round(x, 1) for x in restart_ms],
        "hang_timeout_ms": args.hang_timeout_ms,
        "cache_hits": len(cache["rewards"]),
        "cache_hits_per_s": round(cache["per_s"], 1),
        "window_s": {"checks": round(checks["window_s"], 3), "cache": round(cache["window_s"], 3)},
        "window_rewards": {"checks": checks["in_window"], "cache": cache["in_window"]},
        "pool_cpu_us_per_reward": {"checks": round(checks["cpu_us"], 1), "cache": round(cache["cpu_us"], 1)},
        # Of one core: near 1, the pool's own event loop (one process) is what limits proofs_per_s.
        "pool_cpu_share": {
            "checks": round(checks["cpu_us"] * checks["per_s"] / 1e6, 3),
            "cache": round(cache["cpu_us"] * cache["per_s"] / 1e6, 3),
        },
        "verdicts": dict(collections.Counter(verdicts.values())),
        "sandbox_starts": stats["sandbox_starts"],
        "sandbox_extra": first.extra,
        "redis_version": version,
    }


def usage(args: argparse.Namespace) -> str | None:
    if args.sandboxes < 1 or args.hangs < 1 or args.hang_timeout_ms <= 0:
        return "--sandboxes and --hangs must be at least 1, --hang-timeout-ms positive"
    least = 4 * args.sandboxes * TASKS_PER_SLOT
    if min(args.attempts, args.cache_hits) < least:
        return f"--attempts and --cache-hits must be at least {least} (4 per consumer task)"
    if args.backend == "process" and process.available() is None:
        return "no process sandbox here: install bubblewrap (see verifier_pool/process.py)"
    if args.backend == "docker" and (why := docker_daemon.why_unavailable(CHECKER_IMAGE)):
        return f"no docker sandbox here: {why}"
    return None


async def _measured(url: str, args: argparse.Namespace) -> dict:
    # SIGTERM stops the bench as Ctrl-C does: the task is cancelled, so the pool drains and its sandboxes die.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    load_before = os.getloadavg()[0]
    return {**await bench(url, args), **common.machine(load_before)}


def summary(result: dict) -> str:
    return (
        f"verifier ({result['backend']}, {result['sandboxes']} sandboxes): {result['proofs_per_s']:,} proofs/s, "
        f"utilization {result['utilization']} ({result['utilization_from_rewards']} from rewards), "
        f"restart p50 {result['restart_ms_p50']} ms (p90 {result['restart_ms_p90']}), "
        f"{result['cache_hits_per_s']:,} cache hits/s"
    )


def measure(args: argparse.Namespace) -> dict:
    logs.configure(args.log_level)
    return common.on_redis(args, lambda url: asyncio.run(_measured(url, args)))


def add_parser(sub: argparse._SubParsersAction) -> None:
    about = "the verifier pool on real sandboxes: proofs/s, utilization, restarts, cache"
    p = common.add_bench(sub, "verifier", about, measure, summary, description=__doc__, usage=usage)
    p.add_argument("--backend", choices=("process", "docker"), default="process", help="the sandboxes to measure")
    p.add_argument("--sandboxes", type=int, default=os.cpu_count() or 1, help="slots of the pool (checks at once)")
    p.add_argument("--attempts", type=int, default=20_000, help="attempts checked in the first phase")
    p.add_argument("--cache-hits", type=int, default=20_000, help="attempts re-published in the cache phase")
    p.add_argument("--hangs", type=int, default=20, help="hanging requests in the restart phase")
    p.add_argument("--hang-timeout-ms", type=float, default=200.0, help="the limit each hanging request gets")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up on a phase after this long")
    p.add_argument("--log-level", default="warning", help="of the pool and its sandboxes")
    common.add_ending(p, redis=True)
