"""`python -m evals.compare --task countdown --budget N [--seeds 0 1 2] [flags] [extra trainer flags]`

ES and GRPO from the same base model at the same number of training samples: N attempts generated for
training each (evaluation attempts not counted), held-out reward (shaped partial credit) and held-out exact
success against samples, for each seed in `OUT/seed<K>/` (a table `compare.md`, `compare.json` and a plot
`compare.png`), and over the seeds in `OUT/` itself: mean and spread of the held-out reward and exact success
at the end, the gain from version 0, proofs verified per version (the case study's measure: training
attempts judged `proved` per update), wall time and training samples per second, per algorithm; a plot of
the mean curves with their min-max band. Resumable: a seed whose two runs finished is not run again. It says
how many versions it will run, an estimate once the first is done and an ETA after each (evals/eta.py).

The two runs go one after the other as `python -m trainer` subprocesses, each with its own local pipeline
(private Redis, generator, verifier), the same seed and so the same problems and held-out split, the same
sampling temperature and max_new_tokens, and the same generator precision. The budget becomes iterations per
algorithm: a version costs population x batch samples in ES (every member answers the version's batch once)
and batch x group_size in GRPO (G samples of each of `batch` theorems), so iterations = N // that. Each run
evaluates its policy (greedy, on the held-out split) at version 0, every `iterations // eval_points`
versions and at the end, so each curve has several points. The x coordinate of an evaluation is the number
of training attempts the updates up to that version consumed (the version's `samples`; in GRPO they also
count steps whose groups all lacked signal and so made no version). Attempts generated but
never used (members or groups still in flight at the end, or dropped as stale) are reported beside it, from
the generators' own count in the run's Redis.

Flags the comparison does not own (`--engine hf`, `--model PATH`, `--curriculum ramp`, ...) go to both runs
unchanged; the ones it sets for fairness are refused there, with the flag to use instead.

One file, over 400 lines, because it is one experiment's command: planning the two runs, running them,
reading their curves back and the table, JSON and plot of their comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import redis

from evals import plots
from evals.eta import Eta
from evals.runs import EvalError, run_redis
from streams.embedded import die_with_parent
from streams.keys import Keys
from streams.settings import DefaultsFormatter
from trainer.config import GRPO_BATCH, PRESETS, TrainerSettings
from trainer.curves import curve, plot_runs, samples_used
from trainer.loop import FINISHED_BEFORE
from trainer.metrics import read_records, update_records
from trainer.result import INFO

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ("es", "grpo", "es-lowrank")  # es-lowrank: ES with low-rank members (--es-noise lowrank, EGGROLL)
DEFAULT_ALGOS = ("es", "grpo")
LABELS = {"es": "ES", "grpo": "GRPO", "es-lowrank": "ES low-rank"}
COLORS = {"es": "tab:blue", "grpo": "tab:orange", "es-lowrank": "tab:green"}
INTERRUPTED = (130, -2, -15)  # python -m trainer's exit after SIGINT/SIGTERM, or killed by either signal
TICK_S = 10.0  # how often a running trainer's progress is read for the ETA
# Trainer flags this module sets itself (same value for both runs, or per algorithm from the budget).
OWNED = {
    "--algo": "(both run)",
    "--task": "--task",
    "--iterations": "--budget",
    "--eval-every": "--eval-points",
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


@dataclass(frozen=True)
class Plan:
    """One algorithm's run: how many samples a version costs, how many versions the budget buys."""

    algo: str
    samples_per_version: int
    iterations: int
    eval_every: int
    flags: tuple[str, ...]  # the algorithm's own trainer flags

    @property
    def samples(self) -> int:
        return self.samples_per_version * self.iterations


def samples_per_version(algo: str, *, population: int = 0, batch: int, group_size: int = 0) -> int:
    """ES: every one of `population` members answers the version's `batch` problems once.
    GRPO: `group_size` samples of each of `batch` theorems."""
    if algo in ("es", "es-lowrank"):
        return population * batch
    if algo == "grpo":
        return batch * group_size
    raise ValueError(f"unknown algo {algo!r}")


