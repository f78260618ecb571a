"""A run that cannot make progress stops (the local pipeline) or raises its alarm (a trainer given a Redis URL),
naming the cause in the words of the part that failed (trainer/progress.py). Real processes: `python -m
trainer` with its private Redis, generator and verifier; the model is the real default one."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis as redis_sync

from consumers.service import VerifierService
from ops.deploy import health
from streams.codec import decode, encode
from streams.keys import Keys
from streams.schema import Reward, WorkOrder
from tests.consumers.test_verifier import unstartable_countdown
from tests.producers.conftest import needs_model
from verifier_pool.config import VerifierSettings

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}, **extra}


def _argv(run_dir: Path, algo: str, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "trainer", "--algo", algo, "--task", "countdown", "--run", "stuck"]
    argv += ["--run-dir", str(run_dir), "--iterations", "2", "--population", "2", "--batch", "2", "--group-size", "2"]
    argv += ["--problems", "8", "--held-out", "2", "--max-new-tokens", "8", "--engine", "hf", "--sandbox", "process"]
    argv += ["--log-level", "warning", *extra]
    return argv


def _last_trainer_line(err: str) -> str:
    return [line for line in err.splitlines() if line.startswith("trainer: ")][-1]


@needs_model
@pytest.mark.timeout(300)
def test_a_local_run_with_no_usable_isolation_tool_stops_with_the_verifiers_reason(tmp_path):
    """bwrap and unshare on PATH both fail (as they do where user namespaces are off): no sandbox can start.
    With the default stall timeout the run exits 1 within three minutes, its last line naming the verifier's
    own reason; the attempts it dead-lettered say `infrastructure`, never `poison`."""
    broken = tmp_path / "bin"
    broken.mkdir()
    for tool in ("bwrap", "unshare"):
        (broken / tool).write_text(f"#!/bin/sh\necho '{tool}: user namespaces are disabled here' >&2\nexit 1\n")
        (broken / tool).chmod(0o755)
    started = time.monotonic()
    done = subprocess.run(
        _argv(tmp_path / "run", "es"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env=_env(PATH=f"{broken}:{os.environ['PATH']}"),
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-3000:]
    line = _last_trainer_line(done.stderr)
    assert "no progress for" in line and "no verifier can start a sandbox" in line, line
    assert "no working isolation tool" in line and "user namespaces are disabled here" in line, line
    assert elapsed < 180, elapsed
    shown = subprocess.run(
        [sys.executable, "-m", "ops", "run", "--run-dir", str(tmp_path / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    # Attempts dead-lettered before the stop (how many depends on the machine's speed: the verifiers' reports
    # name the cause at once) blame the infrastructure, never the attempt.
    assert "poison" not in shown.stdout, shown.stdout
    assert "dead letters: 0" in shown.stdout or "attempts: infrastructure" in shown.stdout, shown.stdout


@needs_model
@pytest.mark.timeout(300)
def test_a_grpo_run_whose_engine_fails_every_order_exits_with_the_engines_error(tmp_path):
    """The first H100 run: GRPO's engine raised on every order, each was redelivered and dead-lettered, and the
    run went on with no version. Now the generator stops after three orders failed alike, and the run with it."""
    done = subprocess.run(
        _argv(tmp_path / "run", "grpo"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env=_env(PROOFSTREAM_FAIL_AT="engine.generate"),
    )
    assert done.returncode == 1, done.stderr[-3000:]
    line = _last_trainer_line(done.stderr)
    assert line.startswith(
        "trainer: the generator process exited with status 1: producers: the hf engine failed "
        "3 orders in a row with the same error: InjectedFault: fault injected at engine.generate"
    )
    assert "generator.log" in line and "\n" not in line


async def test_a_trainer_given_a_redis_url_raises_the_alarm_while_stalled_and_lowers_it_on_progress(
    redis, redis_url, keys, tmp_path
):
    """The roles run elsewhere, so the trainer does not exit: it sets `{ps:R}:trainer_alert` with the cause
    (`ops.health trainer` turns red, `ops run` says STALLED) and removes it once a reward arrives."""
    settings = VerifierSettings.load(env={}, flags={"run": keys.run, "concurrency": 1, "tasks": ["countdown"]})
    verifier = VerifierService(settings, redis_url, unstartable_countdown)
    await verifier.start()  # its report says: no sandbox of it can start
    argv = [sys.executable, "-m", "trainer", "--algo", "es", "--task", "countdown", "--run", keys.run]
    argv += ["--redis-url", redis_url, "--run-dir", str(tmp_path)]
    argv += ["--iterations", "2", "--population", "2", "--batch", "2", "--problems", "8", "--held-out", "0"]
    argv += ["--eval-every", "0", "--stall-timeout-s", "3", "--log-level", "warning"]
    trainer = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sync = redis_sync.Redis.from_url(redis_url)
    try:
        alert = await _wait(lambda: redis.get(keys.trainer_alert), trainer, 60, "the alert")
        cause = orjson.loads(alert)["cause"]
        assert "no verifier can start a sandbox (broken-0:" in cause and "/nonexistent/python3" in cause, cause
        assert health.check_trainer(sync, keys) == f"the run is stalled: {cause}"
        shown = subprocess.run(
            [sys.executable, "-m", "ops", "run", "--redis-url", redis_url, "--run", keys.run],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(),
        )
        assert f"STALLED at version 0: {cause}" in shown.stdout, shown.stdout
        await _reward_one_order(redis, keys)
        await _wait(lambda: _gone(redis, keys.trainer_alert), trainer, 30, "the alert to be lowered")
        assert health.check_trainer(sync, keys) is None
    finally:
        trainer.terminate()
        trainer.communicate(timeout=60)
        sync.close()
        await verifier.stop()


async def _gone(redis, key: str) -> bool:
    return not await redis.exists(key)


async def _wait(read, proc: subprocess.Popen, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (value := await read()):  # an observable state in Redis, polled
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return value


async def _reward_one_order(redis, keys: Keys) -> None:
    """A verdict for the first attempt of the first work order, as a verifier settles it."""
    [(_, fields)] = await redis.xrange(keys.work, count=1)
    order = decode(WorkOrder, fields)
    reward = Reward(
        attempt_id=f"{order.work_id}:0:0",
        theorem_id=order.theorem_ids[0],
        policy_version=order.policy_version,
        verdict="rejected",
        reward=0.0,
        reason="wrong_answer",
        member=order.member,
        work_id=order.work_id,
        sample_index=0,
    )
    await redis.xadd(keys.rewards, encode(reward))


# -- the watch's rules, against a real Redis: what counts as a cause, and what does not ------------------------


async def test_a_quiet_run_is_stalled_only_when_the_infrastructure_says_why(redis, keys):
    from trainer.progress import ProgressWatch

    watch = ProgressWatch(stall_timeout_s=30)

    async def check_long_quiet() -> str | None:
        watch.last_progress = watch._checked = time.monotonic() - 100  # 100 s without a reward, due a check
        return await watch.check(redis, keys)

    assert await check_long_quiet() is None  # slow (a model loading, long checks): no cause, not stalled
    watch.saw_letter("poison: statement missing")  # the input's fault: the pipeline works
    watch.saw_letter("skipped: stale: policy version 0, newest 3, bound 2")
    assert await check_long_quiet() is None
    watch.saw_letter("infrastructure: verifier: no verdict on any of 5 deliveries: sandbox unavailable: X")
    cause = await check_long_quiet()
    assert cause.startswith(
        "no progress for 100 s: 1 dead letters blame the infrastructure; the newest: "
        "infrastructure: verifier: no verdict on any of 5 deliveries"
    ), cause
    watch.saw_progress()  # a reward arrives: not stalled, whatever came before
    watch._checked = 0.0
    assert await watch.check(redis, keys) is None

    watch = ProgressWatch(stall_timeout_s=30)
    now_ms = time.time() * 1000
    await redis.hset(keys.generator_stats, "gen-a", orjson.dumps({"fatal": "", "reported_ms": now_ms}))
    assert await check_long_quiet() is None
    await redis.hset(keys.generator_stats, "gen-b", orjson.dumps({"fatal": "the hf engine died (E)"}))
    assert (await check_long_quiet()).endswith("generator gen-b stopped: the hf engine died (E)")

    # Verifiers: a cause only when every one that reported lately has no sandbox started.
    some = {"updated_ms": now_ms, "sandboxes": 2, "sandboxes_unavailable": {"s0": "no bwrap"}}
    none = {"updated_ms": now_ms, "sandboxes": 1, "sandboxes_unavailable": {"t0": "no image"}}
    gone = {"updated_ms": now_ms - 3600_000, "sandboxes": 1, "sandboxes_unavailable": {}}
    await redis.delete(keys.generator_stats)
    await redis.hset(keys.verifier_stats, mapping={"a": orjson.dumps(some), "b": orjson.dumps(none)})
    assert await check_long_quiet() is None  # worker a still checks with one sandbox
    await redis.hset(keys.verifier_stats, mapping={"a": orjson.dumps(gone)})  # a is gone: b is all there is
    assert (await check_long_quiet()).endswith("no verifier can start a sandbox (t0: no image)")
    watch.stall_timeout_s = 0  # 0: never stalled
    assert await check_long_quiet() is None
