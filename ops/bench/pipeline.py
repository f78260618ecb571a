"""`python -m ops bench pipeline`: how well generation, verification and training overlap, end to end.

The real ES trainer (`trainer.es.ESRun`: top up, read rewards, update at the quorum, checkpoint) runs in
this process; the generator (`producers.service.GeneratorService`) and the verifier pool
(`consumers.service.VerifierService`) run as deployed, each in a process of its own, with only the model and
the sandboxes replaced by fixed latencies (`ops/bench/pipeline_roles.py`); all three talk through a private Redis
(or `--redis-url`). The latencies are real waiting: `--gen-ms` per attempt on each of `--generators` (one
process = one accelerator, its attempts one after another), `--verify-ms` per attempt on each of
`--verifier-slots` sandboxes, and `--train-ms` per update in the trainer (a sleep before the step is
published, holding the trainer as a training step would). Each stage records when it was busy. The ES
schedule (`--population` members in flight, an update at `--quorum` of them, members at most
`--max-staleness` versions old used, `--batch` theorems each) is the trainer's default unless given.

Figures, per policy version, over the steady state: the `--versions` updates after the first `--warmup`.
- `iteration_s`: wall seconds per version: from the last warm-up update's publication to the last one's,
  divided by `--versions`. Measured; nothing in it is assumed.
- `attempts_per_version`: the attempts the updates used (members used x theorems per member). Work thrown
  away (members dropped as stale, orders skipped as stale) is not in it: it costs time and earns nothing.
- `stage_s`: each stage's busy time for that work. generate: attempts x gen_ms / generators; verify:
  attempts x verify_ms / verifier slots; train: the trainer's update as measured (the `--train-ms` sleep
  plus the real ES update: select, step, checkpoint, policy entry).
- `ideal_s` = max(stage_s): no schedule does the work faster than its slowest stage.
- `sequential_s` = sum(stage_s): the same work run generate, then verify, then train, in series.
- `efficiency` = ideal_s / iteration_s: 1.0 means the slowest stage spent the whole time on used work.
- `efficiency_factors`: where the bottleneck's time went; their product is the efficiency (up to the ends
  of the window): `busy` (its utilization: share of capacity spent in engine calls or checks), `kept`
  (attempts used / attempts it processed) and `latency` (the latency asked / the latency measured: a sleep
  overshoots a little).
- `idle_between_calls_ms`: median gap between one engine call (or check) and the next on the same
  generator (or slot): the per-order (per-attempt) cost of the runtime around the stage.
Last line of output: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import redis as redis_sync

from ops.bench import common
from streams import logs, role_stats
from streams.connect import connect, connect_sync
from streams.keys import Keys
from tasks.countdown import countdown_problems
from trainer.config import PRESETS, TrainerSettings
from trainer.es import ESRun
from trainer.local import LocalPipeline
from trainer.metrics import MetricsSink

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
WALL_OFFSET_S = time.time() - time.monotonic()  # entry ids carry Redis's wall clock; busy times are monotonic
STAGES = ("generate", "verify", "train")


# -- the worker processes -------------------------------------------------------------------------------


class Roles(LocalPipeline):
    """The generator and verifier processes of one bench, run as `python -m trainer` runs its children
    (LocalPipeline: sessions of their own, SIGTERM from the kernel if the bench dies, `stop` idempotent:
    SIGTERM to each group, a grace period, SIGKILL of the group). The Redis is not theirs to start."""

    def start_roles(self, args: argparse.Namespace) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        for i in range(args.generators):
            self._role(f"generator-{i}", "generator", "--name", f"bench-gen-{i}", "--gen-ms", str(args.gen_ms))
        self._role("verifier", "verifier", "--slots", str(args.verifier_slots), "--verify-ms", str(args.verify_ms))

    def _role(self, name: str, *argv: str) -> None:
        s = self.settings
        argv = (
            *argv,
            "--redis-url",
            s.redis_url,
            "--run",
            s.run,
            "--stats-out",
            str(self._stats(name)),
            "--log-level",
            s.log_level,
        )
        self._spawn(name, [sys.executable, "-m", "ops.bench.pipeline_roles", *argv], dict(os.environ))

    def _stats(self, name: str) -> Path:
        return self.run_dir / f"{name}.json"

    def wait_ready(self, generators: int) -> None:
        """Until every generator and the verifier pool have reported themselves to Redis."""
        keys, r = Keys(self.settings.run), connect_sync(self.settings.redis_url)
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while len(role_stats.generators_sync(r, keys)) < generators or not role_stats.verifiers_sync(r, keys):
                self.check()
                if time.monotonic() > deadline:
                    tails = "\n".join(f"{name}: ...{self.log_tail(name)}" for name, _ in self.children)
                    raise RuntimeError(f"bench roles not ready after {READY_TIMEOUT_S:.0f} s; their logs end:\n{tails}")
                time.sleep(0.05)
        finally:
            r.close()

    def stop_roles(self) -> list[dict]:
        """Stop every role (each drains: the entry in hand is settled) and return what each recorded; a role
        that wrote nothing (it was killed) is `{"role": name, "missing": True}`."""
        names = [name for name, _ in self.children]
        self.stop(grace_s=STOP_GRACE_S)
        return [
            orjson.loads(f.read_bytes()) if (f := self._stats(n)).exists() else {"role": n, "missing": True}
            for n in names
        ]


# -- the trainer -------------------------------------------------------------------------------------------


class TimedESRun(ESRun):
    """ESRun whose update first trains for `train_s` (a sleep in a thread: the trainer waits for it as for a
    training step) and records when each version was published and how long its update took."""

    def __init__(self, *args: Any, train_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.train_s = train_s
        self.published: list[dict[str, Any]] = []

    async def update(self, complete: list) -> dict[str, Any]:
        started = time.monotonic()
        if self.train_s:
            await asyncio.to_thread(time.sleep, self.train_s)
        metrics = await super().update(complete)
        ended = time.monotonic()
        self.published.append({**metrics, "at": ended, "busy_s": ended - started})
        return metrics


async def train(settings: TrainerSettings, args: argparse.Namespace, roles: Roles) -> list[dict]:
    """Run the ES trainer until `warmup + versions` versions exist; return what each update recorded."""
    redis = connect(settings.redis_url)
    problems = list(countdown_problems(settings.problems, 0))
    es_run = TimedESRun(settings, redis, problems, [], MetricsSink(settings.directory()), train_s=args.train_ms / 1000)
    stop = asyncio.Event()
    watch = asyncio.create_task(roles.watch(stop, every_s=0.5, timeout_s=args.timeout_s))
    try:
        await es_run.run(stop)
    finally:
        watch.cancel()
        (stopped_by,) = await asyncio.gather(watch, return_exceptions=True)
        await redis.aclose()
    if isinstance(stopped_by, RuntimeError):  # a role died, or the time ran out: the trainer was stopped
        raise stopped_by
    return es_run.published


# -- the figures -------------------------------------------------------------------------------------------


def _in_window(lanes: list[list], t0: float, t1: float) -> tuple[float, float]:
    """(busy seconds, attempts) of the intervals (start, end, attempts) inside [t0, t1]; an interval the
    window cuts counts pro rata."""
    busy = attempts = 0.0
    for start, end, n in (b for lane in lanes for b in lane):
        inside = max(0.0, min(end, t1) - max(start, t0))
        busy += inside
        attempts += n * inside / (end - start) if end > start else n * (t0 <= start <= t1)
    return busy, attempts


def _latency(lanes: list[list]) -> float:
    """Seconds per attempt, as measured over the whole run."""
    calls = [b for lane in lanes for b in lane]
    attempts = sum(n for *_, n in calls)
    return sum(end - start for start, end, _ in calls) / attempts if attempts else 0.0


def _median_gap(lanes: list[list], t0: float, t1: float) -> float:
    """Median seconds from the end of one interval to the start of the next in the same lane, inside [t0, t1]."""
    gaps = [b[0] - a[1] for lane in lanes for a, b in itertools.pairwise(lane) if t0 <= a[1] and b[0] <= t1]
    return statistics.median(gaps) if gaps else 0.0


def figures(updates: list[dict], roles: list[dict], args: argparse.Namespace) -> dict:
    """The JSON's figures from what the trainer and the roles recorded (see the module docstring)."""
    steady = updates[args.warmup :]  # warmup >= 1: the window opens at the last warm-up update
    t0, t1 = updates[args.warmup - 1]["at"], steady[-1]["at"]
    n, window = len(steady), t1 - t0
    iteration_s = window / n
    lanes = {
        "generate": [lane for r in roles if r["role"] == "generator" for lane in r["lanes"]],
        "verify": [lane for r in roles if r["role"] == "verifier" for lane in r["lanes"]],
    }
    parallel = {"generate": args.generators, "verify": args.verifier_slots}
    asked_s = {"generate": args.gen_ms / 1000, "verify": args.verify_ms / 1000}
    attempts = sum(u["attempts"] for u in steady) / n
    train_s = sum(u["busy_s"] for u in steady) / n
    stage_s = {**{s: attempts * asked_s[s] / parallel[s] for s in parallel}, "train": train_s}
    ideal_s = max(stage_s.values())
    bottleneck = max(stage_s, key=stage_s.get)
    utilization, processed = {"train": train_s / iteration_s}, {}
    for s, stage_lanes in lanes.items():
        busy, done = _in_window(stage_lanes, t0, t1)
        utilization[s], processed[s] = busy / (window * parallel[s]), done / n
    measured_s = {s: _latency(stage_lanes) for s, stage_lanes in lanes.items()}
    if bottleneck == "train":
        factors = {"busy": utilization["train"], "kept": 1.0, "latency": 1.0}
    else:
        done, took = processed[bottleneck], measured_s[bottleneck]  # 0 only if the stage did nothing at all
        factors = {
            "busy": utilization[bottleneck],
            "kept": attempts / done if done else 0.0,
            "latency": asked_s[bottleneck] / took if took else 0.0,
        }
    staleness: collections.Counter[str] = collections.Counter()
    for u in steady:
        staleness.update(u["staleness"])
    generators = [r for r in roles if r["role"] == "generator"]
    return {
        "bench": "pipeline",
        **{
            k: getattr(args, k)
            for k in (
                "gen_ms",
                "verify_ms",
                "train_ms",
                "generators",
                "verifier_slots",
                "population",
                "batch",
                "quorum",
                "max_staleness",
                "versions",
                "warmup",
            )
        },
        "iteration_s": round(iteration_s, 4),
        "ideal_s": round(ideal_s, 4),
        "sequential_s": round(sum(stage_s.values()), 4),
        "efficiency": round(ideal_s / iteration_s, 4),
        "bottleneck": bottleneck,
        "stage_s": _rounded(stage_s),
        "efficiency_factors": _rounded(factors),
        "utilization": _rounded({s: utilization[s] for s in STAGES}),
        "attempts_per_version": round(attempts, 2),
        "members_per_version": round(sum(u["members"] for u in steady) / n, 2),
        "processed_per_version": _rounded(processed, 2),
        "latency_ms_measured": _rounded({s: x * 1000 for s, x in measured_s.items()}, 3),
        "idle_between_calls_ms": _rounded({s: _median_gap(x, t0, t1) * 1000 for s, x in lanes.items()}, 3),
        "staleness": dict(sorted(staleness.items())),
        "stale_dropped": sum(u["stale_dropped"] for u in steady),
        "stale_orders_skipped": sum(g["counts"]["stale_skipped"] for g in generators),  # the whole run
        "generator_held_for_room_s": round(sum(g["held_for_room_s"] for g in generators), 3),  # the whole run
    }


