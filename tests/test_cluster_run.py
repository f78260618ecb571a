"""A run end to end on a real Redis Cluster (three masters on 127.0.0.1, tests/fixtures/cluster.py), with
the roles given a `redis+cluster://` URL: `python -m trainer` (ES), `arq workers.verifier` with process
sandboxes judging Countdown answers, and a generator process without a model
(tests/fixtures/stand_in_generator.py: the real one's wire, a fixed answer; `python -m producers --engine hf`
took 150 s per ES version on this 2-core machine); then `python -m ops` on it.

The run id is picked so that its slot is served by a master other than the one redis-py uses for commands
without a key (the "default node", the first master it finds), so a server command sent to the wrong node
shows. Asserted: the trainer makes every version and exits 0; each attempt is rewarded or dead-lettered,
once; every key the run and arq wrote is on the run's slot, on its master, on no other (listed on each node,
slots from CLUSTER KEYSLOT); arq ran its cron jobs to the end there (their result keys); the worker drains
and exits 0 on SIGTERM; `ops run`/`ops streams` read the run, a benchmark refuses a cluster in one line.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis as redis_sync

from streams.codec import decode
from streams.connect import connect_sync
from streams.keys import Keys
from streams.schema import Attempt, DeadLetter, PolicyUpdate, Reward
from tests.streams.test_cluster import assert_run_on_its_slot, run_on
from verifier_pool import process

pytestmark = pytest.mark.slow
sandboxes = pytest.mark.skipif(process.available() is None, reason="neither bubblewrap nor unshare works here")

ROOT = Path(__file__).resolve().parent.parent
ARQ = shutil.which("arq", path=str(Path(sys.executable).parent)) or "arq"
VERSIONS = 2


def _until(predicate, timeout_s: float, what: str, procs: dict | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        for name, proc in (procs or {}).items():
            assert proc.poll() is None or name == "trainer", f"{name} exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.1)  # polls an observable condition of other processes


def _keys_on(port: int, pattern: str) -> list[str]:
    with redis_sync.Redis(port=port) as node:
        return sorted(k.decode() for k in node.keys(pattern))


@sandboxes
@pytest.mark.timeout(600)
def test_a_run_end_to_end_on_the_cluster(redis_cluster, tmp_path):
    with connect_sync(redis_cluster.url) as probe:
        default_port = probe.get_default_node().port
    port = next(p for p in redis_cluster.ports if p != default_port)
    run = run_on(redis_cluster, port, stem="e2e-")
    keys = Keys(run)
    slot = redis_cluster.keyslot(keys.prefix)
    logs = tmp_path / "logs"
    logs.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
    env = {
        **clean,
        "PROOFSTREAM_REDIS_URL": redis_cluster.url,
        "PROOFSTREAM_RUN": run,
        "PROOFSTREAM_LOG_LEVEL": "info",
        "HF_HUB_OFFLINE": "1",
        "PROOFSTREAM_TASKS": '["countdown"]',
        "PROOFSTREAM_SANDBOX": "process",
        "PROOFSTREAM_CONCURRENCY": "1",
        "PROOFSTREAM_SWEEP_EVERY_S": "2",
    }  # arq's sweep cron job every 2 s
    trainer = [sys.executable, "-m", "trainer", "--redis-url", redis_cluster.url, "--run", run, "--algo", "es"]
    trainer += ["--population", "2", "--batch", "2", "--no-antithetic", "--iterations", str(VERSIONS)]
    trainer += ["--eval-every", "0", "--task", "countdown", "--quorum", "1", "--problems", "8", "--held-out", "2"]
    trainer += ["--seed", "3", "--run-dir", str(tmp_path / "run")]
    argv = {
        "verifier": [ARQ, "workers.verifier"],
        "generator": [sys.executable, "-m", "tests.fixtures.stand_in_generator", redis_cluster.url, run],
        "trainer": trainer,
    }
    procs: dict[str, subprocess.Popen] = {}

    def log(role: str) -> str:
        return (logs / f"{role}.log").read_text(errors="replace")[-4000:]

    try:
        for role, cmd in argv.items():
            with open(logs / f"{role}.log", "wb") as out:
                procs[role] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        _until(lambda: procs["trainer"].poll() is not None, 400, "the trainer to finish", procs)
        assert procs["trainer"].returncode == 0, log("trainer")

        # arq ran cron jobs to their end on the run's master (finish_job's MULTI, the abort set's ZREM in it):
        # its health record counts them, and none failed.
        def health() -> str:
            with redis_sync.Redis(port=port) as node:
                return (node.get(f"{keys.prefix}:arq:health-check") or b"").decode()

        _until(lambda: "j_complete=0 " not in health() and "j_complete=" in health(), 30, "a finished cron job", procs)
        assert " j_failed=0 " in health(), health()
        # `arq workers.verifier --check` finds the run's master by itself and reads the health key there.
        check = subprocess.run(
            [ARQ, "workers.verifier", "--check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert check.returncode == 0, check.stdout + check.stderr
        procs["verifier"].send_signal(signal.SIGTERM)
        assert procs["verifier"].wait(60) == 0, log("verifier")
        procs["generator"].send_signal(signal.SIGTERM)
        procs["generator"].wait(60)
        verifier_log = log("verifier")
        assert "Traceback" not in verifier_log and "CROSSSLOT" not in verifier_log, verifier_log

        with connect_sync(redis_cluster.url) as r:
            versions = [decode(PolicyUpdate, f).policy_version for _, f in r.xrange(keys.policy)]
            attempts = [decode(Attempt, f).attempt_id for _, f in r.xrange(keys.attempts)]
            rewards = [decode(Reward, f).attempt_id for _, f in r.xrange(keys.rewards)]
            letters = [decode(Attempt, decode(DeadLetter, f).original).attempt_id for _, f in r.xrange(keys.dlq)]
        assert versions == list(range(1, VERSIONS + 1))
        # Accounting: each attempt rewarded or dead-lettered, once (the trainer may trim acked rewards
        # only past history_s, an hour by default, so all are here).
        assert attempts and not [a for a, n in Counter(rewards).items() if n > 1]
        assert set(rewards) | set(letters) == set(attempts)
        assert not set(rewards) & set(letters)
        assert len(rewards) + len(letters) == len(set(attempts))

        # Every key of the run and of its arq worker is on the run's slot, on its master only.
        assert_run_on_its_slot(redis_cluster, keys)
        for p in redis_cluster.ports:
            arq_keys = _keys_on(p, "arq:*")
            if p == port:
                assert arq_keys, "arq wrote no job key"
                assert {redis_cluster.keyslot(k) for k in arq_keys} == {slot}, arq_keys
            else:
                assert arq_keys == [], (p, arq_keys)

        # ops on the cluster: the run's report and streams; a benchmark refuses in one line.
        ops_env = {**clean, "PROOFSTREAM_REDIS_URL": redis_cluster.url, "PROOFSTREAM_RUN": run}
        for command in (["run"], ["streams"], ["tail", "rewards", "-n", "3"]):
            out = subprocess.run(
                [sys.executable, "-m", "ops", *command],
                cwd=ROOT,
                env=ops_env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, (command, out.stderr)
        out = subprocess.run(
            [sys.executable, "-m", "ops", "--json", "streams"],
            cwd=ROOT,
            env=ops_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f'"length":{len(rewards)}' in out.stdout.replace(" ", "")
        out = subprocess.run(
            [sys.executable, "-m", "ops", "bench", "wire", "--redis-url", redis_cluster.url],
            cwd=ROOT,
            env=ops_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and "measure one Redis server" in out.stderr and "Traceback" not in out.stderr
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


class SlotMaster:
    """The chaos test's Redis (tests/streams/test_chaos.py `run_chaos`) on a cluster: the master that holds the
    run's slot, SIGKILLed and started again on its port, nodes.conf and AOF (appendfsync always) while the
    other masters stay up. Leaves the session's cluster whole."""

    def __init__(self, cluster, port: int) -> None:
        self.cluster, self.port = cluster, port
        self.url = cluster.url

    def start(self) -> SlotMaster:
        if self.cluster.procs[self.port].poll() is not None:
            self.cluster.restart(self.port)
        return self

    def kill(self) -> None:
        self.cluster.kill(self.port)

    def close(self) -> None:
        self.start()


