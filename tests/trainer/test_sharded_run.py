"""A sharded GRPO trainer (torchrun, 2 gloo ranks) whose rank 1 is SIGKILLed mid-step stops, and the restarted
job resumes from the last DCP checkpoint without losing or doubling a sample.

The pipeline is real but for the model work: a real Redis, the real `python -m trainer --algo grpo` under
`torchrun --standalone --nproc-per-node 2 --max-restarts 0`, and tests/fixtures/fake_roles.py as the
generator + verifier (the real consumer runtime; G attempts a theorem with their tokens and logprobs, then
their rewards), which like the real generator skips an order it has settled (tests/trainer/sharded_roles.py):
the restarted trainer's samples of the killed step can only come from its pending list. The model is the tiny
random Llama of tests/trainer/test_grpo.py: what is tested here is the accounting across a dead rank, and a
135M step over gloo costs ~10 s a pass on this machine (the step itself is compared on the real model in
tests/trainer/test_sharded.py).

Rank 1 kills itself (`streams.faults`, point `grpo.sharded_pass.rank1`) in its pass of the second step,
while rank 0 waits on it in a collective: torchrun exits nonzero within a bound, with no process of the job
left, and the run's state in Redis names version 1's DCP checkpoint. The next job's rank 0 kills itself once
every rank has written version 2's checkpoint into its temporary folder, before renaming it into place: the
state still names version 1. The third job resumes at version 1 and finishes. Counted independently of the
trainer's own counters: the policy stream has every version once; the groups each version's metrics say it
used are the lockstep's (`grpo-v<V-1>-g<i>`, none cut, none twice); the attempts and rewards streams hold
exactly G attempts for each used group, generated once and rewarded once; nothing is left pending in the
trainer's groups (every attempt and reward read was acked, after the checkpoint that holds it); the
temporary folder is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis as redis_sync

from streams.codec import decode
from streams.faults import ENV
from streams.keys import TRAINER, Keys
from streams.schema import Attempt, PolicyUpdate, Reward
from tests.trainer.test_grpo import tiny_llama

ROOT = Path(__file__).resolve().parents[2]
VERSIONS, BATCH, GROUP = 4, 2, 2
DIST_TIMEOUT_S = 60


def _job_processes(run: str) -> list[int]:
    """torchrun and its ranks: the processes running `-m trainer` with the run's variable (each rank has a
    session of its own: elastic's SubprocessHandler starts them with start_new_session)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"PROOFSTREAM_RUN={run}".encode() in environ and b"trainer" in argv:
                pids.append(int(proc.name))
    return pids


