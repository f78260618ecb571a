"""The generator and ES benchmarks run end to end at a tiny size and print their JSON (figures are not
asserted: they are measurements, recorded in docs/PERFORMANCE.md from quiet-machine runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.producers.conftest import needs_model

ROOT = Path(__file__).resolve().parents[2]


def _bench(*argv: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "ops", "bench", *argv, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _es_throughput(*argv: str) -> dict:
    """`bench es-throughput` on 2 members x 2 problems, one token a row a step (`--lookahead 0`), so the rows
    decoded follow from the tokens (the look-ahead feeds drafted tokens to calls of 8 rows or fewer; it has a
    test of its own in tests/producers/test_hf_engine.py)."""
    return _bench("es-throughput", "--population", "2", "--problems", "2", "--lookahead", "0", *argv)


@needs_model
def test_bench_generator_prints_its_figures_and_both_sides_made_the_same_tokens():
    out = _bench("generator", "--orders", "1", "--prompts", "2", "--n", "2", "--max-new-tokens", "6", "--rounds", "1")
    assert out["bench"] == "generator" and out["engine"] == "hf"
    assert out["device"] == "cpu" and out["cpu_threads"] >= 1  # auto, on a machine without a GPU
    assert out["tokens"] == out["raw_tokens"] and out["tokens"][0] > 0  # same seeds, same weights, same tokens
    assert out["tokens_per_s"] > 0 and out["raw_tokens_per_s"] > 0 and out["ratio"] > 0


@needs_model
def test_bench_es_prints_its_figures():
    out = _bench("es", "--rounds", "1", "--population", "1", "--versions", "1", "--threads", "1")
    assert out["parameters"] == 134_515_008 and out["device"] == "cpu"
    assert {"noise_only_s", "perturb_restore_s", "ratio", "replay_s_per_version"} <= out.keys()
    assert out["perturb_restore_s"] > 0 and out["noise_only_s"] > 0


@needs_model
def test_bench_es_throughput_prints_the_three_ways_and_their_ratios():
    out = _es_throughput("--max-new-tokens", "4", "--rank", "2")
    assert out["lookahead"] == 0
    assert out["bench"] == "es-throughput" and out["device"] == "cpu" and out["rows"] == 4
    for way in ("inference", "lowrank", "full"):
        assert 0 < out[way]["tokens"] <= 4 * 4 and out[way]["tokens_per_s"] > 0, way
        assert 1 <= out[way]["longest"] <= 4 and out[way]["tokens"] / (4 * 4) <= out[way]["useful"] <= 1, way
    # inference: the two rows of each prompt are the same greedy answer; one call of 4 rows decodes as long as
    # its longest row, so its useful share is the rows' mean length over the longest
    assert out["inference"]["useful"] == round(out["inference"]["tokens"] / (4 * out["inference"]["longest"]), 3)
    assert out["ratio"] == round(out["lowrank"]["tokens_per_s"] / out["inference"]["tokens_per_s"], 3)
    assert out["full_ratio"] == round(out["full"]["tokens_per_s"] / out["inference"]["tokens_per_s"], 3)


def test_bench_es_throughput_at_fixed_length_gives_every_way_the_same_work(tmp_path):
    """`--fixed-length`: every row writes --max-new-tokens tokens whatever it writes (EOS not stopped at), so
    each way's tokens are rows x tokens, whichever answers the members give. `--out`: the same JSON in a file
    (every bench takes it; es-throughput once did not)."""
    written = tmp_path / "es-throughput.json"
    out = _es_throughput("--max-new-tokens", "6", "--fixed-length", "--out", str(written))
    assert json.loads(written.read_text()) == out
    assert out["fixed_length"] is True
    for way in ("inference", "lowrank", "full"):
        assert (out[way]["tokens"], out[way]["longest"], out[way]["useful"]) == (4 * 6, 6, 1.0), way


def test_every_model_bench_refuses_cuda_where_torch_sees_no_gpu_instead_of_measuring_the_cpu():
    """The first GPU box: `bench es` reported the CPU's numbers because nothing placed it on the GPU. Asked for
    cuda where there is none, a bench says so and measures nothing."""
    import torch

    if torch.cuda.is_available():
        return  # a GPU box: `make gpu-check` runs the benches there
    for bench in ("es", "es-throughput", "generator", "grpo"):
        done = subprocess.run(
            [sys.executable, "-m", "ops", "bench", bench, "--device", "cuda", "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and done.stdout == "", (bench, done.stdout, done.stderr[-500:])
        assert done.stderr.startswith("ops: --device cuda, but torch") and "no CUDA device" in done.stderr, bench
