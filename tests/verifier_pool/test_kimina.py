"""KiminaChecker against a test double of kimina-lean-server's HTTP API (tests/fixtures/fake_kimina.py).

The double is not Lean and not the server: these tests assert our client's behaviour (what it sends, how it
batches, how it reads positions and maps failures to verdicts, how it authenticates), never Lean's. The double
answers as kimina-lean-server at fb2393de does (positions in the whole snippet's lines, PR #56) or, with
`positions="body"`, as the servers before it; the tests that judge answers run under both.

One file, over 450 lines, because it follows verifier_pool/kimina.py, one client of one server, part by part.
"""

from __future__ import annotations

import asyncio
import socket

import orjson
import pytest

from consumers.service import VerifierService
from streams.codec import decode
from streams.publisher import Publisher
from streams.schema import Attempt, Reward
from streams.theorems import Theorem, register
from tests.fixtures.fake_kimina import FakeKimina, apply_header_offset, split_snippet
from verifier_pool.checkers import JUDGING_DIGEST, CountdownChecker
from verifier_pool.config import VerifierSettings
from verifier_pool.judgement import Judgement
from verifier_pool.kimina import KiminaChecker, KiminaClient, Layout, assemble_snippet, judge_result
from verifier_pool.lean_audit import SecondLine
from verifier_pool.pool import make_checkers
from verifier_pool.sandbox import SandboxUnavailable

pytestmark = pytest.mark.timeout(30)

HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\nopen BigOperators Real Nat Topology Rat\n"
STATEMENT = "theorem mathd_algebra_10 : abs ((120 : ℝ) / 100 * 30 - 130) = 94 := by"
THEOREM = Theorem("mathd_algebra_10", "lean", statement=STATEMENT, header=HEADER)
NAME = "mathd_algebra_10"
# The server's word accepted, as the operator must say for kimina (it cannot hand over the env to audit).
TRUST = SecondLine(audit=None, trust_repl=True)


def attempt(tactics: str = "norm_num [abs_of_nonpos]") -> str:
    """A model's output: the usual Kimina-Prover shape, header and statement restated in a lean4 block."""
    return f"Let me prove it.\n```lean4\n{HEADER}\n{STATEMENT}\n  {tactics}\n```"


@pytest.fixture
def server():
    with FakeKimina() as s:
        yield s


@pytest.fixture(params=["snippet", "body"])
def any_server(request):
    """Today's server (positions in the snippet's lines) and the older one (in the body's lines)."""
    with FakeKimina(positions=request.param) as s:
        yield s


@pytest.fixture
async def checker(server):
    c = KiminaChecker(server.url, timeout_s=60, client=KiminaClient(server.url, timeout_s=60), second_line=TRUST)
    yield c
    await c.kill()


@pytest.fixture
async def any_checker(any_server):
    c = KiminaChecker(
        any_server.url, timeout_s=60, client=KiminaClient(any_server.url, timeout_s=60), second_line=TRUST
    )
    yield c
    await c.kill()


async def test_proved_sends_header_command_and_axioms_check_in_one_snippet(server, checker):
    assert (await checker.check(THEOREM, attempt())).verdict == "proved"
    [(path, body)] = server.requests
    assert path == "/verify"
    assert body["timeout"] == 60 and body["disable_cache"] is False
    [item] = body["codes"]
    assert set(item) == {"custom_id", "proof"}
    # The split's header (2 imports, 1 blank line) padded with 3 blank lines to the body's 6 lines.
    assert item["proof"] == (
        "import Mathlib\nimport Aesop\n\n" + "\n" * 3 + "set_option maxHeartbeats 400000\n\n"
        f"open BigOperators Real Nat Topology Rat\n{STATEMENT}\n  norm_num [abs_of_nonpos]\n#print axioms {NAME}"
    )
    assert server.auth_headers == [None]  # no key configured: no Authorization header


async def test_a_correct_proof_is_proved_through_the_second_line_in_both_conventions(any_server, any_checker):
    assert (await any_checker.check(THEOREM, attempt())).verdict == "proved"  # trust_repl: the server's word
    audit_wanted = KiminaChecker(any_server.url, timeout_s=60, client=KiminaClient(any_server.url, timeout_s=60))
    try:  # the default (audit), which kimina cannot feed: error, never a reward, as before
        judgement = await audit_wanted.check(THEOREM, attempt())
        assert judgement.verdict == "error" and "trust_repl" in judgement.detail
    finally:
        await audit_wanted.kill()


