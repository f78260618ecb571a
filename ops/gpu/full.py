"""`python -m ops.gpu_check --full` (`make gpu-check`): the real pipeline, the real default model, on a GPU.

What the first run on a GPU lacked: every path a user takes, run end to end where it will run. In order, each
step a child process with its own time limit, its outcome (or its error) written to the JSON as it ends:

1. `checks`: the quick checks of ops/gpu/check.py (noise, engine, GRPO step, cuda against cpu; GPU only);
2. `runs.es`: `python -m trainer --algo es`, the `cpu` preset, `--es-versions` versions (8), 64 new tokens, 32
   held-out problems evaluated every 4 versions: the local pipeline (a private Redis, the hf generator on the
   device, a verifier with the process sandbox);
3. `runs.grpo`: `python -m trainer --algo grpo` with the defaults (8 groups of 8 a version) for
   `--grpo-samples` samples (1,024: 16 versions), generator and trainer on the device;
4. `sharded`: the sharded GRPO trainer (FSDP) on one rank over NCCL (ops/gpu/sharded_job.py; GPU only);
5. `benches`: `ops bench es`, `ops bench generator` (the dynamic KV cache, then the static one that
   transformers compiles on a GPU), `ops bench grpo`, `ops bench es-throughput` (low-rank members against pure
   inference, `--es-throughput-shape`: 32 members x 16 problems), each with `--device`.

Each run records `versions`, `held_out_start` / `held_out_end` (reward and exact, at the first and last
evaluation), `wall_s`, `generator_tokens_per_s` (the engine's own, as its last report says) and
`generator_busy` (the share of the generator's time spent generating); GRPO also `step_s` (the median
optimizer step). The file is `<out>/<gpu name>-<date>.json` (`cpu-<date>.json` for a `--device cpu`
rehearsal), with the device, GPU, torch and transformers versions and the commit; a second call of the same
commit on the same day adds its steps to that file (`--skip` divides the check among calls). Without a GPU
and without `--device cpu`, it refuses with the reason and runs nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streams.run_dir import REPORT, eval_records, read_json, read_records, update_records

ROOT = Path(__file__).resolve().parents[2]
GROUP_SAMPLES = 64  # what one GRPO version trains on with the defaults: batch 8 x group size 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--es-versions", type=int, default=8, help="--full: the ES run's versions (default 8)")
    p.add_argument(
        "--grpo-samples",
        type=int,
        default=1024,
        help=f"--full: the GRPO run's training samples ({GROUP_SAMPLES} a version; default 1024)",
    )
    p.add_argument("--bench-rounds", type=int, default=3, help="--full: rounds of each bench (default 3)")
    p.add_argument(
        "--es-throughput-shape",
        nargs=2,
        type=int,
        default=[32, 16],
        metavar=("MEMBERS", "PROBLEMS"),
        help="--full: bench es-throughput's population and problems a member, 64 tokens (default 32 16)",
    )
    p.add_argument(
        "--bench-shape",
        nargs=3,
        type=int,
        default=[4, 8, 8],
        metavar=("ORDERS", "PROMPTS", "N"),
        help="--full: bench generator's orders a round, problems an order, samples a problem (default "
        "4 8 8: GRPO's default batch of 8 x 8 rows an order)",
    )
    p.add_argument("--step-timeout-s", type=float, default=3600.0, help="--full: each step's limit (default 3600)")
    p.add_argument("--work", default="", help="--full: where the runs go (default runs/gpu-check-<time>)")
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=("checks", "es", "grpo", "sharded", "benches"),
        help="--full: steps not to run",
    )


def main(args: argparse.Namespace, quick: Callable[[Path], dict[str, Any]]) -> int:
    import transformers

    from weights import device as devices
    from weights.model import resolve_model

    try:
        device = devices.resolve(args.device)
    except devices.NoDevice as e:
        print(f"gpu_check: {e}: `make gpu-check` measures a GPU (`--device cpu` rehearses it here)", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = Path(args.work or ROOT / "runs" / f"gpu-check-{stamp}").resolve()
    model = resolve_model(None)  # converted once, before any step's clock starts
    about = devices.describe(device)
    name = re.sub(r"[^a-z0-9]+", "-", str(about.get("gpu", "cpu")).lower()).strip("-")
    out = Path(args.out or ROOT / "docs" / "results" / "gpu") / f"{name}-{datetime.date.today().isoformat()}.json"
    result: dict[str, Any] = {
        **about,
        "transformers": transformers.__version__,
        "commit": _commit(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "work": str(work),
        "runs": {},
        "benches": {},
        "errors": {},
    }
    result = _earlier(out, result)
    steps = _steps(args, device, work, model)
    if device.startswith("cuda"):
        steps.insert(0, ("checks", lambda: {"checks": quick(model)}))
    for step, run in steps:
        if _skipped(step, args.skip):
            continue
        started = time.monotonic()
        result["errors"].pop(step, None)
        print(f"gpu_check: {step} ...", file=sys.stderr, flush=True)
        try:
            _merge(result, run())
        except Exception as e:  # noqa: BLE001 - one step's failure is a result too; the others still run
            result["errors"][step] = f"{type(e).__name__}: {e}"[-3000:]
        print(f"gpu_check: {step} done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        _write(out, result)
    print(json.dumps(result))
    print(f"gpu_check: wrote {out}", file=sys.stderr)
    # the runs themselves stay in `work`; their own light files go beside the summary the same way as an
    # experiment's (evals/publish.py; ops may not import evals: tests/test_layers.py)
    print(f"gpu_check: to publish its runs: python -m evals.publish {work} docs/results/gpu/{name}", file=sys.stderr)
    return 1 if result["errors"] else 0


def _steps(args: argparse.Namespace, device: str, work: Path, model: Path) -> list[tuple[str, Callable[[], dict]]]:
    iterations = max(1, args.grpo_samples // GROUP_SAMPLES)
    rounds = str(args.bench_rounds)
    timeout = args.step_timeout_s
    orders, prompts, n = (str(x) for x in args.bench_shape)
    shape = ("--orders", orders, "--prompts", prompts, "--n", n, "--max-new-tokens", "64")
    es_flags = ("--iterations", str(args.es_versions), "--max-new-tokens", "64")
    grpo_flags = ("--iterations", str(iterations), "--train-device", device)
    throughput = ("--population", str(args.es_throughput_shape[0]), "--problems", str(args.es_throughput_shape[1]))
    return [
        ("runs.es", lambda: {"runs": {"es": _run("es", work / "es", device, timeout, *es_flags)}}),
        ("runs.grpo", lambda: {"runs": {"grpo": _run("grpo", work / "grpo", device, timeout, *grpo_flags)}}),
        ("sharded", lambda: {"sharded": _sharded(work / "sharded", model, timeout)} if device == "cuda" else {}),
        ("benches.es", lambda: {"benches": {"es": _bench(timeout, "es", "--device", device, "--rounds", rounds)}}),
        (
            "benches.generator",
            lambda: {
                "benches": {"generator": _bench(timeout, "generator", "--device", device, "--rounds", rounds, *shape)}
            },
        ),
        (
            "benches.generator_static",
            lambda: {
                "benches": {
                    "generator_static": _bench(
                        timeout, "generator", "--device", device, "--rounds", rounds, *shape, "--kv-cache", "static"
                    )
                }
            },
        ),
        (
            "benches.grpo",
            lambda: {"benches": {"grpo": _bench(timeout, "grpo", "--device", device, "--rounds", rounds)}},
        ),
        (
            "benches.es_throughput",
            lambda: {"benches": {"es_throughput": _bench(timeout, "es-throughput", "--device", device, *throughput)}},
        ),
    ]


def _skipped(step: str, skip: list[str]) -> bool:
    """`--skip es grpo` names the runs, `--skip benches` every bench, `checks` and `sharded` themselves."""
    group, _, name = step.partition(".")
    return (name if group == "runs" else group) in skip


def _env(device: str) -> dict[str, str]:
    """The caller's environment without its run settings (the check chooses them), the generator on `device`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_") or k == "PROOFSTREAM_CACHE"}
    return {**env, "PROOFSTREAM_DEVICE": device, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _run(algo: str, run_dir: Path, device: str, timeout_s: float, *extra: str) -> dict[str, Any]:
    """One local-pipeline run to its end; its figures from its report and metrics."""
    argv = [sys.executable, "-m", "trainer", "--algo", algo, "--task", "countdown", "--run", f"gpu-{algo}"]
    argv += ["--run-dir", str(run_dir), "--held-out", "32", "--eval-every", "4", "--engine", "hf"]
    argv += ["--sandbox", "process", "--log-level", "warning", *extra]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=_env(device), capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.startswith("trainer: ")]
        raise RuntimeError(
            f"python -m trainer --algo {algo} exited {done.returncode}: {said[-1:] or done.stderr[-1500:]}"
        )
    return run_figures(run_dir, time.monotonic() - started)


