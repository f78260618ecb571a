"""A consumer process whose handler holds each entry for a long time, for the claim-refresh tests
(`test_claim_refresh.py`), which SIGKILL and SIGSTOP it.

    python -m tests.streams.claim_worker --redis-url URL --run RUN --name NAME --claim-idle-ms 1500 --hold-s 60

It runs one `streams.runtime.Consumer` (through `run`, so it refreshes its claims) in group "verifiers" on the
run's attempts stream. Each entry is held `--hold-s` seconds (the event loop stays awake: this is a slow
check, not a stall), then gets a `Reward` whose `sandbox_id` is this consumer's name. A stop (SIGTERM) cuts a
hold short with a transient failure, so the entry is released, if it is still this consumer's, rather than
settled. On exit the process prints its consumer's `Stats` as one JSON line on stdout. It also stops by itself
when its parent goes away (consumer_process.py), so a killed test run leaves no consumer behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys

from streams.runtime import ConsumerSettings, Delivery
from streams.schema import Attempt, Reward
from tests.streams.consumer_process import parser, proved, serve


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--hold-s", type=float, default=60.0)
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def holding(stop: asyncio.Event):
        async def hold(d: Delivery[Attempt]) -> list[Reward]:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.hold_s)
            if stop.is_set():
                raise RuntimeError("stopped before the hold ended")  # transient: released, not settled
            return proved(d.message, args.name)

        return hold

    settings = ConsumerSettings(
        batch_size=1, block_ms=100, claim_idle_ms=args.claim_idle_ms, claim_every_ms=100, retry_delay_ms=100
    )
    consumer = await serve(args, settings, holding)
    print(json.dumps(dataclasses.asdict(consumer.stats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
