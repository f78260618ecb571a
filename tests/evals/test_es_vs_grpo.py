"""`python -m evals.es_vs_grpo` (evals/es_vs_grpo.py, its planning and running in evals/runner.py, its tables in
evals/es_vs_grpo_report.py): the budget -> iterations conversion, curves and tables from metrics records, the
flags it refuses, its other name `python -m evals.compare`, and one short real comparison (both pipelines, the
hf engine, a handful of tokens)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis as redis_sync

from evals import es_vs_grpo, es_vs_grpo_report, runner
from streams.embedded import EmbeddedRedis
from streams.keys import Keys
from trainer.curves import curve, samples_used

ROOT = Path(__file__).resolve().parents[2]


def test_a_version_costs_population_x_batch_in_es_and_batch_x_group_size_in_grpo():
    assert runner.samples_per_version("es", population=8, batch=8) == 64
    assert runner.samples_per_version("grpo", batch=4, group_size=8) == 32
    with pytest.raises(ValueError):
        runner.samples_per_version("ppo", batch=1)


def test_the_budget_buys_whole_versions_and_evaluations_spread_over_them():
    p = runner.plan("es", 512, 64, eval_points=4)
    assert (p.iterations, p.eval_every, p.samples) == (8, 2, 512)
    p = runner.plan("grpo", 500, 32, eval_points=4)  # 15 versions = 480 samples; the 20 left are not spent
    assert (p.iterations, p.eval_every, p.samples) == (15, 3, 480)
    assert runner.plan("es", 64, 64, eval_points=4).eval_every == 1
    with pytest.raises(ValueError, match="buys no version"):
        runner.plan("grpo", 63, 64, eval_points=4)


def test_plans_from_flags_give_each_algorithm_its_own_trainer_flags():
    args = es_vs_grpo.parser().parse_args(
        ["--budget", "256", "--es-population", "4", "--es-batch", "8", "--grpo-group-size", "4", "--grpo-lr", "1e-5"]
    )
    es, grpo = es_vs_grpo.plans(args)
    assert (es.samples_per_version, es.iterations) == (32, 8)
    assert es.flags == ("--population", "4", "--batch", "8")
    assert (grpo.samples_per_version, grpo.iterations) == (32, 8)
    assert grpo.flags == ("--batch", "8", "--group-size", "4", "--lr", "1e-05")
    argv = es_vs_grpo.trainer_argv(grpo, ["--seed", "0"], "c-grpo", Path("/tmp/c/grpo"), ["--engine", "hf"])
    expected = ["-m", "trainer", "--algo", "grpo", "--seed", "0", "--iterations", "8", "--eval-every", "2", *grpo.flags]
    expected += ["--run", "c-grpo", "--run-dir", "/tmp/c/grpo", "--engine", "hf"]
    assert argv[1:] == expected


def test_es_lowrank_is_a_third_run_of_es_with_low_rank_members_and_its_own_population():
    flags = ["--budget", "1024", "--algos", "es", "grpo", "es-lowrank"]
    flags += ["--lowrank-rank", "8", "--lowrank-population", "16", "--lowrank-batch", "8"]
    args = es_vs_grpo.parser().parse_args(flags)
    es, grpo, low = es_vs_grpo.plans(args)
    assert [p.algo for p in (es, grpo, low)] == ["es", "grpo", "es-lowrank"]
    assert (low.samples_per_version, low.iterations) == (16 * 8, 1024 // 128)
    assert low.flags == ("--es-noise", "lowrank", "--es-rank", "8", "--population", "16", "--batch", "8")
    argv = es_vs_grpo.trainer_argv(low, ["--seed", "1"], "c-low", Path("/tmp/c/low"), [])
    assert argv[3:5] == ["--algo", "es"] and "--es-noise" in argv  # the trainer's algorithm is ES
    assert [p.algo for p in es_vs_grpo.plans(es_vs_grpo.parser().parse_args(["--budget", "1024"]))] == ["es", "grpo"]
    refusal = "--es-noise is set by the comparison: use --algos es-lowrank"
    assert es_vs_grpo.refused(["--es-noise", "lowrank"]) == [refusal]


def test_flags_the_comparison_sets_are_refused_as_pass_through():
    assert es_vs_grpo.refused(["--engine", "hf", "--model", "m"]) == []
    problems = es_vs_grpo.refused(["--lr=1e-4", "--iterations", "3", "--engine", "hf"])
    assert problems == [
        "--lr is set by the comparison: use --grpo-lr",
        "--iterations is set by the comparison: use --budget",
    ]
    assert es_vs_grpo.main(["--budget", "64", "--batch", "2"]) == 2
    assert es_vs_grpo.main(["--budget", "10"]) == 2  # buys no version at 64 samples a version


def test_the_other_name_evals_compare_runs_the_experiment_and_names_it():
    """`python -m evals.compare` still runs the experiment, with one line naming `evals.es_vs_grpo`."""
    argv = [sys.executable, "-m", "evals.compare", "--budget", "10"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2  # its own refusal: 10 samples buy no version at 64 a version
    assert done.stderr.splitlines()[0] == (
        "evals.compare: this is `python -m evals.es_vs_grpo`, the ES-against-GRPO experiment"
    )
    assert "es_vs_grpo: es: a budget of 10 samples buys no version" in done.stderr


def test_a_stopped_trainer_stops_the_comparison(tmp_path, monkeypatch):
    ran = []

    def fake_run(argv, env, log_path, tick=None):
        ran.append(argv[argv.index("--algo") + 1])
        return 130, 1.0  # python -m trainer after SIGINT/SIGTERM

    monkeypatch.setattr(es_vs_grpo, "run_one", fake_run)
    assert es_vs_grpo.main(["--budget", "128", "--out", str(tmp_path / "c")]) == 1
    assert ran == ["es"]  # GRPO never started, nor the other seeds
    result = json.loads((tmp_path / "c" / "seed0" / "compare.json").read_text())
    assert not result["ok"] and list(result["algos"]) == ["es"] and result["algos"]["es"]["returncode"] == 130
    assert "(exit 130)" in (tmp_path / "c" / "seed0" / "compare.md").read_text()
    summary = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert not summary["ok"] and summary["seeds"] == [0] and summary["algos"]["es"]["reward_end"]["n"] == 0
    assert (
        "| 0 | ES |" in (tmp_path / "c" / "compare.md").read_text()
        and "| 130 |" in (tmp_path / "c" / "compare.md").read_text()
    )


def test_over_seeds_each_algorithm_gets_mean_and_spread_and_a_finished_seed_is_not_run_again(
    tmp_path, monkeypatch, capsys
):
    """Three seeds of stand-in trainers whose metrics are known: the summary's mean and sample std are the
    values computed here, and a second comparison with the same --out runs nothing."""
    ran = []
    ends = {("es", 0): 0.2, ("es", 1): 0.3, ("es", 2): 0.4, ("grpo", 0): 0.1, ("grpo", 1): 0.1, ("grpo", 2): 0.4}

    def fake_run(argv, env, log_path, tick=None):
        algo, seed = argv[argv.index("--algo") + 1], int(argv[argv.index("--seed") + 1])
        ran.append((algo, seed))
        run_dir = Path(argv[argv.index("--run-dir") + 1])
        run_dir.mkdir(parents=True, exist_ok=True)
        records = [
            {"eval": True, "version": 0, "held_out_reward": 0.1, "held_out_exact": 0.0},
            {"version": 1, "algo": algo, "attempts": 64, "samples": 64, "pass_rate": 0.25},
            {"eval": True, "version": 1, "held_out_reward": ends[algo, seed], "held_out_exact": 0.5},
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run_dir / "report.json").write_text(json.dumps({"version": 1, "wall_s": 32.0}))
        tick()  # as run_one does while the trainer runs: the ETA reads the version just written
        return 0, 40.0

    monkeypatch.setattr(es_vs_grpo, "run_one", fake_run)
    monkeypatch.setattr(es_vs_grpo, "generated_for_training", lambda *a: None)
    argv = ["--budget", "64", "--es-population", "8", "--es-batch", "8", "--grpo-batch", "8", "--out", str(tmp_path)]
    assert es_vs_grpo.main(argv) == 0
    assert len(ran) == 6
    err = capsys.readouterr().err
    assert "es_vs_grpo: 6 versions to run (es 1, grpo 1 a seed, seeds [0, 1, 2]" in err
    assert "es_vs_grpo: estimate from the first version (" in err and "): 6 versions, about " in err
    assert "es_vs_grpo: 6/6 versions in " in err and "ETA 0 ms" in err
    summary = json.loads((tmp_path / "compare.json").read_text())
    es, grpo = summary["algos"]["es"], summary["algos"]["grpo"]
    assert es["reward_end"]["mean"] == pytest.approx(0.3) and es["reward_end"]["std"] == pytest.approx(0.1)
    assert es["gain"]["mean"] == pytest.approx(0.2) and grpo["gain"]["mean"] == pytest.approx(0.1)
    assert grpo["reward_end"]["std"] == pytest.approx(((0.1 - 0.2) ** 2 * 2 + (0.4 - 0.2) ** 2) ** 0.5 / 2**0.5)
    assert es["proved_per_version"]["mean"] == pytest.approx(16.0)  # 0.25 of 64
    assert es["samples_per_s"]["mean"] == pytest.approx(64 / 32.0)  # samples used over the trainer's wall time
    md = (tmp_path / "compare.md").read_text()
    assert "| ES | 0.300 ± 0.100 (n=3) | 0.200 ± 0.100 (n=3) |" in md
    assert (tmp_path / "compare.png").stat().st_size > 1000 and (tmp_path / "seed2" / "compare.md").exists()
    ran.clear()
    assert es_vs_grpo.main(argv) == 0 and ran == []  # every seed finished before


def test_a_sigterm_to_the_comparison_reaches_the_trainer(tmp_path):
    child = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(130)); "
        "print('ready', flush=True); time.sleep(60)"
    )
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    code, wall_s = runner.run_one([sys.executable, "-c", child], dict(os.environ), tmp_path / "t.log")
    assert code == 130 and wall_s < 30  # the stand-in trainer got the SIGTERM and stopped
    assert signal.getsignal(signal.SIGTERM) == before and "ready" in (tmp_path / "t.log").read_text()


ES_RECORDS = [
    {"eval": True, "version": 0, "held_out_reward": 0.1, "held_out_exact": 0.0, "problems": 4},
    {"version": 1, "algo": "es", "attempts": 64, "samples": 64, "reward_mean": 0.1},
    {"version": 2, "algo": "es", "attempts": 60, "samples": 124, "reward_mean": 0.1},  # a straggler cut: 60 used
    {"eval": True, "version": 2, "held_out_reward": 0.2, "held_out_exact": 0.25, "problems": 4},
    {"version": 3, "algo": "es", "attempts": 64, "samples": 188, "reward_mean": 0.1},
    {"eval": True, "version": 3, "held_out_reward": 0.15, "held_out_exact": 0.0, "problems": 4},
]
GRPO_RECORDS = [
    {"eval": True, "version": 0, "held_out_reward": 0.1, "held_out_exact": 0.0, "problems": 4},
    # a step without signal (64 samples) came first: version 1 is at 128 samples, not 64
    {"version": 1, "algo": "grpo", "attempts": 64, "samples": 128},
    {"eval": True, "version": 1, "held_out_reward": 0.12, "held_out_exact": 0.0, "problems": 4},
    {"version": 2, "algo": "grpo", "attempts": 64, "samples": 192},
    {"eval": True, "version": 2, "held_out_reward": 0.3, "held_out_exact": 0.5, "problems": 4},
]


def test_curves_put_each_evaluation_at_the_samples_its_version_consumed():
    es = curve(ES_RECORDS)
    assert [(p["version"], p["samples"], p["held_out_reward"], p["held_out_exact"]) for p in es] == [
        (0, 0, 0.1, 0.0),
        (2, 124, 0.2, 0.25),
        (3, 188, 0.15, 0.0),
    ]
    assert samples_used(ES_RECORDS) == 188
    grpo = curve(list(reversed(GRPO_RECORDS)))  # order in the file does not matter
    assert [(p["version"], p["samples"]) for p in grpo] == [(0, 0), (1, 128), (2, 192)]
    assert samples_used(GRPO_RECORDS) == 192
    assert curve([{"eval": True, "version": 4, "held_out_reward": 0, "held_out_exact": 0}])[0]["samples"] is None
    assert samples_used([]) == 0
    # a record from a trainer whose ES versions did not carry `samples`: its x is unknown, not guessed
    old = [
        {"version": 1, "algo": "es", "attempts": 64},
        {"eval": True, "version": 1, "held_out_reward": 0, "held_out_exact": 0},
    ]
    assert curve(old)[0]["samples"] is None and samples_used(old) is None


def test_generated_for_training_is_the_generators_count_less_evaluation(tmp_path):
    assert es_vs_grpo.generated_for_training(tmp_path, "r", ES_RECORDS) is None  # no Redis data: not a local run
    (tmp_path / "redis").mkdir()
    server = EmbeddedRedis(data_dir=tmp_path / "redis").start()  # what the run's local pipeline leaves behind
    client = redis_sync.Redis.from_url(server.url)
    client.hset(Keys("r").generator_stats, "g", json.dumps({"orders": 30, "attempts": 212}))
    client.close()
    server.stop()
    assert es_vs_grpo.generated_for_training(tmp_path, "r", ES_RECORDS) == 212 - 12
    assert es_vs_grpo.generated_for_training(tmp_path, "other", ES_RECORDS) is None


def _result(tmp_path: Path) -> dict:
    args = es_vs_grpo.parser().parse_args(["--budget", "192", "--es-batch", "8", "--grpo-lr", "1e-5"])
    es, grpo = es_vs_grpo.plans(args)
    result = {
        "out": str(tmp_path),
        "budget": 192,
        "ok": True,
        "wall_s": 100.0,
        "extra": ["--engine", "hf"],
        "settings": {**vars(args), "seed": 0, "model": "m", "engine": "hf"},
        "algos": {},
    }
    for p, records in ((es, ES_RECORDS), (grpo, GRPO_RECORDS)):
        run_dir = tmp_path / p.algo
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run_dir / "report.json").write_text(json.dumps({"version": 3 if p.algo == "es" else 2, "wall_s": 40.0}))
        result["algos"][p.algo] = es_vs_grpo.result_for(p, p.algo, run_dir, ["python", "-m", "trainer"], 0, 42.0)
    return result


def test_the_table_json_and_plot_from_two_runs(tmp_path):
    result = _result(tmp_path)
    es_vs_grpo_report.write(result, tmp_path)
    md = (tmp_path / "compare.md").read_text()
    assert "| ES | 2 | 124 | - | 0.200 | 0.250 |" in md  # no run.json here: the wall time is unknown
    assert "| GRPO | 1 | 128 | - | 0.120 | 0.000 |" in md
    # 188 samples in the trainer's 40 s: 4.70 a second
    assert "| ES | hf float32 | 64 | 3 | 188 | - | 4.70 | 0.100 -> 0.150 | 0.000 -> 0.000 | 42 s |" in md
    assert "learning rate 1e-05" in md and "generator precision: float32" in md
    assert json.loads((tmp_path / "compare.json").read_text())["algos"]["grpo"]["samples_used"] == 192
    assert (tmp_path / "compare.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_real_comparison_writes_its_table_plot_and_json(tmp_path):
    out = tmp_path / "cmp"
    argv = [sys.executable, "-m", "evals.es_vs_grpo", "--task", "countdown", "--budget", "8", "--out", str(out)]
    argv += ["--es-population", "2", "--es-batch", "4", "--grpo-batch", "2", "--grpo-group-size", "4"]
    argv += ["--max-new-tokens", "16", "--held-out", "2", "--problems", "8", "--eval-points", "1"]
    argv += ["--engine", "hf", "--seeds", "0"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=840)
    except subprocess.TimeoutExpired:
        proc.terminate()  # es_vs_grpo passes it on: the trainer stops its pipeline
        proc.communicate(timeout=60)
        raise
    assert proc.returncode == 0, stderr[-3000:] + "".join(p.read_text()[-3000:] for p in out.glob("**/*.log"))
    line = json.loads(stdout.strip().splitlines()[-1])
    assert line["ok"] and line["budget"] == 8 and line["seeds"] == [0] and line["es"]["n"] == 1
    assert (out / "compare.md").exists() and (out / "compare.png").exists()
    out = out / "seed0"
    result = json.loads((out / "compare.json").read_text())
    es, grpo = result["algos"]["es"], result["algos"]["grpo"]
    assert es["plan"]["iterations"] == 1 and grpo["plan"]["iterations"] == 1
    assert [p["version"] for p in es["curve"]] == [0, 1] and es["samples_used"] == 8
    assert [p["version"] for p in grpo["curve"]] == [0, 1] and grpo["samples_used"] >= 8
    assert es["curve"][0]["held_out_reward"] == grpo["curve"][0]["held_out_reward"]  # the same base model and split
    for r in (es, grpo):
        assert r["generated_for_training"] >= r["samples_used"]
    md = (out / "compare.md").read_text()
    assert "| ES | 0 | 0 |" in md and "| GRPO | 1 |" in md and "--engine hf" in md
    assert (out / "compare.png").stat().st_size > 1000
    # the GRPO generator loaded the announced weights after checking their digest
    assert '"grpo_weights_loaded"' in (out / "grpo" / "logs" / "generator.log").read_text()


def test_wall_clock_engines_are_the_fastest_measured_unless_told_and_hf_without_vllm():
    with_vllm = es_vs_grpo.engine_choices(["es", "grpo", "es-lowrank"], [], "float32", vllm=True)
    assert with_vllm == {"es": ("vllm", "bfloat16"), "grpo": ("vllm", "float32"), "es-lowrank": ("hf", "float32")}
    without = es_vs_grpo.engine_choices(["es", "grpo"], [], "float32", vllm=False)
    assert without == {"es": ("hf", "float32"), "grpo": ("hf", "float32")}
    told = es_vs_grpo.engine_choices(["es", "grpo"], ["es=hf", "grpo=auto:bfloat16"], "float32", vllm=True)
    assert told == {"es": ("hf", "float32"), "grpo": ("auto", "bfloat16")}
    with pytest.raises(ValueError, match="ALGO=ENGINE"):
        es_vs_grpo.engine_choices(["es"], ["es=tpu"], "float32", vllm=True)


def test_wall_clock_pairs_both_algorithms_on_the_same_minutes_and_reports_time_and_samples(tmp_path, monkeypatch):
    """Stand-in trainers (their metrics known): each run gets `--max-minutes 3`, evaluations every 3 / 3 = 1
    minute, its own engine and precision (ES: hf at bfloat16 as told; GRPO: hf at the common float32), and
    the report pairs the two at 3 minutes of wall-clock with each curve against samples and minutes."""
    seen = {}

    def fake_run(argv, env, log_path, tick=None):
        algo = argv[argv.index("--algo") + 1]
        seen[algo] = (argv, env.get("PROOFSTREAM_DTYPE"))
        run_dir = Path(argv[argv.index("--run-dir") + 1])
        run_dir.mkdir(parents=True, exist_ok=True)
        per = 128 if algo == "es" else 64
        (run_dir / "run.json").write_text(json.dumps({"started": 1000.0}))
        records = [{"eval": True, "version": 0, "held_out_reward": 0.1, "held_out_exact": 0.0, "time": 1030.0}]
        records += [{"version": v, "algo": algo, "attempts": per, "samples": per * v} for v in (1, 2, 3)]
        records += [{"eval": True, "version": 3, "held_out_reward": 0.2, "held_out_exact": 0.25, "time": 1210.0}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run_dir / "report.json").write_text(json.dumps({"version": 3, "wall_s": 240.0, "time_up": True}))
        return 0, 245.0

    monkeypatch.setattr(es_vs_grpo, "run_one", fake_run)
    monkeypatch.setattr(es_vs_grpo, "generated_for_training", lambda *a: None)
    argv = ["--wall-clock", "3", "--seeds", "0", "--eval-points", "3", "--out", str(tmp_path)]
    argv += ["--es-population", "8", "--es-batch", "16", "--engine-for", "es=hf:bfloat16", "grpo=hf"]
    assert es_vs_grpo.main(argv) == 0
    for algo, dtype in (("es", "bfloat16"), ("grpo", "float32")):
        cmd, env_dtype = seen[algo]
        flag = lambda name, cmd=cmd: cmd[len(cmd) - cmd[::-1].index(name)]  # noqa: E731 - the last one wins
        assert flag("--max-minutes") == "3.0" and flag("--eval-every-minutes") == "1.0"
        assert flag("--eval-every") == "0" and flag("--engine") == "hf" and env_dtype == dtype
        assert int(flag("--iterations")) >= 10_000  # a cap the budget reaches first
    result = json.loads((tmp_path / "seed0" / "compare.json").read_text())
    assert result["wall_clock_min"] == 3.0 and result["budget"] is None
    es, grpo = result["algos"]["es"], result["algos"]["grpo"]
    assert (es["engine"], es["gen_dtype"], grpo["engine"], grpo["gen_dtype"]) == ("hf", "bfloat16", "hf", "float32")
    assert es["plan"]["minutes"] == grpo["plan"]["minutes"] == 3.0
    assert [(p["samples"], p["wall_s"]) for p in es["curve"]] == [(0, 30.0), (384, 210.0)]
    md = (tmp_path / "seed0" / "compare.md").read_text()
    assert md.startswith("# ES vs GRPO on countdown: 3 minutes of wall-clock each")
    assert "| ES | 3 | 384 | 3.5 | 0.200 | 0.250 |" in md and "| GRPO | 3 | 192 | 3.5 |" in md
    assert "| ES | hf bfloat16 | 128 | 3 | 384 |" in md and "| 1.60 |" in md  # 384 samples in 240 s
    # each algorithm's engine and precision are said once, per algorithm: no common line contradicts them
    assert "generator precision:" not in md and ", engine auto" not in md
    assert "ES ran on the hf engine, generator in bfloat16" in md
    summary = json.loads((tmp_path / "compare.json").read_text())
    assert summary["wall_clock_min"] == 3.0
    assert summary["algos"]["grpo"]["samples_per_s"]["mean"] == pytest.approx(192 / 240)
    assert (tmp_path / "compare.md").read_text().startswith("# ES vs GRPO: 3 minutes of wall-clock each")


def test_wall_clock_and_budget_are_one_or_the_other(capsys):
    assert es_vs_grpo.main(["--seeds", "0"]) == 2
    assert es_vs_grpo.main(["--budget", "64", "--wall-clock", "2"]) == 2
    # a trainer flag passed through is not an abbreviation of ours: `--engine` is not `--engine-for`
    args, extra = es_vs_grpo.parser().parse_known_args(["--budget", "8", "--engine", "hf"])
    assert (args.engine_for, extra) == ([], ["--engine", "hf"])
    assert es_vs_grpo.main(["--budget", "64", "--engine-for", "es=hf"]) == 2
    assert es_vs_grpo.main(["--wall-clock", "2", "--max-minutes", "3"]) == 2
    err = capsys.readouterr().err
    assert "--budget N (training samples) or --wall-clock MINUTES" in err and "--engine-for is for --wall-clock" in err
    assert "--max-minutes is set by the comparison: use --wall-clock" in err
