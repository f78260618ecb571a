"""The generator and the verifier pool with synthetic stage latencies, for `python -m ops bench pipeline`.

Each role is the deployed service with only its model or its sandbox replaced:

- `generator`: `producers.service.GeneratorService` (consumer runtime on `work`, group `generators`, one
  order at a time, policy stream followed, stale orders skipped, backpressure gate, attempts settled with
  the order's ack) around `SyntheticEngine`, whose `generate` sleeps `gen_ms` for each attempt it returns,
  on the engine thread, as an accelerator would be busy: one generator process is one accelerator, its
  calls run one at a time.
- `verifier`: `consumers.service.VerifierService` (N slots, two consumer tasks each, `VerifyHandler`:
  theorem lookup, verdict cache, reward, settle) whose checkers are `FixedLatencyChecker`s: each check awaits
  `verify_ms` (a thread's sleep, as a check awaits its sandbox's answer); the N slots check N attempts at once.

The latencies are real waiting in the role's own process. Each process records when it was busy: the start
and end of every engine call or check, per generator or slot (a lane), on `time.monotonic` (one clock for
every process of a Linux host), and writes them to `--stats-out` as JSON when it stops (SIGTERM or SIGINT:
the service drains first).

    python -m ops.bench.pipeline_roles generator --redis-url URL --run RUN --gen-ms 20 --stats-out gen.json
    python -m ops.bench.pipeline_roles verifier --redis-url URL --run RUN --verify-ms 15 --slots 2 --stats-out v.json
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from consumers.service import VerifierService
from producers.config import GeneratorSettings
from producers.engine import EngineStats, Sample, Sampling
from producers.service import GeneratorService
from streams import logs
from streams.connect import connect
from streams.theorems import Theorem
from verifier_pool.config import VerifierSettings
from verifier_pool.judgement import Judgement
from verifier_pool.sandbox import SandboxStats

SYNTHETIC_ENVIRONMENT = "synthetic-checker-1"  # part of the verdict cache key: never mixed with a real checker's


# -- the generator -----------------------------------------------------------------------------------------


class _Encoded:
    def __init__(self, input_ids: list[int]) -> None:
        self.input_ids = input_ids


class SyntheticTokenizer:
    """What `tasks.prompts.tokenize` asks of a tokenizer: a chat template and an encoder."""

    def apply_chat_template(self, chat: list[dict[str, str]], tokenize: bool, **_template: bool) -> str:
        return "\n".join(m["content"] for m in chat)

    def __call__(self, text: str, add_special_tokens: bool = False) -> _Encoded:
        return _Encoded([len(text)])


class SyntheticEngine:
    """The `producers.engine.Engine` interface with no model: `generate` takes `gen_s` per attempt.

    Every answer is distinct (the order's sampling seed, the prompt and the sample index are in it), so the
    verifier's verdict cache never spares a check."""

    name = "synthetic"
    device = "cpu"  # where its (absent) ES noise would be drawn: one device type for the whole bench

    def __init__(self, gen_s: float) -> None:
        self.gen_s = gen_s
        self.model_path = Path("synthetic")
        self.tokenizer = SyntheticTokenizer()
        self.stats = EngineStats()
        self.busy: list[tuple[float, float, int]] = []  # (start, end, attempts) of every engine call

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Sample]]:
        count = len(prompts) * sampling.n
        started = time.monotonic()
        if self.gen_s:
            time.sleep(self.gen_s * count)  # the accelerator is busy; this thread is the engine thread
        ended = time.monotonic()
        self.busy.append((started, ended, count))
        self.stats.generate_s += ended - started
        self.stats.prompts += len(prompts)
        self.stats.generated_tokens += count
        return [
            [Sample([1], f"<answer>{sampling.seed}-{i}-{k}</answer>") for k in range(sampling.n)]
            for i in range(len(prompts))
        ]

    def es_add_step(self, version: int, step: dict[str, Any]) -> None:
        pass  # no weights: the step's cost is part of gen_ms

    def es_forget_after(self, version: int) -> None:
        pass

    def es_use(self, version: int, seed: int | None, sign: int = 1, sigma: float = 0.0, rank: int = 0) -> None:
        self.stats.policy_switches += 1

    def es_digest(self, version: int) -> str:
        return ""

    def load_weights(self, folder: Path) -> None:
        pass

    def close(self) -> None:
        pass


