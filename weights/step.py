"""The ES update as data: what the trainer publishes for version v -> v+1 and every generator replays.

One `ESStep` per policy version (seeds, signs, normalized rewards, sigma, alpha; ~200 bytes) and the digest
of a history of them. Pure Python, no torch: the trainer builds steps without holding any weights, and
`weights.es` applies them to tensors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Noise = Literal["full", "lowrank"]
NOISES: tuple[str, ...] = ("full", "lowrank")


@dataclass(frozen=True, slots=True)
class ESStep:
    """One update, version v -> v+1: members (seed, sign), their z-scored rewards, the step sizes, and the
    kind of noise the members were drawn with (`full`: every tensor; `lowrank`: rank-`rank` products on the
    weight matrices, weights/es.py). A full step's fields and repr are what they were before `noise`
    existed, so the digests of full-rank histories did not change."""

    seeds: tuple[int, ...]
    signs: tuple[int, ...]
    rewards: tuple[float, ...]  # normalized (z-scored) member rewards
    sigma: float
    alpha: float
    noise: Noise = field(default="full", repr=False)
    rank: int = field(default=0, repr=False)  # lowrank only: r of each member's A_i B_i^T

    def __post_init__(self) -> None:
        if not (len(self.seeds) == len(self.signs) == len(self.rewards)) or not self.seeds:
            raise ValueError("an ES step needs one sign and one reward per seed, and at least one seed")
        if any(s not in (1, -1) for s in self.signs):
            raise ValueError(f"signs must be +1 or -1, got {self.signs}")
        if self.noise not in NOISES or (self.noise == "lowrank") != (self.rank > 0):
            raise ValueError(f"noise {self.noise!r} with rank {self.rank}: full has rank 0, lowrank a rank >= 1")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ESStep:
        seeds = tuple(int(s) for s in doc["seeds"])
        signs = tuple(int(s) for s in doc.get("signs") or [1] * len(seeds))
        rewards = tuple(float(r) for r in doc["rewards"])
        noise, rank = doc.get("noise", "full"), int(doc.get("rank", 0))
        return cls(seeds, signs, rewards, float(doc["sigma"]), float(doc["alpha"]), noise, rank)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "seeds": list(self.seeds),
            "signs": list(self.signs),
            "rewards": list(self.rewards),
            "sigma": self.sigma,
            "alpha": self.alpha,
        }
        if self.noise != "full":  # a full step's entry is the one runs wrote before low-rank noise existed
            out.update(noise=self.noise, rank=self.rank)
        return out

    def describe(self) -> str:
        """What its history digest hashes: the repr, plus the noise where it is not full."""
        return repr(self) if self.noise == "full" else f"{self!r}|{self.noise}:{self.rank}"


def history_digest(steps: Mapping[int, ESStep], version: int, origin: str) -> str:
    """What center `version` is, as a hash: its origin (the noise's device type; the base model is the
    snapshot folder's) and the steps 1..version in order. Two runs share it only if they share the center."""
    h = hashlib.sha256(f"{origin}\x00".encode())
    for v in range(1, version + 1):
        h.update(steps[v].describe().encode())  # a frozen dataclass of ints, floats and tuples: a stable repr
    return h.hexdigest()
