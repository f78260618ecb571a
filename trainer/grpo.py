"""GRPO for proofstream: group advantages, the clipped token-level objective with truncated importance weights
for off-policy samples, and a trainer that owns the model, the optimizer and the saved policy versions.

The orchestration (`trainer/run.py`) gathers groups of samples (one group = the G attempts of one theorem,
with their rewards) and calls `GRPOTrainer.step(groups)`; it then `save(version)`s the new weights and
announces the folder and its digest in the policy stream. Everything here is pure torch + transformers.

The objective (exactly what `grpo_loss` computes)
-------------------------------------------------

For a sample i with reward R_i in a group g of G samples:

- ``advantage="grpo"`` (Shao et al. 2024, DeepSeekMath): A_i = (R_i - mean_g R) / (std_g R + adv_eps), with the
  unbiased (Bessel-corrected) std, as in TRL.
- ``advantage="dr_grpo"`` (Liu et al. 2025, "Understanding R1-Zero-Like Training", Dr. GRPO): A_i = R_i - mean_g R.

A group whose rewards are all equal has A = 0 everywhere: it carries no signal and is skipped (counted), never
entering the batch or its normalizer.

Per completion token t of sample i, with log-probabilities under three policies,

- ``logp_new``  : the weights being optimized (with gradient),
- ``logp_prox`` : the "proximal" policy = the trainer's weights at the start of `step` (no gradient),
- ``logp_beh``  : the behaviour policy = what the generator sampled with (`Attempt.logprobs`: log-softmax of raw
  logits at temperature 1),

the loss is the *decoupled PPO* objective (Hilton, Cobbe & Schulman 2022, "Batch size-invariance for policy
optimization"; used for asynchronous LLM RL by AReaL, Fu et al. 2025), whose behaviour importance weight is
truncated as in TIS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"):

    r_it  = exp(logp_new_it - logp_prox_it)                                   (trust-region ratio)
    w_it  = min(exp(logp_prox_it - logp_beh_it), is_cap)   if sample i is off-policy, else 1   (no gradient)
    s_it  = min(r_it * A_i, clip(r_it, 1 - clip_low, 1 + clip_high) * A_i)   (DAPO clip-higher, Yu et al. 2025)
    k3_it = exp(ref_it - logp_new_it) - (ref_it - logp_new_it) - 1            (Schulman's k3 KL estimator)
    l_it  = -w_it * s_it + kl_coef * k3_it                                    (k3 term only when kl_coef > 0)

    loss  = sum_{i,t} l_it / Z,   Z = number of completion tokens in the whole optimizer step   ("grpo": DAPO's
                                                                                                 token-mean)
                                  Z = number of sequences in the step * max_tokens              ("dr_grpo": Dr.
                                                                                                 GRPO's constant)

A sample is off-policy when its ``policy_version`` is older than the version the trainer holds (``is_on_policy``
= True applies w to every sample, TIS's correction of the generator/trainer numerical mismatch). The clipped
ratio is taken against the proximal policy, not the behaviour policy: the trust region is centred on the
current weights whatever the sample's age, and staleness is corrected by w alone (decoupled PPO). With
``epochs=1`` (one optimizer step per batch) logp_prox equals logp_new in value, so r = 1, clipping never binds
and the gradient is the truncated-IS policy gradient sum w * A * grad logp_new / Z (plus KL); with ``epochs > 1``
the batch is reused for further optimizer steps and the clip bounds the later ones. Z is the normalizer of the
whole optimizer step, so the sum of the micro-batch losses equals the full-batch loss and gradient accumulation
is exact.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch

from streams import faults, files
from weights.model import weights_digest

ADVANTAGE_MODES = ("grpo", "dr_grpo")
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


@dataclass
class GRPOConfig:
    group_size: int = 8  # G: samples per theorem (the orchestration asks the generators for this many)
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    grad_accum: int = 1  # micro-batches per optimizer step (the batch is split into this many forward passes)
    epochs: int = 1  # optimizer steps per batch (PPO epochs, DeepSeekMath's mu); clipping binds only when > 1
    clip_low: float = 0.2  # eps_low: ratio floor 1 - clip_low
    clip_high: float = 0.28  # eps_high: ratio ceiling 1 + clip_high (DAPO clip-higher)
    is_cap: float = 2.0  # truncation C of the behaviour importance weight min(pi_prox / pi_beh, C)
    is_on_policy: bool = False  # also weight on-policy samples (TIS: corrects generator/trainer mismatch)
    advantage: str = "grpo"  # "grpo" (std-normalized, token-mean) | "dr_grpo" (no std, constant normalizer)
    adv_eps: float = 1e-4  # added to the group std in "grpo" mode
    max_tokens: int = 1024  # Dr. GRPO's constant length normalizer: the generation budget (max_new_tokens)
    kl_coef: float = 0.0  # 0: off; > 0: k3 KL to the frozen reference (the model at model_path)
    max_grad_norm: float = 1.0  # <= 0: no clipping (the norm is still reported)

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)
        if self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"advantage must be one of {ADVANTAGE_MODES}, not {self.advantage!r}")
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2: advantages are relative within a group")
        if self.grad_accum < 1 or self.epochs < 1 or self.max_tokens < 1:
            raise ValueError("grad_accum, epochs and max_tokens must be >= 1")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0 and self.is_cap > 0 and self.kl_coef >= 0):
            raise ValueError(f"bad GRPO config: {self}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GRPOConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown GRPO settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)


class GRPOSample(NamedTuple):
    """One attempt as the trainer needs it. Any object with these attributes (or a 5-tuple) is accepted."""

    prompt_ids: Sequence[int]
    token_ids: Sequence[int]  # the completion; ends with EOS when the model stopped
    logprobs: Sequence[float]  # behaviour logprob of each completion token
    reward: float
    policy_version: int


def as_sample(item: Any) -> GRPOSample:
    if isinstance(item, GRPOSample):
        return item
    if isinstance(item, tuple | list):
        return GRPOSample(*item)
    return GRPOSample(item.prompt_ids, item.token_ids, item.logprobs, item.reward, item.policy_version)


# ------------------------------------------------------------------------------------------------ the math


def group_advantages(rewards: Sequence[float] | torch.Tensor, mode: str = "grpo", eps: float = 1e-4):
    """``(advantages float32 [G], skipped)``; skipped (and zeros) when all rewards are equal (no signal).

    "grpo": (r - mean) / (std + eps) with the unbiased std; "dr_grpo": r - mean.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode must be one of {ADVANTAGE_MODES}, not {mode!r}")
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if r.numel() == 0:
        return torch.zeros(0, dtype=torch.float32), True
    if bool((r == r[0]).all()):
        return torch.zeros(r.numel(), dtype=torch.float32), True
    centred = r - r.mean()
    if mode == "grpo":
        centred = centred / (r.std(unbiased=True) + eps)
    return centred.to(torch.float32), False