@pytest.mark.timeout(150)
async def test_chaos_accounting_on_the_cluster(redis_cluster, tmp_path):
    """The chaos test's accounting on the cluster: consumer processes SIGKILLed at random, the run's master
    SIGKILLed once mid-publish and restarted; nothing lost, nothing rewarded twice, rewards + dead letters ==
    attempts. A smaller twin of tests/streams/test_chaos.py (same code, fewer attempts and kills)."""
    from tests.streams.test_chaos import run_chaos  # noqa: PLC0415

    port = redis_cluster.ports[1]
    run = run_on(redis_cluster, port, stem="chaos-")
    await run_chaos(
        None, tmp_path, server=SlotMaster(redis_cluster, port), run=run, n_unique=1500, min_consumer_kills=8
    )


def migrate_slot(cluster, slot: int, source: int, target: int) -> None:
    """Move `slot`, keys and all, from the master on `source` to the one on `target`, as a resharding does
    (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE of its keys, SETSLOT NODE on every master)."""
    ids = {}
    for p in cluster.ports:
        with redis_sync.Redis(port=p) as node:
            ids[p] = node.execute_command("CLUSTER", "MYID").decode()
    with redis_sync.Redis(port=target) as dst, redis_sync.Redis(port=source) as src:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        while names := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *names)
    for p in [target, source, *(q for q in cluster.ports if q not in (source, target))]:
        with redis_sync.Redis(port=p) as node:
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    _until(lambda: _agreed(cluster, slot, target), 10, "every master to agree on the slot's new owner")


