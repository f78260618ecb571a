"""Evolution Strategies weights: exact perturbations, exact restore, deterministic replay (Qiu et al. 2025).

The state of an ES run is the base model plus its history: one `ESStep` (seeds, signs, normalized rewards,
sigma, alpha) per policy version, ~200 bytes each. Everything here is a pure function of that state:

- `noise(seed, name, shape)`: the noise of one parameter tensor, drawn in fp32 from a generator seeded by a
  hash of (seed, tensor name). Any process on the same device type draws the same bits.
- `ESWeights` keeps the fp32 master copy of the center. A member's weights are `master + sigma*sign*eps`,
  computed in fp32 and only then cast into the engine's dtype by its `write` function; restoring the center
  (`use(version)`) writes the master again. Nothing is ever added and subtracted back in bf16 (that drifts
  and loses the update).
- An update is `theta += alpha/N * sum_n z_n * sign_n * eps_n`, accumulated in fp32 in member order, so
  replaying the same history from the same base gives bit-identical weights.
- Low-rank noise (`noise="lowrank"`, EGGROLL, Sarkar et al. 2025): member n's noise of a weight matrix W
  (out x in) is eps_n = A_n B_n^T / sqrt(r), A_n (out x r) and B_n (in x r) standard normal from the same
  seeded generator; the update is the same sum, now a full-rank change made of low-rank terms, so a version
  is still its seeds and z-scores. Vectors (norms, biases) and the token embedding (tied to the output layer
  in the default model) are left alone: a member is then exactly a LoRA adapter on the linear layers, which
  is what lets an engine serve a whole population in one batch (each row adding its member's (x B) A^T,
  producers/hf.py; vLLM's multi-LoRA) with no weight written per member. The scale convention is the full
  path's (sigma in the perturbation, alpha/N in the update, Qiu et al.), so a preset's alpha means the same
  step length under both; EGGROLL's alpha/(N sigma) form is this one with alpha' = alpha * sigma.
- Snapshots of the master every K versions (safetensors, written atomically) bound the replay of a generator
  that starts late. A snapshot is named by the history that made it (`history_digest`: the device type and
  every step up to its version, hashed in order) and its bytes are checked against the digest it was
  written with, so a run that reuses a run id, or a torn file, never hands a generator another run's center.

Tensor names are the checkpoint's (safetensors) names, the same in every engine, so a member means the
same perturbation under transformers and under vLLM. The engine supplies `write`, which receives
(name, fp32 tensor) pairs and copies them into whatever it samples with.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import structlog
import torch

from weights.io import Weights, digest, load_master, save_weights, snapshot_metadata
from weights.step import ESStep, history_digest

Writer = Callable[[Iterable[tuple[str, torch.Tensor]]], None]

_NOISE_KEY = b"proofstream-es-noise/1"  # part of the noise definition: changing it changes every run


def noise_seed(seed: int, name: str) -> int:
    """The generator seed of tensor `name` for member seed `seed`: 63 bits of a keyed BLAKE2b."""
    digest = hashlib.blake2b(f"{seed}\x00{name}".encode(), digest_size=8, key=_NOISE_KEY).digest()
    return int.from_bytes(digest, "little") >> 1


def noise(
    seed: int, name: str, shape: torch.Size | tuple[int, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Standard normal fp32 noise for one tensor: a pure function of (seed, name, shape, device type)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(noise_seed(seed, name))
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float32, device=device)


def device_type(device: str | torch.device) -> str:
    """ "cuda:1" -> "cuda": noise depends on the device type, not its index."""
    return str(device).split(":", 1)[0]


def lowrank_target(name: str, shape: torch.Size | tuple[int, ...]) -> bool:
    """Whether low-rank noise perturbs tensor `name`: the weight matrices of the linear layers (2-D, not an
    embedding or the output layer); everything else stays at the center."""
    return len(shape) == 2 and not any(part in name for part in ("embed", "lm_head", "wte", "wpe"))


def factors(
    seed: int, name: str, shape: torch.Size | tuple[int, ...], rank: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B): fp32 standard normal, A (out x rank) then B (in x rank) from one generator seeded as `noise`'s."""
    out_features, in_features = shape
    generator = torch.Generator(device=device)
    generator.manual_seed(noise_seed(seed, name))
    a = torch.randn((out_features, rank), generator=generator, dtype=torch.float32, device=device)
    b = torch.randn((in_features, rank), generator=generator, dtype=torch.float32, device=device)
    return a, b


