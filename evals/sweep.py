"""`python -m evals.sweep --out DIR [grid flags] [extra trainer flags]`: ES or GRPO over a grid of settings.

The case study's next experiment: "systematic sweeps over sigma, population size, and theorem selection to
understand when ES improves and when it stalls". The grid is the product of the list-valued flags and
`--seeds`: for ES (`--algo es`, the default) `--sigma`, `--alpha`, `--population`, `--antithetic on off`,
`--noise full lowrank` and `--rank` (lowrank cells only);
for GRPO (`--algo grpo`) `--lr`, `--group-size`, `--temperature`; for both `--batch`, `--curriculum`,
`--problems`. Each cell is one `python -m trainer` run with its own run id (`<out name>-<cell key>`) and run
directory (`DIR/cells/<cell key>`), evaluated greedily on the held-out split at version 0, every
`--eval-every` versions and at the end. Unset lists default to the trainer's defaults (the ES `cpu` preset).

Where the cells run:
- by default, one after another here, each trainer with its local pipeline (its own embedded Redis in its
  run directory, generator and verifier children): nothing to set up;
- `--shard I/N` runs only every N-th cell from the I-th (0-based): N machines with the same command and
  `--out` on shared storage (or merged afterwards) sweep the grid at once, each with local pipelines;
- `--redis-url URL`: the trainers use that Redis and start no children; the roles run elsewhere, pointed at
  a cell's run with `--run <run id>` (`python -m producers --run ID --redis-url URL`, `arq workers.verifier`
  with `PROOFSTREAM_RUN=ID`): the sweep prints each cell's run id as it starts it (`--plan` prints them all
  without running anything).

Resumable: a cell whose run finished (its `cell.json` says exit 0) is not run again, so a sweep cut short is
finished by the same command; a cell cut short resumes from its checkpoint (the trainer's own resume). It says
how many versions it will run, an estimate once the first is done and an ETA after each (evals/eta.py).

Budget: `--iterations` versions a cell, or `--samples N` training samples a cell (each cell gets the versions
they buy at its cost a version, evaluated at `--eval-points` even steps): cells that differ in population or
batch are then compared at equal samples, as `evals.es_vs_grpo` compares the algorithms.

Output in DIR: `sweep.csv` (a row per cell), `sweep.md` (per configuration over its seeds: held-out reward at
the start and the end, the gain's mean and spread, exact success, samples, wall time) and `sweep.png`
(held-out reward against training samples, a line per configuration: the mean over seeds, the band their
min-max). Last line of output: one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evals import plots
from evals.eta import Eta
from evals.runner import INTERRUPTED, endpoints, outcome, plan, run_one, samples_per_version
from streams.run_dir import read_json
from streams.settings import DefaultsFormatter
from trainer.config import PRESETS, TrainerSettings
from trainer.loop import FINISHED_BEFORE
from trainer.plots import pyplot
from trainer.result import duration

ES_GRID = ("sigma", "alpha", "population", "antithetic", "noise", "rank")  # an ES cell's own list-valued flags
GRPO_GRID = ("lr", "group_size", "temperature")  # a GRPO cell's
SHARED_GRID = ("batch", "curriculum", "problems")
GRID = (*ES_GRID, *GRPO_GRID, *SHARED_GRID)
OWNED = ("--algo", "--run", "--run-dir", "--iterations", "--eval-every", "--seed", "--group-size",
         *(f"--{k}" for k in GRID), "--no-antithetic", "--es-noise", "--es-rank")  # fmt: skip
CELL = "cell.json"  # in a cell's run directory: its result; exit 0 there means the cell is done
CSV_COLUMNS = ("key", "config", "algo", *GRID, "seed", "returncode", "versions", "samples_used", "reward_start",
               "reward_end", "gain", "exact_start", "exact_end", "wall_s", "run")  # fmt: skip


@dataclass(frozen=True)
class Cell:
    """One run of the grid. An ES cell leaves the GRPO fields None, and the other way round."""

    algo: str
    batch: int
    curriculum: str
    problems: int
    seed: int
    sigma: float | None = None
    alpha: float | None = None
    population: int | None = None
    antithetic: bool | None = None
    noise: str | None = None  # ES members' noise: full (seed-history ES) or lowrank (EGGROLL)
    rank: int | None = None  # lowrank: r of each member's A B^T
    lr: float | None = None
    group_size: int | None = None
    temperature: float | None = None

    @property
    def config(self) -> str:
        """The cell's settings without its seed: the cells of one configuration differ only by seed."""
        shared = f"b{self.batch}-{self.curriculum}-n{self.problems}"
        if self.algo == "grpo":
            return f"grpo-lr{self.lr:g}-g{self.group_size}-t{self.temperature:g}-{shared}"
        pairs = "-anti" if self.antithetic else ""
        lowrank = f"-lowrank-r{self.rank}" if self.noise == "lowrank" else ""  # full: the keys sweeps always had
        return f"s{self.sigma:g}-a{self.alpha:g}-p{self.population}{pairs}{lowrank}-{shared}"

    @property
    def key(self) -> str:
        return f"{self.config}-seed{self.seed}"

    @property
    def samples_per_version(self) -> int:
        return samples_per_version(self.algo, population=self.population or 0, batch=self.batch,
                                   group_size=self.group_size or 0)  # fmt: skip

    def flags(self) -> list[str]:
        out = ["--algo", self.algo, "--batch", str(self.batch), "--curriculum", self.curriculum,
               "--problems", str(self.problems), "--seed", str(self.seed)]  # fmt: skip
        if self.algo == "grpo":
            return out + ["--lr", f"{self.lr:g}", "--group-size", str(self.group_size),
                          "--temperature", f"{self.temperature:g}"]  # fmt: skip
        out += ["--sigma", f"{self.sigma:g}", "--alpha", f"{self.alpha:g}", "--population", str(self.population),
                "--antithetic" if self.antithetic else "--no-antithetic",
                "--es-noise", self.noise or "full"]  # fmt: skip
        return out + (["--es-rank", str(self.rank)] if self.noise == "lowrank" else [])


