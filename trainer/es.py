"""Evolution Strategies on the trainer's side (Qiu et al. 2025, "Evolution Strategies at Scale"), top to bottom:
its config, how it issues orders (members), when it is ready, its update, what it publishes.

The variant: N members per center, each a perturbation (seed, sign) of the center's weights by sigma * eps;
a member's reward is its mean reward on the center's batch of problems, scored greedily by default (the
reference code: temperature 0, every member on the same problems, so members differ by their weights, not
by sampling noise); rewards are z-scored across the members (population std; all-equal rewards give a step
of zeros); the update is `theta += alpha/N * sum_n z_n sign_n eps_n`. Optional antithetic pairs (+eps, -eps
sharing a seed). The trainer never touches weights: it publishes the step (`weights.step.ESStep`: seeds,
signs, z, sigma, alpha; ~200 bytes) and every generator applies it itself (weights/es.py), bit for bit the
same everywhere.

Async (docs/TRAINER.md): `population` members are kept in flight around the newest center, so generators
never wait for an update. An update of center v uses complete members whose own center is at least
v - max_staleness (the freshest first, up to the population); older ones are dropped and counted. It
happens when a quorum of the population has reported, or at the deadline with at least two members;
members still out are stragglers: they stay usable for the next update while within the staleness bound.
The loop itself (write-ahead orders, rewards, checkpoint, cuts, evaluations) is trainer/loop.py's.
"""

from __future__ import annotations

import collections
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from streams.schema import Member, PolicyUpdate, WorkOrder
from trainer.config import ROWS_PER_ORDER, TrainerSettings
from trainer.loop import Run
from trainer.orders import Order, bundled, rotation, split_fresh, work_order
from weights.step import ESStep

# ------------------------------------------------------------------------------------------------ config


@dataclass
class ESConfig:
    population: int = 8
    sigma: float = 0.001
    alpha: float = 0.0005
    antithetic: bool = False
    max_staleness: int = 2
    noise: str = "full"  # "full" | "lowrank" (weights/es.py)
    rank: int = 0  # lowrank: r of each member's A B^T; 0 for full
    members_per_order: int = 1  # members a work order carries (one engine call)

    def __post_init__(self) -> None:
        if self.population < 2:
            raise ValueError("ES needs a population of at least 2 (rewards are z-scored across members)")
        if self.antithetic and self.population % 2:
            raise ValueError("antithetic pairs need an even population")
        if self.max_staleness < 0 or self.sigma <= 0 or self.alpha <= 0:
            raise ValueError(f"bad ES settings: {self}")
        if (self.noise == "lowrank") != (self.rank > 0) or self.members_per_order < 1:
            raise ValueError(f"bad ES noise settings: {self}")


