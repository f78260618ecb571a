"""Deterministic recovery: an ES run whose generator, verifier worker, trainer and Redis are each SIGKILLed
once, at points drawn from a seed, and restarted, ends with the same policy stream, step for step, and the same
held-out evaluations as the same run without faults (the pipeline and the schedule: tests/fixtures/recovery.py).
"""

from __future__ import annotations

import pytest

from tests.fixtures.recovery import VERSIONS, clean_and_faulty
from verifier_pool import process

pytestmark = [
    pytest.mark.skipif(process.available() is None, reason="neither bubblewrap nor unshare works here"),
    pytest.mark.slow,
]


@pytest.mark.timeout(1500)
def test_an_es_run_killed_role_by_role_ends_step_for_step_as_the_run_without_faults(tmp_path):
    clean, faulty = clean_and_faulty(tmp_path, "es")
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
