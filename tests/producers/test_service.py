"""The generator service in-process on the real default model and a real Redis: orders in, attempts out.

One fp32 engine for the module (its ES history belongs to these tests). Waiting is always on a condition
in Redis (attempts arrived, nothing pending), with a deadline; never a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import time

import pytest

torch = pytest.importorskip("torch", reason="the generator needs torch (make test installs torch==2.13.0)")

from producers.config import GeneratorSettings  # noqa: E402
from producers.service import GeneratorService  # noqa: E402
from streams import role_stats  # noqa: E402
from streams.codec import decode, unpack_float32, unpack_int32  # noqa: E402
from streams.keys import GENERATORS, VERIFIERS, Keys  # noqa: E402
from streams.publisher import Publisher  # noqa: E402
from streams.runtime import ensure_group  # noqa: E402
from streams.schema import Attempt, DeadLetter, Member, PolicyUpdate, WorkOrder  # noqa: E402
from streams.theorems import Theorem, register  # noqa: E402
from tasks import prompts  # noqa: E402
from weights.es import ESWeights  # noqa: E402
from weights.io import digest, load_master  # noqa: E402
from weights.model import weights_digest  # noqa: E402
from weights.step import ESStep  # noqa: E402

RUN = "gen"
KEYS = Keys(RUN)
THEOREMS = [
    Theorem("cd-a", "countdown", numbers=[3, 5], target=8),
    Theorem("cd-b", "countdown", numbers=[9, 3], target=3),
]
SHORT = {"max_new_tokens": 8, "temperature": 1.0}
STEP = {"seeds": [101], "signs": [1], "rewards": [1.0], "sigma": 0.001, "alpha": 0.0005}


@pytest.fixture(scope="module")
def engine(model_path):
    from producers.hf import HFEngine

    e = HFEngine(model_path)
    yield e
    e.close()


@contextlib.asynccontextmanager
async def serving(redis, engine, **overrides):
    settings = GeneratorSettings(**{"run": RUN, "name": "g1", "policy_wait_s": 2.0, "report_every_s": 0.2, **overrides})
    service = GeneratorService(settings, redis, engine)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        yield service
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def until(predicate, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not (result := await predicate()):
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)
    return result


async def attempts(redis) -> list[Attempt]:
    return [decode(Attempt, f) for _, f in await redis.xrange(KEYS.attempts)]


async def publish(redis, *messages):
    await Publisher(redis, KEYS).publish(list(messages))


async def settled(redis) -> bool:
    """Every work order taken and acked."""
    groups = {g["name"].decode(): g for g in await redis.xinfo_groups(KEYS.work)}
    g = groups.get(GENERATORS)
    return bool(g) and g["pending"] == 0 and g["lag"] == 0


async def test_es_order_becomes_one_attempt_per_theorem_with_ids_from_the_order(one_redis, engine):
    await register(one_redis, KEYS, THEOREMS)
    order = WorkOrder("w-es", 0, "es", "countdown", ["cd-a", "cd-b"], member=Member(7, -1), sigma=0.001, sampling=SHORT)
    await publish(one_redis, order)
    async with serving(one_redis, engine) as service:
        got = await until(lambda: _n(one_redis, 2))
        await until(lambda: settled(one_redis))
    assert [a.attempt_id for a in got] == ["w-es:0:0", "w-es:1:0"]
    assert [a.theorem_id for a in got] == ["cd-a", "cd-b"]
    assert all(a.member == Member(7, -1) and a.policy_version == 0 and a.task == "countdown" for a in got)
    assert all(a.num_tokens > 0 and a.token_ids == b"" for a in got)  # ES carries no token ids
    assert engine.es.current == (0, 7, -1, 0.001, 0)  # the member's full-rank weights were in place
    assert service.counts["orders"] == 1 and service.counts["attempts"] == 2
    reported = (await role_stats.generators(one_redis, KEYS))["g1"]
    assert (reported["name"], reported["engine"], reported["attempts"]) == ("g1", "hf", 2)
    assert await one_redis.get(KEYS.es_noise) == b"cpu"  # the first ES generator named the run's noise device


async def test_a_dead_engine_stops_the_generator_and_leaves_the_order_pending(one_redis, engine, monkeypatch):
    """Seen here: a vLLM engine core stalled past its timeouts raises EngineDeadError on every call after;
    a generator that went on took order after order and sent each to the dead letters. It stops instead
    (exit 1 with the reason), and the order stays pending for a live generator."""

    class EngineDeadError(RuntimeError):  # vllm.v1.engine.exceptions.EngineDeadError, matched by name
        pass

    def dead(*args, **kwargs):
        raise EngineDeadError("EngineCore encountered an issue")

    monkeypatch.setattr(engine, "generate", dead)
    await register(one_redis, KEYS, THEOREMS)
    await publish(
        one_redis, WorkOrder("w-dead", 0, "grpo", "countdown", ["cd-a"], samples_per_theorem=1, sampling=SHORT)
    )
    settings = GeneratorSettings(run=RUN, name="g-dead", policy_wait_s=2.0, report_every_s=0.2)
    service = GeneratorService(settings, one_redis, engine)
    await asyncio.wait_for(service.run(asyncio.Event()), 60)  # returns by itself
    assert "engine died (EngineDeadError" in service.fatal
    assert await one_redis.xlen(KEYS.dlq) == 0 and (await one_redis.xpending(KEYS.work, GENERATORS))["pending"] == 1


async def test_an_order_the_engine_fails_on_every_delivery_is_an_infrastructure_dead_letter(
    one_redis, engine, monkeypatch
):
    """One order the engine cannot serve (here: its theorem's prompt makes it raise) while others pass: the
    generator goes on, the order is retried, and on its last delivery dead-lettered blaming the engine, not
    the order (`infrastructure: generator g-one: <the error>`)."""
    real = engine.generate

    def fails_on_cd_b(prompts_ids, sampling):
        if bad in prompts_ids:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(prompts_ids, sampling)

    await register(one_redis, KEYS, THEOREMS)
    bad = prompts.tokenize(engine.tokenizer, prompts.messages(THEOREMS[1]))
    monkeypatch.setattr(engine, "generate", fails_on_cd_b)
    orders = [
        WorkOrder("w-bad", 0, "grpo", "countdown", ["cd-b"], samples_per_theorem=1, sampling=SHORT),
        WorkOrder("w-ok", 0, "grpo", "countdown", ["cd-a"], samples_per_theorem=1, sampling=SHORT),
    ]
    await publish(one_redis, *orders)
    async with serving(one_redis, engine, name="g-one", max_deliveries=2, claim_idle_ms=1000) as service:
        await until(lambda: _n(one_redis, 1))
        await until(lambda: one_redis.xlen(KEYS.dlq))
        await until(lambda: settled(one_redis))
    [(_, fields)] = await one_redis.xrange(KEYS.dlq)
    letter = decode(DeadLetter, fields)
    reason = "infrastructure: generator g-one: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert letter.reason == reason and letter.deliveries == 2
    assert not service.fatal and service.counts["engine_errors"] == 2 and service.counts["orders"] == 1


async def test_the_same_engine_error_on_three_orders_stops_the_generator_with_it(one_redis, engine, monkeypatch):
    """The first H100 run: GRPO's engine failed every order alike, and the generator took order after order
    for minutes. After three different orders failed with one error it stops (exit 1 with the error), the
    orders left pending for a generator that works."""

    def mixed_devices(*args, **kwargs):
        raise RuntimeError("Expected all tensors to be on the same device, but got index is on cpu")

    monkeypatch.setattr(engine, "generate", mixed_devices)
    await register(one_redis, KEYS, THEOREMS)
    orders = [
        WorkOrder(f"w-{i}", 0, "grpo", "countdown", ["cd-a"], samples_per_theorem=1, sampling=SHORT) for i in range(4)
    ]
    await publish(one_redis, *orders)
    settings = GeneratorSettings(run=RUN, name="g-mix", policy_wait_s=2.0, report_every_s=0.2)
    service = GeneratorService(settings, one_redis, engine)
    await asyncio.wait_for(service.run(asyncio.Event()), 60)  # returns by itself
    assert service.fatal == (
        "the hf engine failed 3 orders in a row with the same error: RuntimeError: Expected "
        "all tensors to be on the same device, but got index is on cpu"
    )
    assert service.counts["engine_errors"] == 3 and await one_redis.xlen(KEYS.dlq) == 0
    report = (await role_stats.generators(one_redis, KEYS))["g-mix"]
    assert report["fatal"] == service.fatal  # what the trainer's progress watch names


async def test_an_order_whose_marker_says_it_is_settled_is_not_generated_again(one_redis, engine):
    """A restarted trainer publishes its orders in flight again; one a generator already settled (its
    marker set in the settle script) is acked without generating: no engine time, no attempts."""
    await register(one_redis, KEYS, THEOREMS)
    order = WorkOrder("w-done", 0, "es", "countdown", ["cd-a"], member=Member(7, 1), sigma=0.001, sampling=SHORT)
    await one_redis.set(KEYS.done(order.dedup_id), b"1-0")  # as the first settle left it
    await publish(one_redis, order)
    async with serving(one_redis, engine) as service:
        await until(lambda: settled(one_redis))
    assert await attempts(one_redis) == []
    assert service.counts["settled_skipped"] == 1 and service.counts["orders"] == 0


async def test_a_low_rank_bundle_is_one_engine_call_and_each_member_answers_under_its_own_work_id(
    one_redis, engine, monkeypatch
):
    """An ES order carrying members (trainer/es.py `bundle`): the live ones generated in one engine call
    with the center in the weights, each member's attempts under its own work id with its own answers (the
    engine's es_members for that member alone, computed here); a member the trainer cut is left out."""
    await register(one_redis, KEYS, THEOREMS)
    greedy = {"max_new_tokens": 8, "temperature": 0.0}
    members = [{"work_id": f"es-v0-m{i}", "seed": 40 + i // 2, "sign": (1, -1)[i % 2]} for i in range(3)]
    order = WorkOrder(
        "es-v0-m0+2-abc", 0, "es", "countdown", ["cd-a", "cd-b"], members=members, sigma=0.01, rank=4, sampling=greedy
    )
    await one_redis.set(KEYS.done(WorkOrder.dedup_for("es-v0-m1")), b"cancelled")  # the trainer cut member 1
    calls = []
    real = engine.generate
    monkeypatch.setattr(engine, "generate", lambda p, s: calls.append(len(p)) or real(p, s))
    await publish(one_redis, order)
    async with serving(one_redis, engine) as service:
        got = await until(lambda: _n(one_redis, 4))
        await until(lambda: settled(one_redis))
    assert calls == [2 * 2]  # two live members x two problems, one call
    assert engine.es.current[1] is None  # the center stayed in the weights
    assert [a.attempt_id for a in got] == ["es-v0-m0:0:0", "es-v0-m0:1:0", "es-v0-m2:0:0", "es-v0-m2:1:0"]
    assert [a.member for a in got] == [Member(40, 1)] * 2 + [Member(41, 1)] * 2
    assert {a.work_id for a in got} == {"es-v0-m0", "es-v0-m2"}
    ids = [prompts.tokenize(engine.tokenizer, prompts.messages(t)) for t in THEOREMS]
    for i, member in ((0, Member(40, 1)), (2, Member(41, 1))):
        alone = engine.es_members(0, [(member.seed, member.sign)], 0.01, 4, ids, _sampling(greedy))[0]
        texts = [prompts.extract("countdown", row[0].text) for row in alone]
        assert [a.proof for a in got if a.work_id == f"es-v0-m{i}"] == texts
    assert service.counts["members"] == 2 and service.counts["members_cut_skipped"] == 1
    assert service.counts["orders"] == 1 and service.counts["attempts"] == 4


def _sampling(fields):
    from producers.engine import Sampling

    return Sampling.from_order(fields, 1, None, False)


async def test_a_generator_on_another_noise_device_stops_and_leaves_the_es_order_for_the_others(one_redis, engine):
    """CUDA and CPU draw different noise from one seed (docs/results/gpu-check-h100.json): a CPU generator in
    a run whose ES noise is drawn on cuda would score members of another center. It stops, says why, and the
    order stays pending for a generator of the run's device type: not answered, not dead-lettered."""
    await register(one_redis, KEYS, THEOREMS)
    await one_redis.set(KEYS.es_noise, "cuda")
    await publish(
        one_redis, WorkOrder("w-cuda", 0, "es", "countdown", ["cd-a"], member=Member(7, 1), sigma=0.001, sampling=SHORT)
    )
    settings = GeneratorSettings(run=RUN, name="g-cpu", policy_wait_s=2.0, report_every_s=0.2)
    service = GeneratorService(settings, one_redis, engine)
    await asyncio.wait_for(service.run(asyncio.Event()), 60)  # returns by itself: nobody set the stop event
    assert "on cuda" in service.fatal and "this generator is on cpu" in service.fatal
    assert await attempts(one_redis) == [] and await one_redis.xlen(KEYS.dlq) == 0
    pending = await one_redis.xpending(KEYS.work, GENERATORS)
    assert pending["pending"] == 1  # still owed: another generator claims it after claim_idle_ms
    assert await one_redis.get(KEYS.es_noise) == b"cuda"  # not overwritten
    await publish(one_redis, WorkOrder("w-g2", 0, "grpo", "countdown", ["cd-a"], samples_per_theorem=1, sampling=SHORT))
    async with serving(one_redis, engine):  # GRPO draws no noise: any device serves it
        got = await until(lambda: _n(one_redis, 1))
    assert got[0].work_id == "w-g2"


async def _n(redis, n: int):
    got = await attempts(redis)
    assert len(got) <= n, f"more attempts than expected: {[a.attempt_id for a in got]}"
    return got if len(got) == n else None


async def test_grpo_attempts_carry_packed_tokens_logprobs_and_prompt(one_redis, engine):
    await register(one_redis, KEYS, THEOREMS[:1])
    await publish(one_redis, WorkOrder("w-g", 0, "grpo", "countdown", ["cd-a"], samples_per_theorem=3, sampling=SHORT))
    async with serving(one_redis, engine):
        got = await until(lambda: _n(one_redis, 3))
    assert [a.sample_index for a in got] == [0, 1, 2]
    prompt = prompts.tokenize(engine.tokenizer, prompts.messages(THEOREMS[0]))
    for a in got:
        tokens, logprobs = unpack_int32(a.token_ids), unpack_float32(a.logprobs)
        assert len(tokens) == len(logprobs) == a.num_tokens > 0
        assert (logprobs <= 0).all()
        assert unpack_int32(a.prompt_ids).tolist() == prompt


async def test_a_prompt_with_a_prefill_is_continued_and_read_back_in_front_of_the_completion(
    one_redis, engine, monkeypatch
):
    """`prompt_format = "equation"`: the assistant's turn is begun with "<answer> " and the model continues it;
    the attempt is read from the prefill and the completion together (the first line after the opened tag),
    not from the completion alone. The model's real completion gets a second line, as the default model's
    often have ("3 + 5 = 8\n\nThe answer is 8."), so the two readings differ."""
    real, said = engine.generate, []

    def with_a_second_line(prompt_ids, sampling):
        rows = real(prompt_ids, sampling)
        said.extend(s.text for row in rows for s in row)
        return [[dataclasses.replace(s, text=s.text + "\n\nThe answer is 8.") for s in row] for row in rows]

    monkeypatch.setattr(engine, "generate", with_a_second_line)
    await register(one_redis, KEYS, THEOREMS[:1])
    greedy = {"max_new_tokens": 24, "temperature": 0.0}
    order = WorkOrder("w-eq", 0, "grpo", "countdown", ["cd-a"], samples_per_theorem=1, sampling=greedy)
    await publish(one_redis, order)
    async with serving(one_redis, engine, prompt_format="equation"):
        (got,) = await until(lambda: _n(one_redis, 1))
    prompt = engine.tokenizer.decode(unpack_int32(got.prompt_ids).tolist())
    assert prompt.endswith("<|im_start|>assistant\n<answer> ") and "Write only the equation" in prompt
    (completion,) = said
    if "</answer>" in completion.lower():
        expected = "<answer>" + completion[: completion.lower().index("</answer>")].strip() + "</answer>"
    else:
        expected = completion.strip().split("\n")[0].strip()
    assert got.proof == expected and expected


async def test_stale_orders_are_skipped_and_counted_fresh_ones_use_the_announced_history(one_redis, engine):
    await register(one_redis, KEYS, THEOREMS[:1])
    steps = [PolicyUpdate(v, "es", es_step={**STEP, "seeds": [100 + v]}) for v in (1, 2, 3)]
    await publish(one_redis, *steps)
    stale = WorkOrder(
        "w-old", 1, "es", "countdown", ["cd-a"], member=Member(1), sigma=0.001, sampling=SHORT, max_staleness=1
    )
    fresh = WorkOrder(
        "w-new", 2, "es", "countdown", ["cd-a"], member=Member(2), sigma=0.001, sampling=SHORT, max_staleness=1
    )
    await publish(one_redis, stale, fresh)
    async with serving(one_redis, engine) as service:
        got = await until(lambda: _n(one_redis, 1))
        await until(lambda: settled(one_redis))
    assert [a.work_id for a in got] == ["w-new"]
    assert service.counts["stale_skipped"] == 1 and service.policy.latest == 3
    # the skip is an outcome the trainer reads: a dead letter naming the order, with why
    (letter,) = [decode(DeadLetter, f) for _, f in await one_redis.xrange(KEYS.dlq)]
    assert letter.reason.startswith("skipped: stale") and letter.original[b"work_id"] == b"w-old"
    # A generator that starts now, from the history alone, holds the same center bit for bit.
    late = ESWeights(lambda: load_master(engine.model_path), lambda named: None)
    for update in steps:
        late.add_step(update.policy_version, update.es_step)
    assert digest(late.center(2)) == engine.es_digest(2)
    assert ESStep.from_dict(steps[0].es_step) == engine.es.steps[1]


async def test_grpo_weights_load_only_with_their_digest(one_redis, engine, tmp_path):
    await register(one_redis, KEYS, THEOREMS[:1])
    folder = tmp_path / "v1"
    shutil.copytree(engine.model_path, folder)
    weights = load_master(folder)
    name = "model.layers.0.mlp.up_proj.weight"
    weights[name] = weights[name] + 0.01
    from weights.io import save_weights

    (file,) = folder.glob("*.safetensors")
    save_weights(weights, file)
    good = weights_digest(folder)
    await publish(
        one_redis,
        PolicyUpdate(1, "grpo", weights_path=str(folder), digest="sha256:" + "0" * 64),
        PolicyUpdate(2, "grpo", weights_path=str(folder), digest=good),
    )
    await publish(
        one_redis,
        WorkOrder("w-bad", 1, "grpo", "countdown", ["cd-a"], sampling=SHORT),
        WorkOrder("w-good", 2, "grpo", "countdown", ["cd-a"], sampling=SHORT),
    )
    try:
        async with serving(one_redis, engine) as service:
            got = await until(lambda: _n(one_redis, 1))
            await until(lambda: settled(one_redis))
        assert [a.work_id for a in got] == ["w-good"]
        (letter,) = [decode(DeadLetter, f) for _, f in await one_redis.xrange(KEYS.dlq)]
        assert "digest" in letter.reason and "refusing to load" in letter.reason and letter.deliveries == 1
        assert service.counts["policy_errors"] == 1
        assert torch.equal(engine.model.state_dict()[name], weights[name])  # version 2's bytes are in place
    finally:
        engine.load_weights(engine.model_path)  # the base again for the next test


async def test_unknown_theorem_and_bad_sampling_go_to_the_dead_letters_at_once(one_redis, engine):
    await register(one_redis, KEYS, THEOREMS[:1])
    await publish(
        one_redis,
        WorkOrder("w-x", 0, "es", "countdown", ["nope"], sampling=SHORT),
        WorkOrder("w-y", 0, "es", "countdown", ["cd-a"], sampling={"temprature": 0.5}),
    )
    async with serving(one_redis, engine):
        await until(lambda: settled(one_redis))
    letters = {
        decode(DeadLetter, f).original[b"work_id"]: decode(DeadLetter, f) for _, f in await one_redis.xrange(KEYS.dlq)
    }
    assert "unknown theorem ids ['nope']" in letters[b"w-x"].reason
    assert "temprature" in letters[b"w-y"].reason
    assert await one_redis.xlen(KEYS.attempts) == 0


async def test_backpressure_holds_the_generator_until_the_verifiers_catch_up(one_redis, engine):
    await register(one_redis, KEYS, THEOREMS[:1])
    await ensure_group(one_redis, KEYS.attempts, VERIFIERS)
    await one_redis.xadd(KEYS.attempts, {"v": "1", "x": "unread"})  # one attempt the verifiers still owe
    await publish(one_redis, WorkOrder("w-bp", 0, "es", "countdown", ["cd-a"], sampling=SHORT))
    async with serving(one_redis, engine, max_outstanding=1) as service:
        await until(lambda: _held(service))
        info = {g["name"].decode(): g for g in await one_redis.xinfo_groups(KEYS.work)}
        assert info[GENERATORS]["pending"] == 0 and info[GENERATORS]["lag"] == 1  # the order was not taken
        await one_redis.xreadgroup(VERIFIERS, "v1", {KEYS.attempts: ">"})
        await one_redis.xack(KEYS.attempts, VERIFIERS, *[e for e, _ in (await one_redis.xrange(KEYS.attempts))])
        await until(lambda: settled(one_redis))
    assert await one_redis.xlen(KEYS.attempts) == 2


async def _held(service) -> bool:
    return service.holding
