"""tasks.lean_text: the lexer reads code, comments and literals as Lean does (tests/verifier_pool/test_lean_check.py
compares it with the per-character reference on random text)."""

from __future__ import annotations

import re

import pytest

from tasks import lean_text
from tasks.lean_text import code_tokens, is_id_first, is_id_rest, lex, mask_comments


def kinds(text: str) -> list[tuple[str, str]]:
    return [(t.kind, t.text) for t in lex(text)]


def test_nested_and_doc_comments_are_comments():
    assert kinds("/- a /- b -/ sorry -/ simp") == [("comment", "/- a /- b -/ sorry -/"), ("ident", "simp")]
    assert kinds("/-- doc sorry -/ x") == [("comment", "/-- doc sorry -/"), ("ident", "x")]
    assert kinds("/-! mod -/ x -- sorry\ny") == [
        ("comment", "/-! mod -/"),
        ("ident", "x"),
        ("comment", "-- sorry"),
        ("ident", "y"),
    ]


def test_doc_comment_body_starts_after_its_third_character():
    # Lean reads `/--` as a token and the comment body after it: `/--/` does not close the comment.
    assert kinds('/--/ " -/ exact sorry -- "')[:3] == [("comment", '/--/ " -/'), ("ident", "exact"), ("ident", "sorry")]


def test_strings_with_escapes_hide_their_contents():
    assert kinds(r'"a \" sorry -/ /-" b') == [("string", r'"a \" sorry -/ /-"'), ("ident", "b")]
    assert kinds('"-- not a comment" c') == [("string", '"-- not a comment"'), ("ident", "c")]


def test_comment_markers_inside_comments_follow_lean():
    # A block comment knows nothing of strings: the first unnested -/ closes it.
    assert kinds('/- "-/ sorry "x"') == [("comment", '/- "-/'), ("ident", "sorry"), ("string", '"x"')]


def test_char_literals_and_primes():
    assert kinds("h' x'' 'a' '\\n' '\\x41'") == [
        ("ident", "h'"),
        ("ident", "x''"),
        ("char", "'a'"),
        ("char", "'\\n'"),
        ("char", "'\\x41'"),
    ]
    # Preimage and image notation: the quote belongs to a symbol, nothing is swallowed.
    assert [t.text for t in code_tokens("f ⁻¹' {7}")] == ["f", "⁻¹'", "{", "7", "}"]
    assert [t.text for t in code_tokens("xs[i]'h' + ∑' n, f n")][3:7] == ["]'", "h'", "+", "∑'"]
    # A known quote-ending token followed by a string: the string is a string, as Lean reads it.
    assert kinds('f ⁻¹\'"x" sorry')[1:] == [("symbol", "⁻¹'"), ("string", '"x"'), ("ident", "sorry")]
    assert [t.text for t in code_tokens("f '' {x | 0 ≤ f x}")][:3] == ["f", "''", "{"]


def test_identifiers_dotted_guillemets_unicode_and_bang_question():
    assert kinds("Nat.succ_le_iff h₀ hₙ «my thm».x ℝ α exact? s! x.1") == [
        ("ident", "Nat.succ_le_iff"),
        ("ident", "h₀"),
        ("ident", "hₙ"),
        ("ident", "«my thm».x"),
        ("ident", "ℝ"),
        ("ident", "α"),
        ("ident", "exact?"),
        ("ident", "s!"),
        ("ident", "x"),
        ("symbol", "."),
        ("number", "1"),
    ]


def test_attributes_hash_commands_and_positions():
    tokens = code_tokens("@[simp] x\n  #eval 1\n#[1, 2]")
    assert [(t.kind, t.text) for t in tokens][:3] == [("symbol", "@["), ("ident", "simp"), ("symbol", "]")]
    ev = next(t for t in tokens if t.kind == "hash")
    assert (ev.text, ev.line, ev.col) == ("#eval", 2, 2)
    assert not [t for t in tokens if t.kind == "hash" and t.line == 3]  # #[ is an array literal


def test_raw_strings_end_at_their_own_delimiter():
    assert kinds('r"a\\d" sorry') == [("string", 'r"a\\d"'), ("ident", "sorry")]
    assert kinds('r#"abc"# c') == [("string", 'r#"abc"#'), ("ident", "c")]
    # Lean without raw strings reads `r` then a plain string that ends elsewhere: the two readings disagree.
    assert kinds('r"\\" sorry') == [("ambiguous", 'r"\\"'), ("ident", "sorry")]
    assert kinds('r#"a"b"# c') == [("ambiguous", 'r#"a"b"#'), ("ident", "c")]


def test_interpolated_strings_expose_their_code():
    assert ("ident", "sorry") in kinds('s!"x = {(sorry : Nat)}"')
    assert kinds('"{"}"')[0][0] == "ambiguous"  # plain vs interpolated reading end in different places


@pytest.mark.parametrize(
    ("text", "is_closed"),
    [
        ("lemma h : True := trivial\n", True),
        ("a -- a line comment ends at the newline after it", True),
        ('a "b" c', True),
        ('x s!"a{x} b"', True),
        ('lemma h : s = "abc', False),  # a string runs on
        ('x "a\\"', False),  # its last quote escaped
        ("/- a", False),
        ("/- /- -/", False),  # nested: one level still open
        ('x s!"a{x   ', False),  # inside an interpolation's braces: what follows would be its code
        ('x s!"a{x} b', False),
    ],
)
def test_closed_says_whether_text_after_it_is_read_as_code(text, is_closed):
    assert lean_text.closed(text) is is_closed


def test_mask_comments_keeps_offsets():
    text = "a /- x\ny -/ b -- c"
    masked = mask_comments(text)
    assert len(masked) == len(text) and masked.split() == ["a", "b"] and masked.count("\n") == 1


def test_identifier_classes_agree_with_the_functions_at_every_code_point():
    first, rest = re.compile(lean_text.ID_FIRST_CLASS), re.compile(lean_text.ID_REST_CLASS)
    for v in range(0x110000):
        c = chr(v)
        assert (first.match(c) is not None) == is_id_first(c), hex(v)
        assert (rest.match(c) is not None) == is_id_rest(c), hex(v)
