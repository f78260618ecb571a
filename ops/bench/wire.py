"""`python -m ops bench wire`: entries/s through the wire, against a raw redis-py loop in the same run.

Both sides do the same Redis work for N attempts: pipelined XADD in chunks, XREADGROUP in batches, one
settle script call per batch (SET NX marker, XADD reward, XACK), and XREAD of the rewards until all N
are back. As deployed, the producer and the consumer are processes of their own; the reader runs here
and the clock stops when it has read the N-th reward. The raw side
sends pre-encoded bytes and skips our codec, dataclasses, handler call, stats and logging, so `ratio`
is the share of the wire's speed our runtime keeps. Our consumer's handler is called once per entry, as
the verifier's is. Last line of output: one JSON object.

`--replica` measures what the settle's WAIT costs (streams/settle.py, "Replicas"): the private server gets a
replica (a second private redis-server, made one with REPLICAOF), and the rounds alternate our consumer
waiting for it after every settle (`settle_replicas` 1) and not waiting (0), on the same two servers;
`ratio` is then the no-wait time over the wait time, the share of the speed WAIT keeps.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import statistics
import time

from redis.asyncio import Redis

from ops.bench import common
from streams.codec import encode
from streams.connect import connect, connect_sync
from streams.embedded import EmbeddedRedis
from streams.keys import VERIFIERS, Keys
from streams.publisher import Publisher
from streams.runtime import Consumer, ConsumerSettings, Delivery, ensure_group
from streams.schema import Attempt, Reward
from streams.settle import _SETTLE_LUA, in_sync

PROOF = "theorem t : 1 + 1 = 2 := by\n  norm_num"


def _attempts(n: int) -> list[Attempt]:
    return [
        Attempt(
            attempt_id=f"a{i}", work_id=f"w{i // 8}", theorem_id="t", policy_version=0, sample_index=i % 8, proof=PROOF
        )
        for i in range(n)
    ]


async def _read_results(redis: Redis, stream: str, n: int) -> None:
    last, seen = "0-0", 0
    while seen < n:
        reply = await redis.xread({stream: last}, count=1000, block=1000)
        if reply:
            entries = reply[0][1]
            seen += len(entries)
            last = entries[-1][0]


async def _publish(pub_once, items: list, chunk: int) -> None:
    for i in range(0, len(items), chunk):
        await pub_once(items[i : i + chunk])


# -- our runtime: the Publisher and the Consumer every role uses ------------------------------------------


def _ours_inputs(n: int) -> list[Attempt]:
    return _attempts(n)


async def _ours_producer(redis: Redis, keys: Keys, attempts: list[Attempt], batch: int) -> None:
    await _publish(Publisher(redis, keys).publish, attempts, batch)


async def _no_op(d: Delivery[Attempt]) -> list[Reward]:
    a = d.message
    return [
        Reward(
            attempt_id=a.attempt_id,
            theorem_id=a.theorem_id,
            policy_version=a.policy_version,
            verdict="proved",
            reward=1.0,
        )
    ]


def _ours_consumer_with(settle_replicas: int | None = None, **handler):
    async def consume(redis: Redis, keys: Keys, n: int, batch: int, stop: asyncio.Event) -> None:
        settings = ConsumerSettings(
            batch_size=batch,
            block_ms=100,
            claim_every_ms=60_000,
            flush_ms=10_000,
            settle_replicas=settle_replicas,
            settle_wait_ms=5_000,
        )
        consumer = Consumer(
            redis,
            keys,
            message_type=Attempt,
            group=VERIFIERS,
            name="bench",
            output=Reward,
            settings=settings,
            **handler,
        )
        await consumer.run(stop)

    return consume


# -- the baseline: the same Redis commands from a plain loop over pre-encoded bytes -----------------------


def _raw_inputs(n: int) -> list[dict[bytes, bytes]]:
    return [encode(a) for a in _attempts(n)]


async def _raw_producer(redis: Redis, keys: Keys, fields: list[dict], batch: int) -> None:
    async def xadd_chunk(chunk: list[dict]) -> None:
        async with redis.pipeline(transaction=False) as pipe:
            for f in chunk:
                pipe.xadd(keys.attempts, f)
            await pipe.execute()

    await _publish(xadd_chunk, fields, batch)


async def _raw_consumer(redis: Redis, keys: Keys, n: int, batch: int, stop: asyncio.Event) -> None:
    reward = encode(Reward(attempt_id="", theorem_id="t", policy_version=0, verdict="proved", reward=1.0))
    sha = await redis.script_load(_SETTLE_LUA)
    while not stop.is_set():
        reply = await redis.xreadgroup(VERIFIERS, "raw", {keys.attempts: ">"}, count=batch, block=100)
        if not reply:
            continue
        markers, argv = [], [VERIFIERS, 3600]
        for eid, f in reply[0][1]:
            markers.append(keys.done("attempt:" + f[b"attempt_id"].decode()))
            r = {**reward, b"attempt_id": f[b"attempt_id"]}
            argv += [b"r", eid, 1, 2 * len(r), *(x for kv in r.items() for x in kv)]
        await redis.evalsha(sha, 3 + len(markers), keys.attempts, keys.rewards, keys.dlq, *markers, *argv)


# side -> (inputs built before the clock starts, producer, consumer).
SIDES = {
    "ours": (_ours_inputs, _ours_producer, _ours_consumer_with(handler=_no_op)),
    "raw": (_raw_inputs, _raw_producer, _raw_consumer),
    # --replica: the settle followed by WAIT for one replica, or never waiting
    "ours-wait": (_ours_inputs, _ours_producer, _ours_consumer_with(settle_replicas=1, handler=_no_op)),
    "ours-no-wait": (_ours_inputs, _ours_producer, _ours_consumer_with(settle_replicas=0, handler=_no_op)),
}


# -- one round: producer and consumer in their own processes (as deployed), the reader in this one --------


def _role(role: str, side: str, url: str, run: str, n: int, batch: int, ready, go, stop) -> None:
    async def main() -> None:
        redis = connect(url)
        keys = Keys(run)
        stop_event = asyncio.Event()
        make_inputs, produce, consume = SIDES[side]
        inputs = make_inputs(n) if role == "producer" else None  # the application's work, not the wire's
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        if role == "producer":
            await produce(redis, keys, inputs, batch)
        else:
            watcher = asyncio.get_running_loop().run_in_executor(None, stop.wait)
            watcher.add_done_callback(lambda _: stop_event.set())
            await consume(redis, keys, n, batch, stop_event)
        await redis.aclose()

    asyncio.run(main())


def one_round(url: str, side: str, run: str, n: int, batch: int) -> float:
    ctx = mp.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    readies = [ctx.Event(), ctx.Event()]
    asyncio.run(_create_group(url, run))
    procs = [
        ctx.Process(target=_role, args=(role, side, url, run, n, batch, ready, go, stop))
        for role, ready in zip(("producer", "consumer"), readies, strict=True)
    ]
    for p in procs:
        p.start()
    try:
        for r in readies:
            if not r.wait(60):
                raise RuntimeError("bench role process did not start")
        start = time.perf_counter()
        go.set()
        asyncio.run(_read_all(url, Keys(run).rewards, n))
        return time.perf_counter() - start
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


async def _create_group(url: str, run: str) -> None:
    redis = connect(url)
    await ensure_group(redis, Keys(run).attempts, VERIFIERS)
    await redis.aclose()


async def _read_all(url: str, stream: str, n: int) -> None:
    redis = connect(url)
    await _read_results(redis, stream, n)
    await redis.aclose()


def _alternated(url: str, warmup: str, sides: tuple[str, str], n: int, batch: int, rounds: int):
    """A warm-up round of `warmup`, then `rounds` rounds of each of the two `sides`, interleaved so drift in
    the machine's load hits both alike; each side's round times, and the server's version and replicas in
    sync, read before the bench's keys are flushed."""
    one_round(url, warmup, "bench-warmup", min(n, 2000), batch)
    times: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        for side, took in zip(sides, times, strict=True):
            took.append(one_round(url, side, f"bench-{side}-{r}", n, batch))
    redis = connect_sync(url)
    server = {
        "redis_version": redis.info("server")["redis_version"],
        "replicas_in_sync": in_sync(redis.info("replication")),
    }
    redis.flushdb()
    redis.close()
    return *times, server