def _rounded(d: dict[str, float], digits: int = 4) -> dict[str, float]:
    return {k: round(x, digits) for k, x in d.items()}


# -- running -----------------------------------------------------------------------------------------------


def bench(url: str, args: argparse.Namespace) -> dict:
    run = f"bench-pipeline-{os.getpid()}-{int(time.time())}"
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="proofstream-bench-pipeline-") as tmp:
        settings = TrainerSettings(
            run=run,
            redis_url=url,
            log_level=args.log_level,
            run_dir=str(Path(tmp) / "run"),
            iterations=args.warmup + args.versions,
            population=args.population,
            batch=args.batch,
            quorum=args.quorum,
            max_staleness=args.max_staleness,
            problems=max(64, args.batch * 4),
            held_out=0,
            eval_every=0,
        )
        roles = Roles(settings, Path(tmp))
        try:
            roles.start_roles(args)
            roles.wait_ready(args.generators)
            updates = asyncio.run(train(settings, args, roles))
        finally:
            recorded = roles.stop_roles()
            try:
                streams = _stream_times(url, run) if args.trace_out else {}
                common.delete_run(url, run)
            except redis_sync.ConnectionError:
                streams = {}  # the private server is gone already (a Ctrl-C in the terminal reached it too)
    if args.trace_out:
        trace = {"updates": updates, "roles": recorded, "streams": streams, "wall_minus_monotonic_s": WALL_OFFSET_S}
        Path(args.trace_out).write_bytes(orjson.dumps(trace))
    missing = [r["role"] for r in recorded if r.get("missing")]
    if missing:
        raise RuntimeError(f"bench roles {missing} stopped without writing their figures")
    return {**figures(updates, recorded, args), **common.machine(load_before)}


