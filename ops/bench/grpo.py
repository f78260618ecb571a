"""`python -m ops bench grpo`: one GRPO step of the trainer on the real default model, fp32 against bf16-mixed.

The batch is what a Countdown run of the defaults hands the trainer: `--groups` easy problems (the real chat
prompts, tokenized by the model's own tokenizer) x `--group-size` completions of `--completion-tokens`
tokens, with rewards that differ within every group (so no group is skipped). The completions' tokens are
drawn at random: a step costs the same whatever the tokens say. Each round steps a fresh trainer of each
precision on the same batch, the precisions alternating, so both see the same machine.

- `fp32_step_s`, `bf16_mixed_step_s`: medians of `--rounds` steps (forward, backward, AdamW);
- `speedup` = fp32_step_s / bf16_mixed_step_s;
- `grad_norm_rel_diff`: how far apart the two steps' gradient norms are, relative (bf16's rounding).
The trainer steps on `--device` (auto: the GPU where torch sees one, as `--train-device auto` does); the
JSON names the device (and GPU). Last line of output: one JSON object (also written to `--out`).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from ops.bench import common


def bench(args: argparse.Namespace) -> dict:
    # torch and transformers are imported when the bench runs, so `python -m ops` starts without them.
    import torch
    from transformers import AutoTokenizer

    from tasks.countdown import countdown_problems
    from tasks.prompts import messages, tokenize
    from trainer.grpo_loss import GRPOConfig, GRPOSample
    from trainer.grpo_trainer import GRPOTrainer
    from weights import device as devices
    from weights.model import resolve_model

    device = devices.resolve(args.device)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    rng = random.Random(0)
    groups = []
    for theorem in countdown_problems(args.groups, seed=0, curriculum="easy"):
        prompt = tokenize(tokenizer, messages(theorem))
        group = []
        for i in range(args.group_size):
            tokens = [rng.randrange(tokenizer.vocab_size) for _ in range(args.completion_tokens)]
            group.append(GRPOSample(prompt, tokens, [-1.0] * len(tokens), float(i % 2), 0))
        groups.append(group)
    times: dict[str, list[float]] = {"fp32": [], "bf16-mixed": []}
    norms: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as out:
        for r in range(args.rounds + 1):  # round 0 warms both up, off the record
            for precision in times if r % 2 == 0 else reversed(times):
                trainer = GRPOTrainer(
                    path, GRPOConfig(lr=1e-5, precision=precision), Path(out) / precision, device=device
                )
                started = time.perf_counter()
                metrics = trainer.step(groups)  # reads the gradient norm back: the GPU's work is done
                if r:
                    times[precision].append(time.perf_counter() - started)
                norms[precision] = metrics["grad_norm"]
                del trainer
    fp32, mixed = statistics.median(times["fp32"]), statistics.median(times["bf16-mixed"])
    return {
        "bench": "grpo",
        **devices.describe(device),
        "model": path.name,
        "threads": torch.get_num_threads(),
        "bf16_in_hardware": _bf16_in_hardware(torch),
        "groups": args.groups,
        "group_size": args.group_size,
        "prompt_tokens": [len(g[0].prompt_ids) for g in groups],
        "completion_tokens": args.completion_tokens,
        "rounds": args.rounds,
        "fp32_step_s": round(fp32, 2),
        "bf16_mixed_step_s": round(mixed, 2),
        "fp32_steps_s": [round(t, 2) for t in times["fp32"]],
        "bf16_mixed_steps_s": [round(t, 2) for t in times["bf16-mixed"]],
        "speedup": round(fp32 / mixed, 3),
        "grad_norm_rel_diff": round(abs(norms["bf16-mixed"] - norms["fp32"]) / norms["fp32"], 5),
    }


def _bf16_in_hardware(torch) -> bool | None:
    """Whether oneDNN has bf16 instructions here (AVX512-BF16, AMX); None where this torch cannot say."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(torch.backends.mkldnn.is_available() and probe is not None and probe())
    except RuntimeError:
        return None


def summary(result: dict) -> str:
    return (
        f"grpo step on {result.get('gpu', result['device'])} ({result['groups']} x {result['group_size']} samples): "
        f"fp32 {result['fp32_step_s']} s, bf16-mixed {result['bf16_mixed_step_s']} s, speedup {result['speedup']}"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = common.add_bench(
        sub, "grpo", "one GRPO trainer step on the default model: fp32 against bf16-mixed", bench, summary
    )
    common.add_device(p, "where the trainer steps")
    common.add_model(p, gguf=False)
    p.add_argument("--groups", type=int, default=8, help="theorems in the batch (the GRPO default)")
    p.add_argument("--group-size", type=int, default=8, help="completions per theorem (the GRPO default)")
    p.add_argument("--completion-tokens", type=int, default=64, help="tokens a completion")
    p.add_argument("--rounds", type=int, default=3, help="steps of each precision measured; medians are reported")
    common.add_ending(p)
