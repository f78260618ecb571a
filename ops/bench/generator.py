"""`python -m ops bench generator`: generated tokens/s through the generator service, against the engine alone.

Both sides generate for the same work: `--orders` orders of `--prompts` Countdown problems with
`--n` samples each, at temperature 1 with the seed each order's work id gives, on one loaded engine.
The raw side calls `engine.generate` on the tokenized prompts, from the generator's engine thread (the one
thread every engine call runs on; producers/engine.py says why). The service side publishes the orders to a
private Redis and runs `GeneratorService` (read order, policy in place, prompts, generate in a thread,
extract, settle attempts + ack) until every attempt is in the stream. Same seeds and weights: both sides
generate the same tokens, so `ratio` is the share of the engine's speed the service path keeps.
Rounds alternate raw and service; medians are reported. The engine runs on `--device` (auto: the GPU where
torch sees one) in the generator's default dtype there; the JSON names the device (and GPU) it measured.
Last line of output: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from ops.bench import common
from streams.connect import connect
from streams.keys import Keys
from streams.publisher import Publisher
from streams.schema import WorkOrder
from streams.theorems import Theorem, register


def _theorems(count: int) -> list[Theorem]:
    import random

    rng = random.Random(0)
    out = []
    for i in range(count):
        numbers = [rng.randint(1, 20) for _ in range(3)]
        out.append(Theorem(f"bench-{i}", "countdown", numbers=numbers, target=numbers[0] * numbers[1] - numbers[2]))
    return out


def _orders(run_tag: str, theorems: list[Theorem], orders: int, per: int, n: int, tokens: int) -> list[WorkOrder]:
    sampling = {"temperature": 1.0, "max_new_tokens": tokens}
    return [
        WorkOrder(
            f"{run_tag}-{o}",
            0,
            "grpo" if n > 1 else "es",
            "countdown",
            [t.theorem_id for t in theorems[o * per : (o + 1) * per]],
            samples_per_theorem=n,
            sampling=sampling,
        )
        for o in range(orders)
    ]


def raw_round(engine, theorems: list[Theorem], orders: list[WorkOrder]) -> tuple[float, int]:
    # The generator's modules import torch: imported when the bench runs, so `python -m ops` starts without it.
    from producers.engine import Sampling
    from producers.service import sampling_seed
    from tasks import prompts

    by_id = {t.theorem_id: t for t in theorems}
    started, tokens = time.perf_counter(), 0
    for order in orders:
        ids = [prompts.tokenize(engine.tokenizer, prompts.messages(by_id[t])) for t in order.theorem_ids]
        sampling = Sampling.from_order(
            order.sampling, order.samples_per_theorem, sampling_seed(order.work_id), order.algo == "grpo"
        )
        for samples in engine.generate(ids, sampling):
            tokens += sum(len(s.token_ids) for s in samples)
    return time.perf_counter() - started, tokens


async def service_round(url: str, engine, theorems: list[Theorem], orders: list[WorkOrder], run: str):
    from producers.config import GeneratorSettings
    from producers.service import GeneratorService
    from streams.codec import decode
    from streams.schema import Attempt

    redis = connect(url)
    keys = Keys(run)
    await register(redis, keys, theorems)
    expected = sum(len(o.theorem_ids) * o.samples_per_theorem for o in orders)
    service = GeneratorService(GeneratorSettings(run=run, name="bench"), redis, engine)
    stop = asyncio.Event()
    started = time.perf_counter()
    await Publisher(redis, keys).publish(orders)
    task = asyncio.create_task(service.run(stop))
    reader = connect(url)  # blocking reads on a connection of its own: no polling beside the engine
    seen, last = 0, "0"
    while seen < expected:
        if task.done():
            task.result()
        for _, entries in await reader.xread({keys.attempts: last}, block=500) or []:
            seen, last = seen + len(entries), entries[-1][0]
    elapsed = time.perf_counter() - started
    stop.set()
    await task
    tokens = sum(decode(Attempt, f).num_tokens for _, f in await redis.xrange(keys.attempts))
    await reader.aclose()
    await redis.aclose()
    return elapsed, tokens


def bench(url: str, args: argparse.Namespace) -> dict:
    from producers.engine import ENGINE_THREAD
    from producers.engines import choose, make_engine
    from weights import device as devices
    from weights.model import resolve_model

    engine_name = choose(args.engine)
    device = devices.resolve(args.device)
    # Both sides call the engine from the service's engine thread (see producers/engine.py: ENGINE_THREAD).
    on_engine_thread = lambda fn, *a, **k: ENGINE_THREAD.submit(fn, *a, **k).result()  # noqa: E731
    engine = on_engine_thread(
        make_engine,
        engine_name,
        resolve_model(args.model),
        threads=args.threads,
        device=device,
        dtype="auto",
        kv_cache=args.kv_cache,
    )
    try:
        theorems = _theorems(args.orders * args.prompts)
        warm = _orders("warm", theorems, 1, args.prompts, args.n, 8)
        # first-call costs (kernels, caches) on neither side's clock
        on_engine_thread(raw_round, engine, theorems, warm)
        raw, ours = [], []
        for r in range(args.rounds):
            orders = _orders(f"r{r}", theorems, args.orders, args.prompts, args.n, args.max_new_tokens)
            raw.append(on_engine_thread(raw_round, engine, theorems, orders))
            ours.append(asyncio.run(service_round(url, engine, theorems, orders, f"bench-gen-{r}")))
    finally:
        on_engine_thread(engine.close)
    raw_rates = [t / s for s, t in raw]
    our_rates = [t / s for s, t in ours]
    r, o = statistics.median(raw_rates), statistics.median(our_rates)
    return {
        "bench": "generator",
        "engine": engine_name,
        **devices.describe(device),
        "orders": args.orders,
        "prompts_per_order": args.prompts,
        "samples_per_prompt": args.n,
        "kv_cache": args.kv_cache,
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "tokens_per_s": round(o, 1),
        "raw_tokens_per_s": round(r, 1),
        "ratio": round(o / r, 3),
        "tokens": [t for _, t in ours],
        "raw_tokens": [t for _, t in raw],
        "service_s": [round(s, 2) for s, _ in ours],
        "raw_s": [round(s, 2) for s, _ in raw],
    }


def summary(result: dict) -> str:
    return (
        f"generator ({result['engine']} on {result.get('gpu', result['device'])}): {result['tokens_per_s']} tokens/s "
        f"through the service, {result['raw_tokens_per_s']} calling the engine, ratio {result['ratio']}"
    )


def measure(args: argparse.Namespace) -> dict:
    return common.on_redis(args, lambda url: bench(url, args))


def add_parser(sub: argparse._SubParsersAction) -> None:
    about = "tokens/s through the generator service against the engine alone"
    p = common.add_bench(sub, "generator", about, measure, summary)
    common.add_engine(p)
    common.add_device(p, "where the engine runs")
    p.add_argument(
        "--kv-cache",
        default="dynamic",
        choices=("dynamic", "static"),
        help="hf engine: static lets transformers compile the decoding step on a GPU (producers/hf.py)",
    )
    common.add_model(p)
    p.add_argument("--orders", type=int, default=3, help="work orders per round")
    p.add_argument("--prompts", type=int, default=4, help="Countdown problems per order")
    p.add_argument("--n", type=int, default=2, help="samples per problem")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens a sample generates at most (default 48)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of each side; medians are reported (default 2)")
    common.add_threads(p)
    common.add_ending(p, redis=True)
