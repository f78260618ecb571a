"""Deterministic recovery: an ES run whose generator, verifier worker, trainer and Redis are
each SIGKILLed once, at points drawn from a seed, and restarted, ends with the same policy stream, step for
step, and the same held-out evaluations as the same run without faults. A GRPO run under the same faults
loses and doubles no sample and makes as many versions.

Real processes on a private redis-server (AOF, fsync always): `python -m trainer --redis-url`, `python -m
producers --engine hf` with the default model, `arq workers.verifier` with process sandboxes. The schedule
does not depend on timing: quorum 1 (each center gets exactly `population` members and its update uses all
of them: trainer/loop.py `_room`), greedy members, a deadline no update reaches. The kill points are
thresholds on the number of rewards published, drawn from `random.Random(SEED)`; one role is killed at a
time and restarted at once (Redis on the same port and AOF).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis as redis_sync

from streams.codec import decode
from streams.embedded import EmbeddedRedis
from streams.keys import Keys
from streams.schema import PolicyUpdate
from verifier_pool import process

pytestmark = [
    pytest.mark.skipif(process.available() is None, reason="neither bubblewrap nor unshare works here"),
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parent.parent
ARQ = shutil.which("arq", path=str(Path(sys.executable).parent)) or "arq"
SEED = 15
RUN = "recovery"
VERSIONS, POPULATION, BATCH, HELD_OUT, GROUP = 3, 4, 2, 4, 4
GRPO_VERSIONS = 2  # a GRPO version of the 135M model costs a backward pass and a 1.6 GB checkpoint
# training rewards a run publishes at least (ES: members x problems; GRPO: groups x samples, a version)
TRAINING_REWARDS = {"es": VERSIONS * POPULATION * BATCH, "grpo": GRPO_VERSIONS * BATCH * GROUP}
ALGO_ARGS = {
    "es": ["--algo", "es", "--population", str(POPULATION), "--batch", str(BATCH), "--no-antithetic",
           "--sigma", "0.01", "--alpha", "0.002", "--iterations", str(VERSIONS), "--eval-every", str(VERSIONS)],
    "grpo": ["--algo", "grpo", "--batch", str(BATCH), "--group-size", str(GROUP), "--train-device", "cpu",
             "--iterations", str(GRPO_VERSIONS), "--eval-every", "0"],
}  # fmt: skip
ROLES = ("generator", "verifier", "trainer", "redis")


def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.05)  # polls an observable condition of other processes


class Pipeline:
    """The run's processes, each restartable, logging to files under `logs`."""

    def __init__(self, tmp: Path, model: Path, algo: str) -> None:
        self.tmp, self.logs = tmp, tmp / "logs"
        self.logs.mkdir(parents=True)
        self.server = EmbeddedRedis(data_dir=tmp / "redis", appendfsync="always").start()
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
        self.env = {**clean, "PROOFSTREAM_REDIS_URL": self.server.url, "PROOFSTREAM_RUN": RUN,
                    "PROOFSTREAM_LOG_LEVEL": "info", "HF_HUB_OFFLINE": "1",
                    # a killed role's entries move on within seconds (the defaults wait ~25 s)
                    "PROOFSTREAM_CLAIM_IDLE_MS": "3000",
                    "PROOFSTREAM_TASKS": '["countdown"]', "PROOFSTREAM_SANDBOX": "process",
                    "PROOFSTREAM_CONCURRENCY": "1"}  # fmt: skip
        self.argv = {
            "generator": [sys.executable, "-m", "producers", "--engine", "hf", "--model", str(model),
                          "--name", "gen"],
            "verifier": [ARQ, "workers.verifier"],
            "trainer": [sys.executable, "-m", "trainer", "--redis-url", self.server.url, "--run", RUN,
                        *ALGO_ARGS[algo], "--task", "countdown", "--model", str(model),
                        "--quorum", "1", "--max-staleness", "0", "--deadline-s", "3600", "--problems", "16",
                        "--held-out", str(HELD_OUT), "--max-new-tokens", "24",
                        "--seed", "3", "--run-dir", str(tmp / "run")],
        }  # fmt: skip
        self.procs: dict[str, subprocess.Popen] = {}
        self.starts: dict[str, int] = {}

    def start(self, role: str) -> None:
        n = self.starts.get(role, 0)
        self.starts[role] = n + 1
        with open(self.logs / f"{role}.{n}.log", "wb") as out:
            self.procs[role] = subprocess.Popen(self.argv[role], cwd=ROOT, env=self.env, stdout=out,
                                                stderr=subprocess.STDOUT)  # fmt: skip

    def kill(self, role: str) -> None:
        """SIGKILL `role` and start it again at once (Redis: on the same port and AOF)."""
        if role == "redis":
            self.server.kill()
            self.server.start()
            return
        proc = self.procs[role]
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        self.start(role)

    def log(self, role: str) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.logs.glob(f"{role}.*.log")))

    def rewards(self) -> int:
        try:
            with redis_sync.Redis.from_url(self.server.url) as r:
                return r.xlen(Keys(RUN).rewards)
        except redis_sync.ConnectionError:
            return 0

    def run(self, kills: dict[int, str]) -> None:
        """Start every role, kill each of `kills` (rewards published -> role) when the run gets there, and
        wait for the trainer to finish."""
        for role in ("verifier", "generator", "trainer"):
            self.start(role)
        for threshold, role in sorted(kills.items()):
            _until(lambda t=threshold: self.rewards() >= t or self.procs["trainer"].poll() is not None, 300,
                   f"{threshold} rewards")  # fmt: skip
            assert self.procs["trainer"].poll() is None, self.log("trainer")  # the kill lands mid-run
            self.kill(role)
        assert self.procs["trainer"].wait(900) == 0, self.log("trainer")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.server.stop()

    def metrics(self) -> list[dict]:
        return [orjson.loads(line) for line in (self.tmp / "run" / "metrics.jsonl").read_bytes().splitlines()]

    def steps(self) -> list[dict]:
        """Each ES version's step: seeds, signs, z-scores, raw rewards, members."""
        with redis_sync.Redis.from_url(self.server.url) as r:
            updates = [decode(PolicyUpdate, f) for _, f in r.xrange(Keys(RUN).policy)]
        return [{"version": u.policy_version, **{k: u.es_step[k] for k in ("seeds", "signs", "rewards", "raw_rewards",
                 "members")}} for u in updates]  # fmt: skip

    def evals(self) -> list[dict]:
        evals = [
            {k: m[k] for k in ("version", "held_out_reward", "held_out_exact")} for m in self.metrics() if m.get("eval")
        ]
        return sorted(evals, key=lambda e: e["version"])

    def state(self) -> dict:
        with redis_sync.Redis.from_url(self.server.url) as r:
            return orjson.loads(r.hget(Keys(RUN).trainer_state, "state"))