def _result(
    name: str, n: int, batch: int, rounds: int, times: tuple[list[float], list[float]], sides: tuple[str, str]
) -> dict:
    """What both wire benches report: the measured side's rate against the other's, from their round times
    (`times`: the measured side's, the other's), named by `sides` (`ours`/`baseline`, `wait`/`no_wait`)."""
    (measured, other), (mine, theirs) = times, sides
    m, o = statistics.median(measured), statistics.median(other)
    return {
        "bench": name,
        "n": n,
        "batch": batch,
        "rounds": rounds,
        "attempts_per_s": round(n / m),
        f"{theirs}_per_s": round(n / o),
        "ratio": round(o / m, 3),
        f"{mine}_s": [round(x, 3) for x in measured],
        f"{theirs}_s": [round(x, 3) for x in other],
    }


def bench(url: str, n: int, batch: int, rounds: int) -> dict:
    raw_s, ours_s, server = _alternated(url, "ours", ("raw", "ours"), n, batch, rounds)
    return {
        **_result("wire", n, batch, rounds, (ours_s, raw_s), ("ours", "baseline")),
        "redis_version": server["redis_version"],
        "topology": "producer process -> consumer process -> reader (this process)",
    }


def bench_wait(url: str, n: int, batch: int, rounds: int) -> dict:
    """Our consumer with WAIT for one replica after every settle against the same without, alternated."""
    load_before = os.getloadavg()[0]
    no_wait_s, wait_s, server = _alternated(url, "ours-wait", ("ours-no-wait", "ours-wait"), n, batch, rounds)
    return {
        **_result("wire-wait", n, batch, rounds, (wait_s, no_wait_s), ("wait", "no_wait")),
        "replicas_in_sync": server["replicas_in_sync"],
        "redis_version": server["redis_version"],
        **common.machine(load_before),
        "topology": "producer process -> consumer process (settle + WAIT 1) -> reader; master + 1 replica, local",
    }