def run_figures(run_dir: Path, wall_s: float) -> dict[str, Any]:
    """What `--full` records of a finished run, from `report.json` and `metrics.jsonl` in its directory."""
    report = read_json(run_dir / REPORT)
    if report is None:
        raise RuntimeError(f"{run_dir / REPORT} is missing or unreadable: the run wrote no report")
    records = read_records(run_dir)
    updates = update_records(records)
    evals = sorted(eval_records(records), key=lambda r: r["version"])
    held = lambda r: {"version": r["version"], "reward": r["held_out_reward"], "exact": r["held_out_exact"]}  # noqa: E731
    last = updates[-1] if updates else {}
    out = {
        "versions": report.get("version"),
        "samples": (report.get("counts") or {}).get("samples"),
        "held_out_start": held(evals[0]) if evals else None,
        "held_out_end": held(evals[-1]) if evals else None,
        "wall_s": round(report.get("wall_s") or wall_s, 1),
        "generator_tokens_per_s": last.get("generator_tokens_per_s"),
        "generator_busy": last.get("generator_busy_share"),
        "verifier_utilization": last.get("verifier_utilization"),
        "dead_letters": last.get("dead_letters"),
    }
    steps = [r["step_s"] for r in updates if "step_s" in r]
    if steps:
        out["step_s"] = round(statistics.median(steps), 3)
    return out


