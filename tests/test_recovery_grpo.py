"""A GRPO run whose generator, verifier worker, trainer and Redis are each SIGKILLed once, at points drawn from
a seed, and restarted, loses and doubles no sample and makes as many versions as asked (the pipeline and the
schedule: tests/fixtures/recovery.py). GRPO's samples differ run to run, so the faulty run is checked on its own.
"""

from __future__ import annotations

import pytest

from tests.fixtures.recovery import GROUP, GRPO_VERSIONS, run
from verifier_pool import process

pytestmark = [
    pytest.mark.skipif(process.available() is None, reason="neither bubblewrap nor unshare works here"),
    pytest.mark.slow,
]


@pytest.mark.timeout(1500)
def test_a_grpo_run_killed_role_by_role_loses_and_doubles_no_sample(tmp_path):
    faulty = run(tmp_path, "grpo", faults=True)
    try:
        updates = [m for m in faulty.metrics() if not m.get("eval")]
        assert [m["version"] for m in updates] == list(range(1, GRPO_VERSIONS + 1))  # as many versions
        assert all(m["attempts"] == m["groups"] * GROUP for m in updates)  # every sample of a group, once
        used = [g for m in updates for g in m["groups_used"]]
        assert len(used) == len(set(used))  # no group in two steps
        state = faulty.state()
        assert state["version"] == GRPO_VERSIONS
        # every step's samples counted once, steps without signal included
        assert state["counts"]["samples"] == updates[-1]["samples"] >= sum(m["attempts"] for m in updates)
    finally:
        faulty.server.stop()
