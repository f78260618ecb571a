"""An ES run through a Sentinel failover: `python -m trainer --redis-url redis+sentinel://...`
and the fake generator+verifier (tests/fixtures/fake_roles.py, which answers each work order with rewards
whose values the test recomputes) on a master, a replica and three sentinels (tests/fixtures/sentinel.py).
The master is SIGKILLed after a few versions, or paused (SIGSTOP) until the sentinels have promoted the
replica and then let go on (SIGCONT: the split brain, tests/test_failover.py); the same trainer process rides
it out (it rebuilds its state from the new master) and finishes the run. In the split brain the trainer would
otherwise build the rest of the run on the old master (seen: versions 4-8 and the run's end written there,
thrown away by its demotion, the trainer exited 0); it asks the sentinels once its master seems to lose its
replica (streams.sentinel `deposed`) and starts over from the new master.

Asserted as for a SIGKILLed trainer (tests/trainer/test_es_run.py): every version once, in order; no member in
two updates; every member's score the mean of all of its rewards (none lost, none counted twice), although
the failover may have taken the old master's last settles and checkpoint with it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import orjson
import pytest

from streams.codec import decode
from streams.connect import connect_sync
from streams.keys import Keys
from streams.schema import PolicyUpdate
from tests.fixtures.fake_roles import fake_reward
from tests.fixtures.sentinel import started
from tests.trainer.test_es_run import ROOT, _trainer

pytestmark = pytest.mark.slow

ITERATIONS = 8
KILL_AFTER = 3  # versions published when the master is killed


@pytest.fixture
def topology(tmp_path, request):
    yield from started(tmp_path, getattr(request, "param", ()))


def _until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.05)  # polls the state of other processes
    return result


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("fault", "topology"),
    [("kill", ()), ("pause", ()), ("pause", ("--min-replicas-to-write", "1"))],
    ids=["kill", "pause", "pause-min-replicas"],
    indirect=["topology"],
)
def test_an_es_run_rides_out_a_failover_and_loses_or_doubles_no_reward(topology, tmp_path, fault):
    """`pause`: SIGSTOP until the sentinels have promoted the replica, then SIGCONT; the trainer and the roles
    may go on writing to the old master until the sentinels demote it (tests/test_failover.py says how)."""
    run, url = "failover-es", topology.url()
    keys = Keys(run)
    roles = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_roles", url, run, "0.05"], cwd=ROOT)
    trainer = _trainer(url, run, tmp_path, ITERATIONS)
    try:
        master = topology.master.client
        _until(lambda: master.xlen(keys.policy) >= KILL_AFTER or trainer.poll() is not None, 120, "versions")
        assert trainer.poll() is None, trainer.communicate()
        old = topology.master.port
        faulted_at = time.monotonic()
        if fault == "kill":
            topology.master.kill()
        else:
            topology.master.stop()
        topology.wait_failover(old)
        failover_s = time.monotonic() - faulted_at
        if fault == "pause":
            split = topology.resume_demoted(topology.master, (keys.policy, keys.rewards))
            print(
                f"split brain: the old master was a master {split[0]:.1f} s after SIGCONT and took "
                f"{split[1][0]} versions and {split[1][1]} rewards that its demotion threw away"
            )
        print(f"failover ({fault}): {failover_s:.1f} s to the new master")
        out, err = trainer.communicate(timeout=180)
        assert trainer.returncode == 0, err[-3000:]
        assert "trainer: Redis is unavailable" in err  # it met the failover, and went on in the same process
        assert f"trainer: run '{run}' finished at version {ITERATIONS}" in err
    finally:
        for p in (trainer, roles):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
    r = connect_sync(url)
    try:
        updates = [decode(PolicyUpdate, f) for _, f in r.xrange(keys.policy)]
        state = orjson.loads(r.hget(keys.trainer_state, "state"))
    finally:
        r.close()
    assert [u.policy_version for u in updates] == list(range(1, ITERATIONS + 1))  # each version once, in order
    used = [w for u in updates for w in u.es_step["members"]]
    assert len(used) == len(set(used))  # no member (and so no reward) went into two updates
    for u in updates:
        for seed, raw in zip(u.es_step["seeds"], u.es_step["raw_rewards"], strict=True):
            # every member's score is the mean of all 3 of its rewards: none lost, none counted twice
            assert raw == pytest.approx(sum(fake_reward(seed, i) for i in range(3)) / 3, abs=1e-6)
    assert state["version"] == ITERATIONS and state["finished"]
