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

The grid and each cell's budget: evals/sweep_grid.py. Output in DIR (evals/sweep_report.py): `sweep.csv` (a row
per cell), `sweep.md` (per configuration over its seeds: held-out reward at the start and the end, the gain's
mean and spread, exact success, samples, wall time) and `sweep.png` (held-out reward against training samples,
a line per configuration: the mean over seeds, the band their min-max). Last line of output: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from evals import publish, sweep_report
from evals.eta import Eta
from evals.runner import INTERRUPTED, outcome, run_one
from evals.sweep_grid import GRID, Cell, budget_of, cells, run_id, shard
from streams.run_dir import read_json
from streams.settings import DefaultsFormatter
from trainer.config import PRESETS, TrainerSettings
from trainer.run_state import FINISHED_BEFORE

OWNED = (
    "--algo",
    "--run",
    "--run-dir",
    "--iterations",
    "--eval-every",
    "--seed",
    "--group-size",
    *(f"--{k}" for k in GRID),
    "--no-antithetic",
    "--es-noise",
    "--es-rank",
)
CELL = "cell.json"  # in a cell's run directory: its result; exit 0 there means the cell is done


def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{value!r}: on or off")
    return value == "on"


def cell_result(cell: Cell, run_dir: Path, run: str, argv: list[str], code: int, wall_s: float) -> dict[str, Any]:
    done = outcome(run_dir, wall_clock=False)
    return {
        "cell": {**cell.__dict__, "key": cell.key, "config": cell.config},
        "run": run,
        "command": argv,
        "returncode": code,
        "wall_s": wall_s,
        "versions": done["versions"],
        "samples_used": done["samples_used"],
        "curve": done["curve"],
    }


def finished(run_dir: Path) -> dict[str, Any] | None:
    """The cell's result if its run finished (exit 0), else None (never run, cut short, or failed)."""
    doc = read_json(run_dir / CELL) or {}
    return doc if doc.get("returncode") == 0 else None


# -- the command ---------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m evals.sweep",
        description=__doc__.split("\n\n")[1],
        epilog="Any other flag goes to every `python -m trainer` run.",
        formatter_class=DefaultsFormatter,
    )
    p.add_argument("--out", required=True, help="the sweep's folder: cells, tables, plot (resumes what it holds)")
    p.add_argument(
        "--algo",
        nargs="+",
        default=["es"],
        choices=("es", "grpo"),
        help="es: a cell per sigma x alpha x population x antithetic x noise (x rank); grpo: per lr x "
        "group size x temperature; either times batch x curriculum x problems x seeds",
    )
    cpu, trainer = PRESETS["cpu"], TrainerSettings.model_fields
    p.add_argument("--sigma", type=float, nargs="+", default=[cpu["sigma"]], help="ES (default: the cpu preset's)")
    p.add_argument("--alpha", type=float, nargs="+", default=[cpu["alpha"]], help="ES (default: the cpu preset's)")
    p.add_argument("--population", type=int, nargs="+", default=[cpu["population"]], help="ES members a version")
    p.add_argument(
        "--antithetic",
        nargs="+",
        default=[cpu["antithetic"]],
        type=_on_off,
        metavar="on|off",
        help="ES: mirrored pairs (+eps, -eps) or independent members",
    )
    p.add_argument(
        "--noise",
        nargs="+",
        default=[trainer["es_noise"].default],
        choices=("full", "lowrank"),
        help="ES noise (--es-noise): full, every tensor; lowrank, a rank-r A B^T a matrix",
    )
    p.add_argument(
        "--rank",
        type=int,
        nargs="+",
        default=[trainer["es_rank"].default],
        help="lowrank ES: r of each member's A B^T (--es-rank)",
    )
    p.add_argument("--lr", type=float, nargs="+", default=[trainer["lr"].default], help="GRPO's learning rate")
    p.add_argument(
        "--group-size",
        dest="group_size",
        type=int,
        nargs="+",
        default=[trainer["group_size"].default],
        help="GRPO: samples per theorem",
    )
    p.add_argument(
        "--temperature",
        type=float,
        nargs="+",
        default=[trainer["temperature"].default],
        help="GRPO's sampling temperature (ES members: es_temperature, greedy by default)",
    )
    p.add_argument(
        "--batch",
        type=int,
        nargs="+",
        default=[cpu["batch"]],
        help="problems every ES member answers; theorems (groups) per GRPO step",
    )
    p.add_argument(
        "--curriculum",
        nargs="+",
        default=["easy"],
        choices=("easy", "ramp", "none"),
        help="Countdown's problems: easy = 2-3 numbers, + - * only",
    )
    p.add_argument("--problems", type=int, nargs="+", default=[256], help="Countdown training problems")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="a cell per seed of each configuration")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--iterations", type=int, default=10, help="policy versions per cell")
    budget.add_argument(
        "--samples",
        type=int,
        help="training samples per cell instead: each cell gets as many versions as they buy (ES: "
        "population x batch a version; GRPO: batch x group size), so cells that differ in "
        "population or batch compare at equal samples",
    )
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
    print(
        f"sweep: {eta.total} versions to run in {len(todo)} cells (less those finished before); an estimate "
        "follows the first version",
        file=sys.stderr,
    )
    for cell in todo:
        run_dir, run = out / "cells" / cell.key, run_id(out, cell)
        if (done := finished(run_dir)) is not None:
            results.append(done)
            skipped += 1
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        iterations, eval_every = budgets[cell.key]
        command = [sys.executable, "-m", "trainer", *cell.flags(), "--iterations", str(iterations)]
        command += ["--eval-every", str(eval_every), "--run", run, "--run-dir", str(run_dir), *extra]
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
        sweep_report.write(out, results, settings)  # after every cell: a sweep cut short keeps its table
        if code in INTERRUPTED:
            print("sweep: stopped", file=sys.stderr)
            break
    sweep_report.write(out, results, settings)
    print(f"sweep: {publish.hint(out)}", file=sys.stderr)
    print(
        json.dumps(
            {
                "out": str(out),
                "cells": len(todo),
                "ran": ran,
                "skipped": skipped,
                "ok": ok,
                "wall_s": round(time.monotonic() - started, 1),
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
