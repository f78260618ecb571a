"""The `hf` engine on the real default model: batched sampling, behaviour logprobs, seeds."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="the hf engine needs torch (make test installs torch==2.13.0)")

from producers.engine import Sampling  # noqa: E402
from producers.engines import choose  # noqa: E402
from producers.hf import lookup_draft  # noqa: E402
from streams.theorems import Theorem  # noqa: E402
from tasks import prompts  # noqa: E402
from tests.producers import cases  # noqa: E402

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


def _without_dropping(engine, call):
    engine.drop_finished = False  # transformers' generate: every row decodes until the longest ends
    try:
        return cases.decoded_rows(engine, call)
    finally:
        engine.drop_finished = True


def test_rows_leave_the_batch_as_they_end_and_greedy_answers_stay_token_identical(hf_engine):
    ids = cases.mixed_ids(hf_engine.tokenizer)
    kept, kept_rows = _without_dropping(hf_engine, lambda: hf_engine.generate(ids, cases.MIXED))
    with cases.one_token_a_step(hf_engine):  # the look-ahead has a test of its own, below
        dropped, rows = cases.decoded_rows(hf_engine, lambda: hf_engine.generate(ids, cases.MIXED))
    lengths = [len(samples[0].token_ids) for samples in dropped]
    assert max(lengths) - min(lengths) >= 16, lengths  # rows that end far apart
    assert [[s.token_ids for s in row] for row in dropped] == [[s.token_ids for s in row] for row in kept]
    assert [s[0].finish_reason for s in dropped] == [s[0].finish_reason for s in kept]
    worst = max(
        abs(a - b)
        for x, y in zip(dropped, kept, strict=True)
        for a, b in zip(x[0].logprobs, y[0].logprobs, strict=True)
    )
    assert worst < 1e-4, worst  # the same fp32 model; only the batch's size differs between the steps
    assert rows == sum(n - 1 for n in lengths)  # each row decoded for its own tokens only
    assert kept_rows == len(ids) * (max(lengths) - 1)


def test_lookup_draft_copies_what_followed_the_latest_match_of_the_longest_ngram():
    assert lookup_draft([1, 2, 3, 9, 1, 2, 3], 5) == [9, 1, 2, 3, 9]  # a loop drafted on past the history's end
    assert lookup_draft([1, 2, 7, 1, 2, 8, 1, 2], 2) == [8, 1]  # the latest earlier [1, 2], not the first
    assert lookup_draft([3, 1, 2, 7, 5, 1, 2, 8, 3, 1, 2], 1) == [7]  # [3, 1, 2] before the later [1, 2]
    assert lookup_draft([4, 5, 6, 5, 4], 3) == []  # no 2-gram repeats (one token is too weak a match)
    assert lookup_draft([1, 2, 1, 2], 0) == []


def test_the_last_rows_of_a_greedy_call_look_ahead_and_write_the_tokens_of_one_at_a_time(hf_engine):
    """Once few rows are left (a step within 16 positions), a greedy step feeds drafted tokens after each row's
    last one and each row keeps those the model chooses itself: a row that repeats itself writes several
    tokens a step. Its tokens are those of one token a step and of transformers' generate; the forward
    passes' rows are fewer."""
    loop = "Repeat the word apple 40 times, separated by spaces."
    chats = [c for c in cases.MIXED_CHATS if not c.startswith("Count")] + [loop]
    ids = [prompts.tokenize(hf_engine.tokenizer, [{"role": "user", "content": c}]) for c in chats]
    sampling = dataclasses.replace(cases.MIXED, max_new_tokens=64)
    with cases.one_token_a_step(hf_engine):
        one, one_rows = cases.decoded_rows(hf_engine, lambda: hf_engine.generate(ids, sampling))
    ahead, ahead_rows = cases.decoded_rows(hf_engine, lambda: hf_engine.generate(ids, sampling))
    generated, _ = _without_dropping(hf_engine, lambda: hf_engine.generate(ids, sampling))
    lengths = [len(samples[0].token_ids) for samples in one]
    assert sorted(lengths)[-2] < max(lengths) == 64, lengths  # the loop runs to the cap, alone at the end
    assert "apple, apple, apple" in one[-1][0].text.lower()
    assert cases.tokens(ahead) == cases.tokens(one) == cases.tokens(generated)
    assert [s[0].finish_reason for s in ahead] == [s[0].finish_reason for s in one]
    worst = max(
        abs(a - b) for x, y in zip(ahead, one, strict=True) for a, b in zip(x[0].logprobs, y[0].logprobs, strict=True)
    )
    assert worst < 1e-4, worst
    assert one_rows == sum(n - 1 for n in lengths)
    alone = 64 - sorted(lengths)[-2]  # the loop's steps alone at the end: it saves at least half of them
    assert alone >= 16 and ahead_rows <= one_rows - alone // 2, (ahead_rows, one_rows, alone)


