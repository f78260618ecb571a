"""The verifier consumer end to end: real Redis, real process sandboxes (bubblewrap or unshare), the real
Countdown checker, and the REPL test double standing in for Lean (it drives our plumbing; it says
nothing about Lean)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
import redis as redis_sync

from consumers.service import VerifierService
from consumers.verifier import VerifyHandler, verdict_digest
from ops.deploy import health
from streams.codec import decode
from streams.groups import group_states
from streams.keys import VERIFIERS
from streams.publisher import Publisher
from streams.runtime import Delivery
from streams.schema import Attempt, DeadLetter, Reward
from streams.theorems import Theorem, register
from tests import fixtures
from verifier_pool import docker_backend, docker_daemon, process
from verifier_pool.checkers import JUDGING_DIGEST, CountdownChecker, LeanChecker
from verifier_pool.config import VerifierSettings
from verifier_pool.judgement import Judgement
from verifier_pool.lean_audit import SecondLine
from verifier_pool.pool import COUNTDOWN_HANDSHAKE, PROJECT_ROOT, _base_python, _python_paths
from verifier_pool.sandbox import SandboxUnavailable
from verifier_pool.sandbox_config import CHECKER_IMAGE, DockerSandboxConfig, ProcessSandboxConfig

pytestmark = pytest.mark.skipif(process.available() is None, reason="neither bubblewrap nor unshare works here")

FAKE_REPL = str(fixtures.FAKE_REPL)
STATEMENT = "theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 12 := by"
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n"
# The consumer's plumbing is under test here; the second line has its own (tests/verifier_pool/test_lean_audit.py).
REPL_WORD = SecondLine(audit=None, trust_repl=True)


def attempt(i: int, theorem_id: str, proof: str) -> Attempt:
    return Attempt(
        attempt_id=f"a{i}",
        work_id="w",
        theorem_id=theorem_id,
        policy_version=0,
        sample_index=i,
        proof=proof,
        task="countdown",
    )


async def wait_settled(redis, keys, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:  # polls the group's own figures: the condition under test
        states = [g for g in await group_states(redis, keys.attempts) if g.name == VERIFIERS]
        if states and states[0].outstanding == 0:
            return
        assert time.monotonic() < deadline, f"not settled: {states}"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def countdown_pool(redis_url: str, keys):
    """A started Countdown pool of one slot on process sandboxes, stopped (drained) on leaving."""
    settings = VerifierSettings.load(
        env={}, flags={"run": keys.run, "concurrency": 1, "tasks": ["countdown"], "sandbox": "process"}
    )
    service = VerifierService(settings, redis_url)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def rewards_by_attempt(redis, keys) -> dict[str, Reward]:
    out = {}
    for _, fields in await redis.xrange(keys.rewards):
        r = decode(Reward, fields)
        assert r.attempt_id not in out, "a reward was published twice"
        out[r.attempt_id] = r
    return out


@pytest.mark.parametrize("sandbox", ["process", "docker"])
async def test_countdown_pool_turns_attempts_into_rewards(redis, redis_url, keys, sandbox):
    if sandbox == "docker" and (why := docker_daemon.why_unavailable(CHECKER_IMAGE)):
        pytest.skip(f"docker sandbox: {why}")
    await register(redis, keys, [Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)])
    proofs = [
        "<answer>3*4+7</answer>",
        "<answer>3+4+7</answer>",
        "<answer>3*4+7</answer>",
        "<answer>__import__('os')</answer>",
    ]
    attempts = [attempt(i, "cd1", p) for i, p in enumerate(proofs)] + [attempt(9, "no-such-theorem", "1")]
    pub = Publisher(redis, keys)
    await pub.publish([a for a in attempts if a.attempt_id != "a2"])
    settings = VerifierSettings.load(
        env={}, flags={"run": keys.run, "concurrency": 2, "tasks": ["countdown"], "sandbox": sandbox}
    )
    service = VerifierService(settings, redis_url)
    await service.start()
    try:
        await wait_settled(redis, keys)
        await pub.publish([attempts[2]])  # the same proof again, once the first verdict is cached
        await wait_settled(redis, keys)
    finally:
        await service.stop()
    got = await rewards_by_attempt(redis, keys)
    assert {k: (r.verdict, r.reward, r.reason) for k, r in got.items()} == {
        "a0": ("proved", 1.0, ""),
        # partial credit: format, parses, right numbers, 14 is 5 from 19 (tasks/countdown_check.py)
        "a1": ("rejected", round(0.1 + 0.1 + 0.3 + 0.3 * (1 - 5 / 19), 6), "wrong_answer"),
        "a2": ("proved", 1.0, ""),
        "a3": ("rejected", 0.1, "wrong_answer"),  # the format alone
    }
    assert (got["a0"].cached, got["a2"].cached) == (False, True)  # the repeated proof cost no sandbox time
    # a refusal's detail leads with the checker's rule word; the answer is quoted after it
    assert (got["a1"].detail, got["a3"].detail) == (
        'value: "3+4+7" = 14, not 19',
        "syntax: ValueError in \"__import__('os')\"",
    )
    [(_, fields)] = await redis.xrange(keys.dlq)
    assert "not registered" in decode(DeadLetter, fields).reason
    stats = service.stats()
    assert stats["processed"] == 5 and stats["sandbox_starts"] == 2


def fake_lean_checker(**kwargs) -> LeanChecker:
    config = ProcessSandboxConfig(
        argv=(sys.executable, FAKE_REPL),
        ro_paths=(*_python_paths(),),
        workdir=PROJECT_ROOT,
        memory_limit_bytes=1 << 30,
        **kwargs,
    )
    return LeanChecker(process.ProcessSandbox(config), proof_timeout_s=2.0, header_timeout_s=5.0, second_line=REPL_WORD)


@pytest.mark.parametrize(
    "proof, verdict, reason",
    [
        (f"{STATEMENT}\n  norm_num", "proved", ""),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:sorry", "rejected", "sorry"),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:error", "rejected", "lean_error"),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:axiom=sorryAx", "rejected", "sorry"),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:axiom=Lean.ofReduceBool", "rejected", "integrity"),
        (f"{STATEMENT}\n  native_decide", "rejected", "integrity"),
        ("theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 13 := by\n  norm_num", "rejected", "statement_mismatch"),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:hang", "timeout", ""),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:crash", "rejected", "lean_error"),
    ],
)
async def test_lean_checker_plumbing(proof, verdict, reason):
    checker = fake_lean_checker()
    await checker.sandbox.start()
    try:
        theorem = Theorem("t", "lean", statement=STATEMENT, header=HEADER)
        j = await checker.check(theorem, proof)
        assert (j.verdict, j.reason) == (verdict, reason), j.detail
        # Whatever happened, the sandbox answers the next proof (restarted if it had to be).
        again = await checker.check(theorem, f"{STATEMENT}\n  norm_num")
        assert again.verdict == "proved", again.detail
    finally:
        await checker.sandbox.kill()


async def test_header_is_elaborated_once_per_repl_process():
    checker = fake_lean_checker(max_requests=7)
    await checker.sandbox.start()
    try:
        theorem = Theorem("t", "lean", statement=STATEMENT, header=HEADER)
        for _ in range(3):  # header + 3 x (proof, #print axioms) = 7 requests: then the REPL is recycled
            assert (await checker.check(theorem, f"{STATEMENT}\n  norm_num")).verdict == "proved"
        assert checker.sandbox.stats().starts == 2
        assert (await checker.check(theorem, f"{STATEMENT}\n  norm_num")).verdict == "proved"  # header again
        assert checker.sandbox.stats().requests == 3
    finally:
        await checker.sandbox.kill()


MISSING_IMAGE = f"proofstream-pytest-missing-{uuid.uuid4().hex[:8]}:latest"


def unstartable_countdown(settings: VerifierSettings, index: int) -> dict:
    """A real process sandbox whose interpreter does not exist."""
    config = ProcessSandboxConfig(
        argv=("/nonexistent/python3", "-m", "tasks.countdown_check"), ro_paths=_python_paths(), workdir=PROJECT_ROOT
    )
    return {"countdown": CountdownChecker(process.ProcessSandbox(config, sandbox_id=f"broken-{index}"))}


async def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():  # an observable condition of the consumer runtime, polled
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("failure", ["missing image", "no docker daemon", "missing interpreter"])
async def test_a_sandbox_that_cannot_start_is_never_a_reward(redis, redis_url, keys, failure, capsys, monkeypatch):
    """End to end through the service: no reward, nothing cached, redelivered, then dead-lettered with the
    sandbox's failure as the reason; the worker stays up and its health check is red meanwhile."""
    if failure == "missing image" and (why := docker_daemon.why_unavailable(CHECKER_IMAGE)):
        pytest.skip(f"docker sandbox: {why}")
    if failure == "no docker daemon":
        monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    await register(redis, keys, [Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)])
    backend = "process" if failure == "missing interpreter" else "docker"
    settings = VerifierSettings.load(
        env={},
        flags={
            "run": keys.run,
            "concurrency": 1,
            "tasks": ["countdown"],
            "sandbox": backend,
            "max_deliveries": 3,
            "checker_image": MISSING_IMAGE,
        },
    )
    cause = {
        "missing image": "not found",
        "no docker daemon": "no Docker daemon answers",
        "missing interpreter": "/nonexistent/python3",
    }[failure]
    service = VerifierService(settings, redis_url, unstartable_countdown if backend == "process" else None)
    capsys.readouterr()
    await service.start()
    try:
        [(sandbox_id, why)] = service.unavailable().items()
        assert cause in why
        logged = [orjson.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
        [event] = [e for e in logged if e["event"] == "sandbox_unavailable"]  # one clear line, with the cause
        assert (event["level"], event["sandbox_id"]) == ("error", sandbox_id) and cause in event["error"]
        sync = redis_sync.Redis.from_url(redis_url)
        try:  # reported at start: the health check is red before any attempt arrives
            problem = health.check_verifier(sync, keys, max_age_s=60)
        finally:
            sync.close()
        assert problem is not None and "cannot start" in problem and sandbox_id in problem
        await Publisher(redis, keys).publish([attempt(0, "cd1", "<answer>3*4+7</answer>")])

        async def dead_lettered() -> bool:
            return await redis.xlen(keys.dlq) == 1

        await wait_for(dead_lettered, 60, "the dead letter")
        await wait_settled(redis, keys)
    finally:
        await service.stop()
    assert await redis.xlen(keys.rewards) == 0
    assert await redis.hlen(keys.verdicts) == 0
    [(_, fields)] = await redis.xrange(keys.dlq)
    letter = decode(DeadLetter, fields)
    assert letter.deliveries == 3  # redelivered: each of the 3 deliveries found the sandbox down
    assert "sandbox unavailable" in letter.reason and cause in letter.reason, letter.reason
    assert letter.reason.startswith("infrastructure: verifier: no verdict on any of 3 deliveries")  # not poison
    assert service.stats()["transient_failures"] == 2  # the first two stayed pending and were retried


@pytest.mark.timeout(120)
async def test_a_slot_recovers_once_its_image_exists_and_caches_under_it(redis, redis_url, keys):
    """The same worker, once the missing image is built: its next check starts the sandbox, the attempt gets
    its real verdict, the health check turns green, and the verdict is cached under the image's id."""
    if why := docker_daemon.why_unavailable(CHECKER_IMAGE):
        pytest.skip(f"docker sandbox: {why}")
    import docker

    await register(redis, keys, [Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)])
    settings = VerifierSettings.load(
        env={},
        flags={
            "run": keys.run,
            "concurrency": 1,
            "tasks": ["countdown"],
            "sandbox": "docker",
            "max_deliveries": 50,
            "checker_image": MISSING_IMAGE,
        },
    )
    client = docker.from_env()
    service = VerifierService(settings, redis_url)
    await service.start()
    try:
        assert service.unavailable()
        await Publisher(redis, keys).publish([attempt(0, "cd1", "<answer>3*4+7</answer>")])

        async def failed_once() -> bool:
            return service.stats()["transient_failures"] >= 1

        await wait_for(failed_once, 60, "a failed delivery")
        image = client.images.get(CHECKER_IMAGE)
        image.tag(MISSING_IMAGE)  # "built" now: the next delivery starts the sandbox

        async def rewarded() -> bool:
            return await redis.xlen(keys.rewards) == 1

        await wait_for(rewarded, 60, "the reward")
        assert service.unavailable() == {}
        await service.report()
        sync = redis_sync.Redis.from_url(redis_url)
        try:
            assert health.check_verifier(sync, keys, max_age_s=60) is None
        finally:
            sync.close()
    finally:
        await service.stop()
        client.images.remove(MISSING_IMAGE, noprune=True)
        client.close()
    [reward] = (await rewards_by_attempt(redis, keys)).values()
    assert (reward.verdict, reward.cached) == ("proved", False)
    [environment] = [c.environment for checkers in service.checkers for c in checkers.values()]
    assert image.id in environment
    stored = await redis.hgetall(keys.verdicts)
    assert list(stored) == [
        verdict_digest(
            Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19), "<answer>3*4+7</answer>", environment
        ).encode()
    ]


