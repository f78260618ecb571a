"""The ES trainer: the step's formula, the staleness bound, and a trainer killed with SIGKILL that resumes
from its checkpoint and the streams without losing or double-counting a reward, while trimming the acked
history as it goes (real Redis, real child processes; the generator and verifier are played by
tests/fixtures/fake_roles.py, so every member's score is known in advance)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis as redis_sync

from streams.codec import decode
from streams.groups import id_order
from streams.keys import TRAINER, Keys
from streams.schema import PolicyUpdate, WorkOrder
from tests.fixtures.fake_roles import fake_reward
from trainer.es import ESConfig, ESRun, es_config, make_step, members_for, policy_entry, zscore
from trainer.orders import Order, split_fresh

ROOT = Path(__file__).resolve().parents[2]


def _member(center: int, index: int, score: float) -> Order:
    m = Order(f"es-v{center}-m{index}", center, 1000 + index, 1, ["a", "b"])
    m.rewards = {"x": score, "y": score}
    return m


def test_step_is_the_z_scored_member_rewards_and_applies_as_the_formula():
    torch = pytest.importorskip("torch")
    from weights.es import apply_step, noise

    members = [_member(0, i, s) for i, s in enumerate([0.0, 0.5, 1.0, 0.5])]
    cfg = ESConfig(population=4, sigma=0.01, alpha=0.1)
    step = policy_entry(make_step(members, cfg), members)
    # By hand: mean 0.5, population std sqrt((0.25 + 0 + 0.25 + 0) / 4) = sqrt(1/8), so z = (r - 0.5) * sqrt(8).
    z = [-(2**0.5), 0.0, 2**0.5, 0.0]
    assert step["rewards"] == pytest.approx(z, abs=1e-12) and step["seeds"] == [1000, 1001, 1002, 1003]
    assert step["members"] == [m.work_id for m in members]
    theta = {"w": torch.randn(5, 3, generator=torch.Generator().manual_seed(1))}
    updated = {"w": theta["w"].clone()}
    from weights.step import ESStep

    apply_step(updated, ESStep.from_dict(step))
    expected = theta["w"].double() + 0.1 / 4 * sum(
        zn * noise(s, "w", (5, 3)).double() for zn, s in zip(z, step["seeds"], strict=True)
    )
    assert torch.allclose(updated["w"].double(), expected, atol=1e-7)
    assert zscore([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]  # no signal, no step
    assert zscore([2.0, 4.0]) == [-1.0, 1.0]  # (r - 3) / 1: the spread is divided out, whatever its scale


def test_staleness_bound_and_population_cap():
    complete = [_member(5, 0, 1.0), _member(4, 1, 0.5), _member(3, 2, 0.0), _member(5, 3, 0.2), _member(4, 4, 0.1)]
    used, stale = split_fresh(complete, 5, max_staleness=1, limit=3)
    assert [m.work_id for m in used] == ["es-v5-m0", "es-v5-m3", "es-v4-m1"]  # freshest first, at most N
    assert [m.work_id for m in stale] == ["es-v3-m2"]  # 2 versions old: past the bound
    assert all(5 - m.center <= 1 for m in used)
    assert all(m.center == 5 for m in split_fresh(complete, 5, max_staleness=0, limit=3)[0])


def test_member_seeds_are_a_pure_function_and_antithetic_twins_share_one():
    assert members_for("r", 2, 0, 4, False) == members_for("r", 2, 0, 4, False)
    assert members_for("r", 2, 0, 4, False) != members_for("r", 3, 0, 4, False)
    twins = members_for("r", 2, 0, 4, True)
    assert [s for _, s, _ in twins][::2] == [s for _, s, _ in twins][1::2] and [g for *_, g in twins] == [1, -1, 1, -1]


def _trainer(url: str, run: str, run_dir: Path, iterations: int, *extra: str) -> subprocess.Popen:
    argv = [*_trainer_argv(url, run, run_dir, iterations), *extra]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trainer_argv(url: str, run: str, run_dir: Path, iterations: int) -> list[str]:
    argv = [sys.executable, "-m", "trainer", "--redis-url", url, "--run", run, "--algo", "es", "--task", "countdown"]
    argv += ["--iterations", str(iterations), "--population", "4", "--batch", "3", "--problems", "40"]
    argv += ["--held-out", "4", "--eval-every", "2", "--run-dir", str(run_dir)]
    argv += ["--log-level", "warning", "--history-s", "0"]
    return argv


def _until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("noise", [(), ("--es-noise", "lowrank", "--members-per-order", "3")], ids=["full", "bundles"])
def test_a_trainer_killed_with_sigkill_resumes_and_loses_or_doubles_nothing(one_redis_url, tmp_path, noise):
    run, iterations = "resume", 10
    keys = Keys(run)
    # MLflow through the real trainer too: the restart must continue the same MLflow run (tests/trainer/test_mlflow.py)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = redis_sync.Redis.from_url(one_redis_url)
    roles = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_roles", one_redis_url, run, "0.05"], cwd=ROOT)
    try:
        first = _trainer(one_redis_url, run, tmp_path, iterations, "--mlflow-uri", mlflow_uri, *noise)
        _until(lambda: r.xlen(keys.policy) >= 3 or first.poll() is not None, 120, "three versions")
        assert first.poll() is None, first.communicate()
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed_at = r.xlen(keys.policy)
        assert killed_at < iterations
        second = _trainer(one_redis_url, run, tmp_path, iterations, "--mlflow-uri", mlflow_uri, *noise)
        out, err = second.communicate(timeout=180)
        assert second.returncode == 0, err[-3000:]
        assert f"trainer: resuming run 'resume' at version {killed_at} of {iterations}" in err  # said, not silent
        said = [
            line
            for line in err.splitlines()
            if line.startswith(
                f"trainer: run 'resume' finished at version {iterations} of {iterations} (ES on countdown"
            )
        ]
        assert len(said) == 1 and "; held-out reward " in said[0], err[-2000:]  # the result (trainer/result.py)
    finally:
        roles.send_signal(signal.SIGTERM)
        roles.wait(30)
    updates = [decode(PolicyUpdate, f) for _, f in r.xrange(keys.policy)]
    assert [u.policy_version for u in updates] == list(range(1, iterations + 1))  # each version once, in order
    used = [w for u in updates for w in u.es_step["members"]]
    assert len(used) == len(set(used))  # no member (and so no reward) went into two updates
    for u in updates:
        step = u.es_step
        assert step.get("noise", "full") == ("lowrank" if noise else "full")
        # within the staleness bound, `max_staleness` 2 by default (trainer/config.py): a member 2 versions back is
        # used when its reward lands late, as on a loaded machine (the bound written as 1 failed once in CI's load)
        assert all(u.policy_version - 1 - c <= 2 for c in step["centers"])
        for seed, raw in zip(step["seeds"], step["raw_rewards"], strict=True):
            # every member's score is the mean of all 3 of its rewards: none lost, none counted twice
            assert raw == pytest.approx(sum(fake_reward(seed, i) for i in range(3)) / 3, abs=1e-6)
    state = orjson.loads(r.hget(keys.trainer_state, "state"))
    assert state["version"] == iterations and state["counts"]["resumes"] == 1
    pending = r.xpending(keys.rewards, TRAINER)
    assert pending["pending"] == 0  # every reward read was checkpointed and acked
    # ... and trimmed (history_s 0) as the run went and at its end: the rewards left are only those the
    # trainer never read (the fake roles went on with the orders in flight after it finished)
    assert state["counts"]["trimmed_rewards"] > 0 and state["counts"]["trimmed_work"] > 0
    [group] = [g for g in r.xinfo_groups(keys.rewards) if g["name"] in (TRAINER, TRAINER.encode())]
    last_read = id_order(group["last-delivered-id"])
    assert all(id_order(eid) > last_read for eid, _ in r.xrange(keys.rewards))
    metrics = [orjson.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes().splitlines()]
    assert [m["version"] for m in metrics if not m.get("eval")][-1] == iterations
    assert any(m.get("eval") for m in metrics)
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert report["version"] == iterations and not report["interrupted"]
    # no parts.png: the fake roles send no credit by part
    assert {p.name for p in tmp_path.glob("*.png")} == {"reward.png", "staleness.png", "throughput.png"}
    r.close()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    [logged] = client.search_runs([e.experiment_id for e in client.search_experiments()])  # one run for both
    assert logged.info.status == "FINISHED" and logged.data.params["population"] == "4"
    assert "redis_url" not in logged.data.params and "mlflow_uri" not in logged.data.params
    steps = {m.step for m in client.get_metric_history(logged.info.run_id, "reward_mean")}
    assert steps == set(range(1, iterations + 1))  # the killed trainer's versions and the resumed one's
    artifacts = {a.path for a in client.list_artifacts(logged.info.run_id)}
    assert artifacts == {"report.json", "reward.png", "staleness.png", "throughput.png"}
    assert state["counts"]["traced_samples"] > 0 and (tmp_path / "samples").is_dir()


def test_es_members_are_scored_greedily_by_default_and_grpo_keeps_sampling(tmp_path):
    """ES members of a center differ by their weights only when they decode greedily (the reference ES: its
    members score at temperature 0); `es_temperature` changes that, GRPO's `temperature` stays its own, and
    evaluations are always greedy."""
    from trainer.config import TrainerSettings
    from trainer.data import load_theorems
    from trainer.metrics import MetricsSink

    def orders(**flags):
        settings = TrainerSettings(run="t", problems=6, held_out=2, **flags)
        train, held_out = load_theorems(settings)
        run = ESRun(settings, None, train, held_out, MetricsSink(tmp_path / "run"))
        member = Order("es-v0-m0", 0, 7, 1, [train[0].theorem_id])
        evaluation = Order("eval-v0", 0, 0, 1, [held_out[0].theorem_id])
        by_id = {w.work_id: w.sampling["temperature"] for w in run.work_orders([member, evaluation])}
        return by_id["es-v0-m0"], by_id["eval-v0"]

    assert orders() == (0.0, 0.0)
    assert orders(temperature=1.0) == (0.0, 0.0)  # GRPO's setting does not reach ES members
    assert orders(es_temperature=0.7) == (0.7, 0.0)


def test_es_takes_its_batch_and_pairing_from_the_preset_and_grpo_keeps_its_own_batch():
    """The cpu preset is the measured configuration (docs/results/sweep-cpu): its batch and antithetic pairs
    come with it unless set, from flags, env or a config file alike; GRPO's batch is not the preset's."""
    from trainer.config import GRPO_BATCH, PRESETS, TrainerSettings

    es = TrainerSettings()
    assert (es.batch, es.antithetic) == (16, True) == (PRESETS["cpu"]["batch"], PRESETS["cpu"]["antithetic"])
    assert es_config(es).antithetic and es_config(es).alpha == 0.002
    assert TrainerSettings(algo="grpo").batch == GRPO_BATCH == 8
    paper = TrainerSettings(preset="paper")
    assert (paper.batch, paper.antithetic, es_config(paper).population) == (200, False, 30)
    assert TrainerSettings.load(flags={"batch": 4, "antithetic": False}, env={}).batch == 4
    assert TrainerSettings.load(flags={}, env={"PROOFSTREAM_ANTITHETIC": "false"}).antithetic is False
    assert TrainerSettings.load(flags={"algo": "grpo"}, env={}).batch == 8


def test_the_trainer_rides_out_a_redis_restart_and_resumes_from_what_redis_kept(tmp_path):
    """Redis SIGKILLed mid-run and started again on its AOF: the trainer (with --redis-url, as in a stack)
    waits for it, rebuilds its state from Redis, and finishes the run: every version once, no member in two
    updates, every member's score from all of its rewards."""
    from streams.embedded import EmbeddedRedis

    run, iterations = "blip", 8
    keys = Keys(run)
    server = EmbeddedRedis(data_dir=tmp_path / "redis", appendfsync="always").start()
    r = redis_sync.Redis.from_url(server.url)
    roles = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_roles", server.url, run, "0.05"], cwd=ROOT)
    log_path = tmp_path / "trainer.err"
    trainer = None
    try:
        with open(log_path, "w") as err:
            trainer = subprocess.Popen(
                _trainer_argv(server.url, run, tmp_path, iterations), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err
            )
        _until(lambda: r.xlen(keys.policy) >= 2 or trainer.poll() is not None, 120, "two versions")
        assert trainer.poll() is None, log_path.read_text()[-3000:]
        server.kill()
        _until(
            lambda: "Redis is unavailable" in log_path.read_text() or trainer.poll() is not None,
            60,
            "the trainer to notice",
        )
        assert trainer.poll() is None, log_path.read_text()[-3000:]  # still alive, waiting
        server.start()  # the same port and data
        assert trainer.wait(180) == 0, log_path.read_text()[-3000:]
    finally:
        roles.send_signal(signal.SIGTERM)
        roles.wait(30)
        if trainer is not None and trainer.poll() is None:
            trainer.kill()
    updates = [decode(PolicyUpdate, f) for _, f in r.xrange(keys.policy)]
    assert [u.policy_version for u in updates] == list(range(1, iterations + 1))
    used = [w for u in updates for w in u.es_step["members"]]
    assert len(used) == len(set(used))
    for u in updates:
        for seed, raw in zip(u.es_step["seeds"], u.es_step["raw_rewards"], strict=True):
            assert raw == pytest.approx(sum(fake_reward(seed, i) for i in range(3)) / 3, abs=1e-6)
    assert "resuming run 'blip'" in log_path.read_text()
    r.close()
    server.close()