@pytest.mark.parametrize(
    ("tactics", "verdict", "reason"),
    [
        ("norm_num -- FIXTURE:sorry", "rejected", "sorry"),
        ("norm_num -- FIXTURE:error", "rejected", "lean_error"),
        ("norm_num -- FIXTURE:timeout", "timeout", ""),
        ("norm_num -- FIXTURE:axiom=sorryAx", "rejected", "sorry"),
        ("norm_num -- FIXTURE:axiom=Lean.ofReduceBool", "rejected", "integrity"),
        ("norm_num -- FIXTURE:axiom=my_axiom", "rejected", "integrity"),
        ("norm_num -- FIXTURE:axiom=none", "proved", ""),
        ("norm_num -- FIXTURE:gc", "proved", ""),  # `env` left out of the response
        # infrastructure: never a reward of 0
        ("norm_num -- FIXTURE:429", "error", ""),
        ("norm_num -- FIXTURE:500", "error", ""),
        ("norm_num -- FIXTURE:header-timeout", "error", ""),
        ("norm_num -- FIXTURE:oom", "error", ""),
        ("norm_num -- FIXTURE:repl-message", "error", ""),
        ("norm_num -- FIXTURE:no-report", "error", ""),
        ("norm_num -- FIXTURE:shift=1", "error", ""),  # a server in neither convention
        ("norm_num -- FIXTURE:shift=1000", "error", ""),
    ],
)
async def test_verdicts(any_server, any_checker, tactics, verdict, reason):
    judgement = await any_checker.check(THEOREM, attempt(tactics))
    assert (judgement.verdict, judgement.reason) == (verdict, reason), judgement
    assert len(any_server.requests) == 1


async def test_an_error_on_a_body_line_is_rejected_in_both_conventions(any_checker):
    judgement = await any_checker.check(THEOREM, attempt("norm_num\n  simp -- FIXTURE:error"))
    assert (judgement.verdict, judgement.reason) == ("rejected", "lean_error"), judgement


def test_the_double_shifts_positions_as_the_servers_own_test_expects():
    """kimina-lean-server's tests/test_header_offset.py (fb2393de): offset 4 moves an error at 2..3 to 6..7
    and a sorry at 1 to 5; offset 0 moves nothing."""
    error = {"severity": "error", "pos": {"line": 2, "column": 1}, "endPos": {"line": 3, "column": 4}, "data": "oops"}
    sorry = {"pos": {"line": 1, "column": 0}, "endPos": {"line": 1, "column": 5}, "goal": "sorry"}
    response = {"messages": [error], "sorries": [sorry]}
    apply_header_offset(response, 4)
    assert (response["messages"][0]["pos"]["line"], response["messages"][0]["endPos"]["line"]) == (6, 7)
    assert (response["sorries"][0]["pos"]["line"], response["sorries"][0]["endPos"]["line"]) == (5, 5)
    unmoved = {"messages": [{"severity": "error", "pos": {"line": 2, "column": 1}, "data": "oops"}]}
    apply_header_offset(unmoved, 0)
    assert unmoved["messages"][0]["pos"]["line"] == 2


async def test_a_report_the_proof_prints_is_not_the_axioms_report(any_checker):
    # The double puts `'NAME' does not depend on any axioms` at the proof's line, as a `trace` could.
    assert (await any_checker.check(THEOREM, attempt("norm_num -- FIXTURE:forge"))).verdict == "proved"
    judgement = await any_checker.check(THEOREM, attempt("norm_num -- FIXTURE:forge FIXTURE:axiom=sorryAx"))
    assert (judgement.verdict, judgement.reason) == ("rejected", "sorry")


async def test_positions_in_no_known_convention_are_an_error_that_says_so(server, checker):
    judgement = await checker.check(THEOREM, attempt("norm_num -- FIXTURE:shift=1000"))
    assert judgement.verdict == "error" and "a server we do not understand" in judgement.detail


@pytest.mark.parametrize(
    "text",
    [
        attempt("sorry"),
        attempt("native_decide"),
        attempt("norm_num\naxiom cheat : False"),
        "```lean4\ntheorem mathd_algebra_10 : (1 : ℕ) = 1 := by\n  rfl\n```",  # altered statement
    ],
)
async def test_integrity_rejections_never_reach_the_server(server, checker, text):
    judgement = await checker.check(THEOREM, text)
    assert judgement.verdict == "rejected", judgement
    assert judgement.reason in ("sorry", "integrity", "statement_mismatch"), judgement
    assert server.requests == []


