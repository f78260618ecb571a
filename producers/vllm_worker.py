"""The vLLM worker extension: ES weights and GRPO weight loads inside vLLM's worker process.

`LLM(..., worker_extension_cls="producers.vllm_worker.ESWorkerExtension")` mixes this class into vLLM's
worker, so its methods run where the model lives and are called from the engine with
`llm.collective_rpc("es_use", args=(...))`. RPC arguments and results cross a process boundary as plain
data (a tensor argument arrives as nested lists): only small dicts, numbers and paths go through here.

The worker owns one `weights.es.ESWeights` (the fp32 master copies). Its `write` callback hands the
(checkpoint name, fp32 tensor) pairs to vLLM's `reload_weights(weights_iterator=...)`, which runs the
model's own `load_weights` (checkpoint names -> fused qkv/gate_up parameters, tensor-parallel shards,
dtype cast) and then the device's post-load processing. That matters on CPU: vLLM repacks every linear
weight into its CPU kernels' layout and leaves `layer.weight` empty, so copying into `named_parameters()`
silently leaves every linear layer as it was (docs/brief/VLLM_CPU.md). And `reload_weights` alone is not
enough on CPU either: it repacks only the modules that received weights, so a tied `lm_head` (SmolLM2)
keeps a packed copy of the first weights; `_repack_stale_cpu_kernels` rebuilds such kernels after every
write. Every write is checked: each parameter of the model must have been loaded, each checkpoint tensor
handed over, and no CPU kernel left holding the previous weights, else it raises.

On CUDA the same path is used. In-place copies into `named_parameters()` would be cheaper there (no
post-load processing), but they need the checkpoint -> fused-name map and were not testable on this
machine; `reload_weights` is correct on every device type vLLM supports.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from streams import logs
from weights.es import ESWeights, member_factors
from weights.io import digest, load_master, save_weights

# The logger of vLLM's "Attempted to load weight %s with dtype %s into parameter with dtype %s" (its
# model_executor/models/utils.py): said once, then counted (streams.logs.SaidOnce).
VLLM_DTYPE_WARNING = "vllm.model_executor.models.utils"


def _iter_safetensors(folder: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, fp32 tensor) of every tensor in a safetensors folder (or file), one tensor in memory at a time."""
    from safetensors import safe_open

    source = Path(folder)
    files = [source] if source.is_file() else sorted(source.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{source} holds no .safetensors file")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, handle.get_tensor(name).to(torch.float32)


class ESWorkerExtension:
    """Methods mixed into vLLM's worker (`self` is the worker: `self.model_runner`, `self.device`, ...)."""

    # -- setup -----------------------------------------------------------------------------------------

    def es_setup(
        self,
        model_path: str,
        snapshot_dir: str | None = None,
        snapshot_every: int = 0,
        keep: int = 2,
    ) -> dict[str, Any]:
        """Create the worker's ESWeights (base: the model folder's checkpoint, read in fp32 on first use)."""
        device = "cuda" if torch.device(self.device).type == "cuda" else "cpu"
        # Our writes hand fp32 masters to a bf16 (or fp16) model on purpose; vLLM warns per tensor per write.
        self._es_said_once = logs.say_once(VLLM_DTYPE_WARNING)
        self._es_model_path = model_path
        self._es_counters = {"writes": 0, "write_s": 0.0, "tensors_written": 0, "last_write": {}}
        self._es = ESWeights(
            lambda: load_master(model_path, device),
            self._es_write,
            snapshot_dir=snapshot_dir,
            snapshot_every=snapshot_every,
            keep=keep,
            device=device,
        )
        return {"device": device, "pid": os.getpid()}

    # -- the write path --------------------------------------------------------------------------------

    def _es_write(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (checkpoint name, fp32 tensor) pairs into the running model; raise unless all were taken."""
        started = time.monotonic()
        model = self.model_runner.get_model()
        # with LoRA enabled vLLM wraps each linear layer, its own weight under `.base_layer.`; loading reports
        # the unwrapped name (vllm/model_executor/model_loader/reload/inplace.py compares the same way)
        expected = {name.replace(".base_layer.", ".") for name, _ in model.named_parameters()}
        handed: list[str] = []
        loaded: set[str] = set()

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in named:
                handed.append(name)
                yield name, tensor

        # reload_weights discards the set of parameters that model.load_weights reports as loaded; record it
        # through an instance attribute that shadows the method for the length of this call.
        original = model.load_weights

        def recording(weights: Iterable[tuple[str, torch.Tensor]]) -> Any:
            out = original(weights)
            loaded.update(out or ())
            return out

        _mark_cpu_kernels(model)
        model.load_weights = recording
        try:
            self.reload_weights(weights_iterator=counted())
        finally:
            del model.load_weights
        missing = sorted(expected - loaded)
        if missing:
            raise RuntimeError(
                f"weight write left {len(missing)} of {len(expected)} parameters unloaded "
                f"(first: {missing[:5]}); the checkpoint names do not match the model"
            )
        repacked = _repack_stale_cpu_kernels(model)
        seconds = time.monotonic() - started
        counters = self._es_counters
        counters["writes"] += 1
        counters["write_s"] += seconds
        counters["tensors_written"] += len(handed)
        counters["last_write"] = {
            "tensors": len(handed),
            "distinct": len(set(handed)),
            "parameters_loaded": len(loaded),
            "parameters": len(expected),
            "repacked": repacked,
            "seconds": round(seconds, 3),
        }

    # -- RPC methods -----------------------------------------------------------------------------------

    def es_add_step(self, version: int, step: dict[str, Any]) -> None:
        self._es.add_step(int(version), step)

    def es_forget_after(self, version: int) -> None:
        self._es.forget_after(int(version))

    def es_use(
        self, version: int, seed: int | None, sign: int = 1, sigma: float = 0.0, rank: int = 0
    ) -> dict[str, Any]:
        """Make the weights center(version) [+ sigma*sign*eps(seed)], eps full-rank or (`rank` > 0) low-rank; says
        whether they changed and how long it took."""
        started = time.monotonic()
        seed = None if seed is None else int(seed)
        switched = self._es.use(int(version), seed, int(sign), float(sigma), int(rank))
        return {"switched": switched, "seconds": time.monotonic() - started}

    def es_digest(self, version: int) -> str:
        return digest(self._es.center(int(version)))

    def es_member_adapters(
        self, version: int, members: list[list[int]], sigma: float, rank: int, folder: str
    ) -> list[str]:
        """Write each low-rank member (seed, sign) of center `version` as a PEFT LoRA adapter folder under
        `folder` (`write_adapter`); returns their paths, in member order. The weights are not touched."""
        master = self._es.center(int(version))
        paths = []
        for index, (seed, sign) in enumerate(members):
            path = Path(folder) / f"member-{index}"
            write_adapter(path, member_factors(master, int(seed), int(sign), float(sigma), int(rank)), int(rank))
            paths.append(str(path))
        return paths

    def es_load_weights(self, folder: str) -> dict[str, Any]:
        """GRPO: load the safetensors weights in `folder` (checked like every write); the ES state is forgotten."""
        started = time.monotonic()
        self._es.current = None  # whatever happens next, the weights are no ES policy we can name
        self._es_write(_iter_safetensors(folder))
        return {"seconds": time.monotonic() - started}

    def es_stats(self) -> dict[str, Any]:
        """What this worker holds and has written (`current` weights, writes, the last write's counts, memory):
        the one view into vLLM's worker process from outside it; the engine tests read it over the RPC."""
        es = getattr(self, "_es", None)
        if es is None:
            return {}
        return {
            **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in self._es_counters.items()},
            "current": list(es.current) if es.current else None,
            "latest": es.latest,
            "masters": sorted(es.masters),
            "replayed": es.replayed,
            "snapshots_loaded": es.snapshots_loaded,
            "rss_gib": round(_rss_bytes() / 2**30, 2),
            "warnings_said_once": {k: n for k, n in self._es_said_once.seen.items() if n > 1},
        }


def write_adapter(folder: Path, factors: dict[str, tuple[torch.Tensor, torch.Tensor]], rank: int) -> None:
    """One member as a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors), as vLLM loads it.

    `factors` is `weights.es.member_factors`: checkpoint name -> (A', B) with the member's change of that
    weight equal to A' B^T. PEFT adds scaling * lora_B @ lora_A to W with scaling = lora_alpha / r, so
    lora_A = B^T (r x in), lora_B = A' (out x r) and lora_alpha = r (scaling exactly 1: vLLM multiplies
    lora_B by the scaling only when it is not 1, vllm/lora/lora_weights.py `optimize`). A rank below the
    engine's `max_lora_rank` needs no padding: vLLM zeroes each slot before copying an adapter into its
    first r rows and columns (vllm/lora/layers/base_linear.py `set_lora`).
    """
    tensors = {}
    modules = set()
    for name, (a, b) in factors.items():
        module = name.removesuffix(".weight")
        modules.add(module.rsplit(".", 1)[-1])
        tensors[f"base_model.model.{module}.lora_A.weight"] = b.T.contiguous().cpu()
        tensors[f"base_model.model.{module}.lora_B.weight"] = a.contiguous().cpu()
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": rank,
        "target_modules": sorted(modules),
        "bias": "none",
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))
    save_weights(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})


