"""GRPO on the trainer's side, top to bottom: its config, how it issues orders (groups), when it is ready, its
update, what it publishes.

The variant (Shao et al. 2024, DeepSeekMath; the objective and its sources in trainer/grpo_loss.py): G
samples per theorem at the run's temperature, advantages within the group (std-normalized, or Dr. GRPO's
mean only), a token-level clipped objective with clip-higher, truncated importance weights for samples of
older versions, optional k3 KL to the base model, AdamW (trainer/grpo_trainer.py). Groups whose rewards are
all equal carry no signal and are counted and skipped.

The loop is trainer/loop.py's: keep `batch` groups in flight around the newest version (one work order per
theorem, `samples_per_theorem` = G), collect, update, publish. GRPO also needs what was sampled: the
trainer's one read takes `{ps:R}:attempts` too, in group `trainer` (so trimming keeps what it has not used),
and the `SampleStore` keeps each attempt's prompt ids, token ids and behaviour logprobs until its group is
settled. A group is ready when its G rewards and G attempts are in. The step (trainer/grpo_trainer.py) skips
groups whose rewards are all equal; when it changes the weights, the new version is saved as a safetensors
folder, the trainer's weights + optimizer + step go to `checkpoints/v<version>.pt` (sharded under torchrun: a
`.dcp` folder, trainer/sharded.py), and then the policy entry (path + digest), the state and the metrics are
written in one MULTI. Attempts are acked only once their group's step is
checkpointed, so a trainer killed mid-step finds them again in its pending list and redoes the step.

A step whose groups all lack signal leaves the weights, and so the version, as they were; its samples still
count (`samples` in each version's metrics: training attempts consumed by steps so far, with or without
signal), so a run is measured in what the generators produced, not in versions. Policy folders no order can
still name are deleted (each is a full copy of the weights).
"""

from __future__ import annotations

import asyncio
import collections
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from streams import faults
from streams.codec import decode, unpack_float32, unpack_int32
from streams.keys import TRAINER
from streams.schema import Attempt, PolicyUpdate, SchemaError
from trainer.config import TrainerSettings
from trainer.grpo_loss import GRPOConfig, GRPOSample
from trainer.grpo_trainer import GRPOTrainer
from trainer.loop import Run
from trainer.orders import Order, rotation, split_fresh
from trainer.run_state import Entries
from weights import device as devices

KEEP_CHECKPOINTS = 2
# Sequences per forward/backward pass. The step's loss and gradient do not depend on it (accumulation is
# exact, trainer/grpo_loss.py); memory does: the default 135M model's trainer peaked at 3.7 GB RSS for 48
# sequences of ~115 prompt + up to 64 new tokens in passes of 8, where one pass over all 48 would hold six times
# the activations (estimated at over 10 GB in fp32).
MICRO_BATCH_SEQUENCES = 8


# ------------------------------------------------------------------------------------------------ config


def grad_accum_for(groups: int, group_size: int, micro_batch: int = MICRO_BATCH_SEQUENCES) -> int:
    """Micro-batches per optimizer step so that none holds more than `micro_batch` sequences."""
    return max(1, math.ceil(groups * group_size / micro_batch))


def grpo_config(settings: TrainerSettings) -> GRPOConfig:
    """The run's GRPO settings; the rest (clip bounds, importance-weight cap, ...) are GRPOConfig's defaults."""
    accum = max(settings.grad_accum, grad_accum_for(settings.batch, settings.group_size))
    precision = step_precision(settings.train_precision, training_device(settings.train_device))
    return GRPOConfig(
        group_size=settings.group_size,
        lr=settings.lr,
        max_tokens=settings.max_new_tokens,
        advantage=settings.advantage,
        kl_coef=settings.kl_coef,
        grad_accum=accum,
        precision=precision,
        epochs=settings.grpo_epochs,
    )


def step_precision(setting: str, device: str) -> str:
    """`auto`: bf16-mixed where the device computes in bfloat16 (a CUDA GPU that supports it; a CPU whose flags
    name AVX512-BF16 or AMX-BF16, or an Arm CPU's BF16), where it halves the step's time
    (docs/PERFORMANCE.md); else fp32, since a CPU without bf16 emulates it, slower than fp32."""
    if setting != "auto":
        return setting
    if device.startswith("cuda"):
        return "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    return "bf16-mixed" if devices.cpu_has_bf16() else "fp32"


def training_device(setting: str) -> str:
    """`auto`: the GPU when torch sees one (the generators choose theirs the same way), else the CPU; `cuda`
    where there is none is refused (weights.device)."""
    return devices.resolve(setting, flag="--train-device")


# ------------------------------------------------------------------------------------------------ publishing


def unneeded_policies(folders: list[Path], needed_from: int) -> list[Path]:
    """Policy folders (`v<version>`) older than `needed_from`, the oldest version an order may still name."""
    return [f for f in folders if f.name.startswith("v") and f.name[1:].isdigit() and int(f.name[1:]) < needed_from]


