"""What must not move when the trainer's code does: the checkpoint document (a run checkpointed by an older
trainer resumes), the ES policy entry's bytes (what generators replay and people audit), and which problems
an order names (a resumed run re-issues the same orders). Every expectation here is written out by hand."""

from __future__ import annotations

import orjson
import pytest

from streams.codec import decode
from streams.keys import Keys
from streams.schema import PolicyUpdate
from streams.theorems import Theorem
from trainer.config import TrainerSettings
from trainer.es import ESRun
from trainer.metrics import MetricsSink
from trainer.orders import Order

# An ES checkpoint as `{ps:R}:trainer` holds it: keys, their order, and the order record's own keys.
ES_STATE = {
    "algo": "es",
    "version": 2,
    "next_index": {"2": 3},
    "members": [
        {
            "work_id": "es-v2-m0",
            "center": 2,
            "seed": 11,
            "sign": 1,
            "theorem_ids": ["a", "b"],
            "samples": 1,
            "rewards": {"es-v2-m0:0:0": 0.5, "es-v2-m0:1:0": 1.0},
            "proved": 1,
            "issued_at": 100.0,
        },
        {
            "work_id": "es-v2-m1",
            "center": 2,
            "seed": 11,
            "sign": -1,
            "theorem_ids": ["a", "b"],
            "samples": 1,
            "rewards": {},
            "proved": 0,
            "issued_at": 100.5,
        },
    ],
    "evals": [
        {
            "work_id": "eval-v2-r1",
            "center": 2,
            "seed": 0,
            "sign": 1,
            "theorem_ids": ["h"],
            "samples": 1,
            "rewards": {},
            "proved": 0,
            "issued_at": 101.0,
        },
    ],
    "eval_results": {"0": {"version": 0, "held_out_reward": 0.25, "held_out_exact": 0.0, "problems": 1}},
    "eval_ids": ["h"],
    "counts": {"members_issued": 3, "cut_timeout": 1, "samples": 12},
    "finished": False,
    "config": {
        "population": 4,
        "sigma": 0.001,
        "alpha": 0.002,
        "antithetic": True,
        "max_staleness": 2,
        "noise": "full",
        "rank": 0,
        "members_per_order": 1,
    },
}


def _es_run(tmp_path, redis=None, **flags):
    settings = TrainerSettings(run="pins", population=4, **flags)
    return ESRun(settings, redis, [], [], MetricsSink(tmp_path / "run"))


def test_an_order_round_trips_through_its_checkpoint_keys():
    doc = ES_STATE["members"][0]
    order = Order.from_dict(doc)
    assert order.to_dict() == doc and list(order.to_dict()) == list(doc)
    assert (order.expected, order.complete, order.score) == (2, True, 0.75)  # 2 theorems x 1 sample; (0.5 + 1) / 2
    running = Order.from_dict(ES_STATE["members"][1])
    assert (running.complete, running.score) == (False, 0.0)


def test_an_evaluation_in_flight_keeps_its_problems_in_the_checkpoint_and_others_keep_their_keys():
    """An evaluation's figures by problem (theorem id -> [reward, proved]) ride in its checkpoint record while it
    is in flight, after the other keys, so a resumed run still pairs every problem; an order without any keeps
    the record above, key for key."""
    doc = {**ES_STATE["evals"][0], "rewards": {"eval-v2-r1:0:0": 1.0}, "proved": 1, "by_theorem": {"h": [1.0, 1]}}
    order = Order.from_dict(orjson.loads(orjson.dumps(doc)))
    assert order.to_dict() == doc and list(order.to_dict()) == list(doc)
    assert "by_theorem" not in Order.from_dict(ES_STATE["evals"][0]).to_dict()


def test_a_checkpoint_loads_and_is_written_back_byte_for_byte(tmp_path):
    run = _es_run(tmp_path)
    run._load(orjson.loads(orjson.dumps(ES_STATE)))
    assert run.state() == ES_STATE
    assert orjson.dumps(run.state()) == orjson.dumps(ES_STATE)  # the same keys in the same order
    assert run.version == 2 and run.next_index[2] == 3 and run.eval_results[0]["held_out_reward"] == 0.25


