"""`python -m ops verdicts clear --run R` against a real Redis: it deletes that run's verdict cache and no
other key, says how many verdicts it removed, and refuses to run without a run named on the command line."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from consumers.verifier import verdict_digest
from ops.cli import main
from streams.codec import encode
from streams.keys import Keys
from streams.schema import Reward
from streams.theorems import Theorem
from verifier_pool.judgement import Judgement

pytestmark = pytest.mark.timeout(30)


async def fill(redis, run: str, count: int) -> Keys:
    keys = Keys(run)
    theorem = Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)
    for i in range(count):
        digest = verdict_digest(theorem, f"<answer>{i}</answer>", "countdown-checker-v2|x|sha256:1")
        await redis.hset(keys.verdicts, digest, Judgement("rejected", "wrong_answer", str(i), 0.1).encode())
    await redis.xadd(keys.stream("rewards"), {"k": "v"})  # another key of the run: must survive
    return keys


async def ops(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))  # main runs its own event loop
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_clear_removes_that_runs_verdicts_and_says_how_many(redis, redis_url, capsys):
    finished, other = await fill(redis, "finished-run", 3), await fill(redis, "other-run", 2)
    code, out, _ = await ops(capsys, "verdicts", "clear", "--run", "finished-run", "--redis-url", redis_url)
    assert code == 0
    assert out.strip() == f"removed 3 cached verdicts of run finished-run ({finished.verdicts})"
    assert await redis.exists(finished.verdicts) == 0
    assert await redis.xlen(finished.stream("rewards")) == 1  # only the cache goes
    assert await redis.hlen(other.verdicts) == 2
    code, out, _ = await ops(capsys, "verdicts", "clear", "--run", "finished-run", "--redis-url", redis_url, "--json")
    assert (code, orjson.loads(out)) == (0, {"run": "finished-run", "key": finished.verdicts, "removed": 0})


async def test_clear_refuses_without_a_run_on_the_command_line(redis, redis_url, capsys, monkeypatch):
    keys = await fill(redis, "default", 2)
    named = await fill(redis, "from-env", 2)
    monkeypatch.setenv("PROOFSTREAM_RUN", "from-env")  # a run from the environment is not enough to delete
    code, out, err = await ops(capsys, "verdicts", "clear", "--redis-url", redis_url)
    assert code == 2 and out == ""
    assert "--run" in err
    assert await redis.hlen(keys.verdicts) == 2 and await redis.hlen(named.verdicts) == 2


# --- `python -m ops verdicts reasons` ----------------------------------------------------------------------------


def reward(i: int, verdict: str, reason: str = "", detail: str = "") -> Reward:
    return Reward(f"a{i}", "t", 0, verdict, 1.0 if verdict == "proved" else 0.0, reason=reason, detail=detail)


async def test_reasons_count_the_newest_verdicts_and_the_refusals_by_reason_and_rule(redis, redis_url, capsys):
    keys = Keys("counted")
    rewards = [
        reward(0, "proved"),
        reward(
            1,
            "rejected",
            "statement_mismatch",
            "the statement of `t` differs from the dataset's at line 3 of the attempt: `13` where the dataset has `12`",
        ),
        reward(2, "rejected", "integrity", "helper `h`: forbidden: native_decide"),
        reward(3, "rejected", "integrity", "helper `other_name`: forbidden: native_decide"),
        reward(4, "rejected", "sorry", "forbidden: sorry"),
        reward(5, "timeout"),
        reward(6, "proved"),
    ]
    for r in rewards:
        await redis.xadd(keys.rewards, encode(r))
    await redis.xadd(keys.rewards, {b"v": b"999"})  # another schema version: counted nowhere
    code, out, _ = await ops(capsys, "verdicts", "reasons", "--run", "counted", "--redis-url", redis_url, "--json")
    assert code == 0
    assert orjson.loads(out) == {
        "run": "counted",
        "counted": 7,
        "by_verdict": {"rejected": 4, "proved": 2, "timeout": 1},
        "refused_by_reason": {"integrity": 2, "statement_mismatch": 1, "sorry": 1},
        "refused_by_rule": {
            "integrity: helper: forbidden: native_decide": 2,
            "statement_mismatch: the statement of … differs from the dataset's at … of the attempt: … where the "
            "dataset has …": 1,
            "sorry: forbidden: sorry": 1,
        },
    }
    code, out, _ = await ops(capsys, "verdicts", "reasons", "--run", "counted", "--redis-url", redis_url, "-n", "2")
    assert code == 2  # `-n` is no option of reasons: argparse refuses it
    code, out, _ = await ops(
        capsys, "verdicts", "reasons", "--run", "counted", "--redis-url", redis_url, "--newest", "3"
    )
    # the three newest entries: the foreign one, then rewards 6 and 5
    assert (code, out.splitlines()[0]) == (0, "run counted: the newest 2 verdicts: proved 1, timeout 1")


async def test_a_rule_is_fixed_words_whatever_the_model_wrote(redis, redis_url, capsys):
    """Countdown refusals are counted by the checker's rule word, never by the answer quoted after it (nor
    by an older detail that was all answer); a Lean message by its first line, the attempt's words out."""
    keys = Keys("words")
    details = [
        ("wrong_answer", 'equation: "1 + 2" = 3, not "3\\n\\nThe answer is 3."'),
        ("wrong_answer", 'equation: "7 - 1" = 6, not "\\u001b]52;c;cm0g…"'),
        ("wrong_answer", 'value: "3 + 4" = 7, not 12'),
        ("wrong_answer", 'value: "5 + 4" = 9, not 12'),
        ("wrong_answer", "1 + 2 = 3, not 3\n\nThe answer is 3."),  # a detail of before this rule
        ("wrong_answer", "format: no expression found"),
        ("lean_error", "unknown identifier 'h\x1b[2J'\nx : ℕ\n⊢ x = x"),
        ("lean_error", "unsolved goals\nx : ℕ\n⊢ 2 = 3"),
    ]
    for i, (reason, detail) in enumerate(details):
        await redis.xadd(keys.rewards, encode(reward(i, "rejected", reason, detail)))
    code, out, _ = await ops(capsys, "verdicts", "reasons", "--run", "words", "--redis-url", redis_url, "--json")
    assert code == 0
    assert orjson.loads(out)["refused_by_rule"] == {
        "wrong_answer: equation": 2,
        "wrong_answer: value": 2,
        "wrong_answer: other": 1,
        "wrong_answer: format": 1,
        "lean_error: unknown identifier …": 1,
        "lean_error: unsolved goals": 1,
    }
    code, out, _ = await ops(capsys, "verdicts", "reasons", "--run", "words", "--redis-url", redis_url)
    assert code == 0 and all(line.isprintable() for line in out.splitlines())  # one rule a line, no escapes
    assert all(line.startswith(("run ", "refused by ", "  ")) for line in out.splitlines()), out