def test_ignore_eos_writes_every_row_to_the_cap_through_its_eos(hf_engine):
    """`Sampling.ignore_eos` (benches at equal work): each row writes max_new_tokens tokens; up to its own EOS
    they are the answer it gives without the flag, and the EOS is among them, not stopped at."""
    ids = cases.mixed_ids(hf_engine.tokenizer)
    natural = hf_engine.generate(ids, cases.MIXED)
    fixed = hf_engine.generate(ids, dataclasses.replace(cases.MIXED, ignore_eos=True))
    cap = cases.MIXED.max_new_tokens
    assert any(s[0].finish_reason == "stop" for s in natural)  # some rows end early by themselves
    for short, full in zip(natural, fixed, strict=True):
        assert len(full[0].token_ids) == cap and full[0].finish_reason == "length"
        assert full[0].token_ids[: len(short[0].token_ids)] == short[0].token_ids
    hf_engine.drop_finished = False
    try:
        with pytest.raises(ValueError, match="ignore_eos needs the engine's own decoding loop"):
            hf_engine.generate(ids, dataclasses.replace(cases.MIXED, ignore_eos=True))
    finally:
        hf_engine.drop_finished = True


def test_sampled_rows_with_logprobs_are_the_same_whichever_rows_have_left(hf_engine):
    """GRPO's sampling: temperature, top-p, n samples a prompt, a seed and behaviour logprobs. Dropping the rows
    that ended changes neither the samples of the seed nor the kept rows' logprobs."""
    ids = cases.mixed_ids(hf_engine.tokenizer)[:3]
    sampling = Sampling(n=3, temperature=0.8, top_p=0.95, max_new_tokens=32, seed=11, logprobs=True)
    kept, kept_rows = _without_dropping(hf_engine, lambda: hf_engine.generate(ids, sampling))
    dropped, rows = cases.decoded_rows(hf_engine, lambda: hf_engine.generate(ids, sampling))
    lengths = [len(s.token_ids) for samples in dropped for s in samples]
    assert len(set(lengths)) > 1, lengths
    assert [[s.token_ids for s in row] for row in dropped] == [[s.token_ids for s in row] for row in kept]
    pairs = [
        (a, b)
        for x, y in zip(dropped, kept, strict=True)
        for s, t in zip(x, y, strict=True)
        for a, b in zip(s.logprobs, t.logprobs, strict=True)
    ]
    assert len(pairs) == sum(lengths)
    assert max(abs(a - b) for a, b in pairs) < 1e-5
    assert rows == sum(n - 1 for n in lengths) < kept_rows == len(lengths) * (max(lengths) - 1)


def test_engine_choice():
    from producers.engine import EngineUnavailable
    from producers.engines import vllm_usable

    assert choose("hf") == "hf"
    assert choose("auto") == ("vllm" if vllm_usable() is None else "hf")
    with pytest.raises(EngineUnavailable, match="unknown engine"):
        choose("tgi")
