"""Runs where users look: `ops runs` lists a folder's runs from their files, `ops compare` puts runs side by
side (table, plot, where MLflow has them: a real MLflow store), and `ops run --run-dir` leads with the result
(a real redis-server on the run's data). Every expected figure is worked out by hand from what is written."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis as redis_sync

from streams import samples
from streams.embedded import EmbeddedRedis
from streams.keys import Keys
from streams.theorems import Theorem

ROOT = Path(__file__).resolve().parents[2]
NOW = time.time()


def _ops(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
    return subprocess.run(
        [sys.executable, "-m", "ops", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )


def _settings(run: str, **changes) -> dict:
    return {
        "run": run,
        "algo": "es",
        "task": "countdown",
        "model": None,
        "iterations": 4,
        "preset": "cpu",
        "population": None,
        "sigma": None,
        "alpha": None,
        "batch": 16,
        "antithetic": True,
        "es_temperature": 0.0,
        "seed": 0,
        "held_out": 8,
        "max_new_tokens": 64,
        "eval_every": 2,
        "quorum": 1.0,
        "max_staleness": 2,
        **changes,
    }


def _evaluation(version: int, reward: float, solved: int, at: float, rewards: list[float] | None = None) -> dict:
    """An evaluation's record; with `rewards` (one a problem, p0..p7: 1.0 is solved) its per-problem figures too."""
    record = {
        "eval": True,
        "version": version,
        "held_out_reward": reward,
        "held_out_exact": solved / 8,
        "problems": 8,
        "time": at,
    }
    if rewards is not None:
        record["problem_rewards"] = {f"p{i}": r for i, r in enumerate(rewards)}
        record["problems_solved"] = [f"p{i}" for i, r in enumerate(rewards) if r == 1.0]
    return record


PER_PROBLEM = ("problem_rewards", "problems_solved")  # in metrics.jsonl only: report.json keeps the means


def _write_run(
    run_dir: Path,
    run: str,
    *,
    started: float,
    pid: int,
    updates: int,
    evals: list[dict],
    report: dict | None = None,
    **changes,
) -> None:
    """A run directory as the trainer leaves it: run.json, metrics.jsonl (updates of 128 attempts a minute
    apart), and report.json when it ended."""
    run_dir.mkdir(parents=True)
    settings = _settings(run, **changes)
    info = {"run": run, "settings": settings, "started": started, "pid": pid, "host": socket.gethostname()}
    (run_dir / "run.json").write_text(json.dumps(info))
    records = [
        {"version": v, "algo": "es", "attempts": 128, "samples": 128 * v, "reward_mean": 0.1, "time": started + 60 * v}
        for v in range(1, updates + 1)
    ] + evals
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if report is not None:
        (run_dir / "report.json").write_text(json.dumps({"settings": settings, **report}))


@pytest.fixture
def folder(tmp_path):
    """Three runs: `a` finished, `b` live (its trainer process runs), `c` killed (its process is gone). `a`'s
    first and last evaluation have per-problem figures: 8 at 0.09, then p0 solved and 7 at 1/7 (mean 0.25)."""
    t0 = NOW - 3600
    evals = [
        _evaluation(0, 0.09, 0, t0 + 10, [0.09] * 8),
        _evaluation(2, 0.3, 2, t0 + 130),
        _evaluation(4, 0.25, 1, t0 + 250, [1.0] + [1 / 7] * 7),
    ]
    _write_run(
        tmp_path / "a",
        "a",
        started=t0,
        pid=1,
        updates=4,
        evals=evals,
        report={
            "version": 4,
            "counts": {"samples": 512},
            "interrupted": False,
            "wall_s": 280.0,
            "evals": {str(e["version"]): {k: v for k, v in e.items() if k not in PER_PROBLEM} for e in evals},
        },
    )
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", "python -m trainer"])
    gone = subprocess.Popen([sys.executable, "-c", "pass", "trainer"])
    gone.wait()
    now = time.time()  # not NOW, the module's import time: the whole suite may run between the two (seen in CI)
    _write_run(
        tmp_path / "b",
        "b",
        started=now - 150,
        pid=live.pid,
        updates=2,
        evals=[_evaluation(0, 0.1, 0, now)],
        alpha=0.004,
    )
    _write_run(tmp_path / "nested" / "c", "c", started=t0 + 600, pid=gone.pid, updates=1, evals=[])
    (tmp_path / "a" / "samples").mkdir()  # a run's own folders are not runs
    (tmp_path / "a" / "samples" / "metrics.jsonl").write_text("")
    yield tmp_path
    live.kill()
    live.wait()


