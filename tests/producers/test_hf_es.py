"""ES weights inside the transformers engine, on the real default model (134.5M parameters): perturb,
restore, the bf16 cast of the fp32 result, export of a version. The pure parts are tests/weights/test_es.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="ES weights need torch (make test installs torch==2.13.0)")

from tests.producers.conftest import needs_model  # noqa: E402
from weights.es import noise  # noqa: E402
from weights.io import load_master  # noqa: E402

# -- the real default model --------------------------------------------------------------------------------


@needs_model
def test_perturb_changes_every_weight_of_the_model_and_restore_is_bit_exact(hf_engine):
    params = {k: v.detach().clone() for k, v in hf_engine.model.state_dict().items()}
    hf_engine.es_use(0, seed=1234, sign=1, sigma=0.001)
    perturbed = hf_engine.model.state_dict()
    unchanged = [k for k in params if torch.equal(perturbed[k], params[k])]
    assert unchanged == [], f"perturbation left {unchanged[:3]} untouched"
    name = "model.layers.3.mlp.down_proj.weight"
    expected = params[name] + 0.001 * noise(1234, name, params[name].shape)
    assert torch.equal(perturbed[name], expected)  # fp32 engine: exactly master + sigma*eps
    hf_engine.es_use(0, None)
    restored = hf_engine.model.state_dict()
    assert all(torch.equal(restored[k], params[k]) for k in params)


@needs_model
def test_bf16_engine_gets_the_cast_of_the_fp32_result_and_restores_exactly(model_path):
    from producers.hf import HFEngine

    engine = HFEngine(model_path, dtype="bfloat16")
    try:
        master = load_master(model_path)
        base = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
        name = "model.layers.0.self_attn.q_proj.weight"
        for seed in (1, 2, 3):  # three members in a row, never restoring in between
            engine.es_use(0, seed=seed, sign=-1, sigma=0.01)
        want = (master[name] - 0.01 * noise(3, name, master[name].shape)).to(torch.bfloat16)
        assert torch.equal(engine.model.state_dict()[name], want)
        engine.es_use(0, None)
        assert all(torch.equal(engine.model.state_dict()[k], base[k]) for k in base)
    finally:
        engine.close()
