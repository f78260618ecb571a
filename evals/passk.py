"""`python -m evals.passk --version V [--run RUN | --run-dir DIR | --config run.toml] [--redis-url URL]`

pass@k of one policy version on the run's held-out split: n samples per problem, every one verified in a
sandbox, the unbiased estimator of Chen et al. 2021 (https://arxiv.org/abs/2107.03374, eq. 1).

What it reads, and the choices made (each in the module named):

- **The run** (evals/runs.py). The trainer's own settings machinery (`--config`, `--run`, `--run-dir`,
  `--redis-url`, env `PROOFSTREAM_*`). A finished run's `report.json` holds the settings it trained with; they
  are the run's, and a flag that contradicts one of them where it defines the run (task, data, seed, split,
  model, prompt format) is refused rather than silently evaluating other problems or another model. Without
  a report (the run is live or was killed), the flags/config are used as given.
- **Its Redis** (evals/runs.py). `--redis-url` (or the report's URL): that Redis. Otherwise the run's
  embedded Redis: if a redis-server still serves `<run dir>/redis` (the run is going on) that one is read;
  else it is started again on that data directory, read, and stopped. Nothing is written to a run's Redis.
- **The held-out split** (evals/runs.py). Exactly the trainer's: `load_theorems(settings)`'s second part (what
  it evaluates every `eval_every` versions), checked record by record against the canonical records the run
  registered in `{ps:R}:theorems`, so settings that are not the run's fail instead of evaluating other
  problems. `--limit N` keeps the first N. The trainer's own evaluation is greedy with one sample; this one
  samples (`--temperature`, default 1.0) n times.
- **The weights of version V** (evals/rebuild.py). The policy entries `{ps:R}:policy` holds, applied as a
  generator applies them (producers/hf.py + producers/policy.py): ES replays the steps of versions 1..V from
  the base model in fp32 (`ESWeights`, the center, no member noise; nothing but the base and the history is
  trusted, unless `--es-snapshots` names a generator's snapshot folder to start from); GRPO loads the
  safetensors folder entry V names after checking its digest. V = 0 is the base.
- **Verification** (evals/attempts.py). The task's real checker, built from the run's settings as the
  verifier pool builds it (verifier_pool/pool.py), in its sandbox; untrusted text runs nowhere else. A sample
  passes when its verdict is `proved` (Countdown: the exact answer). The mean shaped reward is reported
  beside pass@k. No verdict cache is read or written: every sample is checked.

Writes `<run dir>/eval-v<V>.json` (per problem: verdicts, rewards, answers) and prints a table on stderr and
one JSON object as the last stdout line. Bad input exits with 2 and a message; an infrastructure failure
(a sandbox that cannot judge, Redis gone) with 1.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from redis.exceptions import RedisError

from evals.attempts import Timing, sample_and_verify, verifier_settings
from evals.rebuild import apply_policy, build_engine, check_grpo_folder, engine_device, weights_digest_of
from evals.runs import EvalError, find_run, ranges, read_run, run_redis, run_settings
from producers.engine import in_engine_thread
from producers.policy import PolicyMismatch
from streams import files, logs
from streams.connect import connect
from streams.settings import SettingsError, SettingsParser
from trainer.config import TrainerSettings
from trainer.local import lean_backend_problem
from verifier_pool.pool import backends, make_checkers
from verifier_pool.sandbox import SandboxError
from weights.model import MissingDependency, ModelNotFound

# The trainer settings an evaluation reads (which run, its problems, its model and prompts, its checkers):
# `--help` offers these and no other (the ones that shape training only are no use here).
EVAL_FLAGS = (
    "run",
    "run_dir",
    "redis_url",
    "log_level",
    "task",
    "seed",
    "dataset",
    "problems",
    "held_out",
    "curriculum",
    "model",
    "prompt_format",
    "max_new_tokens",
    "sandbox",
    "verifier_concurrency",
    "kimina_url",
    "lean_repl_cmd",
    "lean_workdir",
    "lean_image",
    "lean_audit_cmd",
    "lean_second_line",
)
TEMPERATURE = 1.0  # the eval's own sampling temperature (pass@k samples), not the run's
LOG_LEVEL = "warning"  # the eval's own: its table and JSON line are what it prints
# What each flag defaults to here, where it is not the trainer's default: most come from the run itself.
EVAL_DEFAULTS = {
    **dict.fromkeys(EVAL_FLAGS, "the run's"),
    "run": "the one run the Redis holds, else default",
    "run_dir": "runs/<run>",
    "log_level": LOG_LEVEL,
    "redis_url": "the run's embedded Redis (<run dir>/redis, restarted for the eval if stopped)",
}


# ------------------------------------------------------------------------------------------ the estimator


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n passes), c of the n passing:
    1 - C(n-c, k) / C(n, k) (Chen et al. 2021). Exact integer binomials; Python divides them correctly."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(passed: list[int], n: int, k: int) -> float:
    """pass@k of a split: the estimator averaged over its problems (`passed[i]` of n samples passed)."""
    return sum(pass_at_k(n, c, k) for c in passed) / len(passed)


# ----------------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    version: int | None  # None: the newest
    samples: int
    ks: tuple[int, ...]
    temperature: float
    limit: int | None
    sample_seed: int
    device: str
    snapshots: str | None  # ES: a generator's snapshot folder to start the replay from (opt-in)


def _parser() -> argparse.ArgumentParser:
    parser = SettingsParser(
        prog="python -m evals.passk",
        description=__doc__.split("\n\n")[1],
        epilog="\"the run's\": what the finished run's report.json holds (a flag that contradicts "
        "it where it defines the run is refused); while the run has not finished, the flags, "
        "config and PROOFSTREAM_* as given.",
    )
    TrainerSettings.add_arguments(parser, only=EVAL_FLAGS, defaults=EVAL_DEFAULTS)
    own = parser.add_argument_group("the evaluation")
    own.add_argument(
        "--version",
        dest="eval_version",
        required=True,
        metavar="V",
        help="policy version to evaluate, or 'latest' (required)",
    )
    own.add_argument(
        "--temperature",
        type=float,
        default=TEMPERATURE,
        metavar="X",
        help=f"the samples' temperature (the eval's own, not the run's); default {TEMPERATURE}",
    )
    own.add_argument(
        "--samples", dest="eval_samples", type=int, default=8, metavar="N", help="samples per problem (n); default 8"
    )
    own.add_argument(
        "--k",
        dest="eval_k",
        default=None,
        metavar="K,K,...",
        help="e.g. 1,4,8 (each <= n); default 1, 4, 8 up to n, and n",
    )
    own.add_argument(
        "--limit",
        dest="eval_limit",
        type=int,
        default=None,
        metavar="N",
        help="the first N held-out problems only; default all",
    )
    own.add_argument(
        "--sample-seed", dest="eval_seed", type=int, default=0, metavar="N", help="sampling seed; default 0"
    )
    own.add_argument(
        "--device",
        dest="eval_device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the policy generates; auto: where the run drew its ES noise, else cuda when "
        "available; default auto",
    )
    own.add_argument(
        "--es-snapshots",
        dest="eval_snapshots",
        default=None,
        metavar="DIR",
        help="ES: replay from the newest snapshot in this folder (a generator's snapshot_dir) "
        "instead of from the base; default: from the base, trusting nothing else",
    )
    return parser


def _options(args: argparse.Namespace) -> Options:
    n = args.eval_samples
    if n < 1:
        raise EvalError(f"--samples must be at least 1, not {n}")
    if args.eval_k is None:
        ks = sorted({k for k in (1, 4, 8) if k <= n} | {n})
    else:
        try:
            ks = sorted({int(k) for k in args.eval_k.split(",") if k.strip()})
        except ValueError as e:
            raise EvalError(f"--k must be a comma-separated list of integers such as 1,4,8, not {args.eval_k!r}") from e
        if not ks or ks[0] < 1 or ks[-1] > n:
            raise EvalError(f"--k {args.eval_k}: each k must be in 1..n, and n = --samples = {n}")
    version = None if args.eval_version == "latest" else _int(args.eval_version, "--version", low=0)
    temperature = args.temperature
    if temperature < 0 or (args.eval_limit is not None and args.eval_limit < 1):
        raise EvalError("--temperature must be a number >= 0 and --limit an integer >= 1")
    if args.eval_snapshots and not Path(args.eval_snapshots).is_dir():
        raise EvalError(f"--es-snapshots {args.eval_snapshots}: no such folder")
    return Options(
        version, n, tuple(ks), temperature, args.eval_limit, args.eval_seed, args.eval_device, args.eval_snapshots
    )


def _int(text: str, flag: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise EvalError(f"{flag} must be an integer >= {low} (or 'latest'), not {text!r}")
    return value


# --------------------------------------------------------------------------------------------- the eval


async def evaluate(settings: TrainerSettings, opts: Options, url: str, config: str | None) -> dict[str, Any]:
    timing = Timing()
    redis = connect(url)
    try:
        settings = await find_run(redis, settings)
        view = await read_run(redis, settings, opts.version, opts.limit)
        if view.algo == "grpo" and view.version > 0:
            check_grpo_folder(view)
        if settings.task == "lean" and (problem := lean_backend_problem(settings)):
            raise EvalError(problem)
        vsettings = verifier_settings(settings, config)
        started = time.monotonic()
        device = await engine_device(redis, settings, view, opts.device)
        engine = await in_engine_thread(build_engine, settings, opts.snapshots, device)
        timing.extra["load_s"] = time.monotonic() - started
        try:
            started = time.monotonic()
            applied = await apply_policy(engine, redis, settings, view)
            digest = await in_engine_thread(weights_digest_of, engine)
            timing.extra["weights_s"] = time.monotonic() - started
            kinds = backends(vsettings)
            checkers = [
                make_checkers(vsettings, i, kinds)[settings.task]
                for i in range(min(vsettings.workers, len(view.held_out) * opts.samples))
            ]
            try:
                await asyncio.gather(*(c.sandbox.start() for c in checkers))
                results = await sample_and_verify(
                    engine,
                    checkers,
                    view.held_out,
                    settings,
                    timing,
                    samples=opts.samples,
                    temperature=opts.temperature,
                    seed=opts.sample_seed,
                )
            finally:
                await asyncio.gather(*(c.sandbox.kill() for c in checkers), return_exceptions=True)
        finally:
            await in_engine_thread(engine.close)
        model = str(engine.model_path)
    finally:
        await redis.aclose()
    return {
        "settings": settings,
        "view": view,
        "results": results,
        "timing": timing,
        "applied": applied,
        "digest": digest,
        "model": model,
        "sandbox": kinds.get(settings.task, ""),
    }


def summarize(
    opts: Options, out: dict[str, Any], sources: dict[str, str], seconds: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the stdout line, the file's document)."""
    settings, view, results, timing = out["settings"], out["view"], out["results"], out["timing"]
    passed = [sum(s.verdict == "proved" for s in row) for row in results]
    rewards = [s.reward for row in results for s in row]
    line = {
        "version": view.version,
        "algo": view.algo,
        "task": settings.task,
        "problems": len(results),
        "samples": opts.samples,
        "pass_at_k": {str(k): round(mean_pass_at_k(passed, opts.samples, k), 6) for k in opts.ks},
        "reward_mean": round(sum(rewards) / len(rewards), 6),
        "seconds": round(seconds, 2),
    }
    verdicts: dict[str, int] = {}
    for row in results:
        for s in row:
            verdicts[s.verdict] = verdicts.get(s.verdict, 0) + 1
    doc = {
        **line,
        "run": settings.run,
        "exact": {"passed": sum(passed), "attempts": len(rewards)},
        "verdicts": verdicts,
        "sampling": {
            "temperature": opts.temperature,
            "max_new_tokens": settings.max_new_tokens,
            "seed": opts.sample_seed,
            "prompt_format": settings.prompt_format,
            "engine": "hf",
        },
        "weights": {
            "model": out["model"],
            "applied": out["applied"],
            "digest": out["digest"],
            "versions_in_run": ranges(view.versions),
        },
        "held_out": {
            "source": sources["settings"],
            "limit": opts.limit,
            "seed": settings.seed,
            "problems": settings.problems,
            "held_out": settings.held_out,
            "curriculum": settings.curriculum,
            "dataset": settings.dataset,
        },
        "redis": sources["redis"],
        "sandbox": out["sandbox"],
        "timing": {
            "generate_s": round(timing.generate_s, 2),
            "verify_busy_s": round(timing.verify_s, 2),
            "tokens": timing.tokens,
            **{k: round(v, 2) for k, v in timing.extra.items()},
        },
        "per_problem": [
            {"theorem_id": t.theorem_id, "passed": c, "samples": [asdict(s) for s in row]}
            for t, c, row in zip(view.held_out, passed, results, strict=True)
        ],
        "created": time.time(),
    }
    return line, doc


