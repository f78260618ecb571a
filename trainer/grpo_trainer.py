"""The policy GRPO trains: the model, its AdamW optimizer, one step over a batch of groups, the saved policy
versions, and the checkpoint a restarted trainer resumes from bit for bit. The objective it minimizes is
trainer/grpo_loss.py's; the run that feeds it groups and announces what it saves is trainer/grpo.py's.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from streams import faults, files
from trainer.grpo_loss import (
    GRPOConfig,
    GRPOSample,
    as_sample,
    group_advantages,
    grpo_loss,
    pad_right,
    sequence_logprobs,
)
from weights.model import weights_digest

_TOKENIZER_PATTERNS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.jinja",
    "*.tiktoken",
    "*.model",
)
CHECKPOINT_FORMAT = "proofstream-grpo/1"
SHARDED_FORMAT = "proofstream-grpo-dcp/1"  # a folder: torch.distributed.checkpoint's files + SHARDED_META
SHARDED_META = "trainer.json"


class GRPOTrainer:
    """The policy, its optimizer, and the saved versions. `version` is the policy version the weights are
    (0: the model at `model_path`); each `step` that updates the weights makes version + 1."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        cfg: GRPOConfig,
        out_dir: str | os.PathLike,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model_path = Path(model_path)
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.device = torch.device(device)
        self.model = self._load(dtype)
        self.model.eval()  # no dropout: the forward with gradient matches the no-grad proximal/behaviour ones
        self.model.config.use_cache = False
        self.ref_model = None
        if cfg.kl_coef > 0:
            self.ref_model = self._load(dtype)
            self.ref_model.eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )
        self.version = 0
        self.updates = 0  # optimizer steps taken
        self.skipped_groups = 0  # groups with all-equal rewards, over the trainer's life

    def _load(self, dtype: torch.dtype) -> torch.nn.Module:
        """The model at `model_path`, where it trains: on `device` (trainer/sharded.py shards it across ranks)."""
        return AutoModelForCausalLM.from_pretrained(str(self.model_path), dtype=dtype).to(self.device)

    # -- one batch ------------------------------------------------------------------------------------

    def step(self, groups: Sequence[Sequence[Any]]) -> dict[str, Any]:
        """One policy update from `groups` (each a list of samples of one theorem). Returns its metrics.

        Groups with all-equal rewards are skipped (counted). With nothing left the weights do not change and
        ``metrics["updated"]`` is False; otherwise they take `cfg.epochs` optimizer steps (each over
        `cfg.grad_accum` micro-batches, with gradient clipping) and `version` advances by one.
        """
        started = time.monotonic()
        cfg = self.cfg
        samples: list[GRPOSample] = []
        advs: list[float] = []
        rewards: list[float] = []
        skipped = 0
        for group in groups:
            items = [as_sample(x) for x in group]
            rewards.extend(float(s.reward) for s in items)
            a, skip = group_advantages([s.reward for s in items], cfg.advantage, cfg.adv_eps)
            if skip:
                skipped += 1
                continue
            for s, adv in zip(items, a.tolist(), strict=True):
                if len(s.logprobs) != len(s.token_ids):
                    raise ValueError(f"{len(s.logprobs)} behaviour logprobs for {len(s.token_ids)} completion tokens")
                samples.append(s)
                advs.append(adv)
        self.skipped_groups += skipped
        metrics: dict[str, Any] = {
            "groups": len(groups),
            "skipped_groups": skipped,
            "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
            "version": self.version,
        }
        kept = [i for i, s in enumerate(samples) if len(s.token_ids) > 0]
        if not kept:
            metrics.update(updated=False, sequences=0, tokens=0, step_s=time.monotonic() - started)
            return metrics

        off = [s.policy_version < self.version for s in samples]
        tokens = sum(len(samples[i].token_ids) for i in kept)
        normalizer = float(len(samples) * cfg.max_tokens) if cfg.advantage == "dr_grpo" else float(tokens)
        order = sorted(kept, key=lambda i: len(samples[i].prompt_ids) + len(samples[i].token_ids))
        chunks = self._chunks(order)

        prox = self._no_grad_logprobs(self.model, samples, chunks) if cfg.epochs > 1 else None
        ref = self._no_grad_logprobs(self.ref_model, samples, chunks) if self.ref_model is not None else None

        totals: dict[str, float] = {}
        grad_norms = []
        for _ in range(cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            epoch_totals: dict[str, float] = {}
            for chunk in chunks:
                stats = self._backward(chunk, samples, advs, off, normalizer, ref, prox)
                for k, v in stats.items():
                    epoch_totals[k] = epoch_totals.get(k, 0.0) + v
            epoch_totals = self._batch_totals(epoch_totals)
            params = [p for p in self.model.parameters() if p.grad is not None]
            limit = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
            grad_norms.append(self._clip_grad_norm(params, limit))
            self.optimizer.step()
            self.updates += 1
            if not totals:
                totals = epoch_totals  # the statistics of the first epoch describe the batch as sampled
            else:
                totals["clip_low_tokens"] += epoch_totals["clip_low_tokens"]
                totals["clip_high_tokens"] += epoch_totals["clip_high_tokens"]
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        n_tok = totals["tokens"]
        metrics.update(
            updated=True,
            version=self.version,
            sequences=len(kept),
            tokens=int(n_tok),
            off_policy_sequences=sum(off[i] for i in kept),
            loss=totals["pg_loss"] + totals["kl_loss"],
            pg_loss=totals["pg_loss"],
            kl_loss=totals["kl_loss"],
            kl=totals["kl_sum"] / n_tok,
            clip_low_frac=totals["clip_low_tokens"] / (n_tok * cfg.epochs),
            clip_high_frac=totals["clip_high_tokens"] / (n_tok * cfg.epochs),
            is_truncated_frac=totals["is_truncated_tokens"] / n_tok,
            is_weight_mean=totals["is_weight_sum"] / n_tok,
            grad_norm=grad_norms[0] if len(grad_norms) == 1 else grad_norms,
            lr=self.optimizer.param_groups[0]["lr"],
            step_s=time.monotonic() - started,
        )
        return metrics

    def _chunks(self, order: list[int]) -> list[list[int]]:
        """The micro-batches of one optimizer step: `cfg.grad_accum` runs of the length-sorted sequences."""
        chunks = [c.tolist() for c in torch.tensor(order).tensor_split(min(self.cfg.grad_accum, len(order)))]
        return [c for c in chunks if c]

    def computing(self) -> torch.autocast:
        """The context of the step's forward passes: autocast to bfloat16 with `cfg.precision` "bf16-mixed"
        (`python -m ops bench grpo` measures what it saves), plain fp32 otherwise. The backward follows the
        forward's dtypes; gradients land on the fp32 weights."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16-mixed")

    def _backward(self, chunk, samples, advs, off, normalizer, ref, prox) -> dict[str, float]:
        """Forward and backward of one micro-batch; its loss statistics (sums over its tokens)."""
        with self.computing():
            new = sequence_logprobs(
                self.model, [samples[i].prompt_ids for i in chunk], [samples[i].token_ids for i in chunk]
            )
        logp_new, mask = pad_right(new)
        beh, _ = pad_right([torch.as_tensor(samples[i].logprobs, dtype=torch.float32) for i in chunk])
        loss, stats = grpo_loss(
            logp_new,
            beh.to(logp_new.device),
            torch.tensor([advs[i] for i in chunk], dtype=torch.float32, device=logp_new.device),
            mask,
            self.cfg,
            ref_logp=pad_right([ref[i] for i in chunk])[0] if ref is not None else None,
            logp_prox=pad_right([prox[i] for i in chunk])[0] if prox is not None else None,
            off_policy=torch.tensor([off[i] for i in chunk], device=logp_new.device),
            normalizer=normalizer,
        )
        loss.backward()
        return stats

    def _batch_totals(self, totals: dict[str, float]) -> dict[str, float]:
        """The statistics of the whole batch from this process's micro-batches: here they are the whole batch."""
        return totals

    def _clip_grad_norm(self, params: list[torch.Tensor], limit: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, limit))

    @torch.no_grad()
    def _no_grad_logprobs(self, model: Any, samples: list[GRPOSample], chunks: list[list[int]]) -> dict:
        out = {}
        for chunk in chunks:
            with self.computing():
                rows = sequence_logprobs(
                    model, [samples[i].prompt_ids for i in chunk], [samples[i].token_ids for i in chunk]
                )
            out.update(zip(chunk, rows, strict=True))
        return out

    # -- publishing ----------------------------------------------------------------------------------

    def save(self, version: int, state_dict: dict[str, torch.Tensor] | None = None) -> tuple[Path, str]:
        """``out_dir/policy/v{version:06d}``: safetensors weights (save_pretrained) + the base's tokenizer files.

        Written in a temporary folder (files fsynced) and renamed into place, so the folder either is complete
        or absent. If the folder already exists (a trainer resumed from before it was written): with the same
        digest it is kept; otherwise it is replaced (generators check the digest before loading anyway).
        Returns the folder and its `weights.model.weights_digest`. `state_dict`: the weights to write (None: the
        model's own; a sharded trainer passes the full weights it gathered).
        """
        policy = self.out_dir / "policy"
        policy.mkdir(parents=True, exist_ok=True)
        final = policy / f"v{version:06d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-v{version:06d}-", dir=policy))
        try:
            self.model.save_pretrained(str(tmp), state_dict=state_dict)
            for pattern in _TOKENIZER_PATTERNS:
                for src in self.model_path.glob(pattern):
                    if src.is_file() and not (tmp / src.name).exists():
                        shutil.copy2(src, tmp / src.name)
            for file in tmp.iterdir():
                with open(file, "rb") as handle:
                    os.fsync(handle.fileno())
            digest = weights_digest(tmp)
            if final.exists() and weights_digest(final) == digest:
                return final, digest
            files.replace_folder(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return final, digest

    # -- checkpoint / resume -------------------------------------------------------------------------

    def checkpoint(self, path: str | os.PathLike) -> Path:
        """One file with weights, optimizer state, version and counters, written atomically (temp + rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "format": CHECKPOINT_FORMAT,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "updates": self.updates,
            "skipped_groups": self.skipped_groups,
            "cfg": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.cfg).items()},
            "rng": torch.get_rng_state(),
        }
        with files.replacing(path) as tmp:
            torch.save(state, tmp)
            faults.point("grpo.checkpoint_written")  # a kill here leaves the temp file (GRPORun removes it)
        return path

    def resume(self, path: str | os.PathLike) -> None:
        """Restore exactly what `checkpoint` wrote: the next `step` continues bit-identically (same device).
        A folder is a sharded trainer's checkpoint (`write_sharded`): loaded onto this process, resharded."""
        if Path(path).is_dir():
            self.read_sharded(path)
            return
        state = torch.load(str(path), map_location=self.device, weights_only=True)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a GRPO checkpoint ({state.get('format')!r})")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.updates = int(state["updates"])
        self.skipped_groups = int(state["skipped_groups"])
        torch.set_rng_state(state["rng"].cpu())

    # -- the sharded checkpoint (torch.distributed.checkpoint) ---------------------------------------

    def write_sharded(self, folder: str | os.PathLike) -> None:
        """Every rank's shards of the weights and AdamW state into `folder` with torch.distributed.checkpoint
        (a collective: every rank calls it), then, from rank 0, `trainer.json` (format, version, counters).

        DCP stores each tensor by its name with the part of it every rank held (`.metadata` + one
        `__<rank>_0.distcp` file a rank, each fsynced: FileSystemWriter(sync_files=True)); `read_sharded` loads
        it onto any number of ranks, one process without torch.distributed included. `dcp.save` returns on every
        rank only after the coordinator has written `.metadata` (state_dict_saver._save_state_dict: the "write"
        step is an all_reduce whose reduce writes it, then a broadcast), so the caller may rename the folder
        into place once this returns. The RNG state is not kept: a step draws no random numbers (eval mode).
        """
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder))
        if not dist.is_initialized() or dist.get_rank() == 0:
            meta = {
                "format": SHARDED_FORMAT,
                "version": self.version,
                "updates": self.updates,
                "skipped_groups": self.skipped_groups,
                "cfg": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.cfg).items()},
                "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            }
            files.write_bytes(Path(folder) / SHARDED_META, json.dumps(meta, indent=1).encode())

    def read_sharded(self, folder: str | os.PathLike) -> None:
        """Load what `write_sharded` wrote, whatever the number of ranks that wrote it (DCP reads each rank's
        part of every tensor from the shards that hold it). A collective when torch.distributed is initialized;
        in a single process `dcp.load` reads without a process group (state_dict_loader.load: no_dist when
        torch.distributed is not initialized)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        folder = Path(folder)
        meta_file = folder / SHARDED_META
        meta = json.loads(meta_file.read_bytes()) if meta_file.is_file() else {}
        if meta.get("format") != SHARDED_FORMAT:
            raise ValueError(f"{folder} is not a sharded GRPO checkpoint ({meta.get('format')!r})")
        # get_state_dict gives tensors of this process's layout to load into (it initializes AdamW's state by a
        # step with zero gradients at lr 0 first: state_dict._init_optim_state); dcp.load fills them in place.
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=str(folder))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        self.version = int(meta["version"])
        self.updates = int(meta["updates"])
        self.skipped_groups = int(meta["skipped_groups"])
