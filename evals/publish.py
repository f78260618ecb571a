"""`python -m evals.publish OUT docs/results/NAME`: a comparison's or a sweep's folder, published as runs.

`evals.es_vs_grpo` (OUT/seed<K>/<algo>/) and `evals.sweep` (DIR/cells/<cell>/) keep a whole run directory per
run: its own files (run.json, report.json, metrics.jsonl, plots) beside its samples, Redis data, logs and
weights. Publishing copies the light part, keeping the structure: every run's own files (streams/run_dir.py,
never its PARTS: samples/, redis/, logs/, policy/, checkpoints/, tensorboard/) and the experiment's tables,
JSON and plots (compare.*, sweep.*, cell.json, README.md). `python -m ops runs`, `ops run --run-dir`, `ops
compare` and the dashboard then open the published folder as they open runs/.

`--convert DIR`, for results published before the runs' files were kept: each per-seed compare.json (its
`algos.<algo>.command` and `curve`) and sweep.json (its `cells`) under DIR becomes a run folder per run, its
run.json and report.json rebuilt from what the experiment recorded, and its metrics.jsonl kept where a copy
was saved beside the compare.json, else rebuilt from the held-out curve (one evaluation record a point, and
an update record with that version's training samples). Every rebuilt file says `"reconstructed_from":
"compare.json"` (or sweep.json): the settings are the flags the run's command gave (the trainer's defaults of
that day are not recorded, so nothing else is claimed), and per-problem figures do not exist (the verdict
reads `no per-problem data`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import orjson

from streams.run_dir import INFO, METRICS, PARTS, PLOTS, REPORT, holds_run, read_json, read_records
from trainer.config import TrainerSettings

KEPT = {INFO, REPORT, METRICS, *PLOTS, "cell.json", "README.md"}
EXPERIMENT_FILES = ("compare.", "sweep.")  # evals/es_vs_grpo_report.py FILES, evals/sweep_report.py: md, json, png, csv
TRAINER = TrainerSettings.command_parser("trainer", "")  # reads a run's recorded command back into settings


def hint(out: Path) -> str:
    """The line an experiment ends with: how to publish what it wrote."""
    return f"to publish its runs and tables: python -m evals.publish {out} docs/results/NAME"


# -- publishing a fresh result -------------------------------------------------------------------------


def light_files(out: Path) -> list[Path]:
    """The files under `out` a published copy keeps, relative to `out`: runs' own files and the experiment's,
    never what lies in a run's PARTS."""
    kept, todo = [], [out]
    while todo:
        here = todo.pop()
        for path in sorted(here.iterdir()):
            if path.is_dir() and path.name not in PARTS and not path.name.startswith("."):
                todo.append(path)
            elif path.is_file() and (path.name in KEPT or path.name.startswith(EXPERIMENT_FILES)):
                kept.append(path.relative_to(out))
    return sorted(kept)


def publish(out: Path, dest: Path) -> list[Path]:
    """Copies the light files of `out` into `dest`, structure kept; returns what it copied (relative)."""
    files = light_files(out)
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out / rel, dest / rel)
    return files


# -- converting results published before ---------------------------------------------------------------


def command_settings(command: list[str], source: str) -> dict[str, Any]:
    """The trainer settings a recorded `python -m trainer ...` command gave, typed as the trainer types them;
    only those (a default of the day the run ran is not known now), with `prompt_format` at its default where
    the command did not set it (every run before `--prompt-format` asked in the default format)."""
    given = vars(TRAINER.parse_args(command[command.index("trainer") + 1 :]))
    given.pop("config", None)
    typed = TrainerSettings.model_validate(given)
    settings = {k: getattr(typed, k) for k in given}
    settings.setdefault("prompt_format", TrainerSettings.model_fields["prompt_format"].default)
    return settings


