"""tasks.lean_proof: the theorem's name, and the code block the verifier reads (the rest of its rules, the
statement and the body after it, are tested with the verifier's checks in tests/verifier_pool/test_lean_check.py)."""

from __future__ import annotations

import pytest

from tasks import lean_proof
from tasks.lean_proof import theorem_name

GCD = "theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 12 := by\n"


@pytest.mark.parametrize(
    ("statement", "name"),
    [
        (GCD, "mathd_numbertheory_188"),
        ("lemma foo.bar' (x : ℕ) : x = x := by\n", "foo.bar'"),
        ("theorem h₀_lemma₁ : True := by\n", "h₀_lemma₁"),
        ("/-- doc: theorem fake -/\ntheorem «my thm» : True := by\n", "«my thm»"),
    ],
)
def test_theorem_name(statement, name):
    assert theorem_name(statement) == name


def test_theorem_name_missing_is_a_configuration_error():
    with pytest.raises(ValueError):
        theorem_name("example : True := by\n")


# --- the verifier's fence reading, pinned (the generator's: tests/tasks/test_prompts.py) ----------------------
# code_block: the whole info line, stripped, must be lean4, lean or empty;
# the block is returned as written (newlines kept); without a block, the rest after an unclosed lean fence,
# else the whole text (the generator extracted it already). Expectations worked out by hand.
VERIFIER_FENCES = [
    ("```lean4 title\nA\n```", "```lean4 title\nA\n```"),  # not a Lean tag: no block, the whole text
    ("```lean 4\nA\n```", "```lean 4\nA\n```"),
    ("```{lean}\nA\n```", "```{lean}\nA\n```"),
    ("```\u00a0lean4\nA\n```", "A\n"),  # str.strip() drops a no-break space
    ("```\u00a0python\nA\n```", "```\u00a0python\nA\n```"),
    ("```LEAN4\n\nA\n\n```", "\nA\n\n"),  # as written
    ("```lean4 \nA", "A"),  # unclosed: the rest after the opener
    ("```Lean4\nA", "A"),  # an unclosed fence's tag in any case
    ("```lean4\t\nA\n```", "A\n"),
    ("```python\nx\n```\n```lean4\nA", "A"),
    ("<think>```lean4\nX\n```</think>```lean4\nY\n```", "Y\n"),  # no reasoning rule: the last block
    ("plain", "plain"),
    ("```lean4\nA\n```", "A\n"),
    ("```lean\nA\n```", "A\n"),
    ("```\nA\n```", "A\n"),  # untagged
    ("``` LEAN4 \nA\n```", "A\n"),  # stripped, any case
    ("```lean4\r\nA\n```", "A\n"),  # a carriage return is whitespace
    ("```python\nA\n```", "```python\nA\n```"),
    ("```python\nA\n```\n```lean4\nB\n```", "B\n"),
    ("```lean4\nA\n```\n```lean4\nB\n```", "B\n"),  # the last block
    ("```lean4\nA\n```\n```lean4\nB", "A\n"),  # a closed block wins over a later unclosed fence
    ("```lean4\nA ```lean4\nB\n```", "A "),  # the first three backticks close the block
    ("````lean4\nA\n````", "A\n"),  # four backticks: the fence starts at the second
    ("```lean4 ```\nA\n```", "A\n"),  # a backtick in the info line: the fence starts at the next three
    ("```lean4", "```lean4"),  # no newline: no fence
]


@pytest.mark.parametrize(("text", "code"), VERIFIER_FENCES)
def test_verifier_fence_reading_is_pinned(text, code):
    block = lean_proof.code_block(text)
    assert (text if block is None else block) == code  # extract_proof_body's reading: no fence, the whole text