def grpo_loss(
    logp_new: torch.Tensor,
    logp_behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
    ref_logp: torch.Tensor | None = None,
    logp_prox: torch.Tensor | None = None,
    off_policy: torch.Tensor | None = None,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of the module docstring over a (micro-)batch, and its statistics.

    Shapes: ``logp_*``/``ref_logp``/``mask`` [B, T] (right-padded completions; mask 1 on real tokens),
    ``advantages`` [B], ``off_policy`` [B] bool (None: no sample is off-policy). ``logp_prox`` None means the
    current weights, i.e. ``logp_new.detach()`` (exact for the first optimizer step on a batch).
    ``normalizer`` is Z of the whole optimizer step (None: computed from this batch alone); pass the step's Z
    to every micro-batch so their losses add up to the full-batch loss.

    Stats are sums over this batch's tokens (``tokens``, ``clip_low_tokens``, ``clip_high_tokens``,
    ``is_truncated_tokens``, ``is_weight_sum``, ``kl_sum``, ``ratio_sum``) and the loss parts already divided
    by Z (``pg_loss``, ``kl_loss``), so they add across micro-batches.
    """
    mask = mask.to(logp_new.dtype)
    if logp_prox is None:
        logp_prox = logp_new.detach()
    logp_prox = logp_prox.detach().to(logp_new.dtype)
    logp_behaviour = logp_behaviour.detach().to(logp_new.dtype)
    adv = advantages.detach().to(logp_new.dtype).unsqueeze(-1).expand_as(logp_new)
    if normalizer is None:
        normalizer = batch_normalizer(mask, cfg)
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0, not {normalizer}")

    ratio = torch.exp(logp_new - logp_prox)
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)

    weight = torch.ones_like(logp_new)
    truncated = torch.zeros_like(logp_new, dtype=torch.bool)
    if cfg.is_on_policy or off_policy is not None:
        raw = torch.exp(logp_prox - logp_behaviour)
        truncated = raw > cfg.is_cap
        capped = torch.clamp(raw, max=cfg.is_cap)
        if cfg.is_on_policy:
            weight = capped
        else:
            rows = off_policy.to(torch.bool).to(logp_new.device).unsqueeze(-1).expand_as(logp_new)
            weight = torch.where(rows, capped, weight)
            truncated = truncated & rows
    pg = -(weight * surrogate * mask).sum() / normalizer
    loss = pg

    kl_sum = 0.0
    kl_loss = torch.zeros((), dtype=logp_new.dtype)
    if cfg.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (the reference model's logprobs)")
        delta = ref_logp.detach().to(logp_new.dtype) - logp_new
        k3 = torch.exp(delta) - delta - 1.0
        kl_loss = cfg.kl_coef * (k3 * mask).sum() / normalizer
        loss = loss + kl_loss
        kl_sum = float((k3.detach() * mask).sum())

    real = mask > 0
    stats = {
        "tokens": float(mask.sum()),
        "clip_low_tokens": float(((adv < 0) & (ratio.detach() < 1.0 - cfg.clip_low) & real).sum()),
        "clip_high_tokens": float(((adv > 0) & (ratio.detach() > 1.0 + cfg.clip_high) & real).sum()),
        "is_truncated_tokens": float((truncated & real).sum()),
        "is_weight_sum": float((weight * mask).sum()),
        "ratio_sum": float((ratio.detach() * mask).sum()),
        "kl_sum": kl_sum,
        "pg_loss": float(pg.detach()),
        "kl_loss": float(kl_loss.detach()),
    }
    return loss, stats


def batch_normalizer(mask: torch.Tensor, cfg: GRPOConfig) -> float:
    """Z for a batch whose completion mask is ``mask`` [B, T] (see the module docstring)."""
    if cfg.advantage == "dr_grpo":
        return float(mask.shape[0] * cfg.max_tokens)
    return float(mask.sum())


def pad_right(rows: Sequence[torch.Tensor], value: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D tensors into [B, T] padded on the right with `value`, and the [B, T] bool mask of real entries."""
    width = max((len(r) for r in rows), default=0)
    dtype = rows[0].dtype if rows else torch.float32
    device = rows[0].device if rows else None
    out = torch.full((len(rows), width), value, dtype=dtype, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
        mask[i, : len(row)] = True
    return out, mask


def sequence_logprobs(
    model: Any, prompt_ids_list: Sequence[Sequence[int]], completion_ids_list: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """Per-token logprobs (log-softmax of raw logits, fp32) of each completion given its prompt under `model`.

    One right-padded forward pass over all rows (pad positions come after the real ones, so causal attention
    never sees them and positions are the unpadded ones). Gradients flow when called with grad enabled.
    """
    if len(prompt_ids_list) != len(completion_ids_list):
        raise ValueError("one completion per prompt")
    if not prompt_ids_list:
        return []
    device = next(model.parameters()).device
    lengths = []
    for p, c in zip(prompt_ids_list, completion_ids_list, strict=True):
        if len(p) < 1:
            raise ValueError("every prompt needs at least one token (the first completion token is predicted)")
        lengths.append((len(p), len(c)))
    width = max(p + c for p, c in lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    attention = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids_list, completion_ids_list, strict=True)):
        row = torch.as_tensor(list(p) + list(c), dtype=torch.long)
        ids[i, : len(row)] = row
        attention[i, : len(row)] = 1
    first = min(p for p, _ in lengths) - 1  # the earliest logit any completion needs
    keep = width - first
    out = model(input_ids=ids.to(device), attention_mask=attention.to(device), use_cache=False, logits_to_keep=keep)
    logits = out.logits  # [B, keep, V]: positions first .. width-1
    result = []
    for i, (p, c) in enumerate(lengths):
        if c == 0:
            result.append(torch.zeros(0, dtype=torch.float32, device=device))
            continue
        rows = logits[i, p - 1 - first : p - 1 - first + c].float()
        target = ids[i, p : p + c].to(device)
        result.append(torch.log_softmax(rows, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1))
    return result


# ------------------------------------------------------------------------------------------------ trainer


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
        from transformers import AutoModelForCausalLM

        self.model_path = Path(model_path)
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype).to(self.device)
        self.model.eval()  # no dropout: the forward with gradient matches the no-grad proximal/behaviour ones
        self.model.config.use_cache = False
        self.ref_model = None
        if cfg.kl_coef > 0:
            self.ref_model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype).to(self.device)
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
        chunks = [c.tolist() for c in torch.tensor(order).tensor_split(min(cfg.grad_accum, len(order)))]
        chunks = [c for c in chunks if c]

        prox = self._no_grad_logprobs(self.model, samples, chunks) if cfg.epochs > 1 else None
        ref = self._no_grad_logprobs(self.ref_model, samples, chunks) if self.ref_model is not None else None

        totals: dict[str, float] = {}
        grad_norms = []
        for _ in range(cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            epoch_totals: dict[str, float] = {}
            for chunk in chunks:
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
                    cfg,
                    ref_logp=pad_right([ref[i] for i in chunk])[0] if ref is not None else None,
                    logp_prox=pad_right([prox[i] for i in chunk])[0] if prox is not None else None,
                    off_policy=torch.tensor([off[i] for i in chunk], device=logp_new.device),
                    normalizer=normalizer,
                )
                loss.backward()
                for k, v in stats.items():
                    epoch_totals[k] = epoch_totals.get(k, 0.0) + v
            params = [p for p in self.model.parameters() if p.grad is not None]
            limit = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, limit)))
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

    @torch.no_grad()
    def _no_grad_logprobs(self, model: Any, samples: list[GRPOSample], chunks: list[list[int]]) -> dict:
        out = {}
        for chunk in chunks:
            rows = sequence_logprobs(
                model, [samples[i].prompt_ids for i in chunk], [samples[i].token_ids for i in chunk]
            )
            out.update(zip(chunk, rows, strict=True))
        return out

    # -- publishing ----------------------------------------------------------------------------------

    def save(self, version: int) -> tuple[Path, str]:
        """``out_dir/policy/v{version:06d}``: safetensors weights (save_pretrained) + the base's tokenizer files.

        Written in a temporary folder (files fsynced) and renamed into place, so the folder either is complete
        or absent. If the folder already exists (a trainer resumed from before it was written): with the same
        digest it is kept; otherwise it is replaced (generators check the digest before loading anyway).
        Returns the folder and its `weights.model.weights_digest`.
        """
        policy = self.out_dir / "policy"
        policy.mkdir(parents=True, exist_ok=True)
        final = policy / f"v{version:06d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-v{version:06d}-", dir=policy))
        try:
            self.model.save_pretrained(str(tmp))
            for pattern in _TOKENIZER_PATTERNS:
                for src in self.model_path.glob(pattern):
                    if src.is_file() and not (tmp / src.name).exists():
                        shutil.copy2(src, tmp / src.name)
            for file in tmp.iterdir():
                with open(file, "rb") as handle:
                    os.fsync(handle.fileno())
            digest = weights_digest(tmp)
            if final.exists():
                if weights_digest(final) == digest:
                    return final, digest
                old = policy / f".old-v{version:06d}-{os.getpid()}-{time.monotonic_ns()}"
                os.rename(final, old)
                os.rename(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, final)
            files.fsync_dir(policy)
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
        """Restore exactly what `checkpoint` wrote: the next `step` continues bit-identically (same device)."""
        state = torch.load(str(path), map_location=self.device, weights_only=True)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a GRPO checkpoint ({state.get('format')!r})")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.updates = int(state["updates"])
        self.skipped_groups = int(state["skipped_groups"])
        torch.set_rng_state(state["rng"].cpu())