@pytest.mark.timeout(120)
async def test_a_rebuilt_image_is_never_served_the_old_images_verdicts(redis, keys):
    """The verdict cache key holds the sandbox's identity: a verdict cached by one image is served to the same
    image and never to a rebuilt one (a new image id), which judges afresh."""
    if why := docker_daemon.why_unavailable(CHECKER_IMAGE):
        pytest.skip(f"docker sandbox: {why}")
    import io

    import docker

    client = docker.from_env()
    rebuilt = f"proofstream-pytest-rebuilt-{uuid.uuid4().hex[:8]}:latest"
    dockerfile = f"FROM {CHECKER_IMAGE}\nLABEL proofstream.pytest-rebuilt={rebuilt}\n"
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=rebuilt, rm=True)
    theorem = Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)
    await register(redis, keys, [theorem])
    wrong = "<answer>3+4+7</answer>"
    checkers = []

    def checker(image: str) -> CountdownChecker:
        config = DockerSandboxConfig(
            image=image, argv=docker_backend.COUNTDOWN_ARGV, handshake=COUNTDOWN_HANDSHAKE, memory_limit_bytes=256 << 20
        )
        checkers.append(CountdownChecker(docker_backend.DockerSandbox(config)))
        return checkers[-1]

    async def judge(c: CountdownChecker, i: int) -> Reward:
        handler = VerifyHandler(redis, keys, {"countdown": c}, c.sandbox.sandbox_id)
        [reward] = await handler(Delivery(b"0-1", attempt(i, "cd1", wrong), 1))
        return reward

    try:
        old, new = checker(CHECKER_IMAGE), checker(rebuilt)
        await asyncio.gather(old.sandbox.start(), new.sandbox.start())
        assert old.sandbox.identity != new.sandbox.identity and old.environment != new.environment
        first = await judge(old, 0)
        assert (first.verdict, first.cached) == ("rejected", False)
        # As if the old image had judged it wrongly: its cached verdict now says proved.
        [digest] = await redis.hkeys(keys.verdicts)
        await redis.hset(keys.verdicts, digest, Judgement("proved", "", "from the old image").encode())
        served = await judge(old, 1)
        assert (served.verdict, served.cached) == ("proved", True)  # the same image is served its own
        fresh = await judge(new, 2)
        assert (fresh.verdict, fresh.reward, fresh.cached) == ("rejected", first.reward, False)
        assert await redis.hlen(keys.verdicts) == 2  # one per environment
    finally:
        await asyncio.gather(*(c.sandbox.kill() for c in checkers), return_exceptions=True)
        client.images.remove(rebuilt, noprune=True)
        client.close()