def _agreed(cluster, slot: int, port: int) -> bool:
    for p in cluster.ports:
        with redis_sync.Redis(port=p) as node:
            for first, last, master, *_ in node.execute_command("CLUSTER", "SLOTS"):
                if int(first) <= slot <= int(last) and int(master[1]) != port:
                    return False
    return True


@sandboxes
@pytest.mark.timeout(180)
def test_a_verifier_whose_slot_moves_exits_in_one_line_and_a_restart_serves_the_new_master(redis_cluster, tmp_path):
    """arq's connection goes to the master of the run's slot, found at the start (workers.py). When the slot is
    resharded away, arq's next command gets MOVED: the worker exits 1 saying so in one line (arq's close fails
    on the same MOVED before on_shutdown, so no drain: what it held is reclaimed after claim_idle_ms, as after a
    crash); started again, it connects to the new master and its cron jobs run there."""
    source, target = redis_cluster.ports[0], redis_cluster.ports[2]
    run = run_on(redis_cluster, source, stem="resharded-")
    keys, slot = Keys(run), redis_cluster.keyslot(Keys(run).prefix)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")},
        "PROOFSTREAM_REDIS_URL": redis_cluster.url,
        "PROOFSTREAM_RUN": run,
        "PROOFSTREAM_TASKS": '["countdown"]',
        "PROOFSTREAM_SANDBOX": "process",
        "PROOFSTREAM_CONCURRENCY": "1",
        "PROOFSTREAM_SWEEP_EVERY_S": "2",
        "PROOFSTREAM_LOG_LEVEL": "info",
    }
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str) -> None:
        with open(tmp_path / f"{name}.log", "wb") as out:
            procs[name] = subprocess.Popen(
                [ARQ, "workers.verifier"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def health(port: int) -> str:
        with redis_sync.Redis(port=port) as node:
            return (node.get(f"{keys.prefix}:arq:health-check") or b"").decode()

    try:
        start("first")
        _until(
            lambda: "j_complete=0 " not in health(source) and "j_complete=" in health(source),
            60,
            "the first worker's cron jobs",
            {"first": procs["first"]},
        )
        migrate_slot(redis_cluster, slot, source, target)
        assert procs["first"].wait(60) == 1
        said = (tmp_path / "first.log").read_text(errors="replace")
        assert "the run's slot moved to another master of the cluster" in said and "Traceback" not in said, said

        start("second")

        def second_ran_jobs() -> bool:
            said = (tmp_path / "second.log").read_text(errors="replace")
            return "recording health" in said and " j_complete=0 " not in said.split("recording health")[-1]

        _until(second_ran_jobs, 60, "the restarted worker's cron jobs", {"second": procs["second"]})
        assert redis_cluster.port_of_slot(slot) == target and health(target)
        assert _keys_on(source, f"*{keys.prefix}*") == []  # nothing of the run written to the old master
        procs["second"].send_signal(signal.SIGTERM)
        assert procs["second"].wait(60) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
