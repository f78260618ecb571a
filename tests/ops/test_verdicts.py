"""`python -m ops verdicts clear --run R` against a real Redis: it deletes that run's verdict cache and no
other key, says how many verdicts it removed, and refuses to run without a run named on the command line."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from consumers.verifier import verdict_digest
from ops.cli import main
from streams.keys import Keys
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
