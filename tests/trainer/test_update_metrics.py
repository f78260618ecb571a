"""The metrics every version carries, ES and GRPO alike (trainer/loop.py `_publish`), from a real update on a real
Redis: orders of known centers go in, and the version's entry in `{ps:R}:metrics` and its line in metrics.jsonl
must say, as worked out by hand here, how stale each order used was (versions between its center and the
version the update starts from: 0 for the newest) and how many training attempts the run has consumed."""

from __future__ import annotations

import orjson
import pytest

from streams.keys import Keys
from trainer.config import TrainerSettings
from trainer.es import ESRun
from trainer.metrics import MetricsSink
from trainer.orders import Order

# What every version's metrics hold, whatever the algorithm.
COMMON = {
    "version",
    "algo",
    "reward_mean",
    "pass_rate",
    "attempts",
    "samples",
    "stale_dropped",
    "staleness",
    "verdicts",
    "rewards_per_s",
    "update_s",
    "in_flight",
    "time",
}


def _order(prefix: str, center: int, index: int, rewards: list[float], samples: int = 1) -> Order:
    work_id = f"{prefix}-v{center}-{'g' if prefix == 'grpo' else 'm'}{index}"
    return Order(
        work_id,
        center,
        100 * center + index,
        1,
        ["t"],
        samples=samples,
        rewards={f"{work_id}:0:{k}": r for k, r in enumerate(rewards)},
    )


async def _published(redis, run: str) -> dict:
    [(_, fields)] = await redis.xrange(Keys(run).metrics)
    return orjson.loads(fields[b"json"])


async def test_an_es_version_counts_staleness_from_the_version_it_steps_from_and_its_samples(one_redis, tmp_path):
    """At version 5 with max_staleness 2: members of centers 5, 5, 4, 3 are used (lags 0, 0, 1, 2), the one of
    center 2 (lag 3) is dropped. Each member answers 2 problems: 8 attempts, on top of 10 consumed before."""
    settings = TrainerSettings(run="es-metrics", population=4, max_staleness=2, antithetic=False, eval_every=0)
    run = ESRun(settings, one_redis, [], [], MetricsSink(tmp_path / "run"))
    run.version, run.counts["samples"] = 5, 10
    members = [_order("es", c, i, [0.5, 1.0]) for c, i in ((5, 0), (5, 1), (4, 0), (3, 0), (2, 0))]
    for m in members:
        m.theorem_ids = ["a", "b"]
        run.orders[m.work_id] = m
    metrics = await run.update(members)
    published = await _published(one_redis, "es-metrics")
    assert published == metrics and [r for r in run.sink.records() if not r.get("eval")] == [metrics]
    assert metrics.keys() >= COMMON and metrics["algo"] == "es" and metrics["version"] == 6
    assert metrics["staleness"] == {"0": 2, "1": 1, "2": 1}
    assert metrics["stale_dropped"] == 1 and metrics["members"] == 4
    assert (metrics["attempts"], metrics["samples"]) == (8, 18) and run.counts["samples"] == 18
    assert metrics["reward_mean"] == 0.75  # (0.5 + 1.0) / 2 on every attempt
    # the record's keys in the order metrics.jsonl has always had them: common, ES's own, health, time, pipeline
    assert list(metrics) == [
        *("version", "algo", "reward_mean", "pass_rate", "attempts", "samples", "stale_dropped", "staleness"),
        *("verdicts", "rewards_per_s", "update_s", "reward_max", "members", "member_spread", "stragglers"),
        *("in_flight", "oldest_in_flight_s", "evals_in_flight", "time", "dead_letters", "dead_letters_by_reason"),
        "oldest_pending_idle_ms",
    ]


@pytest.mark.timeout(120)
async def test_a_grpo_version_counts_staleness_from_the_version_it_steps_from_and_its_samples(one_redis, tmp_path):
    """At version 3 with max_staleness 1: groups of centers 3, 3, 2 are used (lags 0, 0, 1), the one of center 1
    (lag 2) is dropped. G = 2 samples each, rewards 0 and 1 (signal, so the step makes version 4): 6 attempts,
    on top of 4 consumed before."""
    pytest.importorskip("torch")
    from tests.trainer.test_grpo import tiny_llama
    from trainer.grpo import GRPORun

    model = tmp_path / "tiny"
    tiny_llama().save_pretrained(model)
    settings = TrainerSettings(
        run="grpo-metrics",
        algo="grpo",
        batch=4,
        group_size=2,
        max_staleness=1,
        eval_every=0,
        train_device="cpu",
        train_precision="fp32",
    )
    run = GRPORun(settings, one_redis, [], [], MetricsSink(tmp_path / "run"), model_path=model)
    run.version = run.trainer.version = 3
    run.counts["samples"] = 4
    groups = [_order("grpo", c, i, [0.0, 1.0], samples=2) for c, i in ((3, 0), (3, 1), (2, 0), (1, 0))]
    for g in groups:
        run.orders[g.work_id] = g
        for k, attempt_id in enumerate(sorted(g.rewards)):
            sample = {
                "prompt_ids": [1, 2, 3],
                "token_ids": [5 + k, 6, 7],
                "logprobs": [-2.0] * 3,
                "policy_version": g.center,
            }
            run.samples.add(g.work_id, attempt_id, sample)
    metrics = await run.update(groups)
    published = await _published(one_redis, "grpo-metrics")
    assert published == metrics and [r for r in run.sink.records() if not r.get("eval")] == [metrics]
    assert metrics.keys() >= COMMON and metrics["algo"] == "grpo" and metrics["version"] == 4 == run.version
    assert metrics["staleness"] == {"0": 2, "1": 1}
    assert metrics["stale_dropped"] == 1 and metrics["groups"] == 3
    assert (metrics["attempts"], metrics["samples"]) == (6, 10) and run.counts["samples"] == 10
    assert metrics["reward_mean"] == 0.5 and run.orders == {} and not run.samples.groups
