"""One verifier-like consumer process for the chaos test (`test_chaos.py`), which SIGKILLs it at random.

    python -m tests.streams.chaos_worker --redis-url URL --run RUN --name NAME [--max-delay-ms 4] ...

It runs one `streams.runtime.Consumer` in group "verifiers" on the run's attempts stream and writes one
`Reward` per attempt; an attempt whose proof is `POISON` makes the handler raise `Poison`, so the runtime
dead-letters it. The handler sleeps a tiny random time now and then, so a SIGKILL often lands while a batch
is in hand. `Consumer.run` rides out Redis restarts by itself.

SIGTERM sets the stop event: the consumer finishes or releases what it holds and the process exits 0 (a
SIGTERM that arrives before the loop is up exits 0 at once, since nothing is held yet). The process also
stops by itself when its parent goes away, so a killed test run leaves no consumer behind.
"""

from __future__ import annotations

import signal
import sys

# Installed before the heavier imports: a replacement worker may be told to stop while still starting.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402

from streams import logs  # noqa: E402
from streams.connect import connect  # noqa: E402
from streams.keys import VERIFIERS, Keys  # noqa: E402
from streams.runtime import Consumer, ConsumerSettings, Delivery, Poison  # noqa: E402
from streams.schema import Attempt, Reward  # noqa: E402
from tests.fixtures.parent import watch_parent  # noqa: E402

POISON = "POISON"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis-url", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--claim-idle-ms", type=int, default=1500)
    p.add_argument("--claim-every-ms", type=int, default=200)
    p.add_argument("--retry-delay-ms", type=int, default=300)
    p.add_argument("--max-deliveries", type=int, default=20)
    p.add_argument("--max-delay-ms", type=float, default=4.0, help="upper bound of the handler's random sleep")
    p.add_argument("--delay-probability", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--ready-file", default=None, help="created once SIGTERM stops the consumer gracefully")
    return p.parse_args(argv)


def make_handler(args: argparse.Namespace):
    rng = random.Random(args.seed)

    async def handle(d: Delivery[Attempt]) -> list[Reward]:
        a = d.message
        if a.proof == POISON:
            raise Poison("proof is POISON")
        if args.max_delay_ms > 0 and rng.random() < args.delay_probability:
            await asyncio.sleep(rng.uniform(0, args.max_delay_ms) / 1000)
        return [
            Reward(
                attempt_id=a.attempt_id, theorem_id=a.theorem_id, policy_version=a.policy_version,
                verdict="proved", reward=1.0, work_id=a.work_id, sample_index=a.sample_index, sandbox_id=args.name,
            )
        ]  # fmt: skip

    return handle


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure(args.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if args.ready_file:
        open(args.ready_file, "w").close()
    settings = ConsumerSettings(
        batch_size=args.batch_size, block_ms=200, claim_idle_ms=args.claim_idle_ms,
        claim_every_ms=args.claim_every_ms, retry_delay_ms=args.retry_delay_ms, max_deliveries=args.max_deliveries,
    )  # fmt: skip
    redis = connect(args.redis_url, socket_connect_timeout=1.0)
    consumer = Consumer(
        redis, Keys(args.run), message_type=Attempt, group=VERIFIERS, name=args.name,
        handler=make_handler(args), output=Reward, settings=settings,
    )  # fmt: skip
    watcher = asyncio.create_task(watch_parent(os.getppid(), stop))
    try:
        await consumer.run(stop)
    finally:
        stop.set()
        await watcher
        await redis.aclose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