async def test_environment_is_unknown_until_the_sandbox_answered_and_after_a_failed_start():
    """No cache key while what would judge is unknown: before the first start, after a start that failed
    (a removed image), and while that lasts; the image's identity again once a start succeeds."""
    if why := docker_daemon.why_unavailable(CHECKER_IMAGE):
        pytest.skip(f"docker sandbox: {why}")
    good = DockerSandboxConfig(
        image=CHECKER_IMAGE,
        argv=docker_backend.COUNTDOWN_ARGV,
        handshake=COUNTDOWN_HANDSHAKE,
        memory_limit_bytes=256 << 20,
    )
    sandbox = docker_backend.DockerSandbox(good)
    checker = CountdownChecker(sandbox)
    theorem = Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)
    try:
        assert checker.environment is None
        await sandbox.start()
        assert sandbox.identity.startswith("sha256:") and sandbox.identity in checker.environment
        sandbox.config = dataclasses.replace(good, image=MISSING_IMAGE)  # the image removed: restarts fail
        with pytest.raises(SandboxUnavailable):
            await sandbox.start()
        assert checker.environment is None
        judgement = await checker.check(theorem, "<answer>3*4+7</answer>")  # its restart fails too
        assert (judgement.verdict, checker.environment) == ("error", None)
        assert MISSING_IMAGE in checker.unavailable
        sandbox.config = good
        assert (await checker.check(theorem, "<answer>3*4+7</answer>")).verdict == "proved"
        assert checker.unavailable is None and sandbox.identity in checker.environment
    finally:
        await sandbox.kill()


