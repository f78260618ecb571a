"""What every bench shares: its place under `python -m ops bench`, the flags several take, where its Redis
comes from, and its ending.

The ending is the same for all: a one-line summary on stderr (left out under `--json`), then the result as one
JSON object on the last line of stdout (and in the file `--out` names, if any), exit status 0. A
bench that cannot run as asked says why on stderr as `bench NAME: ...` and exits 2 (bad usage) or 1 (it
failed while measuring); stopped by Ctrl-C, 130. A bench module holds `bench` (the measurement; `measure`
around it where it needs a Redis, or a signal turned into Ctrl-C), `summary` (its line) and `add_parser` (its
flags, through `add_bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from streams.connect import connect_sync
from streams.embedded import EmbeddedRedis
from streams.keys import Keys
from weights.device import NoDevice

DEVICES = ("auto", "cpu", "cuda")
T = TypeVar("T")


def add_bench(
    sub: argparse._SubParsersAction,
    name: str,
    about: str,
    measure: Callable[[argparse.Namespace], dict[str, Any]],
    summary: Callable[[dict[str, Any]], str],
    *,
    description: str | None = None,
    usage: Callable[[argparse.Namespace], str | None] | None = None,
) -> argparse.ArgumentParser:
    """The bench's parser; `python -m ops bench NAME` then runs it (`run`). `measure(args)`: the bench, its
    result; `summary(result)`: its line; `usage(args)`: why these flags cannot run, or None. `description`: a
    long help (the module docstring), shown as written."""
    extra = {"description": description, "formatter_class": argparse.RawDescriptionHelpFormatter} if description else {}
    p = sub.add_parser(name, help=about, **extra)
    p.set_defaults(func=lambda args: run(args, name, measure, summary, usage))
    return p


def run(
    args: argparse.Namespace,
    name: str,
    measure: Callable[[argparse.Namespace], dict[str, Any]],
    summary: Callable[[dict[str, Any]], str],
    usage: Callable[[argparse.Namespace], str | None] | None = None,
) -> int:
    """A bench from its flags to its ending (module docstring). Ctrl-C (or a SIGTERM a bench turns into one)
    ends it with 130; a RuntimeError but NoDevice (the cli's: usage, 2) is a failure while measuring, 1."""
    if why := (usage(args) if usage is not None else None) or _unwritable(getattr(args, "out", "")):
        return refuse(name, why, 2)
    try:
        result = measure(args)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    except NoDevice:
        raise
    except RuntimeError as e:
        return refuse(name, str(e), 1)
    return finish(args, result, summary)


def _unwritable(out: str) -> str | None:
    """Why the file `--out` names cannot be written, or None: asked before measuring, so that a mistyped
    folder costs no measurement."""
    if not out:
        return None
    path = Path(out)
    if path.is_dir():
        return f"--out {out} is a folder: name a file in it"
    if not path.parent.is_dir():
        return f"--out {out}: there is no folder {path.parent}"
    if not os.access(path.parent, os.W_OK):
        return f"--out {out}: the folder {path.parent} is not writable"
    return None


def add_device(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--device", default="auto", choices=DEVICES, help=f"{what} (default auto: cuda when torch sees a GPU)"
    )


def add_engine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", default="hf", help="hf, vllm or auto (default hf)")


def add_model(p: argparse.ArgumentParser, gguf: bool = True) -> None:
    kinds = "model folder, .gguf or Hugging Face id" if gguf else "model folder or Hugging Face id"
    p.add_argument("--model", default=None, help=f"{kinds} (default SmolLM2-135M)")


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: the library's default)")


def add_ending(p: argparse.ArgumentParser, *, redis: bool = False) -> None:
    """The flags every bench ends with: `--out`, `--redis-url` (where it uses a Redis), `--json`. SUPPRESS: a
    `--redis-url` or `--json` given before the command (`python -m ops --json bench wire`) is kept rather than
    reset by the command's default."""
    p.add_argument("--out", default="", help="also write the JSON line to this file (e.g. under docs/results)")
    if redis:
        p.add_argument("--redis-url", default=argparse.SUPPRESS, help="a Redis to use (default: a private one)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print only the JSON line")


def on_redis(args: argparse.Namespace, measure: Callable[[str], T]) -> T:
    """`measure(url)` on `--redis-url`, or on a private redis-server started for it and stopped after."""
    url = getattr(args, "redis_url", None)
    if url:
        return measure(url)
    with EmbeddedRedis(appendfsync="everysec") as server:
        return measure(server.url)


def machine(load_before: float) -> dict[str, Any]:
    """The machine a bench shared: its CPUs and its 1-minute load average before the bench (`load_before`,
    `os.getloadavg()[0]` then) and now, so a reader can tell a busy machine's figures from a quiet one's."""
    return {
        "cpus": os.cpu_count(),
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


def delete_run(url: str, run: str) -> None:
    """Delete the bench's run's keys, so a bench against a shared Redis leaves nothing behind."""
    client = connect_sync(url)
    try:
        names = list(client.scan_iter(match=f"{Keys(run).prefix}:*", count=1000))  # braces are not glob characters
        for i in range(0, len(names), 500):
            client.delete(*names[i : i + 500])
    finally:
        client.close()


def finish(args: argparse.Namespace, result: dict[str, Any], summary: Callable[[dict[str, Any]], str]) -> int:
    """The ending (module docstring): `summary(result)` on stderr unless `--json`, the JSON line on stdout and
    in `--out`."""
    line = orjson.dumps(result).decode()
    if getattr(args, "out", ""):
        Path(args.out).write_text(line + "\n")
    if not getattr(args, "json", False):
        print(summary(result), file=sys.stderr)
    print(line)
    return 0


def refuse(name: str, why: str, code: int) -> int:
    """`bench NAME: why` on stderr; the exit status `code` (2: bad usage, 1: failed while measuring)."""
    print(f"bench {name}: {why}", file=sys.stderr)
    return code
