"""Low-rank ES members through the hf engine's batched path (`es_members`) on the real default model, against
the same members written into the weights (weights/es.py `perturbed`): tokens equal, logprobs within fp32
rounding, whichever members share the batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the hf engine needs torch (make test installs torch==2.13.0)")

from tests.producers import cases  # noqa: E402
from tests.producers.cases import GREEDY, MEMBERS, RANK, SIGMA, tokens  # noqa: E402
from tests.producers.conftest import needs_model  # noqa: E402
from weights.es import ESWeights  # noqa: E402
from weights.io import digest, load_master  # noqa: E402
from weights.step import ESStep  # noqa: E402


@pytest.mark.slow  # minutes of real-model work: its file is handed out first (tests/conftest.py)
@needs_model
def test_batched_low_rank_members_answer_as_the_same_members_written_into_the_weights(hf_engine):
    ids = cases.prompt_ids(hf_engine.tokenizer)
    try:
        batched = hf_engine.es_members(0, MEMBERS, SIGMA, RANK, ids, GREEDY)
        alone = hf_engine.es_members(0, [MEMBERS[2]], SIGMA, RANK, ids, GREEDY)[0]
        others = hf_engine.es_members(0, [MEMBERS[3], MEMBERS[2]], SIGMA, RANK, ids, GREEDY)[1]
        center = hf_engine.generate(ids, GREEDY)
        assert hf_engine.es.current[1] is None  # the batched path left the center in the weights
    finally:
        hf_engine.es_use(0, None)
    written = cases.written_in_turn(hf_engine, MEMBERS, ids, GREEDY)
    assert len(batched) == len(MEMBERS) and all(len(rows) == len(cases.THEOREMS) for rows in batched)
    for member, (got, want) in enumerate(zip(batched, written, strict=True)):
        assert tokens(got) == tokens(want), member
        assert tokens(got) != tokens(center), member  # the member's term did change its answers
        for row, ref in zip(got, want, strict=True):
            diffs = [abs(a - b) for a, b in zip(row[0].logprobs, ref[0].logprobs, strict=True)]
            assert max(diffs) < 1e-4, (member, max(diffs))
    assert tokens(batched[0]) != tokens(batched[1])  # antithetic twins are two members
    assert tokens(alone) == tokens(batched[2]) == tokens(others)  # its batch-mates change nothing


@pytest.mark.slow
@needs_model
def test_members_whose_rows_end_far_apart_answer_as_their_weights_written_in_full(hf_engine):
    """Rows leave the batch as they end (producers/hf.py `_decode`), so the members' row counts differ in the
    later steps: each kept row must keep its own member's term."""
    ids = cases.mixed_ids(hf_engine.tokenizer)
    try:
        with cases.one_token_a_step(hf_engine):  # rows counted one token a step
            batched, rows = cases.decoded_rows(
                hf_engine, lambda: hf_engine.es_members(0, MEMBERS, SIGMA, RANK, ids, cases.MIXED)
            )
    finally:
        hf_engine.es_use(0, None)
    written = cases.written_in_turn(hf_engine, MEMBERS, ids, cases.MIXED)
    lengths = [[len(row[0].token_ids) for row in member] for member in batched]
    assert max(map(max, lengths)) - min(map(min, lengths)) >= 16, lengths
    assert any(len({member[p] for member in lengths}) > 1 for p in range(len(ids)))  # members end apart
    assert rows == sum(n - 1 for member in lengths for n in member)  # each row decoded for its own tokens
    for member, (got, want) in enumerate(zip(batched, written, strict=True)):
        assert tokens(got) == tokens(want), member
        for row, ref in zip(got, want, strict=True):
            diffs = [abs(a - b) for a, b in zip(row[0].logprobs, ref[0].logprobs, strict=True)]
            assert max(diffs) < 1e-4, (member, max(diffs))


@needs_model
def test_the_engine_replays_a_low_rank_history_to_the_bits_of_an_independent_replay(hf_engine, model_path):
    step = ESStep((21, 22, 23, 24), (1, -1, 1, -1), (1.0, -1.0, 0.5, -0.5), SIGMA, 0.05, "lowrank", RANK)
    replay = ESWeights(lambda: load_master(model_path), lambda named: None)
    replay.add_step(1, step)
    try:
        hf_engine.es_add_step(1, step.to_dict())
        got = hf_engine.es_digest(1)
        hf_engine.es_use(1, None)
        live = {k: v.detach().clone() for k, v in hf_engine.model.state_dict().items()}
    finally:
        hf_engine.es_forget_after(0)
        hf_engine.es_use(0, None)
    center = replay.center(1)
    assert got == digest(center)
    base = load_master(model_path)
    assert torch.equal(live["model.layers.5.mlp.up_proj.weight"], center["model.layers.5.mlp.up_proj.weight"])
    assert not torch.equal(center["model.layers.5.mlp.up_proj.weight"], base["model.layers.5.mlp.up_proj.weight"])
    assert torch.equal(center["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert torch.equal(center["model.norm.weight"], base["model.norm.weight"])
