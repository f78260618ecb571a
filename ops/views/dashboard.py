"""`python -m ops dashboard`: one run's page, served on 127.0.0.1 (`--port`, default 8765).

The page (one HTML file with its script inline: no build step, nothing fetched from elsewhere) asks the API
every `--refresh-s` seconds and draws, first, whether the run learned: its result (trainer/result.py: what ran,
how far, the held-out evaluation first -> last and best, the verdict with its noise and the most common answers
(streams/learned.py), Countdown's credit by part, the samples (an ES run's against the paper's budget, and its
last update's member spread), the wall time or ETA, how to read the numbers) and a chart of the members' reward
and exact success beside the held-out reward and exact success (axes with values, a tooltip on every point, x by
version, training samples or minutes, the PNG plots' colours), with a run selector over the runs `ops runs`
finds (`--dir`) and a second run to overlay; a chart of Countdown's credit by part (format, expression, numbers,
closeness, solved: held-out solid, training dashed); the throughput over time (generated tokens/s, checks/s);
then the trainer's counts, the staleness of the last update, every stream with its groups, the generators and
verifiers, the verdict mix, dead letters by kind with the newest ones' fields, and the judged samples, filtered
by verdict, version, kind and a regular expression, each opening to its problem, the model's text, the proof
judged and the checker's message.

API (JSON): `/api/state` the served run's snapshot; `/api/samples?verdict=&version=&kind=&text=&n=` samples
(the run's traces with `--run-dir`, else the newest rewards in Redis) with their problems; `/api/runs` the
runs under `--dir`; `/api/run?name=N` one of them from its files (result and curves).

It only reads (XRANGE, XLEN, XINFO, XPENDING, HGET*, never a consumer group), so it can watch a live run from
anywhere; `--run-dir DIR` shows a finished local run from its directory (streams/run_redis.py), and a run
kept as its files alone (published: evals/publish.py) from those files, without the roles' figures. Served
by the standard library's ThreadingHTTPServer in a thread; each request's Redis reads run on the command's
event loop with the command's client. Bound to 127.0.0.1 by default; another `--host` needs `--token`, which
every request must then carry (`?token=` or `Authorization: Bearer`): the page passes its own on.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import http.server
import ipaddress
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio import Redis

from ops.views import dlq, inspect, judged, runs, verdicts
from streams import role_stats, samples
from streams.keys import Keys
from streams.run_dir import METRICS, eval_records, read_records, update_records
from trainer.run_plots import COLORS

PAGE = Path(__file__).with_name("dashboard.html")
SAMPLES = 40  # judged samples on the page: the newest that match its filters
VERSIONS = 1_000  # the newest versions' metrics in the chart (each ~1-2 KB, read every refresh)
LETTERS = 10  # the newest dead letters shown with their fields
SNAPSHOT_TTL_S = 0.5  # several tabs (or a fast refresh) share one read of Redis


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def series(records: list[dict[str, Any]], evals: dict[Any, dict[str, Any]], started: float | None) -> dict[str, Any]:
    """What the charts draw: per update its version, training samples so far, minutes since the trainer's start,
    members' reward and exact, throughput, Countdown's credit by part; per evaluation the same x and its held-out
    figures (by part too). An evaluation
    without a time of its own (the trainer's state keeps none) sits at its version's update."""
    minutes = lambda t: None if t is None or started is None else round((t - started) / 60, 3)  # noqa: E731
    updates = []
    for r in sorted(update_records(records), key=lambda r: r["version"]):
        updates.append(
            {
                "version": r["version"],
                "samples": r.get("samples"),
                "minutes": minutes(r.get("time")),
                **{k: r.get(k) for k in ("reward_mean", "pass_rate", "rewards_per_s", "generator_tokens_per_s")},
                "parts": r.get("parts"),  # Countdown's credit by part over the attempts used
            }
        )
    at = {0: (0, 0.0 if started is not None else None)} | {u["version"]: (u["samples"], u["minutes"]) for u in updates}
    points = []
    for version, e in sorted(evals.items(), key=lambda kv: int(kv[0])):
        samples_at, minutes_at = at.get(int(version), (None, None))
        problems = int(e.get("problems") or 0)
        own = minutes(e.get("time"))
        points.append(
            {
                "version": int(version),
                "samples": samples_at,
                "minutes": minutes_at if own is None else own,
                "held_out_reward": e["held_out_reward"],
                "held_out_exact": e["held_out_exact"],
                "solved": round(e["held_out_exact"] * problems),
                "problems": problems,
                "parts": e.get("held_out_parts"),
            }
        )
    return {"updates": updates, "evals": points}


async def snapshot(redis: Redis, keys: Keys, run_dir: Path | None = None) -> dict[str, Any]:
    """Everything the page draws of the served run, read from its Redis (its files too, with `--run-dir`)."""
    streams = await inspect.stream_report(redis, keys)
    report = await inspect.run_report(redis, keys, streams)  # its group figures from the same read
    result = await runs.from_redis(redis, keys, run_dir)
    if run_dir is not None:
        streams, report = inspect.without_idle(streams), inspect.without_idle(report)
    raw_state = await redis.hget(keys.trainer_state, "state")
    evals = orjson.loads(raw_state).get("eval_results", {}) if raw_state else {}
    newest = reversed(await redis.xrevrange(keys.metrics, count=VERSIONS))
    metrics = [orjson.loads(f[b"json"]) for _, f in newest if b"json" in f]
    if run_dir is not None and (run_dir / METRICS).is_file():  # the file also has the evaluations' times
        records = read_records(run_dir)
        metrics, evals = update_records(records), {r["version"]: r for r in eval_records(records)} or evals
    generators, verifiers = await role_stats.generators(redis, keys), await role_stats.verifiers(redis, keys)
    newest = [eid.decode() for eid, _ in await redis.xrevrange(keys.dlq, count=LETTERS)]
    letters = [await dlq.show_letter(redis, keys, eid) for eid in newest]
    return {
        "run": keys.run,
        "now_ms": report["now_ms"],
        "result": result,
        "trainer": report["trainer"],
        "lease": None if report["lease"] is None else {k: v for k, v in report["lease"].items() if k != "token"},
        "last_metrics": metrics[-1] if metrics else {},
        "series": series(metrics, evals, result["started"] if result else None),
        "colors": COLORS,
        "streams": streams["streams"],
        "redis_version": streams["redis_version"],
        "idle_kept": run_dir is None,
        "generators": generators,
        "verifiers": verifiers,
        "dead_letters": report["dead_letters"],
        "letters": letters,
        "alert": report["alert"],  # the run makes no progress, and why (trainer/progress.py)
        "refusals": await verdicts.reasons(redis, keys),  # the newest verdicts, refusals by reason and rule
    }


async def samples_of(redis: Redis, keys: Keys, run_dir: Path | None, filters: judged.Filters, count: int) -> dict:
    """The samples the page's filters pick: from the run's traces (the whole run) where it has them, else from
    the newest rewards in Redis; each with its problem."""
    if run_dir is not None and (run_dir / samples.FOLDER).is_dir():
        found, source = samples.read_dir(run_dir, filters.version), "the run's traces"
    else:
        scan = judged.SCAN_REWARDS  # without traces (a live run): the newest rewards, as `ops samples` reads them
        found, source = await samples.from_redis(redis, keys, scan), f"the newest {scan} rewards"
    matched, shown = judged.pick(found, filters, count)
    return {"source": source, "matched": matched, "samples": await judged.with_problems(redis, keys, shown)}


def other_run(folder: Path, name: str) -> dict[str, Any] | None:
    """A run under `folder` (one `ops runs` lists: no other path is read) from its files: result and series."""
    listed = next((r for r in runs.listing(folder) if r["name"] == name), None)
    if listed is None:
        return None
    wanted = runs.from_dir(Path(listed["dir"]), with_answers=True) | {"name": name}
    records = read_records(Path(wanted["dir"]))
    evals = {r["version"]: r for r in eval_records(records)}
    return {"result": wanted, "series": series(records, evals, wanted["started"])}


def sample_filters(query: dict[str, list[str]]) -> tuple[judged.Filters, int]:
    """The page's filters from a query string; ValueError naming a bad one."""
    one = {k: v[0] for k, v in query.items() if v and v[0] != ""}
    version = int(one["version"]) if "version" in one else None
    verdict, kind = one.get("verdict"), one.get("kind", "all")
    if verdict not in (None, *judged.VERDICTS) or kind not in judged.KINDS:
        raise ValueError(f"verdict {verdict!r} or kind {kind!r} is not one the page offers")
    text = judged.regex(one["text"]) if "text" in one else None
    return judged.Filters(version, verdict, None, kind, text), min(int(one.get("n", SAMPLES)), 500)


def files_snapshot(run_dir: Path) -> dict[str, Any]:
    """The served run's state where it is kept as its files alone (a published run, evals/publish.py): its
    result and curves, from its files; the figures of its roles (trainer, streams, generators, verifiers, dead
    letters) lived in a Redis that was not kept, and are left empty."""
    result = runs.from_dir(run_dir, with_answers=True)
    records = read_records(run_dir)
    metrics, evals = update_records(records), {r["version"]: r for r in eval_records(records)}
    return {
        "run": result["run"],
        "now_ms": int(time.time() * 1000),
        "result": result,
        "trainer": None,
        "lease": None,
        "last_metrics": metrics[-1] if metrics else {},
        "series": series(metrics, evals, result["started"]),
        "colors": COLORS,
        "streams": {},
        "redis_version": None,
        "idle_kept": False,
        "generators": {},
        "verifiers": {},
        "dead_letters": {"total": "not kept", "by_reason": {}},
        "letters": [],
        "alert": None,
        "refusals": None,
    }


class Dashboard:
    """The HTTP side: a ThreadingHTTPServer whose handlers read snapshots on the command's event loop."""

    def __init__(
        self,
        redis: Redis | None,
        keys: Keys,
        loop: asyncio.AbstractEventLoop,
        *,
        host: str,
        port: int,
        token: str | None,
        refresh_s: float,
        run_dir: Path | None = None,
        runs_dir: Path | None = None,
    ) -> None:
        self.redis, self.keys, self.loop = redis, keys, loop  # redis None: a run kept as its files alone
        self.token, self.refresh_s = token, refresh_s
        self.run_dir, self.runs_dir = run_dir, runs_dir
        self._cached: tuple[float, bytes] | None = None
        self._lock = threading.Lock()
        dashboard = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                dashboard.answer(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: one line a refresh
                return

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}/"

    def serve(self) -> threading.Thread:
        thread = threading.Thread(target=self.server.serve_forever, name="dashboard", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _on_loop(self, coroutine) -> Any:
        """Run a Redis read on the command's loop (the client belongs to it) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def state(self) -> bytes:
        with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < SNAPSHOT_TTL_S:
                return self._cached[1]
            if self.redis is None:  # a run kept as its files alone
                body = orjson.dumps(files_snapshot(self.run_dir))
            else:
                body = orjson.dumps(self._on_loop(snapshot(self.redis, self.keys, self.run_dir)))
            self._cached = (time.monotonic(), body)
            return body

    def api(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        """(status, document) of an API path."""
        if path == "/api/samples":
            try:
                filters, count = sample_filters(query)
            except ValueError as e:
                return 400, {"error": str(e)}
            if self.redis is None and not (self.run_dir / samples.FOLDER).is_dir():
                return 200, {"source": "not kept (the run's files alone)", "matched": 0, "samples": []}
            return 200, self._on_loop(samples_of(self.redis, self.keys, self.run_dir, filters, count))
        if path == "/api/runs":
            folder = self.runs_dir
            listed = runs.listing(folder) if folder is not None and folder.is_dir() else []
            return 200, {"dir": None if folder is None else str(folder), "served": self.keys.run, "runs": listed}
        if path == "/api/run":
            found = other_run(self.runs_dir, query.get("name", [""])[0]) if self.runs_dir else None
            return (200, found) if found else (404, {"error": "no such run under the dashboard's --dir"})
        return 404, {"error": "not found"}

    def answer(self, request: http.server.BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(request.path)
        if self.token is not None and not self._authorized(request, url):
            return self._send(request, 401, b"a token is needed: ?token=... or Authorization: Bearer ...", "text/plain")
        if url.path == "/":
            page = PAGE.read_bytes().replace(b"__REFRESH_MS__", str(int(self.refresh_s * 1000)).encode())
            return self._send(request, 200, page, "text/html; charset=utf-8")
        try:
            if url.path == "/api/state":
                status, body = 200, self.state()
            else:
                status, doc = self.api(url.path, urllib.parse.parse_qs(url.query))
                body = orjson.dumps(doc)
        except Exception as e:  # noqa: BLE001 - Redis away, a timeout: the page shows it and asks again
            return self._send(request, 503, orjson.dumps({"error": f"{type(e).__name__}: {e}"}), "application/json")
        return self._send(request, status, body, "application/json")

    def _authorized(self, request: http.server.BaseHTTPRequestHandler, url: urllib.parse.SplitResult) -> bool:
        given = urllib.parse.parse_qs(url.query).get("token", [""])[0]
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            given = header[len("Bearer ") :]
        return hmac.compare_digest(given.encode(), self.token.encode())

    @staticmethod
    def _send(request: http.server.BaseHTTPRequestHandler, status: int, body: bytes, kind: str) -> None:
        request.send_response(status)
        request.send_header("Content-Type", kind)
        request.send_header("Content-Length", str(len(body)))
        request.send_header("Cache-Control", "no-store")
        request.end_headers()
        request.wfile.write(body)


async def serve(redis: Redis | None, keys: Keys, args: argparse.Namespace, stop: asyncio.Event) -> int:
    """Serve until `stop` is set (Ctrl-C, SIGTERM)."""
    run_dir = Path(args.run_dir).expanduser() if getattr(args, "run_dir", None) else None
    runs_dir = Path(args.dir).expanduser() if args.dir else (run_dir.parent if run_dir else Path("runs"))
    dashboard = Dashboard(
        redis,
        keys,
        asyncio.get_running_loop(),
        host=args.host,
        port=args.port,
        token=args.token,
        refresh_s=args.refresh_s,
        run_dir=run_dir,
        runs_dir=runs_dir,
    )
    shown = dashboard.url + (f"?token={args.token}" if args.token else "")
    print(f"dashboard of run {keys.run!r} at {shown} (Ctrl-C to stop)", flush=True)
    dashboard.serve()
    try:
        await stop.wait()
    finally:
        await asyncio.to_thread(dashboard.close)
    return 0