def table(line: dict[str, Any], doc: dict[str, Any]) -> str:
    t = doc["timing"]
    rows = [
        f"eval: run {doc['run']!r} ({line['algo']}, {line['task']}), version {line['version']}: "
        f"{doc['weights']['applied']}",
        f"eval: held-out split of {line['problems']} problems from {doc['held_out']['source']}",
        f"eval: read {doc['redis']}; checked in the {doc['sandbox']} sandbox",
        f"eval: {line['problems']} x {line['samples']} samples at T={doc['sampling']['temperature']:g}, at most "
        f"{doc['sampling']['max_new_tokens']} new tokens: {t['tokens']} tokens in {t['generate_s']} s, sandboxes busy "
        f"{t['verify_busy_s']} s, model load {t.get('load_s', 0)} s, weights {t.get('weights_s', 0)} s",
        "",
        f"  {'k':>4}  {'pass@k':>8}",
        *(f"  {k:>4}  {v:>8.4f}" for k, v in line["pass_at_k"].items()),
        "",
        f"  exact: {doc['exact']['passed']}/{doc['exact']['attempts']} samples proved; "
        f"verdicts: {', '.join(f'{v} {n}' for v, n in sorted(doc['verdicts'].items()))}",
        f"  mean shaped reward: {line['reward_mean']:.4f} (partial credit; pass@k counts only `proved`)",
        f"  {line['seconds']} s in all",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = _parser().parse_args(argv)
    try:
        opts = _options(args)
        given = {k: v for k, v in vars(args).items() if k in TrainerSettings.model_fields and k != "temperature"}
        cli = TrainerSettings.load(config_path=args.config, flags=given)
        logs.configure(cli.log_level if "log_level" in cli.model_fields_set else LOG_LEVEL)
        run_dir = cli.directory()
        settings, settings_source = run_settings(cli, run_dir)
        with run_redis(settings, run_dir) as (url, how):
            out = asyncio.run(evaluate(settings, opts, url, args.config))
    except (EvalError, SettingsError, PolicyMismatch, ModelNotFound, MissingDependency) as e:
        print(f"eval: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, SandboxError, RedisError, OSError) as e:  # infrastructure: a sandbox, Redis, the disk
        print(f"eval: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    line, doc = summarize(opts, out, {"settings": settings_source, "redis": how}, time.monotonic() - started)
    path = run_dir / f"eval-v{line['version']}.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    files.write_bytes(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    print(table(line, doc) + f"\n  written to {path}", file=sys.stderr)
    print(orjson.dumps(line).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
