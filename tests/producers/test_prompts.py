"""Prompt formats and extraction, on what the real default model writes (sampled and greedy, fixed seeds).

SmolLM2-135M rarely writes a fenced Lean block unprompted, so one case continues the assistant's turn
from an opened ```lean4 fence and the restated statement, as Kimina-Prover's answers look: the model's own
continuation is then the proof, cut off or closed as it happens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streams.theorems import Theorem
from tasks import countdown, lean, prompts
from tasks.countdown_check import check
from tasks.lean_proof import IntegrityError, extract_proof_body

DATA = Path(__file__).resolve().parents[2] / "data" / "minif2f.jsonl"
ROWS = [json.loads(line) for line in DATA.read_text().splitlines()[:1]] if DATA.exists() else []
LEAN = [
    Theorem(r["name"], "lean", statement=r["formal_statement"], header=r["header"], informal=r["informal_prefix"])
    for r in ROWS
]
COUNTDOWN = [
    Theorem("cd-1", "countdown", numbers=[3, 5, 7], target=22),
    Theorem("cd-2", "countdown", numbers=[6, 2], target=3),
]


def _continue(engine, chat, prefix, sampling):
    ids = prompts.tokenize(engine.tokenizer, chat) + engine.tokenizer(prefix, add_special_tokens=False).input_ids
    (samples,) = engine.generate([ids], sampling)
    return [prefix + s.text for s in samples]


@pytest.mark.skipif(not ROWS, reason=f"{DATA} not present")
def test_lean_attempts_from_real_outputs_keep_the_statement_and_pass_integrity(hf_engine):
    from producers.engine import Sampling

    for theorem in LEAN:
        for fmt in lean.LEAN_FORMATS:
            chat = prompts.messages(theorem, fmt)
            prefix = f"Here is the proof.\n```lean4\n{theorem.header}{theorem.statement}"
            for text in _continue(hf_engine, chat, prefix, Sampling(n=2, temperature=0.8, max_new_tokens=24, seed=3)):
                attempt = lean.extract_lean(text)
                assert attempt.startswith(theorem.header + theorem.statement.rstrip("\n"))
                assert "```" not in attempt and attempt in text
                body = extract_proof_body(attempt, theorem.statement)
                assert not isinstance(body, IntegrityError), (attempt, body)
                assert attempt.endswith(body.rstrip("\n")) or not body.strip()


@pytest.mark.skipif(not ROWS, reason=f"{DATA} not present")
def test_unprompted_real_outputs_give_a_block_of_the_output_or_nothing(hf_engine):
    from producers.engine import Sampling

    ids = [prompts.tokenize(hf_engine.tokenizer, prompts.messages(t, f)) for t in LEAN for f in lean.LEAN_FORMATS]
    outputs = hf_engine.generate(ids, Sampling(n=2, temperature=1.0, max_new_tokens=40, seed=11))
    for samples in outputs:
        for s in samples:
            attempt = lean.extract_lean(s.text)
            assert attempt == "" or ("```" not in attempt and attempt in s.text)


def test_a_prefilled_chat_is_left_open_for_the_model(hf_engine):
    """The real chat template: a chat ending with the assistant's message (the `equation` prompt's "<answer> ")
    is continued, not closed; one ending with the user's asks for the assistant's turn."""
    t = COUNTDOWN[0]
    opened = hf_engine.tokenizer.decode(prompts.tokenize(hf_engine.tokenizer, prompts.messages(t, "equation")))
    asked = hf_engine.tokenizer.decode(prompts.tokenize(hf_engine.tokenizer, prompts.messages(t, "tinyzero")))
    assert opened.endswith("<|im_end|>\n<|im_start|>assistant\n<answer> ") and opened.count("<|im_end|>") == 2
    assert asked.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_countdown_attempts_from_real_outputs_are_judged(hf_engine):
    from producers.engine import Sampling

    ids = [prompts.tokenize(hf_engine.tokenizer, prompts.messages(t)) for t in COUNTDOWN]
    outputs = hf_engine.generate(ids, Sampling(n=4, temperature=1.0, max_new_tokens=48, seed=2))
    answered = 0
    for theorem, samples in zip(COUNTDOWN, outputs, strict=True):
        for s in samples:
            attempt = countdown.extract_countdown(s.text)
            if "<answer>" in s.text and "</answer>" in s.text:
                answered += 1
                inner = attempt.removeprefix("<answer>").removesuffix("</answer>")
                assert attempt.startswith("<answer>") and inner in s.text and "<answer>" not in inner
            else:
                assert len(attempt) <= countdown.MAX_COUNTDOWN_CHARS and attempt in s.text
            result = check(theorem.numbers, theorem.target, attempt)  # judged, never an exception
            assert result.reason in ("", "format", "numbers", "value", "syntax")
    # Continue the turn from an opened <answer> tag: the extraction is the model's expression, tags gone.
    chat = prompts.messages(COUNTDOWN[0])
    for text in _continue(
        hf_engine, chat, "<think>3 * 7 = 21, 21 + 1</think>\n<answer>", Sampling(n=2, temperature=0, max_new_tokens=16)
    ):
        if "</answer>" in text:
            expression = text.split("<answer>")[-1].split("</answer>")[0].strip()
            assert countdown.extract_countdown(text) == f"<answer>{expression}</answer>"
