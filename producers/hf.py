"""The `hf` engine: transformers `generate`, batched, on CPU (the default) or one GPU.

Prompts of a call are left-padded into one batch (`padding_side="left"`: decoder-only models continue
from the last real token). Behaviour logprobs are recorded while sampling by a logits processor that
sees the raw logits of each step and is paid one log-softmax per step, not a second forward pass.
ES weights are written straight into the model's parameters (`copy_` casts the fp32 values into the
model's dtype); GRPO weights are loaded from a safetensors folder by checkpoint name.

One call generates every row of an order (its problems x n samples), so a GPU gets the whole batch at once.
Low-rank ES members (weights/es.py `noise="lowrank"`) go through `es_members`: the center stays in the
weights and every member's rows are generated in that one call, each linear layer adding to its output the
row's own low-rank term (x B_i) A_i^T through a forward hook, two batched matmuls per layer over the
members (`_LowRankRows`). Not PEFT's mixed-adapter batch: PEFT runs one sub-batch per adapter through each
layer (a Python loop over the population at every layer and step), where the members' factors stacked in
one tensor need two `bmm` calls whatever the population; no weight is written per member either way.
`kv_cache="static"` preallocates the KV cache to the call's full length (transformers' StaticCache), which
lets transformers compile the decoding step with torch.compile on a GPU (its auto-compile criteria: a
compilable cache on cuda): the overhead that dominates short sequences of a small model. Whether it pays
depends on the GPU and the shapes (each new batch shape compiles again): `python -m ops bench generator
--device cuda --kv-cache static` measures it, and `make gpu-check` records both.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from producers.engine import EngineStats, Sample, Sampling, checked_dtype
from streams import faults
from weights.es import ESWeights, member_factors
from weights.io import digest, load_master


class _RawLogprobs(transformers.LogitsProcessor):
    """Records log-softmax(raw logits) of each step; the token sampled at step t is read at step t+1.

    Placed first in the processor list, it sees the model's logits before temperature and top-p.
    """

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []  # per step: logprob of the token sampled there, (batch,)
        self._pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self.steps.append(self._pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(batch, steps) logprobs, given the tokens sampled at the final step."""
        if self._pending is not None:
            self.steps.append(self._pending.gather(1, last_tokens[:, None]).squeeze(1))
            self._pending = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros((last_tokens.shape[0], 0))


