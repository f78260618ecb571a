"""`python -m evals.sweep`: the grid, sharding, the tables from cell results, resuming, and one tiny real cell
(the trainer with its local pipeline and the hf engine, a handful of tokens) that a second run skips."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from evals import sweep, sweep_grid, sweep_report

ROOT = Path(__file__).resolve().parents[2]


def _args(*argv: str):
    args, extra = sweep.parser().parse_known_args(["--out", "x", *argv])
    return args


def test_the_grid_is_the_product_of_the_lists_with_seeds_innermost_and_shards_split_it():
    todo = sweep_grid.cells(_args("--sigma", "0.001", "0.003", "--population", "4", "8", "--seeds", "0", "1"))
    assert len(todo) == 2 * 2 * 2
    assert [c.seed for c in todo[:2]] == [0, 1] and todo[0].config == todo[1].config
    assert todo[0].key == "s0.001-a0.002-p4-anti-b16-easy-n256-seed0"
    assert len({c.key for c in todo}) == 8
    halves = sweep_grid.shard(todo, "0/2") + sweep_grid.shard(todo, "1/2")
    assert sorted(c.key for c in halves) == sorted(c.key for c in todo)
    with pytest.raises(ValueError):
        sweep_grid.shard(todo, "2/2")


def test_grpo_cells_cross_their_own_lists_and_pass_their_own_flags():
    argv = ["--algo", "es", "grpo", "--antithetic", "on", "off", "--lr", "1e-5", "3e-5"]
    argv += ["--group-size", "4", "--seeds", "0"]
    todo = sweep_grid.cells(_args(*argv))
    es, grpo = [c for c in todo if c.algo == "es"], [c for c in todo if c.algo == "grpo"]
    assert [c.antithetic for c in es] == [True, False] and len(grpo) == 2
    assert grpo[1].key == "grpo-lr3e-05-g4-t0.7-b16-easy-n256-seed0"  # T: the trainer's default
    flags = grpo[1].flags()
    assert flags[flags.index("--lr") + 1] == "3e-05" and flags[flags.index("--group-size") + 1] == "4"
    assert "--sigma" not in flags and "--no-antithetic" in es[1].flags() and "--antithetic" in es[0].flags()
    with pytest.raises(SystemExit):
        _args("--antithetic", "maybe")


def test_lowrank_cells_cross_their_ranks_and_full_cells_are_one_whatever_the_ranks():
    todo = sweep_grid.cells(_args("--noise", "full", "lowrank", "--rank", "1", "16", "--seeds", "0"))
    assert [(c.noise, c.rank) for c in todo] == [("full", None), ("lowrank", 1), ("lowrank", 16)]
    assert todo[0].key == "s0.001-a0.002-p8-anti-b16-easy-n256-seed0"  # a full cell keeps the key sweeps had
    assert todo[2].key == "s0.001-a0.002-p8-anti-lowrank-r16-b16-easy-n256-seed0"
    full, _, r16 = (c.flags() for c in todo)
    assert full[full.index("--es-noise") + 1] == "full" and "--es-rank" not in full
    assert r16[r16.index("--es-noise") + 1] == "lowrank" and r16[r16.index("--es-rank") + 1] == "16"
    assert sweep.main(["--out", "x", "--es-rank", "2"]) == 2  # the sweep's own flag, refused as a pass-through


def test_a_samples_budget_gives_each_cell_the_versions_it_buys_at_its_own_cost():
    args = _args("--population", "4", "16", "--batch", "8", "--samples", "1024", "--eval-points", "2", "--seeds", "0")
    budgets = {c.population: sweep_grid.budget_of(c, args) for c in sweep_grid.cells(args)}
    assert budgets == {4: (32, 16), 16: (8, 4)}  # 1024 / (4 x 8) versions, evaluated every half of them
    grpo = sweep_grid.cells(_args("--algo", "grpo", "--group-size", "4", "--batch", "8", "--samples", "100"))[0]
    assert sweep_grid.budget_of(grpo, _args("--samples", "100", "--eval-points", "1")) == (3, 3)  # 100 // 32
    assert sweep_grid.budget_of(grpo, _args("--iterations", "7", "--eval-every", "2")) == (7, 2)
    with pytest.raises(SystemExit):  # one budget or the other
        _args("--samples", "100", "--iterations", "3")
    refused = subprocess.run(
        [sys.executable, "-m", "evals.sweep", "--out", "x", "--plan", "--population", "64", "--samples", "100"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "buys no version" in refused.stderr


def _result(config: dict, seed: int, start: float, end: float, code: int = 0) -> dict:
    cell = sweep_grid.Cell(seed=seed, **config)
    return {
        "cell": {**cell.__dict__, "key": cell.key, "config": cell.config},
        "run": f"r-{cell.key}",
        "command": [],
        "returncode": code,
        "wall_s": 60.0,
        "versions": 4,
        "samples_used": 256,
        "curve": [
            {"version": 0, "samples": 0, "held_out_reward": start, "held_out_exact": 0.0},
            {"version": 4, "samples": 256, "held_out_reward": end, "held_out_exact": 0.25},
        ],
    }


def test_tables_give_each_configurations_mean_and_spread_over_its_seeds(tmp_path):
    a = {
        "algo": "es",
        "sigma": 0.001,
        "alpha": 0.0005,
        "population": 8,
        "antithetic": False,
        "batch": 16,
        "curriculum": "easy",
        "problems": 256,
    }
    b = {**a, "sigma": 0.003}
    results = [
        _result(a, 0, 0.10, 0.20),
        _result(a, 1, 0.10, 0.30),
        _result(a, 2, 0.10, 0.40),
        _result(b, 0, 0.10, 0.10),
        _result(b, 1, 0.10, 0.5, code=1),
    ]
    sweep_report.write(tmp_path, results, {"out": str(tmp_path), "argv": ["--out", "x"], "iterations": 4, "extra": []})
    rows = list(csv.DictReader(io.StringIO((tmp_path / "sweep.csv").read_text())))
    assert tuple(rows[0]) == sweep_report.CSV_COLUMNS and len(rows) == 5
    assert [round(float(r["gain"]), 6) for r in rows[:3]] == [0.1, 0.2, 0.3]
    md = (tmp_path / "sweep.md").read_text()
    # gains 0.1, 0.2, 0.3: mean 0.2, sample std 0.1; the failed cell of b is left out of its line
    assert "| s0.001-a0.0005-p8-b16-easy-n256 | 3 | 0.100 ± 0.000 | 0.300 ± 0.100 | 0.200 ± 0.100 |" in md
    assert "| s0.003-a0.0005-p8-b16-easy-n256 | 1 | 0.100 | 0.100 | 0.000 |" in md
    assert "| 0.250 | 4 | 256 | 1 min 00 s |" in md  # exact at the end, versions, samples, wall
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_flags_the_sweep_owns_are_refused(capsys):
    assert sweep.main(["--out", "x", "--sigma", "0.001", "--run", "mine"]) == 2
    assert "--run" in capsys.readouterr().err


def test_plan_prints_each_cells_run_id_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "sw"
    assert sweep.main(["--out", str(out), "--seeds", "0", "1", "--plan"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    expected = [f"sw-s0.001-a0.002-p8-anti-b16-easy-n256-seed{s}" for s in (0, 1)]
    assert [line.split("\t")[1] for line in lines] == expected
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_tiny_real_cell_runs_and_a_second_sweep_skips_it(tmp_path):
    out = tmp_path / "sw"
    argv = [sys.executable, "-m", "evals.sweep", "--out", str(out), "--population", "2", "--batch", "2"]
    argv += ["--problems", "6", "--seeds", "0", "--iterations", "1", "--eval-every", "1", "--held-out", "2"]
    argv += ["--max-new-tokens", "8", "--engine", "hf", "--quorum", "1"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=840)
    logs = "".join(p.read_text()[-3000:] for p in out.glob("cells/*/trainer.log"))
    assert done.returncode == 0, done.stderr[-3000:] + logs
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert (line["cells"], line["ran"], line["skipped"], line["ok"]) == (1, 1, 0, True)
    [cell] = out.glob("cells/*/cell.json")
    result = orjson.loads(cell.read_bytes())
    assert [p["version"] for p in result["curve"]] == [0, 1] and result["samples_used"] == 2 * 2
    assert (out / "sweep.png").exists() and "| s0.001-a0.002-p2-anti-b2-easy-n6 | 1 |" in (out / "sweep.md").read_text()
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    line = json.loads(again.stdout.strip().splitlines()[-1])
    assert (line["ran"], line["skipped"]) == (0, 1)  # the finished cell is not run again
