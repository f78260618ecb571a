"""The `kimina` backend: Lean checked by an existing kimina-lean-server (project-numina) over HTTP.

Written from reading project-numina/kimina-lean-server at fb2393de (2026-01-11, version string 2.0.0;
server/split.py, server/routers/check.py, server/auth.py, client/kimina_client/models.py), then run against
the released server 2.1.3 (PyPI `kimina-ast-server`, its REPLs a REPL stand-in:
tests/verifier_pool/test_kimina_server.py; docs/VERIFIER.md has each case's verdict). What 2.1.3 showed
that reading had not: it answers in the body's lines (Positions); no REPL free within its max_wait is a
per-snippet `No available REPLs` and a REPL that crashes or answers non-JSON a per-snippet `Snippet
execution failed: ...`, both inside HTTP 200, never 429 or 500 (both `error` here); a request we stop
waiting for keeps its REPL until the server's own timeout, on /verify and /api/check alike.

The server pools REPLs itself: it splits each snippet into its leading blank and `import` lines (one REPL per
import header, the header elaborated once) and the rest, the body, which runs as one command with `env: 0` on
top of that header (`split_snippet`). We do not use its validity test
(docs/brief/LEAN_REPL.md, "Known weaknesses"): we send text assembled from trusted parts and judge the REPL
response it relays with `lean_check`, as LeanChecker does:

- code = theorem.header + blank lines (see Positions) + `lean_check.prepare(proof, statement)` +
  `#print axioms NAME` on a last line of its own. `prepare`'s rejections cost no server time.
- The server offers no env handle to send a second command to, so the axioms check rides in the same
  snippet and messages are attributed by position (`judge_result`): every message counts for
  `judge_command` (an error or a sorry anywhere fails the proof: a proof that does not parse to its end
  puts its error on the `#print` line), and the axioms report is read only from the line of the appended
  command. So an error of the `#print axioms` command itself (`unknown constant`) is `lean_error` here where
  LeanChecker says `integrity`: a rejection either way.
- Concurrent checks from all consumer tasks of a process share one `KiminaClient`, which sends the snippets
  that arrive within `batch_window_ms` in one POST (at most `max_batch`).

Positions: servers answer in one of two conventions. Up to PR #56 (e2cdc1f, 2025-10-24) a message's line counts
the body's lines ("body"); since then the repository's `_apply_header_offset` adds the number of header lines
the split cut off ("snippet": lines of the whole snippet). The released 2.1.3 has no such offset: "body".
`Layout` says why we can tell them apart from every answer, and `judge_result` why a wrong guess can never
make a `proved`.

Auth: with `api_key`, every POST carries `Authorization: Bearer <key>`, as kimina's own client sends it; the
server (`require_key`, when it has LEAN_SERVER_API_KEY) strips `Bearer ` and compares, and answers 401 to a
missing or different key (`GET /health` needs none). A 401 or 403 is infrastructure (`error`) with one log
line saying whether the key is missing or refused. The key is never logged nor put in a verdict's detail.

Classification: a result whose `error` says the command `timed out` is the proof's `timeout`; a header that
timed out, any other per-snippet error (the REPL died or answered garbage, ran out of memory, no REPL free),
HTTP 401/403 (key), 429 (no REPL free, from servers or proxies that say so), 5xx, an unreachable server or an
answer outside the API (cut short, not JSON) is `error` (infrastructure: retried later, never a reward of 0).
A whole request that fails with HTTP 500 (a server that fails the request when one snippet breaks its REPL;
2.1.3 answers that snippet alone) is sent again one snippet per request, so only the snippet that breaks it
gets `error`.

The checker also answers for `checker.sandbox` (start: GET /health; kill: close the client; stats), which is
what the consumer service starts, kills and counts: here the server is the sandbox.

One file, over 400 lines, because it is one client of one server: batching, positions and the reading of
the server's replies depend on each other.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import structlog

from streams.theorems import Theorem
from tasks import lean_proof
from verifier_pool import lean_check
from verifier_pool.checkers import JUDGING_DIGEST
from verifier_pool.judgement import Judgement
from verifier_pool.lean_audit import SecondLine
from verifier_pool.sandbox import SandboxStats, SandboxUnavailable

log = structlog.get_logger("verifier_pool.kimina")

PATHS = {"verify": "/verify", "check": "/api/check"}  # 2.0.0 and 2.1.3 serve both; /verify is the older one
DETAIL_CHARS = 300
AUTH_REFUSED = (401, 403)  # kimina's require_key answers 401; a proxy in front of it may say 403
AUTH_MISSING = (
    "kimina refused the request (HTTP {status}): the server requires an API key and none is set: "
    "set PROOFSTREAM_KIMINA_API_KEY to the server's LEAN_SERVER_API_KEY"
)
AUTH_WRONG = (
    "kimina refused the request (HTTP {status}): it does not accept the configured key: "
    "PROOFSTREAM_KIMINA_API_KEY must equal the server's LEAN_SERVER_API_KEY"
)
NO_IMPORTS = (
    "kimina-lean-server runs a snippet without leading imports on top of whatever its shared env 0 holds "
    "(another request's declarations): give the theorem a header that starts with its imports"
)


class KiminaUnavailable(SandboxUnavailable):
    """The server gave no result for a snippet: unreachable, HTTP 401/403, 429, 5xx, or an answer outside its
    API (cut short, not JSON). Infrastructure: the attempt is retried later, never a reward of 0."""

    def __init__(self, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.status = status


@dataclass(slots=True)
class _Job:
    code: str
    result: asyncio.Future[dict[str, Any]]


def _settle(job: _Job, result: dict[str, Any] | KiminaUnavailable) -> None:
    if job.result.done():  # the caller gave up (cancelled)
        return
    if isinstance(result, KiminaUnavailable):
        job.result.set_exception(result)
    else:
        job.result.set_result(result)


class KiminaClient:
    """HTTP client and batcher, shared by every checker of a process (see `shared_client`).

    `verify(code)` queues the snippet; one flusher task takes the first waiting snippet, lets the others that
    arrive within the batch window join it (up to `max_batch`) and hands the batch to a task of its own, so a
    batch waiting on Lean never holds up the next. Asyncio objects are made on first use in the running
    loop (again in a new loop), so the client can be built outside one.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        batch_window_ms: float = 20,
        max_batch: int = 16,
        api: str = "verify",
        http_timeout_s: float | None = None,
        api_key: str | None = None,
    ) -> None:
        if api not in PATHS:
            raise ValueError(f"kimina api must be one of {sorted(PATHS)}, not {api!r}")
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.window_s = batch_window_ms / 1000
        self.max_batch = max_batch
        self.api = api
        # A snippet may wait for a free REPL (up to the server's max_wait), then elaborate the
        # header on a fresh REPL, then the proof: each of the last two up to `timeout_s`.
        self.http_timeout_s = http_timeout_s or 2 * timeout_s + 60
        self._api_key = api_key or None  # kept out of every log line and detail (`_redact`)
        self.posts = 0
        self.snippets = 0
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._http: httpx.AsyncClient | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._sending: dict[asyncio.Task[None], list[_Job]] = {}  # batches being sent

    def _started(self) -> asyncio.Queue[_Job]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop: nothing made for the old one is usable
            self._loop, self._queue, self._sending = loop, asyncio.Queue(), {}
            # trust_env=False: the server is reached directly, whatever proxy variables the worker inherited.
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._http = httpx.AsyncClient(
                base_url=self.url,
                headers=headers,
                trust_env=False,
                timeout=httpx.Timeout(self.http_timeout_s, connect=10.0),
            )
            self._flusher = None
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush_forever(), name="kimina-batcher")
        return self._queue

    async def verify(self, code: str) -> dict[str, Any]:
        """The server's result for one snippet (`{"error": str}` or `{"response": {...}}`, plus its id and
        time); KiminaUnavailable when the server gave none."""
        queue = self._started()
        job = _Job(code, asyncio.get_running_loop().create_future())
        queue.put_nowait(job)
        return await job.result

    async def health(self) -> None:
        """GET /health must answer `{"status": "ok"}`; else KiminaUnavailable."""
        self._started()
        assert self._http is not None
        try:
            reply = await self._http.get("/health", timeout=10.0)
            ok = reply.status_code == 200 and reply.json().get("status") == "ok"
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            raise KiminaUnavailable(f"kimina at {self.url} unreachable: {type(e).__name__}: {e}") from e
        if not ok:
            raise KiminaUnavailable(
                self._redact(f"kimina at {self.url} unhealthy: HTTP {reply.status_code} {reply.text[:100]}")
            )

    async def aclose(self) -> None:
        """Stop batching and close the connections; callers still waiting get KiminaUnavailable."""
        if self._loop is not asyncio.get_running_loop():
            self._loop = None  # made in another loop (or never): nothing here to stop
            return
        tasks = [t for t in (self._flusher, *self._sending) if t is not None]
        # A send task cancelled before it starts never reaches its own `finally`: settle its jobs here.
        jobs = [job for batch in self._sending.values() for job in batch]
        http, queue = self._http, self._queue
        self._loop = self._http = self._flusher = None  # a later call starts afresh
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while not queue.empty():
            jobs.append(queue.get_nowait())
        for job in jobs:
            _settle(job, KiminaUnavailable("kimina client closed"))
        if http is not None:
            await http.aclose()

    async def _flush_forever(self) -> None:
        queue = self._queue
        while True:
            batch = [await queue.get()]
            try:
                if queue.qsize() < self.max_batch - 1:
                    await asyncio.sleep(self.window_s)  # let the other consumer tasks' checks join this POST
                while len(batch) < self.max_batch and not queue.empty():
                    batch.append(queue.get_nowait())
            except asyncio.CancelledError:
                for job in batch:
                    _settle(job, KiminaUnavailable("kimina client closed"))
                raise
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._sending[task] = batch
            task.add_done_callback(lambda t: self._sending.pop(t, None))

    async def _send(self, batch: list[_Job]) -> None:
        batch = [job for job in batch if not job.result.done()]  # callers that gave up are not sent
        try:
            if not batch:
                return
            try:
                results = await self._post([job.code for job in batch])
            except KiminaUnavailable as e:
                if e.status in AUTH_REFUSED:
                    log.error(
                        "kimina_auth_refused",
                        status=e.status,
                        key_configured=self._api_key is not None,
                        detail=str(e)[:300],
                    )
                else:
                    log.warning("kimina_request_failed", snippets=len(batch), status=e.status, error=str(e)[:200])
                if e.status == 500 and len(batch) > 1:  # one snippet broke its REPL and failed the request
                    await asyncio.gather(*(self._send([job]) for job in batch))
                    return
                results = [e] * len(batch)
            for job, result in zip(batch, results, strict=True):
                _settle(job, result)
        finally:  # whatever happened (a bug, cancellation), no caller waits forever
            for job in batch:
                _settle(job, KiminaUnavailable("kimina request abandoned"))

    async def _post(self, codes: list[str]) -> list[dict[str, Any] | KiminaUnavailable]:
        """One POST; the result for each code, in order. KiminaUnavailable for the whole request."""
        assert self._http is not None
        ids = [str(next(self._ids)) for _ in codes]
        timeout = math.ceil(self.timeout_s)  # both APIs take whole seconds (pydantic int)
        if self.api == "verify":
            id_key = "custom_id"
            body: dict[str, Any] = {
                "codes": [{"custom_id": i, "proof": c} for i, c in zip(ids, codes, strict=True)],
                "timeout": timeout,
                "disable_cache": False,
            }
        else:
            id_key = "id"
            body = {
                "snippets": [{"id": i, "code": c} for i, c in zip(ids, codes, strict=True)],
                "timeout": timeout,
                "reuse": True,
            }
        self.posts += 1
        self.snippets += len(codes)
        try:
            reply = await self._http.post(PATHS[self.api], json=body)
        except httpx.HTTPError as e:
            raise KiminaUnavailable(self._redact(f"kimina at {self.url} unreachable: {type(e).__name__}: {e}")) from e
        if reply.status_code in AUTH_REFUSED:
            why = (AUTH_WRONG if self._api_key else AUTH_MISSING).format(status=reply.status_code)
            raise KiminaUnavailable(self._redact(f"{why} (server said: {reply.text[:100]})"), reply.status_code)
        if reply.status_code != 200:
            raise KiminaUnavailable(
                self._redact(f"kimina answered HTTP {reply.status_code}: {reply.text[:200]}"), reply.status_code
            )
        try:
            by_id = {str(r[id_key]): r for r in reply.json()["results"]}
        except (ValueError, KeyError, TypeError) as e:
            raise KiminaUnavailable(self._redact(f"kimina answered outside its API: {reply.text[:200]}"), 200) from e
        return [by_id.get(i, KiminaUnavailable(f"kimina gave no result for snippet {i}")) for i in ids]

    def _redact(self, text: str) -> str:
        """`text` without the key: what the server or a proxy in front of it echoes goes into logs and details."""
        return text.replace(self._api_key, "[kimina_api_key]") if self._api_key else text