@pytest.mark.parametrize("header", ["", "open Real\n", "-- a comment\nimport Mathlib\n"])
async def test_a_header_without_leading_imports_is_an_error_without_server_time(server, checker, header):
    # kimina would run it on top of its shared env 0: whatever another request declared there.
    judgement = await checker.check(Theorem("t", "lean", statement=STATEMENT, header=header), attempt())
    assert judgement.verdict == "error" and "env 0" in judgement.detail
    assert server.requests == []


async def test_concurrent_checks_of_several_consumers_go_out_in_one_post(server):
    # One checker per consumer task, as make_checkers builds them: they share the process's client.
    checkers = [KiminaChecker(server.url, timeout_s=60, sandbox_id=f"kimina-{i}", second_line=TRUST) for i in range(8)]
    assert len({id(c.client) for c in checkers}) == 1
    texts = [attempt("norm_num -- FIXTURE:sorry" if i % 2 else "norm_num") for i in range(8)]
    judgements = await asyncio.gather(*(c.check(THEOREM, t) for c, t in zip(checkers, texts, strict=True)))
    assert [j.verdict for j in judgements] == ["proved", "rejected"] * 4  # each caller gets its own
    assert len(server.requests) <= 2 and sum(server.batch_sizes) == 8
    assert sum(c.stats().requests for c in checkers) == 8
    await checkers[0].kill()


async def test_batches_hold_at_most_max_batch(server):
    client = KiminaClient(server.url, timeout_s=60, max_batch=16)
    checker = KiminaChecker(server.url, timeout_s=60, client=client, second_line=TRUST)
    judgements = await asyncio.gather(*(checker.check(THEOREM, attempt()) for _ in range(20)))
    assert all(j.verdict == "proved" for j in judgements)
    assert max(server.batch_sizes) <= 16 and sum(server.batch_sizes) == 20
    await checker.kill()


async def test_a_batch_failed_by_one_snippet_is_resent_snippet_by_snippet(server, checker):
    texts = [attempt("norm_num -- FIXTURE:500" if i == 2 else "norm_num") for i in range(4)]
    judgements = await asyncio.gather(*(checker.check(THEOREM, t) for t in texts))
    assert [j.verdict for j in judgements] == ["proved", "proved", "error", "proved"]
    assert server.batch_sizes == [4, 1, 1, 1, 1]


async def test_a_429_is_not_resent(server, checker):
    texts = [attempt("norm_num -- FIXTURE:429" if i == 0 else "norm_num") for i in range(3)]
    judgements = await asyncio.gather(*(checker.check(THEOREM, t) for t in texts))
    assert [j.verdict for j in judgements] == ["error"] * 3
    assert server.batch_sizes == [3]


async def test_the_api_check_endpoint(server):
    checker = KiminaChecker(
        server.url, timeout_s=2.5, client=KiminaClient(server.url, timeout_s=2.5, api="check"), second_line=TRUST
    )
    assert (await checker.check(THEOREM, attempt())).verdict == "proved"
    judgement = await checker.check(THEOREM, attempt("norm_num -- FIXTURE:timeout"))
    assert judgement.verdict == "timeout" and "timed out" in judgement.detail
    path, body = server.requests[0]
    assert path == "/api/check" and body["reuse"] is True
    assert body["timeout"] == 3  # whole seconds, rounded up
    assert set(body["snippets"][0]) == {"id", "code"} and body["snippets"][0]["code"].startswith("import Mathlib\n")
    assert checker.stats().timeouts == 1
    await checker.kill()


async def test_closing_the_client_fails_waiting_checks_instead_of_leaving_them_hanging(server, checker):
    pending = asyncio.create_task(checker.check(THEOREM, attempt("norm_num -- FIXTURE:slow=5")))
    while not server.requests:
        await asyncio.sleep(0.01)
    await checker.kill()
    judgement = await asyncio.wait_for(pending, 2)
    assert judgement.verdict == "error" and "kimina" in judgement.detail
    assert (await checker.check(THEOREM, attempt())).verdict == "proved"  # a later check starts afresh


async def test_start_checks_health(server, checker):
    await checker.start()
    assert checker.sandbox is checker and checker.stats().starts == 1