# ------------------------------------------------------------------------------------------------ samples


class SampleStore:
    """What the step needs of each attempt of the groups in flight (prompt ids, token ids, behaviour logprobs,
    the version that sampled it), by group, with the attempts stream's entries that carried them. Not
    checkpointed: a restarted trainer reads the entries again from its pending list, since they are acked only
    once their group is settled (`release`)."""

    def __init__(self) -> None:
        # by work id: {attempt id: sample}, and the ids of the attempts stream's entries that carried them
        self.groups: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
        self.entries: dict[str, list[bytes]] = collections.defaultdict(list)

    def add(self, work_id: str, attempt_id: str, sample: dict[str, Any], entry_id: bytes | None = None) -> None:
        self.groups[work_id][attempt_id] = sample
        if entry_id is not None:
            self.entries[work_id].append(entry_id)

    def has_all(self, group: Order) -> bool:
        """The group's rewards are in and so are the samples of every attempt they score."""
        held = self.groups.get(group.work_id, {})
        return group.complete and all(a in held for a in group.rewards)

    def samples(self, group: Order) -> list[GRPOSample]:
        """The group's samples with their rewards, in attempt id order."""
        held = self.groups[group.work_id]
        return [GRPOSample(reward=group.rewards[a], **held[a]) for a in sorted(group.rewards)]

    def release(self, groups: list[Order]) -> list[bytes]:
        """Let go of what `groups` held; the entry ids to ack."""
        for g in groups:
            self.groups.pop(g.work_id, None)
        return [e for g in groups for e in self.entries.pop(g.work_id, [])]


def sample_of(attempt: Attempt) -> dict[str, Any]:
    """What the step needs of an attempt (trainer/grpo_loss.py `GRPOSample`, less the reward)."""
    return {
        "prompt_ids": unpack_int32(attempt.prompt_ids).tolist(),
        "token_ids": unpack_int32(attempt.token_ids).tolist(),
        "logprobs": unpack_float32(attempt.logprobs).tolist(),
        "policy_version": attempt.policy_version,
    }


# ------------------------------------------------------------------------------------------------ the run