def es_config(settings: TrainerSettings) -> ESConfig:
    """The run's ES settings, validated, with the two it derives (`rank`: 0 for full-rank noise;
    `members_per_order`: by default as many as fit ROWS_PER_ORDER rows under low-rank noise, else 1). A view,
    never a second copy: `settings` is where a run's parameters live, ESRun reads them there and builds this
    where the step and the checkpoint's `config` want them together. The preset's values are already in
    `settings` (trainer/config.py `with_preset`); the update's quorum and deadline are the loop's."""
    if settings.population is None or settings.sigma is None or settings.alpha is None:
        raise ValueError(f"ES settings need an ES run's (algo es, not {settings.algo})")
    lowrank = settings.es_noise == "lowrank"
    per_order = settings.members_per_order or (
        max(1, min(settings.population, ROWS_PER_ORDER // max(1, settings.batch))) if lowrank else 1
    )
    return ESConfig(
        settings.population,
        settings.sigma,
        settings.alpha,
        settings.antithetic,
        settings.max_staleness,
        noise=settings.es_noise,
        rank=settings.es_rank if lowrank else 0,
        members_per_order=min(per_order, settings.population),
    )


# ------------------------------------------------------------------------------------------------ members


def member_seed(run: str, center: int, index: int) -> int:
    """Seeds are a pure function of (run, center, index): a restarted trainer names the same members."""
    digest = hashlib.blake2b(f"{run}\x00{center}\x00{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def member(run: str, center: int, index: int, antithetic: bool) -> tuple[int, int]:
    """(seed, sign) of member `index` of `center`; antithetic twins (2k, 2k + 1) share a seed, signs +1, -1."""
    if antithetic:
        return member_seed(run, center, index // 2), 1 if index % 2 == 0 else -1
    return member_seed(run, center, index), 1


def members_for(run: str, center: int, start: int, count: int, antithetic: bool) -> list[tuple[int, int, int]]:
    """(index, seed, sign) of `count` members of `center` from index `start`."""
    return [(index, *member(run, center, index, antithetic)) for index in range(start, start + count)]


# ------------------------------------------------------------------------------------------------ the step


def zscore(values: list[float], eps: float = 1e-8) -> list[float]:
    """(r - mean) / std; all-equal rewards carry no signal and give zeros (a step that changes nothing)."""
    r = np.asarray(values, dtype=np.float64)
    std = r.std()
    if std < eps:
        return [0.0] * len(values)
    return ((r - r.mean()) / std).tolist()


def make_step(members: list[Order], cfg: ESConfig) -> ESStep:
    """The step these members make: their z-scored rewards, what every generator replays."""
    z = zscore([m.score for m in members])
    seeds, signs = tuple(m.seed for m in members), tuple(m.sign for m in members)
    return ESStep(seeds, signs, tuple(z), cfg.sigma, cfg.alpha, cfg.noise, cfg.rank)  # type: ignore[arg-type]


def member_spread(members: list[Order]) -> dict[str, Any]:
    """How the members an update used differed in reward (their fitness, to 6 decimals): how many, how many
    distinct rewards, the most common one (`mode`), how many members differed from it, the lowest and highest.
    One distinct reward is a step of zeros (`zscore`): a flat ES curve at a small budget reads as that."""
    rewards = collections.Counter(round(m.score, 6) for m in members)
    mode, common = rewards.most_common(1)[0] if rewards else (0.0, 0)
    return {
        "members": len(members),
        "distinct": len(rewards),
        "mode": mode,
        "differed": len(members) - common,
        "min": min(rewards, default=0.0),
        "max": max(rewards, default=0.0),
    }


def bundle_id(members: list[Order]) -> str:
    """The work id of one work order for several members of a center: it names the first member, how many
    follow and a hash of all of them, so a bundle of other members (after a cut, or a resume) is another order."""
    ids = [m.work_id for m in members]
    tag = hashlib.blake2b("\x00".join(ids).encode(), digest_size=3).hexdigest()
    return f"{ids[0]}+{len(ids) - 1}-{tag}"


def policy_entry(step: ESStep, members: list[Order]) -> dict[str, Any]:
    """The policy stream's `es_step`: the step, then for people and audits each member's raw reward, center
    and work id (generators read only the step's fields)."""
    return {
        **step.to_dict(),
        "raw_rewards": [round(m.score, 6) for m in members],
        "centers": [m.center for m in members],
        "members": [m.work_id for m in members],
    }


# ------------------------------------------------------------------------------------------------ the run


class ESRun(Run):
    algo = "es"

    def __init__(self, settings: TrainerSettings, *args: Any, **kwargs: Any) -> None:
        es_config(settings)  # refuses settings ES cannot run with, before anything starts
        super().__init__(settings, *args, **kwargs)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "config": vars(es_config(self.settings))}  # for people: never read back

    # -- orders: `population` members in flight around the newest center ---------------------------------

    async def top_up(self) -> int:
        """Issue members around the newest center until `population` are in flight (`_room`), a bundle at a
        time while members wait for the generator (trainer/orders.py `bundled`). Returns how many."""
        waiting = any(not o.rewards for o in self.orders.values())
        if not bundled(self._room(self.settings.population), es_config(self.settings).members_per_order, waiting):
            return 0
        return await self._issue(self.settings.population, self._new_member, "members_issued")

    def _new_member(self, center: int, index: int) -> Order:
        seed, sign = member(self.settings.run, center, index, self.settings.antithetic)
        return Order(f"es-v{center}-m{index}", center, seed, sign, self._batch(center), issued_at=time.time())

    def _batch(self, center: int) -> list[str]:
        """The theorems of every member of `center`: one batch per center, shared by its members (the ES
        estimate compares members on the same problems), drawn by a seeded rotation through the train split."""
        k = min(self.settings.batch, len(self.train))
        return [rotation(self.train, center, k, self.settings.seed, i) for i in range(k)]

    def work_orders(self, orders: list[Order]) -> list[WorkOrder]:
        """Members of one center go out `members_per_order` to a work order (one engine call each); a bundle
        names its members, whose attempts carry their own work ids. Evaluations go alone. Members decode at
        `es_temperature`, greedy by default: then members of a center differ by their weights only, as in the
        reference ES (sampling noise would swamp the reward differences sigma-sized perturbations make)."""
        s = self.settings
        out = [work_order(o, self.algo, s, 0.0) for o in orders if o.is_eval]  # greedy, as every evaluation
        by_center: dict[int, list[Order]] = collections.defaultdict(list)
        for o in orders:
            if not o.is_eval:
                by_center[o.center].append(o)
        cfg = es_config(s)
        size, noise = cfg.members_per_order, {"sigma": cfg.sigma, "rank": cfg.rank}
        for group in by_center.values():
            for chunk in (group[start : start + size] for start in range(0, len(group), size)):
                first = chunk[0]
                if len(chunk) == 1:
                    fields: dict[str, Any] = {"member": Member(first.seed, first.sign)}
                else:
                    members = [{"work_id": m.work_id, "seed": m.seed, "sign": m.sign} for m in chunk]
                    fields = {"work_id": bundle_id(chunk), "members": members}
                out.append(work_order(first, self.algo, s, s.es_temperature, **fields, **noise))
        return out

    # -- ready: a quorum of the population, or two members at the deadline ---------------------------------

    def _ready(self) -> list[Order] | None:
        return self._ready_at_quorum(self.settings.population, at_least=2)  # z-scores need two members

    # -- the update, and what it publishes ------------------------------------------------------------------

    async def update(self, complete: list[Order]) -> dict[str, Any] | None:
        s = self.settings
        used, stale = split_fresh(complete, self.version, s.max_staleness, s.population)
        step = make_step(used, es_config(s))
        self.counts["members_used"] += len(used)
        self.counts["members_stale_dropped"] += len(stale)
        entry = policy_entry(step, used)
        policy = PolicyUpdate(self.version + 1, "es", es_step=entry, created_ms=int(time.time() * 1000))
        own = {
            "reward_max": round(max(m.score for m in used), 6),
            "members": len(used),
            "member_spread": member_spread(used),
            "stragglers": sum(1 for m in self.orders.values() if not m.complete),
        }
        return await self._publish(policy, used, stale, own)