async def test_updates_wait_for_the_quorum_or_the_deadline_use_no_stale_member_and_keep_or_cut_stragglers(
    one_redis, tmp_path
):
    """The async rules of docs/TRAINER.md, one by one, on a real Redis: an update needs a quorum of fresh complete
    members (here 6 of 8), or two once `deadline_s` has passed since the last update; a member whose center is
    more than `max_staleness` versions old is never in a step (dropped and counted); a member still running
    at an update (a straggler) stays, is used by the next update if it is fresh enough then, else cut, counted
    and its order cancelled."""
    from trainer.config import TrainerSettings
    from trainer.metrics import MetricsSink

    settings = TrainerSettings(
        run="rules",
        population=8,
        quorum=0.75,
        max_staleness=1,
        deadline_s=60,
        antithetic=False,
        problems=6,
        held_out=2,
        eval_every=0,
    )
    run = ESRun(settings, one_redis, [], [], MetricsSink(tmp_path))
    run.version = 3

    def add(center: int, index: int, score: float | None) -> Order:
        m = Order(f"es-v{center}-m{index}", center, 100 * center + index, 1, ["t"], issued_at=time.time())
        if score is not None:
            m.rewards = {f"{m.work_id}:0:0": score}
        run.orders[m.work_id] = m
        return m

    for i in range(5):
        add(3, i, i / 10)
    add(1, 0, 0.9)  # complete but two versions old: past the bound
    straggler_fresh, straggler_old = add(3, 9, None), add(2, 9, None)
    assert run._ready() is None  # 5 fresh of a quorum of 6; the stale one does not count
    run.last_update = time.monotonic() - 61
    assert run._ready() is not None and run.counts["deadline_updates"] == 1  # >= 2 fresh past the deadline
    run.last_update = time.monotonic()
    add(2, 0, 0.5)  # one version old: fresh
    ready = run._ready()
    assert ready is not None and run.counts["deadline_updates"] == 1  # at the quorum, not the deadline
    metrics = await run.update(ready)
    step = decode(PolicyUpdate, (await one_redis.xrange(Keys("rules").policy))[-1][1]).es_step
    assert sorted(step["members"]) == sorted([*(f"es-v3-m{i}" for i in range(5)), "es-v2-m0"])
    assert metrics["stale_dropped"] == 1 and run.counts["members_stale_dropped"] == 1
    assert metrics["stragglers"] == 2 and set(run.orders) == {straggler_fresh.work_id, straggler_old.work_id}
    await run._expire()  # the loop's next turn: the straggler of center 2 can never be used at version 4
    assert set(run.orders) == {straggler_fresh.work_id} and run.counts["cut_stale"] == 1
    cancelled = Keys("rules").done(WorkOrder.dedup_for(straggler_old.work_id))
    assert await one_redis.get(cancelled) == b"cancelled"  # a generator that takes its order skips it
    straggler_fresh.rewards = {"s:0:0": 1.0}  # it finishes after the update, now at version 4
    for i in range(5):
        add(4, i, i / 10)
    ready = run._ready()
    await run.update(ready)
    step = decode(PolicyUpdate, (await one_redis.xrange(Keys("rules").policy))[-1][1]).es_step
    assert "es-v3-m9" in step["members"]  # the straggler of center 3 went into the next update
    assert run.orders == {}