class GRPORun(Run):
    algo = "grpo"

    def __init__(self, settings, redis, train, held_out, sink, progress=None, *, model_path: Path) -> None:
        super().__init__(settings, redis, train, held_out, sink, progress)
        self.cfg = grpo_config(settings)
        self.checkpoint_suffix = ".pt"
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # rank 0 under torchrun (trainer/__main__.py started the process group); imported only here, so a
            # single process never loads torch.distributed.checkpoint (about a second)
            from trainer import sharded

            self.trainer = sharded.leader().trainer_for(model_path, self.cfg, sink.run_dir)
            self.checkpoint_suffix = sharded.CHECKPOINT_SUFFIX
        else:
            self.trainer = GRPOTrainer(
                model_path, self.cfg, out_dir=sink.run_dir, device=training_device(settings.train_device)
            )
        self.checkpoint_file = ""
        model = self.trainer.model
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        checkpoint = weights + 2 * sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)  # + AdamW's
        print(
            f"trainer: GRPO step in {self.cfg.precision}"
            + (" (train_precision auto)" if settings.train_precision == "auto" else ""),
            file=sys.stderr,
        )
        print(
            f"trainer: GRPO writes about {(weights + checkpoint) / 1e9:.1f} GB a version under {sink.run_dir}: a "
            f"policy folder ({weights / 1e9:.1f} GB, deleted once no order names it) and a checkpoint "
            f"({checkpoint / 1e9:.1f} GB, the last {KEEP_CHECKPOINTS} kept)",
            file=sys.stderr,
        )
        self.samples = SampleStore()
        self.takers[self.keys.attempts] = self._take_attempts

    def state(self) -> dict[str, Any]:
        return {**super().state(), "checkpoint": self.checkpoint_file, "config": vars(self.cfg)}

    def _load(self, doc: dict[str, Any]) -> None:
        super()._load(doc)
        self.checkpoint_file = doc.get("checkpoint", "")
        if self.checkpoint_file:
            self.trainer.resume(self.checkpoint_file)
        if self.trainer.version != self.version:
            raise RuntimeError(
                f"checkpoint {self.checkpoint_file} holds version {self.trainer.version}, "
                f"the run's state says {self.version}"
            )

    async def resume(self) -> bool:
        self._remove_partial_files()
        return await super().resume()

    # -- orders: `batch` groups in flight, one theorem and G samples each -----------------------------------

    async def top_up(self) -> int:
        return await self._issue(self.settings.batch, self._new_group, "groups_issued")  # lockstep at quorum 1

    def _new_group(self, version: int, index: int) -> Order:
        """Group `index` of `version`: the next problem of the seeded rotation (a replacement for a cut group
        takes the one after the version's batch)."""
        theorem_id = rotation(self.train, version, self.settings.batch, self.settings.seed, index)
        return Order(
            f"grpo-v{version}-g{index}", version, 0, 1, [theorem_id], samples=self.cfg.group_size, issued_at=time.time()
        )

    # -- reading: the attempts' tokens and behaviour logprobs, besides the rewards ----------------------------

    async def _take_attempts(self, entries: Entries) -> None:
        """Keep the samples of the groups in flight; ack at once the attempts no group will use."""
        unused: list[bytes] = []
        for entry_id, fields in entries:
            try:
                a = decode(Attempt, fields)
            except SchemaError:
                unused.append(entry_id)  # the verifiers dead-letter it; the trainer never sees its reward
                continue
            if a.work_id not in self.orders:  # evaluation or an order already used or dropped
                unused.append(entry_id)
                continue
            self.samples.add(a.work_id, a.attempt_id, sample_of(a), entry_id)
        if unused:
            await self.redis.xack(self.keys.attempts, TRAINER, *unused)

    def _usable(self, order: Order) -> bool:
        return self.samples.has_all(order)

    async def _settled(self, orders: list[Order]) -> None:
        """Let go of the groups' samples; ack their attempts (their step, if any, is checkpointed)."""
        if entries := self.samples.release(orders):
            await self.redis.xack(self.keys.attempts, TRAINER, *entries)

    # -- ready: a quorum of the batch, or one group at the deadline -----------------------------------------

    def _ready(self) -> list[Order] | None:
        return self._ready_at_quorum(self.settings.batch, at_least=1)

    # -- the update, and what it publishes ------------------------------------------------------------------

    async def update(self, ready: list[Order]) -> dict[str, Any] | None:
        fresh, stale = split_fresh(ready, self.version, self.settings.max_staleness, self.settings.batch)
        groups = [self.samples.samples(m) for m in fresh]
        started = time.monotonic()
        step = await asyncio.to_thread(self.trainer.step, groups)
        faults.point("grpo.stepped")  # new weights in memory only: a restart redoes the step from the checkpoint
        own: dict[str, Any] = {
            "groups": len(fresh),
            "steps_without_signal": self.counts["steps_without_signal"],
            "groups_used": [m.work_id for m in fresh],
            **{k: v for k, v in step.items() if k not in ("version", "reward_mean", "groups")},
            "train_s": round(time.monotonic() - started, 2),
        }
        policy = None
        if step["updated"]:
            folder, digest = await asyncio.to_thread(self.trainer.save, self.trainer.version)
            path = self.sink.run_dir / "checkpoints" / f"v{self.trainer.version:06d}{self.checkpoint_suffix}"
            path.parent.mkdir(exist_ok=True)
            await asyncio.to_thread(self.trainer.checkpoint, path)
            self.checkpoint_file = str(path)
            faults.point("grpo.saved")  # policy folder and checkpoint on disk, the run's state not yet in Redis
            policy = PolicyUpdate(
                self.trainer.version,
                "grpo",
                weights_path=str(Path(folder).resolve()),
                digest=digest,
                created_ms=int(time.time() * 1000),
            )
        else:
            self.counts["steps_without_signal"] += 1
        self.counts["groups_used"] += len(fresh)
        self.counts["groups_stale_dropped"] += len(stale)
        self.counts["groups_skipped"] = self.trainer.skipped_groups
        metrics = await self._publish(policy, fresh, stale, own)
        self._prune_checkpoints()
        self._prune_policies()
        return metrics

    def _remove_partial_files(self) -> None:
        """Temp files and folders a killed trainer left half-written (checkpoints and policy folders are written
        under a dot name and renamed into place): nobody else writes here (one trainer a run, trainer/lease.py)."""
        for folder in (self.sink.run_dir / "checkpoints", self.sink.run_dir / "policy"):
            for partial in folder.glob(".*") if folder.is_dir() else []:
                if partial.is_dir():
                    shutil.rmtree(partial, ignore_errors=True)
                else:
                    partial.unlink(missing_ok=True)

    def _prune_checkpoints(self) -> None:
        folder = self.sink.run_dir / "checkpoints"
        kept = sorted(folder.glob(f"v*{self.checkpoint_suffix}")) if folder.is_dir() else []
        for old in kept[:-KEEP_CHECKPOINTS]:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)

    def _prune_policies(self) -> None:
        """Delete the folders of versions no order in flight names. An order for an older version is either
        settled (its member or evaluation is gone from the state) or past the staleness bound (generators
        skip it before loading anything), so none of them is ever loaded again."""
        folder = self.sink.run_dir / "policy"
        if not folder.is_dir():
            return
        needed_from = min([self.version, *(o.center for o in [*self.orders.values(), *self.evals.values()])])
        for old in unneeded_policies(sorted(folder.iterdir()), needed_from):
            shutil.rmtree(old, ignore_errors=True)