def _bench(timeout_s: float, *argv: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "ops", "bench", *argv, "--json"],
        cwd=ROOT,
        env=_env("auto"),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ops bench {' '.join(argv)} exited {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sharded(out: Path, model: Path, timeout_s: float) -> dict[str, Any]:
    """ops/gpu/sharded_job.py on one rank over NCCL: a step, its policy folder, a DCP checkpoint, a resume and a
    second step. Its metrics lines are the result."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    argv += ["-m", "ops.gpu.sharded_job", str(model), str(out)]
    env = {**_env("cuda"), "SHARDED_JOB_DEVICE": "cuda", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"the sharded job exited {done.returncode}: {done.stderr[-1500:]}")
    steps = read_records(out)
    return {"steps": [{k: s.get(k) for k in ("version", "loss", "grad_norm", "step_s", "world")} for s in steps]}


def _earlier(out: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """The file's result where it is of this commit and device (a box's call limit splits the check into
    calls, each adding its steps), with this call's figures; else `fresh`."""
    try:
        earlier = json.loads(out.read_text())
    except (OSError, ValueError):
        return fresh
    if (earlier.get("commit"), earlier.get("device")) != (fresh["commit"], fresh["device"]):
        return fresh
    return {**earlier, **{k: v for k, v in fresh.items() if k not in ("runs", "benches", "errors")}}


def _merge(into: dict[str, Any], part: dict[str, Any]) -> None:
    for key, value in part.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            into[key].update(value)
        else:
            into[key] = value


def _write(out: Path, result: dict[str, Any]) -> None:
    """The JSON as it stands: a box that is taken back mid-way still leaves what ran."""
    out.parent.mkdir(parents=True, exist_ok=True)
    result["written"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    os.replace(tmp, out)


def _commit() -> str:
    """The commit this runs from: git where the checkout has it, else ops/gpu/COMMIT (written by the pack)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if done.returncode == 0:
            return done.stdout.strip()
    except OSError:
        pass
    marker = Path(__file__).with_name("COMMIT")
    return marker.read_text().strip() if marker.is_file() else "unknown"
