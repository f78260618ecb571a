"""`python -m ops`: the operator's view of a run, from the same Redis the roles use (the views: ops/views/).

    python -m ops run                          the run's result first (ops/views/runs.py), then its health
    python -m ops runs [--dir runs]            the runs in a folder, from their files (no Redis)
    python -m ops compare R1 R2 ... [--plot P] finished runs side by side: table, differences, one plot
                                               (ops/views/compare.py; the ES-against-GRPO experiment that
                                               trains runs to compare is `python -m evals.es_vs_grpo`)
    python -m ops theorem ID                   one problem of the run, as the verifier judges it
    python -m ops streams                      lengths, group lag / pending, consumers and their idle time
    python -m ops dlq list [--limit N]         dead letters, oldest first
    python -m ops dlq show ID                  one dead letter, its original fields byte for byte
    python -m ops dlq requeue ID|--all         put the original back on its stream, delete the letter
    python -m ops dlq purge ID|--all --yes     delete dead letters
    python -m ops tail STREAM [--count N] [--follow]
    python -m ops verdicts clear --run R       delete a finished run's verdict cache (ops/views/verdicts.py)
    python -m ops verdicts reasons             the newest verdicts counted, refusals by reason and rule
    python -m ops open --run-dir DIR           serve a finished local run's Redis (a copy) for redis-cli
    python -m ops dashboard [--port P]         the run's live page on 127.0.0.1 (ops/views/dashboard.py)
    python -m ops samples [--version V] [--verdict X] [--theorem ID] [--text REGEX] [-n N]
                                               judged attempts: problem, text, proof, verdict (the run dir's
                                               traces with --run-dir, else the streams' history)
    python -m ops bench NAME [--json] [--out F] wire, generator, es, es-throughput, grpo, pipeline, verifier
                                               (ops/bench/NAME.py; --help after NAME for its flags)

Shared flags (`--run`, `--redis-url`, `--run-dir`, `--config`, `--json`, ...) go before or after the command.
`--run-dir DIR` reads a finished local run from its directory instead of a live Redis, on a copy of its data
(streams/run_redis.py). Text by default; `--json` prints one JSON object (`tail --follow --json`: one per
entry). Exit status: 0 done, 1 Redis or the operation failed, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import ClassVar

import orjson
from pydantic import Field
from redis import exceptions as rx
from redis.asyncio import Redis

from ops.bench import es, es_throughput, generator, grpo, pipeline, verifier, wire
from ops.views import compare, dashboard, dlq, inspect, judged, runs, text, verdicts
from ops.views.text import emit, fail
from streams.cluster import is_cluster_url
from streams.connect import connect, shown_url
from streams.embedded import has_data
from streams.keys import STREAMS, Keys
from streams.run_dir import REDIS, holds_run
from streams.run_redis import NoRunData, reopen
from streams.settings import RoleSettings, SettingsError, SettingsParser
from weights.device import NoDevice

NO_REDIS = (
    "no run to inspect: name a finished run's directory with --run-dir DIR (`ops runs` lists them), "
    "or a live run's Redis with --redis-url URL (or PROOFSTREAM_REDIS_URL)"
)


class OpsSettings(RoleSettings):
    """ops has nothing to start on its own: it needs the run's Redis (`redis_url`), never an embedded one."""

    section: ClassVar[str] = "ops"

    timeout_s: float = Field(5.0, gt=1.0, description="seconds to wait for Redis to connect or answer")


# Shared settings ops has no use for: it never settles (WAIT) and logs nothing of its own.
NOT_OPS = ("log_level", "settle_replicas", "settle_wait_ms")

Command = Callable[[Redis, Keys, argparse.Namespace], Awaitable[int]]


# -- commands -----------------------------------------------------------------------------------------


async def cmd_run(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir).expanduser() if getattr(args, "run_dir", None) else None
    data = {"result": await runs.from_redis(redis, keys, run_dir), **await inspect.run_report(redis, keys)}
    emit(args, inspect.without_idle(data) if run_dir else data, text.run)
    return 0