class _LowRankRows:
    """Forward hooks that add member i's low-rank term to the output of each perturbed linear layer for its
    rows: the batch is member-major (rows [i*k, (i+1)*k) are member i's), so one layer's input (M*k, t, in)
    is viewed as (M, k*t, in) and the term is bmm(bmm(x, B), A^T) with A, B stacked over the members."""

    def __init__(self, model: torch.nn.Module, stacked: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.handles = []
        for name, (a, b) in stacked.items():
            module = model.get_submodule(name.removesuffix(".weight"))
            self.handles.append(module.register_forward_hook(self._hook(a, b)))

    @staticmethod
    def _hook(a: torch.Tensor, b: torch.Tensor):  # a: (M, out, r), b: (M, in, r)
        members, a_t = a.shape[0], a.transpose(1, 2).contiguous()

        def add_term(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            x = inputs[0]
            low = torch.bmm(x.reshape(members, -1, x.shape[-1]), b)  # (M, k*t, r): member-major rows
            output.view(members, -1, output.shape[-1]).baddbmm_(low, a_t)  # += (x B) A^T, in place

        return add_term

    def __enter__(self) -> _LowRankRows:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()


class HFEngine:
    name = "hf"

    def __init__(
        self,
        model_path: Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        snapshot_dir: str | os.PathLike | None = None,
        snapshot_every: int = 0,
        keep: int = 2,
        threads: int = 0,
        kv_cache: str = "dynamic",
    ) -> None:
        if kv_cache not in ("dynamic", "static"):
            raise ValueError(f"kv_cache {kv_cache!r}: use dynamic or static")
        self.kv_cache = kv_cache
        dtype = checked_dtype(("float32" if device == "cpu" else "bfloat16") if dtype == "auto" else dtype)
        if threads:
            torch.set_num_threads(threads)
        self.model_path = Path(model_path)
        self.device = device
        self.dtype = getattr(torch, dtype)
        started = time.monotonic()
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(model_path), dtype=self.dtype)
        self.model.to(device).eval()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_path))
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.stats = EngineStats(
            extra={
                "engine": self.name,
                "device": device,
                "dtype": dtype,
                "kv_cache": kv_cache,
                "load_s": round(time.monotonic() - started, 2),
            }
        )
        self.es = ESWeights(
            lambda: load_master(self.model_path, device),
            self._write,
            snapshot_dir=snapshot_dir,
            snapshot_every=snapshot_every,
            keep=keep,
            device=device,
        )
        self._params: dict[str, torch.Tensor] | None = None

    # -- weights ---------------------------------------------------------------------------------------

    def _parameters(self) -> dict[str, torch.Tensor]:
        """Checkpoint name -> live tensor (tied weights appear under the name the checkpoint uses)."""
        if self._params is None:
            self._params = dict(self.model.state_dict(keep_vars=True))
        return self._params

    @torch.no_grad()
    def _write(self, named: Any) -> None:
        params = self._parameters()
        for name, value in named:
            target = params.get(name)
            if target is None:
                raise KeyError(f"weight {name!r} is not a parameter of the loaded model")
            target.data.copy_(value)

    def es_add_step(self, version: int, step: dict[str, Any]) -> None:
        self.es.add_step(version, step)

    def es_forget_after(self, version: int) -> None:
        self.es.forget_after(version)

    def es_use(self, version: int, seed: int | None, sign: int = 1, sigma: float = 0.0, rank: int = 0) -> None:
        started = time.monotonic()
        if self.es.use(version, seed, sign, sigma, rank):
            self.stats.policy_switches += 1
            self.stats.policy_s += time.monotonic() - started

    def es_members(
        self,
        version: int,
        members: list[tuple[int, int]],
        sigma: float,
        rank: int,
        prompts: list[list[int]],
        sampling: Sampling,
    ) -> list[list[list[Sample]]]:
        """Low-rank members (seed, sign) of center `version` on the same prompts, in one generate call:
        [member][prompt][sample]. The weights hold the center throughout."""
        if not members or not prompts:
            return [[] for _ in members]
        started = time.monotonic()
        self.es_use(version, None)
        master = self.es.center(version)
        per_member = [member_factors(master, seed, sign, sigma, rank) for seed, sign in members]
        stacked = {
            name: tuple(torch.stack([f[name][i] for f in per_member]).to(self.device, self.dtype) for i in (0, 1))
            for name in per_member[0]
        }
        self.stats.policy_s += time.monotonic() - started
        with _LowRankRows(self.model, stacked):
            rows = self.generate([p for _ in members for p in prompts], sampling)
        return [rows[i * len(prompts) : (i + 1) * len(prompts)] for i in range(len(members))]

    def es_digest(self, version: int) -> str:
        return digest(self.es.center(version))

    def load_weights(self, folder: Path) -> None:
        started = time.monotonic()
        self._write(load_master(folder, self.device).items())
        self.es.current = None
        self.stats.policy_switches += 1
        self.stats.policy_s += time.monotonic() - started

    # -- sampling --------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Sample]]:
        if not prompts:
            return []
        faults.point("engine.generate")  # an engine that fails every call (tests/trainer/test_no_progress.py)
        started = time.monotonic()
        pad = self.tokenizer.pad_token_id
        batch = [p for p in prompts for _ in range(sampling.n)]  # n rows per prompt (greedy allows no n > 1)
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        recorder = _RawLogprobs() if sampling.logprobs else None
        greedy = sampling.temperature == 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "do_sample": not greedy,
            "pad_token_id": pad,
            "logits_processor": transformers.LogitsProcessorList([recorder] if recorder else []),
        }
        if not greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        if self.kv_cache == "static":
            kwargs["cache_implementation"] = "static"
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs)
        # The recorder's logprobs live on the model's device: finish them there, then bring both to the host.
        logprobs = recorder.finish(out[:, -1]).cpu() if recorder else None
        completions = out[:, width:].cpu()
        eos = set(self._eos_ids())
        samples: list[list[Sample]] = [[] for _ in prompts]
        tokens = 0
        for row in range(completions.shape[0]):
            seq = completions[row].tolist()
            end = next((k + 1 for k, t in enumerate(seq) if t in eos), None)
            finish = "stop" if end is not None else "length"
            seq = seq[: end if end is not None else len(seq)]
            tokens += len(seq)
            lp = logprobs[row, : len(seq)].tolist() if logprobs is not None else None
            text = self.tokenizer.decode(seq, skip_special_tokens=True)
            samples[row // sampling.n].append(Sample(seq, text, lp, finish))
        self.stats.generated_tokens += tokens
        self.stats.prompts += len(prompts)
        self.stats.generate_s += time.monotonic() - started
        return samples

    def _eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return list(eos) if isinstance(eos, list | tuple) else [eos]

    def close(self) -> None:
        self._params = None