def _stream_times(url: str, run: str) -> dict[str, list]:
    """For the trace: when each entry of the run's streams was added (ms, from its id) and what it was about."""
    r, keys, out = connect_sync(url), Keys(run), {}
    try:
        for name, field in (
            ("work", b"work_id"),
            ("attempts", b"attempt_id"),
            ("rewards", b"attempt_id"),
            ("policy", b"policy_version"),
        ):
            out[name] = [
                [int(eid.split(b"-")[0]), f.get(field, b"").decode()] for eid, f in r.xrange(keys.stream(name))
            ]
    finally:
        r.close()
    return out


def usage(args: argparse.Namespace) -> str | None:
    if min(args.gen_ms, args.verify_ms, args.train_ms) < 0:
        return "latencies cannot be negative"
    if args.generators < 1 or args.verifier_slots < 1 or args.population < 2 or args.batch < 1:
        return "--generators, --verifier-slots and --batch must be at least 1, --population at least 2"
    if not 0 < args.quorum <= 1 or args.max_staleness < 0:
        return "--quorum must be in (0, 1] and --max-staleness at least 0"
    if args.warmup < 1 or args.versions < 2:
        return "--warmup must be at least 1 (the window opens at an update) and --versions at least 2"
    return None


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the bench as Ctrl-C does: through the `finally` that stops the roles


