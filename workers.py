"""arq entry point: `arq workers.verifier` starts a verifier pool worker; `arq workers.verifier --check`
answers its health check.

arq reads the settings class's own `__dict__` (inherited attributes are ignored) and keeps only names of
`arq.worker.Worker` parameters, so `verifier` is a plain class with every setting spelt out, and this
module keeps no other globals named like Worker parameters. Settings come from the TOML file
($PROOFSTREAM_CONFIG, table [verifier]) and PROOFSTREAM_* variables; arq owns the command line.
"""

from __future__ import annotations

import sys

from arq import cron
from arq.connections import RedisSettings

from consumers.service import VerifierService
from streams import logs
from streams.keys import Keys
from streams.settings import SettingsError
from verifier_pool.config import VerifierSettings


def _load() -> VerifierSettings:
    try:
        settings = VerifierSettings.load()
    except SettingsError as e:
        sys.exit(f"proofstream verifier: {e}")
    if not settings.redis_url:
        sys.exit("proofstream verifier: set PROOFSTREAM_REDIS_URL (or redis_url in the TOML file) to the run's Redis")
    return settings


_SETTINGS = _load()


async def _startup(ctx: dict) -> None:
    logs.configure(_SETTINGS.log_level)
    service = VerifierService(_SETTINGS, _SETTINGS.redis_url)
    ctx["service"] = service
    await service.start()


async def _shutdown(ctx: dict) -> None:
    if "service" in ctx:
        await ctx["service"].stop()


async def _sweep(ctx: dict) -> None:
    """Dead letters no live consumer would reach, dead consumers, acked history."""
    await ctx["service"].sweep()


async def _report(ctx: dict) -> None:
    await ctx["service"].report()


class verifier:  # noqa: N801 - the name users type: `arq workers.verifier`
    redis_settings = RedisSettings.from_dsn(_SETTINGS.redis_url)
    queue_name = f"{Keys(_SETTINGS.run).prefix}:arq"  # per run, so `--check` reads this run's health key
    on_startup = _startup
    on_shutdown = _shutdown
    cron_jobs = [
        cron(_sweep, second=set(range(0, 60, _SETTINGS.sweep_every_s)), run_at_startup=False, unique=True),
        cron(_report, second={0, 30}, run_at_startup=False, unique=True),
    ]
    health_check_interval = 10
    handle_signals = True