_STALE = "_proofstream_stale"


def _mark_cpu_kernels(model: torch.nn.Module) -> None:
    """Tag every module's CPU matmul kernel (`cpu_linear`, a closure over a packed copy of the weight)."""
    for module in model.modules():
        kernel = getattr(module, "cpu_linear", None)
        if kernel is not None:
            # a builtin (F.linear on the plain weight) takes no attribute: nothing packed, nothing stale
            with contextlib.suppress(AttributeError, TypeError):
                setattr(kernel, _STALE, True)


def _repack_stale_cpu_kernels(model: torch.nn.Module) -> list[str]:
    """Rebuild the CPU kernels that the reload did not rebuild; raise where that is impossible.

    vLLM's layerwise reload re-runs post-load processing (which repacks the weight for the CPU kernels)
    only for modules that received weights. A tied output layer (`lm_head` sharing `embed_tokens`'
    weight, as in SmolLM2) receives none: its shared weight tensor changes, but its packed copy keeps the
    weights of the first load, so the logits are computed with the old output matrix, silently. Such a
    module still holds its full weight, so its kernel is rebuilt from it here. A module whose packed copy
    is stale and whose weight was emptied by the packing cannot be rebuilt: that is an error.
    """
    repacked, broken = [], []
    for name, module in model.named_modules():
        kernel = getattr(module, "cpu_linear", None)
        if kernel is None or not getattr(kernel, _STALE, False):
            continue
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if weight is None or weight.numel() == 0 or method is None:
            broken.append(name)
            continue
        method.process_weights_after_loading(module)
        if getattr(module.cpu_linear, _STALE, False):
            broken.append(name)
        else:
            repacked.append(name)
    if broken:
        raise RuntimeError(f"CPU kernels of {broken[:5]} still hold the previous weights after the reload")
    return repacked


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
