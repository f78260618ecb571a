"""One rank of a sharded GRPO trainer job, run by torchrun: the GPU check's `sharded` step (one rank over NCCL,
ops/gpu/full.py) and tests/trainer/test_sharded.py's (2 CPU ranks over gloo) run it.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m ops.gpu.sharded_job MODEL OUT

Every rank calls the ShardedGRPOTrainer's collectives itself (the calls trainer/sharded.py's Leader and
`follow` make on each rank): one step on `batch(1)`, the policy folder of version 1 (rank 0 writes it) and
the checkpoint `OUT/v000001.dcp` (a temporary folder renamed by rank 0 once every rank has written, as the
Leader does). Ranks other than 0 are given a folder with the model's config and no weights. Then a second
trainer, loaded afresh from the base model, resumes from that checkpoint and steps on `batch(2)` (version 2's
policy folder under OUT/resumed). Rank 0 writes each step's metrics to `OUT/metrics.jsonl` (streams/run_dir.py METRICS).
`SHARDED_JOB_DEVICE` (default cpu) and `SHARDED_JOB_PRECISION` (default fp32) choose the device and precision.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from streams.run_dir import METRICS
from trainer import sharded
from trainer.grpo_loss import GRPOConfig, GRPOSample

# grad_accum 2: one pass a rank for batch(1)'s 3 sequences (2 on rank 0, 1 on rank 1); batch(2) trains one
# sequence, so rank 1 runs an idle pass. SHARDED_JOB_PRECISION: the job's (the tests' reference: fp32).
CFG = GRPOConfig(group_size=2, lr=1e-6, grad_accum=2, precision=os.environ.get("SHARDED_JOB_PRECISION", "fp32"))


def batch(n: int) -> list[list[GRPOSample]]:
    """Groups of two samples in SmolLM2's vocabulary with rewards that carry signal and completions of
    different lengths (the split is over the length-sorted batch); an empty completion is not trained.
    batch(1): 3 sequences trained; batch(2): 1."""

    def ids(seed: int, length: int) -> list[int]:
        return [(97 * seed + 31 * j + 1000 * n) % 49000 + 10 for j in range(length)]

    empty = {(1, 1)} if n == 1 else {(0, 1)}
    groups = []
    for g in range(2 if n == 1 else 1):
        pair = []
        for k in range(2):
            completion = [] if (g, k) in empty else ids(10 * g + k, 3 + 2 * g + k)
            pair.append(
                GRPOSample(
                    prompt_ids=ids(g, 4 + g),
                    token_ids=completion,
                    logprobs=[-2.5] * len(completion),
                    reward=float(k == (g % 2)),
                    policy_version=0,
                )
            )
        groups.append(pair)
    return groups


def step(trainer: sharded.ShardedGRPOTrainer, n: int, out: Path, checkpoint: bool = True) -> Path:
    """One step on batch(n), its policy folder, its checkpoint (unless not asked); returns the checkpoint."""
    metrics = trainer.step(batch(n))
    full = trainer.full_state()
    tmp, final = out / f".tmp-v{trainer.version:06d}.dcp", out / f"v{trainer.version:06d}.dcp"
    if dist.get_rank() == 0:
        trainer.save(trainer.version, full)
        tmp.mkdir(parents=True)
    if checkpoint:
        dist.barrier()
        trainer.write_sharded(tmp)
    if dist.get_rank() == 0:
        os.rename(tmp, final)
        with open(out / METRICS, "a") as handle:
            handle.write(json.dumps({**metrics, "world": dist.get_world_size()}) + "\n")
    return final


def without_weights(model: str, out: Path) -> Path:
    """A folder with the model's config and no weights: what ranks other than 0 load from (trainer/sharded.py
    `_load`: only rank 0 reads the weights). Were they to read any, from_pretrained would fail here."""
    folder = out / f"config-only-rank{dist.get_rank()}"
    folder.mkdir(parents=True)
    shutil.copy(Path(model) / "config.json", folder / "config.json")
    return folder


def main(model: str, out: str) -> None:
    torch.set_num_threads(1)
    # SHARDED_JOB_DEVICE=cuda: the same job on NCCL, one GPU a rank (`python -m ops.gpu.check --full` runs it)
    mesh = sharded.start(os.environ.get("SHARDED_JOB_DEVICE", "cpu"), timeout_s=120)
    if dist.get_rank() != 0:
        model = str(without_weights(model, Path(out)))
    trainer = sharded.ShardedGRPOTrainer(model, CFG, Path(out), mesh)
    checkpoint = step(trainer, 1, Path(out))
    del trainer
    resumed = sharded.ShardedGRPOTrainer(model, CFG, Path(out) / "resumed", mesh)
    resumed.resume(checkpoint)
    step(resumed, 2, Path(out) / "resumed", checkpoint=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