async def test_an_unreachable_server_is_an_error_and_fails_start():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    checker = KiminaChecker(url, timeout_s=60, client=KiminaClient(url, timeout_s=60), second_line=TRUST)
    judgement = await checker.check(THEOREM, attempt())
    assert judgement.verdict == "error" and "unreachable" in judgement.detail
    with pytest.raises(SandboxUnavailable):
        await checker.start()
    await checker.kill()


def test_the_header_is_padded_so_that_the_two_conventions_never_share_a_line():
    # Leading import and blank lines go to kimina's header REPL; the body starts at `open`.
    command = f"{STATEMENT}\n  norm_num"
    code, layout = assemble_snippet("import Mathlib\n\nimport Aesop\n\nopen Real\n", command, NAME)
    assert code.splitlines()[-1] == f"#print axioms {NAME}"
    assert layout == Layout(header_lines=4, body_lines=4)  # 4 leading lines already cover open / stmt / tactic / #print
    # Lines as str.splitlines cuts them (kimina rejoins the body with \n): \u2028 counts as a break.
    code, layout = assemble_snippet("import Mathlib", f"{STATEMENT}\n  norm_num\u2028  simp", NAME)
    assert layout == Layout(header_lines=4, body_lines=4)  # 1 import + 3 blank lines of padding
    assert code.startswith("import Mathlib\n\n\n\n" + STATEMENT)
    # A long proof: as many blank lines as it needs.
    tactics = "\n".join(f"  have h{i} : True := trivial" for i in range(60))
    code, layout = assemble_snippet("import Mathlib", f"{STATEMENT}\n{tactics}", NAME)
    assert layout == Layout(header_lines=62, body_lines=62)


def test_padding_leaves_the_servers_header_and_body_as_they_were():
    """The REPLs are pooled by the split's import header: the padding must not change it, nor the body."""
    command = f"{STATEMENT}\n  norm_num"
    code, layout = assemble_snippet(HEADER, command, NAME)
    unpadded = f"{HEADER.rstrip()}\n{command}\n#print axioms {NAME}"
    header, body, header_line_count = split_snippet(code)
    assert (header, body) == split_snippet(unpadded)[:2] == ("import Mathlib\nimport Aesop", body)
    assert header_line_count == layout.header_lines and len(body.split("\n")) == layout.body_lines


def test_a_header_whose_line_breaks_defeat_the_padding_is_an_error():
    # A lone \r ending the import lines joins the first padding \n into one break: the ranges could overlap.
    judgement = assemble_snippet("import Mathlib\ropen Real", f"{STATEMENT}\n  norm_num", NAME)
    assert isinstance(judgement, Judgement) and judgement.verdict == "error"


def test_a_layout_whose_conventions_overlap_is_refused():
    with pytest.raises(ValueError, match="overlap"):
        Layout(header_lines=3, body_lines=5)


def _report(line: int, axioms: str = "propext") -> dict:
    data = f"'{NAME}' does not depend on any axioms" if axioms == "none" else f"'{NAME}' depends on axioms: [{axioms}]"
    return {"severity": "info", "pos": {"line": line, "column": 0}, "endPos": None, "data": data}


LAYOUT = Layout(header_lines=6, body_lines=5)  # body lines 1..5 (report at 5); snippet lines 7..11 (report at 11)


@pytest.mark.parametrize(
    ("messages", "verdict", "reason"),
    [
        ([_report(5)], "proved", ""),  # body convention
        ([_report(11)], "proved", ""),  # snippet convention (the repository since PR #56)
        ([_report(4)], "error", ""),  # not at the command's line: no report
        ([_report(10)], "error", ""),
        ([_report(4), _report(5, "sorryAx")], "rejected", "sorry"),  # the earlier one is the proof's
        ([_report(10), _report(11, "sorryAx")], "rejected", "sorry"),
        ([_report(5), _report(5)], "rejected", "integrity"),  # two reports for one command
        ([_report(11), _report(11)], "rejected", "integrity"),
        ([_report(5), _report(11)], "error", ""),  # both conventions at once: no guess
        # A wrong guess cannot make `proved`: a snippet-convention answer (real report at 11, sorryAx) with a
        # forged clean report at 5, the body convention's report line, fits neither convention.
        ([_report(5, "none"), _report(11, "sorryAx")], "error", ""),
        ([_report(6)], "error", ""),  # a header line: neither convention
        ([_report(12)], "error", ""),  # past the snippet's last line
        ([{**_report(5), "pos": None}], "error", ""),  # unpositioned: never the report
    ],
)
def test_judge_result_reads_the_report_only_at_the_command_line_of_the_answers_convention(messages, verdict, reason):
    judgement = judge_result({"response": {"env": 3, "messages": messages}}, NAME, LAYOUT)
    assert (judgement.verdict, judgement.reason) == (verdict, reason), judgement


