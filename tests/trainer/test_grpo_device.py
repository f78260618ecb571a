"""The GRPO trainer on an accelerator: a step, its reference model and extra epochs, the saved policy, and the
checkpoint and resume keep every tensor on the trainer's device (tests/fixtures/accelerator.py), with the
real default model, and compute what the CPU trainer computes (to float rounding: the device's composite ops
are split into other kernels than the CPU's).

The sharded trainer (trainer/sharded.py) is the same step over FSDP: its own tensors are its micro-batch
order (host lists), the summed statistics (made on its device) and the zero-loss pass (the model's device);
its collectives need gloo or NCCL on real tensors, so `python -m ops.gpu_check --full` runs it on a GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from tests.fixtures.accelerator import DEVICE, OnDevice, simulated_accelerator  # noqa: E402
from trainer.grpo_loss import GRPOConfig, GRPOSample  # noqa: E402
from trainer.grpo_trainer import GRPOTrainer  # noqa: E402
from weights.model import resolve_model  # noqa: E402


@pytest.fixture(scope="module")
def model_path():
    return resolve_model(None)  # the real default model, converted once per machine


def _groups(offset: int = 0) -> list[list[GRPOSample]]:
    """Two groups of four 6-token completions with rewards that differ within each group (none skipped); the
    behaviour logprobs say the samples are a little off-policy (is weights < 1 are applied)."""
    g = torch.Generator().manual_seed(3 + offset)
    return [
        [
            GRPOSample(
                [1, 2, 3, 4 + j], torch.randint(10, 1000, (6,), generator=g).tolist(), [-2.0] * 6, float(k % 2), 0
            )
            for k in range(4)
        ]
        for j in range(2)
    ]


def _config(**kw) -> GRPOConfig:
    return GRPOConfig(group_size=4, lr=1e-4, max_tokens=8, precision="fp32", **kw)


@pytest.mark.parametrize("extra", [{}, {"kl_coef": 0.1, "epochs": 2}], ids=["plain", "kl-and-2-epochs"])
def test_a_step_on_the_device_is_the_cpu_step(model_path, tmp_path, extra):
    cpu = GRPOTrainer(model_path, _config(**extra), tmp_path / "cpu")
    expected = cpu.step(_groups())
    cpu_folder, _ = cpu.save(1)
    del cpu
    with simulated_accelerator() as mode:
        trainer = GRPOTrainer(model_path, _config(**extra), tmp_path / "dev", device=DEVICE.type)
        assert isinstance(next(trainer.model.parameters()), OnDevice)
        got = trainer.step(_groups())
        folder, _ = trainer.save(1)
    assert not mode.mixes
    assert got["updated"] and got["version"] == 1
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-4, abs=1e-6)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
    assert got["is_weight_mean"] == pytest.approx(expected["is_weight_mean"], rel=1e-5)
    # The saved policy (what a generator loads) moved from the base as the CPU's did, to rounding. (Adam's
    # first step moves a weight by about lr whatever its gradient, so a weight whose gradient is near zero may
    # move either way on the two: compared as whole updates, not weight by weight.)
    base, mine, theirs = (load_file(str(f / "model.safetensors")) for f in (model_path, folder, cpu_folder))
    moved = sum(float((theirs[k] - base[k]).square().sum()) for k in base) ** 0.5
    apart = sum(float((mine[k] - theirs[k]).square().sum()) for k in base) ** 0.5
    assert moved > 0 and apart < moved / 20, (moved, apart)


def test_bf16_mixed_steps_on_the_device(model_path, tmp_path):
    """bf16-mixed autocasts on the trainer's device type: it must run there (the fixture checks placement only;
    the precision's numbers are tests/trainer/test_grpo.py's and `ops bench grpo`'s)."""
    with simulated_accelerator() as mode:
        trainer = GRPOTrainer(
            model_path,
            GRPOConfig(group_size=4, lr=1e-4, max_tokens=8, precision="bf16-mixed"),
            tmp_path,
            device=DEVICE.type,
        )
        metrics = trainer.step(_groups())
    assert not mode.mixes and metrics["updated"] and metrics["grad_norm"] > 0


def test_a_checkpoint_taken_on_the_device_resumes_there_to_the_cpu_runs_next_step(model_path, tmp_path):
    cpu = GRPOTrainer(model_path, _config(), tmp_path / "cpu")
    cpu.step(_groups())
    expected = cpu.step(_groups(1))
    del cpu
    with simulated_accelerator() as mode:
        first = GRPOTrainer(model_path, _config(), tmp_path / "a", device=DEVICE.type)
        first.step(_groups())
        checkpoint = first.checkpoint(tmp_path / "grpo.pt")
        del first
        resumed = GRPOTrainer(model_path, _config(), tmp_path / "b", device=DEVICE.type)
        resumed.resume(checkpoint)
        assert all(
            isinstance(s, OnDevice)
            for st in resumed.optimizer.state.values()
            for s in st.values()
            if isinstance(s, torch.Tensor) and s.dim() > 0
        )
        got = resumed.step(_groups(1))
    assert not mode.mixes
    assert (got["version"], got["loss"]) == (2, pytest.approx(expected["loss"], rel=1e-4, abs=1e-6))
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
