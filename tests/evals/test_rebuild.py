"""evals/rebuild.py: where a version is rebuilt. The weights themselves (ES replay, GRPO by digest) are
checked through the CLI in test_passk.py."""

from __future__ import annotations

import os

import pytest

from evals.rebuild import engine_device
from evals.runs import EvalError, RunView
from streams.keys import Keys
from trainer.config import TrainerSettings


@pytest.fixture(autouse=True)
def _no_proofstream_env(monkeypatch):
    for name in [n for n in os.environ if n.startswith("PROOFSTREAM_")]:
        monkeypatch.delenv(name)


async def test_es_centers_are_rebuilt_on_the_device_type_their_noise_was_drawn_on(one_redis):
    """CUDA and CPU draw different ES noise from one seed: a version is replayed where the run's generators
    drew theirs (`es_noise`), or refused with the reason; GRPO and version 0 draw no noise."""
    settings = TrainerSettings(run="noise")
    view = RunView("es", [], [], 3, [0, 1, 2, 3], [])
    assert await engine_device(one_redis, settings, view, "cpu") == "cpu"  # no generator said: as asked
    await one_redis.set(Keys("noise").es_noise, "cpu")
    assert await engine_device(one_redis, settings, view, "auto") == "cpu"
    with pytest.raises(EvalError, match="replay only there"):
        await engine_device(one_redis, settings, view, "cuda")
    await one_redis.set(Keys("noise").es_noise, "cuda")
    if not __import__("torch").cuda.is_available():
        with pytest.raises(EvalError, match="no GPU"):
            await engine_device(one_redis, settings, view, "auto")
    base = RunView("es", [], [], 0, [0], [])
    grpo = RunView("grpo", [], [], 3, [0, 3], [3])
    assert await engine_device(one_redis, settings, base, "cpu") == "cpu"
    assert await engine_device(one_redis, settings, grpo, "cpu") == "cpu"