async def test_low_rank_members_go_out_in_bundles_and_a_dead_bundle_cuts_every_member_in_it(one_redis, tmp_path):
    """`members_per_order` members of a center to a work order (3, 3, 2 of 8), each named with its seed and
    sign; a dead letter of one bundle loses its three members (cut, cancelled), the others stay; the step
    says its noise, so generators replay it as low-rank."""
    from streams.codec import encode
    from streams.schema import DeadLetter
    from trainer.config import TrainerSettings
    from trainer.metrics import MetricsSink

    settings = TrainerSettings(
        run="bundles",
        population=8,
        es_noise="lowrank",
        es_rank=2,
        members_per_order=3,
        problems=6,
        held_out=2,
        eval_every=0,
    )
    keys = Keys("bundles")
    run = ESRun(settings, one_redis, *_split(settings), MetricsSink(tmp_path))
    await run.resume()
    assert await run.top_up() == 8
    work = [decode(WorkOrder, f) for _, f in await one_redis.xrange(keys.work)]
    assert [len(w.members) for w in work] == [3, 3, 2]
    assert [m["work_id"] for w in work for m in w.members] == [f"es-v0-m{i}" for i in range(8)]
    for w in work:
        assert (
            w.member is None
            and w.rank == 2
            and w.sigma == run.settings.sigma
            and w.work_id.startswith(w.members[0]["work_id"])
        )
        for m in w.members:
            order = run.orders[m["work_id"]]
            assert (m["seed"], m["sign"]) == (order.seed, order.sign)
    assert len({w.work_id for w in work}) == 3
    entry_id = (await one_redis.xrange(keys.work))[0][0]
    letter = DeadLetter(
        keys.work,
        "generators",
        entry_id.decode(),
        4,
        "infrastructure: generator g: boom",
        "g",
        0,
        dict((await one_redis.xrange(keys.work))[0][1]),
    )
    await one_redis.xadd(keys.dlq, encode(letter))
    await run.poll(block_ms=100)
    assert sorted(run.orders) == [f"es-v0-m{i}" for i in range(3, 8)]
    assert run.counts["cut_dead_letter"] == 3
    for i in range(3):
        assert await one_redis.get(keys.done(WorkOrder.dedup_for(f"es-v0-m{i}"))) == b"cancelled"
    members = list(run.orders.values())
    for i, m in enumerate(members):
        m.rewards = {f"{m.work_id}:0:0": i / 10}
    await run.update(members)
    step = decode(PolicyUpdate, (await one_redis.xrange(keys.policy))[-1][1]).es_step
    assert (step["noise"], step["rank"]) == ("lowrank", 2)


