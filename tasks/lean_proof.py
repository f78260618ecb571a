"""A Lean proof in a model's text: the code block, the canonical statement restated in it, the proof body
after it, and the command assembled from trusted parts. The Lean task's text rules that both the verifier
(verifier_pool.lean_check.prepare, before its scan for forbidden constructs) and the trainer's loader
(tasks.lean.lean_problem: is a statement checkable at all) apply, so they live below both.

Judging code: its digest joins the verdict cache key with lean_text's (verifier_pool.checkers), and it is
kept apart from tasks/lean.py (prompts and loaders) so that editing a prompt does not retire cached verdicts.
Model text is untrusted and may be megabytes long: everything here is linear in it (a fence opener is also a
closer, so `.*?` scans from at most one unclosed opener to the end).
"""

from __future__ import annotations

import re
import textwrap
from collections import deque
from dataclasses import dataclass

from tasks.lean_text import Token, code_tokens, comments, is_id_rest, lex

# A fence: ``` and its info line (spaces, a run of letters and digits, anything but a backtick), a body, ```.
# The possessive `*+` read the info line greedily without backtracking: `([A-Za-z0-9]*)[^\n`]*` made an info
# line of k letters or spaces cost k^2 steps before failing.
_FENCE = re.compile(r"```([ \t]*+([A-Za-z0-9]*+)[^\n`]*+)\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[ \t]*+(?:lean4|lean)[ \t]*\n", re.IGNORECASE)
LEAN_TAGS = ("", "lean", "lean4")  # an info line naming Lean, lowercased (or none: an untagged block)
_WHITESPACE_RUN = re.compile(r"\s+")
_SPACE_RUN = re.compile(r"  +")


@dataclass(frozen=True, slots=True)
class IntegrityError:
    """A value, not an exception: the model text does not carry the canonical statement (missing, altered)."""

    detail: str


@dataclass(frozen=True, slots=True)
class TermBody:
    """A term-mode proof body: the model wrote `theorem X : P := term` where the canonical statement says
    `:= by`. Lean reads both the same way once assembled as the canonical statement without its `by`."""

    text: str


def code_block(text: str, first_word: bool = False) -> str | None:
    """The body of the last fenced Lean block in `text`, as written; else the text after the last unclosed
    ```lean4 (or ```lean) fence, a generation cut off by its token limit; None when there is neither.

    Which info line names Lean (LEAN_TAGS, any case): by default, the verifier's reading, the whole line
    stripped of whitespace; with `first_word`, the generator's (tasks.lean.extract_lean), its leading run of
    letters and digits after spaces and tabs, so ```lean4 title, ```lean 4 and ```{lean} (no run: untagged)
    count too. Every block the first reading accepts the second accepts, so the verifier reading a
    generator's attempt finds no block in it and takes it whole."""
    blocks = [
        body for info, word, body in _FENCE.findall(text) if (word if first_word else info.strip()).lower() in LEAN_TAGS
    ]
    if blocks:
        return blocks[-1]
    opened = deque(_OPEN_FENCE.finditer(text), maxlen=1)  # the last one, without a list of them all
    return text[opened[0].end() :] if opened else None


def theorem_name(formal_statement: str) -> str:
    """NAME in `theorem NAME` or `lemma NAME`, spelled as written (dots, primes, subscripts, `«»` kept).
    A statement without one is a configuration error, not a verdict: ValueError."""
    tokens = code_tokens(formal_statement)
    for keyword, name in zip(tokens, tokens[1:], strict=False):
        if keyword.kind == "ident" and keyword.text in ("theorem", "lemma") and name.kind == "ident":
            return name.text
    raise ValueError(f"no `theorem NAME` in the canonical statement: {formal_statement[:80]!r}")


@dataclass(frozen=True, slots=True)
class Attempt:
    """A model's Lean code cut at the canonical statement: the text before it (the model's header, helper
    declarations, prose) and the proof body after it (as `extract_proof_body` returns it)."""

    before: str
    body: str
    term: bool = False  # a term-mode body: it follows the statement's `:=`


def extract_proof_body(model_text: str, formal_statement: str) -> str | TermBody | IntegrityError:
    """The proof body to check: the text after the canonical statement's `:= by` in the model's code, or a
    `TermBody` when the model's statement ends in `:=` followed by a term instead (`:= h₀ ▸ rfl`).
    `split_attempt` says how it is found, and what comes before it."""
    attempt = split_attempt(model_text, formal_statement)
    if isinstance(attempt, IntegrityError):
        return attempt
    return TermBody(attempt.body) if attempt.term else attempt.body


