"""The `hf` engine on the real default model: batched sampling, behaviour logprobs, seeds."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the hf engine needs torch (make test installs torch==2.13.0)")

from producers.engine import Sampling  # noqa: E402
from producers.engines import choose  # noqa: E402
from streams.theorems import Theorem  # noqa: E402
from tasks import prompts  # noqa: E402

THEOREMS = [
    Theorem("cd-1", "countdown", numbers=[3, 5, 7], target=22),
    Theorem("cd-2", "countdown", numbers=[10, 4], target=6),
]


def _prompts(engine):
    return [prompts.tokenize(engine.tokenizer, prompts.messages(t)) for t in THEOREMS]


def test_behaviour_logprobs_match_a_separate_forward_pass(hf_engine):
    ids = _prompts(hf_engine)
    out = hf_engine.generate(ids, Sampling(n=3, temperature=1.0, max_new_tokens=12, seed=5, logprobs=True))
    assert [len(samples) for samples in out] == [3, 3]
    worst = 0.0
    for prompt, samples in zip(ids, out, strict=True):
        for s in samples:
            assert len(s.logprobs) == len(s.token_ids) > 0
            assert s.finish_reason in ("stop", "length")
            with torch.no_grad():
                logits = hf_engine.model(torch.tensor([prompt + s.token_ids])).logits[0].float()
            ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(1, torch.tensor(s.token_ids)[:, None])
            worst = max(worst, float((ref.squeeze(1) - torch.tensor(s.logprobs)).abs().max()))
    # The same fp32 weights; the difference is the KV-cache path against one full pass (float rounding).
    assert worst < 1e-3, worst


def test_the_same_seed_gives_the_same_samples_and_another_seed_others(hf_engine):
    ids = _prompts(hf_engine)
    a = hf_engine.generate(ids, Sampling(n=2, temperature=1.0, max_new_tokens=10, seed=42))
    b = hf_engine.generate(ids, Sampling(n=2, temperature=1.0, max_new_tokens=10, seed=42))
    c = hf_engine.generate(ids, Sampling(n=2, temperature=1.0, max_new_tokens=10, seed=43))
    tokens = lambda out: [s.token_ids for samples in out for s in samples]  # noqa: E731
    assert tokens(a) == tokens(b)
    assert tokens(a) != tokens(c)
    assert a[0][0].logprobs is None  # asked for none, paid for none


def test_greedy_samples_of_one_prompt_are_identical_and_stop_at_eos(hf_engine):
    ids = _prompts(hf_engine)[:1]
    (samples,) = hf_engine.generate(ids, Sampling(n=2, temperature=0, max_new_tokens=200))
    assert samples[0].token_ids == samples[1].token_ids
    eos = hf_engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    if samples[0].finish_reason == "stop":
        assert samples[0].token_ids[-1] == eos and eos not in samples[0].token_ids[:-1]
    else:
        assert len(samples[0].token_ids) == 200
    assert "<|im_end|>" not in samples[0].text
    assert hf_engine.stats.generated_tokens > 0 and hf_engine.stats.as_dict()["tokens_per_s"] > 0


def test_engine_choice():
    from producers.engine import EngineUnavailable
    from producers.engines import vllm_usable

    assert choose("hf") == "hf"
    assert choose("auto") == ("vllm" if vllm_usable() is None else "hf")
    with pytest.raises(EngineUnavailable, match="unknown engine"):
        choose("tgi")