async def test_room_goes_out_a_bundle_at_a_time_while_members_wait_for_the_generator(one_redis, tmp_path):
    """With `members_per_order` 4 of 8 at quorum 0.75: after an update the room of the members it used goes out
    at once (bundles of 4 and 2); a straggler that finishes while the new members still wait for the generator
    (no verdict yet) makes room that is held back, and issued once nothing waits (the generator would idle).
    Without the hold, each finished member went out as a one-member work order: one engine call each, which on
    a GPU costs about as much as a call of 32 (docs/results/gpu/README.md)."""
    from trainer.config import TrainerSettings
    from trainer.metrics import MetricsSink

    settings = TrainerSettings(
        run="hold",
        population=8,
        quorum=0.75,
        es_noise="lowrank",
        es_rank=2,
        members_per_order=4,
        batch=2,
        problems=6,
        held_out=2,
        eval_every=0,
    )
    keys = Keys("hold")
    run = ESRun(settings, one_redis, *_split(settings), MetricsSink(tmp_path))
    await run.resume()

    def verdicts(order: Order, n: int) -> None:
        order.rewards = {f"{order.work_id}:{i}:0": 0.1 * i for i in range(n)}

    async def bundles() -> list[int]:
        return [len(decode(WorkOrder, f).members or [1]) for _, f in await one_redis.xrange(keys.work)]

    assert await run.top_up() == 8 and await bundles() == [4, 4]
    for i in range(6):
        verdicts(run.orders[f"es-v0-m{i}"], 2)
    await run.update(run._ready())
    assert run.version == 1 and sorted(run.orders) == ["es-v0-m6", "es-v0-m7"]  # two stragglers, no verdict yet
    assert await run.top_up() == 6 and await bundles() == [4, 4, 4, 2]
    verdicts(run.orders["es-v0-m6"], 2)  # a straggler finishes: room 1, six members wait for the generator
    assert await run.top_up() == 0
    for work_id, order in run.orders.items():
        if work_id != "es-v0-m6":
            verdicts(order, 1)  # every member generated, verification under way: nothing waits
    assert await run.top_up() == 1 and await bundles() == [4, 4, 4, 2, 1]
    assert run.counts["work_orders"] == 5 and run.counts["members_issued"] == 15