def split_attempt(model_text: str, formal_statement: str) -> Attempt | IntegrityError:
    """The model's code cut at its restatement of the canonical statement.

    The model's statement must equal the canonical one up to whitespace runs, comments, the spacing of `:=`
    and `lemma` for `theorem` (or back); the last such occurrence counts. A text that declares no
    `theorem`/`lemma`/`example` at all is taken as a bare proof body (tactics, optionally after `by`). A text
    that declares one but not the canonical statement is an integrity rejection naming the first place its
    statement differs: the model altered or dropped the statement. The body starts at a line start with its
    columns as the model wrote them (a first tactic on the `by` line keeps its column), so indentation-
    sensitive tactic blocks parse as they did for the model.
    """
    block = code_block(model_text)
    code = model_text if block is None else block  # no fence: the generator extracted the code already
    statement = _normalized(formal_statement, _outside_comments(formal_statement, lex(formal_statement))).rstrip()
    if not statement.endswith(":= by"):
        raise ValueError(f"canonical statement does not end with ':= by': {formal_statement[-40:]!r}")
    head = statement.removesuffix(" by")  # up to and with its `:=`
    segments = _outside_comments(code, comments(code))
    text = _normalized(code, segments)
    found = [(at, len(h)) for h in _spellings(head) if (at := _find_statement(text, h)) is not None]
    if found:
        at, length = max(found)
        end = at + length  # just after the `:=`
        tactics = text.startswith(" by", end) and _ends_word(text, end + 3)
        last = end + 2 if tactics else end - 1  # the `y` of `by` or the `=` of `:=`: count visible ones up to it
        body = _body_from(code, _visible_offset(code, segments, last + 1 - text.count(" ", 0, last + 1)) + 1)
        start = _visible_offset(code, segments, at + 1 - text.count(" ", 0, at + 1))  # the statement's first letter
        return Attempt(code[:start], body, term=not tactics)
    declares = lex(code, merge=True, stop=_declares)  # lexing ends at the first declaration
    if declares and _declares(declares[-1]):
        return IntegrityError(_mismatch(code, segments, text, head, declares[-1]))
    return Attempt("", _bare_body(code))


def _mismatch(code: str, segments: list[tuple[int, int]], text: str, head: str, first: Token) -> str:
    """Where the model's statement of the theorem first differs from the canonical one (`head`, normalized up
    to its `:=`): the word of each at that place, and its line in the model's code. Without a declaration of
    the theorem's name, the first name the code declares. `text`: the code normalized; `first`: its first
    declaring keyword."""
    keyword, name = head.split(" ", 2)[:2]
    at = max((a for k in ("theorem", "lemma") if (a := _find_statement(text, f"{k} {name}")) is not None), default=-1)
    if at < 0:
        declared = _first_code_tokens(code[first.start :], 2)
        other = "an `example`" if first.text == "example" or len(declared) < 2 else f"`{declared[1].text[:60]}`"
        return f"no theorem `{name}`: the attempt declares {other} (line {first.line}) instead"
    after_keyword = text.index(" ", at)
    model = keyword + text[after_keyword : at + len(head) + 40]  # the model's keyword read as ours
    ours, theirs = code_tokens(head), code_tokens(model)
    k = next((k for k, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a.text != b.text), None)
    if k is None and len(theirs) >= len(ours):  # token for token ours: spaced otherwise somewhere
        i = next((i for i, (a, b) in enumerate(zip(model, head, strict=False)) if a != b), len(head))
        word, dataset = _word_at(model, i), _word_at(head, i)
    else:
        k = min(len(ours), len(theirs)) if k is None else k
        i = theirs[k].start if k < len(theirs) else len(model)
        word = theirs[k].text[:40] if k < len(theirs) else "(end)"
        dataset = ours[k].text[:40] if k < len(ours) else "(end)"
    where = min(after_keyword + i - len(keyword), len(text) - 1)  # that place in `text`
    line = code.count("\n", 0, _visible_offset(code, segments, where + 1 - text.count(" ", 0, where + 1))) + 1
    return (
        f"the statement of `{name}` differs from the dataset's at line {line} of the attempt: "
        f"`{word}` where the dataset has `{dataset}`"
    )


def _word_at(text: str, i: int) -> str:
    """The space-separated word of `text` around index `i`, or `(end)` past the end."""
    if i >= len(text):
        return "(end)"
    start = text.rfind(" ", 0, i) + 1
    stop = text.find(" ", i + 1)
    return text[start : len(text) if stop < 0 else stop][:40]


def _spellings(head: str) -> tuple[str, ...]:
    """The normalized statement head as written, and with `lemma` (Mathlib's synonym) for `theorem` or back."""
    for keyword, other in (("theorem ", "lemma "), ("lemma ", "theorem ")):
        if head.startswith(keyword):
            return head, other + head.removeprefix(keyword)
    return (head,)


def _declares(token: Token) -> bool:
    return token.kind == "ident" and token.text in ("theorem", "lemma", "example")


