"""Did a run learn: its held-out evaluations at the first and the last version, compared problem by problem, with
the evaluation's own noise. One verdict that the trainer's end line, `ops run`, `ops runs`, `ops compare` and the
dashboard all show, in the same words.

An evaluation is greedy, so the same policy gives the same answers: its noise is which problems were drawn for
the held-out split. Both evaluations answer the same problems, so the comparison is paired:

- **Reward.** d_i = reward at the last evaluation - reward at the first, for each problem i both evaluated;
  the change is mean(d), its standard error SE = sd(d) / sqrt(n) (sd with n - 1), and the noise 2 SE: a
  change counts ("learned", "got worse") only when |mean(d)| > 2 SE, the two-sided 95% level of a paired
  t-test for n around 30 (t(0.975, 31) = 2.04; with fewer problems 2 SE is looser than 95%). So one problem
  gained once never counts: with a single nonzero d_i, mean(d) = SE exactly.
- **Exact success.** The problems solved first -> last, and which moved: `gained` (unsolved, then solved) and
  `lost`. McNemar's exact test: under no change each moved problem is gained or lost with probability 1/2,
  so the two-sided p = 2 P(X <= min(gained, lost)) for X ~ Binomial(gained + lost, 1/2), capped at 1; beyond
  noise when p < 0.05. A binomial, not 2 SE, since a handful of 0/1 changes is far from normal: 4 gained
  and none lost is p = 0.125, within noise; 6 gained and none lost (p = 0.031) is the smallest that counts.

The per-problem figures come from the evaluations' records in metrics.jsonl (`problem_rewards`,
`problems_solved`: trainer/held_out.py); a run written before they were kept reads "no per-problem data:
noise unknown". What the answers became: the most common answers of an evaluation, from the run's traces.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from streams import samples

NOISE_SE = 2.0  # a reward change counts beyond this many standard errors of the paired mean difference
EXACT_P = 0.05  # an exact-success change counts below this two-sided p of McNemar's exact test
ANSWER_CHARS = 40  # an answer shown is cut to this many characters, JSON-quoted
UNKNOWN = "no per-problem data: noise unknown"
ONE_EVALUATION = "one evaluation: nothing to compare yet"


def paired_reward(first: dict[str, float], last: dict[str, float]) -> dict[str, Any] | None:
    """The mean change of the problems both evaluated and its noise (NOISE_SE standard errors); None with
    fewer than two such problems (no spread to measure)."""
    common = sorted(set(first) & set(last))
    n = len(common)
    if n < 2:
        return None
    d = [last[t] - first[t] for t in common]
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return {"problems": n, "change": mean, "se": sd / math.sqrt(n), "noise": NOISE_SE * sd / math.sqrt(n)}


def mcnemar_p(gained: int, lost: int) -> float:
    """Two-sided p of McNemar's exact test: 2 P(X <= min(gained, lost)), X ~ Binomial(gained + lost, 1/2)."""
    moved = gained + lost
    if moved == 0:
        return 1.0
    tail = sum(math.comb(moved, k) for k in range(min(gained, lost) + 1)) / 2**moved
    return min(1.0, 2 * tail)


def paired_exact(first: set[str], last: set[str], problems: Iterable[str]) -> dict[str, Any]:
    """Problems solved at the first and last evaluation (of `problems`, those both evaluated), gained and lost."""
    common = set(problems)
    was, now = first & common, last & common
    gained, lost = len(now - was), len(was - now)
    return {
        "problems": len(common),
        "solved_first": len(was),
        "solved_last": len(now),
        "gained": gained,
        "lost": lost,
        "p": mcnemar_p(gained, lost),
    }


def has_problems(record: dict[str, Any]) -> bool:
    return isinstance(record.get("problem_rewards"), dict) and isinstance(record.get("problems_solved"), list)


