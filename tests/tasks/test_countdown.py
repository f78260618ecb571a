"""tasks.countdown: seeded solvable problems with curricula, and an answer's reward."""

from __future__ import annotations

import pytest

from tasks.countdown import countdown_problems, reward, verdict_parts
from tasks.countdown_check import check, credit_parts, partial_credit, scored

# --- Countdown problems --------------------------------------------------------------------------------------


@pytest.mark.parametrize("curriculum", [None, "easy", "ramp"])
def test_every_countdown_problem_is_solvable(curriculum):
    problems = countdown_problems(500, seed=11, curriculum=curriculum)
    assert [t.theorem_id for t in problems] == [f"cd-11-{i}" for i in range(500)]
    for t in problems:
        assert t.task == "countdown" and 1 <= t.target <= 100 and t.target not in t.numbers
        assert all(1 <= n <= 20 for n in t.numbers)
        solution = problems.meta[t.theorem_id]["solution"]
        assert check(t.numbers, t.target, solution).ok, (t, solution)
        assert partial_credit(f"<answer>{solution}</answer>", check(t.numbers, t.target, solution), t.target) == 1.0
    sizes = [len(t.numbers) for t in problems]
    if curriculum == "easy":
        assert set(sizes) == {2, 3}
        assert all("/" not in problems.meta[t.theorem_id]["solution"] for t in problems)
    elif curriculum == "ramp":
        assert sizes == sorted(sizes) and sizes[0] == 2 and sizes[-1] == 4
    else:
        assert set(sizes) == {2, 3, 4}


def test_countdown_problems_are_seeded():
    a = countdown_problems(50, seed=5)
    assert a == countdown_problems(50, seed=5) and a.meta == countdown_problems(50, seed=5).meta
    assert countdown_problems(20, seed=5) == a[:20]  # problem i depends on (seed, i) only
    b = countdown_problems(50, seed=6)
    assert [(t.numbers, t.target) for t in a] != [(t.numbers, t.target) for t in b]
    assert {t.theorem_id for t in a}.isdisjoint(t.theorem_id for t in b)


def test_countdown_parameters():
    big = countdown_problems(100, seed=0, numbers=(3, 3), max_number=50, max_target=500)
    assert {len(t.numbers) for t in big} == {3} and max(n for t in big for n in t.numbers) > 20
    assert max(t.target for t in big) > 100
    with pytest.raises(ValueError):
        countdown_problems(1, 0, numbers=(4, 2))
    with pytest.raises(ValueError):
        countdown_problems(1, 0, curriculum="hard")
    with pytest.raises(ValueError):
        countdown_problems(1, 0, numbers=(4, 5), curriculum="easy")


# --- an answer's reward: the checker's, in this process (evals.members) --------------------------------------


def test_reward_is_one_exactly_for_a_correct_answer_and_shaped_below():
    numbers, target = [3, 5, 7], 22
    correct = reward(numbers, target, "<think>3*5=15</think><answer>3 * 5 + 7</answer>")
    assert correct == 1.0
    assert reward(numbers, target, "3 * 5 + 7") == 1.0  # the checker's rule: no tags, whole text
    wrong_numbers = reward(numbers, target, "<answer>15 + 7</answer>")  # = 22, numbers not used
    near = reward(numbers, target, "<answer>3 * 7 + 5</answer>")  # 26
    far = reward(numbers, target, "<answer>3 + 5 + 7</answer>")  # 15
    untagged_near = reward(numbers, target, "3 * 7 + 5")
    assert 0 < wrong_numbers < far < near < correct
    assert near < 1.0 and max(near, far, wrong_numbers) <= 0.8  # exact success stays distinguishable
    assert untagged_near < near  # the answer format earns credit
    assert reward(numbers, target, "I don't know") == 0.0
    assert reward(numbers, target, "") == 0.0
    assert 0 < reward(numbers, target, "<answer>banana</answer>") <= 0.1  # a tag, nothing else
    assert reward(numbers, target, "<answer>__import__('os')</answer>") <= 0.1


def test_reward_is_monotone_in_closeness_with_the_right_numbers():
    numbers, target = [10, 4], 40
    values = {"10 * 4": 40, "10 + 4": 14, "10 - 4": 6, "10 / 4": 2.5, "4 - 10": -6}
    rewards = {expr: reward(numbers, target, f"<answer>{expr}</answer>") for expr in values}
    by_distance = sorted(values, key=lambda e: abs(values[e] - target))
    scores = [rewards[e] for e in by_distance]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0