def cells(args: argparse.Namespace) -> list[Cell]:
    """The grid, per algorithm, in a stable order (seeds innermost, so a cut-short sweep has whole
    configurations first)."""
    out: list[Cell] = []
    for algo in args.algo:
        own = ES_GRID if algo == "es" else GRPO_GRID
        lists = [getattr(args, k) for k in own] + [getattr(args, k) for k in SHARED_GRID] + [args.seeds]
        for values in itertools.product(*lists):
            named = dict(zip((*own, *SHARED_GRID, "seed"), values, strict=True))
            if named.get("noise") == "full":
                named["rank"] = None  # full-rank members have no rank: one cell, whatever --rank lists
            if (cell := Cell(algo=algo, **named)) not in out:
                out.append(cell)
    return out


def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{value!r}: on or off")
    return value == "on"


def shard(todo: list[Cell], spec: str) -> list[Cell]:
    """`I/N`: every N-th cell from the I-th."""
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard {spec!r}: expected I/N, e.g. 0/2") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {spec!r}: I must be in 0..N-1")
    return todo[i::n]


def budget_of(cell: Cell, args: argparse.Namespace) -> tuple[int, int]:
    """(versions, evaluate every) of a cell: `--iterations` and `--eval-every` as given, or with `--samples`
    the versions those samples buy at the cell's cost a version, evaluated at `--eval-points` even steps."""
    if args.samples is None:
        return args.iterations, args.eval_every
    p = plan(cell.algo, args.samples, cell.samples_per_version, args.eval_points)
    return p.iterations, p.eval_every


def run_id(out: Path, cell: Cell) -> str:
    return f"{out.name}-{cell.key}"


def cell_result(cell: Cell, run_dir: Path, run: str, argv: list[str], code: int, wall_s: float) -> dict[str, Any]:
    done = outcome(run_dir, wall_clock=False)
    return {"cell": {**cell.__dict__, "key": cell.key, "config": cell.config}, "run": run, "command": argv,
            "returncode": code, "wall_s": wall_s, "versions": done["versions"], "samples_used": done["samples_used"],
            "curve": done["curve"]}


def finished(run_dir: Path) -> dict[str, Any] | None:
    """The cell's result if its run finished (exit 0), else None (never run, cut short, or failed)."""
    doc = read_json(run_dir / CELL) or {}
    return doc if doc.get("returncode") == 0 else None


# -- tables and plot ---------------------------------------------------------------------------------------