def test_runs_lists_each_run_with_its_status_and_result(folder):
    done = _ops("runs", "--dir", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)["runs"]}
    assert list(rows) == ["a", "nested/c", "b"]  # by start: a at t0, c at t0 + 600, b 150 s ago
    a, b, c = rows["a"], rows["b"], rows["nested/c"]
    assert (a["status"], a["version"], a["iterations"], a["samples"], a["wall_s"]) == ("finished", 4, 4, 512, 280.0)
    assert (a["held_out"]["first"]["reward"], a["held_out"]["last"]["solved"], a["held_out"]["best"]["version"]) == (
        0.09,
        1,
        2,
    )
    assert (b["status"], b["version"], b["samples"]) == ("live", 2, 256)  # two updates of 128 attempts
    assert 140 < b["wall_s"] < 300 and b["eta_s"] is not None
    assert (c["status"], c["version"], c["samples"], c["wall_s"]) == ("interrupted", 1, 128, 60.0)
    text = _ops("runs", "--dir", str(folder)).stdout
    [line] = [x for x in text.splitlines() if x.startswith("a ")]
    assert line.split()[:9] == ["a", "ES", "finished", "4/4", "512", "0.090", "->", "0.250", "0/8"]
    assert "4 min 40 s" in line
    # d = 0.91 once (p0: 0.09 -> 1) and 1/7 - 0.09 = 0.052857 seven times: mean 1.28 / 8 = 0.16; deviations 0.75
    # and -0.107143: sum of squares 0.5625 + 7 x 0.011480 = 0.642857, sd = sqrt(0.642857 / 7) = 0.303046,
    # noise 2 x 0.303046 / sqrt(8) = 0.214286 > 0.16: no change
    assert "0/8 -> 1/8  no change +0.160 ±0.214  4 min 40 s" in line
    [b_line] = [x for x in text.splitlines() if x.startswith("b ")]
    assert "(ETA " in b_line and "0.100 -> 0.100" in b_line
    assert a["verdict"]["learned"] == "no change" and b["verdict"]["words"] == "one evaluation: nothing to compare yet"
    assert text.startswith("3 runs in ")
    positional = _ops("runs", str(folder / "nested"))  # the folder as an argument, as `ls` takes one
    assert positional.returncode == 0 and positional.stdout.startswith("1 run in "), positional.stderr
    assert [x.split()[0] for x in positional.stdout.splitlines()[3:]] == ["c"]
    missing = _ops("runs", str(folder / "nowhere"))
    assert missing.returncode == 2 and "`ops runs DIR`" in missing.stderr


