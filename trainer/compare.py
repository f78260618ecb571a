"""`python -m trainer.compare --task countdown --budget N [flags] [extra trainer flags]`

ES and GRPO from the same base model at the same number of training samples: N attempts generated for
training each (evaluation attempts not counted), held-out reward (shaped partial credit) and held-out exact
success against samples, as a table (`compare.md`), `compare.json` and a plot (`compare.png`).

The two runs go one after the other as `python -m trainer` subprocesses, each with its own local pipeline
(private Redis, generator, verifier), the same seed and so the same problems and held-out split, the same
sampling temperature and max_new_tokens, and the same generator precision. The budget becomes iterations per
algorithm: a version costs population x batch samples in ES (every member answers the version's batch once)
and batch x group_size in GRPO (G samples of each of `batch` theorems), so iterations = N // that. Each run
evaluates its policy (greedy, on the held-out split) at version 0, every `iterations // eval_points`
versions and at the end, so each curve has several points. The x coordinate of an evaluation is the number
of training attempts the updates up to that version consumed (`attempts` of each ES version; `samples` of
GRPO, which also counts steps whose groups all lacked signal and so made no version). Attempts generated but
never used (members or groups still in flight at the end, or dropped as stale) are reported beside it, from
the generators' own count in the run's Redis.

Flags the comparison does not own (`--engine hf`, `--model PATH`, `--curriculum ramp`, ...) go to both runs
unchanged; the ones it sets for fairness are refused there, with the flag to use instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import redis

from streams.keys import Keys
from trainer.config import TrainerSettings

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ("es", "grpo")
LABELS = {"es": "ES", "grpo": "GRPO"}
COLORS = {"es": "tab:blue", "grpo": "tab:orange"}
INTERRUPTED = (130, -2, -15)  # python -m trainer's exit after SIGINT/SIGTERM, or killed by either signal
# Trainer flags this module sets itself (same value for both runs, or per algorithm from the budget).
OWNED = {
    "--algo": "(both run)",
    "--task": "--task",
    "--iterations": "--budget",
    "--eval-every": "--eval-points",
    "--run": "--out",
    "--run-dir": "--out",
    "--redis-url": "(each run starts its own local pipeline)",
    "--seed": "--seed",
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
    if algo == "es":
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


def curve(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Held-out points from a run's metrics records, in version order, each with the training samples the
    updates up to its version consumed (`samples` where the record has it, else the running sum of
    `attempts`). Version 0 is at 0 samples."""
    at = {0: 0}
    total = 0
    for r in sorted((r for r in records if not r.get("eval") and "version" in r), key=lambda r: r["version"]):
        total += int(r.get("attempts", 0))
        at[int(r["version"])] = int(r["samples"]) if "samples" in r else total
    points = []
    for r in sorted((r for r in records if r.get("eval")), key=lambda r: r["version"]):
        v = int(r["version"])
        points.append({"version": v, "samples": at.get(v), "held_out_reward": r["held_out_reward"],
                       "held_out_exact": r["held_out_exact"], "problems": r.get("problems")})  # fmt: skip
    return points


def samples_used(records: list[dict[str, Any]]) -> int:
    """Training attempts consumed by the run's updates (the last version's x)."""
    updates = [r for r in records if not r.get("eval") and "version" in r]
    if not updates:
        return 0
    last = max(updates, key=lambda r: r["version"])
    return int(last["samples"]) if "samples" in last else sum(int(r.get("attempts", 0)) for r in updates)


def generated_for_training(run_dir: Path, run: str, records: list[dict[str, Any]]) -> int | None:
    """Attempts the run's generators published (their own final count, in the run's Redis, opened again from
    its AOF in `run_dir/redis`), less those of evaluation orders (one per held-out problem each). None when
    the run kept no Redis data there (a run against an external Redis) or no generator reported."""
    from trainer.eval import EvalError, run_redis  # the run's Redis, under the data directory's lock

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
    return [sys.executable, "-m", "trainer", "--algo", p.algo, *common, "--iterations", str(p.iterations),
            "--eval-every", str(p.eval_every), *p.flags, "--run", run, "--run-dir", str(run_dir), *extra]  # fmt: skip


def run_one(argv: list[str], env: dict[str, str], log_path: Path) -> tuple[int, float]:
    """Run one trainer to the end, its output in `log_path`. (exit status, wall seconds). A SIGTERM to this
    process is passed on to the trainer, which stops its pipeline and exits 130; if this process dies, the
    kernel sends the trainer SIGTERM (PR_SET_PDEATHSIG), so no trainer is left running without it."""
    from streams.embedded import die_with_parent

    started = time.monotonic()
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)  # fmt: skip
        previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # the trainer got the Ctrl-C too (same process group): let it stop its pipeline
            code = proc.wait()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
    return code, round(time.monotonic() - started, 1)