def summary(result: dict) -> str:
    return (
        f"pipeline: {result['iteration_s']} s per version, ideal {result['ideal_s']} s ({result['bottleneck']}), "
        f"sequential {result['sequential_s']} s, efficiency {result['efficiency']}"
    )


def measure(args: argparse.Namespace) -> dict:
    logs.configure(args.log_level)
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main_thread else None
    try:
        return common.on_redis(args, lambda url: bench(url, args))
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def add_parser(sub: argparse._SubParsersAction) -> None:
    about = "the ES trainer, generators and verifiers overlapping, synthetic latencies"
    p = common.add_bench(sub, "pipeline", about, measure, summary, description=__doc__, usage=usage)
    p.add_argument("--gen-ms", type=float, default=20.0, help="generation time per attempt, per generator")
    p.add_argument("--verify-ms", type=float, default=15.0, help="check time per attempt, per verifier slot")
    p.add_argument("--train-ms", type=float, default=0.0, help="training time per update, in the trainer")
    p.add_argument("--generators", type=int, default=1, help="generator processes (one accelerator each)")
    p.add_argument("--verifier-slots", type=int, default=1, help="sandboxes checking at once (one process)")
    trainer = TrainerSettings.model_fields  # the ES schedule: the trainer's own defaults unless given
    p.add_argument("--population", type=int, default=PRESETS["cpu"]["population"], help="ES members in flight")
    p.add_argument("--batch", type=int, default=trainer["batch"].default, help="theorems per member")
    p.add_argument(
        "--quorum", type=float, default=trainer["quorum"].default, help="share of the population an update waits for"
    )
    p.add_argument(
        "--max-staleness",
        type=int,
        default=trainer["max_staleness"].default,
        help="versions a member's center may lag behind the version it is used for",
    )
    p.add_argument("--versions", type=int, default=20, help="versions measured after the warm-up")
    p.add_argument("--warmup", type=int, default=2, help="versions run first and not measured")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up after this long")
    p.add_argument("--log-level", default="warning", help="of the trainer and the roles (their logs: a temp dir)")
    p.add_argument("--trace-out", default="", help="write every update's time and every busy interval here (JSON)")
    common.add_ending(p, redis=True)
