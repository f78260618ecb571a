"""tests/fixtures/fake_roles.py with the real generator's rule for an order it sees again: one whose done
marker exists (settled, or cancelled by the trainer) is acked unserved (producers/service.py, `handle`). A
restarted trainer publishes its orders in flight again; fake_roles alone would serve them a second time and
publish their attempts anew, which would hide a trainer that lost the attempts it had read.

    python -m tests.trainer.sharded_roles REDIS_URL RUN
"""

from __future__ import annotations

import asyncio
import sys

from streams.connect import connect
from streams.keys import Keys
from streams.runtime import Delivery
from streams.schema import Reward, WorkOrder
from tests.fixtures import fake_roles


def main(url: str, run: str) -> None:
    serve = fake_roles.handle
    redis, keys = connect(url), Keys(run)

    async def handle(delivery: Delivery[WorkOrder]) -> list[Reward]:
        if await redis.exists(keys.done(delivery.message.dedup_id)):
            return []
        return await serve(delivery)

    fake_roles.handle = handle  # fake_roles.main hands its module's `handle` to the consumer
    asyncio.run(fake_roles.main(url, run))


if __name__ == "__main__":
    main(*sys.argv[1:3])
