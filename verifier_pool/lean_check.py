"""What "proved" means: the text checks and the REPL-response checks of ../shared/LEAN_REPL.md, as pure functions.

The order a verifier runs them in (`prepare` does steps 1-3):
1. `extract_proof_body(model_text, statement)`: the proof body, the text after the statement's `:= by`. The
   model's restatement must equal the canonical statement up to whitespace; everything before it (imports,
   opens, notations, instances, axioms, helper lemmas) is discarded.
2. `scan_forbidden(body)`: a token-level scan (`lean_text`) for holes, code that runs at elaboration time,
   syntax definitions, new axioms, compiler trust, debug options and new commands.
3. `assemble(statement, body)`: the command, built from trusted parts only; the header is elaborated once
   per REPL and the command runs with that `env`, so it never contains `import`.
4. `judge_command(response)`: no error, no sorry (either quoting of the warning), no `#exit`; its `proved`
   means "no objection yet".
5. `axioms_command(theorem_name(statement))` as a separate command in the env the proof returned, then
   `judge_axioms(response, name)`: only propext, Classical.choice and Quot.sound.

What these checks do NOT catch:
- Environment forgery. Code that runs during elaboration can add unchecked declarations or overwrite
  constants; we forbid every way we know to run code from a proof (`#eval`, `run_tac`, `by_elab`, `elab`,
  `macro`, simprocs, `initialize`, attributes that register elaborators, ...), but only replaying the final
  environment through the kernel (lean4checker, SafeVerify, comparator) proves it was not forged. Offer
  that as a second pass for evaluation sets.
- Syntax we do not know: a Mathlib command or tactic, missing from our lists, that runs code or hides a
  hole. Lean's own sorry warning and the axioms check back up the scan for holes, not for code.
- Wrong answers from Lean itself (kernel or elaborator bugs), and resource attacks (the sandbox's job).
- A proof text that reads differently under a Lean version whose token rules differ from `lean_text`'s.
"""

from __future__ import annotations

import re
import textwrap
from collections import deque
from dataclasses import dataclass
from typing import Any

from verifier_pool.judgement import Judgement  # the pool's one verdict type; `proved` here means "no objection"
from verifier_pool.lean_text import Token, code_tokens, comments, is_id_rest, lex, name_parts

ALLOWED_AXIOMS = frozenset({"propext", "Classical.choice", "Quot.sound"})
COMPILER_AXIOMS = frozenset({"Lean.ofReduceBool", "Lean.ofReduceNat", "Lean.trustCompiler"})  # native_decide & co
DETAIL_CHARS = 300
# Longer attempts are refused before any scanning. The scan is linear but pays a few microseconds of Python
# per token, on the worker's event loop: 10 MB of short tokens took over a minute. Real proofs are a few KB
# (Kimina-Prover's and DeepSeek-Prover's longest miniF2F proofs are tens of KB); at this cap the densest text
# scans in about a second on a 2-core machine.
MAX_PROOF_CHARS = 200_000

# Whole words (an identifier token, `«»` removed). None has a use in a proof of a competition statement.
FORBIDDEN_WORDS = frozenset({
    # holes: Lean flags them too, but the scan names them and costs no sandbox time
    "sorry", "admit", "stop",
    # library search: slow, and `apply?` admits the goal when it finds nothing complete
    "apply?", "exact?", "decide?", "rw?", "library_search",
    # run code at elaboration time, or define syntax that can change what the statement's symbols mean
    "elab", "elab_rules", "macro", "macro_rules", "syntax", "declare_syntax_cat", "notation", "notation3",
    "infix", "infixl", "infixr", "prefix", "postfix", "binder_predicate",
    "run_cmd", "run_tac", "run_elab", "run_meta", "by_elab", "initialize", "builtin_initialize",
    "simproc", "dsimproc", "simproc_decl", "dsimproc_decl", "builtin_simproc", "builtin_dsimproc",
    "command_elab", "term_elab", "builtin_command_elab", "builtin_term_elab", "builtin_tactic", "builtin_macro",
    # change the trusted base
    "import", "prelude", "axiom", "opaque", "unsafe", "partial",
})  # fmt: skip
# Components of any identifier: constants and attributes that reach the compiler or the trusted base, however
# they are spelled (`Lean.ofReduceBool`, `«sorryAx»`, `_root_.sorryAx`, `@[implemented_by f]`, `+native`).
FORBIDDEN_COMPONENTS = frozenset({
    "sorryAx", "native_decide", "nativeDecide", "native", "bv_decide", "ofReduceBool", "ofReduceNat",
    "reduceBool", "reduceNat", "trustCompiler", "implemented_by", "extern", "csimp",
})  # fmt: skip
# Commands that declare or change scopes. No tactic uses these words, and Lean ends a tactic block at the
# first token that is not a tactic, whatever its column: so any occurrence starts a new command. After the
# proof such a command cannot change it, but it can change how `#print axioms NAME` resolves NAME.
COMMAND_WORDS = frozenset({
    "theorem", "lemma", "def", "abbrev", "instance", "structure", "class", "inductive", "coinductive",
    "example", "namespace", "section", "end", "universe", "variable", "attribute", "local", "mutual",
    "deriving", "export", "omit", "include", "alias", "irreducible_def", "add_decl_doc", "noncomputable",
    "private", "protected",
})  # fmt: skip
# Also tactic syntax (`open Real in nlinarith [...]`, `open scoped BigOperators in`), so a command only where a
# command can start: column 0 (where newer Lean requires every proof line to be indented).
LINE_START_WORDS = frozenset({"open", "scoped"})
_REASON_OF_COMPONENT = {"native": "decide +native"}
HOLES = frozenset({"forbidden: sorry", "forbidden: admit", "forbidden: stop", "forbidden: sorryAx"})

