"""The codec: entries as docs/WIRE.md writes them (pinned byte for byte), every message survives a trip
through a real Redis stream, and bad bytes give SchemaError, never garbage."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING

import pytest

from streams.codec import decode, encode, encode_flat, pack_float32, pack_int32, unpack_float32, unpack_int32
from streams.schema import Attempt, DeadLetter, Member, PolicyUpdate, Reward, SchemaError, WorkOrder

EXAMPLES = [
    WorkOrder(
        work_id="w-7",
        policy_version=3,
        algo="es",
        task="lean",
        theorem_ids=["mathd_1", "amc_2"],
        member=Member(seed=123456789, sign=-1),
        sampling={"temperature": 0.7, "max_new_tokens": 256},
        timeout_s=120.5,
        issued_ms=1_700_000_000_000,
    ),
    WorkOrder(work_id="w-8", policy_version=0, algo="grpo", task="countdown", theorem_ids=[], samples_per_theorem=8),
    Attempt(
        attempt_id="w-7/mathd_1/0",
        work_id="w-7",
        theorem_id="mathd_1",
        policy_version=3,
        sample_index=0,
        proof="theorem t : 1 + 1 = 2 := by\n  norm_num -- ünïcode ⊢ ∀",
        member=Member(5, 1),
        num_tokens=17,
        gen_ms=12.25,
        token_ids=pack_int32([1, 2, 2**31 - 1]),
        logprobs=pack_float32([-0.5, -1.25, 0.0]),
    ),
    Reward(
        attempt_id="a",
        theorem_id="t",
        policy_version=1,
        verdict="rejected",
        reward=0.0,
        reason="sorry",
        member=Member(9, -1),
        verify_ms=3.5,
        sandbox_id="docker-3",
        cached=True,
        detail="declaration uses `sorry`",
    ),
    Reward(attempt_id="b", theorem_id="t", policy_version=1, verdict="proved", reward=1.0),
    PolicyUpdate(policy_version=4, algo="es", es_step={"seeds": [1, 2], "rewards": [0.5, -0.5], "sigma": 0.001}),
    PolicyUpdate(policy_version=5, algo="grpo", weights_path="/ckpt/v5", digest="sha256:ab"),
    DeadLetter(
        source="{ps:r}:attempts",
        group="verifiers",
        original_id="1-0",
        deliveries=6,
        reason="poison: x",
        original={b"v": b"1", b"proof": b"\xff\xfe not utf-8"},
    ),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
async def test_round_trip_through_redis(redis, keys, msg):
    stream = keys.stream(msg.stream)
    await redis.xadd(stream, encode(msg))
    [(_, fields)] = await redis.xrange(stream)
    assert decode(type(msg), fields) == msg


def test_packed_arrays_keep_their_values():
    assert unpack_int32(pack_int32([0, -7, 2**31 - 1])).tolist() == [0, -7, 2**31 - 1]
    assert unpack_float32(pack_float32([-0.5, 3.25])).tolist() == [-0.5, 3.25]


def test_optional_none_is_left_out_and_comes_back_none():
    fields = encode(Reward(attempt_id="a", theorem_id="t", policy_version=0, verdict="timeout", reward=0.0))
    assert b"member" not in fields
    assert decode(Reward, fields).member is None


GOOD = encode(Reward(attempt_id="a", theorem_id="t", policy_version=0, verdict="proved", reward=1.0))


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda f: f.pop(b"v"), "missing schema version"),
        (lambda f: f.update({b"v": b"99"}), "unknown schema version"),
        (lambda f: f.pop(b"attempt_id"), "missing field 'attempt_id'"),
        (lambda f: f.update({b"attempt_id": b"\xff\xfe"}), "cannot decode"),
        (lambda f: f.update({b"policy_version": b"three"}), "policy_version"),
        (lambda f: f.update({b"verdict": b"maybe"}), "not one of"),
        (lambda f: f.update({b"cached": b"yes"}), "cached"),
        (lambda f: f.update({b"member": b"[1, 0]"}), "member"),
        (lambda f: f.update({b"member": b"{not json"}), "member"),
    ],
)
def test_bad_fields_raise_schema_error_with_reason(mutate, reason):
    fields = dict(GOOD)
    mutate(fields)
    with pytest.raises(SchemaError, match=reason):
        decode(Reward, fields)


# Entries written out by hand from docs/WIRE.md ("Entry schema"): `v` first, the required fields, the optional
# ones not at their default in class order, a dead letter's originals last; numbers as repr, booleans 0/1,
# lists, dicts and members as compact JSON, text as UTF-8, packed arrays little-endian.
PINNED = [
    (
        Reward(attempt_id="b", theorem_id="t", policy_version=1, verdict="proved", reward=1.0),
        [
            b"v",
            b"1",
            b"attempt_id",
            b"b",
            b"theorem_id",
            b"t",
            b"policy_version",
            b"1",
            b"verdict",
            b"proved",
            b"reward",
            b"1.0",
        ],
    ),
    (
        Reward(
            attempt_id="a",
            theorem_id="t",
            policy_version=1,
            verdict="rejected",
            reward=0.0,
            reason="sorry",
            member=Member(9, -1),
            verify_ms=3.5,
            sandbox_id="docker-3",
            cached=True,
            detail="uses `sorry`",
        ),
        [
            b"v",
            b"1",
            b"attempt_id",
            b"a",
            b"theorem_id",
            b"t",
            b"policy_version",
            b"1",
            b"verdict",
            b"rejected",
            b"reward",
            b"0.0",
            b"reason",
            b"sorry",
            b"member",
            b"[9,-1]",
            b"verify_ms",
            b"3.5",
            b"sandbox_id",
            b"docker-3",
            b"cached",
            b"1",
            b"detail",
            b"uses `sorry`",
        ],
    ),
    (
        Attempt(
            attempt_id="w-7/m/0",
            work_id="w-7",
            theorem_id="m",
            policy_version=3,
            sample_index=0,
            proof="by simp \u22a2",
            member=Member(5, 1),
            num_tokens=17,
            gen_ms=12.25,
            token_ids=pack_int32([1, -2]),
            logprobs=pack_float32([-0.5]),
        ),
        [
            b"v",
            b"1",
            b"attempt_id",
            b"w-7/m/0",
            b"work_id",
            b"w-7",
            b"theorem_id",
            b"m",
            b"policy_version",
            b"3",
            b"sample_index",
            b"0",
            b"proof",
            b"by simp \xe2\x8a\xa2",
            b"member",
            b"[5,1]",
            b"num_tokens",
            b"17",
            b"gen_ms",
            b"12.25",
            b"token_ids",
            b"\x01\x00\x00\x00\xfe\xff\xff\xff",
            b"logprobs",
            b"\x00\x00\x00\xbf",
        ],
    ),
    (
        WorkOrder(
            work_id="w-8",
            policy_version=0,
            algo="grpo",
            task="countdown",
            theorem_ids=["a", "b"],
            samples_per_theorem=8,
            sampling={"temperature": 0.7},
            max_staleness=0,
        ),
        [
            b"v",
            b"1",
            b"work_id",
            b"w-8",
            b"policy_version",
            b"0",
            b"algo",
            b"grpo",
            b"task",
            b"countdown",
            b"theorem_ids",
            b'["a","b"]',
            b"samples_per_theorem",
            b"8",
            b"sampling",
            b'{"temperature":0.7}',
            b"max_staleness",
            b"0",
        ],
    ),
    (
        PolicyUpdate(policy_version=4, algo="es", es_step={"seeds": [1, 2], "sigma": 0.001}),
        [b"v", b"1", b"policy_version", b"4", b"algo", b"es", b"es_step", b'{"seeds":[1,2],"sigma":0.001}'],
    ),
    (
        DeadLetter(
            source="s", group="g", original_id="2-0", deliveries=1, reason="r", original={b"v": b"1", b"proof": b"\xff"}
        ),
        [
            b"v",
            b"1",
            b"source",
            b"s",
            b"group",
            b"g",
            b"original_id",
            b"2-0",
            b"deliveries",
            b"1",
            b"reason",
            b"r",
            b"f:v",
            b"1",
            b"f:proof",
            b"\xff",
        ],
    ),
]


@pytest.mark.parametrize("msg, flat", PINNED, ids=[type(msg).__name__ for msg, _ in PINNED])
def test_entries_are_what_the_wire_document_says(msg, flat):
    assert encode_flat(msg) == flat
    assert list(encode(msg).items()) == list(zip(flat[::2], flat[1::2], strict=True))
    assert decode(type(msg), dict(zip(flat[::2], flat[1::2], strict=True))) == msg


MORE = [
    *EXAMPLES,
    WorkOrder(work_id="w", policy_version=1, algo="grpo", task="lean", theorem_ids=["x"], max_staleness=0),
    Attempt(
        attempt_id="a",
        work_id="w",
        theorem_id="t",
        policy_version=0,
        sample_index=1,
        proof="",
        prompt_ids=pack_int32([7, 8]),
    ),
    Reward(
        attempt_id="c",
        theorem_id="t",
        policy_version=2,
        verdict="timeout",
        reward=-0.0,
        work_id="w",
        sample_index=3,
        cached=False,
        detail="",
    ),
    DeadLetter(source="s", group="g", original_id="2-0", deliveries=1, reason="r"),
]


@pytest.mark.parametrize("msg", MORE, ids=lambda m: type(m).__name__)
def test_flat_and_mapped_encodings_agree_and_decode_back(msg):
    fields = encode(msg)
    assert encode_flat(msg) == [x for kv in fields.items() for x in kv]
    assert decode(type(msg), fields) == msg


def test_decoded_default_containers_are_fresh():
    fields = encode(WorkOrder(work_id="w", policy_version=0, algo="es", task="lean", theorem_ids=[]))
    a, b = decode(WorkOrder, fields), decode(WorkOrder, fields)
    assert a.sampling == {} and a.sampling is not b.sampling


def test_unknown_fields_are_ignored_and_bad_ones_explained():
    fields = {**GOOD, b"from_a_newer_writer": b"x"}
    assert decode(Reward, fields) == decode(Reward, GOOD)
    with pytest.raises(SchemaError, match=r"Reward.reward: cannot decode b'one'"):
        decode(Reward, {**GOOD, b"reward": b"one"})


@pytest.mark.parametrize("cls", [Member, WorkOrder, Attempt, Reward, PolicyUpdate, DeadLetter])
def test_fast_init_keeps_the_dataclass_signature_defaults_and_frozenness(cls):
    assert "__setattr__" not in cls.__init__.__code__.co_names  # fast_init's, not dataclass's
    example = next((m for m in MORE if type(m) is cls), Member(seed=3, sign=-1))
    fields = dataclasses.fields(cls)
    values = [getattr(example, f.name) for f in fields]
    assert cls(*values) == cls(**{f.name: v for f, v in zip(fields, values, strict=True)}) == example
    required = {f.name: getattr(example, f.name) for f in fields if f.default is f.default_factory is MISSING}
    bare = cls(**required)
    for f in fields:
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        assert getattr(bare, f.name) == required.get(f.name, default)
        if f.default is not MISSING:
            assert getattr(bare, f.name) is f.default  # the very object: encode leaves it out by identity
    if any(f.default_factory is not MISSING for f in fields):
        assert all(
            getattr(bare, f.name) is not getattr(cls(**required), f.name)
            for f in fields
            if f.default_factory is not MISSING
        )  # fresh containers each time
    assert dataclasses.replace(bare) == bare
    with pytest.raises(dataclasses.FrozenInstanceError):
        bare.__setattr__(fields[0].name, values[0])
    with pytest.raises(TypeError):
        cls(**{**required, "no_such_field": 1})
    with pytest.raises(TypeError):
        cls()