async def test_a_crash_whose_replacement_cannot_start_is_an_error_not_the_proofs():
    """After a crash the check runs again on a fresh sandbox; when that one cannot start, the verdict is the
    infrastructure's `error`, not the second crash the proof would otherwise be blamed for."""
    if why := docker_daemon.why_unavailable(CHECKER_IMAGE):
        pytest.skip(f"docker sandbox: {why}")
    fake_repl = ("python3", "-c", Path(FAKE_REPL).read_text())  # the image's python3 runs the test double
    good = DockerSandboxConfig(image=CHECKER_IMAGE, argv=fake_repl, memory_limit_bytes=256 << 20)
    sandbox = docker_backend.DockerSandbox(good)
    checker = LeanChecker(sandbox, proof_timeout_s=10, header_timeout_s=10, second_line=REPL_WORD)
    theorem = Theorem("t", "lean", statement=STATEMENT, header=HEADER)
    crash = f"{STATEMENT}\n  norm_num -- FIXTURE:crash"
    try:
        await sandbox.start()
        assert (await checker.check(theorem, f"{STATEMENT}\n  norm_num")).verdict == "proved"
        sandbox.config = dataclasses.replace(good, image=MISSING_IMAGE)  # the image removed while it ran
        judgement = await checker.check(theorem, crash)
        assert judgement.verdict == "error" and MISSING_IMAGE in judgement.detail, judgement
        sandbox.config = good  # with a sandbox to restart, the same input crashing twice is the proof's
        again = await checker.check(theorem, crash)
        assert (again.verdict, again.reason) == ("rejected", "lean_error"), again
        assert sandbox.stats().crashes == 3
    finally:
        await sandbox.kill()


