"""The ES run: issue members, collect rewards, update, publish; checkpointed so a killed trainer resumes.

The loop, until `iterations` versions exist:

1. **Top up.** Keep `population` members in flight (issued, not yet fully rewarded) around the newest
   center, so generators never wait for an update. Members are written to the checkpoint before their
   work orders are published (write-ahead); their work ids and seeds are pure functions of
   (run, center, index), so a restarted trainer re-publishes the same orders and the generators' markers
   make the repeats no-ops.
2. **Collect.** Read `{ps:R}:rewards` in group `trainer`; add each reward to its member by attempt id
   (a reward seen twice counts once). Rewards are acked only after a checkpoint holding them is written:
   a trainer killed in between re-reads them from its pending list.
3. **Update.** When a quorum of the population has reported (or at the deadline, with at least two),
   z-score the members' rewards (members older than `max_staleness` are dropped, counted) and publish the
   step. The policy entry, the checkpoint and the version's metrics are written in one MULTI, so a restart
   never sees one without the others.

Evaluation orders (`eval-v<version>`: the center, greedy, on the held-out split) go through the same
pipeline every `eval_every` versions and at the end.

After each update, and at the end, the rewards and work orders that every group has acked and that are
older than `history_s` are trimmed from their streams (`streams.groups.trim_acked`): a long run's Redis
holds what is in flight plus the last hour, not every attempt's reward since the start.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from streams.groups import trim_acked
from streams.keys import GENERATORS, TRAINER, Keys
from streams.runtime import ensure_group
from streams.schema import DeadLetter, Member, PolicyUpdate, Reward, SchemaError, WorkOrder, decode, encode
from streams.theorems import Theorem, register
from trainer.config import TrainerSettings
from trainer.es import PRESETS, ESConfig, MemberState, make_step, members_for, select
from trainer.metrics import MetricsSink

log = structlog.get_logger("trainer.run")

STATE_FIELD = "state"


FINISHED_BEFORE = 3  # python -m trainer's exit status when the run id names a finished run


class RunMismatch(RuntimeError):
    """The run directory and the Redis it was given do not describe the same run."""


class RunFinished(RuntimeError):
    """The run id names a finished run: resuming it would do nothing, silently."""


CHECKPOINT_EVERY_S = 2.0


def es_config(settings: TrainerSettings) -> ESConfig:
    preset = PRESETS[settings.preset]
    return ESConfig(
        population=settings.population or preset["population"],
        sigma=settings.sigma or preset["sigma"],
        alpha=settings.alpha or preset["alpha"],
        antithetic=settings.antithetic,
        max_staleness=settings.max_staleness,
        quorum=settings.quorum,
        deadline_s=settings.deadline_s,
    )


class Run:
    """What every algorithm's run shares: state, checkpoint, orders, rewards, evaluation, the loop."""

    algo = ""

    def __init__(
        self,
        settings: TrainerSettings,
        redis: Redis,
        train: list[Theorem],
        held_out: list[Theorem],
        sink: MetricsSink,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.keys = Keys(settings.run)
        self.train = train
        self.held_out = held_out
        self.sink = sink
        self.progress = progress or (lambda version: None)
        self.consumer = "trainer"
        # checkpointed state
        self.version = 0
        self.next_index: dict[int, int] = collections.defaultdict(int)
        self.members: dict[str, MemberState] = {}
        self.evals: dict[str, MemberState] = {}
        self.eval_results: dict[int, dict[str, Any]] = {}
        self.eval_ids: list[str] = []  # the held-out split as evaluated: what trainer.eval checks its own against
        self.counts: collections.Counter[str] = collections.Counter()
        self.finished = False  # the run reached `iterations` and its last evaluation
        self.last_update = time.monotonic()
        # not checkpointed: rewards read since the last checkpoint (entry ids to ack once it is written)
        self._unacked: list[bytes] = []
        self._verdicts: collections.Counter[str] = collections.Counter()
        self._last_checkpoint = 0.0
        self._window_started = time.monotonic()
        self._window_rewards = 0

    # -- checkpoint ------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "algo": self.algo,
            "version": self.version,
            "next_index": {str(k): v for k, v in self.next_index.items()},
            "members": [m.to_dict() for m in self.members.values()],
            "evals": [m.to_dict() for m in self.evals.values()],
            "eval_results": {str(k): v for k, v in self.eval_results.items()},
            "eval_ids": self.eval_ids,
            "counts": dict(self.counts),
            "finished": self.finished,
        }

    def _load(self, doc: dict[str, Any]) -> None:
        if doc.get("algo") != self.algo:
            raise RuntimeError(
                f"run {self.settings.run!r} holds a {doc.get('algo')} checkpoint, not {self.algo}: use another run id"
            )
        self.version = int(doc["version"])
        self.next_index.update({int(k): int(v) for k, v in doc["next_index"].items()})
        self.members = {m["work_id"]: MemberState.from_dict(m) for m in doc["members"]}
        self.evals = {m["work_id"]: MemberState.from_dict(m) for m in doc["evals"]}
        self.eval_results = {int(k): v for k, v in doc["eval_results"].items()}
        self.eval_ids = list(doc.get("eval_ids", []))
        self.counts.update(doc["counts"])
        self.finished = bool(doc.get("finished"))

    async def resume(self) -> bool:
        """Load the checkpoint if the run has one; re-publish the orders still in flight. True if resumed."""
        raw = await self.redis.hget(self.keys.trainer_state, STATE_FIELD)
        await ensure_group(self.redis, self.keys.rewards, TRAINER)
        await ensure_group(self.redis, self.keys.work, GENERATORS)
        if raw is None:
            done = max((int(r["version"]) for r in self.sink.records() if "version" in r and not r.get("eval")),
                       default=0)  # fmt: skip
            if done:
                raise RunMismatch(
                    f"{self.sink.run_dir} holds run {self.settings.run!r} up to version {done} (metrics.jsonl), "
                    "but this Redis has no state for it: the run's Redis data is gone, or this is another Redis. "
                    "Point the trainer at that run's Redis, or start over in a new --run-dir (or delete this one)"
                )
            await register(self.redis, self.keys, self.train + self.held_out)
            return False
        self._load(orjson.loads(raw))
        run, iterations = self.settings.run, self.settings.iterations
        if self.finished and self.version >= iterations:
            raise RunFinished(
                f"run {run!r} finished at version {self.version} ({self.counts['samples']} training samples); "
                f"nothing to resume. Use a new --run for a new run, or --iterations N with N > {self.version} "
                "to continue this one"
            )
        what = "continuing the finished" if self.finished else "resuming"
        print(f"trainer: {what} run {run!r} at version {self.version} of {iterations} ({self.counts['samples']} "
              f"training samples so far, {len(self.members)} in flight)", file=sys.stderr)  # fmt: skip
        self.finished = False
        self.counts["resumes"] += 1
        # Orders written ahead but maybe never published: publish again (the generators' markers dedup).
        await self._publish_orders([*self.members.values(), *self.evals.values()])
        await self._read(block_ms=None, pending=True)  # rewards read before the crash, never acked
        log.info("trainer_resumed", version=self.version, members=len(self.members), evals=len(self.evals))
        return True

    async def checkpoint(self, *extra: tuple[str, dict[bytes, bytes]]) -> None:
        """Write the state (plus `extra` stream entries) in one MULTI, then ack the rewards it holds."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for stream, fields in extra:
                pipe.xadd(stream, fields)
            pipe.hset(self.keys.trainer_state, STATE_FIELD, orjson.dumps(self.state()))
            await pipe.execute()
        if self._unacked:
            await self.redis.xack(self.keys.rewards, TRAINER, *self._unacked)
            self._unacked.clear()
        self._last_checkpoint = time.monotonic()

    async def trim_history(self) -> None:
        """Trim the rewards and work orders every group has acked, keeping the last `history_s` seconds."""
        for name, stream in (("rewards", self.keys.rewards), ("work", self.keys.work)):
            if trimmed := await trim_acked(self.redis, stream, keep_s=self.settings.history_s):
                self.counts[f"trimmed_{name}"] += trimmed

    # -- work --------------------------------------------------------------------------------------------

    async def _publish_orders(self, members: list[MemberState]) -> None:
        if not members:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for m in members:
                pipe.xadd(self.keys.work, encode(self._order(m)))
            await pipe.execute()

    def _order(self, m: MemberState) -> WorkOrder:
        """The work order of a member (ES), a group (GRPO) or an evaluation (greedy, no staleness bound)."""
        is_eval = m.work_id.startswith("eval-")
        return WorkOrder(
            work_id=m.work_id,
            policy_version=m.center,
            algo=self.algo,
            task=self.settings.task,
            theorem_ids=m.theorem_ids,
            sampling={
                "temperature": 0.0 if is_eval else self._temperature(),
                "max_new_tokens": self.settings.max_new_tokens,
            },
            issued_ms=int(time.time() * 1000),
            max_staleness=None if is_eval else self.settings.max_staleness,
            **self._order_fields(m, is_eval),
        )

    def _order_fields(self, m: MemberState, is_eval: bool) -> dict[str, Any]:
        """The algorithm's own work-order fields."""
        raise NotImplementedError

    def _temperature(self) -> float:
        """The sampling temperature of training work (evaluations are greedy)."""
        return self.settings.temperature

    async def top_up(self) -> int:
        raise NotImplementedError

    def _ready(self) -> Any:
        """What the next update needs, when it can happen now; else None."""
        raise NotImplementedError

    async def update(self, ready: Any) -> dict[str, Any] | None:
        raise NotImplementedError

    async def poll(self, block_ms: int) -> None:
        """Read what has arrived (rewards; GRPO also attempts)."""
        await self._read(block_ms=block_ms)

    async def issue_eval(self, version: int) -> None:
        """Evaluate `version` on the held-out split, once: a second order would carry the same work id, which
        the generators drop as a repeat, and the run would wait for its rewards until the deadline (a GRPO
        step without signal keeps the version; the end of a run asks for the last version again)."""
        if not self.held_out or f"eval-v{version}" in self.evals or version in self.eval_results:
            return
        self.eval_ids = [t.theorem_id for t in self.held_out]
        m = MemberState(f"eval-v{version}", version, 0, 1, self.eval_ids, issued_at=time.time())
        self.evals[m.work_id] = m
        await self.checkpoint()
        await self._publish_orders([m])

    # -- rewards -----------------------------------------------------------------------------------------

    async def _read(self, block_ms: int | None, pending: bool = False) -> int:
        start = "0" if pending else ">"
        seen = 0
        while True:
            reply = await self.redis.xreadgroup(TRAINER, self.consumer, {self.keys.rewards: start}, count=500,
                                                block=None if pending else block_ms)  # fmt: skip
            entries = reply[0][1] if reply else []
            for entry_id, fields in entries:
                await self._take(entry_id, fields)
            seen += len(entries)
            if not pending or not entries:
                return seen
            start = entries[-1][0]

    async def _take(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        self._unacked.append(entry_id)
        try:
            reward = decode(Reward, fields)
        except SchemaError as e:
            letter = DeadLetter(self.keys.rewards, TRAINER, entry_id.decode(), 1, str(e), self.consumer,
                                int(time.time() * 1000), dict(fields))  # fmt: skip
            await self.redis.xadd(self.keys.dlq, encode(letter))
            self.counts["bad_rewards"] += 1
            return
        member = self.members.get(reward.work_id) or self.evals.get(reward.work_id)
        if member is None:  # a member already used in an update, or dropped: its late rewards change nothing
            self.counts["late_rewards"] += 1
            return
        if reward.attempt_id in member.rewards:
            self.counts["duplicate_rewards"] += 1
            return
        member.rewards[reward.attempt_id] = reward.reward
        member.proved += reward.verdict == "proved"
        self._verdicts[reward.verdict] += 1
        self._window_rewards += 1

    # -- updates -----------------------------------------------------------------------------------------

    def _eval_done(self) -> None:
        for work_id, m in list(self.evals.items()):
            if m.complete:
                version = m.center
                result = {
                    "version": version,
                    "held_out_reward": round(m.score, 6),
                    "held_out_exact": round(m.proved / max(1, m.expected), 6),
                    "problems": m.expected,
                }
                self.eval_results[version] = result
                self.sink.write({"eval": True, **result, "time": time.time()})
                del self.evals[work_id]

    # -- the loop ----------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> dict[str, Any]:
        await self.resume()
        if self.settings.eval_every and self.version == 0:
            await self.issue_eval(0)
        self.progress(self.version)
        while not stop.is_set() and self.version < self.settings.iterations:
            await self.top_up()
            await self.poll(block_ms=500)
            self._eval_done()
            ready = self._ready()
            if ready is not None:
                await self.update(ready)
                await self.trim_history()
                if self.settings.eval_every and self.version % self.settings.eval_every == 0:
                    await self.issue_eval(self.version)
                self.progress(self.version)
            elif self._unacked and time.monotonic() - self._last_checkpoint > CHECKPOINT_EVERY_S:
                await self.checkpoint()
        if not stop.is_set() and self.settings.eval_every:
            await self.issue_eval(self.version)
            deadline = time.monotonic() + self.settings.deadline_s
            while self.evals and not stop.is_set() and time.monotonic() < deadline:
                await self.poll(block_ms=500)
                self._eval_done()
        self.finished = not stop.is_set() and self.version >= self.settings.iterations
        await self.checkpoint()
        await self.trim_history()
        return {"version": self.version, "counts": dict(self.counts), "evals": self.eval_results}


class ESRun(Run):
    algo = "es"

    def __init__(self, settings: TrainerSettings, *args: Any, **kwargs: Any) -> None:
        super().__init__(settings, *args, **kwargs)
        self.cfg = es_config(settings)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "config": vars(self.cfg)}

    def _batch(self, center: int, index: int) -> list[str]:
        """The theorems of member `index` of `center`: one batch per center, shared by its members (the ES
        estimate compares members on the same problems), drawn by a seeded rotation through the train split."""
        n, k = len(self.train), min(self.settings.batch, len(self.train))
        start = (center * k + self.settings.seed * 7919) % n
        return [self.train[(start + i) % n].theorem_id for i in range(k)]

    def _temperature(self) -> float:
        """`es_temperature`, greedy by default: then members of a center differ by their weights only, as in the
        reference ES (sampling noise would swamp the reward differences sigma-sized perturbations make)."""
        return self.settings.es_temperature

    def _order_fields(self, m: MemberState, is_eval: bool) -> dict[str, Any]:
        sigma = 0.0 if is_eval else self.cfg.sigma
        return {"member": Member(m.seed, m.sign) if sigma else None, "sigma": sigma}

    async def top_up(self) -> int:
        """Issue members around the newest center until `population` are in flight. Returns how many."""
        in_flight = sum(1 for m in self.members.values() if not m.complete)
        want = self.cfg.population - in_flight
        if want <= 0:
            return 0
        center = self.version
        new = []
        for index, seed, sign in members_for(
            self.settings.run, center, self.next_index[center], want, self.cfg.antithetic
        ):
            m = MemberState(
                f"es-v{center}-m{index}", center, seed, sign, self._batch(center, index), issued_at=time.time()
            )
            self.members[m.work_id] = m
            new.append(m)
        self.next_index[center] += want
        await self.checkpoint()  # write-ahead: the members exist before their orders do
        await self._publish_orders(new)
        self.counts["members_issued"] += len(new)
        return len(new)

    def _ready(self) -> list[MemberState] | None:
        complete = [m for m in self.members.values() if m.complete]
        fresh, _ = select(complete, self.version, self.cfg)
        if len(fresh) >= max(2, round(self.cfg.quorum * self.cfg.population)):
            return complete
        if len(fresh) >= 2 and time.monotonic() - self.last_update > self.cfg.deadline_s:
            self.counts["deadline_updates"] += 1
            return complete
        return None

    async def update(self, complete: list[MemberState]) -> dict[str, Any]:
        used, stale = select(complete, self.version, self.cfg)
        step = make_step(used, self.cfg)
        stragglers = [m for m in self.members.values() if not m.complete]
        for m in [*used, *stale]:
            del self.members[m.work_id]
        attempts = sum(len(m.rewards) for m in used)
        self.counts["members_used"] += len(used)
        self.counts["samples"] += attempts
        self.counts["members_stale_dropped"] += len(stale)
        self.version += 1
        now = time.monotonic()
        metrics = {
            "version": self.version,
            "algo": "es",
            "reward_mean": round(sum(m.score for m in used) / len(used), 6),
            "reward_max": round(max(m.score for m in used), 6),
            "pass_rate": round(sum(m.proved for m in used) / max(1, attempts), 6),
            "members": len(used),
            "attempts": attempts,
            "stragglers": len(stragglers),
            "stale_dropped": len(stale),
            "staleness": dict(collections.Counter(str(self.version - 1 - m.center) for m in used)),
            "verdicts": dict(self._verdicts),
            "rewards_per_s": round(self._window_rewards / max(now - self._window_started, 1e-9), 2),
            "update_s": round(now - self.last_update, 2),
            "time": time.time(),
        }
        metrics.update(await self.sink.pipeline_figures(self.redis, self.keys))
        self._verdicts.clear()
        self._window_rewards, self._window_started, self.last_update = 0, now, now
        policy = PolicyUpdate(self.version, "es", es_step=step, created_ms=int(time.time() * 1000))
        await self.checkpoint(
            (self.keys.policy, encode(policy)), (self.keys.metrics, {b"v": b"1", b"json": orjson.dumps(metrics)})
        )
        self.sink.write(metrics)
        log.info(
            "es_update", **{k: metrics[k] for k in ("version", "reward_mean", "pass_rate", "members", "stragglers")}
        )
        return metrics