def _schedule(seed: int, rewards: int) -> dict[int, str]:
    """Each role killed once, at distinct reward counts drawn from the seed, inside the first `rewards`."""
    rng = random.Random(seed)
    points = sorted(rng.sample(range(2, rewards - 2), len(ROLES)))
    roles = list(ROLES)
    rng.shuffle(roles)
    return dict(zip(points, roles, strict=True))


def _clean_and_faulty(tmp_path: Path, algo: str) -> tuple[Pipeline, Pipeline]:
    """The same run twice, on two private Redis servers: without faults, then with each role killed once."""
    from weights.model import resolve_model

    model = resolve_model(None)  # the default model (converted once per machine)
    runs = []
    for name, kills in (("clean", {}), ("faulty", _schedule(SEED, TRAINING_REWARDS[algo]))):
        pipeline = Pipeline(tmp_path / name, model, algo)
        try:
            pipeline.run(kills)
        finally:
            pipeline.stop()
        pipeline.server.start()  # read the results back from its AOF
        runs.append(pipeline)
        if kills:
            assert pipeline.starts == {"verifier": 2, "generator": 2, "trainer": 2}
            assert "resuming run 'recovery'" in pipeline.log("trainer")
    return runs[0], runs[1]


@pytest.mark.timeout(1500)
def test_an_es_run_killed_role_by_role_ends_step_for_step_as_the_run_without_faults(tmp_path):
    clean, faulty = _clean_and_faulty(tmp_path, "es")
    try:
        clean_steps, steps = clean.steps(), faulty.steps()
        assert [s["version"] for s in steps] == list(range(1, VERSIONS + 1))  # each version once
        assert any(any(z != 0 for z in s["rewards"]) for s in clean_steps)  # members differed: steps carry signal
        assert steps == clean_steps  # seeds, signs, z-scores, raw rewards, members: step for step
        assert [e["version"] for e in clean.evals()] == [0, VERSIONS]
        assert faulty.evals() == clean.evals()  # the same held-out evaluation
    finally:
        clean.server.stop()
        faulty.server.stop()


@pytest.mark.timeout(1500)
def test_a_grpo_run_killed_role_by_role_loses_and_doubles_no_sample(tmp_path):
    clean, faulty = _clean_and_faulty(tmp_path, "grpo")
    try:
        for run in (clean, faulty):
            updates = [m for m in run.metrics() if not m.get("eval")]
            assert [m["version"] for m in updates] == list(range(1, GRPO_VERSIONS + 1))  # as many versions
            assert all(m["attempts"] == m["groups"] * GROUP for m in updates)  # every sample of a group, once
            used = [g for m in updates for g in m["groups_used"]]
            assert len(used) == len(set(used))  # no group in two steps
            state = run.state()
            assert state["version"] == GRPO_VERSIONS
            # every step's samples counted once, steps without signal included
            assert state["counts"]["samples"] == updates[-1]["samples"] >= sum(m["attempts"] for m in updates)
    finally:
        clean.server.stop()
        faulty.server.stop()
