"""evals/runs.py: finding a run's Redis, through the one opener of a run directory's Redis
(streams/run_redis.py). Real Redis servers of our own."""

from __future__ import annotations

import fcntl

import pytest
import redis as redis_sync

from evals.runs import EvalError, run_redis
from streams.embedded import EmbeddedRedis
from streams.run_redis import RunGoing, live_server, reopen
from trainer.config import TrainerSettings


def test_a_running_embedded_redis_is_found_by_its_data_directory(tmp_path):
    server = EmbeddedRedis(data_dir=tmp_path).start()
    try:
        assert live_server(tmp_path) == server.url
    finally:
        server.stop()
    assert live_server(tmp_path) is None


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_live_run_is_read_on_its_own_server_and_a_stopped_one_on_a_copy_that_leaves_its_folder_as_it_was(tmp_path):
    data = tmp_path / "redis"
    data.mkdir()
    settings = TrainerSettings(run="r")
    with open(data / ".lock", "a+") as lock:  # what a live local pipeline holds, with its server on the data
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        server = EmbeddedRedis(data_dir=data).start()
        try:
            redis_sync.Redis.from_url(server.url).xadd("{ps:r}:rewards", {"v": "1"})
            with run_redis(settings, tmp_path) as (url, how):
                assert url == server.url and "still running" in how
            with pytest.raises(RunGoing) as going, reopen(tmp_path):  # ops's mode: never a live run's server
                pass
            assert going.value.url == server.url
        finally:
            server.stop()
    before = _files(tmp_path)
    with run_redis(settings, tmp_path) as (url, how):
        assert url != server.url and "a copy" in how
        client = redis_sync.Redis.from_url(url)
        assert client.xlen("{ps:r}:rewards") == 1
        client.xadd("{ps:r}:rewards", {"v": "1"})  # a write reaches the copy only
        client.close()
    assert _files(tmp_path) == before and live_server(data) is None


def test_a_folder_without_redis_data_is_refused_with_what_to_pass(tmp_path):
    (tmp_path / "redis").mkdir()
    with (
        pytest.raises(EvalError, match="holds no Redis data.*--redis-url"),
        run_redis(TrainerSettings(run="r"), tmp_path),
    ):
        pass