_SHARED: dict[tuple, KiminaClient] = {}


def shared_client(url: str, **options: Any) -> KiminaClient:
    """The process's client for (url, options): checkers built alike batch together."""
    key = (url.rstrip("/"), tuple(sorted(options.items())))
    if key not in _SHARED:
        _SHARED[key] = KiminaClient(url, **options)
    return _SHARED[key]


# --- what is sent, and how its answer is read -------------------------------------------------------------


def _split(code: str) -> tuple[list[str], list[str]]:
    """(header lines, body lines) exactly as kimina's `split_snippet` cuts a snippet: the header is the leading
    lines that are blank or start with `import `; the body (rejoined with `\\n`) runs as one REPL command, so
    the REPL counts its lines from 1. `str.splitlines` as there, separators and all."""
    lines = code.splitlines()
    i = 0
    while i < len(lines) and (lines[i].strip() == "" or lines[i].strip().startswith("import ")):
        i += 1
    return lines[:i], lines[i:]


Convention = Literal["body", "snippet"]


@dataclass(frozen=True, slots=True)
class Layout:
    """How the sent snippet's lines fall under kimina's split, and so where each convention puts a message.

    A body line k is reported as line k ("body", servers before PR #56) or k + header_lines ("snippet", since).
    `assemble_snippet` pads the header with blank lines until header_lines >= body_lines: the split counts them
    in its header and leaves them out of the import header it elaborates, so the REPL and its pool key are
    unchanged. Then the two conventions' ranges, [1, B] and [H + 1, H + B], do not overlap: the line of every
    positioned message says which convention the answer is in, and the `#print axioms` line of one convention
    (B, or H + B) is never a line of the proof in the other.
    """

    header_lines: int  # H: leading blank and import lines, which the server cuts off
    body_lines: int  # B: the body's lines; the last is `#print axioms NAME`

    def __post_init__(self) -> None:
        if self.header_lines < self.body_lines:
            raise ValueError("the conventions' line ranges overlap: pad the header to at least the body's lines")

    def offset(self, convention: Convention) -> int:
        return self.header_lines if convention == "snippet" else 0

    def report_line(self, convention: Convention) -> int:
        return self.offset(convention) + self.body_lines

    def convention_of(self, line: int) -> Convention | None:
        """The convention under which a message can sit at `line`; None: under neither."""
        for convention in ("body", "snippet"):
            if self.offset(convention) < line <= self.report_line(convention):
                return convention
        return None


