"""The grid of `python -m evals.sweep`: its cells (one `python -m trainer` run each, a configuration and a seed),
which of them a shard runs, and the versions each cell's budget buys (evals/runner.py)."""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass
from pathlib import Path

from evals.runner import plan, samples_per_version

ES_GRID = ("sigma", "alpha", "population", "antithetic", "noise", "rank")  # an ES cell's own list-valued flags
GRPO_GRID = ("lr", "group_size", "temperature")  # a GRPO cell's
SHARED_GRID = ("batch", "curriculum", "problems")
GRID = (*ES_GRID, *GRPO_GRID, *SHARED_GRID)


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
        return samples_per_version(
            self.algo, population=self.population or 0, batch=self.batch, group_size=self.group_size or 0
        )

    def flags(self) -> list[str]:
        out = ["--algo", self.algo, "--batch", str(self.batch), "--curriculum", self.curriculum]
        out += ["--problems", str(self.problems), "--seed", str(self.seed)]
        if self.algo == "grpo":
            out += ["--lr", f"{self.lr:g}", "--group-size", str(self.group_size)]
            return out + ["--temperature", f"{self.temperature:g}"]
        out += ["--sigma", f"{self.sigma:g}", "--alpha", f"{self.alpha:g}", "--population", str(self.population)]
        out += ["--antithetic" if self.antithetic else "--no-antithetic", "--es-noise", self.noise or "full"]
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
