"""`python -m ops bench es`: the cost of ES perturbations on the real default model, against drawing the noise.

- `noise_only_s`: drawing the fp32 noise of every tensor of the model for one member, nothing else.
- `perturb_restore_s`: putting a member in the engine (master + sigma*eps, cast, written into the weights
  it samples with) and then the center back, through the engine's own `es_use`.
- `ratio` = perturb_restore_s / noise_only_s (target <= 1.5: the perturbation costs little beyond its noise).
- `replay_s_per_version`: rebuilding a center from the base by replaying `--versions` steps of a
  population of `--population` members, per version (what a generator that starts late pays).
On `--device` (auto: the GPU where torch sees one): the engine's weights, the master, the noise and the
replay all live there, as in a generator on that device; the JSON says which device (and GPU) it measured.
Medians of `--rounds`. Last line of output: one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ops.bench import common


def bench(args: argparse.Namespace) -> dict:
    # torch (weights.es, the engines) is imported when the bench runs, so `python -m ops` starts without it.
    import torch

    from producers.engines import choose, make_engine
    from weights import device as devices
    from weights.es import ESWeights, noise
    from weights.io import digest, load_master
    from weights.model import resolve_model

    device = devices.resolve(args.device)
    path = resolve_model(args.model)
    engine_name = choose(args.engine)
    engine = make_engine(engine_name, path, threads=args.threads, device=device, dtype="auto")  # as a generator
    try:
        master = load_master(path, device)
        params = sum(t.numel() for t in master.values())
        engine.es_use(0, None)  # the center in place and the base master loaded, off the clock
        noise_s, switch_s = [], []
        for r in range(args.rounds):
            started = time.perf_counter()
            for name, tensor in master.items():
                noise(1000 + r, name, tensor.shape, device)
            _synchronize(torch, device)
            noise_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            engine.es_use(0, 1000 + r, 1, 0.001)
            engine.es_use(0, None)
            _synchronize(torch, device)
            switch_s.append(time.perf_counter() - started)
        members = range(args.population)
        rewards = [float(i % 3 - 1) for i in members]
        step = {"seeds": list(members), "signs": [1] * len(rewards), "rewards": rewards, "sigma": 1e-3, "alpha": 5e-4}
        replay = ESWeights(lambda: {k: v.clone() for k, v in master.items()}, lambda named: None, device=device)
        for v in range(1, args.versions + 1):
            replay.add_step(v, step)
        started = time.perf_counter()
        center = replay.center(args.versions)
        _synchronize(torch, device)
        replay_s = (time.perf_counter() - started) / args.versions
        center_digest = digest(center)
    finally:
        engine.close()
    n, p = statistics.median(noise_s), statistics.median(switch_s)
    return {
        "bench": "es",
        "engine": engine_name,
        **devices.describe(device),
        "parameters": params,
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "noise_only_s": round(n, 3),
        "perturb_restore_s": round(p, 3),
        "ratio": round(p / n, 3),
        "population": args.population,
        "versions": args.versions,
        "replay_s_per_version": round(replay_s, 3),
        "center_digest": center_digest[:16],
    }


def _synchronize(torch, device: str) -> None:
    """A GPU runs kernels asynchronously: wait for them before reading the clock."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def summary(result: dict) -> str:
    return (
        f"es ({result['engine']} on {result.get('gpu', result['device'])}): perturb+restore "
        f"{result['perturb_restore_s']} s, noise alone {result['noise_only_s']} s, ratio {result['ratio']}; replay "
        f"{result['replay_s_per_version']} s per version of {result['population']} members"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = common.add_bench(sub, "es", "ES perturb+restore of the whole model against drawing its noise", bench, summary)
    common.add_engine(p)
    common.add_device(p, "where the weights live and the noise is drawn")
    common.add_model(p)
    p.add_argument("--rounds", type=int, default=3, help="rounds measured; medians are reported (default 3)")
    p.add_argument("--population", type=int, default=8, help="members per replayed step")
    p.add_argument("--versions", type=int, default=2, help="steps replayed")
    common.add_threads(p)
    common.add_ending(p)