def assemble_snippet(header: str, command: str, theorem_name: str) -> tuple[str, Layout] | Judgement:
    """The code to send (header, blank lines, command, then `#print axioms NAME` as its last line, without a
    trailing newline) and its Layout.

    Why the proof cannot forge the axioms report: `command` is what `lean_check.prepare` sends, which holds no `#`
    command (refused in the proof, dropped after it), so the only `#print` is ours, and it sits alone on the last
    line; the proof's syntax ends before it (a comment or string left open to swallow it is a Lean error, which
    fails the proof), so a message the proof makes (`trace "'NAME' does not depend on any axioms"`) sits on an
    earlier line and is never read as the report; the report must be the only one on that line and name our theorem;
    and the scan also forbids what could redefine `#print` or change how NAME resolves (see `lean_check`).
    """
    code = f"{header.rstrip()}\n{command.rstrip()}\n{lean_check.axioms_command(theorem_name)}"
    head, body = _split(code)
    if not any(line.strip().startswith("import ") for line in head):
        return Judgement("error", "", NO_IMPORTS)
    parts = code.splitlines(keepends=True)  # every header part ends with its line break: a body follows
    padding = "\n" * max(0, len(body) - len(head))
    code = "".join(parts[: len(head)]) + padding + "".join(parts[len(head) :])
    head, padded_body = _split(code)  # as the server will cut it (a header line ending in a lone \r eats a \n)
    if padded_body != body or len(head) < len(body):
        return Judgement("error", "", "kimina: the theorem's header has line breaks the padding cannot follow")
    return code, Layout(header_lines=len(head), body_lines=len(body))


