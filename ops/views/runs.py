"""Runs as a user looks for them: one run's result (trainer/result.py) read from its Redis or from its
directory, and the runs a folder holds (`python -m ops runs`; side by side: ops/views/compare.py).

From a directory, without any Redis (streams/run_dir.py names its files): `run.json` (what the trainer runs
and since when; written at each start), `report.json` (written at the end: the settings, version, counts,
evaluations, wall time), `metrics.jsonl` (versions, evaluations, their times). A run's status:
- finished / interrupted: its report.json is newer than its run.json (the trainer ended and said how);
- live: no such report, and the trainer process run.json names is alive on this host;
- interrupted: no such report and no such process (killed, or its machine went away).
"""

from __future__ import annotations

import argparse
import socket
import time
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio import Redis

from ops.views import text
from streams import learned
from streams.keys import Keys
from streams.run_dir import (
    INFO,
    METRICS,
    PARTS,
    REPORT,
    eval_records,
    holds_run,
    newest_update,
    read_json,
    read_records,
    update_records,
)
from trainer import result
from trainer.curves import samples_used


def alive(info: dict[str, Any]) -> bool:
    """The trainer run.json names is still running here: same host, its pid a live `trainer` process."""
    if info.get("host") != socket.gethostname() or not isinstance(info.get("pid"), int):
        return False
    try:
        cmdline = Path(f"/proc/{info['pid']}/cmdline").read_bytes()
    except OSError:
        return False
    return b"trainer" in cmdline  # a pid reused by another program is not the run's trainer


# -- one run --------------------------------------------------------------------------------------------


def from_dir(run_dir: Path, now: float | None = None, with_answers: bool = False) -> dict[str, Any] | None:
    """A run's result from its directory's files, with its verdict (streams/learned.py: the per-problem figures
    of its evaluations' records in metrics.jsonl); `with_answers`: also what the answers were at the first and
    last evaluation (from its traces: a read `ops runs` does not make for every run). None where the folder
    holds no run."""
    info, report = read_json(run_dir / INFO), read_json(run_dir / REPORT)
    records = read_records(run_dir)
    if info is None and report is None and not records:
        return None
    started = (info or {}).get("started")
    ended = report is not None and (started is None or (run_dir / REPORT).stat().st_mtime >= started)
    source = report if ended else info or report or {}
    settings = source.get("settings") or {}
    settings = {**settings, "run": settings.get("run") or run_dir.name}
    updates = update_records(records)
    if ended:
        version, counts, evals, wall_s = (
            report.get("version"),
            report.get("counts") or {},
            report.get("evals") or {},
            report.get("wall_s"),
        )
        reached = report.get("time_up") or (version or 0) >= int(settings.get("iterations") or 0)  # or its budget
        done = not report.get("interrupted") and bool(reached)
        status = "finished" if done else "interrupted"
        if started is None and wall_s is not None and not report.get("reconstructed_from"):
            # a run without run.json: its report's time less its wall (a rebuilt report's time is the rebuild's)
            started = (run_dir / REPORT).stat().st_mtime - wall_s
    else:
        version = max((int(r["version"]) for r in updates), default=0)
        counts = {"samples": samples_used(records)}
        evals = {r["version"]: r for r in eval_records(records)}
        status = "live" if info and alive(info) else "interrupted"
        last = max((r.get("time", 0) for r in records), default=None)
        wall_s = None if status == "live" or started is None or not last else last - started
    evals = learned.with_problems(evals, records)
    out = result.summary(
        settings,
        version=version,
        counts=counts,
        evals=evals,
        status=status,
        started=started,
        wall_s=wall_s,
        update_times=[r["time"] for r in updates if "time" in r],
        now=now,
        eval_s=eval_time(records),
        answers=learned.answers(run_dir, learned.ends(evals)) if with_answers else (),
        prompt=(report or {}).get("prompt") or (info or {}).get("prompt"),
        last_update=newest_update(updates),
    )
    out["dir"] = str(run_dir)
    out["reconstructed_from"] = source.get("reconstructed_from")  # evals/publish.py: not the trainer's own files
    return out


def local_dir(info: dict[str, Any], settings: dict[str, Any]) -> Path | None:
    """The run directory of a run whose trainer runs on this host, where it can be found from here (its
    `run_dir` setting, else runs/<run>): a live run read from its Redis gets its evaluations' per-problem
    figures and answers from there. None elsewhere."""
    if info.get("host") != socket.gethostname():
        return None
    folder = Path(settings.get("run_dir") or Path("runs") / str(settings.get("run") or "")).expanduser()
    return folder if holds_run(folder) else None


def eval_time(records: list[dict[str, Any]]) -> float | None:
    """The newest evaluation's time from issue to landing (`took_s`), for the ETA's final evaluation."""
    return next((r["took_s"] for r in reversed(eval_records(records)) if r.get("took_s")), None)