async def cmd_streams(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    data = await inspect.stream_report(redis, keys)
    emit(args, inspect.without_idle(data) if getattr(args, "run_dir", None) else data, text.streams)
    return 0


async def cmd_tail(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    entries = await inspect.tail(redis, keys, args.stream, args.count)
    if not args.follow:
        data = {"stream": args.stream, "key": keys.stream(args.stream), "entries": entries}
        emit(args, data, lambda d: "\n".join(map(text.entry, d["entries"])) or f"{d['key']} has no entries")
        return 0
    # Following: one line per entry as it comes, JSON lines under --json, so a pipe sees each at once.
    after = entries[-1]["id"] if entries else "0-0"
    block_ms = min(500, int(args.settings.timeout_s * 500))  # well inside the socket timeout
    for view in entries:
        print(orjson.dumps(view).decode() if as_json else text.entry(view), flush=True)
    stop = _stop_on_signals()
    async for view in inspect.follow(redis, keys, args.stream, after, stop, block_ms=block_ms):
        print(orjson.dumps(view).decode() if as_json else text.entry(view), flush=True)
    return 0


def _stop_on_signals() -> asyncio.Event:
    """An event set by Ctrl-C or SIGTERM, so `--follow` ends between two reads, cleanly, with status 0."""
    stop = asyncio.Event()
    if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def cmd_open(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    """Keep the copy of a finished run's Redis up for redis-cli (or another ops) until Ctrl-C or SIGTERM."""
    url = args.settings.redis_url
    emit(
        args,
        {"redis_url": url, "run": keys.run},
        lambda d: (
            f"run {d['run']!r} of {args.run_dir} served (a copy) at {d['redis_url']} until Ctrl-C:\n"
            f"  redis-cli -u {d['redis_url']} XLEN '{{ps:{d['run']}}}:rewards'\n"
            f"  python -m ops --redis-url {d['redis_url']} --run {d['run']} run"
        ),
    )
    await _stop_on_signals().wait()
    return 0


async def cmd_dashboard(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    """The run's live page (ops/views/dashboard.py) until Ctrl-C or SIGTERM."""
    return await dashboard.serve(redis, keys, args, _stop_on_signals())


async def cmd_dlq_list(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    emit(args, await dlq.list_letters(redis, keys, args.limit), text.dlq_list)
    return 0


async def cmd_dlq_show(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    emit(args, await dlq.show_letter(redis, keys, args.id), text.dlq_show)
    return 0


async def cmd_dlq_requeue(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    if args.all:
        data = await dlq.requeue_all(redis, keys)
    else:
        data = {"requeued": [await dlq.requeue(redis, keys, args.id)], "failed": []}
    emit(args, data, text.requeued, changed=True)
    return 1 if data["failed"] else 0


async def cmd_dlq_purge(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    data = await (dlq.purge_all(redis, keys) if args.all else dlq.purge(redis, keys, args.id))
    emit(args, data, text.purged, changed=True)
    return 0


# -- parsing ------------------------------------------------------------------------------------------


_ENTRY_ID = re.compile(r"^\d+-\d+$")


def _entry_id(value: str) -> str:
    if not _ENTRY_ID.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a stream entry id (like 1712345678901-0)")
    return value


def _count(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a count (0 or more)")
    return int(value)


def _shared() -> argparse.ArgumentParser:
    """Settings flags and --json, for the top level and every command alike."""
    p = SettingsParser(add_help=False)
    OpsSettings.add_arguments(p, exclude=NOT_OPS)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--run-dir",
        dest="run_dir",
        metavar="DIR",
        help="a finished local run's directory: its Redis data, opened on a copy, instead of --redis-url "
        "(the run id is read from it unless --run names one)",
    )
    # All suppressed, so a flag given before the command is not reset by the command's default.
    for action in p._actions:
        action.default = argparse.SUPPRESS
    return p


def _local() -> argparse.ArgumentParser:
    """--json alone: the commands that read run directories need no Redis and no run id."""
    p = SettingsParser(add_help=False)
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON object")
    return p


def _regex(value: str):
    try:
        return judged.regex(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def build_parser() -> argparse.ArgumentParser:
    shared = _shared()
    parser = SettingsParser(prog="python -m ops", description="Inspect a proofstream run.", parents=[shared])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def leaf(subs, name: str, fn: Command, help: str) -> argparse.ArgumentParser:
        p = subs.add_parser(name, help=help, description=help, parents=[shared])
        p.set_defaults(command_fn=fn)
        return p

    leaf(
        sub,
        "run",
        cmd_run,
        "a run on one screen: its result first (held-out reward and problems solved, samples, "
        "wall time or ETA), then its health: trainer, in flight, generators, dead letters, groups",
    )
    leaf(sub, "streams", cmd_streams, "stream lengths, consumer groups (lag, pending, oldest pending), consumers")

    p = leaf(sub, "tail", cmd_tail, "the last entries of a stream, decoded")
    p.add_argument("stream", choices=STREAMS)
    p.add_argument("--count", "-n", type=_count, default=10, help="entries to show (default 10)")
    p.add_argument("--follow", "-f", action="store_true", help="then wait for new ones (XREAD BLOCK) until Ctrl-C")
    _dead_letters(sub, leaf)
    _samples(sub, leaf)
    _files(sub)
    p = leaf(
        sub, "dashboard", cmd_dashboard, "a live page of the run on 127.0.0.1 (reads only; --run-dir: a finished run)"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; any other needs --token)")
    p.add_argument("--port", type=int, default=8765, help="0: any free port (default 8765)")
    p.add_argument("--token", help="required on every request (?token= or Authorization: Bearer); default none")
    p.add_argument(
        "--refresh-s", dest="refresh_s", type=float, default=2.0, help="how often the page asks again (default 2.0)"
    )
    p.add_argument("--dir", help="the runs the page's selector offers (default: the folder of --run-dir, else runs)")
    leaf(sub, "open", cmd_open, "serve a finished run's Redis (a copy, with --run-dir) for redis-cli until Ctrl-C")

    b = sub.add_parser("bench", help="benchmarks (flags go after the benchmark's name)")
    benches = b.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    for module in (wire, generator, es, es_throughput, grpo, pipeline, verifier):
        module.add_parser(benches)
    return parser


def _dead_letters(sub, leaf) -> None:
    d = sub.add_parser("dlq", help="dead letters: list, show, requeue, purge").add_subparsers(
        dest="dlq_command", metavar="ACTION", required=True
    )
    p = leaf(d, "list", cmd_dlq_list, "dead letters, oldest first")
    p.add_argument("--limit", type=_count, default=50, help="at most this many (default 50)")
    p = leaf(d, "show", cmd_dlq_show, "every field of one dead letter, with its original fields")
    p.add_argument("id", type=_entry_id)
    requeue = leaf(d, "requeue", cmd_dlq_requeue, "put dead letters back on their source stream, delete them")
    purge = leaf(d, "purge", cmd_dlq_purge, "delete dead letters")
    purge.add_argument("--yes", action="store_true", help="confirm `purge --all`")
    for p in (requeue, purge):
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("id", nargs="?", type=_entry_id, help="the dead letter's entry id")
        which.add_argument("--all", action="store_true", help="every dead letter of the run")
    v = sub.add_parser("verdicts", help="the run's verdict cache").add_subparsers(
        dest="verdicts_command", metavar="ACTION", required=True
    )
    leaf(v, "clear", verdicts.cmd_clear, "delete a finished run's verdict cache ({ps:R}:verdicts); needs --run")
    p = leaf(v, "reasons", verdicts.cmd_reasons, "the newest verdicts counted, the refusals by reason and by rule")
    p.add_argument("--newest", type=_count, default=verdicts.NEWEST, help=f"counted (default {verdicts.NEWEST})")


def _samples(sub, leaf) -> None:
    about = (
        "judged attempts with their problem, text, proof, verdict and the checker's message (with --run-dir: "
        "the run's traces, the whole run; else the streams' last hour)"
    )
    p = leaf(sub, "samples", judged.cmd_samples, about)
    p.add_argument("--version", type=int, help="only this policy version's samples (default: every version)")
    p.add_argument("--verdict", choices=judged.VERDICTS, help="only samples with this verdict (default: any)")
    p.add_argument("--theorem", help="only this theorem id (default: any)")
    p.add_argument("--kind", choices=judged.KINDS, default="all", help="training or held-out samples (default all)")
    p.add_argument(
        "--text",
        type=_regex,
        metavar="REGEX",
        help="only samples whose text, proof or checker's message this regular expression finds "
        "(Python's re; (?i) for any case)",
    )
    p.add_argument("--count", "-n", type=_count, default=10, help="the newest this many that match (default 10)")
    about = "one problem of the run as the verifier judges it: a Countdown target and numbers, a Lean statement"
    p = leaf(sub, "theorem", judged.cmd_theorem, about)
    p.add_argument("id", help="the theorem id (as `ops samples` shows it, e.g. cd-17)")


def _files(sub) -> None:
    """The commands that read run directories: no Redis, no run id."""
    commands = (
        (
            "runs",
            runs.cmd_runs,
            "the runs in a folder: algorithm, status, versions, held-out reward and exact "
            "first -> last, wall time, start (from their files; no Redis)",
        ),
        (
            "compare",
            compare.cmd_compare,
            "runs side by side: their table, the settings they differ in, and one plot "
            "of held-out reward and exact against samples and wall time",
        ),
    )
    for name, fn, about in commands:
        p = sub.add_parser(name, help=about, description=about, parents=[_local()])
        p.set_defaults(local_fn=fn)
        if name == "runs":  # `ops runs docs/results`, as `ls` takes a folder; --dir says the same
            p.add_argument("folder", nargs="?", metavar="DIR", help="the folder of the runs (default runs)")
        p.add_argument("--dir", default="runs", help="the folder of the runs (default runs)")
    p.add_argument("runs", nargs="+", metavar="RUN", help="a run directory, or a run's name under --dir")
    p.add_argument("--plot", metavar="PNG", help="where the plot goes (default: compare.png in --dir)")


# -- running ------------------------------------------------------------------------------------------


async def _run(fn: Command, redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    try:
        return await fn(redis, keys, args)
    finally:
        await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a usage error argparse has already printed
        return int(e.code or 0)
    if getattr(args, "local_fn", None):
        return args.local_fn(args)
    if args.command == "bench":
        if is_cluster_url(getattr(args, "redis_url", None) or ""):
            return fail(
                "the benchmarks measure one Redis server: give --redis-url redis://HOST:PORT of one "
                "(a master of the cluster), or none for a private one",
                2,
            )
        try:
            return args.func(args)
        except NoDevice as e:  # --device cuda where torch sees no GPU: never measured on the CPU instead
            return fail(str(e), 2)
    if getattr(args, "dlq_command", None) == "purge" and args.all and not args.yes:
        return fail("purge --all deletes every dead letter of the run; add --yes to confirm", 2)
    if getattr(args, "verdicts_command", None) == "clear" and not getattr(args, "run", None):
        return fail("verdicts clear deletes a run's verdict cache: name the run with --run R", 2)
    try:
        settings = OpsSettings.from_args(args)
        Keys(settings.run)  # a run id that cannot be a key's hash tag fails here
    except (SettingsError, ValueError) as e:  # ValueError: a run id that cannot be a key's hash tag
        return fail(str(e), 2)
    run_dir = getattr(args, "run_dir", None)
    if args.command_fn is cmd_dashboard and not dashboard.loopback(args.host) and not args.token:
        return fail(f"dashboard on {args.host} would serve the run to the network: give --token T too", 2)
    if run_dir is not None and args.command_fn is judged.cmd_samples:
        return judged.samples_from_run_dir(args)
    if run_dir is None and args.command_fn is cmd_open:
        return fail("open serves a finished local run: name its directory with --run-dir DIR", 2)
    if run_dir is not None:
        if settings.redis_url:
            return fail("--run-dir reads a finished run's own data: give it or --redis-url, not both", 2)
        if args.command_fn is cmd_run and files_only(Path(run_dir).expanduser()):
            return runs.cmd_run_files(args)
        if args.command_fn is cmd_dashboard and files_only(Path(run_dir).expanduser()):
            return _dashboard_of_files(args)
        try:
            with reopen(run_dir) as run:
                named = getattr(args, "run", None) or os.environ.get("PROOFSTREAM_RUN")
                found = None if named else run.only_run()
                update = {"redis_url": run.url} | ({} if found is None else {"run": found})
                return _inspect(args, settings.model_copy(update=update))
        except NoRunData as e:
            return fail(str(e), 2)
    if not settings.redis_url:
        return fail(NO_REDIS, 2)
    return _inspect(args, settings)


def files_only(run_dir: Path) -> bool:
    """The folder keeps a run's files but not its Redis data: a published run (evals/publish.py)."""
    return holds_run(run_dir) and not has_data(run_dir / REDIS)


def _dashboard_of_files(args: argparse.Namespace) -> int:
    """The dashboard of a run kept as its files alone: no Redis to read (ops/views/dashboard.py)."""
    run = runs.from_dir(Path(args.run_dir).expanduser())["run"]

    async def serving() -> int:
        return await dashboard.serve(None, Keys(run), args, _stop_on_signals())

    try:
        return asyncio.run(serving())
    except KeyboardInterrupt:
        return 0


def _inspect(args: argparse.Namespace, settings: OpsSettings) -> int:
    keys = Keys(settings.run)
    args.settings = settings
    try:
        t = settings.timeout_s
        redis = connect(settings.redis_url, socket_connect_timeout=t, socket_timeout=t)
    except ValueError as e:  # from_url: a scheme or a query it does not know
        return fail(f"bad redis url {shown_url(settings.redis_url)!r}: {e}", 2)
    try:
        return asyncio.run(_run(args.command_fn, redis, keys, args))
    except KeyboardInterrupt:
        return 0 if getattr(args, "follow", False) else 130  # Ctrl-C is how --follow ends
    except (rx.ConnectionError, rx.TimeoutError) as e:
        return fail(f"cannot reach Redis at {shown_url(settings.redis_url)}: {e}", 1)
    except rx.ResponseError as e:
        return fail(f"Redis refused: {e}", 1)
    except rx.RedisClusterException as e:  # e.g. a redis+cluster:// URL naming a server without cluster mode
        return fail(f"Redis Cluster at {shown_url(settings.redis_url)}: {e}", 1)
    except dlq.OpsError as e:
        return fail(str(e), 1)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
