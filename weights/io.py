"""Weights on disk and their identity, for every role that reads or writes them (the ES engines, the GRPO
trainer, the evaluations): safetensors in, fp32 out, by checkpoint tensor names.

- `load_master(source)`: the fp32 copy of a safetensors model folder (all shards) or one file.
- `save_weights(weights, path, metadata)`: one safetensors file, written whole or not at all (streams.files).
- `snapshot_metadata(path)`: the string metadata a file was written with.
- `digest(weights)`: the identity of tensors in memory; equal digests, equal bits (a folder's bytes have
  weights.model.weights_digest).

safetensors is imported when a file is read or written.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from streams import files

Weights = dict[str, torch.Tensor]


def digest(weights: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over names, shapes, dtypes and raw bytes, in name order: equal digests, equal bits."""
    h = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().contiguous().cpu()
        h.update(f"{name}\x00{tuple(t.shape)}\x00{t.dtype}\x00".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def load_master(source: str | os.PathLike, device: str = "cpu") -> Weights:
    """The fp32 master copy of a safetensors model folder (all shards) or one file, by checkpoint names."""
    from safetensors.torch import load_file

    source = Path(source)
    paths = [source] if source.is_file() else sorted(source.glob("*.safetensors"))
    if not paths:
        raise FileNotFoundError(f"{source} holds no .safetensors file")
    master: Weights = {}
    for path in paths:
        for name, tensor in load_file(str(path), device=device).items():
            master[name] = tensor.to(torch.float32).contiguous()
    return master


def snapshot_metadata(path: Path) -> dict[str, str]:
    """The string metadata the safetensors file `path` was written with (empty if none)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})


def save_weights(weights: Mapping[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically (streams.files): a reader sees the old file or the new one."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    with files.replacing(path) as tmp:
        save_file({k: v.contiguous() for k, v in weights.items()}, tmp, metadata=metadata)