def test_make_checkers_builds_kimina_checkers_that_share_a_client():
    settings = VerifierSettings(
        sandbox="kimina", kimina_url="http://kimina.invalid:8000", tasks=["lean", "countdown"], lean_toolchain="v4.19.0"
    )
    first, second = make_checkers(settings, 0), make_checkers(settings, 1)
    assert isinstance(first["lean"], KiminaChecker) and first["lean"].client is second["lean"].client
    assert first["lean"].sandbox.sandbox_id != second["lean"].sandbox.sandbox_id
    assert (
        first["lean"].environment == f"lean:v4.19.0+kimina:unconfirmed|{JUDGING_DIGEST}"
    )  # and our judging code's digest
    # kimina checks Lean only: Countdown keeps a local process sandbox
    assert isinstance(first["countdown"], CountdownChecker) and first["countdown"].sandbox.backend == "process"


async def test_the_verifier_service_runs_on_kimina(redis, redis_url, keys, server):
    """End to end: attempts in Redis -> VerifierService with sandbox = 'kimina' -> rewards."""
    await register(redis, keys, [THEOREM])
    tactics = ["norm_num", "norm_num -- FIXTURE:sorry", "norm_num -- FIXTURE:timeout", "sorry", "norm_num"]
    await Publisher(redis, keys).publish(
        [
            Attempt(
                attempt_id=f"a{i}",
                work_id="w",
                theorem_id=THEOREM.theorem_id,
                policy_version=0,
                sample_index=i,
                proof=attempt(t),
            )
            for i, t in enumerate(tactics)
        ]
    )
    settings = VerifierSettings.load(
        env={},
        flags={
            "run": keys.run,
            "concurrency": 3,
            "tasks": ["lean"],
            "sandbox": "kimina",
            "kimina_url": server.url,
            "lean_second_line": "trust_repl",
        },
    )
    service = VerifierService(settings, redis_url)
    await service.start()
    try:
        for _ in range(500):
            if await redis.xlen(keys.rewards) == len(tactics):
                break
            await asyncio.sleep(0.02)
    finally:
        await service.stop()
    rewards = {r.attempt_id: r for r in (decode(Reward, f) for _, f in await redis.xrange(keys.rewards))}
    assert {k: (r.verdict, r.reward, r.reason) for k, r in rewards.items()} == {
        "a0": ("proved", 1.0, ""),
        "a1": ("rejected", 0.0, "sorry"),
        "a2": ("timeout", 0.0, ""),
        "a3": ("rejected", 0.0, "sorry"),  # the scan's: never sent
        "a4": ("proved", 1.0, ""),  # the same proof as a0: its cached verdict, or checked again
    }
    assert 3 <= sum(server.batch_sizes) <= 4 and service.stats()["sandbox_starts"] == 3


async def test_without_trust_repl_a_proof_kimina_accepts_is_an_error_never_a_reward(server):
    """kimina keeps the proof's environment to itself, so the second line cannot audit it: its `proved` is
    the server's word, which code run from the proof can forge. Unless the operator accepts that word, the
    verdict is `error` (retried, never published), and the two modes never share cached verdicts."""
    unconfirmed = KiminaChecker(server.url, timeout_s=60, client=KiminaClient(server.url, timeout_s=60))
    trusting = KiminaChecker(server.url, timeout_s=60, client=KiminaClient(server.url, timeout_s=60), second_line=TRUST)
    try:
        judgement = await unconfirmed.check(THEOREM, attempt())
        assert judgement.verdict == "error" and "trust_repl" in judgement.detail
        assert (await trusting.check(THEOREM, attempt())).verdict == "proved"
        wrong = await unconfirmed.check(THEOREM, attempt("norm_num -- FIXTURE:error"))
        assert (wrong.verdict, wrong.reason) == ("rejected", "lean_error")  # refusals need no second line
        assert unconfirmed.environment != trusting.environment
    finally:
        await unconfirmed.kill()
        await trusting.kill()