def _line(position: Any) -> int:
    line = position.get("line") if isinstance(position, dict) else None
    return line if isinstance(line, int) and not isinstance(line, bool) else 0  # unpositioned: never the report


def judge_result(result: dict[str, Any], theorem_name: str, layout: Layout) -> Judgement:
    """One snippet's result (`{"error": ...}` or `{"response": <REPL response>}`) as a Judgement.

    Failures are read from content wherever they sit (an error or a sorry anywhere). Positions matter only
    to a would-be `proved`, to find the axioms report, and there they fail safe: every positioned message
    must fit one convention (`Layout`); a mix, or a line under neither, is `error` (a server we do not
    understand), never a guess. A guess could only go wrong on an answer that fits both conventions, and
    the padding makes none. Under the convention the lines show, the report line holds only what our
    `#print axioms` printed (see `assemble_snippet`).
    """
    error = result.get("error")
    if error:
        detail = f"kimina: {error}"[:DETAIL_CHARS]
        if "timed out" in str(error) and "header" not in str(error):
            return Judgement("timeout", "", detail)
        return Judgement("error", "", detail)  # our header timed out, or the REPL died / ran out of memory
    response = result.get("response")
    if not isinstance(response, dict):
        return Judgement("error", "", f"kimina result with neither error nor response: {str(result)[:200]}")
    if "message" not in response:  # kimina runs bodies with `gc: true`, whose answer may leave `env` out
        response = {**response, "env": response.get("env")}
    judgement = lean_check.judge_command(response)  # the whole snippet: an error or a sorry anywhere fails it
    if judgement.verdict != "proved":
        return judgement
    messages = response.get("messages") or []
    lines = sorted({line for m in messages if (line := _line(m.get("pos")))})
    conventions = {layout.convention_of(line) for line in lines}
    if len(conventions) > 1 or None in conventions:
        return Judgement(
            "error",
            "",
            f"kimina: message lines {lines[:8]} fit no one convention (body: 1-"
            f"{layout.body_lines}, snippet: {layout.header_lines + 1}-"
            f"{layout.report_line('snippet')}): a server we do not understand",
        )
    report_line = layout.report_line(conventions.pop()) if conventions else -1  # no positioned message: no report
    report = [{**m, "pos": {**m["pos"], "line": 1}} for m in messages if _line(m.get("pos")) == report_line]
    return lean_check.judge_axioms({"env": response["env"], "messages": report}, theorem_name)


