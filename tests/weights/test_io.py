"""Weights on disk: a folder's shards load as one fp32 master by checkpoint names, a file is written whole with
its metadata, and the digest of tensors tells their bits apart (names, shapes, dtypes, values)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="weights need torch (make test installs torch==2.13.0)")
safetensors = pytest.importorskip("safetensors.torch", reason="weights files are safetensors")

from weights.io import digest, load_master, save_weights, snapshot_metadata  # noqa: E402


def test_a_sharded_bf16_folder_loads_as_one_fp32_master(tmp_path):
    first = {"a.weight": torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16)}
    second = {"b.bias": torch.tensor([0.25, 3.0], dtype=torch.float16)}
    safetensors.save_file(first, str(tmp_path / "model-00001-of-00002.safetensors"))
    safetensors.save_file(second, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "config.json").write_text("{}")

    master = load_master(tmp_path)
    assert sorted(master) == ["a.weight", "b.bias"]
    assert all(t.dtype == torch.float32 for t in master.values())
    assert master["a.weight"].tolist() == [[1.5, -2.0]] and master["b.bias"].tolist() == [0.25, 3.0]
    assert load_master(tmp_path / "model-00002-of-00002.safetensors").keys() == {"b.bias"}  # one file
    with pytest.raises(FileNotFoundError, match="no .safetensors"):
        load_master(tmp_path / "missing-folder")


def test_saved_weights_come_back_with_their_metadata_and_leave_no_temporary(tmp_path):
    weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3).T}  # not contiguous
    path = tmp_path / "sub" / "v1.safetensors"
    save_weights(weights, path, metadata={"version": "1"})
    assert snapshot_metadata(path) == {"version": "1"}
    assert digest(load_master(path)) == digest(weights)
    assert [p.name for p in path.parent.iterdir()] == ["v1.safetensors"]


def test_the_digest_tells_apart_names_shapes_dtypes_and_values():
    t = torch.tensor([[1.0, 2.0]])
    base = digest({"x": t})
    assert digest({"x": t.clone()}) == base
    assert digest({"y": t}) != base
    assert digest({"x": t.reshape(2, 1)}) != base
    assert digest({"x": t.to(torch.float64)}) != base
    assert digest({"x": t + 1e-3}) != base
    assert digest({"x": t, "z": torch.zeros(0)}) != base  # an empty tensor is still a tensor
