"""Every work order ends in an outcome the trainer sees, and a lost one never holds a slot.

The trainer runs in process on a real Redis; the generator and the verifier are two real consumers of the
runtime (`streams.runtime.Consumer`, the settle script, its dead letters) with handlers that misbehave on
purpose: a generator that skips every first order of version 1 as stale, a work order and an attempt that
end in the dead letters, an evaluation order that does, and a generator killed with orders in hand that
nobody reclaims (its entries stay pending under its name, as a SIGKILLed process leaves them). Each run must
finish every version with its full population (ES) or batch (GRPO), count what it cut, and never use a cut
member's rewards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import orjson
import pytest

from streams import samples
from streams.codec import decode, pack_float32, pack_int32
from streams.keys import GENERATORS, VERIFIERS, Keys
from streams.runtime import Consumer, ConsumerSettings, Delivery, Poison, Skip
from streams.schema import Attempt, PolicyUpdate, Reward, WorkOrder
from trainer.config import TrainerSettings
from trainer.data import load_theorems
from trainer.metrics import MetricsSink

POPULATION = 4
NEVER_MS = 3_600_000  # the live generator's reclaim deadline: nobody reclaims a dead generator's orders


def _reward(attempt_id: str) -> float:
    """Deterministic rewards with a spread across members, so every ES step carries signal."""
    return (sum(attempt_id.encode()) % 5) / 4


def _text(attempt_id: str) -> str:
    """The model's whole text of an attempt (its proof is "x"): what the run's traces must keep."""
    return f"<think>working on {attempt_id}</think>\nx"


def _generator(misbehave: Callable[[WorkOrder], None]):
    async def handle(delivery: Delivery[WorkOrder]) -> list[Attempt]:
        order = delivery.message
        misbehave(order)
        out = []
        for i, theorem_id in enumerate(order.theorem_ids):
            for k in range(order.samples_per_theorem):
                attempt_id = f"{order.work_id}:{i}:{k}"
                out.append(
                    Attempt(
                        attempt_id,
                        order.work_id,
                        theorem_id,
                        order.policy_version,
                        k,
                        "x",
                        text=_text(attempt_id),
                        task=order.task,
                        member=order.member,
                        num_tokens=4,
                        token_ids=pack_int32([5 + i, 6 + k, 7, 8]),
                        logprobs=pack_float32([-2.0] * 4),
                        prompt_ids=pack_int32([1, 2, 3]),
                    )
                )
        return out

    return handle


def _verifier(misbehave: Callable[[Attempt], None]):
    async def handle(delivery: Delivery[Attempt]) -> list[Reward]:
        a = delivery.message
        misbehave(a)
        return [
            Reward(
                attempt_id=a.attempt_id,
                theorem_id=a.theorem_id,
                sample_index=a.sample_index,
                reward=_reward(a.attempt_id),
                policy_version=a.policy_version,
                verdict="rejected",
                member=a.member,
                work_id=a.work_id,
                attempt_entry=delivery.entry_id.decode(),
            )
        ]

    return handle


def _stale_first_orders_of_v1(order: WorkOrder) -> None:
    if order.work_id.startswith("es-v1-") and int(order.work_id.rsplit("m", 1)[1]) < POPULATION:
        raise Skip(f"stale: policy version {order.policy_version}, newest {order.policy_version + 1}, bound 0")


def _poison_work(work_id: str) -> Callable[[WorkOrder], None]:
    def misbehave(order: WorkOrder) -> None:
        if order.work_id == work_id:
            raise Poison(f"bad policy for {work_id}")

    return misbehave


def _poison_attempt(attempt_id: str) -> Callable[[Attempt], None]:
    def misbehave(a: Attempt) -> None:
        if a.attempt_id == attempt_id:
            raise Poison("unparseable")

    return misbehave


def _fine(_message: object) -> None:
    return None


@contextlib.asynccontextmanager
async def _roles(redis, keys: Keys, generator: Callable, verifier: Callable):
    """A generator and a verifier consumer, both real runtime consumers, serving until the block ends."""
    fast = ConsumerSettings(batch_size=1, block_ms=50, claim_idle_ms=NEVER_MS, max_deliveries=3)
    gen = Consumer(
        redis,
        keys,
        message_type=WorkOrder,
        group=GENERATORS,
        name="gen",
        output=Attempt,
        handler=_generator(generator),
        settings=fast,
    )
    ver = Consumer(
        redis,
        keys,
        message_type=Attempt,
        group=VERIFIERS,
        name="ver",
        output=Reward,
        handler=_verifier(verifier),
        settings=fast,
    )
    await gen.ensure_group()
    await ver.ensure_group()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in (gen, ver)]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def _kill_a_generator_holding(redis, keys: Keys, n: int) -> list[str]:
    """What a SIGKILLed generator leaves: `n` orders delivered to it, pending under its name for good."""
    await redis.xgroup_createconsumer(keys.work, GENERATORS, "dead-gen")
    reply = await redis.xreadgroup(GENERATORS, "dead-gen", {keys.work: ">"}, count=n)
    return [decode(WorkOrder, fields).work_id for _, fields in reply[0][1]]


async def _published(redis, keys: Keys, n: int) -> bool:
    return await redis.xlen(keys.work) >= n


async def _until(predicate, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


SCENARIOS = {
    # name: (generator misbehaviour, verifier misbehaviour, counts expected, work ids that must not be used)
    "stale": (_stale_first_orders_of_v1, _fine, {"cut_skipped": POPULATION}, [f"es-v1-m{i}" for i in range(4)]),
    "work_dead_letter": (_poison_work("es-v0-m2"), _fine, {"cut_dead_letter": 1}, ["es-v0-m2"]),
    "attempt_dead_letter": (_fine, _poison_attempt("es-v1-m1:1:0"), {"cut_dead_letter": 1}, ["es-v1-m1"]),
    "eval_dead_letter": (_poison_work("eval-v0"), _fine, {"evals_reissued": 1}, []),
    # the dead generator holds every order the run publishes first: the evaluation of v0 and the population
    "killed_generator": (
        _fine,
        _fine,
        {"cut_timeout": POPULATION, "evals_reissued": 1},
        [f"es-v0-m{i}" for i in range(POPULATION)],
    ),
}


LETTERS = {  # the dead letters each scenario makes, as each version's metrics count them
    "stale": {"work: skipped": POPULATION},
    "work_dead_letter": {"work: poison": 1},
    "attempt_dead_letter": {"attempts: poison": 1},
    "eval_dead_letter": {"work: poison": 1},
    "killed_generator": {},
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_every_es_order_ends_in_an_outcome_and_a_lost_one_never_holds_a_slot(one_redis, tmp_path, scenario):
    from trainer.es import ESRun

    generator, verifier, expected, unused = SCENARIOS[scenario]
    settings = TrainerSettings(
        run=f"lost-{scenario}",
        population=POPULATION,
        antithetic=False,
        batch=2,
        quorum=1.0,
        max_staleness=0,
        iterations=3,
        problems=8,
        held_out=2,
        eval_every=3,
        order_timeout_s=3.0,
        deadline_s=60.0,
    )
    keys = Keys(settings.run)
    train, held_out = load_theorems(settings)
    run = ESRun(settings, one_redis, train, held_out, MetricsSink(tmp_path))
    stop = asyncio.Event()
    running = asyncio.create_task(run.run(stop))
    killed: list[str] = []
    try:
        if scenario == "killed_generator":  # it takes the first orders before any live generator runs
            await _until(lambda: _published(one_redis, keys, 1 + POPULATION))
            killed = await _kill_a_generator_holding(one_redis, keys, 1 + POPULATION)
            assert killed == ["eval-v0", *(f"es-v0-m{i}" for i in range(POPULATION))]
        async with _roles(one_redis, keys, generator, verifier):
            summary = await asyncio.wait_for(asyncio.shield(running), 90)
    finally:
        stop.set()
        await running

    assert summary["version"] == settings.iterations
    steps = [decode(PolicyUpdate, f).es_step for _, f in await one_redis.xrange(keys.policy)]
    assert [len(s["members"]) for s in steps] == [POPULATION] * settings.iterations  # the full population each time
    used = {m for s in steps for m in s["members"]}
    assert not used & set(unused)
    for name, count in expected.items():
        assert summary["counts"].get(name) == count, summary["counts"]
    # nothing left holding a slot: only members issued around the last center are still out (top-up keeps
    # `population` unfinished members in flight, so the generators never wait for an update)
    assert all(m.center == settings.iterations - 1 for m in run.orders.values()) and run.evals == {}
    assert sorted(summary["evals"]) == [0, 3]  # evaluations answered, the lost one too (asked again)
    last = [r for r in run.sink.records() if not r.get("eval")][-1]
    for name, count in expected.items():
        assert last[name] == count  # the metrics carry the counts
    assert last["dead_letters_by_reason"] == LETTERS[scenario]
    assert last["in_flight"] >= 0 and "evals_in_flight" in last and "oldest_in_flight_s" in last
    assert {"work/generators", "attempts/verifiers", "rewards/trainer", "dlq/trainer"} <= set(
        last["oldest_pending_idle_ms"]
    )
    for work_id in killed:  # cancelled: a generator that reclaims it later skips it unserved
        assert await one_redis.get(keys.done(WorkOrder.dedup_for(work_id))) == b"cancelled"
    # Traces: a sample for every reward the run read (all still in the stream: history_s is an hour), with
    # its attempt's whole text and the verdict, in the file of the attempt's policy version.
    rewards = {decode(Reward, f).attempt_id: decode(Reward, f) for _, f in await one_redis.xrange(keys.rewards)}
    traced = list(samples.read_dir(tmp_path))
    assert sorted(s["attempt_id"] for s in traced) == sorted(rewards)
    for s in traced:
        r = rewards[s["attempt_id"]]
        assert (s["text"], s["proof"], s["verdict"], s["reward"]) == (_text(r.attempt_id), "x", "rejected", r.reward)
        assert s in samples.read_dir(tmp_path, version=r.policy_version)
    assert summary["counts"]["traced_samples"] >= len(rewards) and not summary["counts"].get("traced_without_text")


@pytest.mark.timeout(120)
async def test_a_resume_writes_the_versions_redis_has_and_the_run_directory_lacks(one_redis, tmp_path):
    """A trainer killed between a version's MULTI and its metrics line: Redis has the version, metrics.jsonl
    not. The next trainer writes it from the metrics stream (and an evaluation from the checkpoint)."""
    from trainer.es import ESRun

    settings = TrainerSettings(
        run="backfill",
        population=POPULATION,
        antithetic=False,
        batch=2,
        quorum=1.0,
        max_staleness=0,
        iterations=2,
        problems=8,
        held_out=2,
        eval_every=2,
    )
    keys = Keys(settings.run)
    train, held_out = load_theorems(settings)
    async with _roles(one_redis, keys, _fine, _fine):
        await ESRun(settings, one_redis, train, held_out, MetricsSink(tmp_path)).run(asyncio.Event())
    sink = MetricsSink(tmp_path)
    whole = sink.records()
    assert [(r.get("eval", False), r["version"]) for r in whole] == [(True, 0), (False, 1), (False, 2), (True, 2)]
    kept = [r for r in whole if r["version"] != 2]  # as if killed right after version 2's MULTI
    sink.path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in kept))
    again = ESRun(settings.model_copy(update={"iterations": 3}), one_redis, train, held_out, MetricsSink(tmp_path))
    assert await again.resume()
    restored = MetricsSink(tmp_path).records()
    assert [(r.get("eval", False), r["version"]) for r in restored] == [(True, 0), (False, 1), (False, 2), (True, 2)]
    assert restored[2] == whole[2]  # the version's own metrics, from the metrics stream, not rebuilt
    assert restored[3]["held_out_reward"] == whole[3]["held_out_reward"]
    assert again.counts["metrics_backfilled"] == 2


@pytest.mark.timeout(180)
@pytest.mark.parametrize("scenario", ["work_dead_letter", "attempt_dead_letter"])
async def test_a_grpo_group_whose_order_or_attempt_is_dead_lettered_is_cut_and_replaced(one_redis, tmp_path, scenario):
    from tests.trainer.test_grpo import tiny_llama
    from trainer.grpo import GRPORun

    generator = _poison_work("grpo-v0-g1") if scenario == "work_dead_letter" else _fine
    verifier = _poison_attempt("grpo-v0-g1:0:1") if scenario == "attempt_dead_letter" else _fine
    settings = TrainerSettings(
        run=f"grpo-lost-{scenario}",
        algo="grpo",
        iterations=2,
        batch=2,
        group_size=2,
        quorum=1.0,
        max_staleness=0,
        eval_every=0,
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
    async with _roles(one_redis, keys, generator, verifier):
        summary = await asyncio.wait_for(run.run(asyncio.Event()), 150)
    assert summary["version"] == 2 and summary["counts"]["cut_dead_letter"] == 1
    updates = [r for r in run.sink.records() if not r.get("eval")]
    assert [r["groups"] for r in updates] == [2, 2]  # the full batch each step
    assert all("grpo-v0-g1" not in r["groups_used"] for r in updates)
    # the cut group's samples and attempt entries are let go (only groups still in flight hold any)
    assert set(run.samples.groups) <= set(run.orders)
    assert all(a.rsplit(":", 2)[0] == w for w, held in run.samples.groups.items() for a in held)
    assert set(run.samples.entries) <= set(run.orders)
    pending = await one_redis.xpending_range(keys.attempts, "trainer", min="-", max="+", count=100)
    held = {e for ids in run.samples.entries.values() for e in ids}
    assert {p["message_id"] for p in pending} <= held
