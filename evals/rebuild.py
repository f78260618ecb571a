"""A policy version of a run, rebuilt in an `hf` engine the way a generator holds it (producers/hf.py and
producers/policy.py's `PolicyFollower`): ES replays the steps of versions 1..V from the base model in fp32
(`ESWeights`, the center, no member noise; nothing but the base and the history is trusted, unless
`--es-snapshots` names a generator's snapshot folder to start from); GRPO loads the safetensors folder entry V
names after checking its digest. V = 0 is the base.

torch, transformers and safetensors are imported inside the functions that use them (with producers/hf.py and
weights/es.py, which import torch), so `--help` and a refused input answer without loading them.
"""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis

from evals.runs import EvalError, RunView, ranges
from producers.engine import in_engine_thread
from producers.policy import PolicyFollower, checked_grpo_folder
from streams.keys import Keys
from trainer.config import TrainerSettings
from weights.model import resolve_model


def check_grpo_folder(view: RunView) -> None:
    """Fail before loading a model: the folder entry V names must hold the bytes its digest names (the
    generator's check, producers/policy.py, which runs again right before the weights are loaded)."""
    update = view.entry()
    folder = Path(update.weights_path)
    if not folder.is_dir():
        raise EvalError(
            f"GRPO version {view.version}: its weights folder {folder} does not exist (the trainer "
            f"deletes the folders no work order can name any more, or the run directory moved); "
            f"versions with weights on disk: {ranges(view.on_disk)}"
        )
    checked_grpo_folder(update)


async def engine_device(redis: Redis, settings: TrainerSettings, view: RunView, asked: str) -> str:
    """Where to rebuild the policy. ES centers must be replayed on the device type the run's generators drew
    their noise on (`{ps:R}:es_noise`: CUDA and CPU draw different numbers from one seed); anything else
    runs where asked (`auto`: the GPU when there is one, as a generator chooses)."""
    import torch

    noise = (await redis.get(Keys(settings.run).es_noise) or b"").decode() if view.algo == "es" else ""
    if noise and view.version > 0:
        if asked not in ("auto", noise):
            raise EvalError(
                f"run {settings.run}'s ES noise was drawn on {noise}: its centers replay only there "
                f"(--device {noise}), not on {asked}"
            )
        if noise == "cuda" and not torch.cuda.is_available():
            raise EvalError(
                f"run {settings.run}'s ES noise was drawn on cuda and this machine has no GPU: "
                "evaluate it on a machine with one"
            )
        return noise
    if asked == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return asked


def build_engine(settings: TrainerSettings, snapshots: str | None, device: str):
    """The hf engine on the run's base model on `device` (runs on the engine thread)."""
    import transformers

    from producers.hf import HFEngine

    transformers.utils.logging.disable_progress_bar()
    # snapshot_every=0: snapshots are only read, never written
    return HFEngine(resolve_model(settings.model), dtype="auto", device=device, snapshot_dir=snapshots)


async def apply_policy(engine, redis: Redis, settings: TrainerSettings, view: RunView) -> str:
    """Put version V in the engine the way a generator does; returns what was applied, for the report."""
    if view.version == 0:
        return "the base model (version 0)"
    if view.algo == "es":
        for update in view.updates:  # in stream order, as a generator's follower hands them over
            if update.es_step is None:
                raise EvalError(f"ES policy version {update.policy_version} carries no es_step")
            try:
                await in_engine_thread(engine.es_add_step, update.policy_version, update.es_step)
            except (ValueError, KeyError, TypeError) as e:  # a malformed or conflicting step: the run's history
                raise EvalError(f"ES policy version {update.policy_version}: {e}") from e
        await in_engine_thread(engine.es_use, view.version, None)
        start = "the base model" if not engine.es.snapshots_loaded else "a snapshot"
        return f"{start} + {engine.es.replayed} ES steps up to version {view.version}, replayed in fp32"
    update = view.entry()
    follower = PolicyFollower(redis, Keys(settings.run), engine)
    await follower.take(update)
    await in_engine_thread(follower.load_grpo, view.version, engine.model_path)
    return f"GRPO weights {update.weights_path} ({update.digest}, checked)"


def weights_digest_of(engine) -> str:
    """`weights.io.digest` of the weights the engine samples with, under the checkpoint's tensor names:
    equal digests, equal bits (the test replays ES steps itself and compares)."""
    from safetensors import safe_open

    from weights.io import digest

    names: set[str] = set()
    for file in sorted(Path(engine.model_path).glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            names.update(handle.keys())
    state = engine.model.state_dict()
    return digest({name: state[name] for name in names})
