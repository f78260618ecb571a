"""`python -m ops compare R1 R2 ...`: finished (or live) runs side by side, from their directories (no Redis):
their rows as `ops runs` shows them, the settings on which they differ, each one's best held-out evaluation,
one plot of held-out reward and exact success against training samples and wall time (trainer/curves.py), and
how to open the same runs in MLflow's UI or TensorBoard.

It compares runs that exist; the experiment that trains ES and GRPO at one budget to compare them is
`python -m evals.es_vs_grpo`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ops.views import text
from ops.views.runs import find, from_dir, no_run
from streams.run_dir import MLFLOW, TENSORBOARD, holds_run, read_json, read_records
from trainer.curves import curve, plot_runs

PLOT = "compare.png"  # in --dir, unless --plot names another file


def resolve(name: str, folder: Path) -> Path:
    """A run named on the command line: a directory path, else a folder under `folder` (runs/<name>)."""
    path = Path(name).expanduser()
    return path if path.is_dir() else folder / name


def expand(paths: list[Path]) -> list[Path]:
    """The run directories named: a run's own folder as it is, a folder of runs (a published comparison,
    docs/results/compare-countdown-1024) as the runs it holds."""
    out = []
    for path in paths:
        inside = [path] if holds_run(path) else sorted(find(path)) if path.is_dir() else []
        if not inside:
            raise FileNotFoundError(no_run(path) if path.is_dir() else f"{path} holds no run: it does not exist")
        out += inside
    return out


def labels(run_dirs: list[Path]) -> list[str]:
    """Each run's shortest name that tells it from the others: its folder's name, else as many of its path's
    last parts as it takes (seed0/grpo against seed1/grpo)."""
    for n in range(1, max(len(p.parts) for p in run_dirs) + 1):
        names = ["/".join(p.parts[-n:]) for p in run_dirs]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in run_dirs]


def compare(run_dirs: list[Path]) -> dict[str, Any]:
    """The runs' results and held-out curves, the settings they all record and differ in, and where their
    MLflow runs and TensorBoard logs are."""
    runs = []
    run_dirs = expand(run_dirs)
    for run_dir, name in zip(run_dirs, labels(run_dirs), strict=True):
        r = from_dir(run_dir, with_answers=True)
        r["name"] = name
        r["curve"] = curve(read_records(run_dir), r["started"])
        r["mlflow"] = read_json(run_dir / MLFLOW)
        r["tensorboard"] = str(run_dir / TENSORBOARD) if (run_dir / TENSORBOARD).is_dir() else None
        runs.append(r)
    # A setting one algorithm has and another lacks (ES's sigma, GRPO's lr) is no difference between them.
    keys = [k for k in runs[0]["settings"] if all(r["settings"].get(k) is not None for r in runs)]
    differ = {k: [r["settings"][k] for r in runs] for k in keys if len({repr(r["settings"][k]) for r in runs}) > 1}
    for attribute in ("algo", "task", "model"):
        values = [r[attribute] for r in runs]
        if len(set(values)) > 1:
            differ[attribute] = values
    return {"runs": runs, "differ": differ}


def elsewhere(runs: list[dict[str, Any]]) -> list[str]:
    """How to open the same comparison in MLflow's UI (runs logged there) or TensorBoard (their event files)."""
    lines = []
    stores: dict[tuple[str, str], list[str]] = {}
    for r in runs:
        if r.get("mlflow"):
            stores.setdefault((r["mlflow"]["uri"], r["mlflow"].get("experiment", "")), []).append(r["mlflow"]["run_id"])
    for (uri, experiment), ids in stores.items():
        lines.append(
            f"MLflow: `mlflow ui --backend-store-uri {uri}`, experiment {experiment!r}: tick runs "
            f"{', '.join(ids)} and press Compare"
        )
    boards = [f"{r['name']}:{r['tensorboard']}" for r in runs if r.get("tensorboard")]
    if len(boards) > 1:
        lines.append(f"TensorBoard: `tensorboard --logdir_spec {','.join(boards)}`")
    return lines


def cmd_compare(args: argparse.Namespace) -> int:
    folder = Path(args.dir).expanduser()
    try:
        data = compare([resolve(name, folder) for name in args.runs])
    except FileNotFoundError as e:
        return text.fail(str(e), 2)
    path = Path(args.plot).expanduser() if args.plot else (folder if folder.is_dir() else Path()) / PLOT
    title = "held-out reward and exact success: " + ", ".join(r["name"] for r in data["runs"])
    plotted = plot_runs([{"label": r["name"], "curve": r["curve"]} for r in data["runs"]], path, title)
    data |= {"plot": str(plotted) if plotted else None, "elsewhere": elsewhere(data["runs"])}
    text.emit(args, data, text.compare)
    return 0
