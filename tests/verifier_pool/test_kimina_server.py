"""Our kimina backend against the REAL kimina-lean-server 2.1.3 (tests/fixtures/kimina_server.py), whole path:
attempts in Redis -> VerifierService (sandbox = "kimina") -> KiminaClient -> HTTP -> the server's routers and
REPL manager -> a REPL stand-in behind its `lake` shim -> the verdict published (or the attempt dead-lettered).

The REPL stand-in is the synthetic REPL (not Lean: its answers copy leanprover-community/repl v4.28.0's
transcripts, and markers in the proof's comments pick them); everything between our client and the REPL's
pipes is the server's own code, so what these tests show about it is evidence: how it splits, pools, times
out, authenticates and relays. Each case's verdict is in docs/VERIFIER.md's conformance table. The
hand-written double (tests/fixtures/fake_kimina.py, test_kimina.py) keeps the shapes this server cannot be
made to produce (positions in the snippet's lines, HTTP 429/500).

Verifier faults (`error`) are dead-lettered on their first delivery here (max_deliveries = 1), so each case
ends promptly with the reason the checker gave; the restart case allows redeliveries instead.
"""

from __future__ import annotations

import asyncio
import itertools
import re

import pytest

from consumers.service import VerifierService
from streams.codec import decode
from streams.connect import connect
from streams.keys import Keys
from streams.publisher import Publisher
from streams.schema import Attempt, DeadLetter, Reward
from streams.theorems import Theorem, register
from tests.fixtures import kimina_server
from tests.fixtures.kimina_server import RealKimina
from verifier_pool import kimina
from verifier_pool.config import VerifierSettings

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(kimina_server.unavailable() is not None, reason=str(kimina_server.unavailable())),
]

HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\nopen BigOperators Real Nat Topology Rat\n"
THEOREMS = [
    Theorem(
        f"mathd_algebra_{n}", "lean", statement=f"theorem mathd_algebra_{n} : ({n} : ℕ) + 0 = {n} := by", header=HEADER
    )
    for n in (10, 11, 12)
]
KEY = "sk-kimina-test-8c1f"
RUNS = itertools.count()


def proof(theorem: Theorem, tactics: str = "norm_num") -> str:
    """A model's output: the usual Kimina-Prover shape, header and statement restated in a lean4 block."""
    return f"Let me prove it.\n```lean4\n{theorem.header}\n{theorem.statement}\n  {tactics}\n```"


@pytest.fixture
def server(tmp_path):
    with RealKimina(tmp_path, max_repls=2) as s:
        yield s


@pytest.fixture
async def redis(one_redis_url):
    """A client of one real Redis (the newest available); `redis.url` is where the service connects."""
    client = connect(one_redis_url)
    client.url = one_redis_url
    yield client
    await client.aclose()


async def run_service(
    redis,
    url: str,
    proofs: dict[str, tuple[Theorem, str]],
    *,
    env: dict | None = None,
    stats: dict | None = None,
    **flags,
) -> dict[str, tuple]:
    """Publish `proofs` (attempt id -> (theorem, output)), run a verifier service on kimina until each attempt
    has a reward or a dead letter, and return attempt id -> (verdict, reward, reason) or ("dead", reason);
    `stats` gets the service's figures."""
    keys = Keys(f"kimina-{next(RUNS)}")  # a run of its own: earlier runs' rewards and dead letters are not its
    await register(redis, keys, THEOREMS)
    attempts = [
        Attempt(attempt_id=a, work_id="w", theorem_id=t.theorem_id, policy_version=0, sample_index=i, proof=p)
        for i, (a, (t, p)) in enumerate(proofs.items())
    ]
    await Publisher(redis, keys).publish(attempts)
    settings = VerifierSettings.load(
        env=env or {},
        flags={
            "run": keys.run,
            "tasks": ["lean"],
            "sandbox": "kimina",
            "kimina_url": url,
            "lean_second_line": "trust_repl",
            "concurrency": 2,
            "max_deliveries": 1,
            "proof_timeout_s": 2,
            **flags,
        },
    )
    service = VerifierService(settings, redis.url)
    await service.start()
    try:
        async with asyncio.timeout(90):
            while await redis.xlen(keys.rewards) + await redis.xlen(keys.dlq) < len(proofs):
                await asyncio.sleep(0.05)  # polling the outcome streams, not ordering events
    finally:
        await service.stop()
    if stats is not None:
        stats.update(service.stats())
    out: dict[str, tuple] = {}
    for _, fields in await redis.xrange(keys.rewards):
        r = decode(Reward, fields)
        out[r.attempt_id] = (r.verdict, r.reward, r.reason)
    for _, fields in await redis.xrange(keys.dlq):
        letter = decode(DeadLetter, fields)
        out[decode(Attempt, letter.original).attempt_id] = ("dead", letter.reason)
    return out