async def test_a_lazily_recycled_repl_is_not_asked_for_the_old_ones_env_ids():
    """The docker sandbox recycles inside the next request (after max_requests): the REPL that answers it knows
    none of the env ids the checker holds. Each check still gets its verdict, never an `error`."""
    if why := docker_daemon.why_unavailable(CHECKER_IMAGE):
        pytest.skip(f"docker sandbox: {why}")
    fake_repl = ("python3", "-c", Path(FAKE_REPL).read_text())
    config = DockerSandboxConfig(image=CHECKER_IMAGE, argv=fake_repl, memory_limit_bytes=256 << 20, max_requests=4)
    sandbox = docker_backend.DockerSandbox(config)
    checker = LeanChecker(sandbox, proof_timeout_s=10, header_timeout_s=10, second_line=REPL_WORD)
    theorem = Theorem("t", "lean", statement=STATEMENT, header=HEADER)
    try:
        await sandbox.start()
        proofs = [f"{STATEMENT}\n  norm_num", f"{STATEMENT}\n  norm_num -- FIXTURE:sorry"] * 3
        verdicts = [(j.verdict, j.reason) for j in [await checker.check(theorem, p) for p in proofs]]
        assert verdicts == [("proved", ""), ("rejected", "sorry")] * 3
        assert sandbox.stats().starts >= 3  # recycled along the way
    finally:
        await sandbox.kill()