def test_compare_prints_the_table_the_differences_and_writes_one_plot(folder):
    plot = folder / "out" / "cmp.png"
    (folder / "out").mkdir()
    done = _ops("compare", "a", str(folder / "b"), "--dir", str(folder), "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    assert "alpha: 0.002 | 0.004" in done.stdout  # a takes the cpu preset's, b set its own
    assert "a  reward 0.300, exact 2/8 at v2" in done.stdout  # a's best evaluation
    assert (
        "  a  no change beyond noise: held-out reward +0.160 (noise ±0.214), 0 -> 1 of 8 solved (1 gained, 0 lost: "
        "within noise)\n  b  one evaluation: nothing to compare yet\n"
    ) in done.stdout
    assert f"plot: {plot}" in done.stdout and plot.stat().st_size > 5000
    assert "so 0.1 is the tags alone or an expression without them" in done.stdout
    doc = json.loads(_ops("compare", "a", "b", "--dir", str(folder), "--json", "--plot", str(plot)).stdout)
    assert [p["samples"] for p in doc["runs"][0]["curve"]] == [0, 256, 512]
    assert [p["wall_s"] for p in doc["runs"][0]["curve"]] == [10.0, 130.0, 250.0]
    missing = _ops("compare", "a", "nope", "--dir", str(folder))
    assert missing.returncode == 2 and "nope holds no run" in missing.stderr


@pytest.mark.timeout(180)
def test_compare_says_where_mlflow_holds_the_runs(folder, tmp_path_factory):
    from mlflow.tracking import MlflowClient

    from trainer.mlflow_run import MLflowRun

    store = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{store / 'mlflow.db'}"
    ids = [MLflowRun(folder / name, uri, "proofstream", {"run": name}).run_id for name in ("a", "b")]
    done = _ops("compare", "a", "b", "--dir", str(folder), "--plot", str(store / "c.png"))
    [line] = [x for x in done.stdout.splitlines() if x.startswith("MLflow:")]
    assert f"mlflow ui --backend-store-uri {uri}" in line and "'proofstream'" in line
    assert all(i in line for i in ids)
    client = MlflowClient(tracking_uri=uri)
    assert [client.get_run(i).data.tags["proofstream.run"] for i in ids] == ["a", "b"]  # the runs it names


def _finished_with_redis(run_dir: Path) -> None:
    """A finished local run: its Redis data written by a real server (state, run info, a theorem), files."""
    evals = {
        "0": {"version": 0, "held_out_reward": 0.1, "held_out_exact": 0.0, "problems": 8},
        "4": {"version": 4, "held_out_reward": 0.2, "held_out_exact": 0.125, "problems": 8},
    }
    _write_run(
        run_dir,
        "fin",
        started=NOW - 900,
        pid=1,
        updates=4,
        evals=[],
        report={"version": 4, "counts": {"samples": 512}, "interrupted": False, "wall_s": 397.0, "evals": evals},
    )
    answers = {0: ["1 + 2 = 3"] * 6 + ["3 * 8"] * 2, 4: ["1 + 2 = 3"] * 7 + ["8 * 3 * 1"]}  # its traces: what it wrote
    for v, said in answers.items():
        found = [
            {"attempt_id": f"eval-v{v}:{i}:0", "eval": True, "policy_version": v, "theorem_id": f"p{i}", "proof": a}
            for i, a in enumerate(said)
        ]
        samples.append(samples.file_for(run_dir, v), found)
    (run_dir / "redis").mkdir()
    server = EmbeddedRedis(data_dir=run_dir / "redis").start()
    try:
        client, keys = redis_sync.Redis.from_url(server.url), Keys("fin")
        state = {
            "algo": "es",
            "version": 4,
            "finished": True,
            "members": [],
            "evals": [],
            "eval_results": evals,
            "counts": {"samples": 512},
        }
        client.hset(keys.trainer_state, "state", json.dumps(state))
        client.set(keys.run_info, (run_dir / "run.json").read_text())
        client.hset(keys.theorems, "cd-7", Theorem("cd-7", "countdown", numbers=[3, 8, 1], target=24).encode())
        client.xgroup_create(keys.rewards, "trainer", id="0", mkstream=True)
        client.close()
    finally:
        server.stop()


def test_run_on_a_finished_run_leads_with_its_result_and_blanks_idle(tmp_path):
    _finished_with_redis(tmp_path / "fin")
    done = _ops("run", "--run-dir", str(tmp_path / "fin"))
    assert done.returncode == 0, done.stderr
    ended = time.strftime("%H:%M", time.localtime(NOW - 900 + 397))
    lines = done.stdout.splitlines()
    assert lines[0] == f"run fin: finished version 4 of 4 at {ended} after 6 min 37 s"
    assert lines[1] == "  ES on countdown, SmolLM2-135M-Instruct (default)"
    assert lines[2] == (
        "  held-out reward 0.100 (v0) -> 0.200 (v4); exact 0/8 -> 1/8 (8 held-out problems, greedy; 2 evaluations)"
    )
    assert lines[3] == "  did it learn? no per-problem data: noise unknown"  # a run from before they were kept
    assert lines[4] == (
        '  answers: v0: 6 of 8 answers are "1 + 2 = 3", 2 are "3 * 8"; 2 distinct; '
        'v4: 7 of 8 answers are "1 + 2 = 3", 1 is "8 * 3 * 1"; 2 distinct'
    )
    # 512 of the paper's 30 x 200 x 500 = 3,000,000 samples: 0.01707% (two significant digits)
    assert lines[5] == (
        "  training: 512 samples: 0.017% of the paper's 3M (population 30 x 200 problems x 500 iterations, Qiu et al. "
        "2025)"
    )
    assert "population 8, sigma 0.001, alpha 0.002, batch 16" in lines[6]
    assert lines[7].startswith("  reading: Countdown's reward is shaped credit: <answer> tags 0.1, plus 0.1")
    assert "IDLE: not kept in a finished run's data" in done.stdout
    doc = json.loads(_ops("streams", "--json", "--run-dir", str(tmp_path / "fin")).stdout)
    group = doc["streams"]["rewards"]["groups"]["trainer"]
    assert doc["idle_kept"] is False and group["oldest_pending_idle_ms"] is None


def test_a_problem_is_shown_by_theorem_and_commands_that_change_a_copy_say_so(tmp_path):
    _finished_with_redis(tmp_path / "fin")
    shown = _ops("theorem", "cd-7", "--run-dir", str(tmp_path / "fin"))
    assert shown.stdout == "theorem cd-7 (countdown): reach 24 from 3, 8, 1, each number once\n"
    missing = _ops("theorem", "cd-9", "--run-dir", str(tmp_path / "fin"))
    assert missing.returncode == 1 and "has no theorem 'cd-9'" in missing.stderr and "cd-7" in missing.stderr
    purged = _ops("dlq", "purge", "--all", "--yes", "--run-dir", str(tmp_path / "fin"))
    assert purged.stdout.splitlines()[-1].startswith(f"(done on a copy of {tmp_path / 'fin'}'s Redis data")
    cleared = _ops("verdicts", "clear", "--run", "fin", "--run-dir", str(tmp_path / "fin"))
    assert "removed 0 cached verdicts" in cleared.stdout and "the run directory is unchanged" in cleared.stdout
    assert "copy" not in _ops("dlq", "list", "--run-dir", str(tmp_path / "fin")).stdout  # reading changes nothing


def test_a_live_run_read_from_redis_finds_its_directory_on_its_own_host(tmp_path):
    """`ops run --redis-url` on a live run: the evaluations' per-problem figures are in its run directory, found
    where its settings put it when its trainer runs on this host; nowhere else."""
    from ops.views.runs import local_dir

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "run.json").write_text("{}")
    here = {"host": socket.gethostname()}
    assert local_dir(here, {"run": "r", "run_dir": str(tmp_path / "r")}) == tmp_path / "r"
    assert local_dir({"host": "another-host"}, {"run": "r", "run_dir": str(tmp_path / "r")}) is None
    assert local_dir(here, {"run": "r", "run_dir": str(tmp_path / "gone")}) is None