def dead(outcome: tuple, *needles: str) -> bool:
    """A dead letter for the infrastructure (never a reward), whose reason says each of `needles`."""
    return outcome[0] == "dead" and outcome[1].startswith("infrastructure") and all(n in outcome[1] for n in needles)


def test_the_stand_in_says_which_repl_it_copies():
    assert "leanprover-community/repl v4.28.0" in kimina_server.repl_copies()


async def test_verdicts_through_the_real_server(redis, server):
    """Proved, sorry, a Lean error, the scan's refusal, past the server's timeout, and a REPL that answers
    garbage or crashes: each the verdict the real server's relay leads to."""
    t = THEOREMS[0]
    cases = {
        "proved": proof(t),
        "sorry": proof(t, "norm_num -- FIXTURE:sorry"),
        "error": proof(t, "norm_num -- FIXTURE:error"),
        "scan": proof(t, "sorry"),
        "server_timeout": proof(t, "norm_num -- FIXTURE:hang"),
        "garbage": proof(t, "norm_num -- FIXTURE:garbage"),
        "crash": proof(t, "norm_num -- FIXTURE:crash"),
    }
    got = await run_service(redis, server.url, {a: (t, p) for a, p in cases.items()})
    assert got["proved"] == ("proved", 1.0, "")
    assert got["sorry"] == ("rejected", 0.0, "sorry")
    assert got["error"] == ("rejected", 0.0, "lean_error")
    assert got["scan"] == ("rejected", 0.0, "sorry")  # never sent
    assert got["server_timeout"] == ("timeout", 0.0, "")  # "Lean REPL command timed out in 2.0 seconds"
    assert dead(got["garbage"], "kimina: Snippet execution failed"), got["garbage"]
    assert dead(got["crash"], "kimina: Snippet execution failed"), got["crash"]
    assert len(got) == len(cases)


async def test_past_our_http_timeout_is_an_error_and_the_server_serves_on(redis, server):
    """The server's timeout (30 s) outlasts our HTTP wait (3 s): our side gives up, `error`, never a reward;
    the hung REPL holds one of the server's two, and the next proof is judged on the other."""
    t = THEOREMS[0]
    options = {"timeout_s": 30, "batch_window_ms": 20, "max_batch": 16, "api": "verify", "api_key": None}
    kimina.shared_client(server.url, **options).http_timeout_s = 3  # the client the service's checkers share
    try:
        got = await run_service(
            redis, server.url, {"hang": (t, proof(t, "norm_num -- FIXTURE:hang"))}, proof_timeout_s=30
        )
        assert dead(got["hang"], "unreachable", "ReadTimeout"), got["hang"]
        after = await run_service(redis, server.url, {"next": (t, proof(t))}, proof_timeout_s=30)
        assert after["next"] == ("proved", 1.0, "")
    finally:
        kimina._SHARED.pop((server.url, tuple(sorted(options.items()))), None)


