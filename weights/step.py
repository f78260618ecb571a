"""The ES update as data: what the trainer publishes for version v -> v+1 and every generator replays.

One `ESStep` per policy version (seeds, signs, normalized rewards, sigma, alpha; ~200 bytes) and the digest
of a history of them. Pure Python, no torch: the trainer builds steps without holding any weights, and
`weights.es` applies them to tensors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ESStep:
    """One update, version v -> v+1: members (seed, sign), their z-scored rewards, and the step sizes."""

    seeds: tuple[int, ...]
    signs: tuple[int, ...]
    rewards: tuple[float, ...]  # normalized (z-scored) member rewards
    sigma: float
    alpha: float

    def __post_init__(self) -> None:
        if not (len(self.seeds) == len(self.signs) == len(self.rewards)) or not self.seeds:
            raise ValueError("an ES step needs one sign and one reward per seed, and at least one seed")
        if any(s not in (1, -1) for s in self.signs):
            raise ValueError(f"signs must be +1 or -1, got {self.signs}")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ESStep:
        seeds = tuple(int(s) for s in doc["seeds"])
        signs = tuple(int(s) for s in doc.get("signs") or [1] * len(seeds))
        return cls(seeds, signs, tuple(float(r) for r in doc["rewards"]), float(doc["sigma"]), float(doc["alpha"]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "seeds": list(self.seeds),
            "signs": list(self.signs),
            "rewards": list(self.rewards),
            "sigma": self.sigma,
            "alpha": self.alpha,
        }


def history_digest(steps: Mapping[int, ESStep], version: int, origin: str) -> str:
    """What center `version` is, as a hash: its origin (the noise's device type; the base model is the
    snapshot folder's) and the steps 1..version in order. Two runs share it only if they share the center."""
    h = hashlib.sha256(f"{origin}\x00".encode())
    for v in range(1, version + 1):
        h.update(repr(steps[v]).encode())  # a frozen dataclass of ints, floats and tuples: a stable repr
    return h.hexdigest()
