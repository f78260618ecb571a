"""A real verifier worker process for tests that stop and kill it (`test_stall.py`):

    PROOFSTREAM_REDIS_URL=... PROOFSTREAM_RUN=... PROOFSTREAM_TASKS='["lean"]' ... \
        python -m tests.consumers.verifier_worker

It runs `consumers.service.VerifierService` with the settings its environment gives (`VerifierSettings.load`,
as `arq workers.verifier` does) until SIGTERM, which drains it (`stop`). Then it prints one JSON line on stdout:
the service's stats plus its consumers' summed runtime counters (`duplicates`, `reclaimed`, `claims_lost`,
`released`). It also stops when its parent goes away, so a killed test run leaves no worker behind. Logs
(structlog JSON, one event a line) go to stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from consumers.service import VerifierService
from streams import logs
from tests.fixtures.parent import watch_parent
from verifier_pool.config import VerifierSettings


async def main() -> int:
    settings = VerifierSettings.load()
    logs.configure(settings.log_level)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    service = VerifierService(settings, settings.redis_url)
    watcher = asyncio.create_task(watch_parent(os.getppid(), stop))
    await service.start()
    try:
        await stop.wait()
    finally:
        stop.set()
        await watcher
        await service.stop()
    figures = service.stats()
    for name in ("duplicates", "reclaimed", "claims_lost", "released"):
        figures[name] = sum(getattr(c.stats, name) for c in service.consumers)
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
