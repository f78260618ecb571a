"""The probe behind docs/results/equation-prompt (session 20): how the default model answers Countdown under
prompt variants, greedy, and whether low-rank ES members of it answer differently.

`python docs/results/equation-prompt/probe.py [problems] [max_new_tokens] [variants] [sigmas]` from the
checkout's root; variants: tinyzero, equation (the two `prompt_format`s) and the rejected ones below.
Prints one JSON line. Scoring is the verifier's own (tasks.countdown.reward on the real extraction).
"""

import json
import statistics
import sys
import time

from producers.engine import Sampling
from producers.engines import choose, make_engine
from streams.theorems import Theorem
from tasks import prompts
from tasks.countdown import countdown_messages, countdown_problems, extract_countdown, reward
from trainer.es import members_for
from weights.model import resolve_model

SYSTEM = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the answer."
)
# name -> (how the chat ends: a prefill or None, the user's text: "tinyzero" | "equation" | "raw")
REJECTED = {
    "think-prefill": ("Let me solve this step by step.\n<think>", "tinyzero"),  # TinyZero's instruct template
    "tinyzero-answer-prefill": ("<answer>", "tinyzero"),  # copies "(1 + 2) / 3 = 1.5"
    "equation-no-space": ("<answer>", "equation"),  # "\n\nThe equation is: ..."
    "equation-no-prefill": (None, "equation"),  # "The equation is: 10 + 9 = 90", never tagged
}


def prompt_ids(tokenizer, variant: str, p) -> tuple[list[int], str]:
    """(token ids, the prefill to read back in front of a completion)."""
    t = Theorem(p.theorem_id, "countdown", numbers=p.numbers, target=p.target)
    if variant in ("tinyzero", "equation"):
        chat = prompts.messages(t, variant)
        return prompts.tokenize(tokenizer, chat), chat[-1]["content"] if chat[-1]["role"] == "assistant" else ""
    if variant == "raw-tinyzero":  # the paper's text as a base model reads it, no chat template
        user = countdown_messages(p.numbers, p.target, "tinyzero")[0]["content"]
        text = f"{SYSTEM}\nUser: {user}\nAssistant: Let me solve this step by step.\n<think>"
        return list(tokenizer(text, add_special_tokens=False).input_ids), "<think>"
    prefill, user = REJECTED[variant]
    chat = [countdown_messages(p.numbers, p.target, user)[0]]
    chat += [{"role": "assistant", "content": prefill}] if prefill else []
    return prompts.tokenize(tokenizer, chat), prefill or ""


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    variants = sys.argv[3].split(",") if len(sys.argv) > 3 else ["tinyzero", "equation", *REJECTED, "raw-tinyzero"]
    sigmas = [float(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else []
    engine = make_engine(choose("hf"), resolve_model(None), dtype="float32")
    problems = countdown_problems(n, 0)
    sampling = Sampling(n=1, temperature=0.0, max_new_tokens=tokens, seed=0)
    out = {}
    for v in variants:
        ids, prefill = zip(*(prompt_ids(engine.tokenizer, v, p) for p in problems), strict=True)
        started = time.monotonic()
        answers = [prefill[0] + row[0].text for row in engine.generate(list(ids), sampling)]
        wall = time.monotonic() - started
        rewards = [reward(p.numbers, p.target, extract_countdown(a)) for p, a in zip(problems, answers, strict=True)]
        res = {
            "mean": round(statistics.fmean(rewards), 4),
            "exact": rewards.count(1.0),
            "closed_tags": sum("</answer>" in a.lower() for a in answers),
            "copies_1_plus_2": sum(a.removeprefix(prefill[0]).lstrip().startswith("1 + 2") for a in answers),
            "distinct": len(set(answers)),
            "wall_s": round(wall, 1),
            "first": answers[:3],
        }
        for sigma in sigmas:  # 8 low-rank members (4 antithetic pairs), rank 4, in one engine call
            members = [(seed, sign) for _i, seed, sign in members_for("probe", 0, 0, 8, True)]
            got = engine.es_members(0, members, sigma, 4, list(ids), sampling)
            scores = [
                [
                    reward(p.numbers, p.target, extract_countdown(prefill[0] + row[0].text))
                    for p, row in zip(problems, m, strict=True)
                ]
                for m in got
            ]
            means = [statistics.fmean(r) for r in scores]
            res[f"sigma {sigma}"] = {
                "member_means": [round(x, 3) for x in means],
                "member_std": round(statistics.pstdev(means), 4),
                "distinct_share": round(sum(len({m[i][0].text for m in got}) > 1 for i in range(n)) / n, 3),
                "exact": sum(r.count(1.0) for r in scores),
                "answers": n * len(members),
            }
        out[v] = res
        print(v, json.dumps(res), file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
