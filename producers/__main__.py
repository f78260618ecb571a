"""`python -m producers`: one generator process (one per GPU, or per CPU box).

    python -m producers --redis-url redis://host:6379/0 --run myrun [--engine hf|vllm] [--model PATH_OR_ID]

Settings come from defaults < TOML (`--config`, table [generator]) < PROOFSTREAM_* env < flags. SIGTERM or
Ctrl-C stops it after the order in hand is settled (or released for another generator to take).
"""

from __future__ import annotations

import asyncio
import signal
import sys

import structlog

from producers.config import GeneratorSettings
from producers.engine import EngineUnavailable, in_engine_thread
from producers.engines import choose, make_engine
from producers.service import GeneratorService
from streams.connect import connect
from streams.settings import SettingsParser
from weights import device as devices
from weights.model import MissingDependency, ModelNotFound, resolve_model

log = structlog.get_logger("producers")


def build_engine(settings: GeneratorSettings):
    """Resolve the model and load it in the chosen engine (blocking: seconds to a minute)."""
    try:
        device = devices.resolve(settings.device)
    except devices.NoDevice as e:
        raise EngineUnavailable(str(e)) from e
    path = resolve_model(settings.model, settings.model_cache or None)
    snapshots = settings.snapshots() / path.name  # centers of one base model only
    name = choose(settings.engine)
    # the hf engine serves members of any rank in one batch (forward hooks): LoRA slots are vLLM's alone
    lora = {"lora_rank": settings.lora_rank, "max_loras": settings.max_loras} if name == "vllm" else {}
    return make_engine(
        name,
        path,
        dtype=settings.dtype,
        device=device,
        snapshot_dir=snapshots,
        snapshot_every=settings.snapshot_every,
        keep=settings.keep_versions,
        threads=settings.threads,
        kv_cache=settings.kv_cache,
        **lora,
    )


async def serve(settings: GeneratorSettings) -> int:
    redis = connect(settings.redis_url)
    try:
        await redis.ping()
    except Exception as e:
        print(f"producers: cannot reach Redis at {settings.redis_url}: {e}", file=sys.stderr)
        return 1
    engine = await in_engine_thread(build_engine, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service = GeneratorService(settings, redis, engine)
    try:
        await service.run(stop)
    finally:
        engine.close()
        await redis.aclose()
    if service.fatal:
        print(f"producers: {service.fatal}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> SettingsParser:
    return GeneratorSettings.command_parser(
        "producers", __doc__, defaults={"redis_url": "unset: refused (a generator serves a run's Redis)"}
    )


def main(argv: list[str] | None = None) -> int:
    settings, _ = GeneratorSettings.from_command(build_parser(), argv)
    if not settings.redis_url:
        print(
            "producers: no Redis configured. Pass --redis-url (or PROOFSTREAM_REDIS_URL) of the run's Redis; "
            "`python -m trainer` with no Redis starts a private one and a generator with it.",
            file=sys.stderr,
        )
        return 2
    try:
        return asyncio.run(serve(settings))
    except (ModelNotFound, MissingDependency, EngineUnavailable) as e:
        print(f"producers: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