@pytest.mark.parametrize(
    "edited",
    [
        "verifier_pool/checkers.py",
        "verifier_pool/lean_check.py",
        "verifier_pool/lean_commands.py",
        "verifier_pool/lean_preamble.py",
        "verifier_pool/lean_scan.py",
        "verifier_pool/kimina.py",
        "tasks/lean_proof.py",
        "tasks/lean_text.py",
    ],
)
def test_an_edited_judging_module_changes_every_checkers_environment(tmp_path, edited):
    """A copy of verifier_pool and tasks with one judging module edited (a comment added) judges under another
    environment, so its verdicts and the old ones never share a cache key; an unedited copy shares it."""
    import shutil
    import subprocess

    def digest_of(root: Path) -> str:
        code = "from verifier_pool.checkers import JUDGING_DIGEST; print(JUDGING_DIGEST)"
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    for name in ("same", "edited"):
        shutil.copytree(Path(PROJECT_ROOT) / "verifier_pool", tmp_path / name / "verifier_pool")
        shutil.copytree(Path(PROJECT_ROOT) / "streams", tmp_path / name / "streams")
        shutil.copytree(Path(PROJECT_ROOT) / "tasks", tmp_path / name / "tasks")
    with open(tmp_path / "edited" / edited, "a") as f:
        f.write("\n# edited\n")
    assert digest_of(tmp_path / "same") == JUDGING_DIGEST  # this process's, from the checkout
    assert digest_of(tmp_path / "edited") != JUDGING_DIGEST


async def test_a_verdict_reached_without_the_sandbox_is_published_but_not_cached_while_it_is_down(redis, keys):
    """An altered statement is rejected by the text checks alone, before any sandbox time: its reward does not
    wait for a sandbox that cannot start, but with no environment known it is not cached."""
    theorem = Theorem("t", "lean", statement=STATEMENT, header=HEADER)
    await register(redis, keys, [theorem])
    config = ProcessSandboxConfig(argv=("/nonexistent/repl",))
    checker = LeanChecker(process.ProcessSandbox(config), proof_timeout_s=1, header_timeout_s=1)
    handler = VerifyHandler(redis, keys, {"lean": checker}, "down")
    altered = "theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 13 := by\n  norm_num"
    [reward] = await handler(Delivery(b"0-1", attempt(0, "t", altered), 1))
    assert (reward.verdict, reward.reason, reward.reward) == ("rejected", "statement_mismatch", 0.0)
    assert not reward.cached
    assert checker.environment is None and await redis.hlen(keys.verdicts) == 0


async def test_a_batch_of_repeats_is_served_by_one_cache_lookup_per_read(redis, redis_url, keys):
    """A Countdown pool reads attempts in batches (VerifierSettings.batch_size) and looks their verdicts up in
    one HMGET per batch: counted by Redis itself (INFO commandstats), not by our code."""
    await register(redis, keys, [Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)])
    proofs = ["<answer>3*4+7</answer>", "<answer>3+4+7</answer>", "<answer>7*4-3</answer>", "<answer>x</answer>"]
    pub = Publisher(redis, keys)
    await pub.publish([attempt(i, "cd1", p) for i, p in enumerate(proofs)])
    async with countdown_pool(redis_url, keys) as service:
        assert service.settings.batch_size == 16
        await wait_settled(redis, keys)
    # 40 repeats of the 4 judged proofs (a duplicate pair inside every batch), and one unknown theorem,
    # all waiting before the next pool starts: every read takes a full batch.
    repeats = [attempt(100 + i, "cd1", proofs[i % 4]) for i in range(40)] + [attempt(999, "no-such-theorem", "1")]
    await pub.publish(repeats)
    await redis.config_resetstat()
    async with countdown_pool(redis_url, keys):
        await wait_settled(redis, keys)
    stats = await redis.info("commandstats")
    got = await rewards_by_attempt(redis, keys)
    # Every repeat a cache hit, the duplicates inside a batch included.
    assert sorted(k for k, r in got.items() if r.cached) == sorted(f"a{100 + i}" for i in range(40))
    assert {got[f"a{100 + i}"].verdict for i in range(0, 40, 4)} == {"proved"}
    # No verdict looked up one attempt at a time: HGET only for theorems (two tasks, two ids, the unknown twice).
    assert stats.get("cmdstat_hget", {"calls": 0})["calls"] <= 6, stats.get("cmdstat_hget")
    hmgets = stats["cmdstat_hmget"]["calls"]
    assert 3 <= hmgets <= 6, stats["cmdstat_hmget"]  # 41 attempts in reads of up to 16 by two tasks
    [(_, fields)] = await redis.xrange(keys.dlq)
    assert "not registered" in decode(DeadLetter, fields).reason


