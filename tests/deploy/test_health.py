"""ops/health.py, the containers' health checks, against a real Redis: a generator is healthy while its own
figures are fresh, not when they are stale, missing or another host's; the trainer's check is Redis answering."""

from __future__ import annotations

import socket
import time

import orjson
import pytest
import redis as redis_sync

from ops import health
from streams.keys import Keys

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