@contextlib.contextmanager
def _with_replica(master: EmbeddedRedis):
    """A second private server, made a replica of `master` (REPLICAOF), in sync when this yields."""
    with EmbeddedRedis(appendfsync="everysec") as replica:
        client = connect_sync(replica.url)
        client.replicaof("127.0.0.1", master.port)
        client.close()
        watcher, deadline = connect_sync(master.url), time.monotonic() + 60
        while not in_sync(watcher.info("replication")):
            if time.monotonic() > deadline:
                raise RuntimeError("the bench's replica did not come in sync within 60 s")
            time.sleep(0.05)  # polls the master's view of its replica
        watcher.close()
        yield replica


def summary(result: dict) -> str:
    if result["bench"] == "wire-wait":
        return (
            f"wire with WAIT for a replica: {result['attempts_per_s']:,} attempts/s, without "
            f"{result['no_wait_per_s']:,}/s, ratio {result['ratio']} (n={result['n']}, batch={result['batch']})"
        )
    return (
        f"wire: {result['attempts_per_s']:,} attempts/s, raw redis-py {result['baseline_per_s']:,}/s, ratio "
        f"{result['ratio']} (n={result['n']}, batch={result['batch']}, Redis {result['redis_version']})"
    )


def measure(args: argparse.Namespace) -> dict:
    if not args.replica:
        return common.on_redis(args, lambda url: bench(url, args.n, args.batch, args.rounds))
    with EmbeddedRedis(appendfsync="everysec") as server, _with_replica(server):
        return bench_wait(server.url, args.n, args.batch, args.rounds)


def usage(args: argparse.Namespace) -> str | None:
    if args.replica and getattr(args, "redis_url", None):
        return "--replica starts its own master and replica; leave --redis-url out"
    return None


def add_parser(sub: argparse._SubParsersAction) -> None:
    about = "entries/s through publish -> consume -> settle -> read results"
    p = common.add_bench(sub, "wire", about, measure, summary, usage=usage)
    p.add_argument("--n", type=int, default=50_000, help="attempts per round")
    p.add_argument("--batch", type=int, default=500, help="XADD chunk and XREADGROUP count")
    p.add_argument("--rounds", type=int, default=3, help="rounds per side; medians are reported")
    p.add_argument(
        "--replica",
        action="store_true",
        help="start a replica too and compare our consumer with and without WAIT for it",
    )
    common.add_ending(p, redis=True)
