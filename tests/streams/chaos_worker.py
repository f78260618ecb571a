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
import random  # noqa: E402

from streams.runtime import ConsumerSettings, Delivery, Poison  # noqa: E402
from streams.schema import Attempt, Reward  # noqa: E402
from tests.streams.consumer_process import parser, proved, serve  # noqa: E402

POISON = "POISON"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--claim-every-ms", type=int, default=200)
    p.add_argument("--retry-delay-ms", type=int, default=300)
    p.add_argument("--max-deliveries", type=int, default=20)
    p.add_argument("--max-delay-ms", type=float, default=4.0, help="upper bound of the handler's random sleep")
    p.add_argument("--delay-probability", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=None)
    return p.parse_args(argv)


def make_handler(args: argparse.Namespace):
    rng = random.Random(args.seed)

    async def handle(d: Delivery[Attempt]) -> list[Reward]:
        a = d.message
        if a.proof == POISON:
            raise Poison("proof is POISON")
        if args.max_delay_ms > 0 and rng.random() < args.delay_probability:
            await asyncio.sleep(rng.uniform(0, args.max_delay_ms) / 1000)
        return proved(a, args.name, work_id=a.work_id, sample_index=a.sample_index)

    return handle


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = ConsumerSettings(
        batch_size=args.batch_size,
        block_ms=200,
        claim_idle_ms=args.claim_idle_ms,
        claim_every_ms=args.claim_every_ms,
        retry_delay_ms=args.retry_delay_ms,
        max_deliveries=args.max_deliveries,
    )
    handler = make_handler(args)
    await serve(args, settings, lambda _stop: handler)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
