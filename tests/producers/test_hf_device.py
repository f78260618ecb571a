"""The `hf` engine on an accelerator: every path it serves keeps its tensors on the engine's device.

A tensor on the host indexing one on the GPU (sampled completions moved to the host, then used as indices
into the behaviour logprobs left on the GPU) fails on CUDA and passes on a CPU: a CPU run cannot catch what
fails every GRPO work order on a GPU. These tests run the engine on a simulated device
(tests/fixtures/accelerator.py: a second device that computes on the CPU and refuses, as CUDA does, any
operation that mixes its tensors with host tensors), with the real default model, and compare each answer
with the same call on the plain CPU engine: the simulated device computes the same numbers, so tokens and
logprobs must agree, not only run.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the hf engine needs torch (make test installs torch==2.13.0)")

from evals.rebuild import weights_digest_of  # noqa: E402
from producers.engine import Sampling  # noqa: E402
from producers.hf import HFEngine, _RawLogprobs  # noqa: E402
from streams.theorems import Theorem  # noqa: E402
from tasks import prompts  # noqa: E402
from tests.fixtures.accelerator import DEVICE, DeviceMix, OnDevice, simulated_accelerator  # noqa: E402
from weights.io import save_weights  # noqa: E402

THEOREMS = [
    Theorem("cd-1", "countdown", numbers=[3, 5, 7], target=22),
    Theorem("cd-2", "countdown", numbers=[10, 4], target=6),
]
STEP = {
    "seeds": [11, 12, 13, 14],
    "signs": [1, -1, 1, -1],
    "rewards": [1.0, -1.0, 0.5, -0.5],
    "sigma": 0.01,
    "alpha": 0.01,
}
GREEDY = Sampling(n=1, temperature=0.0, max_new_tokens=10)
GRPO = Sampling(n=3, temperature=0.7, max_new_tokens=10, seed=5, logprobs=True)  # what a GRPO order asks
PASSK = Sampling(n=2, temperature=1.0, max_new_tokens=10, seed=9)  # evals.passk: sampled, no logprobs


def _ids(engine):
    return [prompts.tokenize(engine.tokenizer, prompts.messages(t)) for t in THEOREMS]


def _answers(out):
    return [[(s.token_ids, s.finish_reason) for s in row] for row in out]


def test_the_recorder_refuses_a_host_index_into_device_logprobs():
    """The fixture finds the bug of the first GPU run: `_RawLogprobs.finish` given the completions after
    they were moved to the host (what producers/hf.py did) raises, given device tokens it answers."""
    with simulated_accelerator():
        recorder = _RawLogprobs()
        scores = torch.randn(2, 5).to(DEVICE)
        recorder(torch.tensor([[1], [2]]).to(DEVICE), scores)
        with pytest.raises(DeviceMix, match="same device"):
            recorder.finish(torch.tensor([3, 4]))
        recorder = _RawLogprobs()
        recorder(torch.tensor([[1], [2]]).to(DEVICE), scores)
        assert isinstance(recorder.finish(torch.tensor([3, 4]).to(DEVICE)), OnDevice)


PATHS = {"greedy": GREEDY, "grpo": GRPO, "passk": PASSK}


@pytest.fixture(scope="module")
def on_the_cpu(model_path):
    """What the plain CPU engine (fp32) answers on each path: the reference of the device's answers."""
    cpu = HFEngine(model_path)
    expected = {name: cpu.generate(_ids(cpu), sampling) for name, sampling in PATHS.items()}
    cpu.close()
    return expected


