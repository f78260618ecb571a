"""A stopped verifier drains: each slot's tasks finish the attempt in hand, one after the other
(consumers/service.py `stop`, bounded by TASKS_PER_SLOT x proof_timeout_s + 10 s). The stack's own kill
deadlines must not be shorter, or a Lean check near its timeout is killed half-way and judged again."""

from __future__ import annotations

from pathlib import Path

import yaml

from consumers.service import TASKS_PER_SLOT
from verifier_pool.config import VerifierSettings

ROOT = Path(__file__).resolve().parents[2]
DRAIN_S = TASKS_PER_SLOT * VerifierSettings.model_fields["proof_timeout_s"].default + 10


def _seconds(value: str) -> float:
    units = {"s": 1, "m": 60}
    return float(value[:-1]) * units[value[-1]]


def test_compose_gives_the_verifier_its_whole_drain():
    verifier = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["verifier"]
    assert _seconds(verifier["stop_grace_period"]) >= DRAIN_S


def test_kubernetes_gives_the_verifier_its_whole_drain():
    docs = yaml.safe_load_all((ROOT / "ops" / "deploy" / "k8s" / "proofstream.yaml").read_text())
    [verifier] = [d for d in docs if d and d.get("kind") == "Deployment" and d["metadata"]["name"].endswith("verifier")]
    assert verifier["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= DRAIN_S