def _torchrun(url: str, run: str, run_dir: Path, model: Path, kill_at: str | None) -> tuple[int, str, float]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv += ["--max-restarts", "0", "-m", "trainer", "--redis-url", url, "--algo", "grpo", "--task", "countdown"]
    argv += ["--model", str(model), "--iterations", str(VERSIONS), "--batch", str(BATCH), "--group-size", str(GROUP)]
    argv += ["--quorum", "1", "--max-staleness", "0", "--eval-every", "0", "--problems", "12", "--held-out", "2"]
    argv += ["--max-new-tokens", "4", "--train-device", "cpu", "--run-dir", str(run_dir)]
    argv += ["--dist-timeout-s", str(DIST_TIMEOUT_S), "--order-timeout-s", "60", "--log-level", "warning"]
    # the run by its variable: torchrun's own argparse takes `--run` for an ambiguous prefix of its `--run-path`
    env = {**{k: v for k, v in os.environ.items() if k != ENV}, "PROOFSTREAM_RUN": run}
    if kill_at:
        env[ENV] = kill_at
    started = time.monotonic()
    job = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
        for pid in _job_processes(run):  # never left running, whatever the test's outcome
            os.kill(pid, signal.SIGKILL)
    return job.returncode, err, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_rank_killed_mid_step_stops_the_job_and_the_restart_loses_or_doubles_no_sample(one_redis_url, tmp_path):
    model = tmp_path / "tiny"
    tiny_llama().save_pretrained(model)
    run, run_dir = "grpo-sharded", tmp_path / "run"
    keys = Keys(run)
    r = redis_sync.Redis.from_url(one_redis_url)
    roles = subprocess.Popen([sys.executable, "-m", "tests.trainer.sharded_roles", one_redis_url, run], cwd=ROOT)
    try:
        code, err, took = _torchrun(one_redis_url, run, run_dir, model, "grpo.sharded_pass.rank1:2")
        assert code != 0, err[-3000:]
        assert "Signal 9 (SIGKILL)" in err, err[-3000:]  # torchrun's report names the rank that died, and how
        leftover = _job_processes(run)
        assert leftover == [], leftover  # torchrun stopped the other rank before it exited
        # bounded: torchrun stops the others at once (SIGTERM, SIGKILL 30 s later), whatever the collective
        assert took < 150, took
        state = orjson.loads(r.hget(keys.trainer_state, "state"))
        assert state["version"] == 1 and state["checkpoint"].endswith("checkpoints/v000001.dcp"), state
        assert Path(state["checkpoint"], ".metadata").is_file()

        # rank 0 killed with every rank's shards of version 2 written, before it renames them into place: the
        # state still names version 1, and the half-done save is never taken for a checkpoint
        code, err, _ = _torchrun(one_redis_url, run, run_dir, model, "grpo.sharded_checkpoint_written:1")
        assert code != 0 and f"trainer: resuming run '{run}' at version 1 of {VERSIONS}" in err, err[-3000:]
        assert _job_processes(run) == []
        state = orjson.loads(r.hget(keys.trainer_state, "state"))
        assert state["version"] == 1 and state["checkpoint"].endswith("checkpoints/v000001.dcp"), state
        [partial] = [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp-v000002.dcp")]
        assert (partial / ".metadata").is_file()  # complete but never renamed: not a checkpoint of the run

        code, err, _ = _torchrun(one_redis_url, run, run_dir, model, None)
        assert code == 0, err[-3000:]
        assert f"trainer: resuming run '{run}' at version 1 of {VERSIONS}" in err
    finally:
        roles.send_signal(signal.SIGTERM)
        roles.wait(30)

    updates = [decode(PolicyUpdate, f) for _, f in r.xrange(keys.policy)]
    assert [u.policy_version for u in updates] == list(range(1, VERSIONS + 1))  # each version published once
    metrics = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    steps = [m for m in metrics if not m.get("eval")]
    assert [m["version"] for m in steps] == list(range(1, VERSIONS + 1))
    # the lockstep's groups, version by version: none lost with the dead rank, none used twice
    used = [sorted(m["groups_used"]) for m in steps]
    assert used == [[f"grpo-v{v}-g{i}" for i in range(BATCH)] for v in range(VERSIONS)]
    # every used group's G samples, counted from the streams, not from the trainer: generated once, rewarded once
    rewards = [decode(Reward, f) for _, f in r.xrange(keys.rewards)]
    attempts = [decode(Attempt, f) for _, f in r.xrange(keys.attempts)]
    for m in steps:
        for group in m["groups_used"]:
            assert sorted(x.attempt_id for x in rewards if x.work_id == group) == [
                f"{group}:0:{k}" for k in range(GROUP)
            ]
            assert sorted(x.attempt_id for x in attempts if x.work_id == group) == [
                f"{group}:0:{k}" for k in range(GROUP)
            ]
        assert m["attempts"] == BATCH * GROUP
    assert len(rewards) == len(attempts) == VERSIONS * BATCH * GROUP
    assert [m["samples"] for m in steps] == [BATCH * GROUP * v for v in range(1, VERSIONS + 1)]
    state = orjson.loads(r.hget(keys.trainer_state, "state"))
    assert state["counts"]["samples"] == VERSIONS * BATCH * GROUP and state["counts"]["resumes"] == 2
    assert not any(k.startswith("cut_") for k in state["counts"]), state["counts"]
    for stream in (keys.attempts, keys.rewards):  # everything the trainer read was acked, none left behind
        assert r.xpending(stream, TRAINER)["pending"] == 0, stream
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == [f"v{v:06d}.dcp" for v in (VERSIONS - 1, VERSIONS)]  # the last two; the temp one removed
    r.close()
