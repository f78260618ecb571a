"""The verdict on whether a run learned (streams/learned.py): a paired comparison of the first and last held-out
evaluation, problem by problem, with the noise. Every expected figure is worked out by hand in the comments."""

from __future__ import annotations

import pytest

from streams import learned, samples


def _eval(version: int, rewards: dict[str, float], solved: list[str]) -> dict:
    """An evaluation's record as metrics.jsonl holds it (trainer/held_out.py `record`)."""
    return {
        "eval": True,
        "version": version,
        "held_out_reward": sum(rewards.values()) / len(rewards),
        "held_out_exact": len(solved) / len(rewards),
        "problems": len(rewards),
        "problem_rewards": rewards,
        "problems_solved": solved,
    }


def test_a_small_paired_change_and_its_standard_error_by_hand():
    """d = 0.4, 0.2, 0, 0.4: mean 0.25; deviations 0.15, -0.05, -0.25, 0.15, squares summing to 0.11;
    sd = sqrt(0.11 / 3) = 0.191485, SE = sd / sqrt(4) = 0.095743, noise 2 SE = 0.191485 < 0.25: learned."""
    first = _eval(0, {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.1}, [])
    last = _eval(8, {"a": 0.5, "b": 0.3, "c": 0.1, "d": 0.5}, [])
    v = learned.verdict({0: first, 8: last})
    assert v["reward"]["change"] == pytest.approx(0.25)
    assert v["reward"]["se"] == pytest.approx(0.0957427, abs=1e-6)
    assert v["reward"]["noise"] == pytest.approx(0.1914854, abs=1e-6)
    assert v["learned"] == "learned"
    assert v["words"] == (
        "learned: held-out reward +0.250 (noise ±0.191), 0 -> 0 of 4 solved (0 gained, 0 lost: within noise)"
    )
    back = learned.verdict({"0": last | {"version": 0}, "8": first | {"version": 8}})  # the same, the other way
    assert back["learned"] == "got worse" and back["words"].startswith(
        "got worse: held-out reward -0.250 (noise ±0.191)"
    )


def test_one_problem_gained_once_is_no_change_beyond_noise():
    """32 problems at 0.1, one of them solved at the end (+0.9): mean 0.9 / 32 = 0.028125; with one nonzero
    difference x, sd = x / sqrt(n) and SE = x / n = the mean itself, so the noise is 2 x 0.028125 = 0.05625.
    McNemar: 1 gained, 0 lost, p = 2 x 1/2 = 1."""
    ids = [f"p{i}" for i in range(32)]
    first = _eval(0, dict.fromkeys(ids, 0.1), [])
    last = _eval(8, {**dict.fromkeys(ids, 0.1), "p7": 1.0}, ["p7"])
    v = learned.verdict({0: first, 4: _eval(4, dict.fromkeys(ids, 0.9), ids), 8: last})  # the middle is not used
    assert v["reward"]["change"] == pytest.approx(0.028125)
    assert v["reward"]["noise"] == pytest.approx(0.05625)
    assert v["exact"] == {"problems": 32, "solved_first": 0, "solved_last": 1, "gained": 1, "lost": 0, "p": 1.0}
    assert v["learned"] == "no change"
    assert v["words"] == (
        "no change beyond noise: held-out reward +0.028 (noise ±0.056), 0 -> 1 of 32 solved (1 gained, 0 lost: "
        "within noise)"
    )
    assert learned.short(v) == "no change +0.028 ±0.056"