def verdict(evals: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """The verdict of a run's evaluations (version -> eval record) at the first and the last version: `words`
    always; with per-problem data also `learned` ("learned", "got worse", "no change"), `reward` and `exact`."""
    versions = sorted(evals, key=int)
    if len(versions) < 2:
        return {"learned": None, "words": ONE_EVALUATION}
    first, last = evals[versions[0]], evals[versions[-1]]
    if not (has_problems(first) and has_problems(last)):
        return {"learned": None, "words": UNKNOWN}
    a, b = first["problem_rewards"], last["problem_rewards"]
    reward = paired_reward(a, b)
    if reward is None:
        return {"learned": None, "words": UNKNOWN}
    exact = paired_exact(set(first["problems_solved"]), set(last["problems_solved"]), set(a) & set(b))
    up, down = reward["change"] > reward["noise"], reward["change"] < -reward["noise"]
    exact_moved = exact["p"] < EXACT_P
    if up or (exact_moved and exact["gained"] > exact["lost"] and not down):
        learned = "learned"
    elif down or (exact_moved and exact["lost"] > exact["gained"]):
        learned = "got worse"
    else:
        learned = "no change"
    return {
        "learned": learned,
        "first_version": int(versions[0]),
        "last_version": int(versions[-1]),
        "reward": reward,
        "exact": exact,
        "words": words(learned, reward, exact),
    }


def words(learned: str, reward: dict[str, Any], exact: dict[str, Any]) -> str:
    """`learned: held-out reward +0.389 (noise ±0.050), 6 -> 8 of 32 solved (2 gained, 0 lost: within noise)`."""
    lead = "no change beyond noise" if learned == "no change" else learned
    moved = "beyond noise" if exact["p"] < EXACT_P else "within noise"
    change = f"held-out reward {reward['change']:+.3f} (noise ±{reward['noise']:.3f})"
    if reward["change"] == 0 and reward["noise"] == 0:  # no spread to measure: nothing moved at all
        lead, change = "no change", "every problem scored the same at both evaluations"
    return (
        f"{lead}: {change}, "
        f"{exact['solved_first']} -> {exact['solved_last']} of {exact['problems']} solved "
        f"({exact['gained']} gained, {exact['lost']} lost: {moved})"
    )


def quoted(answer: str) -> str:
    """An answer as shown: JSON-quoted on one line, cut at ANSWER_CHARS."""
    cut = answer if len(answer) <= ANSWER_CHARS else answer[: ANSWER_CHARS - 1] + "…"
    return orjson.dumps(cut).decode()


def answer_of(sample: dict[str, Any]) -> str:
    """What a sample answered, as answers are counted: the first non-empty line of the proof it was judged by
    (`1 + 2 = 3` of "1 + 2 = 3\n\nThe answer is 3.": the same answer, whatever prose follows)."""
    return next((line.strip() for line in sample.get("proof", "").splitlines() if line.strip()), "")


def common_answers(found: Iterable[dict[str, Any]], top: int = 2) -> dict[str, Any] | None:
    """The most common answers (`answer_of`) of one evaluation's samples, each problem once (its last sample: a
    retried evaluation answers again); None without a sample that kept its text."""
    by_problem = {s["theorem_id"]: answer_of(s) for s in found if not s.get("text_missing")}
    if not by_problem:
        return None
    counts = Counter(by_problem.values())
    return {"answers": len(by_problem), "distinct": len(counts), "top": counts.most_common(top)}


def answers_words(version: int, found: dict[str, Any] | None) -> str:
    """`v0: 28 of 32 answers are "1 + 2 = 3", 2 are "3 + 4"; 4 distinct`."""
    if found is None:
        return f"v{version}: no answers kept"
    (answer, n), *rest = found["top"]
    are = lambda k: "is" if k == 1 else "are"  # noqa: E731
    shown = [f"{n} of {found['answers']} answers {are(n)} {quoted(answer)}"]
    shown += [f"{k} {are(k)} {quoted(a)}" for a, k in rest]
    return f"v{version}: {', '.join(shown)}; {found['distinct']} distinct"


def evaluation_samples(found: Iterable[dict[str, Any]], version: int) -> list[dict[str, Any]]:
    """The samples of the evaluation of `version` (every try of it) among a run's traces."""
    return [s for s in found if s.get("eval") and s.get("policy_version") == version]


def with_problems(evals: dict[Any, dict[str, Any]], records: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """`evals` (version -> result, as a checkpoint or report.json keeps them: the means) by int version, each with
    the per-problem figures of its record in metrics.jsonl `records` where that has them."""
    out = {int(v): dict(e) for v, e in evals.items()}
    for r in records:
        if r.get("eval") and has_problems(r) and int(r["version"]) in out:
            out[int(r["version"])] |= {k: r[k] for k in ("problem_rewards", "problems_solved")}
    return out


def ends(evals: dict[int, Any]) -> list[int]:
    """The versions of the first and last evaluation (one where they are the same): the two the verdict and
    the answers compare."""
    return sorted({min(evals), max(evals)}) if evals else []


def answers(run_dir: Path, versions: Iterable[int]) -> list[str]:
    """What the answers were at each of `versions`' evaluations, from the run's traces (`answers_words`); []
    where the traces hold none of them."""
    if not (run_dir / samples.FOLDER).is_dir():
        return []
    found = {v: common_answers(evaluation_samples(samples.read_dir(run_dir, v), v)) for v in versions}
    return [answers_words(v, f) for v, f in found.items()] if any(found.values()) else []


def short(v: dict[str, Any] | None) -> str:
    """The verdict in a table cell: `learned +0.389 ±0.050`, `no change +0.013 ±0.041`, `unknown`, `-`."""
    if not v or v.get("learned") is None:
        return "unknown" if v and v.get("words") == UNKNOWN else "-"
    return f"{v['learned']} {v['reward']['change']:+.3f} ±{v['reward']['noise']:.3f}"
