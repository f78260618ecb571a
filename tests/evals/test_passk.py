"""`python -m evals.passk`: the pass@k estimator, the weights of a version (ES replay, GRPO by digest), and a
whole evaluation through the CLI. Real parts only: Redis servers of our own, the default model, the
Countdown checker in its bubblewrap sandbox."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from evals import passk
from streams.codec import encode
from streams.connect import connect
from streams.embedded import EmbeddedRedis
from streams.keys import Keys
from streams.run_redis import live_server
from streams.schema import PolicyUpdate
from streams.theorems import register
from tests.producers.conftest import needs_model
from trainer.config import TrainerSettings
from trainer.data import load_theorems
from trainer.es import ESConfig, make_step, member_seed, policy_entry
from trainer.orders import Order

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_path():
    from weights.model import resolve_model

    return resolve_model(None)  # the default model, converted once per machine (~20 s the first time)


@pytest.fixture(autouse=True)
def _no_proofstream_env(monkeypatch):
    for name in [n for n in os.environ if n.startswith("PROOFSTREAM_")]:
        monkeypatch.delenv(name)


def es_steps(run: str, versions: int) -> list[dict]:
    """Real ES steps as the trainer makes them: two members per version, one rewarded, one not."""
    steps = []
    for v in range(1, versions + 1):
        members = [
            Order(f"es-v{v - 1}-m{i}", v - 1, member_seed(run, v - 1, i), 1, ["x"], rewards={"a": r})
            for i, r in enumerate((1.0, 0.0))
        ]
        steps.append(policy_entry(make_step(members, ESConfig(population=2)), members))
    return steps


def populate(url: str, settings: TrainerSettings, policy: list[PolicyUpdate]) -> None:
    """What the trainer leaves in its Redis: theorems, a checkpoint naming the split it evaluated, policy."""

    async def go() -> None:
        redis, keys = connect(url), Keys(settings.run)
        train, held = load_theorems(settings)
        await register(redis, keys, train + held)
        state = {"algo": settings.algo, "version": len(policy), "eval_ids": [t.theorem_id for t in held]}
        await redis.hset(keys.trainer_state, "state", orjson.dumps(state))
        for update in policy:
            await redis.xadd(keys.policy, encode(update))
        await redis.aclose()

    asyncio.run(go())


def test_pass_at_k_equals_the_share_of_k_subsets_holding_a_pass():
    for n in range(1, 7):
        for c in range(n + 1):
            outcomes = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(outcomes, k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert passk.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)
    assert passk.mean_pass_at_k([0, 1, 4], 4, 2) == pytest.approx((0 + 0.5 + 1) / 3)
    with pytest.raises(ValueError):
        passk.pass_at_k(4, 1, 5)


def test_bad_input_exits_2_with_a_message_that_says_what_is_wrong(one_redis_url, tmp_path, capsys):
    settings = TrainerSettings(run="evalbad", run_dir=str(tmp_path), problems=8, held_out=4)
    policy = [PolicyUpdate(v, "es", es_step=s) for v, s in enumerate(es_steps("evalbad", 2), 1)]
    populate(one_redis_url, settings, policy)
    lean = TrainerSettings(run="evallean", task="lean", held_out=4)
    populate(one_redis_url, lean, [])
    base = ["--redis-url", one_redis_url, "--run", "evalbad", "--run-dir", str(tmp_path)]
    base += ["--problems", "8", "--held-out", "4"]

    def fails(*argv: str) -> str:
        assert passk.main([*argv]) == 2
        return capsys.readouterr().err

    assert "version 7 does not exist in run 'evalbad': it has version(s) 0-2" in fails(*base, "--version", "7")
    assert "each k must be in 1..n" in fails(*base, "--version", "1", "--samples", "2", "--k", "1,4")
    assert "--version must be an integer" in fails(*base, "--version", "one")
    err = fails(*base, "--run", "nosuch", "--version", "0")
    assert "run 'nosuch' has no trainer checkpoint" in err and "'evalbad'" in err and "'evallean'" in err
    assert "these settings give 6 problems" in fails(*base[:-1], "6", "--run", "evalbad", "--version", "0")
    assert f"no run 'default': {tmp_path / 'nope'} does not exist" in fails(
        "--run-dir", str(tmp_path / "nope"), "--version", "0"
    )
    (tmp_path / "report.json").write_bytes(orjson.dumps({"settings": settings.model_dump()}))
    assert "held_out = 5 (the run has 4)" in fails(*base[:-1], "5", "--version", "0")
    lean_argv = ["--redis-url", one_redis_url, "--run", "evallean", "--task", "lean", "--held-out", "4"]
    err = fails(*lean_argv, "--sandbox", "process", "--version", "0")
    assert "no Lean backend found" in err and "kimina" in err


@needs_model
def test_grpo_weights_are_loaded_by_digest_and_a_changed_folder_is_refused(one_redis_url, tmp_path, capsys, model_path):
    import torch

    from weights.io import digest, load_master, save_weights
    from weights.model import weights_digest

    settings = TrainerSettings(run="evalgrpo", algo="grpo", run_dir=str(tmp_path), problems=8, held_out=2)
    base = load_master(model_path)
    changed = {"model.norm.weight": base["model.norm.weight"] + 0.25}  # a folder of one tensor loads that one
    folders = [tmp_path / "policy" / f"v{v:06d}" for v in (1, 2)]
    for folder in folders:
        save_weights(changed, folder / "model.safetensors")
    policy = [PolicyUpdate(v, "grpo", weights_path=str(f), digest=weights_digest(f)) for v, f in enumerate(folders, 1)]
    gone = PolicyUpdate(3, "grpo", weights_path=str(tmp_path / "policy" / "v000003"), digest="sha256:00")
    populate(one_redis_url, settings, [*policy, gone])
    save_weights({"model.norm.weight": base["model.norm.weight"] * 2}, folders[1] / "model.safetensors")
    argv = ["--redis-url", one_redis_url, "--run", "evalgrpo", "--run-dir", str(tmp_path), "--problems", "8"]
    argv += ["--held-out", "2", "--samples", "1", "--limit", "1", "--max-new-tokens", "4", "--sandbox", "process"]

    assert passk.main([*argv, "--version", "2"]) == 2
    err = capsys.readouterr().err
    assert "GRPO version 2" in err and "digest" in err and "refusing" in err
    assert passk.main([*argv, "--version", "3"]) == 2
    assert "does not exist" in (err := capsys.readouterr().err) and "versions with weights on disk: 0-2" in err

    assert passk.main([*argv, "--version", "1"]) == 0, capsys.readouterr().err
    line = orjson.loads(capsys.readouterr().out.splitlines()[-1])
    assert (line["version"], line["algo"], line["problems"], line["samples"]) == (1, "grpo", 1, 1)
    doc = orjson.loads((tmp_path / "eval-v1.json").read_bytes())
    assert doc["weights"]["digest"] == digest({**base, **changed}) != digest(base)
    assert torch.equal(base["model.norm.weight"] + 0.25, changed["model.norm.weight"])


@needs_model
def test_the_cli_evaluates_an_es_version_of_a_stopped_local_run_with_the_replayed_weights(tmp_path, model_path):
    from weights.es import ESWeights
    from weights.io import digest, load_master

    run_dir = tmp_path / "run"
    settings = TrainerSettings(
        run="evalcli", run_dir=str(run_dir), problems=8, held_out=4, max_new_tokens=16, sandbox="process"
    )
    steps = es_steps("evalcli", 2)
    (run_dir / "redis").mkdir(parents=True)
    server = EmbeddedRedis(data_dir=run_dir / "redis").start()  # the run's Redis, as LocalPipeline keeps it
    try:
        populate(server.url, settings, [PolicyUpdate(v, "es", es_step=s) for v, s in enumerate(steps, 1)])
    finally:
        server.stop()
    (run_dir / "report.json").write_bytes(orjson.dumps({"settings": settings.model_dump(), "version": 2}))
    data_before = {p: p.read_bytes() for p in sorted((run_dir / "redis").rglob("*")) if p.is_file()}

    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
    argv = [sys.executable, "-m", "evals.passk", "--run-dir", str(run_dir), "--version", "2", "--samples", "2"]
    argv += ["--k", "1,2"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    replay = ESWeights(lambda: load_master(model_path), lambda named: None)  # meanwhile: the steps, replayed here
    for v, step in enumerate(steps, 1):
        replay.add_step(v, step)
    expected = digest(replay.center(2))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]

    line = orjson.loads(out.strip().splitlines()[-1])
    assert set(line) == {"version", "algo", "task", "problems", "samples", "pass_at_k", "reward_mean", "seconds"}
    assert (line["version"], line["algo"], line["task"], line["problems"], line["samples"]) == (
        2,
        "es",
        "countdown",
        4,
        2,
    )
    assert set(line["pass_at_k"]) == {"1", "2"} and 0 <= line["pass_at_k"]["1"] <= line["pass_at_k"]["2"] <= 1
    assert "pass@k" in err and "report.json" in err
    doc = orjson.loads((run_dir / "eval-v2.json").read_bytes())
    assert doc["weights"]["digest"] == expected  # bit for bit the center a generator replays
    assert doc["sampling"]["max_new_tokens"] == 16 and doc["sandbox"] == "process"
    held = [t.theorem_id for t in load_theorems(settings)[1]]
    assert [p["theorem_id"] for p in doc["per_problem"]] == held
    samples = [s for p in doc["per_problem"] for s in p["samples"]]
    assert len(samples) == 8 and all(s["verdict"] in ("proved", "rejected", "timeout") for s in samples)
    assert all(s["tokens"] <= 16 for s in samples)
    assert line["reward_mean"] == pytest.approx(sum(s["reward"] for s in samples) / 8, abs=1e-6)
    passed = [p["passed"] for p in doc["per_problem"]]
    assert line["pass_at_k"]["1"] == pytest.approx(passk.mean_pass_at_k(passed, 2, 1), abs=1e-6)
    assert live_server(run_dir / "redis") is None  # read on a copy: no server on the run's own data
    assert {p: p.read_bytes() for p in sorted((run_dir / "redis").rglob("*")) if p.is_file()} == data_before


def test_help_offers_what_an_evaluation_uses_and_not_the_training_flags():
    text = passk._parser().format_help()
    assert "--max-new-tokens" in text and "--run-dir" in text and "--sandbox" in text
    training = ("--iterations", "--population", "--lr", "--train-precision", "--dist-timeout-s", "--quorum")
    assert not [f for f in training if f"{f} " in text]
