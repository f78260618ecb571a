"""`python -m ops dashboard`: one run's live page, served on 127.0.0.1 (`--port`, default 8765).

The page (one HTML file with its script inline: no build step, nothing fetched from elsewhere) asks
`/api/state` every `--refresh-s` seconds and draws: the trainer (version, in flight, counts), its reward,
exact-success and held-out curves, the staleness of the last update, every stream with its groups' lag,
pending and oldest pending, the generators (tokens/s, busy share) and verifiers (utilization, checks,
sandbox restarts), the verdict mix, dead letters by reason with the newest letters' fields, and the latest
judged samples, each opening to its whole text. `/api/state` is the same snapshot as JSON.

It only reads (XRANGE, XLEN, XINFO, XPENDING, HGET*, never a consumer group), so it can watch a live run from
anywhere; `--run-dir DIR` shows a finished local run from its directory (ops.finished). Served by the standard
library's ThreadingHTTPServer in a thread; each request's snapshot is read on the command's event loop with
the command's client. Bound to 127.0.0.1 by default; another `--host` needs `--token`, which every request
must then carry (`?token=` or `Authorization: Bearer`): the page passes its own on.
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

from ops import dlq, inspect
from streams import samples
from streams.keys import Keys

PAGE = Path(__file__).with_name("dashboard.html")
SAMPLES = 40  # the newest judged samples on the page
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


async def snapshot(redis: Redis, keys: Keys) -> dict[str, Any]:
    """Everything the page draws, read from the run's Redis."""
    streams = await inspect.stream_report(redis, keys)
    report = await inspect.run_report(redis, keys, streams)  # its group figures from the same read
    raw_state = await redis.hget(keys.trainer_state, "state")
    evals = orjson.loads(raw_state).get("eval_results", {}) if raw_state else {}
    newest = reversed(await redis.xrevrange(keys.metrics, count=VERSIONS))
    metrics = [orjson.loads(f[b"json"]) for _, f in newest if b"json" in f]
    generators = {k.decode(): orjson.loads(v) for k, v in (await redis.hgetall(keys.generator_stats)).items()}
    verifiers = {k.decode(): orjson.loads(v) for k, v in (await redis.hgetall(keys.verifier_stats)).items()}
    newest = [eid.decode() for eid, _ in await redis.xrevrange(keys.dlq, count=LETTERS)]
    letters = [await dlq.show_letter(redis, keys, eid) for eid in newest]
    return {
        "run": keys.run, "now_ms": report["now_ms"], "trainer": report["trainer"],
        "lease": None if report["lease"] is None else {k: v for k, v in report["lease"].items() if k != "token"},
        "metrics": metrics, "evals": {str(v): r for v, r in sorted(evals.items(), key=lambda kv: int(kv[0]))},
        "streams": streams["streams"], "redis_version": streams["redis_version"],
        "generators": generators, "verifiers": verifiers, "dead_letters": report["dead_letters"],
        "letters": letters, "samples": await samples.from_redis(redis, keys, SAMPLES),
    }  # fmt: skip


class Dashboard:
    """The HTTP side: a ThreadingHTTPServer whose handlers read snapshots on the command's event loop."""

    def __init__(self, redis: Redis, keys: Keys, loop: asyncio.AbstractEventLoop, *, host: str, port: int,
                 token: str | None, refresh_s: float) -> None:  # fmt: skip
        self.redis, self.keys, self.loop = redis, keys, loop
        self.token, self.refresh_s = token, refresh_s
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

    def state(self) -> bytes:
        with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < SNAPSHOT_TTL_S:
                return self._cached[1]
            future = asyncio.run_coroutine_threadsafe(snapshot(self.redis, self.keys), self.loop)
            body = orjson.dumps(future.result(timeout=30))
            self._cached = (time.monotonic(), body)
            return body

    def answer(self, request: http.server.BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(request.path)
        if self.token is not None and not self._authorized(request, url):
            return self._send(request, 401, b"a token is needed: ?token=... or Authorization: Bearer ...", "text/plain")
        if url.path == "/":
            page = PAGE.read_bytes().replace(b"__REFRESH_MS__", str(int(self.refresh_s * 1000)).encode())
            return self._send(request, 200, page, "text/html; charset=utf-8")
        if url.path == "/api/state":
            try:
                body = self.state()
            except Exception as e:  # noqa: BLE001 - Redis away, a timeout: the page shows it and asks again
                return self._send(request, 503, orjson.dumps({"error": f"{type(e).__name__}: {e}"}), "application/json")
            return self._send(request, 200, body, "application/json")
        return self._send(request, 404, b"not found", "text/plain")

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


async def serve(redis: Redis, keys: Keys, args: argparse.Namespace, stop: asyncio.Event) -> int:
    """Serve until `stop` is set (Ctrl-C, SIGTERM)."""
    dashboard = Dashboard(redis, keys, asyncio.get_running_loop(), host=args.host, port=args.port,
                          token=args.token, refresh_s=args.refresh_s)  # fmt: skip
    shown = dashboard.url + (f"?token={args.token}" if args.token else "")
    print(f"dashboard of run {keys.run!r} at {shown} (Ctrl-C to stop)", flush=True)
    dashboard.serve()
    try:
        await stop.wait()
    finally:
        await asyncio.to_thread(dashboard.close)
    return 0
