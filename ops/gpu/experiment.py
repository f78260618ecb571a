"""`python -m ops.gpu_check --experiment` (`make gpu-experiment`): ES against GRPO at equal wall-clock on one
GPU, with the real default model and the hf engine, sized to a time budget from a throughput it measures first.

A GPU box is lent rarely and for about 15 minutes, so the experiment is one command, in three steps, each a
`python -m trainer` with its own local pipeline (a private Redis, the hf generator on `--device`, a verifier):

1. **Probe.** ES at the target shape (`--population` x `--batch`; on a CPU a small one, `--probe-shape`) for
   `--probe-versions` versions, no evaluation: its start-up (run.json `started` to the first version, less a
   version) and its seconds a version, from metrics.jsonl's times.
2. **Sizing** (`size`, pure): what fits `--minutes` a run. Start-up first; then `--evals` evaluations of the
   held-out split at the probe's seconds a row, halving the held-out problems (down to `--min-held-out`) while
   they would take more than a quarter of what is left; then the versions the rest buys at the target shape,
   at most `--versions`. On a CPU, where a version's cost follows its rows (members x problems) and is scaled
   from the probe's by them, below `--min-versions` it halves the problems a member (down to `--min-batch`),
   then the population (down to `--min-population`). On a GPU it keeps the shape: there a version's cost
   hardly falls with its rows (the first H200 run: 28.2 s a version at 32 x 64, 18-42 s at 32 x 32), so
   halving them buys no versions.
3. **The runs.** ES at the sized shape: low-rank members (`--es-noise lowrank`, rank 4) served a whole
   population in one hf engine call (`--members-per-order` = population), greedy, the `cpu` preset's sigma and
   alpha, the sized versions, evaluated every versions / (evals - 1) versions and at the end, `--max-minutes`
   as a backstop. GRPO with its defaults (8 theorems x 8 samples, T 0.7, lr 1e-5, trainer on the device) for
   the same `--minutes` (`--max-minutes`), evaluated every (minutes - ES's start-up) / evals minutes and at the
   end. Same seed, problems, held-out split, prompt, max_new_tokens and generator precision.

A box's call limit (10 minutes) is shorter than probe and both runs: `--experiment-algos es`, then
`--experiment-algos grpo` in a second call of the same commit and day, which takes the probe and the sizing
from the JSON the first wrote and adds its run to it.

It writes `experiment-<gpu>-<date>.json` (device, versions, the probe, the sizing with its reasons, each run's
figures and curve: samples, wall time, held-out reward and exact per evaluation, samples/s) and `.png`
(held-out reward and exact against samples and wall time) to `--out` (default docs/results/gpu); the runs stay
in `--work`. A run that fails (killed, timed out, exits non-zero) is an `errors` entry, and what its
metrics.jsonl held up to there (its curve and samples, `partial`) stays in `runs`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ops.gpu import full
from streams.run_dir import INFO, read_json, read_records, update_records
from trainer.config import GRPO_BATCH, TrainerSettings
from trainer.curves import curve, plot_runs, samples_used

ROOT = full.ROOT
CPU_PROBE = (4, 8)  # the probe's population x problems on a CPU, where a call's cost follows its rows
EVAL_SHARE = 0.25  # evaluations may take at most this share of a run's time after start-up (halving held-out)
GRPO_SAMPLES = GRPO_BATCH * TrainerSettings.model_fields["group_size"].default  # a GRPO version's, defaults


@dataclass(frozen=True)
class Shape:
    """What the experiment asks for (the targets) or what it runs (the sizing's answer)."""

    population: int
    batch: int
    versions: int
    held_out: int
    evals: int

    @property
    def rows(self) -> int:
        return self.population * self.batch


@dataclass(frozen=True)
class Floors:
    """How far the sizing may shrink a shape that does not fit."""

    versions: int = 10
    population: int = 4
    batch: int = 4
    held_out: int = 16


@dataclass(frozen=True)
class Probe:
    """What the probe run measured: at `population` x `batch`, its start-up and its seconds a version."""

    population: int
    batch: int
    startup_s: float
    version_s: float

    @property
    def row_s(self) -> float:
        return self.version_s / (self.population * self.batch)


def size(
    minutes: float, target: Shape, probe: Probe, floors: Floors = Floors(), follows_rows: bool = True
) -> dict[str, Any]:
    """The shape that fits `minutes` a run (module doc, step 2), with the figures it was decided on and why.
    `follows_rows` (a CPU): a version's cost scales with its rows, so a smaller shape buys versions. False (a
    GPU): it does not (an H200 took 28.2 s a version at 32 x 64 and 18-42 s at 32 x 32, docs/results/gpu/),
    so the shape stays and the versions are what the time buys at the probe's seconds a version."""
    why = []
    left_s = 60 * minutes - probe.startup_s
    held_out = target.held_out
    while target.evals * held_out * probe.row_s > EVAL_SHARE * left_s and held_out > floors.held_out:
        held_out = max(floors.held_out, held_out // 2)
    if held_out != target.held_out:
        why.append(f"held-out {target.held_out} -> {held_out}: {target.evals} evaluations within a quarter of the time")
    eval_s = target.evals * held_out * probe.row_s
    train_s = left_s - eval_s
    population, batch = target.population, target.batch

    def version_cost(p: int, b: int) -> float:
        return p * b * probe.row_s if follows_rows else probe.version_s

    def versions_at(p: int, b: int) -> int:
        return max(0, min(target.versions, math.floor(train_s / version_cost(p, b))))

    while (
        follows_rows
        and versions_at(population, batch) < floors.versions
        and (batch > floors.batch or population > floors.population)
    ):
        if batch > floors.batch:
            batch = max(floors.batch, batch // 2)
        else:
            population = max(floors.population, population // 2)
    if (population, batch) != (target.population, target.batch):
        why.append(
            f"{target.population} x {target.batch} -> {population} x {batch}: {floors.versions} versions at least"
        )
    versions = versions_at(population, batch)
    if versions < target.versions and (population, batch) == (target.population, target.batch):
        why.append(f"{target.versions} versions -> {versions}: what the time buys")
    if not follows_rows and versions < floors.versions:
        why.append(f"shape kept below {floors.versions} versions: on a GPU a version's cost does not follow its rows")
    versions = max(1, versions)
    shape = replace(target, population=population, batch=batch, versions=versions, held_out=held_out)
    version_s = version_cost(population, batch)
    return {
        "shape": asdict(shape),
        "eval_every": eval_every(versions, target.evals),
        "version_s": round(version_s, 3),
        "eval_s": round(held_out * probe.row_s, 3),
        "expected_s": round(probe.startup_s + eval_s + versions * version_s, 1),
        "budget_s": round(60 * minutes, 1),
        "fits": probe.startup_s + eval_s + versions * version_s <= 60 * minutes,
        "why": why or ["the targets fit"],
    }


def eval_every(versions: int, evals: int) -> int:
    """Versions between evaluations so that version 0, every K-th and the last make at most `evals`."""
    return max(1, math.ceil(versions / max(1, evals - 1)))


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--experiment (ops/gpu/experiment.py)")
    g.add_argument("--minutes", type=float, default=5.0, help="each algorithm's wall-clock budget (default 5)")
    g.add_argument("--population", type=int, default=32, help="ES members a version, the target (default 32)")
    g.add_argument("--batch", type=int, default=64, help="problems each ES member answers, the target (default 64)")
    g.add_argument("--versions", type=int, default=100, help="ES versions, the target (default 100)")
    g.add_argument("--held-out", type=int, default=128, help="held-out problems, the target (default 128)")
    g.add_argument("--evals", type=int, default=5, help="evaluations of each run, version 0 and the end included")
    g.add_argument("--max-new-tokens", type=int, default=64, help="tokens an answer may have (default 64)")
    g.add_argument("--prompt-format", default="equation", help="the prompt of both runs (default equation)")
    g.add_argument(
        "--gen-dtype", default="float32", choices=("auto", "float32", "bfloat16"), help="the generators' precision"
    )
    g.add_argument("--seed", type=int, default=0, help="problems, held-out split and member seeds (default 0)")
    g.add_argument(
        "--experiment-algos",
        nargs="+",
        choices=("es", "grpo"),
        default=["es", "grpo"],
        help="the runs of this call (a later call of the same commit and day reuses the probe and sizing)",
    )
    g.add_argument("--probe-versions", type=int, default=2, help="the probe's versions (default 2)")
    g.add_argument(
        "--probe-shape",
        nargs=2,
        type=int,
        default=None,
        metavar=("POPULATION", "BATCH"),
        help=f"the probe's shape (default: the target's on a GPU, {CPU_PROBE[0]} x {CPU_PROBE[1]} on a CPU)",
    )
    g.add_argument("--min-versions", type=int, default=Floors.versions, help="sizing: fewest ES versions")
    g.add_argument("--min-population", type=int, default=Floors.population, help="sizing: smallest population")
    g.add_argument("--min-batch", type=int, default=Floors.batch, help="sizing: fewest problems a member")
    g.add_argument("--min-held-out", type=int, default=Floors.held_out, help="sizing: fewest held-out problems")


def main(args: argparse.Namespace) -> int:
    import transformers

    from weights import device as devices
    from weights.model import resolve_model

    try:
        device = devices.resolve(args.device)
    except devices.NoDevice as e:
        print(f"gpu_check: {e}: the experiment is for a GPU (`--device cpu` rehearses it here)", file=sys.stderr)
        return 2
    resolve_model(None)  # converted once, before the probe's clock starts
    about = devices.describe(device)
    name = re.sub(r"[^a-z0-9]+", "-", str(about.get("gpu", "cpu")).lower()).strip("-")
    work = Path(args.work or ROOT / "runs" / f"gpu-experiment-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out = Path(args.out or ROOT / "docs" / "results" / "gpu") / f"experiment-{name}-{datetime.date.today()}.json"
    target = Shape(args.population, args.batch, args.versions, args.held_out, args.evals)
    floors = Floors(args.min_versions, args.min_population, args.min_batch, args.min_held_out)
    probe_shape = tuple(args.probe_shape or ((args.population, args.batch) if device != "cpu" else CPU_PROBE))
    result: dict[str, Any] = {
        **about,
        "transformers": transformers.__version__,
        "commit": full._commit(),
        "command": " ".join(["python -m ops.gpu_check", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "work": str(work),
        "minutes": args.minutes,
        "target": asdict(target),
        "engine": "hf",
        "gen_dtype": args.gen_dtype,
        "runs": {},
        "errors": {},
    }
    common = ["--seed", str(args.seed), "--max-new-tokens", str(args.max_new_tokens)]
    common += ["--prompt-format", args.prompt_format, "--problems", "1024"]
    env = {**full._env(device)} | ({"PROOFSTREAM_DTYPE": args.gen_dtype} if args.gen_dtype != "auto" else {})
    if earlier := _earlier(out, result):  # a call before this one measured and sized: its runs and sizing stay
        result |= {k: earlier[k] for k in ("probe", "sizing", "runs", "work")} | {"errors": {}}
        probe = Probe(**{k: v for k, v in earlier["probe"].items() if k != "row_s"})
        work = Path(earlier["work"])
        print("gpu_check: experiment: the probe and sizing of an earlier call", file=sys.stderr, flush=True)
    else:
        print(f"gpu_check: experiment: probe, ES {probe_shape[0]} x {probe_shape[1]} ...", file=sys.stderr, flush=True)
        try:
            shown = (args.probe_versions, args.held_out, args.step_timeout_s)
            probe = measure(work / "probe", env, common, *probe_shape, *shown)
        except Exception as e:  # noqa: BLE001 - said in the JSON; without a probe nothing can be sized
            result["errors"]["probe"] = f"{type(e).__name__}: {e}"[-3000:]
            full._write(out, result)
            print(json.dumps(result["errors"]), file=sys.stderr)
            return 1
        sizing = size(args.minutes, target, probe, floors, follows_rows=device == "cpu")
        result |= {"probe": {**asdict(probe), "row_s": round(probe.row_s, 4)}, "sizing": sizing}
    sizing = result["sizing"]
    full._write(out, result)
    print(f"gpu_check: experiment: sized {json.dumps(sizing)}", file=sys.stderr, flush=True)
    shape = Shape(**sizing["shape"])
    common += ["--held-out", str(shape.held_out)]
    grpo_every = round(max(0.05, (args.minutes - probe.startup_s / 60) / args.evals), 3)
    runs = {
        "es": [
            "--algo", "es", "--iterations", str(shape.versions), "--eval-every", str(sizing["eval_every"]),
            "--population", str(shape.population), "--batch", str(shape.batch), "--es-noise", "lowrank",
            "--members-per-order", str(shape.population), "--max-minutes", str(args.minutes),
        ],
        "grpo": [
            "--algo", "grpo", "--iterations", "100000", "--eval-every", "0",
            "--eval-every-minutes", str(grpo_every), "--max-minutes", str(args.minutes), "--train-device", device,
        ],
    }  # fmt: skip
    for algo, flags in runs.items():
        if algo not in args.experiment_algos:
            continue
        print(f"gpu_check: experiment: {algo} for {args.minutes:g} minutes ...", file=sys.stderr, flush=True)
        try:
            result["runs"][algo] = run(algo, work / algo, env, [*common, *flags], args.step_timeout_s)
        except Exception as e:  # noqa: BLE001 - one run's failure is a result too; the other still runs
            result["errors"][algo] = f"{type(e).__name__}: {e}"[-3000:]
            if kept := partial(work / algo, [*common, *flags]):
                result["runs"][algo] = kept
        full._write(out, result)
    plot(result, out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("sizing", "errors")} | {"runs": _short(result["runs"])}))
    print(f"gpu_check: wrote {out} and {out.with_suffix('.png')}; the runs: {work}", file=sys.stderr)
    return 1 if result["errors"] else 0


def _earlier(out: Path, fresh: dict[str, Any]) -> dict[str, Any] | None:
    """The file's result where it is of this commit, device, budget and targets and has a sizing; else None."""
    try:
        earlier = json.loads(out.read_text())
    except (OSError, ValueError):
        return None
    same = all(earlier.get(k) == fresh[k] for k in ("commit", "device", "minutes", "target", "gen_dtype"))
    return earlier if same and "sizing" in earlier and "probe" in earlier else None


def _trainer(run_dir: Path, algo: str, argv: list[str]) -> list[str]:
    out = [sys.executable, "-m", "trainer", *argv, "--task", "countdown", "--run", f"gpu-experiment-{algo}"]
    return out + ["--run-dir", str(run_dir), "--engine", "hf", "--sandbox", "process", "--log-level", "warning"]


def _call(argv: list[str], env: dict[str, str], timeout_s: float, what: str) -> None:
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.startswith("trainer: ")]
        raise RuntimeError(f"{what} exited {done.returncode}: {said[-1:] or done.stderr[-1500:]}")


def measure(
    run_dir: Path,
    env: dict[str, str],
    common: list[str],
    population: int,
    batch: int,
    versions: int,
    held_out: int,
    timeout_s: float,
) -> Probe:
    """The probe (module doc, step 1): ES at `population` x `batch` for `versions` (at least 2), no evaluation."""
    flags = ["--algo", "es", "--iterations", str(max(2, versions)), "--eval-every", "0", "--held-out", str(held_out)]
    flags += ["--population", str(population), "--batch", str(batch), "--es-noise", "lowrank"]
    flags += ["--members-per-order", str(population)]
    _call(_trainer(run_dir, "probe", [*common, *flags]), env, timeout_s, "the probe")
    return probe_figures(run_dir, population, batch)


def probe_figures(run_dir: Path, population: int, batch: int) -> Probe:
    """Start-up and seconds a version from a finished probe's run.json and metrics.jsonl: a version is the
    median time between consecutive versions; start-up, the first version's time from the start less one."""
    started = (read_json(run_dir / INFO) or {}).get("started")
    times = [float(r["time"]) for r in sorted(update_records(read_records(run_dir)), key=lambda r: r["version"])]
    if started is None or len(times) < 2:
        raise RuntimeError(f"{run_dir}: the probe left no start or fewer than two versions")
    version_s = statistics.median(b - a for a, b in zip(times, times[1:], strict=False))
    return Probe(population, batch, round(max(0.0, times[0] - started - version_s), 1), round(version_s, 3))


def run(algo: str, run_dir: Path, env: dict[str, str], argv: list[str], timeout_s: float) -> dict[str, Any]:
    """One run to its end, and what the JSON keeps of it: ops/gpu/full.py's figures, its curve (samples, wall
    time, held-out reward and exact at each evaluation) and its training samples a second."""
    started = time.monotonic()
    _call(_trainer(run_dir, algo, argv), env, timeout_s, f"python -m trainer --algo {algo}")
    figures = full.run_figures(run_dir, time.monotonic() - started)
    kept = _kept(run_dir, argv)
    used = kept["samples"]
    rate = round(used / figures["wall_s"], 2) if used and figures["wall_s"] else None
    return {**figures, "samples": used, "samples_per_s": rate, **kept}


def partial(run_dir: Path, argv: list[str]) -> dict[str, Any] | None:
    """What a run that failed (killed, timed out, exited non-zero) kept in its metrics.jsonl: its curve up to
    there and the training samples its updates used, marked `partial`; None where it wrote no metrics. Its
    error is beside it in the JSON's `errors`."""
    return {"partial": True, **_kept(run_dir, argv)} if read_records(run_dir) else None


def _kept(run_dir: Path, argv: list[str]) -> dict[str, Any]:
    """A run's figures from its metrics.jsonl, finished or not: the training samples its updates used, its
    curve (samples, wall time, held-out reward and exact at each evaluation) and its command."""
    records = read_records(run_dir)
    return {
        "samples": samples_used(records),
        "curve": curve(records, (read_json(run_dir / INFO) or {}).get("started")),
        "command": " ".join(["python -m trainer", *argv]),
    }


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Held-out reward and exact success of both runs against training samples and wall time."""
    labels = {"es": "ES", "grpo": "GRPO"}
    runs = [{"label": labels[a], "curve": r["curve"]} for a, r in result["runs"].items() if r.get("curve")]
    if not runs:
        return None
    title = f"ES vs GRPO for {result['minutes']:g} min each on {result.get('gpu') or result['device']}"
    return plot_runs(runs, path, title, minutes=result["minutes"])


def _short(runs: dict[str, Any]) -> dict[str, Any]:
    keep = ("versions", "samples", "samples_per_s", "wall_s", "held_out_start", "held_out_end")
    return {algo: {k: r.get(k) for k in keep} for algo, r in runs.items()}
