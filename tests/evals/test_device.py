"""pass@k's engine on an accelerator (tests/fixtures/accelerator.py): the ES version rebuilt on the device is the
center a generator replays, and sampling and checking run there with the real model and the real Countdown
checker in its sandbox. The engine is called from the engine thread, as `python -m evals.passk` calls it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from evals.attempts import Timing, sample_and_verify, verifier_settings  # noqa: E402
from evals.rebuild import apply_policy, build_engine, weights_digest_of  # noqa: E402
from evals.runs import RunView  # noqa: E402
from producers.engine import in_engine_thread  # noqa: E402
from streams.schema import PolicyUpdate  # noqa: E402
from tests.evals.test_passk import es_steps  # noqa: E402
from tests.fixtures.accelerator import DEVICE, OnDevice, simulated_accelerator  # noqa: E402
from trainer.config import TrainerSettings  # noqa: E402
from trainer.data import load_theorems  # noqa: E402
from verifier_pool.pool import make_checkers  # noqa: E402
from weights.es import ESWeights  # noqa: E402
from weights.io import digest, load_master  # noqa: E402
from weights.model import resolve_model  # noqa: E402


async def test_an_es_version_rebuilt_and_sampled_on_the_device(tmp_path):
    settings = TrainerSettings(
        run="evaldev", run_dir=str(tmp_path), problems=8, held_out=2, max_new_tokens=12, sandbox="process"
    )
    steps = es_steps("evaldev", 2)
    held = load_theorems(settings)[1]
    view = RunView("es", held, [PolicyUpdate(v, "es", es_step=s) for v, s in enumerate(steps, 1)], 2, [0, 1, 2], [])
    replay = ESWeights(lambda: load_master(resolve_model(None)), lambda named: None)
    for v, step in enumerate(steps, 1):
        replay.add_step(v, step)
    expected = digest(replay.center(2))  # on the CPU: the noise of the fixture's device is the CPU's (its docstring)

    checker = make_checkers(verifier_settings(settings, None), 0)["countdown"]
    await checker.sandbox.start()
    with simulated_accelerator() as mode:
        engine = await in_engine_thread(build_engine, settings, None, DEVICE.type)
        try:
            assert isinstance(next(engine.model.parameters()), OnDevice)
            await apply_policy(engine, None, settings, view)  # an ES version reads no Redis
            # The eval's dtype is "auto", bf16 on a device: the digest is of the fp32 master it replayed.
            assert await in_engine_thread(engine.es_digest, 2) == expected
            assert len(await in_engine_thread(weights_digest_of, engine)) == 64
            results = await sample_and_verify(
                engine, [checker], held, settings, Timing(), samples=2, temperature=1.0, seed=7
            )
        finally:
            await in_engine_thread(engine.close)
            await checker.sandbox.kill()
    assert not mode.mixes and mode.ops > 1000
    assert [len(r) for r in results] == [2, 2]
    assert all(v.verdict in ("proved", "rejected") and 0 < v.tokens <= 12 for r in results for v in r)