def test_a_clear_gain_is_learned():
    """32 problems: 6 solved at both ends (d = 0), 24 from 0.1 to 0.5 (d = 0.4), 2 from 0.1 to solved (d = 0.9).
    mean = (24 x 0.4 + 2 x 0.9) / 32 = 11.4 / 32 = 0.35625; sum d^2 = 24 x 0.16 + 2 x 0.81 = 5.46, less
    32 x 0.35625^2 = 4.06125: 1.39875; sd = sqrt(1.39875 / 31) = 0.212417, SE = 0.037551, noise 0.075101.
    Exact 6 -> 8, 2 gained and none lost: p = 2 / 4 = 0.5, within noise."""
    solved = [f"s{i}" for i in range(6)]
    rising = [f"r{i}" for i in range(24)]
    first = _eval(0, {**dict.fromkeys(solved, 1.0), **dict.fromkeys([*rising, "g0", "g1"], 0.1)}, solved)
    last = _eval(8, {**dict.fromkeys([*solved, "g0", "g1"], 1.0), **dict.fromkeys(rising, 0.5)}, [*solved, "g0", "g1"])
    v = learned.verdict({0: first, 8: last})
    assert v["reward"]["change"] == pytest.approx(0.35625)
    assert v["reward"]["noise"] == pytest.approx(0.075101, abs=1e-6)
    assert v["words"] == (
        "learned: held-out reward +0.356 (noise ±0.075), 6 -> 8 of 32 solved (2 gained, 0 lost: within noise)"
    )
    assert learned.short(v) == "learned +0.356 ±0.075"


def test_a_run_whose_every_problem_scored_the_same_says_so():
    same = _eval(0, {"a": 0.1, "b": 0.5}, [])
    v = learned.verdict({0: same, 2: same | {"version": 2}})
    assert v["learned"] == "no change" and v["reward"]["noise"] == 0.0
    assert v["words"] == (
        "no change: every problem scored the same at both evaluations, 0 -> 0 of 2 solved (0 gained, 0 lost: "
        "within noise)"
    )


def test_mcnemars_exact_p_by_hand():
    """2 P(X <= min) for X ~ Binomial(moved, 1/2): 6 gained none lost 2/64; 4 and 0: 2/16; 5 and 1: 2 x 7/64."""
    assert learned.mcnemar_p(6, 0) == pytest.approx(0.03125)
    assert learned.mcnemar_p(0, 6) == pytest.approx(0.03125)
    assert learned.mcnemar_p(4, 0) == pytest.approx(0.125)
    assert learned.mcnemar_p(5, 1) == pytest.approx(14 / 64)
    assert learned.mcnemar_p(0, 0) == 1.0 and learned.mcnemar_p(3, 3) == 1.0  # capped at 1


def test_six_problems_gained_with_equal_rewards_count_in_exact_success():
    """A Lean-like run (reward 1 exactly when proved) of 32: 6 gained, 0 lost. Reward: d = 1 on 6, mean 0.1875,
    sum d^2 = 6, less 32 x 0.1875^2 = 1.125: 4.875; sd = sqrt(4.875 / 31) = 0.396558, noise = 2 sd / sqrt(32) =
    0.140204 < 0.1875: learned; exact p = 2 / 64 = 0.031 < 0.05: beyond noise."""
    ids = [f"p{i}" for i in range(32)]
    gained = ids[:6]
    v = learned.verdict(
        {
            0: _eval(0, dict.fromkeys(ids, 0.0), []),
            5: _eval(5, {**dict.fromkeys(ids, 0.0), **dict.fromkeys(gained, 1.0)}, gained),
        }
    )
    assert v["reward"]["noise"] == pytest.approx(0.140204, abs=1e-6)
    assert v["words"] == (
        "learned: held-out reward +0.188 (noise ±0.140), 0 -> 6 of 32 solved (6 gained, 0 lost: beyond noise)"
    )


def test_only_the_problems_both_evaluations_answered_are_paired():
    """a and b in both (d = 0.2 and 0.4: mean 0.3, sd = sqrt(0.02) = 0.141421, noise 2 x 0.141421 / sqrt(2) = 0.2);
    c only at the first, d only at the last: left out."""
    first = _eval(0, {"a": 0.1, "b": 0.1, "c": 1.0}, ["c"])
    last = _eval(3, {"a": 0.3, "b": 0.5, "d": 1.0}, ["d"])
    v = learned.verdict({0: first, 3: last})
    assert v["reward"]["problems"] == 2 and v["reward"]["noise"] == pytest.approx(0.2)
    assert (v["exact"]["problems"], v["exact"]["solved_first"], v["exact"]["solved_last"]) == (2, 0, 0)


