"""evals/runs.py: finding a run's Redis. Real Redis servers of our own."""

from __future__ import annotations

from evals.runs import live_server
from streams.embedded import EmbeddedRedis


def test_a_running_embedded_redis_is_found_by_its_data_directory(tmp_path):
    server = EmbeddedRedis(data_dir=tmp_path).start()
    try:
        assert live_server(tmp_path) == server.url
    finally:
        server.stop()
    assert live_server(tmp_path) is None