def result_for(p: Plan, run: str, run_dir: Path, argv: list[str], code: int, wall_s: float) -> dict[str, Any]:
    records = _records(run_dir / "metrics.jsonl")
    report = _json(run_dir / "report.json")
    points = curve(records)
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


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


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
        f"split), sampling temperature {s['temperature']}, max_new_tokens {s['max_new_tokens']}, held-out "
        f"problems {s['held_out']}, base model {s['model']}, engine {s['engine']}",
        f"generator precision: {s['gen_dtype']} (`--gen-dtype`; the GRPO trainer computes in float32). Why float32 "
        "by default: bf16 keeps ~2^-8 of a weight, coarser than a GRPO step at this learning rate, so only the "
        "weights near a rounding edge would move, and vLLM's bf16 logprobs differ from the fp32 trainer's on the "
        "same tokens (up to 1.7 nats a token measured here) where GRPO's importance weights assume they agree; ES "
        "perturbations come from an fp32 master either way",
        f"evaluations: version 0, every iterations // {s['eval_points']} versions, and the last (`--eval-points`)",
        f"quorum {s['quorum']} for both (`--quorum`): an update waits for that share of its members or groups; at "
        "1 every version uses exactly its samples a version (below 1, an update takes the first to finish and "
        "the stragglers go into the next). Both pipelines are asynchronous: a full population (ES) or batch "
        "(GRPO) is kept in flight, so most of a version's samples may come from the policy one version older "
        f"(max_staleness {s.get('max_staleness', 1)}; `staleness` in each run's metrics.jsonl)",
    ]
    if es:
        p = es["plan"]
        out.append(
            f"ES: population {s['es_population']} (`--es-population`) x batch {s['es_batch']} (`--es-batch`) = "
            f"{p['samples_per_version']} samples a version, {p['iterations']} version(s); sigma "
            f"{s['es_sigma'] or 'preset cpu (0.001)'}, alpha {s['es_alpha'] or 'preset cpu (0.0005)'} (the "
            "paper's values, Qiu et al. 2025); members share the version's batch"
        )
    if grpo:
        p = grpo["plan"]
        out.append(
            f"GRPO: batch {s['grpo_batch']} theorems (`--grpo-batch`) x group size {s['grpo_group_size']} "
            f"(`--grpo-group-size`) = {p['samples_per_version']} samples a version, {p['iterations']} version(s); "
            f"learning rate {s['grpo_lr']} (`--grpo-lr`; the trainer's default 1e-6 is a billion-parameter "
            "value, and an AdamW step moves each weight by about the learning rate: a handful of steps at 1e-6 "
            "leave a 135M model where it was), AdamW, one optimizer step per batch, std-normalized advantages, "
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
    """x = training samples, y = held-out reward (solid) and exact success (dashed), one colour per algo."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for algo, r in result["algos"].items():
        pts = [p for p in r["curve"] if p["samples"] is not None]
        x = [p["samples"] for p in pts]
        ax.plot(x, [p["held_out_reward"] for p in pts], marker="o", color=COLORS[algo],
                label=f"{LABELS[algo]} held-out reward (shaped)")  # fmt: skip
        ax.plot(x, [p["held_out_exact"] for p in pts], marker="^", linestyle="--", color=COLORS[algo],
                label=f"{LABELS[algo]} held-out exact success")  # fmt: skip
    ax.axvline(result["budget"], color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("training samples (generated attempts used by updates)")
    ax.set_ylabel("held-out reward / exact success")
    ax.set_title(f"ES vs GRPO, {result['settings']['task']}, greedy on {result['settings']['held_out']} held-out")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(result: dict[str, Any], out: Path) -> None:
    (out / "compare.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    (out / "compare.md").write_text(markdown(result))
    plot(result, out / "compare.png")


def summary_line(result: dict[str, Any]) -> dict[str, Any]:
    line: dict[str, Any] = {"out": result["out"], "budget": result["budget"], "ok": result["ok"]}
    for algo, r in result["algos"].items():
        last = r["curve"][-1] if r["curve"] else {}
        line[algo] = {"samples_used": r["samples_used"], "versions": r["versions"], "wall_s": r["wall_s"],
                      "held_out_reward": last.get("held_out_reward"), "held_out_exact": last.get("held_out_exact"),
                      "returncode": r["returncode"]}  # fmt: skip
    return line


# -- the command ---------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.compare", description=__doc__.split("\n\n")[1],
                                epilog="Any other flag goes to both `python -m trainer` runs.")  # fmt: skip
    p.add_argument("--task", choices=("countdown", "lean"), default="countdown")
    p.add_argument("--budget", type=int, required=True, help="training samples (generated attempts) per algorithm")
    p.add_argument("--out", default="", help="output folder (default runs/compare-<timestamp>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0, help="training sampling temperature (evaluation: 0)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--held-out", type=int, default=32, help="held-out problems")
    p.add_argument("--problems", type=int, default=256, help="countdown training problems")
    p.add_argument("--eval-points", type=int, default=4, help="evaluations after version 0, per algorithm")
    p.add_argument("--quorum", type=float, default=1.0,
                   help="share of a version's members (ES) or groups (GRPO) an update waits for; 1: every version "
                   "uses exactly its samples")  # fmt: skip
    p.add_argument("--gen-dtype", choices=("auto", "float32", "bfloat16"), default="float32",
                   help="the generators' weights precision (PROOFSTREAM_DTYPE for the runs' generators)")  # fmt: skip
    p.add_argument("--es-population", type=int, default=8)
    p.add_argument("--es-batch", type=int, default=8, help="problems every ES member answers, per version")
    p.add_argument("--es-sigma", type=float, default=None, help="default: the cpu preset's")
    p.add_argument("--es-alpha", type=float, default=None, help="default: the cpu preset's")
    p.add_argument("--grpo-batch", type=int, default=8, help="theorems (groups) per GRPO step")
    p.add_argument("--grpo-group-size", type=int, default=8)
    p.add_argument("--grpo-lr", type=float, default=1e-5)
    return p


def plans(args: argparse.Namespace) -> list[Plan]:
    es_flags = ["--population", str(args.es_population), "--batch", str(args.es_batch)]
    if args.es_sigma:
        es_flags += ["--sigma", str(args.es_sigma)]
    if args.es_alpha:
        es_flags += ["--alpha", str(args.es_alpha)]
    grpo_flags = ["--batch", str(args.grpo_batch), "--group-size", str(args.grpo_group_size), "--lr", str(args.grpo_lr)]
    es = samples_per_version("es", population=args.es_population, batch=args.es_batch)
    grpo = samples_per_version("grpo", batch=args.grpo_batch, group_size=args.grpo_group_size)
    return [plan("es", args.budget, es, args.eval_points, tuple(es_flags)),
            plan("grpo", args.budget, grpo, args.eval_points, tuple(grpo_flags))]  # fmt: skip


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
    env = {**os.environ}
    if args.gen_dtype != "auto":
        env["PROOFSTREAM_DTYPE"] = args.gen_dtype
    common = ["--task", args.task, "--seed", str(args.seed), "--temperature", str(args.temperature),
              "--max-new-tokens", str(args.max_new_tokens), "--held-out", str(args.held_out),
              "--quorum", str(args.quorum)]  # fmt: skip
    if args.task == "countdown":
        common += ["--problems", str(args.problems)]
    result: dict[str, Any] = {
        "out": str(out),
        "budget": args.budget,
        "settings": {
            **{k: v for k, v in vars(args).items() if k != "out"},
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
    for p in todo:
        run_dir = out / p.algo
        run = f"{out.name}-{p.algo}"
        argv = trainer_argv(p, common, run, run_dir, extra)
        print(f"compare: {p.algo}: {p.iterations} versions x {p.samples_per_version} samples; log {out / p.algo}.log",
              file=sys.stderr)  # fmt: skip
        code, wall_s = run_one(argv, env, out / f"{p.algo}.log")
        result["algos"][p.algo] = result_for(p, run, run_dir, argv, code, wall_s)
        result["ok"] = result["ok"] and code == 0
        result["wall_s"] = round(time.monotonic() - started, 1)
        write(result, out)  # after each run, so a comparison cut short keeps what it has
        print(f"compare: {p.algo}: exit {code} after {_minutes(wall_s)}", file=sys.stderr)
        if code in INTERRUPTED:  # the trainer was stopped (Ctrl-C, SIGTERM): so is the comparison
            print("compare: stopped", file=sys.stderr)
            break
    print(f"compare: {out / 'compare.md'}, {out / 'compare.png'}", file=sys.stderr)
    print(json.dumps(summary_line(result)))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
