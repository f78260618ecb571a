"""`python -m ops.gpu_check [--full | --experiment] [--device cuda|cpu]`: do the engine and trainer paths run on a
GPU? (`--experiment`, `make gpu-experiment`: ES against GRPO at equal wall-clock on it, ops/gpu/experiment.py.)

`--full` (`make gpu-check`) runs the real pipeline with the real default model on the device and writes
docs/results/gpu/<gpu>-<date>.json: ops/gpu/full.py says what it runs and records. Without it, the quick
checks below.

What "runs unchanged on a GPU" needs from our own code, checked on a model small enough to build on the spot
(the default model's config shrunk to 2 layers of width 64, random weights, the default model's tokenizer;
a machine without a model cache or network can run it):

- ES noise: `weights.es.noise` on cuda against the same draw on cpu. torch's CUDA generator (Philox) and
  its CPU generator (Mersenne Twister) give different bits for one seed, so a pool must draw its noise on one
  device type; the check records whether they differ on this machine.
- the HF engine on cuda: a member perturbation, a step replayed twice to the same digest, greedy answers
  that repeat exactly, and the step replayed on cpu to compare the centres.
- the GRPO trainer on cuda (the trainer's `device` setting): one step on a fixed batch, against the same
  step on cpu (same initial weights): loss and the weights' largest difference after the step.

Prints one JSON object and writes it to `--out`. Needs torch and transformers only (no Redis, no vLLM).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from ops.gpu import experiment as gpu_experiment
from ops.gpu import full as gpu_full
from producers.engine import Sampling
from producers.hf import HFEngine
from trainer.grpo_loss import GRPOConfig, GRPOSample
from trainer.grpo_trainer import GRPOTrainer
from weights.es import noise

STEP = {
    "seeds": [11, 12, 13, 14],
    "signs": [1, -1, 1, -1],
    "rewards": [1.0, -1.0, 0.5, -0.5],
    "sigma": 0.01,
    "alpha": 0.01,
}


def tiny_model(tokenizer_dir: Path, folder: Path) -> Path:
    """The tokenizer's model config, 2 layers of width 64, random weights (seeded), saved as safetensors."""
    config = transformers.AutoConfig.from_pretrained(str(tokenizer_dir))
    config.update(
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
        }
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def check_noise() -> dict[str, Any]:
    cpu = noise(7, "w", (256, 64), "cpu")
    cuda = noise(7, "w", (256, 64), "cuda")
    again = noise(7, "w", (256, 64), "cuda")
    return {
        "cuda_repeats": bool(torch.equal(cuda, again)),
        "cuda_equals_cpu": bool(torch.equal(cuda.cpu(), cpu)),
        "cuda_std": round(float(cuda.std()), 4),
    }


def check_engine(model: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    greedy = Sampling(n=1, temperature=0.0, max_new_tokens=16)
    engines = {device: HFEngine(model, dtype="float32", device=device) for device in ("cuda", "cpu")}
    for device, engine in engines.items():
        engine.es_add_step(1, STEP)
        started = time.monotonic()
        engine.es_use(1, 99, -1, 0.01)  # a member of center 1: the step replayed, then a perturbation
        first = [s[0].token_ids for s in engine.generate(prompts, greedy)]
        second = [s[0].token_ids for s in engine.generate(prompts, greedy)]
        out[device] = {
            "greedy_repeats": first == second,
            "member_s": round(time.monotonic() - started, 3),
            "center_digest": engine.es_digest(1),
        }
    out["cuda"]["replay_repeats"] = engines["cuda"].es_digest(1) == out["cuda"]["center_digest"]
    out["centers_equal_across_devices"] = out["cuda"]["center_digest"] == out["cpu"]["center_digest"]
    for engine in engines.values():
        engine.close()
    return out


def check_grpo(model: Path, work: Path) -> dict[str, Any]:
    cfg = GRPOConfig(group_size=4, lr=1e-3, max_tokens=8)
    generator = torch.Generator().manual_seed(3)
    groups = []
    for g in range(2):
        group = []
        for k in range(4):
            tokens = torch.randint(10, 1000, (6,), generator=generator).tolist()
            group.append(GRPOSample([1, 2, 3, 4 + g], tokens, [-2.0] * 6, float(k % 2), 0))
        groups.append(group)
    results, weights = {}, {}
    for device in ("cpu", "cuda"):
        trainer = GRPOTrainer(model, cfg, out_dir=work / device, device=device)
        started = time.monotonic()
        metrics = trainer.step(groups)
        results[device] = {
            "loss": metrics.get("loss"),
            "updated": metrics.get("updated"),
            "step_s": round(time.monotonic() - started, 3),
        }
        weights[device] = {k: v.detach().float().cpu() for k, v in trainer.model.state_dict().items()}
    diff = max(float((weights["cuda"][k] - weights["cpu"][k]).abs().max()) for k in weights["cpu"])
    moved = max(float((weights["cpu"][k] - w).abs().max()) for k, w in _initial(model).items())
    return {
        **results,
        "max_weight_diff_cuda_vs_cpu": diff,
        "max_weight_change_cpu": moved,
        "loss_diff": abs(results["cuda"]["loss"] - results["cpu"]["loss"]),
    }


def _initial(model: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(model / "model.safetensors")).items()}


def quick(tokenizer: Path) -> dict[str, Any]:
    """The checks above on a 2-layer model built from the tokenizer's config (no Redis, no pipeline)."""
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(tokenizer, Path(tmp) / "tiny")
        return {"noise": check_noise(), "engine": check_engine(model), "grpo": check_grpo(model, Path(tmp))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--full",
        action="store_true",
        help="the real pipeline with the real model on the device: an ES run, a GRPO run, the benches "
        "(ops/gpu/full.py); without it, the quick checks on a 2-layer model",
    )
    p.add_argument(
        "--experiment",
        action="store_true",
        help="ES against GRPO at equal wall-clock with the real model, sized to --minutes from a throughput "
        "it measures first (ops/gpu/experiment.py; `make gpu-experiment`)",
    )
    p.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="--full, --experiment: where to run (default cuda, refused without a GPU; cpu rehearses the script)",
    )
    p.add_argument(
        "--tokenizer",
        default="",
        help="quick checks: a model folder with tokenizer.json and config.json (default: the default model's folder)",
    )
    p.add_argument(
        "--out",
        default="",
        help="also write the JSON here (--full, --experiment: a folder, default docs/results/gpu; the file is "
        "<gpu>-<date>.json, experiment-<gpu>-<date>.json)",
    )
    gpu_full.add_arguments(p)
    gpu_experiment.add_arguments(p)
    args = p.parse_args(argv)
    if args.experiment:  # before --full: ops/gpu/box.sh's `run` always passes --full
        return gpu_experiment.main(args)
    if args.full:
        return gpu_full.main(args, quick)
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no GPU"}))
        return 1
    from weights.model import resolve_model

    tokenizer = Path(args.tokenizer) if args.tokenizer else resolve_model(None)
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        **quick(tokenizer),
    }
    line = json.dumps(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(line)
    return 0
