"""An order: one work order the trainer issued and follows to its outcome (an ES member, a GRPO group, an
evaluation), and the rules every algorithm applies to orders alike: which problems an order names, and which
finished orders are fresh enough for an update.

The checkpoint holds orders as `Order.to_dict()`: those keys are the checkpoint's format, so a run
checkpointed by an older trainer resumes (tests/trainer/test_state_format.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from streams.codec import decode
from streams.schema import DeadLetter, SchemaError, WorkOrder
from streams.theorems import Theorem

if TYPE_CHECKING:
    from trainer.config import TrainerSettings

SEED_SHIFT = 7919  # a prime: runs with neighbouring seeds start their rotations far apart


@dataclass
class Order:
    """One work order in flight: from which policy version, on which theorems, and the rewards in so far.

    `center` is the policy version the order samples from (ES: the center its member perturbs). `seed` and
    `sign` name an ES member's perturbation; GRPO groups and evaluations carry 0 and +1 (none).
    """

    work_id: str
    center: int
    seed: int
    sign: int
    theorem_ids: list[str]
    samples: int = 1  # attempts per theorem (GRPO: the group size G)
    rewards: dict[str, float] = field(default_factory=dict)  # attempt_id -> reward
    proved: int = 0
    issued_at: float = 0.0
    # an evaluation's figures by problem, theorem id -> [reward, 1 if proved else 0] (streams/learned.py pairs
    # them across evaluations); kept in the checkpoint only while it is non-empty, so other orders keep the format
    by_theorem: dict[str, list[float]] = field(default_factory=dict)
    # Countdown: each credit part (tasks.countdown_check.PARTS) summed over the order's rewards; kept in the
    # checkpoint only while it is non-empty, like `by_theorem`
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def is_eval(self) -> bool:
        """An evaluation of the policy on the held-out split (work id `eval-v<version>[-r<try>]`)."""
        return self.work_id.startswith("eval-")

    @property
    def expected(self) -> int:
        return len(self.theorem_ids) * self.samples

    @property
    def complete(self) -> bool:
        return len(self.rewards) >= self.expected

    def add_parts(self, parts: dict[str, float]) -> None:
        """Count one reward's credit by part (its numeric figures; anything else a newer writer sent is not ours)."""
        for name, value in parts.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.parts[name] = self.parts.get(name, 0.0) + float(value)

    @property
    def score(self) -> float:
        """The order's reward: mean over its attempts (success rate when rewards are 0/1)."""
        return float(np.mean(list(self.rewards.values()))) if self.rewards else 0.0

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        for key in ("by_theorem", "parts"):
            if not doc[key]:
                del doc[key]
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Order:
        return cls(**doc)


def mean_parts(orders: Iterable[Order]) -> dict[str, float]:
    """The mean credit by part over the rewards of `orders` that carried parts (Countdown's; {} for Lean and
    for rewards of verifiers before parts): each order's sums over its own count of rewards."""
    orders = [o for o in orders if o.parts]
    count = sum(len(o.rewards) for o in orders)
    names = dict.fromkeys(name for o in orders for name in o.parts)
    return {name: round(sum(o.parts.get(name, 0.0) for o in orders) / count, 6) for name in names} if count else {}


def work_order(
    order: Order, algo: str, settings: TrainerSettings, temperature: float, work_id: str = "", **fields: Any
) -> WorkOrder:
    """The one constructor of a run's work orders: the one that asks for `order` (or, under `work_id`, for a
    bundle that `order` opens: trainer/es.py), with the algorithm's own `fields`. Evaluations decode greedily
    and have no staleness bound."""
    is_eval = order.is_eval
    return WorkOrder(
        work_id=work_id or order.work_id,
        policy_version=order.center,
        algo=algo,  # type: ignore[arg-type]
        task=settings.task,
        theorem_ids=order.theorem_ids,
        samples_per_theorem=order.samples,
        sampling={"temperature": 0.0 if is_eval else temperature, "max_new_tokens": settings.max_new_tokens},
        issued_ms=int(time.time() * 1000),
        max_staleness=None if is_eval else settings.max_staleness,
        **fields,
    )


def rotation(train: list[Theorem], version: int, per_version: int, seed: int, offset: int) -> str:
    """The theorem at `offset` of version `version`'s stretch of a seeded rotation through the train split:
    each version's stretch starts `per_version` problems after the previous one's, so consecutive versions
    see new problems, and the seed shifts where the run starts. A pure function of its arguments: a
    restarted trainer names the same problems."""
    return train[(version * per_version + offset + seed * SEED_SHIFT) % len(train)].theorem_id


def staleness(version: int, center: int) -> int:
    """How many versions an order's samples lag the policy an update starts from: `version` is the run's newest
    version before the update (the one it steps from), `center` the version the order sampled from. An order
    sampled from the newest version has staleness 0. The one definition: the bound `max_staleness` applies
    to it (`split_fresh`, the loop's quorum and cuts) and each version's metrics count it (`staleness`)."""
    return version - center