def plan(algo: str, budget: int, per_version: int, eval_points: int, flags: tuple[str, ...] = ()) -> Plan:
    """Iterations = budget // per_version (the remainder is not spent); evaluation every
    iterations // eval_points versions (at least 1), plus version 0 and the last."""
    if per_version < 1:
        raise ValueError("a version must cost at least one sample")
    if budget < per_version:
        raise ValueError(f"{algo}: a budget of {budget} samples buys no version at {per_version} samples a version")
    iterations = budget // per_version
    return Plan(algo, per_version, iterations, max(1, iterations // max(1, eval_points)), flags)


def generated_for_training(run_dir: Path, run: str, records: list[dict[str, Any]]) -> int | None:
    """Attempts the run's generators published (their own final count, in the run's Redis, opened again from
    its AOF in `run_dir/redis`), less those of evaluation orders (one per held-out problem each). None when
    the run kept no Redis data there (a run against an external Redis) or no generator reported."""
    try:
        with run_redis(TrainerSettings(run=run), run_dir) as (url, _):
            client = redis.Redis.from_url(url)
            figures = [orjson.loads(v) for v in client.hvals(Keys(run).generator_stats)]
            client.close()
    except EvalError:  # no Redis data in the run directory
        return None
    if not figures:
        return None
    evaluation = sum(int(r.get("problems") or 0) for r in records if r.get("eval"))
    return sum(int(f.get("attempts", 0)) for f in figures) - evaluation


# -- running -------------------------------------------------------------------------------------------


def trainer_argv(p: Plan, common: list[str], run: str, run_dir: Path, extra: list[str]) -> list[str]:
    algo = "es" if p.algo == "es-lowrank" else p.algo  # the low-rank flags are the plan's
    return [sys.executable, "-m", "trainer", "--algo", algo, *common, "--iterations", str(p.iterations),
            "--eval-every", str(p.eval_every), *p.flags, "--run", run, "--run-dir", str(run_dir), *extra]  # fmt: skip


def run_one(argv: list[str], env: dict[str, str], log_path: Path, tick: Callable[[], object] | None = None,
            every_s: float = TICK_S) -> tuple[int, float]:  # fmt: skip
    """Run one trainer to the end, its output in `log_path`, calling `tick` every `every_s` while it runs (the
    ETA, evals/eta.py). (exit status, wall seconds). A SIGTERM to this process is passed on to the trainer,
    which stops its pipeline and exits 130; if this process dies, the kernel sends the trainer SIGTERM
    (PR_SET_PDEATHSIG), so no trainer is left running without it."""
    started = time.monotonic()
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)  # fmt: skip
        previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
        try:
            code = _wait(proc, tick, every_s)
        except KeyboardInterrupt:  # the trainer got the Ctrl-C too (same process group): let it stop its pipeline
            code = proc.wait()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
    return code, round(time.monotonic() - started, 1)


def _wait(proc: subprocess.Popen, tick: Callable[[], object] | None, every_s: float) -> int:
    while True:
        try:
            return proc.wait(timeout=every_s if tick else None)
        except subprocess.TimeoutExpired:  # still running: time to say how far the job is
            tick()


def result_for(p: Plan, run: str, run_dir: Path, argv: list[str], code: int, wall_s: float) -> dict[str, Any]:
    records = read_records(run_dir / "metrics.jsonl")
    report = _json(run_dir / "report.json")
    points = curve(records, _json(run_dir / INFO).get("started"))
    return {
        "plan": {**asdict(p), "flags": list(p.flags), "samples": p.samples},
        "command": argv,
        "returncode": code,
        "wall_s": wall_s,
        "trainer_wall_s": report.get("wall_s"),
        "versions": report.get("version"),
        "samples_used": samples_used(records),
        "generated_for_training": generated_for_training(run_dir, run, records),
        "counts": report.get("counts", {}),
        "curve": points,
        "run_dir": str(run_dir),
    }


def _json(path: Path) -> dict[str, Any]:
    return orjson.loads(path.read_bytes()) if path.exists() else {}


# -- output --------------------------------------------------------------------------------------------


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    s, algos = result["settings"], result["algos"]
    lines = [f"# ES vs GRPO on {s['task']}: {result['budget']} training samples each", ""]
    lines += [
        "Held-out: greedy decoding of the policy on the same "
        f"{s['held_out']} held-out problems; **reward** is the verifier's shaped partial credit, **exact** the "
        "share solved exactly. Training samples: attempts the updates up to that version consumed.",
        "",
        "| algo | version | training samples | held-out reward | held-out exact |",
        "|---|---:|---:|---:|---:|",
    ]
    for algo, r in algos.items():
        for pt in r["curve"]:
            lines.append(f"| {LABELS[algo]} | {pt['version']} | {pt['samples'] if pt['samples'] is not None else '-'}"
                         f" | {_fmt(pt['held_out_reward'])} | {_fmt(pt['held_out_exact'])} |")  # fmt: skip
    lines += [
        "",
        "| algo | samples / version | versions | samples used | generated for training | held-out reward "
        "start -> end | held-out exact start -> end | wall time |",
        "|---|---:|---:|---:|---:|---|---|---:|",
    ]
    for algo, r in algos.items():
        c = r["curve"]
        first, last = (c[0], c[-1]) if c else ({}, {})
        failed = "" if r["returncode"] == 0 else f" (exit {r['returncode']})"
        lines.append(
            f"| {LABELS[algo]} | {r['plan']['samples_per_version']} | {r['versions']} | {r['samples_used']} | "
            f"{r['generated_for_training'] if r['generated_for_training'] is not None else '-'} | "
            f"{_fmt(first.get('held_out_reward'))} -> {_fmt(last.get('held_out_reward'))} | "
            f"{_fmt(first.get('held_out_exact'))} -> {_fmt(last.get('held_out_exact'))} | "
            f"{_minutes(r['wall_s'])}{failed} |"
        )
    lines += ["", "## Settings", ""]
    lines += [f"- {line}" for line in settings_lines(result)]
    lines += ["", "## Commands", ""]
    for algo, r in algos.items():
        lines += [f"{LABELS[algo]} (log: `{Path(r['run_dir']).parent / (algo + '.log')}`):", "", "```",
                  " ".join(_short(a) for a in r["command"]), "```", ""]  # fmt: skip
    lines += [f"Total wall time: {_minutes(result['wall_s'])}.", ""]
    return "\n".join(lines)


def settings_lines(result: dict[str, Any]) -> list[str]:
    s = result["settings"]
    es, grpo = result["algos"].get("es"), result["algos"].get("grpo")
    out = [
        f"budget: {result['budget']} training samples per algorithm (`--budget`); evaluation not counted",
        f"same for both: task {s['task']}, seed {s['seed']} (same {s['problems']} training problems and held-out "
        f"split), GRPO's sampling temperature {s['temperature']} (ES members: `es_temperature`, greedy unless "
        f"passed), max_new_tokens {s['max_new_tokens']}, held-out "
        f"problems {s['held_out']}, base model {s['model']}, engine {s['engine']}",
        f"generator precision: {s['gen_dtype']} (`--gen-dtype`; the GRPO trainer computes in float32). Why float32 "
        "by default: bf16 keeps ~2^-8 of a weight, coarser than a GRPO step at this learning rate, so only the "
        "weights near a rounding edge would move, and vLLM's bf16 logprobs differ from the fp32 trainer's on the "
        "same tokens (up to 1.7 nats a token measured here) where GRPO's importance weights assume they agree; ES "
        "perturbations come from an fp32 master either way",
        f"evaluations: version 0, every iterations // {s['eval_points']} versions, and the last (`--eval-points`)",
        f"quorum {s['quorum']} for both (`--quorum`): an update waits for that share of its members or groups; at "
        "1 the runs go in lockstep (each version issues exactly its population or batch and its update uses all "
        "of it, every sample from that version's own policy); below 1 an update takes the first to finish, a "
        "full population or batch is kept in flight, and samples may come from a policy up to "
        f"{s.get('max_staleness', 1)} versions older (`max_staleness`; `staleness` in each run's metrics.jsonl)",
    ]
    if es:
        p, cpu = es["plan"], PRESETS["cpu"]
        sigma = s["es_sigma"] or f"preset cpu ({cpu['sigma']})"
        alpha = s["es_alpha"] or f"preset cpu ({cpu['alpha']})"
        out.append(
            f"ES: population {s['es_population']} (`--es-population`) x batch {s['es_batch']} (`--es-batch`) = "
            f"{p['samples_per_version']} samples a version, {p['iterations']} version(s); sigma {sigma}, alpha "
            f"{alpha} (the paper: sigma 0.001, alpha 0.0005, Qiu et al. 2025); members share the version's batch, "
            "greedy unless --es-temperature is passed"
        )
    if grpo:
        p = grpo["plan"]
        out.append(
            f"GRPO: batch {s['grpo_batch']} theorems (`--grpo-batch`) x group size {s['grpo_group_size']} "
            f"(`--grpo-group-size`) = {p['samples_per_version']} samples a version, {p['iterations']} version(s); "
            f"learning rate {s['grpo_lr']} (`--grpo-lr`, default the trainer's `lr`: an AdamW step moves each "
            "weight by about the learning rate, and a billion-parameter model's 1e-6 leaves a 135M model where it "
            "was in a handful of steps), AdamW, one optimizer step per batch, std-normalized advantages, "
            "clip 0.2/0.28, no KL"
        )
    if result.get("extra"):
        out.append(f"passed to both trainers unchanged: `{' '.join(result['extra'])}`")
    out.append(
        "a GRPO step whose groups all have equal rewards carries no signal and makes no version, but its samples "
        "count: GRPO can use more than the budget; `samples used` says how many it did"
    )
    return out


def _short(arg: str) -> str:
    return "python" if arg == sys.executable else arg


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Held-out reward (solid) and exact success (dashed) against training samples and against wall time, a
    colour per algorithm: trainer/curves.py's plot, the one `python -m ops compare` draws."""
    runs = [{"label": LABELS[algo], "color": COLORS[algo], "curve": r["curve"]} for algo, r in result["algos"].items()]
    title = f"ES vs GRPO, {result['settings']['task']}, greedy on {result['settings']['held_out']} held-out"
    return plot_runs(runs, path, title, budget=result["budget"])


def write(result: dict[str, Any], out: Path) -> None:
    (out / "compare.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    (out / "compare.md").write_text(markdown(result))
    plot(result, out / "compare.png")


def summary_line(summary: dict[str, Any]) -> dict[str, Any]:
    line: dict[str, Any] = {"budget": summary["budget"], "seeds": summary["seeds"], "ok": summary["ok"]}
    for algo, st in summary["algos"].items():
        line[algo] = {key: st[key]["mean"] for key in ("reward_end", "gain", "exact_end", "wall_s")}
        line[algo]["n"] = st["reward_end"]["n"]
    return line


# -- the command ---------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m evals.compare", description=__doc__.split("\n\n")[1],
                                epilog="Any other flag goes to both `python -m trainer` runs.",
                                formatter_class=DefaultsFormatter)  # fmt: skip
    p.add_argument("--task", choices=("countdown", "lean"), default="countdown", help="the task both runs train on")
    p.add_argument("--budget", type=int, required=True, help="training samples (generated attempts) per algorithm")
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
    p.add_argument("--eval-points", type=int, default=4, help="evaluations after version 0, per algorithm")
    p.add_argument("--quorum", type=float, default=1.0,
                   help="share of a version's members (ES) or groups (GRPO) an update waits for; 1: every version "
                   "uses exactly its samples")  # fmt: skip
    p.add_argument("--gen-dtype", choices=("auto", "float32", "bfloat16"), default="float32",
                   help="the generators' weights precision (PROOFSTREAM_DTYPE for the runs' generators)")  # fmt: skip
    cpu, trainer = PRESETS["cpu"], TrainerSettings.model_fields
    p.add_argument("--es-population", type=int, default=cpu["population"],
                   help=f"ES members a version (default: the cpu preset's, {cpu['population']})")  # fmt: skip
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
    p.add_argument("--algos", nargs="+", choices=ALGOS, default=list(DEFAULT_ALGOS),
                   help="the runs of each seed, in order; es-lowrank: ES with low-rank members, a population "
                   "generated in one engine call (--lowrank-*)")  # fmt: skip
    p.add_argument("--lowrank-population", type=int, default=32, help="es-lowrank: members a version")
    p.add_argument("--lowrank-batch", type=int, default=cpu["batch"], help="es-lowrank: problems a member answers")
    p.add_argument("--lowrank-rank", type=int, default=4, help="es-lowrank: r of each member's A B^T")
    p.add_argument("--lowrank-sigma", type=float, default=None,
                   help=f"es-lowrank: noise scale (default: the cpu preset's, {cpu['sigma']})")  # fmt: skip
    p.add_argument("--lowrank-alpha", type=float, default=None,
                   help=f"es-lowrank: step size (default: the cpu preset's, {cpu['alpha']})")  # fmt: skip
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
    lowrank_flags = ["--es-noise", "lowrank", "--es-rank", str(args.lowrank_rank), "--population",
                     str(args.lowrank_population), "--batch", str(args.lowrank_batch)]  # fmt: skip
    if args.lowrank_sigma:
        lowrank_flags += ["--sigma", str(args.lowrank_sigma)]
    if args.lowrank_alpha:
        lowrank_flags += ["--alpha", str(args.lowrank_alpha)]
    per_version = {
        "es": (samples_per_version("es", population=args.es_population, batch=args.es_batch), es_flags),
        "grpo": (samples_per_version("grpo", batch=args.grpo_batch, group_size=args.grpo_group_size), grpo_flags),
        "es-lowrank": (samples_per_version("es-lowrank", population=args.lowrank_population, batch=args.lowrank_batch),
                       lowrank_flags),
    }  # fmt: skip
    return [plan(algo, args.budget, per_version[algo][0], args.eval_points, tuple(per_version[algo][1]))
            for algo in dict.fromkeys(args.algos)]  # fmt: skip


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
    try:
        todo = plans(args)
    except ValueError as e:
        problems.append(str(e))
    if problems:
        for problem in problems:
            print(f"compare: {problem}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("runs") / time.strftime("compare-%Y%m%d-%H%M%S")).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    eta = Eta("compare", versions_to_run(args.seeds, out, todo))
    print(
        f"compare: {eta.total} versions to run ({', '.join(f'{p.algo} {p.iterations}' for p in todo)} a seed, "
        f"seeds {args.seeds}, less what finished before); an estimate follows the first version",
        file=sys.stderr,
    )
    results: dict[int, dict[str, Any]] = {}
    summary: dict[str, Any] = {}
    for seed in args.seeds:
        seed_out = out / f"seed{seed}"
        done = _json(seed_out / "compare.json")
        if done.get("ok") and set(done.get("algos", {})) == {p.algo for p in todo}:
            print(f"compare: seed {seed}: finished before, not run again", file=sys.stderr)
            results[seed] = done
        else:
            results[seed] = compare_seed(args, seed, seed_out, todo, extra, eta)
        summary = summarize(results, args)
        write_summary(summary, out)  # after each seed: a comparison cut short keeps its summary
        if not results[seed]["ok"] and any(r["returncode"] in INTERRUPTED for r in results[seed]["algos"].values()):
            print("compare: stopped", file=sys.stderr)
            break
    print(f"compare: {out / 'compare.md'}, {out / 'compare.png'}", file=sys.stderr)
    print(json.dumps(summary_line(summary)))
    return 0 if summary["ok"] else 1


def versions_to_run(seeds: list[int], out: Path, todo: list[Plan]) -> int:
    """The versions the comparison still has to make: every seed's runs but those that finished before."""
    total = 0
    for seed in seeds:
        done = _json(out / f"seed{seed}" / "compare.json")
        if done.get("ok") and set(done.get("algos", {})) == {p.algo for p in todo}:
            continue
        total += sum(p.iterations for p in todo if done.get("algos", {}).get(p.algo, {}).get("returncode") != 0)
    return total


def compare_seed(args: argparse.Namespace, seed: int, out: Path, todo: list[Plan], extra: list[str],
                 eta: Eta | None = None) -> dict[str, Any]:  # fmt: skip
    """ES then GRPO on one seed (the same problems and held-out split for both), in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ}
    if args.gen_dtype != "auto":
        env["PROOFSTREAM_DTYPE"] = args.gen_dtype
    common = ["--task", args.task, "--seed", str(seed), "--temperature", str(args.temperature),
              "--max-new-tokens", str(args.max_new_tokens), "--held-out", str(args.held_out),
              "--quorum", str(args.quorum)]  # fmt: skip
    if args.task == "countdown":
        common += ["--problems", str(args.problems)]
    result: dict[str, Any] = {
        "out": str(out),
        "budget": args.budget,
        "settings": {
            **{k: v for k, v in vars(args).items() if k not in ("out", "seeds")},
            "seed": seed,
            "model": _value(extra, "--model", "default (SmolLM2-135M-Instruct)"),
            "engine": _value(extra, "--engine", "auto"),
            "max_staleness": int(
                _value(extra, "--max-staleness", str(TrainerSettings.model_fields["max_staleness"].default))
            ),
        },  # fmt: skip
        "extra": extra,
        "algos": {},
        "ok": True,
    }
    started = time.monotonic()
    before = _json(out / "compare.json").get("algos", {})
    for p in todo:
        if before.get(p.algo, {}).get("returncode") == 0:  # this seed was cut short after that run finished
            result["algos"][p.algo] = before[p.algo]
            print(f"compare: seed {seed}: {p.algo}: finished before, not run again", file=sys.stderr)
            continue
        run_dir = out / p.algo
        run = f"{out.parent.name}-{out.name}-{p.algo}"
        argv = trainer_argv(p, common, run, run_dir, extra)
        print(f"compare: seed {seed}: {p.algo}: {p.iterations} versions x {p.samples_per_version} samples; "
              f"log {out / p.algo}.log", file=sys.stderr)  # fmt: skip
        if eta is not None:
            eta.start(run_dir)
        code, wall_s = run_one(argv, env, out / f"{p.algo}.log", tick=eta.tick if eta else None)
        if eta is not None:
            eta.done()
        code = 0 if code == FINISHED_BEFORE else code  # it finished before its result was written: read it
        result["algos"][p.algo] = result_for(p, run, run_dir, argv, code, wall_s)
        result["ok"] = result["ok"] and code == 0
        result["wall_s"] = round(time.monotonic() - started, 1)
        write(result, out)  # after each run, so a comparison cut short keeps what it has
        print(f"compare: seed {seed}: {p.algo}: exit {code} after {_minutes(wall_s)}", file=sys.stderr)
        if code in INTERRUPTED:  # the trainer was stopped (Ctrl-C, SIGTERM): so is the comparison
            break
    return result


# -- over seeds ------------------------------------------------------------------------------------------


def proved_per_version(records: list[dict[str, Any]]) -> float | None:
    """Training attempts judged `proved` per update (pass rate x attempts of each version), averaged."""
    updates = [r for r in update_records(records) if "pass_rate" in r]
    if not updates:
        return None
    return statistics.fmean(float(r["pass_rate"]) * int(r.get("attempts", 0)) for r in updates)


def endpoints(points: list[dict[str, Any]]) -> dict[str, Any]:
    """A curve's held-out reward and exact success at its first and last evaluation, and the reward's gain
    between them (None where the curve has no evaluation)."""
    first, last = (points[0], points[-1]) if points else ({}, {})
    start, end = first.get("held_out_reward"), last.get("held_out_reward")
    return {"reward_start": start, "reward_end": end, "gain": None if start is None or end is None else end - start,
            "exact_start": first.get("held_out_exact"), "exact_end": last.get("held_out_exact")}  # fmt: skip


def algo_figures(r: dict[str, Any]) -> dict[str, Any]:
    """One algorithm's figures on one seed (from its result and its run's metrics)."""
    ends = endpoints(r["curve"])
    wall = r.get("trainer_wall_s") or r["wall_s"]
    return {
        "reward_end": ends["reward_end"],
        "gain": ends["gain"],
        "exact_end": ends["exact_end"],
        "proved_per_version": proved_per_version(read_records(Path(r["run_dir"]) / "metrics.jsonl")),
        "wall_s": wall,
        "samples_per_s": (r["samples_used"] / wall) if wall and r["samples_used"] is not None else None,
        "returncode": r["returncode"],
    }


FIGURES = ("reward_end", "gain", "exact_end", "proved_per_version", "wall_s", "samples_per_s")


def _stats(values: list[float | None]) -> dict[str, float | int | None]:
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "min": min(xs),
            "max": max(xs), "n": len(xs)}  # fmt: skip


def summarize(results: dict[int, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    per_seed = {seed: {algo: algo_figures(r) for algo, r in res["algos"].items()} for seed, res in results.items()}
    algos: dict[str, Any] = {}
    for algo in dict.fromkeys(getattr(args, "algos", DEFAULT_ALGOS)):
        rows = [figs[algo] for figs in per_seed.values() if algo in figs and figs[algo]["returncode"] == 0]
        algos[algo] = {key: _stats([row[key] for row in rows]) for key in FIGURES}
    return {"budget": args.budget, "seeds": list(results), "per_seed": per_seed, "algos": algos,
            "ok": all(res["ok"] for res in results.values()) and len(results) == len(args.seeds),
            "results": results}  # fmt: skip


def _ms(st: dict[str, Any], digits: int = 3) -> str:
    if st["mean"] is None:
        return "-"
    return f"{st['mean']:.{digits}f} ± {st['std']:.{digits}f} (n={st['n']})"


def summary_markdown(summary: dict[str, Any]) -> str:
    lines = [f"# ES vs GRPO: {summary['budget']} training samples each, seeds {summary['seeds']}", "",
             "Mean ± sample standard deviation over the seeds whose run finished. Held-out: greedy on the "
             "seed's held-out split; gain = end - version 0 of the same seed. Proved per version: training "
             "attempts judged `proved` per update. Per seed: `seed<K>/compare.md`.", "",
             "| algo | held-out reward (end) | gain | held-out exact (end) | proved per version | wall (s) | "
             "training samples / s |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for algo, st in summary["algos"].items():
        lines.append(f"| {LABELS[algo]} | {_ms(st['reward_end'])} | {_ms(st['gain'])} | {_ms(st['exact_end'])} | "
                     f"{_ms(st['proved_per_version'], 2)} | {_ms(st['wall_s'], 0)} | "
                     f"{_ms(st['samples_per_s'], 2)} |")  # fmt: skip
    lines += ["", "| seed | algo | reward end | gain | exact end | exit |", "|---:|---|---:|---:|---:|---:|"]
    for seed, figs in summary["per_seed"].items():
        for algo, f in figs.items():
            lines.append(f"| {seed} | {LABELS[algo]} | {_fmt(f['reward_end'])} | {_fmt(f['gain'])} | "
                         f"{_fmt(f['exact_end'])} | {f['returncode']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def summary_plot(summary: dict[str, Any], path: Path) -> Path | None:
    if (plt := plots.pyplot()) is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for algo in summary["algos"]:
        runs = [res["algos"][algo] for res in summary["results"].values() if algo in res["algos"]]
        curves = [r["curve"] for r in runs if r["curve"]]
        if curves:
            plots.mean_band(ax, curves, f"{LABELS[algo]} held-out reward, mean of {len(curves)} seed(s)", COLORS[algo])
    return plots.save(plt, fig, ax, path, "ES vs GRPO over seeds (band: min-max)", "held-out reward (shaped, greedy)")


def write_summary(summary: dict[str, Any], out: Path) -> None:
    doc = {k: v for k, v in summary.items() if k != "results"}
    (out / "compare.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    (out / "compare.md").write_text(summary_markdown(summary))
    summary_plot(summary, out / "compare.png")


if __name__ == "__main__":
    raise SystemExit(main())
