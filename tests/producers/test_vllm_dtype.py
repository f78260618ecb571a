"""The engines' `--dtype`, without vLLM: `auto` is bf16 only where the device computes in it (on this
machine's AVX2-only CPU vLLM's bf16 ran at a third of fp32's tokens/s, docs/GENERATOR.md, and a `make run`
that took bf16 there crawled at 10.8 tokens/s), and a precision no engine holds is refused before anything
loads."""

from __future__ import annotations

import pytest

from producers.vllm_engine import VLLMEngine, auto_dtype

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"  # this machine's AMD EPYC, abridged
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_auto_is_bf16_on_a_gpu_and_on_a_cpu_with_bf16_and_fp32_on_one_without():
    assert auto_dtype("cuda", AVX2_ONLY) == "bfloat16"
    assert auto_dtype("cpu", SAPPHIRE_RAPIDS) == "bfloat16"
    assert auto_dtype("cpu", GRAVITON3) == "bfloat16"
    assert auto_dtype("cpu", AVX2_ONLY) == "float32"
    assert auto_dtype("cpu", "") == "float32"


def test_both_engines_refuse_a_precision_they_cannot_hold_before_loading_anything(tmp_path):
    hf = pytest.importorskip("producers.hf", reason="the hf engine needs torch and transformers")
    nowhere = tmp_path / "no-model"  # never read: the dtype is refused first
    for engine in (hf.HFEngine, VLLMEngine):
        with pytest.raises(ValueError, match=r"dtype 'int8': use auto or one of bfloat16, float16, float32"):
            engine(nowhere, dtype="int8", device="cpu")