async def test_a_checkpoint_whose_config_holds_the_old_quorum_and_deadline_resumes(one_redis, tmp_path):
    """A trainer from before ESConfig lost `quorum` and `deadline_s` checkpointed them under `config`; `config`
    is written for people and never read back (the settings say how the run goes on), so the run resumes and
    its next checkpoint holds the config as it is now."""
    old = {**ES_STATE, "config": {**ES_STATE["config"], "quorum": 0.75, "deadline_s": 600.0}}
    await one_redis.hset(Keys("pins").trainer_state, "state", orjson.dumps(old))
    run = _es_run(tmp_path, one_redis)
    assert await run.resume()
    assert run.version == 2 and set(run.orders) == {"es-v2-m0", "es-v2-m1"}
    state = orjson.loads(await one_redis.hget(Keys("pins").trainer_state, "state"))
    assert state["config"] == ES_STATE["config"] and state["counts"]["resumes"] == 1


async def test_the_es_policy_entry_is_the_step_then_the_audit_fields(one_redis, tmp_path):
    """Scores 0, 1, 1, 0: mean 0.5, population std 0.5, so z = -1, 1, 1, -1 exactly."""
    run = _es_run(tmp_path, one_redis, sigma=0.01, alpha=0.1, antithetic=True)
    members = []
    for i, score in enumerate([0.0, 1.0, 1.0, 0.0]):
        m = Order(f"es-v0-m{i}", 0, 1000 + i // 2, 1 - 2 * (i % 2), ["t"], rewards={f"es-v0-m{i}:0:0": score})
        run.orders[m.work_id] = m
        members.append(m)
    await run.update(members)
    [(_, fields)] = await one_redis.xrange(Keys("pins").policy)
    [raw] = [v for v in fields.values() if v.startswith(b'{"seeds"')]
    assert raw == (
        b'{"seeds":[1000,1000,1001,1001],"signs":[1,-1,1,-1],"rewards":[-1.0,1.0,1.0,-1.0],"sigma":0.01,"alpha":0.1,'
        b'"raw_rewards":[0.0,1.0,1.0,0.0],"centers":[0,0,0,0],"members":["es-v0-m0","es-v0-m1","es-v0-m2","es-v0-m3"]}'
    )
    assert decode(PolicyUpdate, fields).policy_version == 1


def _theorems(n: int) -> list[Theorem]:
    return [Theorem(f"t{i}", "countdown", numbers=[1, 2], target=3) for i in range(n)]


async def test_es_members_of_a_center_share_one_batch_from_a_seeded_rotation(one_redis, tmp_path):
    """5 problems, batch 3, seed 1 (shift 7919 % 5 = 4): center 1 starts at (1 * 3 + 4) % 5 = 2."""
    settings = TrainerSettings(run="pins", population=2, batch=3, seed=1, antithetic=False, eval_every=0)
    run = ESRun(settings, one_redis, _theorems(5), [], MetricsSink(tmp_path / "run"))
    run.version = 1
    assert await run.top_up() == 2
    assert {w: m.theorem_ids for w, m in run.orders.items()} == {
        "es-v1-m0": ["t2", "t3", "t4"],
        "es-v1-m1": ["t2", "t3", "t4"],
    }


@pytest.mark.timeout(120)
async def test_grpo_groups_take_consecutive_problems_of_the_seeded_rotation(one_redis, tmp_path):
    """5 problems, batch 2, seed 1: group g of version 1 gets problem (1 * 2 + g + 4) % 5."""
    pytest.importorskip("torch")
    from tests.trainer.test_grpo import tiny_llama
    from trainer.grpo import GRPORun

    model = tmp_path / "tiny"
    tiny_llama().save_pretrained(model)
    settings = TrainerSettings(run="pins", algo="grpo", batch=2, group_size=2, seed=1, eval_every=0)
    run = GRPORun(settings, one_redis, _theorems(5), [], MetricsSink(tmp_path / "run"), model_path=model)
    run.version = 1
    assert await run.top_up() == 2
    assert {w: (m.theorem_ids, m.samples) for w, m in run.orders.items()} == {
        "grpo-v1-g0": (["t1"], 2),
        "grpo-v1-g1": (["t2"], 2),
    }
    assert list(run.state()) == [*list(ES_STATE)[:-1], "checkpoint", "config"]


def test_work_orders_keep_their_wire_fields(tmp_path, monkeypatch):
    """The entries an ES run's members (a bundle of two, one alone), its evaluation and a GRPO group put on
    `{ps:R}:work`, field by field and in order, as the trainer wrote them before its work orders had one
    constructor (trainer/orders.py `work_order`)."""
    import time

    from streams.codec import encode
    from trainer.orders import work_order

    monkeypatch.setattr(time, "time", lambda: 1000.0)
    settings = TrainerSettings(
        run="pins", population=4, es_noise="lowrank", es_rank=2, members_per_order=2, es_temperature=0.5
    )
    run = ESRun(settings, None, [], [], MetricsSink(tmp_path / "run"))
    members = [
        Order("es-v1-m0", 1, 11, 1, ["a"]),
        Order("es-v1-m1", 1, 11, -1, ["a"]),
        Order("es-v1-m2", 1, 12, 1, ["a", "b"]),
    ]
    entries = [list(encode(w).items()) for w in run.work_orders([*members, Order("eval-v1", 1, 0, 1, ["h"])])]
    head = [(b"v", b"1")]
    es, sampled = [(b"algo", b"es"), (b"task", b"countdown")], b'{"temperature":0.5,"max_new_tokens":96}'
    assert entries == [
        [
            *head,
            (b"work_id", b"eval-v1"),
            (b"policy_version", b"1"),
            *es,
            (b"theorem_ids", b'["h"]'),
            (b"sampling", b'{"temperature":0.0,"max_new_tokens":96}'),
            (b"issued_ms", b"1000000"),
        ],
        [
            *head,
            (b"work_id", b"es-v1-m0+1-7e240b"),
            (b"policy_version", b"1"),
            *es,
            (b"theorem_ids", b'["a"]'),
            (b"sigma", b"0.001"),
            (b"members", b'[{"work_id":"es-v1-m0","seed":11,"sign":1},{"work_id":"es-v1-m1","seed":11,"sign":-1}]'),
            (b"rank", b"2"),
            (b"sampling", sampled),
            (b"issued_ms", b"1000000"),
            (b"max_staleness", b"2"),
        ],
        [
            *head,
            (b"work_id", b"es-v1-m2"),
            (b"policy_version", b"1"),
            *es,
            (b"theorem_ids", b'["a","b"]'),
            (b"member", b"[12,1]"),
            (b"sigma", b"0.001"),
            (b"rank", b"2"),
            (b"sampling", sampled),
            (b"issued_ms", b"1000000"),
            (b"max_staleness", b"2"),
        ],
    ]
    grpo = TrainerSettings(run="pins", algo="grpo", temperature=0.7, max_staleness=1)
    group = work_order(Order("grpo-v3-g0", 3, 0, 1, ["t"], samples=4), "grpo", grpo, grpo.temperature)
    assert list(encode(group).items()) == [
        *head,
        (b"work_id", b"grpo-v3-g0"),
        (b"policy_version", b"3"),
        (b"algo", b"grpo"),
        (b"task", b"countdown"),
        (b"theorem_ids", b'["t"]'),
        (b"samples_per_theorem", b"4"),
        (b"sampling", b'{"temperature":0.7,"max_new_tokens":96}'),
        (b"issued_ms", b"1000000"),
        (b"max_staleness", b"1"),
    ]