def rebuilt_records(curve: list[dict[str, Any]], started: float | None, source: str) -> list[dict[str, Any]]:
    """metrics.jsonl from a held-out curve: before each evaluation past version 0, an update record carrying
    the version's training samples; each evaluation at the start plus its `wall_s`, where known."""
    records = []
    for p in curve:
        if p["version"] > 0:
            records.append({"version": p["version"], "samples": p["samples"], "reconstructed_from": source})
        e = {"eval": True, **{k: p[k] for k in ("version", "held_out_reward", "held_out_exact", "problems")}}
        if started is not None and p.get("wall_s") is not None:
            e["time"] = started + p["wall_s"]
        records.append(e | {"reconstructed_from": source})
    return records


def convert_run(run: dict[str, Any], run_dir: Path, saved: Path | None, source: str) -> None:
    """Writes a run folder for one run an experiment recorded (`run`: its command, curve, versions, counts,
    walls). `saved`: a metrics.jsonl copied by hand for this run, moved into the run folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if saved is not None and saved != run_dir / METRICS:
        saved.rename(run_dir / METRICS)
    records = read_records(run_dir)
    wall_s = run.get("trainer_wall_s") or run.get("wall_s")
    first = next((p for p in run["curve"] if p.get("wall_s") is not None), None)
    first_eval = next((r for r in records if r.get("eval") and "time" in r), None)
    started = first_eval["time"] - first["wall_s"] if first and first_eval else None
    if not records:
        records = rebuilt_records(run["curve"], started, source)
        (run_dir / METRICS).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    settings = command_settings(run["command"], source)
    mark = {"reconstructed_from": source}
    info = {"run": settings["run"], "settings": settings, "started": started, **mark}
    evals = {p["version"]: {k: p[k] for k in ("held_out_reward", "held_out_exact", "problems")} for p in run["curve"]}
    report = {
        "settings": settings,
        "version": run.get("versions"),
        "counts": {"samples": run.get("samples_used"), **(run.get("counts") or {})},
        "evals": evals,
        "interrupted": run.get("returncode") != 0,
        "wall_s": wall_s,
        **mark,
    }
    options = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
    (run_dir / INFO).write_bytes(orjson.dumps(info, option=options))
    (run_dir / REPORT).write_bytes(orjson.dumps(report, option=options))


def convert(folder: Path) -> list[Path]:
    """Run folders for every run a per-seed compare.json or a sweep.json under `folder` recorded and no run
    folder holds yet; returns them."""
    made = []
    for doc_path in sorted(folder.rglob("compare.json")) + sorted(folder.rglob("sweep.json")):
        doc, here = read_json(doc_path) or {}, doc_path.parent
        if doc_path.name == "compare.json":
            named = {a: (r, here / a) for a, r in (doc.get("algos") or {}).items() if "command" in r}
            alone = here / METRICS if len(named) == 1 and (here / METRICS).is_file() else None
        else:
            named = {c["cell"]["key"]: (c, here / "cells" / c["cell"]["key"]) for c in doc.get("cells") or []}
            alone = None
        for run, run_dir in named.values():
            if holds_run(run_dir) and read_json(run_dir / REPORT) is not None:
                continue
            saved = run_dir / METRICS if (run_dir / METRICS).is_file() else alone
            convert_run(run, run_dir, saved, doc_path.name)
            made.append(run_dir)
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.publish", description=__doc__.split("\n\n")[0])
    p.add_argument("out", metavar="OUT", help="the experiment's folder (evals.es_vs_grpo --out, evals.sweep --out)")
    p.add_argument("dest", metavar="DEST", nargs="?", help="where the published copy goes (docs/results/NAME)")
    p.add_argument(
        "--convert", action="store_true", help="rebuild run folders in OUT from its compare.json / sweep.json files"
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    if not out.is_dir():
        print(f"publish: {out} is not a folder", file=sys.stderr)
        return 2
    if args.convert:
        for run_dir in convert(out):
            print(f"publish: {run_dir}: run folder rebuilt from its experiment's record", file=sys.stderr)
        return 0
    if not args.dest:
        print("publish: name where the copy goes: python -m evals.publish OUT docs/results/NAME", file=sys.stderr)
        return 2
    files = publish(out, Path(args.dest))
    runs = len({f.parent for f in files if f.name in (INFO, REPORT, METRICS)})
    print(f"publish: {len(files)} files of {runs} run{'' if runs == 1 else 's'} copied to {args.dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
