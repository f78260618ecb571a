"""A GRPO trainer SIGKILLed mid-step and mid-checkpoint resumes as if nothing happened.

Two runs of `python -m trainer --algo grpo --redis-url ...` on one real Redis, each served by
tests/fixtures/fake_roles.py (a stand-in generator + verifier whose GRPO groups all carry the same tokens,
logprobs and rewards, so a step does not depend on which groups it got): one without faults, one whose
trainer kills itself with SIGKILL three times (`streams.faults`): after a step's new weights exist only in
memory; after the checkpoint's temp file is written and before it is renamed into place; after the policy
folder and the checkpoint are on disk and before the run's state records them in Redis. Each time the next
trainer resumes from the checkpoint saved before the kill and redoes the step on the same samples.

The faulty run must end where the clean one does: every version's weights with the same digest, the
final weights and AdamW state equal, the same samples counted (none lost, none twice), no group in two
steps, and no half-written file left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis as redis_sync
import torch

from streams.codec import decode
from streams.faults import ENV
from streams.keys import Keys
from streams.schema import PolicyUpdate
from tests.trainer.test_grpo import tiny_llama

ROOT = Path(__file__).resolve().parents[2]
VERSIONS, BATCH, GROUP = 5, 2, 2
KILLS = ["grpo.stepped:2", "grpo.checkpoint_written:1", "grpo.saved:1"]


def _trainer(url: str, run: str, run_dir: Path, model: Path, kill_at: str | None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "trainer", "--redis-url", url, "--run", run, "--algo", "grpo", "--task", "countdown"]
    argv += ["--model", str(model), "--iterations", str(VERSIONS), "--batch", str(BATCH), "--group-size", str(GROUP)]
    argv += ["--quorum", "1", "--max-staleness", "0", "--eval-every", "0", "--problems", "12", "--held-out", "2"]
    argv += ["--max-new-tokens", "4", "--train-device", "cpu", "--run-dir", str(run_dir), "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if kill_at:
        env[ENV] = kill_at
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def _run(url: str, run: str, run_dir: Path, model: Path, kills: list[str]) -> list[subprocess.CompletedProcess]:
    roles = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_roles", url, run, "0"], cwd=ROOT)
    try:
        return [_trainer(url, run, run_dir, model, kill_at) for kill_at in [*kills, None]]
    finally:
        roles.send_signal(signal.SIGTERM)
        roles.wait(30)


@pytest.mark.timeout(900)
def test_a_grpo_trainer_killed_mid_step_and_mid_checkpoint_ends_where_a_clean_run_ends(one_redis_url, tmp_path):
    model = tmp_path / "tiny"
    tiny_llama().save_pretrained(model)
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    [done] = _run(one_redis_url, "grpo-clean", clean, model, [])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainer: GRPO writes about 0.0 GB a version" in done.stderr  # said at the start (a tiny model here)
    *killed, done = _run(one_redis_url, "grpo-faulty", faulty, model, KILLS)
    assert [p.returncode for p in killed] == [-signal.SIGKILL] * len(KILLS), [p.stderr[-2000:] for p in killed]
    assert done.returncode == 0, done.stderr[-3000:]
    for p in [*killed[1:], done]:
        assert "trainer: resuming run 'grpo-faulty' at version 1 of 5" in p.stderr  # each resumed from v1's checkpoint

    r = redis_sync.Redis.from_url(one_redis_url)

    def updates(run: str) -> list[PolicyUpdate]:
        return [decode(PolicyUpdate, f) for _, f in r.xrange(Keys(run).policy)]

    a, b = updates("grpo-clean"), updates("grpo-faulty")
    assert [u.policy_version for u in b] == list(range(1, VERSIONS + 1))  # each version published once, in order
    assert [u.digest for u in b] == [u.digest for u in a]  # the same weights, step for step

    state = orjson.loads(r.hget(Keys("grpo-faulty").trainer_state, "state"))
    assert state["counts"]["samples"] == VERSIONS * BATCH * GROUP and state["counts"]["resumes"] == len(KILLS)
    metrics = [orjson.loads(line) for line in (faulty / "metrics.jsonl").read_bytes().splitlines()]
    steps = [m for m in metrics if not m.get("eval")]
    assert [m["version"] for m in steps] == list(range(1, VERSIONS + 1))  # the killed attempts wrote no metrics
    assert [m["samples"] for m in steps] == [BATCH * GROUP * v for v in range(1, VERSIONS + 1)]
    used = [g for m in steps for g in m["groups_used"]]
    assert len(used) == len(set(used)) == VERSIONS * BATCH  # no group's samples in two steps

    final_clean = torch.load(clean / "checkpoints" / f"v{VERSIONS:06d}.pt", weights_only=True)
    final_faulty = torch.load(faulty / "checkpoints" / f"v{VERSIONS:06d}.pt", weights_only=True)
    for name, tensor in final_clean["model"].items():
        assert torch.equal(tensor, final_faulty["model"][name]), name
    opt_clean, opt_faulty = final_clean["optimizer"]["state"], final_faulty["optimizer"]["state"]
    assert opt_clean.keys() == opt_faulty.keys()
    for key, moments in opt_clean.items():  # AdamW's step count and moments continued from the checkpoint
        for name, value in moments.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt_faulty[key][name])), (key, name)
    leftovers = [p.name for d in ("checkpoints", "policy") for p in (faulty / d).iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the temp file of the checkpoint killed mid-write was removed at the next start
    r.close()
