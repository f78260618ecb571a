"""`python -m ops samples`: judged attempts shown with their text, proof, verdict and the checker's message,
from a run directory's traces (no Redis) or from the streams' history (a real Redis), filtered."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from streams import samples
from streams.codec import encode
from streams.keys import Keys
from streams.schema import Attempt, Member, Reward

ROOT = Path(__file__).resolve().parents[2]


def _ops(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ops", "samples", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _pair(i: int, version: int, verdict: str) -> tuple[Attempt, Reward]:
    work = f"eval-v{version}" if i == 5 else f"es-v{version}-m{i}"
    a = Attempt(
        attempt_id=f"{work}:0:0",
        work_id=work,
        theorem_id=f"cd-{i % 2}",
        policy_version=version,
        sample_index=0,
        proof=f"<answer>{i} * 4</answer>",
        text=f"<think>step one\nstep {i}</think>\n<answer>{i} * 4</answer>",
        task="countdown",
        member=Member(100 + i, 1),
        num_tokens=20,
    )
    r = Reward(
        attempt_id=a.attempt_id,
        theorem_id=a.theorem_id,
        policy_version=version,
        verdict=verdict,
        reward=1.0 if verdict == "proved" else 0.1,
        reason="" if verdict == "proved" else "wrong_answer",
        member=a.member,
        work_id=work,
        detail=f'"{i} * 4" = 24' if verdict == "proved" else f'value: "{i} * 4" = {4 * i}, not 24',
        sandbox_id="process-0",
        verify_ms=0.5,
        # Countdown's credit by part (tasks/countdown.py verdict_parts): an expression with the wrong value
        parts={"format": 1.0, "expression": 1.0, "numbers": 0.0, "closeness": 0.25, "solved": 0.0}
        if verdict == "rejected"
        else {},
    )
    return a, r


PAIRS = [_pair(i, version=i // 3, verdict="proved" if i == 4 else "rejected") for i in range(6)]


def test_samples_from_a_run_directory_are_filtered_and_shown_with_their_text(tmp_path):
    for a, r in PAIRS:
        samples.append(samples.file_for(tmp_path, r.policy_version), [samples.sample(r, "1712345678901-0", a)])
    shown = _ops("--run-dir", str(tmp_path), "--verdict", "rejected", "--kind", "train", "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert [s["attempt_id"] for s in doc["samples"]] == ["es-v0-m0:0:0", "es-v0-m1:0:0", "es-v0-m2:0:0", "es-v1-m3:0:0"]
    assert doc["matched"] == 4 and doc["source"].startswith("traces in")
    one = json.loads(_ops("--run-dir", str(tmp_path), "--version", "1", "--theorem", "cd-0", "--json").stdout)
    assert [s["attempt_id"] for s in one["samples"]] == ["es-v1-m4:0:0"]
    text = _ops("--run-dir", str(tmp_path), "-n", "1", "--version", "0").stdout  # the newest of version 0
    assert "es-v0-m2:0:0" in text and "es-v0-m1" not in text
    assert "     | <think>step one" in text and "     | step 2</think>" in text  # the model's text, line by line
    assert "rejected (wrong_answer), reward 0.1" in text and 'checker: value: "2 * 4" = 8, not 24' in text
    assert "judged:\n     | <answer>2 * 4</answer>" in text  # the proof it was judged by
    by_part = "   by part: format 1.000, expression 1.000, numbers 0.000, closeness 0.250, solved 0.000"
    assert by_part in text and doc["samples"][0]["parts"]["closeness"] == 0.25  # each sample's credit by part
    hostile = _pair(9, version=7, verdict="rejected")
    hostile = (
        dataclasses.replace(hostile[0], text="fine\n\x1b]52;c;cm0gLXJmIH4=\x07\rgone"),
        dataclasses.replace(hostile[1], detail="unsolved goals\nx : ℕ\n\x1b[2J⊢ " + "x" * 300),
    )
    samples.append(samples.file_for(tmp_path, 7), [samples.sample(hostile[1], "1-0", hostile[0])])
    shown = _ops("--run-dir", str(tmp_path), "--version", "7").stdout
    assert "\x1b" not in shown and "\r" not in shown and "\x07" not in shown  # a model's escapes stay text
    assert "     | fine\n" in shown and '"\\u001b]52;c;cm0gLXJmIH4=\\u0007\\rgone"' in shown
    # the checker's message: one quoted line, cut (ops/views/text.py one_line)
    [checker] = [line for line in shown.splitlines() if line.startswith("   checker: ")]
    assert checker.startswith('   checker: "unsolved goals\\nx : ℕ\\n\\u001b[2J⊢ xxx') and checker.endswith("x…")
    assert len(checker) == len("   checker: ") + 160
    missing = _ops("--run-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "has no traces" in missing.stderr


async def test_samples_from_the_streams_join_each_reward_with_its_attempt(one_redis, one_redis_url):
    keys = Keys("samples-test")
    for a, r in PAIRS:
        entry = await one_redis.xadd(keys.attempts, encode(a))
        await one_redis.xadd(keys.rewards, encode(dataclasses.replace(r, attempt_entry=entry.decode())))
    shown = _ops("--redis-url", one_redis_url, "--run", "samples-test", "--kind", "eval", "--json")
    assert shown.returncode == 0, shown.stderr
    (only,) = json.loads(shown.stdout)["samples"]
    assert only["attempt_id"] == "eval-v1:0:0" and only["eval"] and only["text"].startswith("<think>step one\nstep 5")


async def test_samples_show_their_problem_and_a_text_filter_finds_them(one_redis, one_redis_url):
    from streams.theorems import Theorem, register

    keys = Keys("samples-problems")
    await register(
        one_redis,
        keys,
        [
            Theorem("cd-0", "countdown", numbers=[2, 12], target=24),
            Theorem("cd-1", "countdown", numbers=[5, 7, 3], target=38),
        ],
    )
    for a, r in PAIRS:
        entry = await one_redis.xadd(keys.attempts, encode(a))
        await one_redis.xadd(keys.rewards, encode(dataclasses.replace(r, attempt_entry=entry.decode())))
    found = _ops("--redis-url", one_redis_url, "--run", "samples-problems", "--text", r"step [34]\b", "--json")
    assert found.returncode == 0, found.stderr
    doc = json.loads(found.stdout)
    assert [s["attempt_id"] for s in doc["samples"]] == ["es-v1-m3:0:0", "es-v1-m4:0:0"] and doc["matched"] == 2
    assert [s["problem"]["target"] for s in doc["samples"]] == [38, 24]  # cd-1 and cd-0
    by_detail = json.loads(
        _ops("--redis-url", one_redis_url, "--run", "samples-problems", "--text", "= 8, not", "--json").stdout
    )
    assert [s["attempt_id"] for s in by_detail["samples"]] == ["es-v0-m2:0:0"]  # the checker's "= 8, not 24"
    text = _ops("--redis-url", one_redis_url, "--run", "samples-problems", "--theorem", "cd-1", "-n", "1").stdout
    assert "   problem: reach 38 from 5, 7, 3, each number once" in text
    bad = _ops("--redis-url", one_redis_url, "--run", "samples-problems", "--text", "(")
    assert bad.returncode == 2 and "not a regular expression" in bad.stderr and bad.stderr.count("\n") == 1