class KiminaChecker:
    """The Checker for Lean through a kimina-lean-server; one per consumer task, all sharing one client."""

    backend = "kimina"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        batch_window_ms: float = 20,
        max_batch: int = 16,
        toolchain: str = "kimina",
        api: str = "verify",
        sandbox_id: str = "kimina",
        client: KiminaClient | None = None,
        second_line: SecondLine | None = None,
        api_key: str | None = None,
    ) -> None:
        self.client = client or shared_client(
            url, timeout_s=timeout_s, batch_window_ms=batch_window_ms, max_batch=max_batch, api=api, api_key=api_key
        )
        # The server keeps the proof's environment to itself: no audit can run, so its `proved` counts only
        # where the operator accepts its word (lean_second_line = "trust_repl"); otherwise it is `error`.
        self.second_line = second_line or SecondLine(audit=None)
        if self.second_line.audit is None and not self.second_line.trust_repl:
            detail = "every proof kimina accepts is `error`: set lean_second_line = 'trust_repl'"
            log.warning("kimina_unconfirmed", sandbox=sandbox_id, detail=detail)
        # The server does not say what it runs: the configured toolchain names it, beside our judging code and
        # what stands behind a `proved`.
        self.environment = f"lean:{toolchain}:{self.second_line.mode}|{JUDGING_DIGEST}"
        self.sandbox_id = sandbox_id
        self.sandbox = self  # what the consumer service starts, kills and counts: here, the server
        self._stats = SandboxStats(sandbox_id, self.backend)

    async def check(self, theorem: Theorem, proof: str) -> Judgement:
        # trusted assembly + token scan, no server time
        text = lean_check.prepare(proof, theorem.statement, header=theorem.header)
        if isinstance(text, Judgement):
            return text
        name = lean_proof.theorem_name(theorem.statement)
        snippet = assemble_snippet(theorem.header, text, name)
        if isinstance(snippet, Judgement):
            return snippet
        code, layout = snippet
        self._stats.requests += 1
        self._stats.total_requests += 1
        try:
            result = await self.client.verify(code)
        except KiminaUnavailable as e:
            return Judgement("error", "", str(e)[:DETAIL_CHARS])
        judgement = judge_result(result, name, layout)
        if judgement.verdict == "timeout":
            self._stats.timeouts += 1
        if judgement.verdict == "proved":  # the server's word, which code run from the proof can forge
            return await self.second_line.confirm(theorem, None)
        return judgement

    # The sandbox face (verifier_pool.sandbox.Sandbox, without `request`).

    async def start(self) -> None:
        """Raises KiminaUnavailable (a SandboxUnavailable) unless the server answers its health check."""
        await self.client.health()
        self._stats.starts += 1

    async def kill(self) -> None:
        await self.client.aclose()

    def stats(self) -> SandboxStats:
        self._stats.extra = {"posts": self.client.posts, "snippets": self.client.snippets}
        return self._stats