def lowrank_noise(
    seed: int, name: str, shape: torch.Size | tuple[int, ...], rank: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """eps = A B^T / sqrt(rank) of one weight matrix, in fp32 (a product over `rank` terms per element: no
    reduction that a thread count could reorder at these sizes)."""
    a, b = factors(seed, name, shape, rank, device)
    return (a @ b.T).mul_(rank**-0.5)


def apply_step(master: Weights, step: ESStep) -> None:
    """theta += alpha/N * sum_n z_n sign_n eps_n, in place, in fp32, tensors in name order, members in order.
    Low-rank steps change only the tensors their members perturb (`lowrank_target`)."""
    scale = step.alpha / len(step.seeds)
    for name in sorted(master):
        tensor = master[name]
        if step.noise == "lowrank" and not lowrank_target(name, tensor.shape):
            continue
        acc = torch.zeros_like(tensor)
        for seed, sign, z in zip(step.seeds, step.signs, step.rewards, strict=True):
            if z == 0.0:
                continue
            if step.noise == "lowrank":
                eps = lowrank_noise(seed, name, tensor.shape, step.rank, tensor.device)
            else:
                eps = noise(seed, name, tensor.shape, tensor.device)
            acc.add_(eps, alpha=z * sign)
        tensor.add_(acc, alpha=scale)


TAG = 16  # hex digits of the history digest in a snapshot's file name

log = structlog.get_logger("weights.es")


class ESWeights:
    """The fp32 master copies of recent centers, and the one set of weights the engine samples with.

    `add_step(version, step)` records history (steps must arrive in version order, once each);
    `use(version, seed, sign, sigma)` makes the engine's weights center(version) + sigma*sign*eps(seed)
    (`seed=None`: the center itself). Centers are built on demand: from a master in memory, else from the
    newest snapshot at or below the version, else from the base, by replaying steps. `keep` masters stay in
    memory (the newest ones), so members of a center that is a version or two old cost no replay.
    """

    def __init__(
        self,
        base: Callable[[], Weights],
        write: Writer,
        *,
        snapshot_dir: str | os.PathLike | None = None,
        snapshot_every: int = 0,
        keep: int = 2,
        device: str = "cpu",
    ) -> None:
        self._base = base
        self.device = device
        self.device_type = device_type(device)
        self._write = write
        self.snapshot_dir = Path(snapshot_dir) if snapshot_dir else None
        self.snapshot_every = snapshot_every
        self.keep = max(1, keep)
        self.steps: dict[int, ESStep] = {}  # version v -> the step that made v from v-1
        self.masters: OrderedDict[int, Weights] = OrderedDict()
        self.current: tuple[int, int | None, int, float, int] | None = None  # what the engine holds now
        self.replayed = 0  # steps applied while building centers (a late start, a restart, an old center)
        self.snapshots_loaded = 0

    @property
    def latest(self) -> int:
        return max(self.steps, default=0)

    def add_step(self, version: int, step: ESStep | Mapping[str, Any]) -> None:
        step = step if isinstance(step, ESStep) else ESStep.from_dict(step)
        if version < 1:
            raise ValueError(f"an ES step makes version >= 1, not {version}")
        known = self.steps.get(version)
        if known is not None and known != step:
            raise ValueError(f"conflicting ES steps for version {version}: the history must never change")
        self.steps[version] = step

    def forget_after(self, version: int) -> None:
        """Drop the steps that made the versions after `version`, and every center built from them: a failover
        lost their policy entries, and the trainer makes those versions again, maybe otherwise
        (producers/policy.py). Snapshots need nothing: each is named by its history's digest, so a
        snapshot of the forgotten history is never loaded for the new one."""
        for v in [v for v in self.steps if v > version]:
            del self.steps[v]
        for v in [v for v in self.masters if v > version]:
            del self.masters[v]
        if self.current is not None and self.current[0] > version:
            self.current = None  # the engine's weights are a center that no longer exists

    def center(self, version: int) -> Weights:
        """The fp32 master of `version` (built and cached if needed). Do not modify it."""
        if version in self.masters:
            self.masters.move_to_end(version)
            return self.masters[version]
        missing = [v for v in range(1, version + 1) if v not in self.steps]
        if missing:
            raise LookupError(f"policy version {version} needs ES steps {missing[:5]}... that were not received")
        start, weights = self._nearest(version)
        for v in range(start + 1, version + 1):
            apply_step(weights, self.steps[v])
            self.replayed += 1
            self._maybe_snapshot(v, weights)
        self.masters[version] = weights
        while len(self.masters) > self.keep:
            self.masters.popitem(last=False)
        return weights

    def _nearest(self, version: int) -> tuple[int, Weights]:
        """A fresh copy of the newest known center at or below `version`: memory, snapshot, or base."""
        below = [v for v in self.masters if v <= version]
        best = max(below, default=-1)
        snap = self._newest_snapshot(version) if version > best else None
        if snap is not None and snap[0] > best:
            self.snapshots_loaded += 1
            return snap
        if best >= 0:
            return best, {k: v.clone() for k, v in self.masters[best].items()}
        return 0, self._base()

    def history(self, version: int) -> str:
        return history_digest(self.steps, version, self.device_type)

    def _newest_snapshot(self, version: int) -> tuple[int, Weights] | None:
        """The newest snapshot at or below `version` whose name is this history's and whose bytes are the
        ones it was written with; a snapshot of another history (a reused run id) or a torn file is passed
        over, never loaded."""
        if self.snapshot_dir is None or not self.snapshot_dir.is_dir():
            return None
        found = []
        for path in self.snapshot_dir.glob("v*-*.safetensors"):
            number, _, tag = path.stem[1:].partition("-")
            if number.isdigit() and 0 < int(number) <= version:
                found.append((int(number), tag, path))
        for v, tag, path in sorted(found, reverse=True):
            history = self.history(v)
            if tag != history[:TAG]:
                continue
            try:
                weights, metadata = load_master(path, self.device), snapshot_metadata(path)
            except Exception as e:  # noqa: BLE001 - a snapshot is a cache: unreadable means not there
                log.warning("es_snapshot_unreadable", path=str(path), error=str(e))
                continue
            if metadata.get("history") != history or metadata.get("digest") != digest(weights):
                log.warning(
                    "es_snapshot_refused",
                    path=str(path),
                    version=v,
                    reason="its history or its bytes are not the ones it was written with",
                )
                continue
            return v, weights
        return None

    def _maybe_snapshot(self, version: int, weights: Weights) -> None:
        if self.snapshot_dir is None or self.snapshot_every <= 0 or version % self.snapshot_every:
            return
        history = self.history(version)
        path = self.snapshot_dir / f"v{version:08d}-{history[:TAG]}.safetensors"
        if not path.exists():  # every generator computes the same bits: the first one to get here writes
            meta = {"version": str(version), "digest": digest(weights), "history": history}
            save_weights(weights, path, metadata=meta)

    def use(self, version: int, seed: int | None = None, sign: int = 1, sigma: float = 0.0, rank: int = 0) -> bool:
        """Make the engine's weights center(version) [+ sigma*sign*eps(seed)], eps full-rank or (`rank` > 0)
        low-rank. False if they already are."""
        member = seed is not None
        want = (version, seed, sign if member else 1, sigma if member else 0.0, rank if member else 0)
        if self.current == want:
            return False
        master = self.center(version)
        self.current = None  # a failure halfway leaves weights we cannot name
        if seed is None:
            self._write(master.items())
        else:
            self._write(perturbed(master, seed, sign, sigma, rank))
        self.current = want
        return True


def perturbed(
    master: Mapping[str, torch.Tensor], seed: int, sign: int, sigma: float, rank: int = 0
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, master + sigma*sign*eps) per tensor, in fp32, one tensor at a time (each a fresh tensor); with
    `rank` > 0 the low-rank eps on the tensors it perturbs, and the others as the master has them."""
    for name in sorted(master):
        tensor = master[name]
        if rank and not lowrank_target(name, tensor.shape):
            yield name, tensor
            continue
        if rank:
            eps = lowrank_noise(seed, name, tensor.shape, rank, tensor.device)
        else:
            eps = noise(seed, name, tensor.shape, tensor.device)
        yield name, eps.mul_(sigma * sign).add_(tensor)


def member_factors(
    master: Mapping[str, torch.Tensor], seed: int, sign: int, sigma: float, rank: int
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (A * sigma*sign/sqrt(rank), B) of one low-rank member: its perturbation of W is the first times
    the second transposed, which an engine adds to a row's output as (x B) A^T without writing W."""
    out = {}
    for name in sorted(master):
        tensor = master[name]
        if lowrank_target(name, tensor.shape):
            a, b = factors(seed, name, tensor.shape, rank, tensor.device)
            out[name] = (a.mul_(sigma * sign * rank**-0.5), b)
    return out
