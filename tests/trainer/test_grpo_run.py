"""The GRPO run in process against a real Redis, with a stand-in generator + verifier whose first group has no
signal (all rewards equal), as the 135M default's Countdown groups often have: the step changes nothing, the
version stays, and the run must neither re-issue that version's finished evaluation (its work id would be a
repeat the generators drop, and the run would wait for it until the deadline) nor lose count of the samples.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from streams.codec import pack_float32, pack_int32
from streams.keys import GENERATORS, Keys
from streams.publisher import Publisher
from streams.runtime import Consumer, ConsumerSettings, Delivery
from streams.schema import Attempt, Reward, WorkOrder
from tests.trainer.test_grpo import tiny_llama
from trainer.config import TrainerSettings
from trainer.data import load_theorems
from trainer.grpo import GRPORun, grad_accum_for, unneeded_policies
from trainer.metrics import MetricsSink


def test_grad_accum_keeps_micro_batches_small():
    assert grad_accum_for(8, 8) == 8
    assert grad_accum_for(1, 2) == 1
    assert grad_accum_for(3, 4) == 2
    assert grad_accum_for(3, 4, micro_batch=4) == 3


def test_unneeded_policies_are_the_older_version_folders_only():
    folders = [Path(n) for n in ("v000001", "v000002", "v000003", ".tmp-v000004-x", "notes")]
    assert [f.name for f in unneeded_policies(folders, 3)] == ["v000001", "v000002"]
    assert unneeded_policies(folders, 1) == []


def _handler(publisher: Publisher):
    async def handle(delivery: Delivery[WorkOrder]) -> list[Reward]:
        """G attempts per theorem (fake tokens, behaviour logprobs -2), then their rewards: all 0 for the first
        group (no signal), the sample index / (G - 1) for the others, 0.5 for evaluation."""
        order = delivery.message
        out, attempts = [], []
        for i, theorem_id in enumerate(order.theorem_ids):
            for k in range(order.samples_per_theorem):
                attempt_id = f"{order.work_id}:{i}:{k}"
                if order.work_id.startswith("eval-"):
                    reward = 0.5
                elif order.work_id == "grpo-v0-g0":
                    reward = 0.0
                else:
                    reward = k / max(1, order.samples_per_theorem - 1)
                tokens, logprobs = pack_int32([5 + i, 6 + k, 7, 8]), pack_float32([-2.0] * 4)
                attempts.append(
                    Attempt(
                        attempt_id,
                        order.work_id,
                        theorem_id,
                        order.policy_version,
                        k,
                        "x",
                        task=order.task,
                        num_tokens=4,
                        token_ids=tokens,
                        logprobs=logprobs,
                        prompt_ids=pack_int32([1, 2, 3]),
                    )
                )
                out.append(
                    Reward(
                        attempt_id=attempt_id,
                        theorem_id=theorem_id,
                        sample_index=k,
                        reward=reward,
                        policy_version=order.policy_version,
                        verdict="rejected",
                        work_id=order.work_id,
                    )
                )
        await publisher.publish(attempts)
        return out

    return handle


@pytest.mark.timeout(120)
async def test_a_step_without_signal_keeps_the_version_evaluates_it_once_and_counts_its_samples(one_redis, tmp_path):
    settings = TrainerSettings(
        run="grpo-nosignal",
        algo="grpo",
        iterations=3,
        batch=1,
        group_size=2,
        eval_every=1,
        problems=6,
        held_out=2,
        max_new_tokens=4,
        deadline_s=60.0,
    )
    model = tmp_path / "tiny"
    tiny_llama().save_pretrained(model)
    keys = Keys(settings.run)
    train, held_out = load_theorems(settings)
    run = GRPORun(settings, one_redis, train, held_out, MetricsSink(tmp_path / "run"), model_path=model)
    roles = Consumer(
        one_redis,
        keys,
        message_type=WorkOrder,
        group=GENERATORS,
        name="fake",
        output=Reward,
        handler=_handler(Publisher(one_redis, keys)),
        settings=ConsumerSettings(batch_size=1, block_ms=100),
    )
    await roles.ensure_group()
    stop, roles_stop = asyncio.Event(), asyncio.Event()
    serving = asyncio.create_task(roles.run(roles_stop))
    started = time.monotonic()
    try:
        summary = await asyncio.wait_for(run.run(stop), 90)
    finally:
        roles_stop.set()
        await serving
    # the deadline (60 s) is never waited for: every evaluation asked for was answered
    assert time.monotonic() - started < 45
    assert summary["version"] == 3
    assert sorted(summary["evals"]) == [0, 1, 2, 3]
    assert summary["counts"]["steps_without_signal"] == 1
    records = run.sink.records()
    assert sorted(r["version"] for r in records if r.get("eval")) == [0, 1, 2, 3]  # each version evaluated once
    updates = [r for r in records if not r.get("eval")]
    # samples: every training attempt a step consumed, including the 2 of the step without signal
    assert [r["samples"] for r in updates] == [4, 6, 8]
    assert [r["attempts"] for r in updates] == [2, 2, 2]
    assert summary["counts"]["samples"] == 8
    policies = {p.name for p in (tmp_path / "run" / "policy").iterdir() if not p.name.startswith(".")}
    assert "v000003" in policies and "v000001" not in policies  # folders no order can name are deleted