def _split(settings):
    from trainer.data import load_theorems

    return load_theorems(settings)


def test_an_unreachable_redis_at_the_start_is_a_clear_error_not_a_traceback(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run(
        _trainer_argv(f"redis://127.0.0.1:{port}/0", "nowhere", tmp_path, 2),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert f"trainer: cannot reach Redis at redis://127.0.0.1:{port}/0" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("content, message", [(None, "no such file"), ('{"bad": 1}\n', ":1: unknown row format")])
def test_a_missing_or_malformed_dataset_is_a_clear_error_not_a_traceback(one_redis_url, tmp_path, content, message):
    dataset = tmp_path / "theorems.jsonl"
    if content is not None:
        dataset.write_text(content)
    argv = [sys.executable, "-m", "trainer", "--redis-url", one_redis_url, "--run", "nodata", "--task", "lean"]
    argv += ["--dataset", str(dataset), "--run-dir", str(tmp_path / "run")]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_end_of_a_run_says_its_result_in_one_line():
    from trainer.__main__ import headline_of
    from trainer.config import TrainerSettings

    settings = TrainerSettings(run="r", iterations=8)
    summary = {
        "version": 8,
        "counts": {"samples": 1024},
        "interrupted": False,
        "wall_s": 397.2,
        "evals": {
            "8": {"held_out_reward": 0.1, "held_out_exact": 0.03125, "problems": 32},
            "0": {"held_out_reward": 0.0875, "held_out_exact": 0.0, "problems": 32},
        },
    }
    assert headline_of(settings, summary) == (
        "run 'r' finished at version 8 of 8 (ES on countdown, SmolLM2-135M-Instruct (default), 6 min 37 s); "
        "held-out reward 0.087 (v0) -> 0.100 (v8); exact 0/32 -> 1/32; 1024 training samples"
    )
    summary["evals"]["4"] = {"held_out_reward": 0.2, "held_out_exact": 0.0625, "problems": 32}  # a better middle
    assert "-> 0.100 (v8), best 0.200 (v4); exact 0/32 -> 1/32, best 2/32;" in headline_of(settings, summary)
    assert headline_of(settings, {"version": 2, "interrupted": True}) == (
        "run 'r' stopped at version 2 of 8 (ES on countdown, SmolLM2-135M-Instruct (default)); 0 training samples"
    )
    assert headline_of(settings, {"interrupted": True}) == ""


def test_only_a_redis_outage_is_waited_out_not_a_local_failure():
    import redis.exceptions as rx

    from trainer.__main__ import _outage

    assert _outage(rx.ConnectionError("refused")) and _outage(rx.ReadOnlyError()) and _outage(ConnectionResetError())
    assert not _outage(OSError(28, "No space left on device")) and not _outage(FileNotFoundError("checkpoint"))
