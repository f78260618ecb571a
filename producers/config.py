"""The generator's settings (TOML table `[generator]`, env `PROOFSTREAM_<FIELD>`, `python -m producers --flag`)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field

from tasks.prompts import PromptSettings
from weights.model import default_cache_dir
from weights.settings import ModelSettings


class GeneratorSettings(PromptSettings, ModelSettings):
    """The trainer declares the same `engine` and `model` (weights.settings) and `prompt_format` (tasks.prompts):
    it trains that model and starts generators of its own in its local pipeline."""

    section = "generator"

    model_cache: str = Field(
        "", description="where converted models live", json_schema_extra={"default_text": "~/.cache/proofstream/models"}
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="the engine's weights precision; auto: the engine's choice for the device"
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available, else cpu")
    threads: int = Field(0, ge=0, description="CPU threads for the engine; 0: the library's default")
    kv_cache: Literal["dynamic", "static"] = Field(
        "dynamic",
        description="hf engine: static preallocates the KV cache, which lets transformers compile the "
        "decoding step on a GPU (python -m ops bench generator --kv-cache static measures it)",
    )
    lora_rank: int = Field(
        0,
        ge=0,
        le=512,
        description="vllm engine: serve low-rank ES members up to this rank as LoRA adapters, all "
        "members in one batch (0: each member is written into the weights in turn; docs/GENERATOR.md measures both)",
    )
    max_loras: int = Field(8, ge=1, description="vllm engine, lora_rank > 0: adapters (members) in one batch")

    name: str = Field(
        "", description="consumer name in the group", json_schema_extra={"default_text": "gen-<host>-<pid>"}
    )
    max_outstanding: int = Field(4096, ge=1, description="attempts the verifiers may owe before we hold back")
    # A live generator refreshes its claim on the order in hand every fifth of this (streams.runtime), so a
    # dead or stalled generator's order moves on after it, however long generating an order may take.
    claim_idle_ms: int = Field(25_000, ge=1000, description="a dead or stalled generator's order moves on after this")
    max_deliveries: int = Field(3, ge=1, description="a work order delivered this often is dead-lettered")
    policy_wait_s: float = Field(10.0, ge=0, description="wait this long for a policy version an order names")
    report_every_s: float = Field(10.0, gt=0, description="how often the generator's figures go to Redis")

    snapshot_dir: str = Field(
        "",
        description="ES master snapshots, shared by generators",
        json_schema_extra={"default_text": "<model cache>/../runs/<run>/es-snapshots"},
    )
    snapshot_every: int = Field(10, ge=0, description="snapshot the ES center every K versions (0: never)")
    keep_versions: int = Field(2, ge=1, description="ES centers kept in memory")

    @property
    def consumer_name(self) -> str:
        return self.name or f"gen-{socket.gethostname()}-{os.getpid()}"

    def snapshots(self) -> Path:
        if self.snapshot_dir:
            return Path(self.snapshot_dir).expanduser()
        return default_cache_dir().parent / "runs" / self.run / "es-snapshots"
