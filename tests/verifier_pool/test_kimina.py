"""KiminaChecker against a test double of kimina-lean-server's HTTP API (tests/fixtures/fake_kimina.py).

The double is not Lean and not the server: these tests assert our client's behaviour (what it sends, how it
batches, how it reads positions and maps failures to verdicts), never Lean's.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from consumers.service import VerifierService
from streams.publisher import Publisher
from streams.schema import Attempt, Reward, decode
from streams.theorems import Theorem, register
from tests.fixtures.fake_kimina import FakeKimina
from verifier_pool.checkers import JUDGING_DIGEST, CountdownChecker
from verifier_pool.config import VerifierSettings
from verifier_pool.kimina import KiminaChecker, KiminaClient, assemble_snippet, judge_result
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


@pytest.fixture
async def checker(server):
    c = KiminaChecker(server.url, timeout_s=60, client=KiminaClient(server.url, timeout_s=60), second_line=TRUST)
    yield c
    await c.kill()


async def test_proved_sends_header_command_and_axioms_check_in_one_snippet(server, checker):
    assert (await checker.check(THEOREM, attempt())).verdict == "proved"
    [(path, body)] = server.requests
    assert path == "/verify"
    assert body["timeout"] == 60 and body["disable_cache"] is False
    [item] = body["codes"]
    assert set(item) == {"custom_id", "proof"}
    assert item["proof"] == (f"{HEADER.rstrip()}\n{STATEMENT}\n  norm_num [abs_of_nonpos]\n#print axioms {NAME}")


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
        ("norm_num -- FIXTURE:file-positions", "error", ""),  # a server that does not position as 2.0.0
    ],
)
async def test_verdicts(server, checker, tactics, verdict, reason):
    judgement = await checker.check(THEOREM, attempt(tactics))
    assert (judgement.verdict, judgement.reason) == (verdict, reason), judgement
    assert len(server.requests) == 1


async def test_a_report_the_proof_prints_is_not_the_axioms_report(server, checker):
    # The double puts `'NAME' does not depend on any axioms` at the proof's line, as a `trace` could.
    assert (await checker.check(THEOREM, attempt("norm_num -- FIXTURE:forge"))).verdict == "proved"
    judgement = await checker.check(THEOREM, attempt("norm_num -- FIXTURE:forge FIXTURE:axiom=sorryAx"))
    assert (judgement.verdict, judgement.reason) == ("rejected", "sorry")


@pytest.mark.parametrize(
    "text",
    [
        attempt("sorry"),
        attempt("norm_num\n#print axioms mathd_algebra_10"),
        attempt("native_decide"),
        attempt("exact?"),
        attempt("norm_num\naxiom cheat : False"),
        "```lean4\ntheorem mathd_algebra_10 : (1 : ℕ) = 1 := by\n  rfl\n```",  # altered statement
    ],
)
async def test_integrity_rejections_never_reach_the_server(server, checker, text):
    judgement = await checker.check(THEOREM, text)
    assert judgement.verdict == "rejected" and judgement.reason in ("sorry", "integrity"), judgement
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
    assert set(body["snippets"][0]) == {"id", "code"} and body["snippets"][0]["code"].startswith(HEADER.rstrip())
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


def test_the_axioms_line_is_counted_in_the_body_as_kimina_splits_it():
    # Leading import and blank lines go to kimina's header REPL; the body starts at `open`.
    command = f"{STATEMENT}\n  norm_num"
    code, line = assemble_snippet("import Mathlib\n\nimport Aesop\n\nopen Real\n", command, NAME)
    assert code.splitlines()[-1] == f"#print axioms {NAME}"
    assert line == 4  # open Real / statement / norm_num / #print
    # Lines as str.splitlines cuts them (kimina rejoins the body with \n): \u2028 and \x0c count as breaks.
    _, line = assemble_snippet("import Mathlib", f"{STATEMENT}\n  norm_num\u2028  simp\x0c", NAME)
    assert line == 4


def _report(line: int, axioms: str = "propext") -> dict:
    return {"severity": "info", "pos": {"line": line, "column": 0}, "endPos": None,
            "data": f"'{NAME}' depends on axioms: [{axioms}]"}  # fmt: skip


@pytest.mark.parametrize(
    ("messages", "verdict", "reason"),
    [
        ([_report(5)], "proved", ""),
        ([_report(4)], "error", ""),  # not at the command's line: no report
        ([_report(4), _report(5, "sorryAx")], "rejected", "sorry"),  # the earlier one is the proof's
        ([_report(5), _report(5)], "rejected", "integrity"),  # two reports for one command
        ([_report(5), _report(6)], "error", ""),  # past the last line: not body coordinates
    ],
)
def test_judge_result_reads_the_report_only_at_the_command_line(messages, verdict, reason):
    judgement = judge_result({"response": {"env": 3, "messages": messages}}, NAME, 5)
    assert (judgement.verdict, judgement.reason) == (verdict, reason), judgement


def test_make_checkers_builds_kimina_checkers_that_share_a_client():
    settings = VerifierSettings(sandbox="kimina", kimina_url="http://kimina.invalid:8000", tasks=["lean", "countdown"],
                                lean_toolchain="v4.19.0")  # fmt: skip
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
    await Publisher(redis, keys).publish([
        Attempt(attempt_id=f"a{i}", work_id="w", theorem_id=THEOREM.theorem_id, policy_version=0, sample_index=i,
                proof=attempt(t)) for i, t in enumerate(tactics)
    ])  # fmt: skip
    settings = VerifierSettings.load(env={}, flags={"run": keys.run, "concurrency": 3, "tasks": ["lean"],
                                                    "sandbox": "kimina", "kimina_url": server.url,
                                                    "lean_second_line": "trust_repl"})  # fmt: skip
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
        settings = VerifierSettings(tasks=["lean"], sandbox="kimina", kimina_url="http://k:8000",
                                    lean_second_line=choice)  # fmt: skip
        assert make_checkers(settings, 0)["lean"].second_line.trust_repl is trusted