async def test_n_slots_against_fewer_server_repls_cross_no_verdict(redis, tmp_path):
    """4 consumer slots, 18 attempts on 3 theorems, batched POSTs, 2 REPLs: every attempt gets its
    own verdict (a crossed answer would name another theorem in its axioms report: `error`), none waits
    forever."""
    kinds = {"proved": "norm_num", "sorry": "norm_num -- FIXTURE:sorry", "error": "norm_num -- FIXTURE:error"}
    expected = {
        "proved": ("proved", 1.0, ""),
        "sorry": ("rejected", 0.0, "sorry"),
        "error": ("rejected", 0.0, "lean_error"),
    }
    proofs, want = {}, {}
    for i in range(18):
        t, kind = THEOREMS[i % 3], list(kinds)[(i // 3) % 3]
        proofs[f"a{i}"] = (t, proof(t, f"{kinds[kind]} -- {i}"))
        want[f"a{i}"] = expected[kind]
    with RealKimina(tmp_path, max_repls=2) as server:
        got = await run_service(redis, server.url, proofs, concurrency=4, read_batch=4)
        assert 1 <= server.repls_started() <= 2  # the server's bound held (2 in every run recorded)
    assert got == want


@pytest.mark.parametrize(
    ("client_key", "why"),
    [(KEY, None), (None, "none is set"), ("sk-wrong-5d1a", "does not accept")],
    ids=["right", "missing", "wrong"],
)
async def test_the_servers_api_key(redis, tmp_path, client_key, why):
    """LEAN_SERVER_API_KEY set: the right key is proved; a missing or wrong one is a clear error (401 from the
    server's `require_key`), never a reward, and the key never shows in the reason."""
    t = THEOREMS[1]
    env = {"PROOFSTREAM_KIMINA_API_KEY": client_key} if client_key else {}
    with RealKimina(tmp_path, api_key=KEY) as server:
        got = await run_service(redis, server.url, {"a": (t, proof(t))}, env=env)
    if why is None:
        assert got["a"] == ("proved", 1.0, "")
    else:
        assert dead(got["a"], "HTTP 401", why), got["a"]
        assert KEY not in got["a"][1] and "sk-wrong-5d1a" not in got["a"][1]


async def test_a_server_killed_and_restarted_mid_run_loses_nothing_and_scores_nothing_it_did_not_judge(redis, tmp_path):
    """The server is SIGKILLed (and its REPLs) while a proof is on a REPL, then started again on its port: the
    attempt in flight is re-verified after the restart or dead-lettered as infrastructure, never scored by the
    crash; every attempt ends somewhere."""
    t = THEOREMS[2]
    proofs = {"slow": (t, proof(t, "norm_num -- FIXTURE:slow=4"))}
    proofs |= {f"p{i}": (t, proof(t, f"norm_num -- {i}")) for i in range(4)}
    server = RealKimina(tmp_path, max_repls=2).start()
    try:

        async def crash_and_restart() -> None:
            while server.repls_started() == 0:  # a proof reached a REPL: the run is under way
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            server.kill()
            await asyncio.to_thread(server.start)

        restarter = asyncio.create_task(crash_and_restart())
        figures: dict = {}
        got = await run_service(
            redis, server.url, proofs, stats=figures, max_deliveries=4, claim_idle_ms=1000, proof_timeout_s=10
        )
        await restarter
    finally:
        server.stop()
    assert figures["transient_failures"] >= 1  # the crash cut checks in flight (retried, not judged)
    assert set(got) == set(proofs)  # nothing lost
    for attempt_id, outcome in got.items():
        assert outcome == ("proved", 1.0, "") or dead(outcome, "kimina"), (attempt_id, outcome)
    assert got["slow"] == ("proved", 1.0, "") or dead(got["slow"]), got["slow"]


# --- a server answer mangled on the way: a clear error, never a reward --------------------------------------


class Mangler:
    """An HTTP/1.1 proxy in front of the real server that passes GETs through and mangles POST answers:
    "truncate" sends the headers (Content-Length of the whole) and half the body, then closes; "malformed"
    sends half the body as the whole (Content-Length fixed), so it parses as HTTP but not as JSON."""

    def __init__(self, upstream_port: int, mode: str) -> None:
        self.upstream_port, self.mode = upstream_port, mode

    async def __aenter__(self) -> Mangler:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    @staticmethod
    async def _message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        m = re.search(rb"(?i)content-length:\s*(\d+)", head)
        body = await reader.readexactly(int(m.group(1))) if m else b""
        return head, body

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head, body = await self._message(reader)
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            up_writer.write(head + body)
            await up_writer.drain()
            reply_head, reply = await self._message(up_reader)
            up_writer.close()
            if head.startswith(b"POST"):
                half = reply[: len(reply) // 2]
                if self.mode == "malformed":
                    reply_head = re.sub(rb"(?i)content-length:\s*\d+", b"content-length: %d" % len(half), reply_head)
                reply = half
            writer.write(reply_head + reply)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize(("mode", "why"), [("truncate", "unreachable"), ("malformed", "outside its API")])
async def test_a_truncated_or_malformed_server_answer_is_a_clear_error(redis, server, mode, why):
    t = THEOREMS[0]
    async with Mangler(server.port, mode) as proxy:
        got = await run_service(redis, proxy.url, {"a": (t, proof(t))})
    assert dead(got["a"], "kimina", why), got["a"]


# --- what the real server relays, read directly ----------------------------------------------------------------


@pytest.mark.parametrize("api", ["verify", "check"])
async def test_the_server_answers_in_the_bodys_lines_on_both_endpoints(server, api):
    """2.1.3 has no `_apply_header_offset` (PR #56 of the repository is not in the released package): a
    message's line counts the body's lines, the "body" convention of `kimina.Layout`, on /verify and
    /api/check alike. Our padding keeps the two conventions apart, so the line says which one it is."""
    t = THEOREMS[0]
    code, layout = kimina.assemble_snippet(t.header, f"{t.statement}\n  norm_num -- FIXTURE:error", t.theorem_id)
    client = kimina.KiminaClient(server.url, timeout_s=5, api=api)
    try:
        result = await client.verify(code)
    finally:
        await client.aclose()
    lines = [m["pos"]["line"] for m in result["response"]["messages"]]
    assert lines and {layout.convention_of(line) for line in lines} == {"body"}, (lines, layout)
    assert kimina.judge_result(result, t.theorem_id, layout).reason == "lean_error"


async def test_no_repl_free_in_time_is_a_per_snippet_error_not_http_429(tmp_path):
    """One REPL, held by a proof until the server's timeout (6 s), and a server that waits 1 s for a free
    one: the second snippet's result is `No available REPLs` inside an HTTP 200 (2.1.3 never answers 429),
    which our client reads as infrastructure: `error`, never a reward."""
    t = THEOREMS[0]
    with RealKimina(tmp_path, max_repls=1, max_wait_s=1) as server:
        checker = kimina.KiminaChecker(
            server.url, timeout_s=6, client=kimina.KiminaClient(server.url, timeout_s=6, batch_window_ms=0)
        )
        try:
            held = asyncio.create_task(checker.check(t, proof(t, "norm_num -- FIXTURE:hang")))
            while server.repls_started() == 0:  # the first snippet holds the only REPL
                await asyncio.sleep(0.05)
            refused = await checker.check(t, proof(t))
            assert (refused.verdict, refused.detail) == ("error", "kimina: No available REPLs")
            assert (await held).verdict == "timeout"
        finally:
            await checker.kill()


@pytest.mark.parametrize("api", ["check", "verify"])
async def test_a_request_we_gave_up_on_holds_its_repl_until_the_servers_timeout(tmp_path, api):
    """Our HTTP wait (2 s) ends before the server's timeout (8 s) on the server's only REPL: `error` for us.
    The server keeps that REPL to its own timeout on both endpoints (/api/check's disconnect poll never saw our
    client leave: no `Client disconnected` in its log), so the next snippet, allowed 1 s to find a REPL, gets
    `No available REPLs` (`error`, never a reward). Our default HTTP wait (2 x timeout + 60 s) outlasts the
    server's timeout, so a pool of ours does not cause this."""
    t = THEOREMS[0]
    with RealKimina(tmp_path, max_repls=1, max_wait_s=1) as server:
        client = kimina.KiminaClient(server.url, timeout_s=8, api=api, http_timeout_s=2, batch_window_ms=0)
        checker = kimina.KiminaChecker(server.url, timeout_s=8, client=client)
        try:
            gave_up = await checker.check(t, proof(t, "norm_num -- FIXTURE:hang"))
            assert gave_up.verdict == "error" and "ReadTimeout" in gave_up.detail, gave_up
            after = await checker.check(t, proof(t))
            assert (after.verdict, after.detail) == ("error", "kimina: No available REPLs"), after
        finally:
            await checker.kill()
