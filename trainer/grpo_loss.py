"""GRPO's objective: its config, group advantages, the clipped token-level loss with truncated importance
weights for off-policy samples, and the per-token logprobs it is computed from. Pure functions of tensors
that tests call without a model (tests/trainer/test_grpo.py checks `grpo_loss` against a token-by-token
loop); `GRPOTrainer` (trainer/grpo_trainer.py) runs them over a batch, and `GRPORun` (trainer/grpo.py) feeds
it groups (one group = the G attempts of one theorem, with their rewards).

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

ADVANTAGE_MODES = ("grpo", "dr_grpo")
# fp32: every forward and backward in float32. bf16-mixed: the forwards and backwards of the step under
# torch.autocast to bfloat16 (matrix products in bf16), weights, gradients, AdamW and the log-softmax in fp32.
PRECISIONS = ("fp32", "bf16-mixed")


@dataclass
class GRPOConfig:
    group_size: int = 8  # G: samples per theorem (the orchestration asks the generators for this many)
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    grad_accum: int = 1  # micro-batches per optimizer step (the batch is split into this many forward passes)
    epochs: int = 1  # optimizer steps per batch (PPO epochs, DeepSeekMath's mu; --grpo-epochs); clips only when > 1
    clip_low: float = 0.2  # eps_low: ratio floor 1 - clip_low
    clip_high: float = 0.28  # eps_high: ratio ceiling 1 + clip_high (DAPO clip-higher)
    is_cap: float = 2.0  # truncation C of the behaviour importance weight min(pi_prox / pi_beh, C)
    is_on_policy: bool = False  # also weight on-policy samples (TIS: corrects generator/trainer mismatch)
    advantage: str = "grpo"  # "grpo" (std-normalized, token-mean) | "dr_grpo" (no std, constant normalizer)
    adv_eps: float = 1e-4  # added to the group std in "grpo" mode
    max_tokens: int = 1024  # Dr. GRPO's constant length normalizer: the generation budget (max_new_tokens)
    kl_coef: float = 0.0  # 0: off; > 0: k3 KL to the frozen reference (the model at model_path)
    max_grad_norm: float = 1.0  # <= 0: no clipping (the norm is still reported)
    precision: str = "fp32"  # PRECISIONS: how the step computes (the weights and optimizer stay fp32 either way)

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)
        if self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"advantage must be one of {ADVANTAGE_MODES}, not {self.advantage!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {self.precision!r}")
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2: advantages are relative within a group")
        if self.grad_accum < 1 or self.epochs < 1 or self.max_tokens < 1:
            raise ValueError("grad_accum, epochs and max_tokens must be >= 1")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0 and self.is_cap > 0 and self.kl_coef >= 0):
            raise ValueError(f"bad GRPO config: {self}")


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