# Model text is untrusted and may be megabytes long: everything from here to `prepare` is linear in it (a fence
# opener is also a closer, so `.*?` scans from at most one unclosed opener to the end).
_FENCE = re.compile(r"```([^\n`]*+)\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[ \t]*+(?:lean4|lean)[ \t]*\n", re.IGNORECASE)
_WHITESPACE_RUN = re.compile(r"\s+")
_SPACE_RUN = re.compile(r"  +")
_DEPENDS = re.compile(r"'(.+)' depends on axioms: \[(.*)\]", re.DOTALL)
_NO_AXIOMS = re.compile(r"'(.+)' does not depend on any axioms", re.DOTALL)
_SEVERITIES = frozenset({"trace", "info", "warning", "error"})


@dataclass(frozen=True, slots=True)
class IntegrityError:
    """A value, not an exception: the model text does not carry the canonical statement (missing, altered)."""

    detail: str

    def judgement(self) -> Judgement:
        return Judgement("rejected", "integrity", self.detail)


def _rejected(reason: str, detail: str) -> Judgement:
    return Judgement("rejected", reason, detail[:DETAIL_CHARS])


def _infrastructure(detail: str) -> Judgement:
    return Judgement("error", "", detail[:DETAIL_CHARS])


# --- text: from model output to the checked command ----------------------------------------------------


def lean_code_block(model_text: str) -> str:
    """The last fenced block tagged lean4, lean or untagged; else the text after an unclosed ```lean4 fence
    (a generation cut off by its token limit); else the whole text (already extracted by the generator)."""
    blocks = [body for tag, body in _FENCE.findall(model_text) if tag.strip().lower() in ("", "lean", "lean4")]
    if blocks:
        return blocks[-1]
    opened = deque(_OPEN_FENCE.finditer(model_text), maxlen=1)  # the last one, without a list of them all
    return model_text[opened[0].end() :] if opened else model_text


def theorem_name(formal_statement: str) -> str:
    """NAME in `theorem NAME` or `lemma NAME`, spelled as written (dots, primes, subscripts, `«»` kept).
    A statement without one is a configuration error, not a verdict: ValueError."""
    tokens = code_tokens(formal_statement)
    for keyword, name in zip(tokens, tokens[1:], strict=False):
        if keyword.kind == "ident" and keyword.text in ("theorem", "lemma") and name.kind == "ident":
            return name.text
    raise ValueError(f"no `theorem NAME` in the canonical statement: {formal_statement[:80]!r}")


def extract_proof_body(model_text: str, formal_statement: str) -> str | IntegrityError:
    """The proof body to check: the text after the canonical statement's `:= by` in the model's code.

    The model's statement must equal the canonical one up to whitespace runs, comments and the spacing of
    `:=`; the last such occurrence counts and everything before it is discarded. A text that declares no
    `theorem`/`lemma`/`example` at all is taken as a bare proof body (tactics, optionally after `by`). A text
    that declares one but not the canonical statement is an integrity rejection: the model altered or dropped
    the statement. The body starts at a line start with its columns as the model wrote them (a first tactic on
    the `by` line keeps its column), so indentation-sensitive tactic blocks parse as they did for the model.
    """
    code = lean_code_block(model_text)
    statement = _normalized(formal_statement, _outside_comments(formal_statement, lex(formal_statement))).rstrip()
    if not statement.endswith(":= by"):
        raise ValueError(f"canonical statement does not end with ':= by': {formal_statement[-40:]!r}")
    segments = _outside_comments(code, comments(code))
    text = _normalized(code, segments)
    at = _find_statement(text, statement)
    if at is not None:
        last = at + len(statement) - 1  # the `y` of `by`, a visible character: count them up to it
        return _body_from(code, _visible_offset(code, segments, last + 1 - text.count(" ", 0, last + 1)) + 1)
    declares = lex(code, merge=True, stop=_declares)  # lexing ends at the first declaration
    if declares and _declares(declares[-1]):
        return IntegrityError("the canonical statement is missing or altered")
    return _bare_body(code)


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
        after = text[at + len(statement) : at + len(statement) + 1] or " "
        if not (is_id_rest(before) or before == ".") and not (is_id_rest(after) or after in ".«"):
            return at
        end = at + len(statement) - 1
    return None


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


