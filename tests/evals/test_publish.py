"""Published results are runs: `python -m evals.publish OUT DEST` copies the light files of an experiment's
runs, which `ops runs`, `ops run --run-dir` and `ops compare` open as runs; `--convert` rebuilds run folders
from the compare.json of results published before, marked as rebuilt. The folders are written by the tests;
every expected figure is worked out by hand from what they write."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_795_000_000.0  # a fixed start, 2026-11-18: the rebuilt start is checked against it


def _python(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _experiment(out: Path) -> None:
    """What evals.es_vs_grpo leaves in OUT: a seed's finished ES run, whole (its heavy parts included), and
    the seed's and the comparison's tables."""
    run = out / "seed0" / "es"
    settings = {"run": "x-seed0-es", "algo": "es", "task": "countdown", "iterations": 2, "prompt_format": "kimina"}
    _write(run / "run.json", json.dumps({"run": "x-seed0-es", "settings": settings, "started": T0}))
    evals = {"0": {"held_out_reward": 0.1, "held_out_exact": 0.0, "problems": 8}}
    evals["2"] = {"held_out_reward": 0.25, "held_out_exact": 0.125, "problems": 8}
    asked = [{"role": "user", "content": "Reach 7 from [3, 4].\nSay it in tags."}]  # as tasks/prompts.py applied
    prompt = {"format": "tinyzero", "theorem_id": "cd-1", "messages": asked}
    report = {"settings": settings, "version": 2, "counts": {"samples": 256}, "evals": evals, "wall_s": 120.0}
    report["prompt"] = prompt
    _write(run / "report.json", json.dumps(report))
    _write(run / "metrics.jsonl", _jsonl([{"version": 1, "samples": 128, "time": T0 + 50}]))
    _write(run / "reward.png", "png")
    for heavy in ("samples/v0.jsonl.gz", "redis/appendonly.aof", "logs/generator.log", "policy/v1/w.bin"):
        _write(run / heavy, "heavy")
    _write(out / "seed0" / "compare.json", "{}")
    _write(out / "compare.md", "# table")
    _write(out / "notes.txt", "not a result")


def test_publish_copies_the_runs_own_files_and_the_tables_and_the_copy_opens_as_runs(tmp_path):
    _experiment(tmp_path / "out")
    dest = tmp_path / "docs" / "x"
    done = _python("-m", "evals.publish", str(tmp_path / "out"), str(dest))
    assert done.returncode == 0, done.stderr
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == [
        "compare.md",
        "seed0/compare.json",
        "seed0/es/metrics.jsonl",
        "seed0/es/report.json",
        "seed0/es/reward.png",
        "seed0/es/run.json",
    ]
    assert "6 files of 1 run copied" in done.stderr
    listed = _python("-m", "ops", "runs", str(dest), "--json")
    [row] = json.loads(listed.stdout)["runs"]
    assert (row["name"], row["algo"], row["status"], row["version"], row["iterations"]) == (
        "seed0/es",
        "es",
        "finished",
        2,
        2,
    )
    shown = _python("-m", "ops", "run", "--run-dir", str(dest / "seed0" / "es"))
    assert shown.returncode == 0, shown.stderr
    assert "run x-seed0-es: finished version 2 of 2" in shown.stdout
    assert '  prompt: tinyzero (for cd-1)\n    user: "Reach 7 from [3, 4].\\nSay it in tags."\n' in shown.stdout
    assert "health: not kept" in shown.stdout


def _seed(here: Path, extra: list[str], algos: dict[str, dict]) -> None:
    """A per-seed compare.json as evals.es_vs_grpo writes it: each algorithm's trainer command and curve."""
    _write(here / "compare.json", json.dumps({"settings": {"seed": 0}, "extra": extra, "algos": algos}))


def _algo(argv: list[str], curve: list[dict], versions: int, trainer_wall_s: float) -> dict:
    command = ["python", "-m", "trainer", *argv]
    return {
        "command": command,
        "curve": curve,
        "versions": versions,
        "samples_used": 256,
        "counts": {},
        "returncode": 0,
        "trainer_wall_s": trainer_wall_s,
        "wall_s": trainer_wall_s + 4,
    }