def test_runs_without_per_problem_figures_or_a_second_evaluation_say_so():
    old = {0: {"held_out_reward": 0.1, "held_out_exact": 0.0, "problems": 32}, 8: {"held_out_reward": 0.2}}
    assert learned.verdict(old) == {"learned": None, "words": "no per-problem data: noise unknown"}
    assert learned.short(learned.verdict(old)) == "unknown"
    assert learned.verdict({0: _eval(0, {"a": 0.1, "b": 0.1}, [])})["words"] == "one evaluation: nothing to compare yet"
    assert learned.verdict({})["learned"] is None
    one = learned.verdict({0: _eval(0, {"a": 0.1}, []), 1: _eval(1, {"a": 1.0}, ["a"])})  # one problem: no spread
    assert one["words"] == "no per-problem data: noise unknown"


def test_the_checkpoints_means_take_their_per_problem_figures_from_the_records():
    means = {"0": {"version": 0, "held_out_reward": 0.1}, "4": {"version": 4, "held_out_reward": 0.2}}
    records = [{"version": 1, "reward_mean": 0.3}, _eval(4, {"a": 0.2}, []), {"eval": True, "version": 0}]
    merged = learned.with_problems(means, records)
    assert set(merged) == {0, 4} and "problem_rewards" not in merged[0]
    assert merged[4]["problem_rewards"] == {"a": 0.2} and merged[4]["held_out_reward"] == 0.2


def _sample(version: int, theorem: str, proof: str, kind_eval: bool = True, **more) -> dict:
    return {
        "attempt_id": f"{'eval' if kind_eval else 'es'}-v{version}:{theorem}:{proof}",
        "eval": kind_eval,
        "policy_version": version,
        "theorem_id": theorem,
        "proof": proof,
        **more,
    }


def test_the_most_common_answers_of_an_evaluation_from_the_traces(tmp_path):
    """v0: 3 problems answered "1 + 2 = 3" (one with prose after it: an answer is its first line), 1 "3 + 4" (a
    training sample and a v1 sample left out); a retried evaluation's problem counts once, its last answer. v2:
    a long answer shown quoted and cut, a control character escaped."""
    long_answer = "(25 - 5) * 4\t" + "x" * 60
    samples.append(
        samples.file_for(tmp_path, 0),
        [
            _sample(0, "a", "1 + 2 = 3"),
            _sample(0, "b", "\n1 + 2 = 3\n\nThe answer is 3."),
            _sample(0, "c", "2 + 2"),
            _sample(0, "c", "1 + 2 = 3 ", attempt_id="eval-v0-r1:c"),  # the retry answers c again
            _sample(0, "d", "3 + 4"),
            _sample(0, "a", "9 * 9", kind_eval=False),
            _sample(0, "e", "", text_missing=True),
        ],
    )
    samples.append(samples.file_for(tmp_path, 2), [_sample(2, "a", long_answer), _sample(2, "b", long_answer)])
    assert learned.answers(tmp_path, [0, 2, 5]) == [
        'v0: 3 of 4 answers are "1 + 2 = 3", 1 is "3 + 4"; 2 distinct',
        'v2: 2 of 2 answers are "(25 - 5) * 4\\txxxxxxxxxxxxxxxxxxxxxxxxxx…"; 1 distinct',
        "v5: no answers kept",
    ]
    assert learned.answers(tmp_path / "elsewhere", [0]) == []  # no traces: nothing to say
    assert learned.answers(tmp_path, [5, 7]) == []  # traces without those evaluations: nothing either