def scan_forbidden(body: str) -> str | None:
    """A short reason (`"forbidden: native_decide"`) if the body contains a forbidden construct, else None.

    Token-based (`lean_text`), so comments and strings do not count (`-- sorry`, `"sorry"`), a nested comment
    hides what Lean hides (`/- /- -/ sorry -/`), `sor/- -/ry` is two identifiers, and `sorry_lemma` or `h'`
    are identifiers of their own. The first token, in source order, that breaks a rule names the reason:
    text whose reading depends on Lean's token table (`ambiguous`); any `#` command (none belongs in a proof:
    `#print` could fake an axioms line, `#eval` runs code, `#exit` truncates; Mathlib's card notation `#s` is
    a false positive we accept); FORBIDDEN_WORDS; `debug.*` options (`set_option debug.skipKernelTC true
    in`); FORBIDDEN_COMPONENTS anywhere in a dotted name; COMMAND_WORDS anywhere; LINE_START_WORDS at
    column 0.
    """
    return _first_forbidden(body)[1]


def _first_forbidden(body: str) -> tuple[list[Token], str | None]:
    """The tokens of `body` up to its first forbidden one (all if none), and the reason for that one."""
    tokens = lex(body, merge=True, stop=lambda token: _forbidden(token) is not None)  # ends at the first one
    reason = _forbidden(tokens[-1]) if tokens else None
    return tokens, None if reason is None else f"forbidden: {reason}"


def _forbidden(token: Token) -> str | None:
    if token.kind == "ambiguous":
        return f"ambiguous literal {token.text[:20]!r} at line {token.line}"
    if token.kind == "hash":
        return token.text
    if token.kind != "ident":
        return None
    word = ".".join(name_parts(token.text))
    if word in FORBIDDEN_WORDS:
        return word
    if word.startswith("debug."):
        return f"set_option {word}"
    for component in word.split("."):
        if component in FORBIDDEN_COMPONENTS:
            return _REASON_OF_COMPONENT.get(component, component)
    if word in COMMAND_WORDS:
        return f"{word} (a new command)"
    if word in LINE_START_WORDS and token.col == 0:
        return f"{word} at the start of a line (a new command)"
    return None


def assemble(formal_statement: str, body: str) -> str:
    """The command to elaborate on top of the header's env: the trusted statement, a newline, the body (as
    `extract_proof_body` returns it: starting at a line start)."""
    statement = formal_statement.rstrip()
    if not statement.endswith("by") or any(t.text == "import" for t in code_tokens(statement)):
        raise ValueError(f"not a canonical statement ending in ':= by': {formal_statement[:80]!r}")
    return statement + "\n" + body


def prepare(model_text: str, formal_statement: str, max_chars: int | None = MAX_PROOF_CHARS) -> str | Judgement:
    """Steps 1-3: the command to send, or the rejection that makes sending it unnecessary. `max_chars`:
    MAX_PROOF_CHARS (None only in tests that time the scan itself)."""
    if max_chars is not None and len(model_text) > max_chars:
        return _rejected("lean_error", f"attempt of {len(model_text)} characters exceeds {max_chars}")
    body = extract_proof_body(model_text, formal_statement)
    if isinstance(body, IntegrityError):
        return body.judgement()
    tokens, reason = _first_forbidden(body)  # one reading of the body for both checks
    if all(t.kind == "comment" for t in tokens):  # no Lean run can prove anything with whitespace and comments
        return _rejected("lean_error", "empty proof: the attempt holds no Lean code")
    if reason is not None:
        return _rejected("sorry" if reason in HOLES else "integrity", reason)
    return assemble(formal_statement, body)


# --- REPL responses --------------------------------------------------------------------------------------


def _messages(response: Any) -> list[dict[str, Any]] | Judgement:
    """The messages of a `{"env": n, ...}` response, or the `error` judgement for anything else: a
    `{"message": ...}` answer ("Unknown environment.") or an unknown shape is the infrastructure's problem."""
    if not isinstance(response, dict) or "env" not in response:
        text = response.get("message", response) if isinstance(response, dict) else response
        return _infrastructure(f"REPL: {text}")
    messages = response.get("messages") or []
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return _infrastructure(f"REPL: malformed messages: {str(messages)[:100]}")
    unknown = {m.get("severity") for m in messages} - _SEVERITIES
    if unknown:
        return _infrastructure(f"REPL: unknown message severity {sorted(map(str, unknown))}")
    return messages