def test_convert_rebuilds_runs_from_compare_json_and_compare_names_the_prompt_formats(tmp_path):
    results = tmp_path / "results"
    equation = results / "equation" / "seed0"
    curve = [
        {"version": 0, "samples": 0, "held_out_reward": 0.3, "held_out_exact": 0.25, "problems": 8, "wall_s": 20.0},
        {
            "version": 2,
            "samples": 256,
            "held_out_reward": 0.35,
            "held_out_exact": 0.375,
            "problems": 8,
            "wall_s": 300.0,
        },
    ]
    argv = [
        "--algo",
        "es",
        "--task",
        "countdown",
        "--seed",
        "0",
        "--iterations",
        "2",
        "--es-noise",
        "lowrank",
        "--run",
        "eq-es-lowrank",
        "--prompt-format",
        "equation",
    ]
    _seed(equation, ["--prompt-format", "equation"], {"es-lowrank": _algo(argv, curve, 2, 310.0)})
    # its metrics.jsonl was copied by hand beside the compare.json: the version-0 evaluation landed at T0 + 20
    saved = [
        {"eval": True, "version": 0, "held_out_reward": 0.3, "held_out_exact": 0.25, "problems": 8, "time": T0 + 20.0},
        {"version": 2, "samples": 256, "time": T0 + 290.0},
        {
            "eval": True,
            "version": 2,
            "held_out_reward": 0.35,
            "held_out_exact": 0.375,
            "problems": 8,
            "time": T0 + 300.0,
        },
    ]
    _write(equation / "metrics.jsonl", _jsonl(saved))
    old = results / "old" / "seed0"
    old_curve = [{k: v for k, v in p.items() if k != "wall_s"} for p in curve]  # an older curve: no wall times
    grpo = [
        "--algo",
        "grpo",
        "--task",
        "countdown",
        "--seed",
        "0",
        "--iterations",
        "2",
        "--temperature",
        "1.0",
        "--run",
        "old-grpo",
    ]
    _seed(old, [], {"grpo": _algo(grpo, old_curve, 2, 600.0)})
    done = _python("-m", "evals.publish", "--convert", str(results))
    assert done.returncode == 0, done.stderr

    rows = {r["name"]: r for r in json.loads(_python("-m", "ops", "runs", str(results), "--json").stdout)["runs"]}
    assert sorted(rows) == ["equation/seed0/es-lowrank", "old/seed0/grpo"]
    eq, og = rows["equation/seed0/es-lowrank"], rows["old/seed0/grpo"]
    assert (eq["algo"], eq["status"], eq["version"], eq["iterations"], eq["samples"]) == ("es", "finished", 2, 2, 256)
    assert eq["started"] == T0  # the version-0 evaluation's time less its 20 s since the start
    assert eq["wall_s"] == 310.0 and eq["settings"]["prompt_format"] == "equation"
    assert (og["algo"], og["status"], og["version"], og["started"]) == ("grpo", "finished", 2, None)
    assert og["settings"]["prompt_format"] == "tinyzero"  # the default then, kimina, applied to Countdown
    assert not (equation / "metrics.jsonl").exists()  # moved into the run's folder
    rebuilt = (old / "grpo" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x).get("eval", False) for x in rebuilt] == [True, False, True]  # v0, v2's update, v2
    for run_dir in (equation / "es-lowrank", old / "grpo"):
        for name in ("run.json", "report.json"):
            assert json.loads((run_dir / name).read_text())["reconstructed_from"] == "compare.json"

    compared = _python(
        "-m", "ops", "compare", str(equation / "es-lowrank"), str(old / "grpo"), "--plot", str(tmp_path / "c.png")
    )
    assert compared.returncode == 0, compared.stderr
    assert "  prompt_format: equation | tinyzero\n" in compared.stdout
    assert "unset" not in compared.stdout  # only the settings both runs record
    assert "Countdown's reward is shaped credit" in compared.stdout
    assert "Lean" not in compared.stdout  # a Countdown comparison: no Lean reading
    shown = _python("-m", "ops", "run", "--run-dir", str(equation / "es-lowrank")).stdout
    assert "  prompt: equation\n" in shown and "reconstructed from compare.json" in shown

    again = _python("-m", "evals.publish", "--convert", str(results))  # once: converted folders stay as they are
    assert again.returncode == 0 and "rebuilt" not in again.stderr


def test_a_folder_of_runs_is_compared_run_by_run_and_a_summary_alone_is_named(tmp_path):
    _experiment(tmp_path / "out")
    _experiment(tmp_path / "other")
    both = _python(
        "-m",
        "ops",
        "compare",
        str(tmp_path / "out"),
        str(tmp_path / "other" / "seed0" / "es"),
        "--plot",
        str(tmp_path / "c.png"),
        "--json",
    )
    assert both.returncode == 0, both.stderr
    assert [r["name"] for r in json.loads(both.stdout)["runs"]] == ["out/seed0/es", "other/seed0/es"]
    # a run kept as its metrics alone, by hand: its task unknown, so it adds no reading of another task's
    _write(
        tmp_path / "bare" / "metrics.jsonl",
        _jsonl([{"eval": True, "version": 0, "held_out_reward": 0.1, "held_out_exact": 0.0, "problems": 8}]),
    )
    mixed = _python(
        "-m", "ops", "compare", str(tmp_path / "out"), str(tmp_path / "bare"), "--plot", str(tmp_path / "c.png")
    )
    assert mixed.returncode == 0, mixed.stderr
    assert (
        [x for x in mixed.stdout.splitlines() if x.startswith("reading:")]
        == [x for x in mixed.stdout.splitlines() if x.startswith("reading: Countdown's reward is shaped credit")]
        != []
    )
    _write(tmp_path / "summary" / "compare.json", "{}")
    alone = _python("-m", "ops", "compare", str(tmp_path / "summary"))
    assert alone.returncode == 2 and "only an experiment's summary (compare.json)" in alone.stderr


def test_the_dashboard_serves_a_published_run_from_its_files(tmp_path):
    _experiment(tmp_path / "out")
    run_dir = tmp_path / "out" / "seed0" / "es"
    for heavy in ("samples", "redis", "logs", "policy"):  # as published: the run's own files alone
        shutil.rmtree(run_dir / heavy)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
    argv = [sys.executable, "-m", "ops", "dashboard", "--run-dir", str(run_dir), "--port", "0"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "dashboard of run 'x-seed0-es' at http://127.0.0.1:PORT/ (Ctrl-C to stop)"
        assert line.startswith("dashboard of run 'x-seed0-es' at http"), proc.stderr.read() if proc.poll() else line
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        with urllib.request.urlopen(url + "api/state", timeout=30) as answer:
            state = json.loads(answer.read())
        r = state["result"]
        assert (r["algo"], r["status"], r["version"], r["iterations"], r["samples"]) == ("es", "finished", 2, 2, 256)
        assert state["trainer"] is None and state["streams"] == {}  # the roles' figures were not kept
        assert [p["version"] for p in state["series"]["updates"]] == [1]
        with urllib.request.urlopen(url + "api/samples", timeout=30) as answer:
            assert json.loads(answer.read())["samples"] == []
        with urllib.request.urlopen(url + "api/runs", timeout=30) as answer:  # its folder's runs: itself
            assert [x["name"] for x in json.loads(answer.read())["runs"]] == ["es"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