async def from_redis(redis: Redis, keys: Keys, run_dir: Path | None = None) -> dict[str, Any] | None:
    """A run's result from its Redis (the trainer's state, `{ps:R}:run`, the metrics stream, the lease), with
    its report.json where the run directory is known. None where the Redis holds no state for the run."""
    raw_state = await redis.hget(keys.trainer_state, "state")
    if raw_state is None:
        return None
    state = orjson.loads(raw_state)
    raw_info = await redis.get(keys.run_info)
    info = orjson.loads(raw_info) if raw_info else (read_json(run_dir / INFO) if run_dir else None) or {}
    report = read_json(run_dir / REPORT) if run_dir else None
    settings = info.get("settings") or (report or {}).get("settings") or {"run": keys.run, "algo": state.get("algo")}
    newest = [orjson.loads(f[b"json"]) for _, f in await redis.xrevrange(keys.metrics, count=8) if b"json" in f]
    times = [m.get("time") for m in newest]
    if state.get("finished"):
        status = "finished"
    elif await redis.exists(keys.trainer_lease) and run_dir is None:
        status = "live"  # a copy of a finished run's data (--run-dir) is never live, even with a lease left in it
    else:
        status = "interrupted"
    started, ended = info.get("started"), info.get("ended")
    wall_s = None
    if status != "live":  # the trainer's own measure, else from the end it recorded in {ps:R}:run
        wall_s = (report or {}).get("wall_s") or (ended - started if ended and started else None)
    if started is None and report and wall_s is not None:  # a run without run.json: its report's time less its wall
        started = (run_dir / REPORT).stat().st_mtime - wall_s
    files_at = run_dir or local_dir(info, settings)
    records = read_records(files_at) if files_at else []  # the evaluations' per-problem figures, their times
    evals = learned.with_problems(state.get("eval_results") or {}, records)
    out = result.summary(
        settings,
        version=state.get("version"),
        counts=state.get("counts") or {},
        evals=evals,
        status=status,
        started=started,
        wall_s=wall_s,
        update_times=[t for t in times if t],
        eval_s=eval_time(records),
        answers=learned.answers(files_at, learned.ends(evals)) if files_at else (),
        prompt=info.get("prompt") or (report or {}).get("prompt"),
        last_update=newest[0] if newest else newest_update(update_records(records)),
    )
    out["dir"] = str(run_dir) if run_dir else None
    return out


# -- a folder of runs -----------------------------------------------------------------------------------


def find(folder: Path) -> list[Path]:
    """The run directories under `folder` (itself included): those holding run.json, report.json or
    metrics.jsonl, at any depth (evals.es_vs_grpo keeps its runs in OUT/seed<K>/<algo>, sweeps in
    DIR/cells/...)."""
    found, todo = [], [folder]
    while todo:
        here = todo.pop()
        if holds_run(here):
            found.append(here)
        try:
            children = sorted(p for p in here.iterdir() if p.is_dir() and p.name not in PARTS)
        except OSError:
            continue
        todo += [c for c in children if not c.name.startswith(".")]
    return found


def no_run(folder: Path) -> str:
    """Why a folder holding no run is not one, in words: an experiment's summary whose runs were not kept (a
    compare.json or sweep.json, nothing below it), else no run's files at all."""
    summaries = sorted(p.name for p in folder.glob("*.json") if p.name.startswith(("compare.", "sweep.")))
    if summaries:
        return (
            f"{folder} holds no run: only an experiment's summary ({', '.join(summaries)}), its runs' files were "
            "not kept"
        )
    return f"{folder} holds no run (no {INFO}, {REPORT} or {METRICS} in it or below it)"


def listing(folder: Path) -> list[dict[str, Any]]:
    """Every run under `folder`, oldest start first, each with its result and its name relative to `folder`."""
    rows = []
    now = time.time()
    for run_dir in find(folder):
        r = from_dir(run_dir, now)
        if r is not None:
            r["name"] = str(run_dir.relative_to(folder)) if run_dir != folder else run_dir.name
            rows.append(r)
    return sorted(rows, key=lambda r: (r["started"] or 0, r["name"]))


# -- the commands (no Redis) ---------------------------------------------------------------------------


def cmd_runs(args: argparse.Namespace) -> int:
    folder = Path(getattr(args, "folder", None) or args.dir).expanduser()
    if not folder.is_dir():
        return text.fail(f"{folder} does not exist: name the folder of the runs (`ops runs DIR`; default runs)", 2)
    found = listing(folder)
    text.emit(args, {"dir": str(folder), "runs": found, "none": None if found else no_run(folder)}, text.runs)
    return 0


def cmd_run_files(args: argparse.Namespace) -> int:
    """`ops run --run-dir DIR` where DIR keeps a run's files but no Redis data (a published run,
    evals/publish.py): its result from the files; the health figures lived in the Redis that was not kept."""
    r = from_dir(Path(args.run_dir).expanduser(), with_answers=True)
    text.emit(args, {"result": r, "health": None}, text.run_files)
    return 0
