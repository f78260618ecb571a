"""Evolution Strategies on the trainer's side (Qiu et al. 2025): members, their rewards, the update.

The trainer never touches weights for ES. It names members (seed, sign) around a center version, collects
each member's reward (its success rate on the iteration's theorem batch), z-scores them, and publishes
the step `{seeds, signs, rewards: z, sigma, alpha}`; every generator applies
`theta += alpha/N * sum_n z_n sign_n eps_n` itself (weights/es.py), bit for bit the same everywhere.

Async mode: members are issued around the newest center so generators never wait for an update. An
update of center v uses members whose own center is at least v - max_staleness (the freshest first, up to
the population); older ones are dropped and counted. An update happens when a quorum of the population
has reported, or at the deadline with at least two members; members still out are stragglers: they stay
usable for the next update while within the staleness bound.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PRESETS: dict[str, dict[str, Any]] = {
    # The paper's defaults (Qiu et al. 2025, Countdown and reasoning tasks on 0.5B-8B models).
    "paper": {"population": 30, "sigma": 0.001, "alpha": 0.0005, "batch": 200, "antithetic": False},
    # A population a 2-core CPU gets through in minutes with the 135M default model. alpha 4x the paper's:
    # measured over 3 seeds at 8 versions (docs/results/sweep-cpu: greedy members, batch 16, antithetic),
    # the held-out shaped reward gained 0.004 +- 0.002 at 0.0005, 0.032 +- 0.006 at 0.002, 0.015 +- 0.020 at
    # 0.008; the paper's alpha is made for 1,000 iterations, not a budget of minutes.
    "cpu": {"population": 8, "sigma": 0.001, "alpha": 0.002, "batch": 16, "antithetic": True},
}


def member_seed(run: str, center: int, index: int) -> int:
    """Seeds are a pure function of (run, center, index): a restarted trainer names the same members."""
    digest = hashlib.blake2b(f"{run}\x00{center}\x00{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


@dataclass
class MemberState:
    """One member (one work order): which perturbation, around which center, on which theorems."""

    work_id: str
    center: int
    seed: int
    sign: int
    theorem_ids: list[str]
    samples: int = 1  # attempts per theorem
    rewards: dict[str, float] = field(default_factory=dict)  # attempt_id -> reward
    proved: int = 0
    issued_at: float = 0.0

    @property
    def expected(self) -> int:
        return len(self.theorem_ids) * self.samples

    @property
    def complete(self) -> bool:
        return len(self.rewards) >= self.expected

    @property
    def score(self) -> float:
        """The member's reward: mean over its attempts (success rate when rewards are 0/1)."""
        return float(np.mean(list(self.rewards.values()))) if self.rewards else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> MemberState:
        return cls(**doc)


def zscore(values: list[float], eps: float = 1e-8) -> list[float]:
    """(r - mean) / std; all-equal rewards carry no signal and give zeros (a step that changes nothing)."""
    r = np.asarray(values, dtype=np.float64)
    std = r.std()
    if std < eps:
        return [0.0] * len(values)
    return ((r - r.mean()) / std).tolist()


@dataclass
class ESConfig:
    population: int = 8
    sigma: float = 0.001
    alpha: float = 0.0005
    antithetic: bool = False
    max_staleness: int = 2
    quorum: float = 0.75  # share of the population that must report before an update
    deadline_s: float = 600.0  # an update waits at most this long past the quorum-less wait, given >= 2 members

    def __post_init__(self) -> None:
        if self.population < 2:
            raise ValueError("ES needs a population of at least 2 (rewards are z-scored across members)")
        if self.antithetic and self.population % 2:
            raise ValueError("antithetic pairs need an even population")
        if not 0 < self.quorum <= 1 or self.max_staleness < 0 or self.sigma <= 0 or self.alpha <= 0:
            raise ValueError(f"bad ES settings: {self}")


def members_for(run: str, center: int, start: int, count: int, antithetic: bool) -> list[tuple[int, int, int]]:
    """(index, seed, sign) of `count` members of `center` from index `start`; antithetic twins share a seed."""
    out = []
    for index in range(start, start + count):
        if antithetic:
            out.append((index, member_seed(run, center, index // 2), 1 if index % 2 == 0 else -1))
        else:
            out.append((index, member_seed(run, center, index), 1))
    return out


def split_fresh(
    complete: list[MemberState], version: int, max_staleness: int, limit: int
) -> tuple[list[MemberState], list[MemberState]]:
    """(work to use for the update of `version`: freshest first, at most `limit`; work too stale to use).
    ES members here, GRPO groups in trainer/grpo_run.py."""
    fresh = [m for m in complete if version - m.center <= max_staleness]
    stale = [m for m in complete if version - m.center > max_staleness]
    fresh.sort(key=lambda m: (-m.center, m.work_id))
    return fresh[:limit], stale


def select(complete: list[MemberState], version: int, cfg: ESConfig) -> tuple[list[MemberState], list[MemberState]]:
    """(members to use for the update of `version`, members too stale to use): freshest first, at most N."""
    return split_fresh(complete, version, cfg.max_staleness, cfg.population)


def make_step(members: list[MemberState], cfg: ESConfig) -> dict[str, Any]:
    """The policy stream's `es_step` for these members."""
    z = zscore([m.score for m in members])
    return {
        "seeds": [m.seed for m in members],
        "signs": [m.sign for m in members],
        "rewards": z,
        "sigma": cfg.sigma,
        "alpha": cfg.alpha,
        # For people and audits; generators read only the five fields above.
        "raw_rewards": [round(m.score, 6) for m in members],
        "centers": [m.center for m in members],
        "members": [m.work_id for m in members],
    }