def row(result: dict[str, Any]) -> dict[str, Any]:
    c, ends = result["cell"], endpoints(result["curve"])
    return {
        "key": c["key"], "config": c["config"], "algo": c.get("algo", "es"), **{k: c.get(k) for k in GRID},
        "seed": c["seed"],
        "returncode": result["returncode"], "versions": result["versions"], "samples_used": result["samples_used"],
        **ends, "gain": None if ends["gain"] is None else round(ends["gain"], 6),
        "wall_s": result["wall_s"], "run": result["run"],
    }  # fmt: skip


def to_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def markdown(rows: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    """Per configuration, over its seeds: mean ± sample standard deviation (n-1)."""
    lines = [f"# Sweep: {settings['out']}", "",
             "Held-out: greedy decoding of the policy (the ES center) on the held-out split; reward is the "
             "verifier's shaped credit, exact the share solved. gain = end - start, per seed, then mean ± std over "
             "seeds.", "",
             "| configuration | seeds | reward start | reward end | gain | exact end | versions | samples | wall |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for config, group in itertools.groupby(sorted(rows, key=lambda r: (r["config"], r["seed"])),
                                           key=lambda r: r["config"]):  # fmt: skip
        group = [r for r in group if r["returncode"] == 0]
        if not group:
            continue
        pick = [r for r in group if r["gain"] is not None]
        lines.append(
            f"| {config} | {len(group)} | {_spread([r['reward_start'] for r in pick])} | "
            f"{_spread([r['reward_end'] for r in pick])} | {_spread([r['gain'] for r in pick])} | "
            f"{_spread([r['exact_end'] for r in pick if r['exact_end'] is not None])} | "
            f"{max((r['versions'] or 0) for r in group)} | {max((r['samples_used'] or 0) for r in group)} | "
            f"{duration(statistics.fmean(r['wall_s'] for r in group))} |"
        )
    lines += ["", "Command: `python -m evals.sweep " + " ".join(settings["argv"]) + "`", ""]
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> Path | None:
    if (plt := pyplot()) is None:
        return None
    by_config: dict[str, list[list[dict[str, Any]]]] = {}
    for r in results:
        if r["returncode"] == 0 and r["curve"]:
            by_config.setdefault(r["cell"]["config"], []).append(r["curve"])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for config, curves in sorted(by_config.items()):
        plots.mean_band(ax, curves, f"{config} ({len(curves)} seeds)")
    title = "Sweep: mean over seeds, band = min-max"
    return plots.finish(fig, ax, path, title, "held-out reward (shaped, greedy)", legend_size=7)


def write(out: Path, results: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    rows = [row(r) for r in results]
    (out / "sweep.csv").write_text(to_csv(rows))
    (out / "sweep.md").write_text(markdown(rows, settings))
    (out / "sweep.json").write_bytes(orjson.dumps({"settings": settings, "cells": results}, option=orjson.OPT_INDENT_2))
    plot(results, out / "sweep.png")


# -- the command ---------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m evals.sweep", description=__doc__.split("\n\n")[1],
                                epilog="Any other flag goes to every `python -m trainer` run.",
                                formatter_class=DefaultsFormatter)  # fmt: skip
    p.add_argument("--out", required=True, help="the sweep's folder: cells, tables, plot (resumes what it holds)")
    p.add_argument("--algo", nargs="+", default=["es"], choices=("es", "grpo"),
                   help="es: a cell per sigma x alpha x population x antithetic x noise (x rank); grpo: per lr x "
                   "group size x temperature; either times batch x curriculum x problems x seeds")  # fmt: skip
    cpu, trainer = PRESETS["cpu"], TrainerSettings.model_fields
    p.add_argument("--sigma", type=float, nargs="+", default=[cpu["sigma"]], help="ES (default: the cpu preset's)")
    p.add_argument("--alpha", type=float, nargs="+", default=[cpu["alpha"]], help="ES (default: the cpu preset's)")
    p.add_argument("--population", type=int, nargs="+", default=[cpu["population"]], help="ES members a version")
    p.add_argument("--antithetic", nargs="+", default=[cpu["antithetic"]], type=_on_off, metavar="on|off",
                   help="ES: mirrored pairs (+eps, -eps) or independent members")  # fmt: skip
    p.add_argument("--noise", nargs="+", default=[trainer["es_noise"].default], choices=("full", "lowrank"),
                   help="ES noise (--es-noise): full, every tensor; lowrank, a rank-r A B^T a matrix")  # fmt: skip
    p.add_argument("--rank", type=int, nargs="+", default=[trainer["es_rank"].default],
                   help="lowrank ES: r of each member's A B^T (--es-rank)")  # fmt: skip
    p.add_argument("--lr", type=float, nargs="+", default=[trainer["lr"].default], help="GRPO's learning rate")
    p.add_argument("--group-size", dest="group_size", type=int, nargs="+", default=[trainer["group_size"].default],
                   help="GRPO: samples per theorem")  # fmt: skip
    p.add_argument("--temperature", type=float, nargs="+", default=[trainer["temperature"].default],
                   help="GRPO's sampling temperature (ES members: es_temperature, greedy by default)")  # fmt: skip
    p.add_argument("--batch", type=int, nargs="+", default=[cpu["batch"]],
                   help="problems every ES member answers; theorems (groups) per GRPO step")  # fmt: skip
    p.add_argument("--curriculum", nargs="+", default=["easy"], choices=("easy", "ramp", "none"),
                   help="Countdown's problems: easy = 2-3 numbers, + - * only")  # fmt: skip
    p.add_argument("--problems", type=int, nargs="+", default=[256], help="Countdown training problems")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="a cell per seed of each configuration")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--iterations", type=int, default=10, help="policy versions per cell")
    budget.add_argument("--samples", type=int,
                        help="training samples per cell instead: each cell gets as many versions as they buy (ES: "
                        "population x batch a version; GRPO: batch x group size), so cells that differ in "
                        "population or batch compare at equal samples")  # fmt: skip
    p.add_argument("--eval-every", type=int, default=5, help="held-out evaluation every this many versions")
    p.add_argument(
        "--eval-points",
        type=int,
        default=4,
        help="with --samples: evaluations besides version 0, spread evenly over each cell's versions",
    )
    p.add_argument("--shard", default="0/1", help="I/N: run every N-th cell from the I-th")
    p.add_argument("--plan", action="store_true", help="print the cells and their run ids, run nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, extra = parser().parse_known_args(argv)
    clash = [a for a in extra if a.split("=", 1)[0] in OWNED]
    try:
        todo = shard(cells(args), args.shard)
        budgets = {cell.key: budget_of(cell, args) for cell in todo}
    except ValueError as e:
        clash.append(str(e))
    if clash:
        print(f"sweep: set by the sweep (use its own flags): {' '.join(clash)}", file=sys.stderr)
        return 2
    out = Path(args.out).expanduser()
    if args.plan:
        for cell in todo:
            print(f"{cell.key}\t{run_id(out, cell)}\t{budgets[cell.key][0]} versions")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    settings = {"out": str(out), "argv": argv, "iterations": args.iterations, "samples": args.samples, "extra": extra}
    results, ran, skipped, started, ok = [], 0, 0, time.monotonic(), True
    eta = Eta("sweep", sum(budgets[c.key][0] for c in todo if finished(out / "cells" / c.key) is None))
    print(f"sweep: {eta.total} versions to run in {len(todo)} cells (less those finished before); an estimate "
          "follows the first version", file=sys.stderr)  # fmt: skip
    for cell in todo:
        run_dir, run = out / "cells" / cell.key, run_id(out, cell)
        if (done := finished(run_dir)) is not None:
            results.append(done)
            skipped += 1
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        iterations, eval_every = budgets[cell.key]
        command = [sys.executable, "-m", "trainer", *cell.flags(), "--iterations", str(iterations),
                   "--eval-every", str(eval_every), "--run", run, "--run-dir", str(run_dir), *extra]  # fmt: skip
        print(f"sweep: cell {cell.key}: run {run}; log {run_dir / 'trainer.log'}", file=sys.stderr)
        eta.start(run_dir)
        code, wall_s = run_one(command, {**os.environ}, run_dir / "trainer.log", tick=eta.tick)
        eta.done()
        code = 0 if code == FINISHED_BEFORE else code  # it finished before its cell.json was written: read it
        result = cell_result(cell, run_dir, run, command, code, wall_s)
        (run_dir / CELL).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        results.append(result)
        ran += 1
        ok = ok and code == 0
        write(out, results, settings)  # after every cell: a sweep cut short keeps its table
        if code in INTERRUPTED:
            print("sweep: stopped", file=sys.stderr)
            break
    write(out, results, settings)
    print(json.dumps({"out": str(out), "cells": len(todo), "ran": ran, "skipped": skipped, "ok": ok,
                      "wall_s": round(time.monotonic() - started, 1)}))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
