"""ops/deploy/health.py, the containers' health checks, against a real Redis: a generator is healthy while its own
figures are fresh, not when they are stale, missing or another host's; the trainer's check is Redis answering."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import orjson
import pytest
import redis as redis_sync
import yaml

from ops.deploy import health
from streams.embedded import EmbeddedRedis
from streams.keys import Keys

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def client(redis_url: str):
    c = redis_sync.Redis.from_url(redis_url)
    yield c
    c.close()


def report(client, keys: Keys, name: str, age_s: float) -> None:
    client.hset(keys.generator_stats, name, orjson.dumps({"name": name, "reported_ms": (time.time() - age_s) * 1000}))


def test_generator_health_follows_its_own_reports(client) -> None:
    keys = Keys("health")
    mine = f"gen-{socket.gethostname()}-7"
    assert "no report" in health.check_generator(client, keys, 60)
    report(client, keys, "gen-otherhost-7", 1)  # another container's generator does not make this one healthy
    assert "no report" in health.check_generator(client, keys, 60)
    report(client, keys, mine, 300)
    assert "300 s old" in health.check_generator(client, keys, 60)
    report(client, keys, mine, 1)
    assert health.check_generator(client, keys, 60) is None
    assert "no report from gen-a" in health.check_generator(client, keys, 60, name="gen-a")  # PROOFSTREAM_NAME


def test_main_exit_codes(redis_url: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PROOFSTREAM_REDIS_URL", redis_url)
    monkeypatch.setenv("PROOFSTREAM_RUN", "health-main")
    monkeypatch.delenv("PROOFSTREAM_NAME", raising=False)
    assert health.main(["trainer"]) == 0
    assert health.main(["generator"]) == 1
    assert "no report" in capsys.readouterr().err
    monkeypatch.setenv("PROOFSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")
    assert health.main(["trainer", "--timeout-s", "1"]) == 1
    assert "does not answer" in capsys.readouterr().err


def verifier_report(client, keys: Keys, worker: str, age_s: float, unavailable: dict | None = None) -> None:
    figures = {"worker": worker, "updated_ms": (time.time() - age_s) * 1000, "sandboxes_unavailable": unavailable or {}}
    client.hset(keys.verifier_stats, worker, orjson.dumps(figures))


def test_verifier_health_is_red_while_a_sandbox_cannot_start(client) -> None:
    keys = Keys("health-verifier")
    host = socket.gethostname()
    assert "no report" in health.check_verifier(client, keys, 90)
    verifier_report(client, keys, "otherhost-7-ab12", 1)  # another container's worker
    assert "no report" in health.check_verifier(client, keys, 90)
    verifier_report(client, keys, f"{host}-7-ab12", 1, {"docker-countdown-0-7": "image x not found"})
    problem = health.check_verifier(client, keys, 90)
    assert "1 sandbox(es)" in problem and "docker-countdown-0-7: image x not found" in problem
    verifier_report(client, keys, f"{host}-8-cd34", 1)  # the newest worker of this container counts
    assert health.check_verifier(client, keys, 90) is None
    verifier_report(client, keys, f"{host}-8-cd34", 200)
    verifier_report(client, keys, f"{host}-7-ab12", 300)
    assert "200 s old" in health.check_verifier(client, keys, 90)


def test_verifier_main_exit_codes(client, redis_url: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PROOFSTREAM_REDIS_URL", redis_url)
    monkeypatch.setenv("PROOFSTREAM_RUN", "health-verifier-main")
    keys = Keys("health-verifier-main")
    verifier_report(client, keys, f"{socket.gethostname()}-9-ef56", 1, {"process-countdown-0-9": "no interpreter"})
    assert health.main(["verifier"]) == 1
    assert "no interpreter" in capsys.readouterr().err
    verifier_report(client, keys, f"{socket.gethostname()}-9-ef56", 1)
    assert health.main(["verifier"]) == 0
    verifier_report(client, keys, f"{socket.gethostname()}-9-ef56", 100)
    assert health.main(["verifier"]) == 1 and "100 s old" in capsys.readouterr().err  # default limit 90 s
    assert health.main(["verifier", "--max-age-s", "120"]) == 0


def test_liveness_fails_on_a_stale_report_only_and_passes_while_redis_does_not_answer(monkeypatch, capsys) -> None:
    """`--liveness` (Kubernetes restarts a container that fails it): a stale report fails it; a Redis that is
    stopped (SIGSTOP: the probe times out) or dead (connection refused) does not, while the readiness check
    (no flag) fails on both; a verifier whose sandbox cannot start is live but not ready."""
    with EmbeddedRedis() as server:
        monkeypatch.setenv("PROOFSTREAM_REDIS_URL", server.url)
        monkeypatch.setenv("PROOFSTREAM_RUN", "liveness")
        monkeypatch.delenv("PROOFSTREAM_NAME", raising=False)
        keys, host = Keys("liveness"), socket.gethostname()
        client = redis_sync.Redis.from_url(server.url)
        report(client, keys, f"gen-{host}-7", 300)
        verifier_report(client, keys, f"{host}-7-ab12", 200)
        for role in ("generator", "verifier"):
            assert health.main([role, "--liveness"]) == 1 and "s old" in capsys.readouterr().err
        report(client, keys, f"gen-{host}-7", 1)
        verifier_report(client, keys, f"{host}-7-ab12", 1, {"process-countdown-0-7": "no interpreter"})
        assert health.main(["generator", "--liveness"]) == 0
        assert health.main(["verifier", "--liveness"]) == 0  # it retries its sandboxes itself
        assert health.main(["verifier"]) == 1 and "no interpreter" in capsys.readouterr().err
        client.close()

        os.kill(server.proc.pid, signal.SIGSTOP)  # answers nothing: the probe's read times out
        try:
            for role in ("generator", "verifier", "trainer"):
                assert health.main([role, "--liveness", "--timeout-s", "0.5"]) == 0
                assert "rides the outage out" in capsys.readouterr().err
                assert health.main([role, "--timeout-s", "0.5"]) == 1
                assert "does not answer" in capsys.readouterr().err
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.kill()  # gone: connection refused
        for role in ("generator", "verifier"):
            assert health.main([role, "--liveness", "--timeout-s", "0.5"]) == 0
            assert health.main([role, "--timeout-s", "0.5"]) == 1


def test_liveness_is_red_on_refused_credentials(monkeypatch, capsys) -> None:
    """A wrong password is no outage (redis-py raises it as a ConnectionError): never healthy."""
    with EmbeddedRedis() as server:
        redis_sync.Redis.from_url(server.url).config_set("requirepass", "right")
        monkeypatch.setenv("PROOFSTREAM_REDIS_URL", server.url.replace("redis://", "redis://:wrong@"))
        assert health.main(["generator", "--liveness"]) == 1
        assert "refused the credentials" in capsys.readouterr().err


def test_kubernetes_restarts_the_long_lived_roles_on_a_stale_report_only() -> None:
    """The manifests' livenessProbes of the generator and the verifier are `ops.health <role> --liveness`."""
    docs = [d for d in yaml.safe_load_all((ROOT / "ops" / "deploy" / "k8s" / "proofstream.yaml").read_text()) if d]
    probes = {}
    for doc in docs:
        for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            if "livenessProbe" in container:
                probes[container["name"]] = container["livenessProbe"]["exec"]["command"]
    roles = {name: role for name in probes for role in ("generator", "verifier") if role in name}
    assert sorted(roles.values()) == ["generator", "verifier"], probes
    for name, role in roles.items():
        assert probes[name][:4] == ["python", "-m", "ops.health", role] and "--liveness" in probes[name], probes[name]
