"""Low-rank ES members through the hf engine's batched path (`es_members`) on the real default model, against
the same members written into the weights (weights/es.py `perturbed`): tokens equal, logprobs within fp32
rounding, whichever members share the batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the hf engine needs torch (make test installs torch==2.13.0)")

from producers.engine import Sampling  # noqa: E402
from streams.theorems import Theorem  # noqa: E402
from tasks import prompts  # noqa: E402
from tests.producers.conftest import needs_model  # noqa: E402
from weights.es import ESWeights, digest, load_master  # noqa: E402
from weights.step import ESStep  # noqa: E402

THEOREMS = [
    Theorem("cd-1", "countdown", numbers=[3, 5, 7], target=22),
    Theorem("cd-2", "countdown", numbers=[10, 4], target=6),
    Theorem("cd-3", "countdown", numbers=[2, 9, 4], target=26),
]
GREEDY = Sampling(n=1, temperature=0.0, max_new_tokens=24, logprobs=True)
MEMBERS = [(11, 1), (11, -1), (12, 1), (13, 1)]
SIGMA, RANK = 0.01, 4  # sigma large enough that every member answers otherwise than the center somewhere


def _tokens(rows):
    return [[s.token_ids for s in row] for row in rows]


@needs_model
def test_batched_low_rank_members_answer_as_the_same_members_written_into_the_weights(hf_engine):
    ids = [prompts.tokenize(hf_engine.tokenizer, prompts.messages(t)) for t in THEOREMS]
    try:
        batched = hf_engine.es_members(0, MEMBERS, SIGMA, RANK, ids, GREEDY)
        alone = hf_engine.es_members(0, [MEMBERS[2]], SIGMA, RANK, ids, GREEDY)[0]
        others = hf_engine.es_members(0, [MEMBERS[3], MEMBERS[2]], SIGMA, RANK, ids, GREEDY)[1]
        center = hf_engine.generate(ids, GREEDY)
        assert hf_engine.es.current[1] is None  # the batched path left the center in the weights
        written = []
        for seed, sign in MEMBERS:
            hf_engine.es_use(0, seed, sign, SIGMA, RANK)
            written.append(hf_engine.generate(ids, GREEDY))
    finally:
        hf_engine.es_use(0, None)
    assert len(batched) == len(MEMBERS) and all(len(rows) == len(THEOREMS) for rows in batched)
    for member, (got, want) in enumerate(zip(batched, written, strict=True)):
        assert _tokens(got) == _tokens(want), member
        assert _tokens(got) != _tokens(center), member  # the member's term did change its answers
        for row, ref in zip(got, want, strict=True):
            diffs = [abs(a - b) for a, b in zip(row[0].logprobs, ref[0].logprobs, strict=True)]
            assert max(diffs) < 1e-4, (member, max(diffs))
    assert _tokens(batched[0]) != _tokens(batched[1])  # antithetic twins are two members
    assert _tokens(alone) == _tokens(batched[2]) == _tokens(others)  # its batch-mates change nothing


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