async def run_generator(url: str, run: str, name: str, gen_s: float, stop: asyncio.Event) -> dict:
    redis = connect(url)
    engine = SyntheticEngine(gen_s)
    settings = GeneratorSettings(run=run, redis_url=url, name=name, report_every_s=1.0)
    service = GeneratorService(settings, redis, engine)
    try:
        await service.run(stop)  # reports itself to {ps:R}:generator_stats at once: the bench's "ready"
    finally:
        await redis.aclose()
    return {
        "role": "generator",
        "name": name,
        "pid": os.getpid(),
        "lanes": [engine.busy],
        "counts": service.counts,
        "held_for_room_s": service.publisher.held_s,
        "fatal": service.fatal,
    }


# -- the verifier ------------------------------------------------------------------------------------------


class SyntheticSandbox:
    """What `VerifierService` asks of a checker's sandbox: start, kill, an id and its figures."""

    backend = "synthetic"

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self.figures = SandboxStats(sandbox_id, self.backend, starts=1)

    async def start(self) -> None:
        pass

    async def kill(self) -> None:
        pass

    def stats(self) -> SandboxStats:
        return self.figures


class FixedLatencyChecker:
    """A checker (`consumers.verifier.Checker`) whose every check awaits `verify_s` and then judges the
    answer by a hash of its text: about one in eight proved, the rest rejected with partial credit, so ES
    members get different rewards. Verdicts are cacheable, as real ones are."""

    environment = SYNTHETIC_ENVIRONMENT

    def __init__(self, verify_s: float, sandbox_id: str, busy: list) -> None:
        self.verify_s = verify_s
        self.sandbox = SyntheticSandbox(sandbox_id)
        self.busy = busy  # of its slot: (start, end, attempts) of every check

    async def check(self, theorem: Theorem, proof: str) -> Judgement:
        started = time.monotonic()
        if self.verify_s:
            # The sandbox is busy; the event loop serves the other slots. A thread's sleep, not asyncio.sleep:
            # a sandbox's answer wakes the loop as I/O, at once, where a timer's epoll wait is rounded up to
            # whole milliseconds each time the loop wakes for other I/O meanwhile (up to 1 ms a check).
            await asyncio.to_thread(time.sleep, self.verify_s)
        self.busy.append((started, time.monotonic(), 1))
        self.sandbox.figures.requests += 1
        self.sandbox.figures.total_requests += 1
        h = hashlib.blake2b(proof.encode(), digest_size=2).digest()
        if h[0] < 32:
            return Judgement("proved")
        return Judgement("rejected", "wrong_answer", "synthetic", score=round(h[1] / 255, 3))


async def run_verifier(url: str, run: str, slots: int, verify_s: float, stop: asyncio.Event) -> dict:
    lanes: list[list[tuple[float, float, int]]] = [[] for _ in range(slots)]  # one per slot: its checks

    def checkers_for(settings: VerifierSettings, index: int) -> dict:
        lane = lanes[index]
        return {task: FixedLatencyChecker(verify_s, f"synthetic-{task}-{index}", lane) for task in settings.tasks}

    # Only the sandboxes are swapped; every other line of the verifier path runs as deployed.
    settings = VerifierSettings(run=run, redis_url=url, concurrency=slots, tasks=["countdown"], sandbox="process")
    service = VerifierService(settings, url, checkers_for=checkers_for)
    await service.start()
    await service.report()  # the bench's "ready"
    try:
        await stop.wait()
    finally:
        await service.stop(timeout_s=10 + verify_s)
    return {"role": "verifier", "pid": os.getpid(), "slots": slots, "lanes": lanes, "stats": service.stats()}


# -- the process ---------------------------------------------------------------------------------------------


async def _main(args: argparse.Namespace) -> str:
    """Runs the role until stopped; returns why it gave up (a generator that stopped itself), else ''."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.role == "generator":
        result = await run_generator(args.redis_url, args.run, args.name, args.gen_ms / 1000, stop)
    else:
        result = await run_verifier(args.redis_url, args.run, args.slots, args.verify_ms / 1000, stop)
    Path(args.stats_out).write_bytes(orjson.dumps(result))
    return result.get("fatal", "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.pipeline_roles", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("generator", "verifier"))
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--stats-out", required=True, help="JSON file written when the role stops")
    parser.add_argument("--name", default="bench-generator", help="generator: consumer name")
    parser.add_argument("--gen-ms", type=float, default=20.0, help="generator: milliseconds per attempt")
    parser.add_argument("--verify-ms", type=float, default=15.0, help="verifier: milliseconds per check")
    parser.add_argument("--slots", type=int, default=1, help="verifier: checks at once (slots)")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    logs.configure(args.log_level)
    fatal = asyncio.run(_main(args))
    if fatal:  # as `python -m producers` does: the bench names the status and the role's log
        print(f"ops.bench.pipeline_roles: {fatal}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