async def test_a_batchs_verdicts_are_cached_in_one_write_when_its_last_attempt_is_judged(redis, redis_url, keys):
    """The verdicts a batch's checks reach are cached together after its last attempt (a round trip between
    two checks left the slot's sandbox idle): counted by Redis itself, and all in the cache before the stop."""
    await register(redis, keys, [Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)])
    # 20 distinct texts: every fourth the solution (trailing spaces differ), the rest a number not given.
    proofs = [
        f"<answer>3*4+7</answer>{' ' * i}" if i % 4 == 0 else f"<answer>3*4+7+{i}-{i}</answer>" for i in range(20)
    ]
    await Publisher(redis, keys).publish([attempt(i, "cd1", p) for i, p in enumerate(proofs)])
    await redis.config_resetstat()
    async with countdown_pool(redis_url, keys):
        await wait_settled(redis, keys)
        cached = await redis.hvals(keys.verdicts)  # before the stop, which stores what a cut batch judged
        hsets = (await redis.info("commandstats"))["cmdstat_hset"]["calls"] - 1  # less the pool's figures at start
    got = await rewards_by_attempt(redis, keys)
    assert {k: r.verdict for k, r in got.items()} == {
        f"a{i}": "proved" if i % 4 == 0 else "rejected" for i in range(20)
    }
    assert sorted(Judgement.decode(v).verdict for v in cached) == ["proved"] * 5 + ["rejected"] * 15
    # Two tasks read the 20 in batches of 16: at most three reads with attempts, one write each, not one a check.
    assert 1 <= hsets <= 3


async def test_a_countdown_batch_is_judged_in_one_exchange_per_read(redis, redis_url, keys):
    """Countdown's checks take well under a millisecond, so a task sends the misses of the batch it read in one
    request (CountdownChecker.check_many) instead of one exchange each: counted by the sandbox, and every
    verdict the one the checker gives that answer alone (expected values from the rules, not the code)."""
    await register(redis, keys, [Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)])
    # 20 distinct texts: every fourth the solution (trailing spaces differ), the rest use a number not given.
    proofs = [f"<answer>3*4+7</answer>{' ' * i}" if i % 4 == 0 else f"<answer>3*4+{20 + i}</answer>" for i in range(20)]
    await Publisher(redis, keys).publish([attempt(i, "cd1", p) for i, p in enumerate(proofs)])
    async with countdown_pool(redis_url, keys) as service:
        await wait_settled(redis, keys)
        exchanges = service.checkers[0]["countdown"].sandbox.stats().total_requests
    got = await rewards_by_attempt(redis, keys)
    wrong = 0.1 + 0.1  # format and parses; the numbers are not the given ones (tasks/countdown_check.py)
    assert {k: (r.verdict, r.reward, r.cached) for k, r in got.items()} == {
        f"a{i}": ("proved", 1.0, False) if i % 4 == 0 else ("rejected", round(wrong, 6), False) for i in range(20)
    }
    assert all(r.verify_ms > 0 for r in got.values())
    # Two tasks read the 20 in batches of up to 16: one exchange a read (one each, 20 checks).
    assert 1 <= exchanges <= 3, exchanges
    assert service.stats()["sandbox_crashes"] == service.stats()["sandbox_timeouts"] == 0


# The Countdown checker with batches answered badly (tasks.countdown_check's own code otherwise).
_BAD_BATCHES = {
    "unknown": "{'message': 'unknown request'}",  # an older checker image, before batches
    "hang": "time.sleep(60)",
    "crash": "os._exit(3)",
    "short": "{'results': h({'countdown_batch': r['countdown_batch']})['results'][1:]}",
}