def test_make_checkers_passes_the_operators_choice_to_kimina():
    for choice, trusted in (("audit", False), ("trust_repl", True)):
        settings = VerifierSettings(
            tasks=["lean"], sandbox="kimina", kimina_url="http://k:8000", lean_second_line=choice
        )
        assert make_checkers(settings, 0)["lean"].second_line.trust_repl is trusted


# --- auth: `Authorization: Bearer <key>`, as kimina's require_key reads it ----------------------------------

KEY = "sk-kimina-7f3e9b1c-never-logged"


def _logged(capsys) -> tuple[str, list[dict]]:
    out = capsys.readouterr()
    text = out.out + out.err
    return text, [orjson.loads(line) for line in out.err.splitlines() if line.startswith("{")]


@pytest.mark.parametrize(("client_key", "why"), [(None, "none is set"), ("sk-wrong-5d1a", "does not accept")])
async def test_a_server_with_a_key_refuses_a_missing_or_wrong_one_as_an_infrastructure_error(client_key, why, capsys):
    with FakeKimina(api_key=KEY) as server:
        checker = KiminaChecker(
            server.url,
            timeout_s=60,
            second_line=TRUST,
            client=KiminaClient(server.url, timeout_s=60, api_key=client_key),
        )
        try:
            await checker.start()  # /health needs no key
            judgement = await checker.check(THEOREM, attempt())
        finally:
            await checker.kill()
    assert judgement.verdict == "error" and "HTTP 401" in judgement.detail and why in judgement.detail
    assert "PROOFSTREAM_KIMINA_API_KEY" in judgement.detail
    assert server.auth_headers == [f"Bearer {client_key}" if client_key else None]
    text, events = _logged(capsys)
    [event] = [e for e in events if e["event"] == "kimina_auth_refused"]  # one clear line
    assert (event["level"], event["status"], event["key_configured"]) == ("error", 401, client_key is not None)
    assert why in event["detail"]
    assert KEY not in text and (client_key is None or client_key not in text)
    assert client_key is None or client_key not in judgement.detail


async def test_the_right_key_is_sent_as_bearer_and_accepted(capsys):
    with FakeKimina(api_key=KEY) as server:
        checker = KiminaChecker(server.url, timeout_s=60, second_line=TRUST, api_key=KEY, sandbox_id="kimina-key")
        try:
            assert (await checker.check(THEOREM, attempt())).verdict == "proved"
            assert (await checker.check(THEOREM, attempt("norm_num -- FIXTURE:500"))).verdict == "error"
        finally:
            await checker.kill()
    assert server.auth_headers == [f"Bearer {KEY}"] * 2
    text, events = _logged(capsys)
    assert any(e["event"] == "kimina_request_failed" for e in events)  # the 500 was logged, without the key
    assert KEY not in text


def test_the_key_setting_comes_from_the_environment_and_never_shows():
    settings = VerifierSettings.load(
        env={
            "PROOFSTREAM_KIMINA_API_KEY": KEY,
            "PROOFSTREAM_SANDBOX": "kimina",
            "PROOFSTREAM_KIMINA_URL": "http://kimina:8000",
        }
    )
    assert settings.kimina_api_key is not None and settings.kimina_api_key.get_secret_value() == KEY
    assert KEY not in repr(settings) and KEY not in str(settings) and KEY not in str(settings.model_dump())
    assert VerifierSettings.load(env={}).kimina_api_key is None


async def test_the_pool_builds_its_kimina_checker_with_the_key_from_the_environment():
    """The key set in the worker's environment reaches the server through the checkers the pool builds."""
    with FakeKimina(api_key=KEY) as server:
        settings = VerifierSettings.load(
            env={
                "PROOFSTREAM_KIMINA_API_KEY": KEY,
                "PROOFSTREAM_SANDBOX": "kimina",
                "PROOFSTREAM_KIMINA_URL": server.url,
                "PROOFSTREAM_TASKS": '["lean"]',
                "PROOFSTREAM_LEAN_SECOND_LINE": "trust_repl",
            }
        )
        checker = make_checkers(settings, 0)["lean"]
        try:
            assert (await checker.check(THEOREM, attempt())).verdict == "proved"
        finally:
            await checker.kill()
    assert server.auth_headers == [f"Bearer {KEY}"]
