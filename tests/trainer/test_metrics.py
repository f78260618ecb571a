"""The run's metrics: the JSONL in the run directory and, with TensorBoard installed (a dev dependency), the
same numbers as TensorBoard scalars, read back with TensorBoard's own reader."""

from __future__ import annotations

import orjson
import pytest

from trainer.metrics import MetricsSink


def test_versions_and_evaluations_reach_the_jsonl_and_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = MetricsSink(tmp_path)
    records = [
        {"version": 1, "reward_mean": 0.25, "pass_rate": 0.125, "algo": "es", "time": 1.0},
        {"version": 2, "reward_mean": 0.5, "pass_rate": 0.25, "algo": "es", "time": 2.0},
        {"eval": True, "version": 2, "held_out_reward": 0.75, "problems": 4, "time": 3.0},
    ]
    for record in records:
        sink.write(record)
    assert [orjson.loads(line) for line in sink.path.read_bytes().splitlines()] == records == sink.records()

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()

    def scalars(tag: str) -> list[tuple[int, float]]:
        return [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)]

    assert scalars("reward_mean") == [(1, 0.25), (2, 0.5)]
    assert scalars("pass_rate") == [(1, 0.125), (2, 0.25)]
    assert scalars("eval/held_out_reward") == [(2, 0.75)]
    tags = set(events.Tags()["scalars"])
    assert not tags & {"time", "version", "algo", "eval/eval"}  # numbers only (not flags), the step is the version


def test_a_restart_gives_tensorboard_what_a_killed_trainer_wrote_to_the_jsonl_only(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    MetricsSink(tmp_path).write({"version": 1, "reward_mean": 0.25, "time": 1.0})
    with open(tmp_path / "metrics.jsonl", "ab") as jsonl:  # killed after the JSONL, before TensorBoard
        jsonl.write(orjson.dumps({"version": 2, "reward_mean": 0.5, "time": 2.0}) + b"\n")
        jsonl.write(orjson.dumps({"eval": True, "version": 2, "held_out_reward": 0.75, "time": 3.0}) + b"\n")
    again = MetricsSink(tmp_path)
    assert again.catch_up() == 2 and again.catch_up() == 0  # logged once
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    # Two event files, one a start; the reader takes them in name order, and names made in one second differ
    # only by a per-process counter compared as text (".10" before ".9"), so the steps come in either order:
    # TensorBoard plots by step.
    assert sorted((e.step, e.value) for e in events.Scalars("reward_mean")) == [(1, 0.25), (2, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("eval/held_out_reward")] == [(2, 0.75)]
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
