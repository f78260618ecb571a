"""ES weights: noise as a pure function, exact perturb/restore, deterministic replay, snapshots.

On small fp32 tensors; the same code inside an engine, on the real default model, is tests/producers/test_hf_es.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="ES weights need torch (make test installs torch==2.13.0)")

from weights.es import ESWeights, apply_step, noise, noise_seed  # noqa: E402
from weights.io import digest, load_master, snapshot_metadata  # noqa: E402
from weights.step import ESStep  # noqa: E402


def small_base() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "layer.0.weight": torch.randn(8, 4, generator=g),
        "layer.0.bias": torch.randn(8, generator=g),
        "head.weight": torch.randn(3, 8, generator=g),
    }


STEPS = [
    ESStep((11, 11, 12), (1, -1, 1), (1.2, -0.4, -0.8), 0.01, 0.05),
    ESStep((21, 22), (1, 1), (0.7, -0.7), 0.01, 0.05),
    ESStep((31, 32, 33), (1, -1, -1), (0.0, 1.1, -1.1), 0.02, 0.1),
]


class Recorder:
    """A `write` target: what the engine would hold."""

    def __init__(self) -> None:
        self.held: dict[str, torch.Tensor] = {}
        self.writes = 0

    def __call__(self, named) -> None:
        self.writes += 1
        for name, value in named:
            self.held[name] = value.clone()


def test_noise_is_a_pure_function_of_seed_and_name():
    a = noise(7, "layer.0.weight", (8, 4))
    assert a.dtype == torch.float32
    assert torch.equal(a, noise(7, "layer.0.weight", (8, 4)))
    assert not torch.equal(a, noise(8, "layer.0.weight", (8, 4)))
    assert not torch.equal(a, noise(7, "layer.1.weight", (8, 4)))
    assert noise_seed(7, "x") != noise_seed(7, "y") and 0 <= noise_seed(7, "x") < 2**63
    assert abs(float(noise(1, "big", (200_000,)).std()) - 1.0) < 0.01  # standard normal


def test_update_equals_the_formula():
    base = small_base()
    master = {k: v.clone() for k, v in base.items()}
    step = STEPS[0]
    apply_step(master, step)
    n = len(step.seeds)
    for name, tensor in base.items():
        expected = tensor.double() + step.alpha / n * sum(
            z * s * noise(seed, name, tensor.shape).double()
            for seed, s, z in zip(step.seeds, step.signs, step.rewards, strict=True)
        )
        assert torch.allclose(master[name].double(), expected, atol=1e-6, rtol=0)
        assert not torch.equal(master[name], tensor)


def test_member_weights_are_computed_from_the_fp32_master_and_restore_is_exact():
    base = small_base()
    rec = Recorder()
    es = ESWeights(lambda: {k: v.clone() for k, v in base.items()}, rec)
    es.use(0)
    center = {k: v.clone() for k, v in rec.held.items()}
    assert all(torch.equal(center[k], base[k]) for k in base)
    es.use(0, seed=5, sign=-1, sigma=0.1)
    for name, tensor in base.items():
        assert torch.equal(rec.held[name], tensor + (-0.1) * noise(5, name, tensor.shape))
    assert es.use(0)  # the center again, from the master a member never modifies: exact
    assert all(torch.equal(rec.held[k], base[k]) for k in base)
    writes = rec.writes
    assert es.use(0) is False and rec.writes == writes  # already in place: nothing written


def test_replay_is_deterministic_and_a_late_start_equals_a_continuous_follower(tmp_path):
    base = small_base()

    def fresh():
        return {k: v.clone() for k, v in base.items()}

    follower = ESWeights(fresh, Recorder(), keep=1)
    for v, step in enumerate(STEPS, start=1):
        follower.add_step(v, step.to_dict())
        follower.use(v, seed=100 + v, sigma=0.01)  # it samples members of every version on the way
    late = ESWeights(fresh, Recorder())
    for v, step in enumerate(STEPS, start=1):
        late.add_step(v, step)
    assert digest(late.center(3)) == digest(follower.center(3))
    assert late.replayed == 3
    twice = ESWeights(fresh, Recorder())
    for v, step in enumerate(STEPS, start=1):
        twice.add_step(v, step)
    assert digest(twice.center(3)) == digest(late.center(3))
    assert digest(late.center(3)) != digest(late.center(2))  # an old center is rebuilt, not confused


def following(steps, base, **options) -> ESWeights:
    """ES weights over a copy of `base` that have received `steps` (versions 1..len)."""
    es = ESWeights(lambda: {k: v.clone() for k, v in base.items()}, Recorder(), **options)
    for v, step in enumerate(steps, start=1):
        es.add_step(v, step)
    return es


def test_snapshots_bound_the_replay_and_give_the_same_bits(tmp_path):
    base = small_base()
    writer = following(STEPS, base, snapshot_dir=tmp_path, snapshot_every=2)
    full = digest(writer.center(3))
    [snapshot] = tmp_path.glob("*.safetensors")
    assert snapshot.name == f"v00000002-{writer.history(2)[:16]}.safetensors"
    reader = ESWeights(lambda: pytest.fail("the base must not be needed"), Recorder(), snapshot_dir=tmp_path)
    for v, step in enumerate(STEPS, start=1):
        reader.add_step(v, step)
    assert digest(reader.center(3)) == full
    assert reader.snapshots_loaded == 1 and reader.replayed == 1
    assert digest(load_master(snapshot)) == digest(writer.center(2))


def test_a_snapshot_of_another_history_or_with_other_bytes_is_never_loaded(tmp_path):
    """A new run that reuses a run id (and so the snapshot folder) must not start from the old run's center;
    nor may a snapshot whose bytes changed after it was written."""
    base = small_base()
    old = following(STEPS, base, snapshot_dir=tmp_path, snapshot_every=2)
    old.center(3)  # writes the old run's v2 snapshot
    new_steps = [ESStep((7,), (1,), (1.0,), 0.01, 0.05), *STEPS[1:]]  # the new run's first step differs
    new = following(new_steps, base, snapshot_dir=tmp_path)
    assert digest(new.center(3)) == digest(following(new_steps, base).center(3)) != digest(old.center(3))
    assert new.snapshots_loaded == 0 and new.replayed == 3
    # the same history, but the file's bytes changed: refused, the center rebuilt from the base
    [snapshot] = tmp_path.glob("*.safetensors")
    from safetensors.torch import save_file

    tampered = {k: v.clone() + 1e-3 for k, v in load_master(snapshot).items()}
    save_file(tampered, str(snapshot), metadata=snapshot_metadata(snapshot))
    again = following(STEPS, base, snapshot_dir=tmp_path)
    assert digest(again.center(3)) == digest(old.center(3))
    assert again.snapshots_loaded == 0 and again.replayed == 3


def test_history_cannot_be_rewritten_and_gaps_are_refused():
    es = ESWeights(small_base, Recorder())
    es.add_step(1, STEPS[0])
    es.add_step(1, STEPS[0].to_dict())  # the same step again (a re-read policy stream) is fine
    with pytest.raises(ValueError, match="conflicting"):
        es.add_step(1, STEPS[1])
    with pytest.raises(LookupError, match="not received"):
        es.center(3)
    with pytest.raises(ValueError):
        ESStep((1, 2), (1,), (0.5, 0.5), 0.1, 0.1)