@pytest.mark.parametrize("answer", sorted(_BAD_BATCHES))
async def test_a_batch_without_a_verdict_for_each_answer_is_judged_one_answer_at_a_time(answer):
    """A batch that hangs, crashes its sandbox, or is answered outside the protocol is no verdict on any of its
    answers: each is checked alone, and gets the verdict it gets alone (never `timeout` or a crash for all)."""
    program = (
        "import os, sys, time; import tasks.countdown_check as c; h = c.handle_request; "
        f"c.handle_request = lambda r: ({_BAD_BATCHES[answer]}) if 'countdown_batch' in r else h(r); "
        "sys.exit(c.run_checker())"
    )
    config = ProcessSandboxConfig(
        argv=(_base_python(), "-s", "-B", "-c", program),
        ro_paths=_python_paths(),
        workdir="/tmp",
        env={"PYTHONPATH": PROJECT_ROOT},
        memory_limit_bytes=256 << 20,
        handshake=COUNTDOWN_HANDSHAKE,
    )
    sandbox = process.ProcessSandbox(config)
    checker = CountdownChecker(sandbox, timeout_s=1.0)
    theorem = Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)
    answers = ["<answer>3*4+7</answer>", "<answer>3+4+7</answer>", "<answer>7*4-3</answer>", "<answer>x</answer>"]
    try:
        await sandbox.start()
        judged = await checker.check_many([(theorem, a) for a in answers])
        stats = sandbox.stats()
    finally:
        await sandbox.kill()
    # Partial credit (tasks/countdown_check.py): format 0.1, parses 0.1, right numbers 0.3, closeness 0.3.
    assert [(j.verdict, j.score) for j in judged] == [
        ("proved", None),
        ("rejected", round(0.1 + 0.1 + 0.3 + 0.3 * (1 - 5 / 19), 6)),  # 14, 5 from 19
        ("rejected", round(0.1 + 0.1 + 0.3 + 0.3 * (1 - 6 / 19), 6)),  # 25, 6 from 19
        ("rejected", 0.1),  # the format alone
    ]
    assert (stats.timeouts, stats.crashes) == {"hang": (1, 0), "crash": (0, 1)}.get(answer, (0, 0))
    assert stats.total_requests == 1 + len(answers) - (answer in ("hang", "crash"))  # the batch, then each alone


def test_the_reward_scheme_joins_the_verdict_cache_key():
    """A Countdown problem scored the paper's way is another key than the same problem scored the shaped way,
    so no verdict (nor the parts a verdict carries) crosses from a run of one to a run of the other."""
    shaped = Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)
    paper = dataclasses.replace(shaped, reward="paper")
    assert verdict_digest(shaped, "<answer>3+4+7</answer>", "env") != verdict_digest(
        paper, "<answer>3+4+7</answer>", "env"
    )
    assert verdict_digest(dataclasses.replace(shaped, reward="shaped"), "x", "env") != verdict_digest(paper, "x", "env")


async def test_a_paper_run_is_scored_the_papers_way_by_part_and_never_served_a_shaped_verdict(redis, redis_url, keys):
    """The same problem and answer under both schemes: each judged by the checker (the second is no cache hit:
    it would be if the scheme left the key), each with the answer's credit by part and its own scheme's reward."""
    await register(
        redis,
        keys,
        [
            Theorem("shaped", "countdown", numbers=[3, 4, 7], target=19),
            Theorem("paper", "countdown", numbers=[3, 4, 7], target=19, reward="paper"),
        ],
    )
    pub = Publisher(redis, keys)
    async with countdown_pool(redis_url, keys):
        await pub.publish([attempt(0, "shaped", "<answer>3+4+7</answer>")])
        await wait_settled(redis, keys)
        await pub.publish(
            [attempt(1, "paper", "<answer>3+4+7</answer>"), attempt(2, "paper", "<answer>3*4+7</answer>")]
        )
        await wait_settled(redis, keys)
    got = await rewards_by_attempt(redis, keys)
    # 3+4+7 = 14, 5 from 19: tags, an expression, the right numbers, closeness 1 - 5/19
    near = {
        "format": 1.0,
        "expression": 1.0,
        "numbers": 1.0,
        "closeness": pytest.approx(14 / 19, abs=1e-5),
        "solved": 0.0,
    }
    assert got["a0"].parts == near and got["a1"].parts == near
    assert got["a0"].reward == pytest.approx(0.1 + 0.1 + 0.3 + 0.3 * 14 / 19, abs=1e-6)  # shaped
    assert got["a1"].reward == 0.1  # the paper's: the format, nothing between
    assert (got["a1"].verdict, got["a1"].cached) == ("rejected", False)
    assert (got["a2"].verdict, got["a2"].reward) == ("proved", 1.0)
    assert got["a2"].parts == dict.fromkeys(["format", "expression", "numbers", "closeness", "solved"], 1.0)
    assert await redis.hlen(keys.verdicts) == 3