def _outside_comments(text: str, tokens: list[Token]) -> list[tuple[int, int]]:
    """The (start, end) offsets of the stretches of `text` between its comments."""
    segments, at = [], 0
    for t in tokens:
        if t.kind == "comment":
            segments.append((at, t.start))
            at = t.start + len(t.text)
    segments.append((at, len(text)))
    return segments


def _normalized(text: str, segments: list[tuple[int, int]]) -> str:
    """`text` with comments dropped (`segments` are the stretches between them), whitespace runs as one space
    and `:=` spaced as ` := `, without a leading space. Its non-space characters are the text's visible ones
    (neither whitespace nor comment), in order, which is how `_visible_offset` maps them back."""
    joined = " ".join(text[start:end] for start, end in segments)
    spaced = _WHITESPACE_RUN.sub(" ", joined).replace(":=", " := ")
    return _SPACE_RUN.sub(" ", spaced).removeprefix(" ")


def _visible_offset(text: str, segments: list[tuple[int, int]], n: int) -> int:
    """The offset in `text` of its n-th (from 1) visible character: neither whitespace (regex `\\s`, as in
    `_normalized`) nor inside a comment. A segment is counted only when the character is not in it."""
    nth = re.compile(rf"(?:\s*+\S){{{n}}}")
    for start, end in segments:
        segment = text[start:end]
        if m := nth.match(segment):
            return start + m.end() - 1
        n -= len("".join(segment.split()))  # str.split and regex `\\s` agree on what is whitespace
        nth = re.compile(rf"(?:\s*+\S){{{n}}}")
    raise ValueError("fewer visible characters than counted")  # _normalized kept every one of them


def _find_statement(text: str, statement: str) -> int | None:
    """Offset of the last occurrence of `statement` in `text` that stands as whole tokens (not the tail of
    `xtheorem`, not followed by `byx` or `by.x`)."""
    end = len(text)
    while (at := text.rfind(statement, 0, end)) >= 0:
        before = text[at - 1] if at else " "
        if not (is_id_rest(before) or before == ".") and _ends_word(text, at + len(statement)):
            return at
        end = at + len(statement) - 1
    return None


def _ends_word(text: str, at: int) -> bool:
    """Whether a word ending before `at` ends there for Lean (`by` is not the start of `byx` or `by.x`)."""
    after = text[at : at + 1] or " "
    return not (is_id_rest(after) or after in ".«")


def _body_from(code: str, start: int) -> str:
    """`code[start:]` as lines: a rest-of-line that is only whitespace is dropped, a first tactic on the
    statement's line moves to its own line at the same column."""
    newline = code.find("\n", start)
    first = code[start:] if newline < 0 else code[start:newline]
    rest = "" if newline < 0 else code[newline + 1 :]
    if not first.strip():
        return rest
    column = start - (code.rfind("\n", 0, start) + 1) + len(first) - len(first.lstrip())
    return " " * column + first.strip() + ("" if newline < 0 else "\n" + rest)


def _bare_body(code: str) -> str:
    """A body given without its statement: a leading `:=` or `by` is dropped; a body written from column 0
    is indented by two spaces, since newer Lean requires the lines of a top-level `by` block to be indented."""
    tokens = _first_code_tokens(code, 2)
    start = 0
    for expected in (":=", "by"):
        if tokens and tokens[0].text == expected:
            start = tokens[0].start + len(expected)
            tokens = tokens[1:]
    body = _body_from(code, start) if start else code
    first = next(iter(_first_code_tokens(body, 1)), None)
    return textwrap.indent(body, "  ") if first is not None and first.col == 0 else body


def _first_code_tokens(text: str, n: int) -> list[Token]:
    """The first `n` tokens of `text` that are not comments (fewer if it has fewer), lexing no further."""
    seen = [0]

    def enough(token: Token) -> bool:
        seen[0] += token.kind != "comment"
        return seen[0] == n

    return [t for t in lex(text, merge=True, stop=enough) if t.kind != "comment"][:n]


def assemble(
    formal_statement: str, body: str, term: bool = False, before: str = "", options: tuple[str, ...] = ()
) -> str:
    """The command to elaborate on top of the header's env: what goes before the statement (`before`: the
    helper declarations, verifier_pool.lean_commands), each of `options` set on the theorem alone (`set_option
    N V in`, `open X in`), the trusted statement, a newline, the body (as `extract_proof_body` returns it: starting at a
    line start). A term-mode body (`term`) follows the statement's `:=`, its `by` dropped."""
    statement = formal_statement.rstrip()
    if not statement.endswith("by") or any(t.text == "import" for t in code_tokens(statement)):
        raise ValueError(f"not a canonical statement ending in ':= by': {formal_statement[:80]!r}")
    prefix = "".join(f"{option} in\n" for option in options)
    return before + prefix + (statement.removesuffix("by").rstrip() if term else statement) + "\n" + body
