"""A consumer process whose handler holds each entry for a long time, for the claim-refresh tests
(`test_claim_refresh.py`), which SIGKILL and SIGSTOP it.

    python -m tests.streams.claim_worker --redis-url URL --run RUN --name NAME --claim-idle-ms 1500 --hold-s 60

It runs one `streams.runtime.Consumer` (through `run`, so it refreshes its claims) in group "verifiers" on the
run's attempts stream. Each entry is held `--hold-s` seconds (the event loop stays awake: this is a slow
check, not a stall), then gets a `Reward` whose `sandbox_id` is this consumer's name. A stop (SIGTERM) cuts a
hold short with a transient failure, so the entry is released, if it is still this consumer's, rather than
settled. On exit the process prints its consumer's `Stats` as one JSON line on stdout. It also stops by itself
when its parent goes away, so a killed test run leaves no consumer behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys

from streams import logs
from streams.connect import connect
from streams.keys import VERIFIERS, Keys
from streams.runtime import Consumer, ConsumerSettings, Delivery
from streams.schema import Attempt, Reward
from tests.fixtures.parent import watch_parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis-url", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--claim-idle-ms", type=int, default=1500)
    p.add_argument("--hold-s", type=float, default=60.0)
    p.add_argument("--log-level", default="warning")
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure(args.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    async def hold(d: Delivery[Attempt]) -> list[Reward]:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), args.hold_s)
        if stop.is_set():
            raise RuntimeError("stopped before the hold ended")  # transient: released, not settled
        a = d.message
        return [Reward(attempt_id=a.attempt_id, theorem_id=a.theorem_id, policy_version=a.policy_version,
                       verdict="proved", reward=1.0, sandbox_id=args.name)]  # fmt: skip

    redis = connect(args.redis_url, socket_connect_timeout=1.0)
    settings = ConsumerSettings(batch_size=1, block_ms=100, claim_idle_ms=args.claim_idle_ms, claim_every_ms=100,
                                retry_delay_ms=100)  # fmt: skip
    consumer = Consumer(redis, Keys(args.run), message_type=Attempt, group=VERIFIERS, name=args.name,
                        handler=hold, output=Reward, settings=settings)  # fmt: skip
    watcher = asyncio.create_task(watch_parent(os.getppid(), stop))
    try:
        await consumer.run(stop)
    finally:
        stop.set()
        await watcher
        await redis.aclose()
    print(json.dumps(dataclasses.asdict(consumer.stats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
