"""The GRPO trainer sharded across processes with torch FSDP (`fully_shard`, FSDP2), under torchrun.

    torchrun --nproc-per-node 2 -m trainer --algo grpo --redis-url redis://host:6379/0 --run-id R
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint host0:29500 --rdzv-id R \\
        -m trainer --algo grpo --redis-url ... --run-id R     # on each host

Every rank holds 1/N of the policy's weights, gradients and AdamW state (one `fully_shard` per decoder layer
and one for the rest, over a 1-D device mesh: gloo on the CPU, NCCL on GPUs, `train_device` as for one
process). Without torchrun's variables (`RANK`, `WORLD_SIZE`) none of this runs: `python -m trainer` is the
single-process trainer, unchanged.

Who talks to Redis: rank 0 alone. It runs the whole of trainer/grpo.py's loop (reads attempts and rewards,
issues orders, checkpoints the run's state in its MULTI, publishes versions, acks), and its trainer is a
`Leader`: each call (`step`, `save`, `checkpoint`, `resume`) first broadcasts the call to the other ranks
(`broadcast_object_list`; a step carries the batch's groups), then takes part in it. The other ranks run
`follow`: receive a call, take part, repeat, until rank 0 says stop. Chosen over each rank reading its share
because exactly-once accounting then stays where it is (one reader, one consumer name in group `trainer`,
acks only after the checkpoint that holds the step; trainer/loop.py): the ranks hold no Redis state that a
dead rank could lose or double, and a restart resumes exactly as a single trainer does.

A step on N ranks is the single-process step (tests/trainer/test_sharded.py compares them): every rank gets
the whole batch and computes the same advantages, order and normalizer Z (trainer/grpo_loss.py: tokens of the
whole step, or sequences x max_tokens); rank r forwards and backwards sequences r, r+N, r+2N, ... of the
length-sorted batch, each micro-batch's loss divided by that global Z, so the sum of all ranks' gradients is
the full batch's. FSDP reduce-scatters gradients as a mean by default; here it sums (divide factor 1), and
every rank runs the same number of passes (a rank short of sequences runs one token with zero loss), since
each pass is a collective. The loss statistics are summed across ranks the same way.

Checkpoints are torch.distributed.checkpoint folders (`checkpoints/v<version>.dcp`, GRPOTrainer.write_sharded):
each rank writes its shards into a temporary folder, rank 0 renames it into place once every rank has written,
and only then does the run's state in Redis name it, so a killed save is never taken for a good one (the
temporary folder is removed at the next start). DCP reshards on load: onto another number of ranks, or onto
one process without torchrun (GRPOTrainer.resume reads a folder). The policy folder generators load is
written by rank 0 from the full weights gathered to its CPU. Only rank 0 reads the weights at the start: the
others build the model on the meta device and receive their shards from it (`_load`).

A rank that dies: torchrun's agent sees its exit, stops the others (SIGTERM, SIGKILL after 30 s:
elastic/agent/server/local_elastic_agent.py `_shutdown`) and exits nonzero (`--max-restarts 0`, its
default); a rank blocked in a collective with a dead peer gets gloo's connection error, or at the latest the
process group's timeout (`dist_timeout_s`). Nothing was acked past the last checkpoint, so the restarted
job re-reads the rest from its pending lists and redoes the step. While rank 0 waits for rollouts the
others wait in `broadcast_object_list`; rank 0 sends them a no-op every `keepalive_s` so that wait never
reaches the timeout.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM

from streams import faults, files
from trainer.grpo_loss import GRPOConfig, sequence_logprobs
from trainer.grpo_trainer import GRPOTrainer

# the statistics grpo_loss returns, summed across ranks in this order
STAT_KEYS = (
    "tokens",
    "clip_low_tokens",
    "clip_high_tokens",
    "is_truncated_tokens",
    "is_weight_sum",
    "ratio_sum",
    "kl_sum",
    "pg_loss",
    "kl_loss",
)
CHECKPOINT_SUFFIX = ".dcp"


def start(device_type: str, timeout_s: float) -> DeviceMesh:
    """Join the job's process group (torchrun's rendezvous: MASTER_ADDR/PORT, RANK, WORLD_SIZE from the
    environment) and make the 1-D mesh FSDP shards over. `timeout_s` bounds every collective: a rank waiting
    on a peer that is dead or stuck fails after it instead of hanging."""
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return init_device_mesh(device_type, (dist.get_world_size(),), mesh_dim_names=("dp",))


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


# ------------------------------------------------------------------------------------------------ the trainer


class ShardedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with its model sharded over `mesh`. Every method is a collective: every rank calls it with the
    same arguments (rank 0's `Leader` and the others' `follow` see to that)."""

    def __init__(self, model_path: str | os.PathLike, cfg: GRPOConfig, out_dir: str | os.PathLike, mesh: DeviceMesh):
        self.mesh = mesh
        self.rank, self.world = mesh.get_rank(), mesh.size()
        device = f"cuda:{torch.cuda.current_device()}" if mesh.device_type == "cuda" else "cpu"
        super().__init__(model_path, cfg, out_dir, device=device)

    def _load(self, dtype: torch.dtype) -> torch.nn.Module:
        """Only rank 0 reads the weights. The others build the model on the meta device (no memory), every rank
        shards it, the others allocate their shards alone (`to_empty`), and rank 0 sends the weights tensor by
        tensor, each rank keeping its part (set_model_state_dict's `broadcast_from_rank0`), then the buffers
        (the rotary frequencies are in no state dict). So no rank but 0 ever holds the whole model, and rank 0
        holds it once, on its CPU, while loading."""
        if self.rank == 0:
            model = AutoModelForCausalLM.from_pretrained(str(self.model_path), dtype=dtype)
            full = model.state_dict()  # the whole weights, kept while the sharding replaces the parameters
        else:
            config = AutoConfig.from_pretrained(str(self.model_path))
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype)
            full = {}
        self._shard(model)
        if self.rank != 0:
            model.to_empty(device=self.device)
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        del full
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)
        return model

    def _shard(self, model: torch.nn.Module) -> None:
        """Shard each decoder layer (the classes the model names as never split: `_no_split_modules`), then
        the rest (embeddings, final norm, head; tied weights stay one parameter). fully_shard moves the shards
        to the mesh's device. Gradients are reduced as a sum: each rank's loss is already divided by the
        whole batch's normalizer (the module docstring)."""
        blocks = set(getattr(model, "_no_split_modules", None) or [])
        for module in [m for m in model.modules() if type(m).__name__ in blocks]:
            fully_shard(module, mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                # factor 1 + sum-only comms: no division before or after the reduce-scatter
                # (_fsdp_collectives._get_gradient_divide_factors)
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)

    def _chunks(self, order: list[int]) -> list[list[int]]:
        """This rank's micro-batches: every N-th sequence of the length-sorted batch, in as many passes as every
        other rank (some may be empty), about as many sequences a pass as one process would take."""
        mine = torch.tensor(order[self.rank :: self.world], dtype=torch.long)
        passes = max(1, math.ceil(min(self.cfg.grad_accum, len(order)) / self.world))
        return [c.tolist() for c in mine.tensor_split(passes)]

    def _backward(self, chunk, samples, advs, off, normalizer, ref, prox) -> dict[str, float]:
        faults.point(f"grpo.sharded_pass.rank{self.rank}")  # a rank killed mid-step (tests/trainer/test_sharded.py)
        if chunk:
            return super()._backward(chunk, samples, advs, off, normalizer, ref, prox)
        # no sequence left for this rank: the pass's all-gathers and reduce-scatter still need it
        with self.computing():
            zero = sequence_logprobs(self.model, [[0]], [[0]])[0].sum() * 0.0
        zero.backward()
        return {}

    @torch.no_grad()
    def _no_grad_logprobs(self, model: Any, samples: list, chunks: list[list[int]]) -> dict:
        out = {}
        for chunk in chunks:
            if chunk:
                out.update(super()._no_grad_logprobs(model, samples, [chunk]))
            else:
                sequence_logprobs(model, [[0]], [[0]])  # the pass's all-gathers
        return out

    def _batch_totals(self, totals: dict[str, float]) -> dict[str, float]:
        summed = torch.tensor([totals.get(k, 0.0) for k in STAT_KEYS], dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return dict(zip(STAT_KEYS, summed.tolist(), strict=True))

    def _clip_grad_norm(self, params: list[torch.Tensor], limit: float) -> float:
        # over DTensor gradients the norm is the whole model's (a DTensor): as in torch's FSDP2 tests
        # (test_fully_shard_clip_grad_norm_.py), read it with full_tensor()
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
        return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole weights on rank 0's CPU (other ranks get an empty dict); parameters the model ties (the
        embedding and the head) are one tensor again, so save_pretrained writes them once, as one process does."""
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if full:
            first: dict[int, str] = {}
            for name, param in self.model.named_parameters(remove_duplicate=False):
                if id(param) in first and name in full:
                    full[name] = full[first[id(param)]]
                first.setdefault(id(param), name)
        return full

    def resume(self, path: str | os.PathLike) -> None:
        if not Path(path).is_dir():
            raise ValueError(
                f"{path} is a single-process checkpoint: resume this run without torchrun (one "
                "process), or in a new run; a sharded trainer resumes from .dcp folders"
            )
        self.read_sharded(path)


# ------------------------------------------------------------------------------------------------ rank 0


class Leader:
    """Rank 0's trainer for GRPORun: the same calls as GRPOTrainer, each broadcast to the other ranks first.

    One per process (`leader()`); `trainer_for` builds a fresh sharded model on every rank (a run rebuilt after
    a Redis outage starts from its checkpoint, as a new single-process GRPOTrainer would). Calls hold a lock
    while they are collectives, so the keepalive thread's no-ops never interleave with them; what rank 0 does
    alone (writing the policy folder, renaming the checkpoint) happens outside it."""

    def __init__(self, mesh: DeviceMesh, keepalive_s: float) -> None:
        self.mesh = mesh
        self.trainer: ShardedGRPOTrainer | None = None
        self._lock = threading.RLock()
        self._last = time.monotonic()
        self._closed = threading.Event()
        self._broken = False  # a collective failed (a peer died): the others cannot be told anything more
        self._keepalive_s = keepalive_s
        threading.Thread(target=self._keepalive, name="sharded-keepalive", daemon=True).start()

    def __getattr__(self, name: str) -> Any:  # version, updates, skipped_groups, model, cfg: the trainer's
        if name == "trainer":
            raise AttributeError(name)
        return getattr(self.trainer, name)

    @contextlib.contextmanager
    def _collective(self, *call: Any) -> Iterator[None]:
        """Announce `call` to the other ranks and run the body (rank 0's part of it), one call at a time."""
        with self._lock:
            try:
                dist.broadcast_object_list([call], src=0)
                self._last = time.monotonic()
                yield
            except BaseException:
                self._broken = True
                raise

    def trainer_for(self, model_path: Path, cfg: GRPOConfig, out_dir: Path) -> Leader:
        self.trainer = None  # the old model's memory goes before the new one is loaded
        with self._collective("init", cfg, str(out_dir)):
            self.trainer = ShardedGRPOTrainer(model_path, cfg, out_dir, self.mesh)
        return self

    def step(self, groups: list) -> dict[str, Any]:
        with self._collective("step", [[tuple(s) for s in g] for g in groups]):
            return self.trainer.step(groups)

    def save(self, version: int) -> tuple[Path, str]:
        with self._collective("save"):
            full = self.trainer.full_state()
        return self.trainer.save(version, full)

    def checkpoint(self, path: str | os.PathLike) -> Path:
        """Every rank writes its shards under a temporary name; renamed into place once all have written."""
        final = Path(path)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        with self._collective("checkpoint", str(tmp)):
            self.trainer.write_sharded(tmp)
        files.fsync_dir(tmp)
        faults.point("grpo.sharded_checkpoint_written")  # every shard on disk, not yet in place
        # `final` exists where a resumed trainer redoes the step of a checkpoint its state never named
        files.replace_folder(tmp, final)
        return final

    def resume(self, path: str | os.PathLike) -> None:
        with self._collective("resume", str(path)):
            self.trainer.resume(path)

    def close(self) -> None:
        """Tell the other ranks to exit; not after a failed collective (a dead peer): torchrun's agent stops
        the survivors then, as rank 0 exits nonzero."""
        with self._lock:
            self._closed.set()
            if not self._broken:
                with self._collective("stop"):
                    pass

    def _keepalive(self) -> None:
        while not self._closed.wait(self._keepalive_s / 4):
            with self._lock:  # decided under the lock: never a no-op after the stop
                if (
                    not self._closed.is_set()
                    and not self._broken
                    and time.monotonic() - self._last >= self._keepalive_s
                ):
                    with self._collective("noop"):
                        pass


_leader: Leader | None = None


def leader() -> Leader | None:
    """Rank 0's Leader once `become_leader` ran (under torchrun), else None: the single-process trainer."""
    return _leader


def become_leader(mesh: DeviceMesh, timeout_s: float) -> Leader:
    global _leader
    _leader = Leader(mesh, keepalive_s=min(60.0, timeout_s / 4))
    return _leader


# ------------------------------------------------------------------------------------------------ other ranks


def follow(mesh: DeviceMesh, model_path: Path) -> int:
    """Ranks 1..N-1: take part in each call rank 0 announces, until it says stop. Returns the exit status."""
    trainer: ShardedGRPOTrainer | None = None
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        name, *args = box[0]
        if name == "init":
            trainer = None
            cfg, out_dir = args
            trainer = ShardedGRPOTrainer(model_path, cfg, out_dir, mesh)
        elif name == "step":
            trainer.step(*args)
        elif name == "save":
            trainer.full_state()
        elif name == "checkpoint":
            trainer.write_sharded(*args)
        elif name == "resume":
            trainer.resume(*args)
        elif name == "stop":
            return 0
        elif name != "noop":
            print(f"trainer (rank {mesh.get_rank()}): unknown call {name!r} from rank 0", file=sys.stderr)
            return 1
