"""Low-rank ES noise (EGGROLL): what a member and a step are, computed here from the definition in float64;
full-rank steps as they were before `noise` existed; replay bit for bit whatever the thread count.

The engines' batched members against these weights are tests/producers/test_hf_lowrank.py.
"""

from __future__ import annotations

import hashlib

import pytest

torch = pytest.importorskip("torch", reason="ES weights need torch (make test installs torch==2.13.0)")

from weights.es import (  # noqa: E402
    ESWeights,
    apply_step,
    factors,
    lowrank_noise,
    lowrank_target,
    member_factors,
    noise,
    perturbed,
)
from weights.io import digest  # noqa: E402
from weights.step import ESStep, history_digest  # noqa: E402

RANK = 3


def base() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(20, 6, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(6, 6, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(10, 6, generator=g),
        "model.layers.0.input_layernorm.weight": torch.randn(6, generator=g),
        "model.norm.weight": torch.randn(6, generator=g),
    }


MATRICES = ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight")


def eps64(seed: int, name: str, shape) -> torch.Tensor:
    """The definition: A B^T / sqrt(r), A (out x r) then B (in x r) drawn from one seeded generator."""
    a, b = factors(seed, name, shape, RANK)
    return (a.double() @ b.double().T) / RANK**0.5


def test_low_rank_noise_is_a_rank_r_product_on_the_linear_layers_only():
    weights = base()
    assert [n for n, t in weights.items() if lowrank_target(n, t.shape)] == list(MATRICES)
    for name in MATRICES:
        e = lowrank_noise(7, name, weights[name].shape, RANK)
        assert e.dtype == torch.float32 and e.shape == weights[name].shape
        assert torch.linalg.matrix_rank(e.double(), rtol=1e-5) == RANK
        assert torch.allclose(e.double(), eps64(7, name, weights[name].shape), atol=1e-6, rtol=0)
        assert torch.equal(e, lowrank_noise(7, name, weights[name].shape, RANK))  # a pure function
        assert not torch.equal(e, lowrank_noise(8, name, weights[name].shape, RANK))
    a, b = factors(7, MATRICES[1], (10, 6), RANK)
    assert a.shape == (10, RANK) and b.shape == (6, RANK)


def test_a_member_is_the_center_plus_sigma_sign_eps_on_the_matrices_and_the_center_elsewhere():
    weights = base()
    got = dict(perturbed(weights, 5, -1, 0.1, RANK))
    for name, tensor in weights.items():
        if name in MATRICES:
            want = tensor.double() - 0.1 * eps64(5, name, tensor.shape)
            assert torch.allclose(got[name].double(), want, atol=1e-6, rtol=0)
        else:
            assert torch.equal(got[name], tensor)  # vectors and the embedding: not perturbed
    factored = member_factors(weights, 5, -1, 0.1, RANK)
    assert sorted(factored) == sorted(MATRICES)
    for name, (a, b) in factored.items():  # what an engine adds per row, (x B) A^T, is the same perturbation
        assert torch.allclose((a @ b.T).double(), got[name].double() - weights[name].double(), atol=1e-6, rtol=0)


def test_a_low_rank_update_equals_the_formula_and_touches_only_the_matrices():
    weights = base()
    master = {k: v.clone() for k, v in weights.items()}
    step = ESStep((11, 11, 12), (1, -1, 1), (1.2, -0.4, -0.8), 0.01, 0.05, "lowrank", RANK)
    apply_step(master, step)
    for name, tensor in weights.items():
        if name not in MATRICES:
            assert torch.equal(master[name], tensor)
            continue
        want = tensor.double() + step.alpha / 3 * sum(
            z * s * eps64(seed, name, tensor.shape)
            for seed, s, z in zip(step.seeds, step.signs, step.rewards, strict=True)
        )
        assert torch.allclose(master[name].double(), want, atol=1e-6, rtol=0)
        assert torch.linalg.matrix_rank(master[name].double() - tensor.double(), rtol=1e-5) > RANK  # a full-rank change


def test_a_full_step_keeps_its_entry_and_its_history_digest_as_before_low_rank_noise():
    step = ESStep((11, 11, 12), (1, -1, 1), (1.2, -0.4, -0.8), 0.01, 0.05)
    assert step.to_dict() == {
        "seeds": [11, 11, 12],
        "signs": [1, -1, 1],
        "rewards": [1.2, -0.4, -0.8],
        "sigma": 0.01,
        "alpha": 0.05,
    }
    # the digest as the code before `noise` computed it: origin, then each step's repr
    old = hashlib.sha256(b"cpu\x00")
    old.update(b"ESStep(seeds=(11, 11, 12), signs=(1, -1, 1), rewards=(1.2, -0.4, -0.8), sigma=0.01, alpha=0.05)")
    assert history_digest({1: step}, 1, "cpu") == old.hexdigest()
    low = ESStep(step.seeds, step.signs, step.rewards, 0.01, 0.05, "lowrank", RANK)
    assert ESStep.from_dict(low.to_dict()) == low and low.to_dict()["noise"] == "lowrank"
    assert history_digest({1: low}, 1, "cpu") != old.hexdigest()  # another center: another snapshot name
    with pytest.raises(ValueError, match="rank"):
        ESStep((1,), (1,), (0.0,), 0.01, 0.05, "lowrank", 0)
    with pytest.raises(ValueError, match="rank"):
        ESStep((1,), (1,), (0.0,), 0.01, 0.05, "full", 4)


def test_a_full_member_is_unchanged_by_the_rank_parameter_default():
    weights = base()
    got = dict(perturbed(weights, 5, 1, 0.1))
    for name, tensor in weights.items():
        assert torch.equal(got[name], noise(5, name, tensor.shape).mul_(0.1).add_(tensor))


def test_low_rank_replay_is_bit_identical_whatever_the_thread_count():
    """Two generators may run torch with different thread counts: the replayed center must not depend on
    it (the matrices are the default model's sizes, where a BLAS would split work across threads)."""
    g = torch.Generator().manual_seed(1)
    weights = {
        "model.layers.0.mlp.down_proj.weight": torch.randn(576, 1536, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(1536, 576, generator=g),
    }
    z = tuple(float(i - 3.5) for i in range(8))
    steps = [ESStep(tuple(range(10 * v, 10 * v + 8)), (1, -1) * 4, z, 0.001, 0.002, "lowrank", 16) for v in (1, 2)]
    threads = torch.get_num_threads()
    digests = []
    try:
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            es = ESWeights(lambda: {k: v.clone() for k, v in weights.items()}, lambda named: None)
            for v, step in enumerate(steps, start=1):
                es.add_step(v, step)
            digests.append(digest(es.center(2)))
    finally:
        torch.set_num_threads(threads)
    assert len(set(digests)) == 1, digests
