"""`python -m trainer --algo es|grpo [--task countdown|lean] [--config run.toml] [--redis-url URL]`

With no Redis configured, the whole pipeline runs on this machine (a private Redis, one generator, one
verifier worker, all stopped at the end). With a Redis URL, only the trainer runs, against roles running
elsewhere. The run directory (default `runs/<run>`) receives metrics.jsonl, report.json, the plots and
the children's logs; the same run id resumes from its checkpoint. Under torchrun (`PROOFSTREAM_RUN=R torchrun
--nproc-per-node N -m trainer --algo grpo ...`) the GRPO trainer is sharded across the job's ranks
(trainer/sharded.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import orjson
import redis.exceptions as rx
import structlog
from tqdm import tqdm

from streams import files, learned
from streams.connect import connect, shown_url
from streams.keys import Keys
from streams.ride_out import UNAVAILABLE
from streams.run_dir import INFO, REPORT
from streams.runtime import sleep_or_stop
from streams.settings import SettingsParser
from tasks import prompts
from tasks.problems import DataError
from trainer import result
from trainer.config import TrainerSettings
from trainer.console import Console
from trainer.data import load_theorems
from trainer.es import ESRun
from trainer.lease import TrainerLease, TrainerRunning
from trainer.local import LocalPipeline, lean_backend_problem
from trainer.metrics import MetricsSink
from trainer.mlflow_run import MLflowRun, MLflowUnavailable
from trainer.run_state import FINISHED_BEFORE, RunFinished
from weights.model import resolve_model

LOCAL = "unset: this machine runs the whole pipeline, a private redis-server, a generator and verifiers"
SHARDED_ENV = ("RANK", "WORLD_SIZE")  # set by torchrun for each rank it starts


def sharded_launch() -> bool:
    """Started by torchrun: the GRPO trainer shards its model across the job's ranks (trainer/sharded.py)."""
    return all(name in os.environ for name in SHARDED_ENV)


log = structlog.get_logger("trainer")


async def train(
    settings: TrainerSettings, url: str, local: LocalPipeline | None, sink: MetricsSink, started_at: float | None = None
) -> dict:
    redis = connect(url)
    train_set, held_out = load_theorems(settings)
    prompt = prompts.applied((train_set or held_out)[0], settings.prompt_format) if train_set or held_out else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ends_at = None
    if settings.max_minutes:  # the budget counts from the trainer's start (`started_at`, wall-clock time)
        ends_at = time.monotonic() + 60 * settings.max_minutes - (time.time() - (started_at or time.time()))
    bar = Console(settings.iterations, final_evaluation=settings.evaluates, ends_at=ends_at)
    model_path = None
    if settings.algo == "grpo":
        model_path = await asyncio.to_thread(resolve_model, settings.model)

    def fresh_run():
        """The run as its state in Redis says (a new one, or resumed): also after Redis came back, since a
        restarted Redis may have lost the last second of writes (AOF everysec) that this process had made."""
        if settings.algo == "grpo":
            from trainer.grpo import GRPORun  # torch and transformers: an ES trainer never loads them

            run = GRPORun(settings, redis, train_set, held_out, sink, bar, model_path=model_path)
        else:
            run = ESRun(settings, redis, train_set, held_out, sink, progress=bar)
        if started_at is not None:  # `max_minutes` counts from the trainer's start, start-up included
            run.started_at = started_at
        return run

    lease = TrainerLease(redis, Keys(settings.run), settings.lease_s)
    try:
        await lease.acquire()
        await _announce(settings, redis, time.time() if started_at is None else started_at, prompt)
    except BaseException:
        await redis.aclose()
        bar(None)
        raise
    watchdog = asyncio.create_task(local.watch(stop)) if local else None
    usurped = asyncio.create_task(_set_when(lease.lost, stop))
    try:
        pause_s = 0.0  # grows while runs fail at once (a Redis that answers PING but refuses writes: full)
        while True:
            started = time.monotonic()
            try:
                summary = await fresh_run().run(stop) | {"prompt": prompt}
                await _ended(settings, redis, stop.is_set())
                break
            except UNAVAILABLE as e:
                if local is not None or not _outage(e):  # our own Redis child: the watchdog says what happened
                    raise
                pause_s = 0.0 if time.monotonic() - started > 60 else min(max(2 * pause_s, 0.5), 30.0)
                print(
                    f"trainer: Redis is unavailable ({type(e).__name__}: {e}); waiting for it, then resuming "
                    "from the run's state there",
                    file=sys.stderr,
                )
                if not await _redis_back(redis, stop, pause_s):
                    summary = {"version": None, "counts": {}}
                    break
    finally:
        for task in (watchdog, usurped):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await lease.release()
        await redis.aclose()
        bar(None)
    if watchdog and watchdog.done() and not watchdog.cancelled() and watchdog.exception():
        raise watchdog.exception()
    if lease.lost.is_set():
        raise TrainerRunning(f"run {settings.run!r}: another trainer took the run over; this one stopped")
    summary["interrupted"] = stop.is_set()
    return summary