# --- the reward schemes and the credit by part ---------------------------------------------------------------

NUMBERS, TARGET = [3, 4, 7], 19
# answer -> (its parts by hand: format, expression, numbers, closeness, solved; its shaped reward; its paper reward)
BY_HAND = {
    "<answer>3 * 4 + 7</answer>": ((1, 1, 1, 1, 1), 1.0, 1.0),
    "3 * 4 + 7": ((0, 1, 1, 1, 1), 1.0, 1.0),  # correct without tags: solved all the same, no format
    # 3 + 4 + 7 = 14, 5 from 19: closeness 1 - 5/19 = 14/19; shaped 0.1 + 0.1 + 0.3 + 0.3 * 14/19
    "<answer>3 + 4 + 7</answer>": ((1, 1, 1, 14 / 19, 0), 0.5 + 0.3 * 14 / 19, 0.1),
    "3 + 4 + 7": ((0, 1, 1, 14 / 19, 0), 0.4 + 0.3 * 14 / 19, 0.0),
    # 3 * 4 * 7 = 84, 65 from 19: closeness floored at 0
    "<answer>3 * 4 * 7</answer>": ((1, 1, 1, 0, 0), 0.5, 0.1),
    "<answer>12 + 7</answer>": ((1, 1, 0, 0, 0), 0.2, 0.1),  # 19, but not the given numbers
    "<answer>3 + 4 = 8</answer>": ((1, 1, 0, 0, 0), 0.2, 0.1),  # a false equation: parses, no more
    "<answer>banana</answer>": ((1, 0, 0, 0, 0), 0.1, 0.1),
    "I don't know": ((0, 0, 0, 0, 0), 0.0, 0.0),
}
PARTS = ("format", "expression", "numbers", "closeness", "solved")


@pytest.mark.parametrize("answer", list(BY_HAND))
def test_each_answers_parts_and_rewards_under_both_schemes_as_worked_by_hand(answer):
    parts, shaped, paper = BY_HAND[answer]
    result = check(NUMBERS, TARGET, answer)
    assert credit_parts(answer, result, TARGET) == pytest.approx(dict(zip(PARTS, parts, strict=True)))
    assert reward(NUMBERS, TARGET, answer) == pytest.approx(shaped, abs=1e-6)
    assert reward(NUMBERS, TARGET, answer, "paper") == pytest.approx(paper)


@pytest.mark.parametrize("answer", list(BY_HAND))
def test_the_parts_of_a_checkers_verdict_are_the_answers_own(answer):
    """What the verifier reads back from a verdict (its rule word and shaped score, the answer's tags) is the
    credit the checker computed, part by part: verified here against the parts worked by hand."""
    parts, shaped, _ = BY_HAND[answer]
    result = check(NUMBERS, TARGET, answer)
    verdict = "proved" if result.ok else "rejected"
    detail = result.detail if result.ok else f"{result.reason}: {result.detail}"
    score = None if result.ok else partial_credit(answer, result, TARGET)
    got = verdict_parts(answer, verdict, detail, score)
    assert got == pytest.approx(dict(zip(PARTS, parts, strict=True)), abs=1e-6)
    assert scored(got) == pytest.approx(shaped, abs=1e-6)


def test_verdicts_without_the_checkers_credit_have_no_part():
    nothing = dict.fromkeys(PARTS, 0.0)
    assert verdict_parts("<answer>1</answer>", "timeout", "no answer within 5 s", None) == nothing
    crashed = "lean_error: the checker crashed twice on this input: ..."  # verifier_pool.checkers._twice
    assert verdict_parts("<answer>1</answer>", "rejected", crashed, None) == nothing


def test_an_unknown_scheme_is_refused():
    with pytest.raises(ValueError, match="unknown Countdown reward"):
        scored(dict.fromkeys(PARTS, 0.0), "tinyzero")


def test_the_theorem_record_accepts_exactly_the_checkers_schemes():
    """streams.theorems (the layer below tasks, which cannot import it) names the schemes a Countdown theorem
    may ask for; they must be the checker's, or a run asks for a reward no checker scores (or is refused one
    it could have)."""
    from streams.theorems import REWARDS
    from tasks.countdown_check import SCHEMES

    assert set(REWARDS) - {""} == set(SCHEMES)
