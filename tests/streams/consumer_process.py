"""Consumer processes of the tests, both sides.

The process (chaos_worker.py, claim_worker.py): the common flags, and one `streams.runtime.Consumer` in group
"verifiers" on the run's attempts stream, run until SIGTERM or SIGINT sets the stop event, or until the test
process goes away (so a killed test run leaves no consumer behind).

The test that started one (and tests/consumers' verifier workers): `finish` it, or `cleanup` what is left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Callable

from streams import logs
from streams.connect import connect
from streams.keys import VERIFIERS, Keys
from streams.runtime import Consumer, ConsumerSettings, Handler
from streams.schema import Attempt, Reward
from tests.fixtures.parent import watch_parent


def parser(doc: str) -> argparse.ArgumentParser:
    """The flags every consumer process takes; the caller adds its own."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--redis-url", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--claim-idle-ms", type=int, default=1500)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--ready-file", default=None, help="created once SIGTERM stops the consumer gracefully")
    return p


def proved(a: Attempt, by: str, **fields) -> list[Reward]:
    """The handler's result: `a` proved, judged by consumer `by` (its `sandbox_id`), with `fields` added."""
    return [
        Reward(
            attempt_id=a.attempt_id,
            theorem_id=a.theorem_id,
            policy_version=a.policy_version,
            verdict="proved",
            reward=1.0,
            sandbox_id=by,
            **fields,
        )
    ]


async def serve(
    args: argparse.Namespace, settings: ConsumerSettings, handler_for: Callable[[asyncio.Event], Handler[Attempt]]
) -> Consumer:
    """Run the consumer named `args.name` with the handler `handler_for(stop)` until stopped; return it (its
    `stats` say what it did)."""
    logs.configure(args.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.ready_file:
        open(args.ready_file, "w").close()
    redis = connect(args.redis_url, socket_connect_timeout=1.0)
    consumer = Consumer(
        redis,
        Keys(args.run),
        message_type=Attempt,
        group=VERIFIERS,
        name=args.name,
        handler=handler_for(stop),
        output=Reward,
        settings=settings,
    )
    watcher = asyncio.create_task(watch_parent(os.getppid(), stop))
    try:
        await consumer.run(stop)
    finally:
        stop.set()
        await watcher
        await redis.aclose()
    return consumer


def finish(proc: subprocess.Popen, timeout_s: float = 60) -> tuple[dict, str]:
    """SIGTERM (and SIGCONT, in case it is stopped) the process; it must exit 0. Its last stdout line (its
    figures, one JSON object) and its stderr, where the test captured it."""
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err or f"exited {proc.returncode}"
    return json.loads(out.strip().splitlines()[-1]), err


def cleanup(*procs: subprocess.Popen) -> None:
    """SIGKILL whichever of `procs` still runs (a test that failed before finishing them), stopped or not."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.communicate()
