"""streams.samples: a reward joined with its attempt's text through the entry id it names (on real Redis,
6.2 and 7.x), the trace files' gzip members surviving a kill mid-append, and each attempt read once."""

from __future__ import annotations

import gzip

import orjson

from streams import samples
from streams.codec import encode
from streams.schema import Attempt, Member, Reward


def _attempt(i: int, text: str = "") -> Attempt:
    return Attempt(
        attempt_id=f"a{i}",
        work_id="es-v2-m1",
        theorem_id=f"t{i}",
        policy_version=2,
        sample_index=i,
        proof=f"<answer>{i} + 1</answer>",
        text=text,
        task="countdown",
        member=Member(7, -1),
        num_tokens=30 + i,
        gen_ms=12.5,
    )


def _reward(a: Attempt, entry: bytes | str, parts: dict[str, float] | None = None) -> Reward:
    return Reward(
        attempt_id=a.attempt_id,
        theorem_id=a.theorem_id,
        policy_version=a.policy_version,
        verdict="rejected",
        reward=0.1,
        reason="wrong_answer",
        member=a.member,
        work_id=a.work_id,
        sample_index=a.sample_index,
        verify_ms=0.4,
        sandbox_id="process-1",
        detail="value 3 != 24",
        attempt_entry=entry.decode() if isinstance(entry, bytes) else entry,
        parts=parts or {},
    )


async def test_rewards_are_joined_with_their_attempts_text_while_it_is_in_the_stream(redis, keys):
    thinking = "<think>try 3 + 1</think>\n<answer>0 + 1</answer>"
    attempts = [_attempt(0, text=thinking), _attempt(1), _attempt(2)]
    ids = [await redis.xadd(keys.attempts, encode(a)) for a in attempts]
    await redis.xdel(keys.attempts, ids[2])  # trimmed: history_s passed before the reward was read
    elsewhere = _reward(_attempt(3), ids[1])  # names an entry that holds another attempt
    parts = {"format": 1.0, "expression": 1.0, "numbers": 0.0, "closeness": 0.0, "solved": 0.0}
    rewards = [_reward(a, i, parts if a is attempts[0] else None) for a, i in zip(attempts, ids, strict=True)]
    rewards.append(elsewhere)
    for r in rewards:
        await redis.xadd(keys.rewards, encode(r))
    found = await samples.from_redis(redis, keys, newest=10)
    assert [s["attempt_id"] for s in found] == ["a0", "a1", "a2", "a3"]
    first, second = found[0], found[1]
    assert first["text"] == thinking and first["proof"] == "<answer>0 + 1</answer>"
    assert second["text"] == second["proof"] == "<answer>1 + 1</answer>"  # no separate text: the proof was all
    assert first | {"text": None} == {
        "attempt_id": "a0",
        "work_id": "es-v2-m1",
        "eval": False,
        "theorem_id": "t0",
        "policy_version": 2,
        "member": [7, -1],
        "sample_index": 0,
        "verdict": "rejected",
        "reason": "wrong_answer",
        "reward": 0.1,
        "detail": "value 3 != 24",
        "verify_ms": 0.4,
        "sandbox_id": "process-1",
        "cached": False,
        "judged_ms": first["judged_ms"],
        "parts": parts,  # Countdown's credit by part, as the verifier sent it
        "task": "countdown",
        "text": None,
        "proof": "<answer>0 + 1</answer>",
        "num_tokens": 30,
        "gen_ms": 12.5,
    }
    assert "parts" not in second  # a reward without parts (Lean's) has none
    assert found[2]["text_missing"] and "text" not in found[2]
    assert found[3]["text_missing"]  # never another attempt's text
    assert first["judged_ms"] > 1_700_000_000_000  # the reward entry's time, from its id


def test_a_sample_of_megabytes_keeps_a_bounded_part_and_says_how_long_it_was():
    huge = Attempt(
        attempt_id="a",
        work_id="w",
        theorem_id="t",
        policy_version=0,
        sample_index=0,
        proof="<answer>1</answer>",
        text="x" * (10 << 20),
    )
    s = samples.sample(_reward(huge, "1-0"), "1-0", huge)
    assert len(s["text"]) == samples.MAX_TEXT_CHARS and s["cut_chars"] == {"text": 10 << 20, "proof": 18}
    assert "cut_chars" not in samples.sample(_reward(huge, "1-0"), "1-0", _attempt(1))
    assert len(orjson.dumps(s)) < 2 * samples.MAX_TEXT_CHARS


def test_a_trace_file_keeps_every_finished_append_and_each_attempt_once(tmp_path):
    path = samples.file_for(tmp_path, 3)
    one = [{"attempt_id": "a1", "n": 1}, {"attempt_id": "a2", "n": 2}]
    written = samples.append(path, one)
    samples.append(path, [{"attempt_id": "a1", "n": 99}, {"attempt_id": "a3", "n": 3}])  # a1 again: re-read
    assert written > 0 and path.name == "v000003.jsonl.gz"
    assert [orjson.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()][2]["n"] == 99  # plain gzip
    assert [s["n"] for s in samples.read_dir(tmp_path)] == [1, 2, 3]  # the first of a1 kept
    whole = path.read_bytes()
    path.write_bytes(whole + gzip.compress(b'{"attempt_id": "a4"}\n')[:-9])  # killed mid-append
    assert [s["attempt_id"] for s in samples.read_file(path)] == ["a1", "a2", "a1", "a3"]
    path.write_bytes(whole + b"\x00garbage")
    assert len(list(samples.read_file(path))) == 4
    samples.append(samples.file_for(tmp_path, 1), [{"attempt_id": "b1"}])
    assert [s["attempt_id"] for s in samples.read_dir(tmp_path)] == ["b1", "a1", "a2", "a3"]  # version order
    assert [s["attempt_id"] for s in samples.read_dir(tmp_path, version=1)] == ["b1"]
    assert list(samples.read_dir(tmp_path, version=9)) == []
