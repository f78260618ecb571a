"""A policy history rewritten by a failover (producers/policy.py): the trainer's entry for version v was on a
master that died before its replica had it, and the trainer, rebuilt from the promoted replica, made version v
again from other rewards. A generator that read the lost entry follows the new one: its center of version v is
the new history's, bit for bit the center replayed from the new entries alone (weights.es, computed here
without the follower).

The failover is played on a real Redis by what the promoted replica holds: the policy stream without the lost
entry, then the new one. Two cases: the new entry sorts after the lost one (the usual: entry ids are the
master's clock, and the failover took seconds), and before it (the new master's clock behind the old one's).
The real default model's engine (fp32) holds the history.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the generator needs torch (make test installs torch==2.13.0)")

from producers.policy import PolicyFollower  # noqa: E402
from streams.codec import encode  # noqa: E402
from streams.keys import Keys  # noqa: E402
from streams.schema import PolicyUpdate  # noqa: E402
from weights.es import ESWeights  # noqa: E402
from weights.io import digest, load_master  # noqa: E402

KEYS = Keys("rewritten")
STEP = {"seeds": [101], "signs": [1], "rewards": [1.0], "sigma": 0.001, "alpha": 0.0005}


def es(version: int, seed: int) -> PolicyUpdate:
    return PolicyUpdate(version, "es", es_step={**STEP, "seeds": [seed]})


def replayed(engine, *updates: PolicyUpdate) -> str:
    """The center of the last update's version, from these entries alone (no follower, no engine state)."""
    history = ESWeights(lambda: load_master(engine.model_path), lambda named: None)
    for u in updates:
        history.add_step(u.policy_version, u.es_step)
    return digest(history.center(updates[-1].policy_version))


@pytest.fixture
def engine(hf_engine):
    hf_engine.es_forget_after(0)  # this module's histories, from the base
    yield hf_engine
    hf_engine.es_forget_after(0)
    hf_engine.es_use(0, None)  # the base center again for the session's other tests


@pytest.mark.parametrize("new_sorts_first", [False, True], ids=["later-id", "earlier-id"])
async def test_a_version_made_again_after_a_failover_replaces_the_lost_one(one_redis, engine, new_sorts_first):
    v1, lost, again = es(1, 11), es(2, 22), es(2, 33)
    await one_redis.xadd(KEYS.policy, encode(v1), id="1000-0")
    await one_redis.xadd(KEYS.policy, encode(lost), id="3000-0")
    follower = PolicyFollower(one_redis, KEYS, engine)
    assert await follower.poll() == 2
    engine.es_use(2, None)  # sampling the lost center, as a generator would be
    assert engine.es_digest(2) == replayed(engine, v1, lost)

    # The promoted replica: the stream without the lost entry, then the trainer's version 2 made again.
    await one_redis.delete(KEYS.policy)
    await one_redis.xadd(KEYS.policy, encode(v1), id="1000-0")
    await one_redis.xadd(KEYS.policy, encode(again), id="2000-0" if new_sorts_first else "4000-0")
    assert await follower.poll() == 1
    assert follower.rewinds == 1 and follower.latest == 2
    engine.es_use(2, None)
    assert engine.es_digest(2) == replayed(engine, v1, again) != replayed(engine, v1, lost)
    assert await follower.poll() == 0 and follower.rewinds == 1  # nothing more to undo


async def test_a_stream_that_lost_its_tail_is_followed_from_where_it_ends(one_redis, engine):
    """The trainer has not made the lost versions again yet: the follower's newest version falls back."""
    updates = [es(v, 40 + v) for v in (1, 2, 3)]
    for v, u in enumerate(updates, 1):
        await one_redis.xadd(KEYS.policy, encode(u), id=f"{v}000-0")
    follower = PolicyFollower(one_redis, KEYS, engine)
    await follower.poll()
    await one_redis.delete(KEYS.policy)
    await one_redis.xadd(KEYS.policy, encode(updates[0]), id="1000-0")
    assert await follower.poll() == 0
    assert (follower.latest, follower.rewinds, follower.last_id) == (1, 1, b"1000-0")
    with pytest.raises(LookupError):  # version 2 is gone until announced again
        engine.es_digest(2)


async def test_grpo_weights_of_a_lost_version_are_not_taken_for_the_new_one(one_redis, engine):
    """A GRPO version made again names other weights: the engine holding the lost version's must load them."""
    lost = PolicyUpdate(1, "grpo", weights_path="/runs/r/policy/v1-lost", digest="sha256:" + "1" * 64)
    again = PolicyUpdate(1, "grpo", weights_path="/runs/r/policy/v1", digest="sha256:" + "2" * 64)
    await one_redis.xadd(KEYS.policy, encode(lost), id="3000-0")
    follower = PolicyFollower(one_redis, KEYS, engine)
    await follower.poll()
    follower.grpo_loaded = 1  # as after load_grpo(1) of the lost weights
    await one_redis.delete(KEYS.policy)
    await one_redis.xadd(KEYS.policy, encode(again), id="4000-0")
    await follower.poll()
    assert follower.grpo[1] == again and follower.grpo_loaded != 1 and follower.rewinds == 1