def shown_settings(settings: TrainerSettings) -> dict:
    """The settings as report.json and run.json keep them: a Redis URL without its password."""
    return {**settings.model_dump(), "redis_url": shown_url(settings.redis_url) if settings.redis_url else ""}


async def _announce(settings: TrainerSettings, redis, started_at: float, prompt: dict | None = None) -> None:
    """What this trainer runs and since when, for `ops run` / `ops runs` / the dashboard: `run.json` in the run
    directory and `{ps:R}:run` in Redis (a trainer elsewhere has no directory ops can read). Written once the
    lease is ours, so a second trainer refused for the run does not overwrite the first one's. `prompt`: the
    prompt as applied to the task (tasks/prompts.py `applied`), beside the settings, which stay the
    settings' own fields."""
    info = {
        "run": settings.run,
        "settings": shown_settings(settings),
        "prompt": prompt,
        "started": started_at,
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    files.write_bytes(settings.directory() / INFO, orjson.dumps(info, option=orjson.OPT_INDENT_2))
    await redis.set(Keys(settings.run).run_info, orjson.dumps(info))


async def _ended(settings: TrainerSettings, redis, interrupted: bool) -> None:
    """When this trainer's part of the run ended, in `{ps:R}:run` beside its start: a finished run read from
    its Redis alone (no report.json at hand) still says when it finished and how long it took. Best effort:
    Redis going away now costs the run nothing else."""
    key = Keys(settings.run).run_info
    with contextlib.suppress(*UNAVAILABLE):
        info = orjson.loads(await redis.get(key) or b"{}")
        await redis.set(key, orjson.dumps({**info, "ended": time.time(), "interrupted": interrupted}))


def _outage(e: BaseException) -> bool:
    """A Redis outage, not a local failure: UNAVAILABLE holds OSError for the socket errors redis-py lets
    through, but a full disk or a missing file is no reason to wait for Redis."""
    return not isinstance(e, OSError) or isinstance(e, (ConnectionError, TimeoutError))


async def _redis_back(redis, stop: asyncio.Event, pause_s: float = 0.0) -> bool:
    """Wait `pause_s`, then (capped backoff) until Redis answers; False if stopped first."""
    await sleep_or_stop(stop, pause_s)
    delay, waited = 0.05, 0.0
    while not stop.is_set():
        with contextlib.suppress(*UNAVAILABLE):
            await redis.ping()
            log.info("redis_back", waited_s=round(waited, 1))
            return True
        await sleep_or_stop(stop, delay)
        waited += delay
        delay = min(delay * 2, 2.0)
    return False


async def _set_when(event: asyncio.Event, then: asyncio.Event) -> None:
    await event.wait()
    then.set()


def headline_of(settings: TrainerSettings, summary: dict) -> str:
    """The run's result in one line (trainer/result.py, as `python -m ops run` leads with it): where it got to
    and in how long, the held-out evaluation first, last and best, the problems solved, the samples."""
    if summary.get("version") is None:
        return ""
    done = not summary.get("interrupted") and (summary["version"] >= settings.iterations or summary.get("time_up"))
    r = result.summary(
        shown_settings(settings),
        version=summary["version"],
        counts=summary.get("counts") or {},
        evals=summary.get("evals") or {},
        status="finished" if done else "interrupted",
        wall_s=summary.get("wall_s"),
    )
    return result.headline(r)


def verdict_lines(summary: dict, run_dir: Path, records: list[dict]) -> list[str]:
    """Whether the run learned beyond its evaluation's noise (streams/learned.py: the first and last evaluation,
    problem by problem, from metrics.jsonl `records`) and what the answers were at those two evaluations (from
    the run's traces); [] before an evaluation."""
    evals = learned.with_problems(summary.get("evals") or {}, records)
    if not evals:
        return []
    lines = [f"did it learn? {learned.verdict(evals)['words']}"]
    if shown := learned.answers(run_dir, learned.ends(evals)):
        lines.append("answers: " + "; ".join(shown))
    return lines


def build_parser() -> SettingsParser:
    return TrainerSettings.command_parser("trainer", __doc__, defaults={"redis_url": LOCAL})


def main(argv: list[str] | None = None) -> int:
    settings, args = TrainerSettings.from_command(build_parser(), argv)
    if sharded_launch():
        if settings.algo != "grpo":
            print("trainer: torchrun shards the GRPO trainer only; run --algo es as one process", file=sys.stderr)
            return 2
        _sharded(settings, lambda: _main(settings, args))
    return _main(settings, args)


def _sharded(settings: TrainerSettings, rank0: Callable[[], int]) -> NoReturn:
    """Under torchrun (trainer/sharded.py): rank 0 is the trainer as `_main` runs it, with a sharded model;
    the other ranks follow its calls until rank 0 tells them to stop. After a failed collective (a rank died)
    rank 0 exits without telling them: they fail on the dead peer, or torchrun's agent stops them, and the
    job exits nonzero. A rank that gets to the end leaves with os._exit (below)."""
    import torch.distributed as dist

    from trainer import sharded
    from trainer.grpo import training_device

    mesh = sharded.start(training_device(settings.train_device), settings.dist_timeout_s)
    if sharded.rank() == 0:
        lead = sharded.become_leader(mesh, settings.dist_timeout_s)
        code = rank0()
        lead.close()
    else:
        code = sharded.follow(mesh, resolve_model(settings.model))
    dist.destroy_process_group()
    # Everything the job did is in Redis and on disk (fsynced) by now: skip the interpreter's teardown. In it,
    # torch's native threads now and then abort the process after `main` has returned ("terminate called
    # without an active exception", SIGABRT with no Python frame left: once in CI, once in 30 two-rank runs
    # here), and torchrun then reports a finished job as failed.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _main(settings: TrainerSettings, args: argparse.Namespace) -> int:
    if settings.task == "lean" and not settings.redis_url and (problem := lean_backend_problem(settings)):
        print(f"trainer: {problem}", file=sys.stderr)
        return 2
    if settings.dataset and not Path(settings.dataset).expanduser().is_file():
        print(
            f"trainer: dataset {settings.dataset}: no such file (a jsonl of theorems: data/ has miniF2F and ProofNet)",
            file=sys.stderr,
        )
        return 2
    run_dir = settings.directory()
    run_dir.mkdir(parents=True, exist_ok=True)
    mlflow = None
    if settings.mlflow_uri:
        params = settings.model_dump(exclude={"redis_url", "mlflow_uri"})  # URLs may hold credentials
        try:
            mlflow = MLflowRun(run_dir, settings.mlflow_uri, settings.mlflow_experiment, params)
        except MLflowUnavailable as e:
            print(f"trainer: {e}", file=sys.stderr)
            return 2
    sink = MetricsSink(run_dir, mlflow)
    local = None
    started, started_at = time.monotonic(), time.time()
    url = settings.redis_url or ""
    ended = False  # the run came to a summary (or was already finished)
    try:
        if not url:
            local = LocalPipeline(settings, run_dir, config=args.config or os.environ.get("PROOFSTREAM_CONFIG"))
            url = local.start()
            print(f"trainer: local pipeline on {url}; logs in {local.logs}", file=sys.stderr)
        summary = asyncio.run(train(settings, url, local, sink, started_at))
        ended = True
    except KeyboardInterrupt:
        summary, ended = {"interrupted": True}, True
    except RunFinished as e:
        print(f"trainer: {e}", file=sys.stderr)
        sink.finish([], interrupted=False)
        ended = True
        return FINISHED_BEFORE
    except DataError as e:
        print(f"trainer: {e}", file=sys.stderr)
        return 2
    except (rx.ConnectionError, rx.TimeoutError) as e:  # at the start: later, an outage is waited out instead
        if local is not None:  # the trainer's own Redis child died: its log says why
            raise
        print(
            f"trainer: cannot reach Redis at {shown_url(url)} ({type(e).__name__}: {e}). Start it, or point "
            "--redis-url (PROOFSTREAM_REDIS_URL) at the run's Redis; without --redis-url the trainer starts "
            "its own",
            file=sys.stderr,
        )
        return 2
    except RuntimeError as e:
        # through tqdm: a progress bar another library left open must not swallow the line that says why
        tqdm.write(f"trainer: {e}", file=sys.stderr)
        return 1
    finally:
        if local is not None:
            local.stop()
        if not ended:  # any other way out than a summary: the MLflow run ends as killed
            sink.finish([], interrupted=True)
    if local is not None:
        summary["children"] = local.stopped
    summary["wall_s"] = round(time.monotonic() - started, 1)
    plots = sink.plots()
    report = run_dir / REPORT
    options = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
    report.write_bytes(orjson.dumps({"settings": shown_settings(settings), **summary}, option=options))
    sink.finish([report, *plots], interrupted=bool(summary.get("interrupted")))
    if headline := headline_of(settings, summary):
        print(f"trainer: {headline}", file=sys.stderr)
        for line in verdict_lines(summary, run_dir, sink.records()):
            print(f"trainer: {line}", file=sys.stderr)
        print(f"trainer: reading: {result.reading(settings.task, settings.reward)}", file=sys.stderr)
    print(f"trainer: report {report}; metrics {run_dir / 'metrics.jsonl'}", file=sys.stderr)
    if plots:
        print(f"trainer: plots {', '.join(str(p) for p in plots)}", file=sys.stderr)
    if local is not None:  # its Redis is gone now; its data is not
        print(
            f"trainer: inspect it with `python -m ops run --run-dir {run_dir}` (`python -m ops open --run-dir "
            f"{run_dir}` for redis-cli)",
            file=sys.stderr,
        )
    return 130 if summary.get("interrupted") else 0


if __name__ == "__main__":
    raise SystemExit(main())