@pytest.mark.slow  # minutes of real-model work: its file is handed out first (tests/conftest.py)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_sampled_and_logprob_paths_on_the_device_answer_as_on_the_cpu(model_path, on_the_cpu, dtype):
    """fp32: the same tokens and logprobs as the CPU engine. bf16: the same shapes (its kernels round otherwise
    than fp32's, which flips a sampled token now and then: not what is tested; its placement is)."""
    with simulated_accelerator() as mode:
        engine = HFEngine(model_path, dtype=dtype, device=DEVICE.type)
        assert isinstance(next(engine.model.parameters()), OnDevice)
        for name, sampling in PATHS.items():
            got = engine.generate(_ids(engine), sampling)
            assert [len(row) for row in got] == [sampling.n] * len(THEOREMS)
            if dtype == "float32":
                assert _answers(got) == _answers(on_the_cpu[name]), name
            for row, ref in zip(got, on_the_cpu[name], strict=True):
                for s, r in zip(row, ref, strict=True):
                    assert 0 < len(s.token_ids) <= sampling.max_new_tokens
                    if not sampling.logprobs:
                        assert s.logprobs is None
                        continue
                    assert len(s.logprobs) == len(s.token_ids) and all(lp <= 0 for lp in s.logprobs)
                    if dtype == "float32":
                        assert s.logprobs == pytest.approx(r.logprobs, abs=1e-4)
        engine.close()
    assert mode.ops > 1000 and not mode.mixes  # the engine ran under the mode, and nothing crossed devices


def test_es_members_replay_and_grpo_weights_on_the_device_equal_the_cpu_engine(model_path, tmp_path):
    """An ES member (center of version 1 + a perturbation), the center's digest, a snapshot replayed by a
    second engine, and the center saved as GRPO weights and loaded back: the same bits as on the CPU."""
    cpu = HFEngine(model_path)
    cpu.es_add_step(1, STEP)
    cpu.es_use(1, 99, -1, 0.01)
    member = _answers(cpu.generate(_ids(cpu), GREEDY))
    center = cpu.es_digest(1)
    cpu.close()
    with simulated_accelerator() as mode:
        engine = HFEngine(model_path, device=DEVICE.type, snapshot_dir=tmp_path / "snap", snapshot_every=1)
        engine.es_add_step(1, STEP)
        engine.es_use(1, 99, -1, 0.01)
        assert _answers(engine.generate(_ids(engine), GREEDY)) == member
        assert engine.es_digest(1) == center
        assert all(isinstance(t, OnDevice) for t in engine.es.center(1).values())  # the master lives there too
        folder = tmp_path / "v1"  # GRPO's weights folder, holding center 1 as the device computed it
        save_weights({name: t.cpu() for name, t in engine.es.center(1).items()}, folder / "model.safetensors")
        engine.load_weights(folder)
        assert engine.es.current is None
        late = HFEngine(model_path, device=DEVICE.type, snapshot_dir=tmp_path / "snap")
        late.es_add_step(1, STEP)
        assert late.es_digest(1) == center and late.es.snapshots_loaded == 1
    assert not mode.mixes
    # What was saved and loaded on the device is the center, as the CPU's engine reads it back.
    reread = HFEngine(model_path)
    reread.load_weights(folder)
    assert weights_digest_of(reread) == center


def test_the_static_kv_cache_answers_as_the_dynamic_one_on_the_device(model_path, on_the_cpu):
    """`kv_cache="static"` (what lets transformers compile the decoding step on a GPU) keeps the cache on the
    engine's device and changes no answer: greedy and GRPO's sampled path with logprobs, against the CPU
    engine's dynamic cache."""
    expected = [on_the_cpu["greedy"], on_the_cpu["grpo"]]
    with simulated_accelerator() as mode:
        engine = HFEngine(model_path, device=DEVICE.type, kv_cache="static")
        got = [engine.generate(_ids(engine), s) for s in (GREEDY, GRPO)]
        engine.close()
    assert not mode.mixes
    assert [_answers(g) for g in got] == [_answers(e) for e in expected]
    for row, ref in zip(got[1], expected[1], strict=True):
        for s, r in zip(row, ref, strict=True):
            assert s.logprobs == pytest.approx(r.logprobs, abs=1e-4)