def split_fresh(complete: list[Order], version: int, max_staleness: int, limit: int) -> tuple[list[Order], list[Order]]:
    """(orders to use for the update of `version`: freshest first, at most `limit`; orders too stale to use)."""
    fresh = [o for o in complete if staleness(version, o.center) <= max_staleness]
    stale = [o for o in complete if staleness(version, o.center) > max_staleness]
    fresh.sort(key=lambda o: (-o.center, o.work_id))
    return fresh[:limit], stale


def room(size: int, orders: Iterable[Order], version: int, quorum: float, usable: Callable[[Order], bool]) -> int:
    """How many orders top-up may issue around `version` so that `size` of `orders` are out. At quorum 1 the run
    goes in lockstep: a version gets `size` orders and no more (a cut one is replaced) and its update uses all of
    them, so the steps do not depend on timing (a run killed and resumed makes the same steps). Below 1, orders
    finished early (`usable`: the next update decides about them) make room for new ones at once."""
    if quorum >= 1:
        return size - sum(1 for o in orders if o.center == version)
    return size - sum(1 for o in orders if not usable(o))


def bundled(room: int, bundle: int, waiting: bool) -> int:
    """How much of `room` top-up issues now when members go out `bundle` to a work order (one engine call
    each): all of it once it makes a whole bundle, or when none of the run's orders still waits for the
    generator (`waiting`: issued, no verdict yet), which would otherwise idle; else nothing yet, and the room
    grows. On a GPU an engine call costs about the same for one member as for 32 (64 decoding steps of a
    small model: docs/results/gpu/README.md, 2026-11-29); issuing each member as its room appeared split a
    population of 32 into up to ~30 calls a version there (8 versions in 4.5 minutes)."""
    return room if room >= bundle or not waiting else 0


def at_quorum(
    usable: list[Order], size: int, at_least: int, version: int, max_staleness: int, quorum: float, past_deadline: bool
) -> str | None:
    """Whether the `usable` orders make an update: "quorum" once `quorum` of `size` of them are fresh (within
    `max_staleness` of `version`), "deadline" past the deadline with at least `at_least` fresh; else None."""
    fresh = sum(1 for o in usable if staleness(version, o.center) <= max_staleness)
    if fresh >= max(at_least, round(quorum * size)):
        return "quorum"
    if fresh >= at_least and past_deadline:
        return "deadline"
    return None


def expired(
    orders: list[Order],
    evals: list[Order],
    version: int,
    max_staleness: int,
    timeout_s: float,
    since: float,
    now: float,
) -> list[tuple[Order, str, str]]:
    """(order, why, detail) of each order in flight that can no longer be used: training orders whose center is
    past the staleness bound (evaluations have none), then any order unanswered `timeout_s` after it was issued
    or after `since` (a restarted trainer gives the orders it inherits the whole timeout again: their rewards
    may be waiting in the stream, unread while no trainer ran). `orders` and `evals` hold those not yet usable."""
    fresh = [o for o in orders if staleness(version, o.center) <= max_staleness]
    out = [(o, "stale", f"center {o.center}, now at version {version}") for o in orders if o not in fresh]
    for o in [*fresh, *evals]:
        if (waited := now - max(o.issued_at, since)) > timeout_s:
            out.append((o, "timeout", f"unanswered for {waited:.0f} s"))
    return out


def letter_losses(fields: dict[bytes, bytes]) -> tuple[str, str, list[str]]:
    """(why, reason, work ids) of a dead letter: the orders it says will never complete (its own, an attempt's
    or a reward's, and an ES bundle's members), `why` being `skipped` (a generator skipped a stale order) or
    `dead_letter`. None named for an entry deleted after it was read (`ops dlq purge`/`requeue`: no fields)
    or one that is not a dead letter."""
    try:
        letter = decode(DeadLetter, fields) if fields else None
    except SchemaError:
        letter = None
    if letter is None:
        return "", "", []
    why = "skipped" if letter.reason.startswith("skipped") else "dead_letter"
    return why, letter.reason, letter_work_ids(letter.original)


def letter_work_ids(original: dict[bytes, bytes]) -> list[str]:
    """The work ids a dead letter's original entry names: its `work_id` (a work order, an attempt, a reward),
    and the members of an ES bundle (a work order's `members`, trainer/es.py), each of which is lost with it."""
    ids = [original.get(b"work_id", b"").decode("utf-8", "replace")]
    try:
        members = orjson.loads(original.get(b"members") or b"[]")
        ids += [str(m["work_id"]) for m in members if isinstance(m, dict) and "work_id" in m]
    except (orjson.JSONDecodeError, TypeError):
        pass  # a damaged entry names what its work_id names
    return [i for i in ids if i]
