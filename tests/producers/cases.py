"""What the engine tests share: the Countdown prompts and low-rank members of test_hf_lowrank.py and
test_vllm_lowrank.py with their oracle (each member written into the weights in turn), and what a vLLM
engine's worker holds (its extension's figures, asked over vLLM's RPC as the engine asks it everything)."""

from __future__ import annotations

import contextlib
from typing import Any

from producers.engine import Sampling
from streams.theorems import Theorem
from tasks import prompts

THEOREMS = [
    Theorem("cd-1", "countdown", numbers=[3, 5, 7], target=22),
    Theorem("cd-2", "countdown", numbers=[10, 4], target=6),
    Theorem("cd-3", "countdown", numbers=[2, 9, 4], target=26),
]
GREEDY = Sampling(n=1, temperature=0.0, max_new_tokens=24, logprobs=True)
MEMBERS = [(11, 1), (11, -1), (12, 1), (13, 1)]
SIGMA, RANK = 0.01, 4  # sigma large enough that every member answers otherwise than the center somewhere


# Chats whose greedy answers end far apart (8 to 32+ tokens on the default model), and one Countdown prompt:
# the rows of one call leave the batch at very different steps (producers/hf.py `_decode`).
MIXED_CHATS = (
    "Answer with one word: what colour is the sky?",
    "Count from 1 to 40, separated by commas.",
    "Say hello.",
    "What is 2+2? Reply with the number only.",
)
MIXED = Sampling(n=1, temperature=0.0, max_new_tokens=32, logprobs=True)


def prompt_ids(tokenizer) -> list[list[int]]:
    return [prompts.tokenize(tokenizer, prompts.messages(t)) for t in THEOREMS]


def mixed_ids(tokenizer) -> list[list[int]]:
    chats = [prompts.tokenize(tokenizer, [{"role": "user", "content": c}]) for c in MIXED_CHATS]
    return chats + prompt_ids(tokenizer)[:1]


def decoded_rows(engine, call):
    """(call(), rows the model decoded after the prefill): the batch size of every forward pass of the hf
    engine's model but the first, summed, as its output layer sees them. A row that wrote n tokens needs n - 1
    of them; a call that keeps every row until its longest ends pays rows x (longest - 1)."""
    sizes: list[int] = []
    handle = engine.model.lm_head.register_forward_hook(lambda module, args, out: sizes.append(args[0].shape[0]))
    try:
        out = call()
    finally:
        handle.remove()
    return out, sum(sizes[1:])


@contextlib.contextmanager
def one_token_a_step(engine):
    """The hf engine without its look-ahead (`lookahead` 0): every step writes one token a row, so the rows a
    call decoded are the tokens its rows wrote (what the row-dropping tests count)."""
    engine.lookahead, kept = 0, engine.lookahead
    try:
        yield engine
    finally:
        engine.lookahead = kept


def tokens(rows) -> list[list[list[int]]]:
    return [[s.token_ids for s in row] for row in rows]


def written_in_turn(engine, members, ids, sampling: Sampling, rank: int = RANK) -> list:
    """The oracle of the batched paths: each member (seed, sign) of center 0 written into the weights with
    `es_use`, its prompts generated, [member][prompt][sample]; the center put back afterwards."""
    try:
        out = []
        for seed, sign in members:
            engine.es_use(0, seed, sign, SIGMA, rank)
            out.append(engine.generate(ids, sampling))
        return out
    finally:
        engine.es_use(0, None)


def worker_state(engine) -> dict[str, Any]:
    """A vLLM engine's worker extension's figures (producers/vllm_worker.py `es_stats`): the weights it holds
    (`current`), its writes and what the last one loaded."""
    return engine.llm.collective_rpc("es_stats")[0]