def test_run_says_the_credit_by_part_the_papers_budget_and_the_member_spread(tmp_path):
    """A paper-reward ES run kept as its files: its evaluations' and last update's credit by part, its samples
    against the paper's budget, its last update's member spread, the scheme among its settings and reading."""
    parts_v0 = {"format": 0.25, "expression": 0.5, "numbers": 0.125, "closeness": 0.1, "solved": 0.0}
    parts_v2 = {"format": 0.75, "expression": 0.625, "numbers": 0.25, "closeness": 0.2, "solved": 0.125}
    evals = [
        {
            "eval": True,
            "version": 0,
            "held_out_reward": 0.025,
            "held_out_exact": 0.0,
            "problems": 8,
            "held_out_parts": parts_v0,
            "time": NOW - 500,
        },
        {
            "eval": True,
            "version": 2,
            "held_out_reward": 0.2,
            "held_out_exact": 0.125,
            "problems": 8,
            "held_out_parts": parts_v2,
            "time": NOW - 100,
        },
    ]
    _write_run(tmp_path / "p", "p", started=NOW - 600, pid=1, updates=2, evals=evals, reward="paper")
    records = (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()
    last = json.loads(records[1]) | {
        "parts": {"format": 0.5, "expression": 0.5, "numbers": 0.25, "closeness": 0.125, "solved": 0.0625},
        "member_spread": {"members": 8, "distinct": 1, "mode": 0.1, "differed": 0, "min": 0.1, "max": 0.1},
    }
    records[1] = json.dumps(last)
    (tmp_path / "p" / "metrics.jsonl").write_text("\n".join(records) + "\n")
    lines = _ops("run", "--run-dir", str(tmp_path / "p")).stdout.splitlines()
    assert (
        "  held-out by part (v0 -> v2): format 0.250 -> 0.750, expression 0.500 -> 0.625, numbers 0.125 -> 0.250, "
        "closeness 0.100 -> 0.200, solved 0.000 -> 0.125"
    ) in lines
    assert (
        "  training by part (v2): format 0.500, expression 0.500, numbers 0.250, closeness 0.125, solved 0.062" in lines
    )
    # 256 samples (2 updates of 128) of 3,000,000: 0.0085333%
    assert (
        "  training: 256 samples: 0.0085% of the paper's 3M (population 30 x 200 problems x 500 iterations, Qiu et al. "
        "2025)"
    ) in lines
    assert "  last update (v2): all 8 members scored 0.100: no reward difference, so a step of zeros" in lines
    [settings] = [line for line in lines if line.startswith("  settings: ")]
    assert ", reward paper," in settings
    assert any(line.startswith("  reading: Countdown's reward is the paper's (TinyZero's") for line in lines)
    # beside a shaped run from before parts were kept: the scheme is a difference, the parts one run's alone
    _write_run(tmp_path / "s", "s", started=NOW - 600, pid=1, updates=1, evals=[])
    shown = _ops("compare", "p", "s", "--dir", str(tmp_path), "--plot", str(tmp_path / "c.png")).stdout
    assert "\nthey differ in:\n" in shown and "\n  reward: paper | shaped\n" in shown
    assert (
        "credit by part (what the answers have: Countdown's format, expression, numbers, closeness, solved):\n"
        "  p  held-out by part (v0 -> v2): format 0.250 -> 0.750"
    ) in shown
    assert "\n     training by part (v2): format 0.500" in shown and "\n  s  none recorded\n" in shown
    assert "\n  s  128 samples: 0.0043% of the paper's 3M" in shown  # 128 / 3e6 = 0.004267%


def test_a_run_its_wall_clock_budget_ended_is_finished(tmp_path):
    """`--max-minutes`: the budget ends the run at version 3 of a 100,000 cap, and its report says `time_up`;
    the same report without it is a run stopped short."""
    report = {"version": 3, "counts": {"samples": 384}, "interrupted": False, "wall_s": 200.0, "evals": {}}
    for name, extra, status in (("timed", {"time_up": True}, "finished"), ("short", {}, "interrupted")):
        _write_run(
            tmp_path / name,
            name,
            started=NOW - 300,
            pid=1,
            updates=3,
            evals=[],
            report={**report, **extra},
            iterations=100_000,
        )
        done = _ops("runs", str(tmp_path / name), "--json")
        assert done.returncode == 0, done.stderr
        [row] = json.loads(done.stdout)["runs"]
        assert (row["status"], row["version"]) == (status, 3), name
