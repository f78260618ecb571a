"""`python -m evals.members`: do ES members differ, and by more than chance? The measurement behind a preset.

ES learns only from differences between the rewards of its members (perturbations `center + sigma * eps`).
If every member answers every problem the same way, the z-scores are zero and the update is nothing; if
they differ only by luck, the update is noise. For each `--sigma`, `--population` members (antithetic pairs
with `--antithetic`, as the trainer names them: `trainer.es.members_for`) of the base model answer the
same `--batch` Countdown training problems, greedily (the trainer's `es_temperature` default) or at
`--temperature`, through the real engine and the ES weights code (`weights.es`), scored with the
verifier's own shaped reward (`tasks.countdown.reward`; parsing only, nothing is run). Reported per
sigma:

- `distinct_share`: the share of problems on which the members did not all write the same text.
- `member_reward_std`: the standard deviation of the members' mean rewards (what the z-scores divide by).
- `split_half_spearman`: the rank correlation between the members' mean rewards on the batch's two halves.
  Near 0: a member's score is chance (at the batch size, the ES update is mostly noise); well above 0: the
  perturbation itself makes a member better or worse, which is what an ES step estimates.
- `step_cos_halves`: the cosine between the z-score vectors of the two halves (the update directions the
  two halves would take).

Last line of output: one JSON object (also written to `--out`). A benchmark, not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import orjson

from producers.engine import Sampling
from producers.engines import choose, make_engine
from streams.settings import DefaultsFormatter
from tasks.countdown import COUNTDOWN_FORMATS, countdown_messages, countdown_problems, extract_countdown, reward
from tasks.prompts import tokenize
from trainer.es import members_for, zscore
from weights.model import resolve_model


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None when either side has no spread."""
    ra, rb = _ranks(a), _ranks(b)
    if len(set(ra)) < 2 or len(set(rb)) < 2:
        return None
    return _pearson(ra, rb)


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _pearson(a: list[float], b: list[float]) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return cov / (va * vb) ** 0.5


def cosine(a: list[float], b: list[float]) -> float | None:
    na, nb = sum(x * x for x in a) ** 0.5, sum(y * y for y in b) ** 0.5
    if na == 0 or nb == 0:
        return None
    return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)


def measure(args: argparse.Namespace) -> dict:
    problems = countdown_problems(args.batch, args.seed)
    engine = make_engine(choose(args.engine), resolve_model(args.model), dtype="float32")
    tokenizer = engine.tokenizer
    prompts = [tokenize(tokenizer, countdown_messages(p.numbers, p.target, args.prompt_format)) for p in problems]
    sampling = Sampling(n=1, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    half = len(problems) // 2
    out: dict = {
        "bench": "es-members",
        "population": args.population,
        "batch": args.batch,
        "antithetic": args.antithetic,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "prompt_format": args.prompt_format,
        "engine": engine.name,
        "sigmas": {},
    }
    engine.es_use(0, None)
    started = time.monotonic()
    for sigma in args.sigma:
        texts, rewards = [], []
        for _index, seed, sign in members_for("members", 0, 0, args.population, args.antithetic):
            engine.es_use(0, seed, sign, sigma)
            answers = [s[0].text for s in engine.generate(prompts, sampling)]
            texts.append(answers)
            rewards.append(
                [
                    reward(p.numbers, p.target, extract_countdown(a, args.prompt_format))
                    for p, a in zip(problems, answers, strict=True)
                ]
            )
        engine.es_use(0, None)
        means = [statistics.fmean(r) for r in rewards]
        first = [statistics.fmean(r[:half]) for r in rewards]
        second = [statistics.fmean(r[half:]) for r in rewards]
        distinct = sum(len({t[i] for t in texts}) > 1 for i in range(len(problems))) / len(problems)
        out["sigmas"][str(sigma)] = {
            "distinct_share": round(distinct, 4),
            "member_mean_reward": [round(m, 4) for m in means],
            "member_reward_std": round(statistics.pstdev(means), 5),
            "split_half_spearman": _round(spearman(first, second)),
            "step_cos_halves": _round(cosine(zscore(first), zscore(second))),
        }
        print(f"members: sigma {sigma}: {out['sigmas'][str(sigma)]}", file=sys.stderr)
    out["wall_s"] = round(time.monotonic() - started, 1)
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m evals.members", description=__doc__.split("\n\n")[0], formatter_class=DefaultsFormatter
    )
    p.add_argument("--sigma", type=float, nargs="+", default=[0.001, 0.003, 0.01], help="the noise scales measured")
    p.add_argument("--population", type=int, default=8, help="ES members at each sigma")
    p.add_argument("--batch", type=int, default=32, help="Countdown training problems every member answers")
    p.add_argument("--antithetic", action="store_true", help="mirrored member pairs (+eps, -eps); default off")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy, the trainer's es_temperature default")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens a sample may generate at most")
    p.add_argument("--prompt-format", default="tinyzero", choices=COUNTDOWN_FORMATS, help="the Countdown prompt")
    p.add_argument("--engine", default="hf", help="hf | vllm | auto")
    p.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    p.add_argument("--seed", type=int, default=0, help="the problems and the members' seeds follow from it")
    p.add_argument("--out", default="", help="also write the JSON here (e.g. docs/results/es-members.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = measure(args)
    line = orjson.dumps(result).decode()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