def is_sorry_warning(data: str) -> bool:
    """`declaration uses 'sorry'` (Lean up to v4.27) or ``declaration uses `sorry` `` (v4.28 on)."""
    return "declaration uses" in data and ("'sorry'" in data or "`sorry`" in data)


def judge_command(response: Any) -> Judgement:
    """The REPL's answer to the assembled command.

    In order: a `#exit` warning is integrity (the rest of the text was never checked); `sorries` or a sorry
    warning is sorry; an error message is lean_error, with the first error as detail. Info and trace
    messages (`Goals accomplished!`) and other warnings (unused variables, deprecations) never fail a proof.

    A heartbeat error (`(deterministic) timeout at ...`) is a lean_error, not a `timeout`: `timeout` is the
    wall-clock kill, which depends on load and leaves a sandbox to replace; running out of heartbeats is an
    ordinary Lean error, the same on every machine and every retry, so its verdict may be cached.
    """
    messages = _messages(response)
    if isinstance(messages, Judgement):
        return messages
    warnings = [str(m.get("data", "")) for m in messages if m.get("severity") == "warning"]
    errors = [str(m.get("data", "")) for m in messages if m.get("severity") == "error"]
    exits = [w for w in warnings if "using 'exit'" in w or "using `exit`" in w]
    if exits:
        return _rejected("integrity", exits[0])
    if response.get("sorries") or any(is_sorry_warning(w) for w in warnings):
        return _rejected("sorry", next((w for w in warnings if is_sorry_warning(w)), "sorries in the response"))
    if errors:
        return _rejected("lean_error", errors[0])
    return Judgement("proved")


def axioms_command(theorem_name: str) -> str:
    """Sent as its own command in the env the proof returned. Its answer cannot be forged by the proof: the
    response holds only this command's messages (a line the proof printed went to the proof's own response),
    and the scan forbids everything that could redefine `#print` (macro_rules, elab, command_elab, ...) or
    change how NAME resolves (namespace, open, export); `judge_axioms` also checks the name it reports."""
    return f"#print axioms {theorem_name}"


def _axioms_report(data: str) -> tuple[str, list[str]] | None:
    """(name, axioms) from `'NAME' depends on axioms: [a, b]` or `'NAME' does not depend on any axioms`."""
    data = data.strip()
    if m := _DEPENDS.fullmatch(data):
        return m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()]
    if m := _NO_AXIOMS.fullmatch(data):
        return m.group(1), []
    return None


def judge_axioms(response: Any, theorem_name: str) -> Judgement:
    """The REPL's answer to `axioms_command(theorem_name)`.

    Exactly one info report, on line 1 (our command is one line; a report placed elsewhere did not come from
    it), about exactly our theorem. Any error (`unknown constant`: the proof's environment lacks the theorem)
    is integrity. sorryAx is sorry; compiler axioms (native_decide) and any other axiom are integrity. The
    column is not checked: in a one-line command it adds no protection, and a convention change there would
    reject every proof. A response with no readable report is the infrastructure's problem (a new wording).
    """
    messages = _messages(response)
    if isinstance(messages, Judgement):
        return messages
    errors = [str(m.get("data", "")) for m in messages if m.get("severity") == "error"]
    if errors:
        return _rejected("integrity", f"#print axioms: {errors[0]}")
    reports = [(m, r) for m in messages if m.get("severity") == "info" and (r := _axioms_report(str(m.get("data"))))]
    if not reports:
        return _infrastructure(f"no axioms report in {str(messages)[:200]}")
    if len(reports) > 1:
        return _rejected("integrity", f"{len(reports)} axioms reports for one #print axioms")
    message, (name, axioms) = reports[0]
    line = (message.get("pos") or {}).get("line", 1)
    if line != 1:
        return _rejected("integrity", f"axioms report at line {line}, not at the #print command")
    if _constant(name) != _constant(theorem_name):
        return _rejected("integrity", f"axioms report is about {name!r}, not {theorem_name!r}")
    if "sorryAx" in axioms:
        return _rejected("sorry", "depends on sorryAx")
    compiled = sorted(a for a in axioms if a in COMPILER_AXIOMS)
    if compiled:
        return _rejected("integrity", f"trusts the compiler: {', '.join(compiled)}")
    other = sorted(a for a in axioms if a not in ALLOWED_AXIOMS)
    if other:
        return _rejected("integrity", f"uses axioms: {', '.join(other)}")
    return Judgement("proved")


def _constant(name: str) -> list[str]:
    parts = name_parts(name)
    return parts[1:] if parts[:1] == ["_root_"] else parts
