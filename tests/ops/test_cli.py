"""`python -m ops` against a real Redis (7.x and 6.2): the figures it prints are the ones Redis holds, and
a dead letter made by a real consumer can be listed, shown, requeued byte for byte, consumed and purged."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import sys

import orjson

from ops.cli import NO_REDIS, main
from streams.connect import connect
from streams.keys import VERIFIERS, Keys
from streams.publisher import Publisher
from streams.runtime import Consumer, ConsumerSettings, Delivery, Poison
from streams.schema import Attempt, Reward

SETTINGS = ConsumerSettings(batch_size=10, block_ms=50)


def attempt(i: int) -> Attempt:
    return Attempt(
        attempt_id=f"a{i}",
        work_id="w",
        theorem_id=f"t{i}",
        policy_version=0,
        sample_index=i,
        proof="theorem t : 1 + 1 = 2 := by\n  norm_num",
    )


def handler(poison: set[str] = frozenset()):
    async def handle(d: Delivery[Attempt]) -> list[Reward]:
        a = d.message
        if a.attempt_id in poison:
            raise Poison("statement missing")
        return [
            Reward(attempt_id=a.attempt_id, theorem_id=a.theorem_id, policy_version=0, verdict="proved", reward=1.0)
        ]

    return handle


async def consume_once(redis, keys, name: str, poison: set[str] = frozenset()) -> Consumer:
    c = Consumer(
        redis,
        keys,
        message_type=Attempt,
        group=VERIFIERS,
        name=name,
        handler=handler(poison),
        output=Reward,
        settings=SETTINGS,
    )
    await c.ensure_group()
    await c.run_once()
    return c


async def ops(capsys, url: str, *argv: str) -> tuple[int, str, str]:
    """main(argv) in a worker thread (it runs its own event loop), with stdout and stderr captured."""
    code = await asyncio.to_thread(main, [*argv, "--redis-url", url, "--run", "test"])
    out, err = capsys.readouterr()
    return code, out, err


async def ops_json(capsys, url: str, *argv: str) -> dict:
    code, out, err = await ops(capsys, url, *argv, "--json")
    assert code == 0, err
    return orjson.loads(out)


async def dead_letter_ids(redis, keys) -> list[str]:
    return [eid.decode() for eid, _ in await redis.xrange(keys.dlq)]


# -- streams ------------------------------------------------------------------------------------------


async def test_streams_reports_length_lag_pending_and_consumers(redis, redis_url, keys, capsys):
    await Publisher(redis, keys).publish([attempt(i) for i in range(6)])
    consumer = await consume_once(redis, keys, "c1")
    assert consumer.stats.processed == 6
    await Publisher(redis, keys).publish([attempt(i) for i in range(6, 9)])
    [[_, [(held_id, _)]]] = await redis.xreadgroup(VERIFIERS, "c2", {keys.attempts: ">"}, count=1)
    held_id = held_id.decode()

    report = await ops_json(capsys, redis_url, "streams")

    s = report["streams"]
    assert list(s) == ["work", "attempts", "rewards", "dlq", "policy", "metrics"]
    assert s["attempts"]["key"] == "{ps:test}:attempts"
    assert s["attempts"]["length"] == 9
    g = s["attempts"]["groups"]["verifiers"]
    assert (g["lag"], g["pending"]) == (2, 1)
    assert g["last_delivered_id"] == g["oldest_pending_id"] == held_id
    assert g["oldest_pending_age_ms"] >= 0 and g["oldest_pending_idle_ms"] >= 0
    assert {c["name"]: c["pending"] for c in g["consumers"]} == {"c1": 0, "c2": 1}
    assert all(c["idle_ms"] >= 0 for c in g["consumers"])
    assert (s["rewards"]["length"], s["rewards"]["groups"]) == (6, {})
    assert (s["work"]["length"], s["dlq"]["length"]) == (0, 0)

    code, out, _ = await ops(capsys, redis_url, "streams")
    assert code == 0
    [row] = [line.split() for line in out.splitlines() if line.startswith("attempts ")]
    assert row[:7] == ["attempts", "9", "verifiers", "2", "1", held_id, held_id]
    assert [line.split()[:4] for line in out.splitlines() if line.startswith("c2 ")] == [
        ["c2", "attempts", "verifiers", "1"]
    ]


async def test_flags_before_the_command_and_from_a_config_file(redis, redis_url, tmp_path, capsys):
    await Publisher(redis, Keys("other")).publish([attempt(0)])
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'run = "other"\nredis_url = "{redis_url}"\n[ops]\ntimeout_s = 3\n')
    for argv in (
        ["--config", str(cfg), "streams", "--json"],
        ["--run", "other", "--redis-url", redis_url, "--json", "streams"],
    ):
        assert await asyncio.to_thread(main, argv) == 0
        report = orjson.loads(capsys.readouterr().out)
        assert (report["run"], report["streams"]["attempts"]["length"]) == ("other", 1)


# -- dead letters -------------------------------------------------------------------------------------


async def test_dead_letter_listed_shown_requeued_byte_identical_then_consumed(redis, redis_url, keys, capsys):
    await Publisher(redis, keys).publish([attempt(i) for i in range(3)])
    entries = await redis.xrange(keys.attempts)
    poison_id, original = entries[1][0].decode(), entries[1][1]
    await consume_once(redis, keys, "c1", poison={"a1"})
    [letter_id] = await dead_letter_ids(redis, keys)

    listed = await ops_json(capsys, redis_url, "dlq", "list")
    assert listed["length"] == 1
    [row] = listed["dead_letters"]
    assert (row["id"], row["source"], row["group"], row["original_id"], row["deliveries"], row["reason"]) == (
        letter_id,
        keys.attempts,
        VERIFIERS,
        poison_id,
        1,
        "poison: statement missing",
    )
    code, out, _ = await ops(capsys, redis_url, "dlq", "list")
    assert code == 0 and letter_id in out and "poison: statement missing" in out

    shown = await ops_json(capsys, redis_url, "dlq", "show", letter_id)
    assert shown["letter"]["reason"] == "poison: statement missing"
    assert shown["letter"]["consumer"] == "c1"
    assert shown["original"] == {k.decode(): v.decode() for k, v in original.items()}
    assert (shown["original_type"], shown["original_decoded"]["attempt_id"]) == ("Attempt", "a1")
    code, out, _ = await ops(capsys, redis_url, "dlq", "show", letter_id)
    assert code == 0 and "  norm_num" in out and poison_id in out

    requeued = await ops_json(capsys, redis_url, "dlq", "requeue", letter_id)
    [r] = requeued["requeued"]
    assert (r["id"], r["source"]) == (letter_id, keys.attempts)
    [(_, fields)] = await redis.xrange(keys.attempts, r["new_id"], r["new_id"])
    assert list(fields.items()) == list(original.items())
    assert await redis.xlen(keys.dlq) == 0

    await consume_once(redis, keys, "c2")
    rewarded = [f[b"attempt_id"] for _, f in await redis.xrange(keys.rewards)]
    assert sorted(rewarded) == [b"a0", b"a1", b"a2"]
    g = (await ops_json(capsys, redis_url, "streams"))["streams"]["attempts"]["groups"]["verifiers"]
    assert (g["lag"], g["pending"]) == (0, 0)

    code, _, err = await ops(capsys, redis_url, "dlq", "requeue", letter_id)
    assert code == 1 and err.startswith("ops: no dead letter")


async def test_undecodable_bytes_shown_safely_and_requeued_unchanged(redis, redis_url, keys, capsys):
    original = {b"v": b"1", b"attempt_id": b"\xff\xfe", b"token_ids": b"\x00\x01\x80", b"proof": b"ok"}
    await redis.xadd(keys.attempts, original)
    await consume_once(redis, keys, "c1")
    [letter_id] = await dead_letter_ids(redis, keys)

    shown = await ops_json(capsys, redis_url, "dlq", "show", letter_id)
    assert shown["letter"]["reason"].startswith("schema: Attempt.attempt_id")
    assert shown["original"]["attempt_id"] == {"base64": "//4=", "bytes": 2}
    assert shown["original_decoded"] is None and "attempt_id" in shown["original_error"]
    code, out, _ = await ops(capsys, redis_url, "dlq", "show", letter_id)
    assert code == 0 and "<2 bytes, not UTF-8, base64 //4=>" in out

    [r] = (await ops_json(capsys, redis_url, "dlq", "requeue", "--all"))["requeued"]
    [(_, fields)] = await redis.xrange(keys.attempts, r["new_id"], r["new_id"])
    assert list(fields.items()) == list(original.items())


async def test_purge_one_then_all_with_confirmation(redis, redis_url, keys, capsys):
    await Publisher(redis, keys).publish([attempt(i) for i in range(3)])
    await consume_once(redis, keys, "c1", poison={"a0", "a1", "a2"})
    first, *rest = await dead_letter_ids(redis, keys)
    assert len(rest) == 2

    assert (await ops_json(capsys, redis_url, "dlq", "purge", first))["purged"] == [first]
    assert await dead_letter_ids(redis, keys) == rest
    code, _, err = await ops(capsys, redis_url, "dlq", "purge", first)
    assert code == 1 and "no dead letter" in err

    code, _, err = await ops(capsys, redis_url, "dlq", "purge", "--all")
    assert code == 2 and "--yes" in err
    assert await dead_letter_ids(redis, keys) == rest
    code, out, _ = await ops(capsys, redis_url, "dlq", "purge", "--all", "--yes")
    assert (code, out.strip()) == (0, "purged 2 dead letters")
    assert await dead_letter_ids(redis, keys) == []


# -- tail ---------------------------------------------------------------------------------------------


async def test_tail_decodes_the_last_entries(redis, redis_url, keys, capsys):
    ids = await Publisher(redis, keys).publish([attempt(i) for i in range(3)])
    await redis.xadd(keys.metrics, {"policy_version": "3", "reward_mean": "0.25"})

    data = await ops_json(capsys, redis_url, "tail", "attempts", "--count", "2")
    assert [e["id"] for e in data["entries"]] == [i.decode() for i in ids[1:]]
    assert [(e["type"], e["fields"]["attempt_id"], e["error"]) for e in data["entries"]] == [
        ("Attempt", "a1", None),
        ("Attempt", "a2", None),
    ]
    assert data["entries"][0]["fields"]["policy_version"] == 0

    code, out, _ = await ops(capsys, redis_url, "tail", "attempts", "-n", "2")
    assert code == 0 and "attempt_id=a2" in out and "attempt_id=a0" not in out
    code, out, _ = await ops(capsys, redis_url, "tail", "metrics")
    assert code == 0 and "policy_version=3 reward_mean=0.25" in out
    # what the trainer writes: the version's figures as JSON; each shown, none cut off with the rest
    figures = {"version": 4, "reward_mean": 0.125, **{f"figure_{i}": i for i in range(20)}, "cut_timeout": 2}
    await redis.xadd(keys.metrics, {"v": "1", "json": orjson.dumps(figures)})
    code, out, _ = await ops(capsys, redis_url, "tail", "metrics", "-n", "1")
    assert code == 0 and out.startswith(f"{(await redis.xrevrange(keys.metrics, count=1))[0][0].decode()}  version=4")
    assert "reward_mean=0.125" in out and "figure_19=19 cut_timeout=2" in out
    code, out, _ = await ops(capsys, redis_url, "tail", "work")
    assert (code, out.strip()) == (0, "{ps:test}:work has no entries")


async def test_tail_follow_prints_new_entries_and_ends_on_ctrl_c(system_redis_server):
    keys = Keys("follow")
    redis = connect(system_redis_server.url)
    await Publisher(redis, keys).publish([attempt(0)])
    argv = [sys.executable, "-m", "ops", "tail", "attempts", "--follow", "--run", "follow"]
    argv += ["--redis-url", system_redis_server.url]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_clean_env())
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
        assert "attempt_id=a0" in line
        await Publisher(redis, keys).publish([attempt(1)])
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
        assert "attempt_id=a1" in line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert "Traceback" not in proc.stderr.read()
        assert (await redis.xinfo_stream(keys.attempts))["groups"] == 0  # a plain read, never a group
    finally:
        proc.kill()
        proc.wait()
        await redis.aclose()


# -- failing clearly ----------------------------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}


def test_no_redis_url_exits_2_with_what_to_do():
    proc = subprocess.run(
        [sys.executable, "-m", "ops", "streams"], capture_output=True, text=True, env=_clean_env(), timeout=30
    )
    assert proc.returncode == 2
    assert proc.stderr == f"ops: {NO_REDIS}\n"
    assert "--redis-url" in NO_REDIS and "PROOFSTREAM_REDIS_URL" in NO_REDIS


def test_unreachable_redis_and_bad_flags_fail_in_one_line(capsys):
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert main(["streams", "--redis-url", f"redis://:secret@127.0.0.1:{port}/0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ops: cannot reach Redis at redis://:***@127.0.0.1:") and "secret" not in err
    assert err.count("\n") == 1

    for argv in (["streams", "--bogus"], ["tail", "nope"], ["dlq", "show", "not-an-id"], ["--run", "a{b}", "streams"]):
        assert main([*argv, "--redis-url", "redis://127.0.0.1:1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err


def test_a_bench_refuses_an_out_it_could_not_write_before_measuring(tmp_path, capsys):
    """`--out` in a folder that is not there: refused at once (exit 2, one line), not after minutes of
    measuring; nothing is written."""
    missing = tmp_path / "no-such-folder" / "wire.json"
    assert main(["bench", "wire", "--out", str(missing)]) == 2
    assert capsys.readouterr().err == f"bench wire: --out {missing}: there is no folder {missing.parent}\n"
    assert main(["bench", "wire", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"bench wire: --out {tmp_path} is a folder: name a file in it\n"
    assert list(tmp_path.iterdir()) == []


def test_bench_subcommands_come_from_bench_wire(capsys):
    assert main(["bench", "wire", "--help"]) == 0
    assert "--rounds" in capsys.readouterr().out
    assert main(["bench"]) == 2


# -- a run's health -----------------------------------------------------------------------------------


async def test_run_shows_the_trainer_in_flight_generators_dead_letters_and_groups(
    redis, redis_url, keys, capsys, tmp_path
):
    """`python -m ops run` on a run a real ES trainer issued members for, with a dead letter made by a real
    consumer and a generator's figures: every figure is the one Redis holds."""
    from trainer.config import TrainerSettings
    from trainer.data import load_theorems
    from trainer.es import ESRun
    from trainer.metrics import MetricsSink

    settings = TrainerSettings(run=keys.run, population=4, batch=2, problems=8, held_out=2, antithetic=False)
    train, held_out = load_theorems(settings)
    es = ESRun(settings, redis, train, held_out, MetricsSink(tmp_path))
    await es.resume()
    assert await es.top_up() == 4  # four members in flight, written to the state and published as work
    await es.checkpoint()  # as the trainer's loop does every few seconds: the counts are in the state too
    await Publisher(redis, keys).publish([attempt(1), dataclasses.replace(attempt(2), work_id="es-v0-m1")])
    await consume_once(redis, keys, "c1", poison={"a2"})  # a2 dead-lettered: poison
    await es.poll(block_ms=1)  # the trainer reads the dead letter: member 1 will never complete; cut
    await es.checkpoint()
    await redis.hset(keys.generator_stats, "g1", orjson.dumps({"orders": 5, "attempts": 10, "stale_skipped": 2}))
    await redis.set(keys.trainer_lease, orjson.dumps({"host": "h", "pid": 42, "token": "t", "since": 0}))

    report = await ops_json(capsys, redis_url, "run")

    t = report["trainer"]
    assert (t["algo"], t["version"], t["in_flight"], t["complete_waiting"]) == ("es", 0, 3, 0)
    assert t["oldest_in_flight_ms"] >= 0 and t["counts"]["members_issued"] == 4
    assert t["counts"]["cut_dead_letter"] == 1
    assert report["lease"]["pid"] == 42
    assert report["generators"]["g1"] == {
        "orders": 5,
        "attempts": 10,
        "stale_skipped": 2,
        "settled_skipped": 0,
        "policy_errors": 0,
    }
    assert report["dead_letters"] == {"total": 1, "by_reason": {"attempts: poison": 1}, "counted_of_newest": 1}
    assert report["groups"]["work/generators"]["lag"] == 4  # nobody took the members' orders yet
    assert report["groups"]["attempts/verifiers"]["pending"] == 0
    code, out, _ = await ops(capsys, redis_url, "run")
    assert code == 0
    assert "trainer: es version 0; 3 in flight" in out and "lease: h pid 42" in out
    assert "lost orders: cut_dead_letter 1" in out
    assert "dead letters: 1" in out and "attempts: poison" in out
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("g1 ")] == [["g1", "5"]]
