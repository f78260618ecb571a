"""The Lean lexer and text checks as they were before issue 12 (commit 3bfc89f), kept as the reference the
linear-time rewrite is compared against on random text (tests/verifier_pool/test_lean_check.py). They read
one character per Python step and a few passes over the tokens: right, but seconds per megabyte, and the
source of truth for what `lean_text` and `lean_check` must still answer. Issue 13's rules (configuration
values, attributes, `eval%`, `lemma` for `theorem`, term-mode bodies) are added here the plain way, by
looking ahead in token lists and trying every offset, not as `lean_check` does them. Do not use outside tests."""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

MAX_NESTING = 32  # interpolations inside interpolations: deeper than any real text, and bounds the recursion

_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO][0-7]+|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")
# `'a'`, `'\n'`, `'\x41'`, `'\u03B1'`: Lean's charLitFnAux (one character or one escape, then a quote).
_CHAR = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|u\{[0-9a-fA-F]+\}|.)|[^\\])'", re.DOTALL)
_RAW_STRING_START = re.compile(r'r(#*)"')
# Symbols of more than one character that we must know: `:=` and `@[` for readability; the rest end in a
# quote, so that the quote is not taken for the start of a character literal (Lean's longest-match token
# reading: `f ⁻¹' s`, `f '' s`, `xs[i]'h`, `α ×' β`, `α ⊕' β`, `∑' n, f n`, `∏' n, f n`, `f ∘' g`).
_SYMBOLS = ("⁻¹'", "''", "]'", "×'", "⊕'", "∑'", "∏'", "∘'", ":=", "@[")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # ident | number | string | char | symbol | hash | comment | ambiguous
    text: str
    start: int  # offset in the source, in code points (Python str indices)
    line: int  # 1-based, like the REPL's positions
    col: int  # 0-based, in code points, like the REPL's positions


def is_id_first(c: str) -> bool:
    """Lean's `isIdFirst`: ASCII letters, `_`, and `isLetterLike` (Lean's `Char.isAlpha` is ASCII only)."""
    return ("a" <= c <= "z") or ("A" <= c <= "Z") or c == "_" or _is_letter_like(c)


def is_id_rest(c: str) -> bool:
    """Lean's `isIdRest`: also digits, `'`, `!`, `?` and subscripts; so `h'`, `exact?`, `s!` are one word."""
    return is_id_first(c) or ("0" <= c <= "9") or c in "'!?" or _is_subscript(c)


def _is_letter_like(c: str) -> bool:
    v = ord(c)
    return (
        (0x3B1 <= v <= 0x3C9 and v != 0x3BB)  # lower Greek, but not λ
        or (0x391 <= v <= 0x3A9 and v not in (0x3A0, 0x3A3))  # upper Greek, but not Π and Σ
        or 0x3CA <= v <= 0x3FB  # Coptic
        or 0x1F00 <= v <= 0x1FFE  # polytonic Greek
        or 0x2100 <= v <= 0x214F  # letterlike block: ℕ ℝ ℂ ...
        or 0x1D49C <= v <= 0x1D59F  # script, double-struck, Fraktur
        or (0xC0 <= v <= 0xFF and v not in (0xD7, 0xF7))  # Latin-1 letters (newer Lean)
        or 0x100 <= v <= 0x17F  # Latin Extended-A (newer Lean)
    )


def _is_subscript(c: str) -> bool:
    v = ord(c)
    return 0x2080 <= v <= 0x2089 or 0x2090 <= v <= 0x209C or 0x1D62 <= v <= 0x1D6A or v == 0x2C7C


def name_parts(ident: str) -> list[str]:
    """The components of a dotted identifier with `«»` removed: `Lean.«ofReduceBool»` -> [Lean, ofReduceBool].

    Comparing components, not spellings, is what makes `«sorryAx»` and `_root_.sorryAx` the same constant.
    """
    parts, i = [], 0
    while i < len(ident):
        if ident[i] == "«":
            j = ident.find("»", i + 1)
            j = len(ident) if j < 0 else j
            parts.append(ident[i + 1 : j])
            i = j + 1
        else:
            j = i
            while j < len(ident) and ident[j] != ".":
                j += 1
            parts.append(ident[i:j])
            i = j
        i += 1  # the dot
    return parts


def block_comment_end(text: str, i: int) -> int:
    """End of a block comment whose body starts at `i` (after `/-`, `/--` or `/-!`): Lean's
    `finishCommentBlock`, which nests on `/-` and knows nothing of strings. Unterminated: the rest of the text
    (Lean reports an error there)."""
    nesting = 1
    while i < len(text):
        pair = text[i : i + 2]
        if pair == "-/":
            nesting -= 1
            i += 2
            if nesting == 0:
                return i
        elif pair == "/-":
            nesting += 1
            i += 2
        else:
            i += 1
    return len(text)


def plain_string_end(text: str, i: int) -> int:
    """End of the string literal that opens at `text[i] == '"'`, read as a plain (not interpolated) one."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == '"':
            return j + 1
        else:
            j += 1
    return len(text)


def lex(text: str) -> list[Token]:
    """All tokens of `text`, comments included, in source order."""
    lexer = _Lexer(text)
    lexer.code(0, depth=0)
    return lexer.out


def code_tokens(text: str) -> list[Token]:
    """The code view: every token but comments. String and char literals stay as single tokens so that the
    caller sees where they are without reading their contents as code."""
    return [t for t in lex(text) if t.kind != "comment"]


def mask_comments(text: str) -> str:
    """`text` with every comment replaced by spaces (newlines kept), so offsets stay valid."""
    chars = list(text)
    for t in lex(text):
        if t.kind == "comment":
            for k in range(t.start, t.start + len(t.text)):
                if chars[k] != "\n":
                    chars[k] = " "
    return "".join(chars)


class _Ambiguous(Exception):
    """A string literal inside an interpolation reads differently as plain and as interpolated."""


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.out: list[Token] = []
        # After the first ambiguous string the text is rejected anyway: later strings are read plainly only.
        self.poisoned = False
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def emit(self, kind: str, start: int, end: int) -> None:
        line = bisect_right(self._line_starts, start)
        self.out.append(Token(kind, self.text[start:end], start, line, start - self._line_starts[line - 1]))

    def code(self, i: int, depth: int) -> int:
        """Lex code from `i`. Inside an interpolation (depth > 0), stop at its closing `}` and return its index."""
        text, braces = self.text, 0
        while i < len(text):
            c = text[i]
            if c in " \t\r\n":  # Lean's whitespace; any other space character is a token error in Lean
                i += 1
            elif text.startswith("--", i):
                end = text.find("\n", i)
                end = len(text) if end < 0 else end
                self.emit("comment", i, end)
                i = end
            elif text.startswith("/-", i):
                body = i + 3 if text[i + 2 : i + 3] in ("-", "!") else i + 2  # doc comments are tokens in Lean
                end = block_comment_end(text, body)
                self.emit("comment", i, end)
                i = end
            elif c == '"':
                i = self.string(i, depth)
            elif c == "'" and text[i + 1 : i + 2] != "'":
                i = self.char_or_symbol(i)
            elif "0" <= c <= "9":
                i = self.take("number", i, _NUMBER.match(text, i).end())
            elif c == "r" and (m := _RAW_STRING_START.match(text, i)):
                i = self.raw_string(i, m)
            elif is_id_first(c) or c == "«":
                i = self.take("ident", i, self.ident_end(i))
            elif c == "#" and is_id_first(text[i + 1 : i + 2] or " "):
                end = i + 1
                while end < len(text) and is_id_rest(text[end]):
                    end += 1
                i = self.take("hash", i, end)
            elif depth > 0 and c == "}" and braces == 0:
                return i
            else:
                braces += (c == "{") - (c == "}")
                symbol = next((s for s in _SYMBOLS if text.startswith(s, i)), c)
                i = self.take("symbol", i, i + len(symbol))
        return i

    def take(self, kind: str, start: int, end: int) -> int:
        self.emit(kind, start, end)
        return end

    def ident_end(self, i: int) -> int:
        """Lean's `identFnAux`: parts joined by `.` when a part-start follows the dot."""
        text = self.text
        while True:
            if text[i] == "«":
                close = text.find("»", i + 1)
                if close < 0:
                    return len(text)  # unterminated escape: Lean reports an error
                i = close + 1
            else:
                i += 1
                while i < len(text) and is_id_rest(text[i]):
                    i += 1
            nxt = text[i + 1 : i + 2]
            if text[i : i + 1] == "." and nxt and (is_id_first(nxt) or nxt == "«"):
                i += 1
            else:
                return i

    def char_or_symbol(self, i: int) -> int:
        m = _CHAR.match(self.text, i)
        if m is None:
            return self.take("symbol", i, i + 1)  # part of a token like `⁻¹'`, or a Lean error
        prev = self.out[-1] if self.out else None
        after_symbol = prev is not None and prev.kind == "symbol" and prev.start + len(prev.text) == i
        return self.take("ambiguous" if after_symbol else "char", i, m.end())

    def raw_string(self, i: int, m: re.Match[str]) -> int:
        """`r"..."`, `r#"..."#`: no escapes, closed by a quote and as many `#`. A Lean without raw strings
        (before v4.6 or so) reads `r`, the hashes and a plain string: where that string ends elsewhere
        (a quote or backslash inside), the text reads differently across versions and is `ambiguous`."""
        hashes = m.group(1)
        close = self.text.find('"' + hashes, m.end())
        end = len(self.text) if close < 0 else close + 1 + len(hashes)
        same = plain_string_end(self.text, m.end() - 1) == end - len(hashes)
        return self.take("string" if same else "ambiguous", i, end)

    def string(self, i: int, depth: int) -> int:
        """A string literal read both as plain and as interpolated; if the two disagree on where it ends,
        one `ambiguous` token up to the plain end."""
        plain_end = plain_string_end(self.text, i)
        if self.poisoned:
            return self.take("string", i, plain_end)
        mark = len(self.out)
        try:
            end = self.interpolated(i, depth + 1) if depth < MAX_NESTING else -1
            if end != plain_end:
                raise _Ambiguous
        except _Ambiguous:
            if depth > 0:
                raise  # the outermost string is the one to report: one token, and no re-reading per level
            del self.out[mark:]
            self.poisoned = True
            return self.take("ambiguous", i, plain_end)
        return end

    def interpolated(self, i: int, depth: int) -> int:
        """Lean's `interpolatedStrFn`: literal pieces as `string` tokens, `{term}` parts lexed as code."""
        text, piece, j = self.text, i, i + 1
        while j < len(text):
            c = text[j]
            if c == "\\":
                j += 2
            elif c == '"':
                return self.take("string", piece, j + 1)
            elif c == "{":
                self.emit("string", piece, j + 1)
                j = self.code(j + 1, depth)
                if j >= len(text):
                    return len(text)
                piece, j = j, j + 1
            else:
                j += 1
        self.emit("string", piece, len(text))
        return len(text)


# --- verifier_pool/lean_check.py at 3bfc89f: the text steps of prepare; issue 29's commands, plainly ---------

import textwrap  # noqa: E402

from tasks.lean_proof import IntegrityError, TermBody, assemble  # noqa: E402
from verifier_pool.judgement import Judgement  # noqa: E402
from verifier_pool.lean_check import _rejected  # noqa: E402
from verifier_pool.lean_commands import (  # noqa: E402
    HARMLESS_OPTION_PREFIXES,
    HARMLESS_OPTIONS,
    HELPER_WORDS,
    SUFFIX_WORDS,
    Refusal,
)
from verifier_pool.lean_scan import (  # noqa: E402
    _REASON_OF_COMPONENT,
    COMMAND_WORDS,
    FORBIDDEN_COMPONENTS,
    FORBIDDEN_OPTION_PREFIXES,
    FORBIDDEN_WORDS,
    HOLES,
    LINE_START_WORDS,
    TACTIC_ITEMS,
    TACTIC_WORDS,
    TERM_TACTICS,
)  # fmt: skip

_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:lean4|lean)[ \t]*\n", re.IGNORECASE)
_NORM_PIECES = re.compile(r"\s+|:=|.", re.DOTALL)


def lean_code_block(model_text: str) -> str:
    """The last fenced block tagged lean4, lean or untagged; else the text after an unclosed ```lean4 fence
    (a generation cut off by its token limit); else the whole text (already extracted by the generator)."""
    blocks = [body for tag, body in _FENCE.findall(model_text) if tag.strip().lower() in ("", "lean", "lean4")]
    if blocks:
        return blocks[-1]
    opened = list(_OPEN_FENCE.finditer(model_text))
    return model_text[opened[-1].end() :] if opened else model_text


def extract_proof_body(model_text: str, formal_statement: str) -> str | TermBody | IntegrityError:
    """The body alone (`split`'s second part)."""
    split = _split(model_text, formal_statement)
    return split if isinstance(split, IntegrityError) else split[1]


def _split(model_text: str, formal_statement: str) -> tuple[str, str | TermBody] | IntegrityError:
    """The proof body to check: the text after the canonical statement's `:= by` in the model's code, or
    after its `:=` as a TermBody (issue 13: term-mode proofs, and `lemma` for `theorem`).

    The model's statement must equal the canonical one up to whitespace runs, comments and the spacing of
    `:=`; the last such occurrence counts and everything before it is discarded. A text that declares no
    `theorem`/`lemma`/`example` at all is taken as a bare proof body (tactics, optionally after `by`). A text
    that declares one but not the canonical statement is an integrity rejection: the model altered or dropped
    the statement. The body starts at a line start with its columns as the model wrote them (a first tactic on
    the `by` line keeps its column), so indentation-sensitive tactic blocks parse as they did for the model.
    """
    code = lean_code_block(model_text)
    statement, _ = _normalized(formal_statement)
    statement = statement.rstrip()
    if not statement.endswith(":= by"):
        raise ValueError(f"canonical statement does not end with ':= by': {formal_statement[-40:]!r}")
    text, origin = _normalized(code)
    rest = statement.removesuffix(" by").split(" ", 1)[1]  # after `theorem`: the model may write `lemma`
    for at in range(len(text), -1, -1):  # the last restatement, by trying every offset
        head = next((k + " " + rest for k in ("theorem", "lemma") if text.startswith(k + " " + rest, at)), None)
        if head is None or (at > 0 and (is_id_rest(text[at - 1]) or text[at - 1] == ".")):
            continue
        end = at + len(head)
        after_by = text[end + 3 : end + 4] or " "
        before = code[: origin[at]]
        if text[end : end + 3] == " by" and not (is_id_rest(after_by) or after_by in ".«"):
            return before, _body_from(code, origin[end + 2] + 1)
        return before, TermBody(_body_from(code, origin[end - 1] + 1))
    if any(t.kind == "ident" and t.text in ("theorem", "lemma", "example") for t in code_tokens(code)):
        return IntegrityError("the canonical statement is missing or altered")
    return "", _bare_body(code)


def _normalized(text: str) -> tuple[str, list[int]]:
    """`text` with comments blanked, whitespace runs as one space and `:=` spaced as ` := `; with, for each
    character kept, its offset in `text`."""
    chars: list[str] = []
    origin: list[int] = []

    def put(ch: str, at: int) -> None:
        if ch == " " and (not chars or chars[-1] == " "):
            return
        chars.append(ch)
        origin.append(at)

    for m in _NORM_PIECES.finditer(mask_comments(text)):
        piece, at = m.group(), m.start()
        if piece.isspace():
            put(" ", at)
        elif piece == ":=":
            for k, ch in enumerate(" := "):
                put(ch, at + max(0, k - 1))
        else:
            put(piece, at)
    return "".join(chars), origin


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
    tokens = code_tokens(code)
    start = 0
    for expected in (":=", "by"):
        if tokens and tokens[0].text == expected:
            start = tokens[0].start + len(expected)
            tokens = tokens[1:]
    body = _body_from(code, start) if start else code
    first = next(iter(code_tokens(body)), None)
    return textwrap.indent(body, "  ") if first is not None and first.col == 0 else body


# Issue 29, read plainly: the text cut into commands (verifier_pool.lean_commands), configuration told from named
# arguments by position (verifier_pool.lean_scan `Context`). Runs of one-character symbols are rebuilt from the
# per-character tokens and read a character at a time; brackets are a list with no depth cap; each command's
# state is a dict.

_INERT_CHARS = frozenset("!$%&()*+,.;<=>?[\\^`|~-/#")
_NO_COMMAND = "left of the proof's column {col}: Lean ends the proof there and reads a command, which this is not"


def _items(text: str) -> list[Token]:
    """The code tokens, with each run of one-character symbols joined by whitespace only as one `run` token."""
    items: list[Token] = []
    last = None  # the previous token, comments included
    for t in lex(text):
        inert = t.kind == "symbol" and t.text in _INERT_CHARS
        joins = (inert and last is not None and last.kind == "symbol" and last.text in _INERT_CHARS
                 and text[last.start + 1 : t.start].strip(" \t\r\n") == "")  # fmt: skip
        if joins:
            run = items[-1]
            items[-1] = Token("run", text[run.start : t.start + 1], run.start, run.line, run.col)
        elif t.kind != "comment":
            items.append(Token("run", t.text, t.start, t.line, t.col) if inert else t)
        last = t
    return items


def _events(run: str) -> list[tuple[str, int]]:
    """The events of a run, a character at a time: (event, offset); a newline's event is its indentation."""
    out, i = [], 0
    while i < len(run):
        c = run[i]
        if c == "\n":
            j = i + 1
            while j < len(run) and run[j] in " \t\r":
                j += 1
            out.append(("\n" + run[i + 1 : j], j))
            i = j
            continue
        for multi in ("<;>", "<|>", "=>", "||", "|>", "<|"):
            if run.startswith(multi, i):
                out.append((multi, i))
                i += len(multi)
                break
        else:
            if c in "()[];|" or (c == "." and run[i + 1 : i + 2] in (" ", "\t", "\r", "\n")):
                out.append((c, i))
            i += 1
    return out


class _Plain:
    """One text's commands, judged one token at a time (the plain twin of lean_commands._Commands)."""

    def __init__(self, text: str, phase: str, names: frozenset[str], target: str, term: bool = False) -> None:
        self.text, self.phase, self.names, self.target = text, phase, names, target
        self.where_new = "before the statement" if phase == "before" else "after the proof"
        self.commands: list[str] = []
        self.options: list[str] = []
        self.scoped = False
        self.helpers = 0
        self.body_end = -1
        self.body_tokens = 0
        self.cmd = None
        if phase == "body":
            self.cmd = self._new("body", 0, 0, "term" if term else "tactic")
            self.cmd["in_proof"], self.cmd["await"] = True, not term

    @staticmethod
    def _new(kind: str, start: int, col: int, mode: str = "term") -> dict:
        return {"kind": kind, "start": start, "col": col, "end": start, "tokens": 0, "name": "", "value": "",
                "words": [], "pending": False, "in_proof": False, "assign": False, "await": False, "block": None,
                "stack": [[mode, mode == "tactic", mode]], "after_then": False, "state": "code", "item": "",
                "field": False, "attribute": False}  # fmt: skip

    # -- the context ----------------------------------------------------------------------------------------
    @staticmethod
    def _push(cmd: dict, bracket: str) -> None:
        top = cmd["stack"][-1]
        opened = top[0]
        mode = "term" if bracket == "⟨" or (bracket == "[" and not cmd["after_then"]) else opened
        cmd["stack"].append([mode, mode == "tactic", opened])

    @staticmethod
    def _set(cmd: dict, mode: str, sequence: bool = False) -> None:
        cmd["stack"][-1][0] = mode
        cmd["stack"][-1][1] = cmd["stack"][-1][1] or sequence

    def _newline(self, cmd: dict) -> None:
        if cmd["stack"][-1][1]:
            cmd["stack"][-1][0] = "tactic"
        cmd["after_then"] = False

    def _symbol(self, cmd: dict, t: Token) -> Refusal | None:
        if t.kind != "run":
            if t.text in ("{", "⟨"):
                self._push(cmd, t.text)
            elif t.text in ("}", "⟩"):
                if len(cmd["stack"]) > 1:
                    cmd["stack"].pop()
            elif t.text in (":=", ":", "←"):
                self._set(cmd, "term")
            elif t.text == "·":
                self._set(cmd, "tactic")
            elif t.text.startswith("]") and len(cmd["stack"]) > 1:
                cmd["stack"].pop()
            cmd["after_then"] = False
            return None
        for event, at in _events(t.text):
            if event[0] == "\n":
                if cmd["block"] is not None and len(cmd["stack"]) == 1 and len(event) - 1 < cmd["block"]:
                    line = t.line + t.text.count("\n", 0, at)
                    return f"forbidden: `{t.text[at]}` at line {line}, " + _NO_COMMAND.format(col=cmd["block"])
                self._newline(cmd)
                continue
            if event in ("(", "["):
                self._push(cmd, event)
            elif event in (")", "]"):
                if len(cmd["stack"]) > 1:
                    cmd["stack"].pop()
            elif event in ("||", "|>", "<|"):
                pass
            else:
                self._set(cmd, "tactic")
                cmd["after_then"] = event == "<;>"
                continue
            cmd["after_then"] = False
        return None

    # -- the token rules ------------------------------------------------------------------------------------
    def _rules(self, cmd: dict, t: Token) -> str | None:
        reason = _forbidden(t)
        if reason is not None:
            return reason
        if cmd["attribute"]:
            return f"attribute @[{t.text[:40]}" if t.kind == "ident" else "attribute @["
        if t.kind == "ident" and t.text == "eval" and self.text[t.start + 4 : t.start + 5] == "%":
            return "eval%"
        if cmd["state"] == "value":
            return self._value(cmd, t)
        opens = t.kind == "run" and t.text.endswith("(")
        if t.text == "@[":
            cmd["attribute"] = True
        elif cmd["state"] == "open" and t.kind == "ident":
            cmd["state"], cmd["item"] = ("tactic item" if t.text in TACTIC_ITEMS else "name"), t.text
        elif cmd["state"] == "tactic item" and t.text == ":=":
            self._set(cmd, "tactic", sequence=True)
            cmd["state"] = "code"
        elif cmd["state"] == "name" and t.text == ":=":
            cmd["state"] = "code" if cmd["stack"][-1][2] == "term" else "value"
            cmd["field"] = False
        else:
            cmd["state"] = "open" if opens else "code"
        return None

    def _value(self, cmd: dict, t: Token) -> str | None:
        bad = f"config term ({cmd['item'][:40]} := ...)"
        if cmd["field"]:
            cmd["field"] = False
            return None if t.text == ":=" else bad
        if t.kind == "number" or t.text in ("true", "false"):
            return None
        if t.kind == "ident":
            cmd["field"] = self.text[t.start - 1] != "."
            return None
        if t.text in ("{", "}"):
            return None
        if t.kind not in ("run", "symbol"):
            return bad
        for k, c in enumerate(t.text):
            if c == ")":
                rest = t.text[k + 1 :]
                cmd["state"] = "open" if rest.endswith("(") else "code"
                return None
            if c not in "[],. \t\r\n":
                return bad
        return None

    # -- commands -------------------------------------------------------------------------------------------
    def run(self) -> tuple | Refusal:
        last_line = 0
        for t in _items(self.text):
            first = t.line != last_line
            last_line = t.line + t.text.count("\n")
            refusal = self._token(t, first)
            if refusal is not None:
                return refusal
        cmd = self.cmd
        if cmd is not None and cmd["kind"] == "body":
            self.body_end = len(self.text) if cmd["tokens"] else 0
            if cmd["attribute"]:
                return Refusal("forbidden: attribute @[")
        elif cmd is not None and (refusal := self._close(cmd, last=True)) is not None:
            return refusal
        return self.commands, self.options, self.scoped, self.helpers, self.body_end, self.body_tokens

    def _where(self, cmd: dict) -> str:
        if cmd["kind"] == "body":
            return ""
        if cmd["kind"] == "helper" and cmd["name"]:
            return f"helper `{cmd['name']}`" + (" after the proof" if self.phase == "body" else "")
        return self.where_new

    def _token(self, t: Token, first: bool) -> Refusal | None:
        cmd = self.cmd
        word = t.text if t.kind == "ident" else None
        starts = t.kind == "hash" or word in COMMAND_WORDS or (word in LINE_START_WORDS and t.col == 0)
        if cmd is None:
            opener = t.kind == "hash" or t.text == "@[" or (
                word is not None and (word in COMMAND_WORDS or word in ("open", "set_option", "import", "scoped")
                                      or _forbidden(t) is not None))  # fmt: skip
            return self._begin(t) if opener else None
        if first and cmd["block"] is not None and t.col < cmd["block"] and len(cmd["stack"]) == 1:
            if word in SUFFIX_WORDS:
                cmd["block"] = None
            else:
                return self._begin(t, dedent=cmd["block"])
        elif first:
            self._newline(cmd)
        starts = starts or (word in ("open", "set_option", "import") and (not cmd["in_proof"] or cmd["pending"]))
        if starts and cmd["pending"]:
            return self._core(cmd, t)
        if starts:
            return self._begin(t)
        return self._inside(cmd, t, first)

    def _kind(self, t: Token) -> str | None:
        if t.kind == "hash":
            return "print" if t.text == "#print" and self.phase == "body" else None
        if t.text == "@[":
            return "attributed"
        if t.kind == "ident" and t.text in HELPER_WORDS:
            return "helper"
        if t.kind == "ident" and t.text == "import":
            return "import" if self.phase == "before" else None
        return {"open": "open", "set_option": "option"}.get(t.text) if t.kind == "ident" else None

    def _begin(self, t: Token, dedent: int | None = None) -> Refusal | None:
        if self.cmd is not None and (refusal := self._close(self.cmd)) is not None:
            return refusal
        kind = self._kind(t)
        if kind is None:
            reason = _forbidden(t)
            if reason is None and t.kind == "ident" and (t.text in COMMAND_WORDS or t.text in (
                    "open", "set_option", "import", "scoped")):  # fmt: skip
                reason = f"{t.text} (a new command)"
            if reason is None:
                what = t.text[0] if t.kind == "run" else t.text.split("\n", 1)[0][:40]
                return Refusal(f"forbidden: `{what}` at line {t.line}, " + _NO_COMMAND.format(col=dedent),
                               self.where_new)  # fmt: skip
            return Refusal(f"forbidden: {reason}", self.where_new)
        self.cmd = self._new(kind, t.start, t.col)
        self.cmd["end"] = t.start + len(t.text)
        if kind == "print":
            self.cmd["words"].append(t.text)
        if kind == "attributed":
            self.cmd["attribute"] = True
        return None

    def _core(self, cmd: dict, t: Token) -> Refusal | None:
        kind = self._kind(t)
        if kind not in ("helper", "open", "option"):
            return Refusal(f"forbidden: {_forbidden(t) or f'{t.text} (a new command)'}", self._where(cmd))
        cmd.update(kind=kind, pending=False, tokens=0, name="", value="", end=t.start + len(t.text))
        return None

    def _inside(self, cmd: dict, t: Token, first: bool) -> Refusal | None:
        if t.kind in ("run", "symbol"):
            reason = self._symbol(cmd, t)
            if reason is not None:
                return Refusal(reason, self.where_new)
        if cmd["await"]:
            cmd["block"], cmd["await"] = t.col, False
        cmd["tokens"] += 1
        cmd["end"] = t.start + len(t.text)
        if cmd["kind"] == "body":
            self.body_tokens += 1
        else:
            refusal = self._bookkeeping(cmd, t, first)
            if refusal is not None:
                return refusal
        if cmd["kind"] in ("import", "print"):
            return None
        if t.kind == "ident":
            if t.text in TERM_TACTICS:
                self._set(cmd, "term")
            elif t.text in TACTIC_WORDS:
                self._set(cmd, "tactic", sequence=True)
            cmd["after_then"] = False
        reason = self._rules(cmd, t)
        return None if reason is None else Refusal(f"forbidden: {reason}", self._where(cmd))

    def _bookkeeping(self, cmd: dict, t: Token, first: bool) -> Refusal | None:
        assign, cmd["assign"] = cmd["assign"], False
        depth = len(cmd["stack"]) - 1
        kind, n = cmd["kind"], cmd["tokens"]
        if kind == "print":
            cmd["words"].append(t.text)
        elif kind == "helper" and n == 1:
            cmd["name"] = t.text if t.kind == "ident" else ""
            if not cmd["name"]:
                return Refusal("forbidden: a declaration without a name", self._where(cmd))
            parts = name_parts(cmd["name"])
            parts = parts[1:] if parts[:1] == ["_root_"] else parts
            for k in range(len(parts)):
                if ".".join(parts[k:]) in self.names:
                    return Refusal(f"forbidden: redeclares `{'.'.join(parts[k:])}`, a name the statement uses",
                                   self._where(cmd))  # fmt: skip
        elif kind == "helper" and not cmd["in_proof"] and depth == 0 and t.text in (":=", "|"):
            cmd["in_proof"] = t.text == ":=" or first
            cmd["assign"] = t.text == ":="
        elif kind == "helper" and assign:
            cmd["await"] = t.text == "by"
        elif kind in ("open", "option") and t.text == "in" and depth == 0:
            cmd["pending"] = True
            return self._option(cmd) if kind == "option" else None
        elif kind == "option" and n == 1:
            cmd["name"] = t.text
        elif kind == "option" and n == 2:
            cmd["value"] = t.text
        return None

    def _option(self, cmd: dict) -> Refusal | None:
        name = cmd["name"]
        if not (name in HARMLESS_OPTIONS or any(name.startswith(p) for p in HARMLESS_OPTION_PREFIXES)):
            return Refusal(f"forbidden: set_option {name} (options allowed outside a proof: "
                           f"{', '.join(sorted(HARMLESS_OPTIONS))}, linter.*, pp.*)", self._where(cmd))  # fmt: skip
        if not (cmd["value"].isdigit() and cmd["value"].isascii()) and cmd["value"] not in ("true", "false"):
            return Refusal(f"forbidden: set_option {name} {cmd['value'][:40]} (a number, true or false)",
                           self._where(cmd))  # fmt: skip
        return None

    def _close(self, cmd: dict, last: bool = False) -> Refusal | None:
        if cmd["attribute"]:
            return Refusal("forbidden: attribute @[", self._where(cmd))
        kind = cmd["kind"]
        if kind == "body":
            self.body_end = cmd["end"] if cmd["tokens"] else 0
            return None
        if cmd["pending"]:
            if not (last and self.phase == "before"):
                return Refusal("forbidden: `in` followed by no declaration", self._where(cmd))
            if kind == "option":
                self.options.append(f"set_option {cmd['name']} {cmd['value']}")
            return None
        if kind == "option" and (refusal := self._option(cmd)) is not None:
            return refusal
        if kind == "helper" and not cmd["name"]:
            return Refusal("forbidden: a declaration without a name", self._where(cmd))
        if kind == "helper" and not cmd["in_proof"]:
            return Refusal("forbidden: a declaration without a proof", self._where(cmd))
        if kind == "print":
            words = cmd["words"]
            drop = len(words) == 3 and words[1] == "axioms" and _named(words[2]) == _named(self.target)
            return None if drop else Refusal("forbidden: #print", self._where(cmd))
        if kind in ("open", "option") and self.phase == "body":
            word = "open" if kind == "open" else "set_option"
            return Refusal(f"forbidden: {word} (a new command: after the proof it could change how `#print axioms` "
                           "reads the theorem's name, or prints it)", self._where(cmd))  # fmt: skip
        if kind == "option":
            self.options.append(f"set_option {cmd['name']} {cmd['value']}")
        if kind != "import":
            self.commands.append(" " * cmd["col"] + self.text[cmd["start"] : cmd["end"]] + "\n")
            self.scoped = self.scoped or kind in ("open", "option")
            self.helpers += kind == "helper"
        return None


def _closed(text: str) -> bool:
    """No comment, literal or interpolation open at the end of `text`: a sentinel after it is a token of its own."""
    tokens = lex(text + "\n#closed")
    opened = sum(1 for t in tokens if t.kind == "string" and t.text.endswith("{"))
    closed = sum(1 for t in tokens if t.kind == "string" and t.text.startswith("}"))
    last = tokens[-1]
    return opened == closed and (last.kind, last.text, last.start) == ("hash", "#closed", len(text) + 1)


def _named(name: str) -> list[str]:
    parts = name_parts(name)
    return parts[1:] if parts[:1] == ["_root_"] else parts


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
    if word.startswith(FORBIDDEN_OPTION_PREFIXES):
        return f"set_option {word}"
    for component in word.split("."):
        if component in FORBIDDEN_COMPONENTS:
            return _REASON_OF_COMPONENT.get(component, component)
    return None


def scan_forbidden(body: str) -> str | None:
    """A body and what follows it, for a theorem of no name: the first reason to refuse, or None."""
    result = _Plain(body, "body", frozenset(), "").run()
    return result.reason if isinstance(result, Refusal) else None


def statement_names(statement: str) -> frozenset[str]:
    names = set()
    for t in code_tokens(statement):
        if t.kind == "ident":
            parts = name_parts(t.text)
            for k in range(len(parts)):
                names.add(".".join(parts[k:]))
    return frozenset(names)


def prepare(model_text: str, formal_statement: str) -> str | Judgement:
    """Steps 1-3: the command to send, or the rejection that makes sending it unnecessary. A statement that
    differs gets the verdict and reason only (its detail is tested by hand)."""
    split = _split(model_text, formal_statement)
    if isinstance(split, IntegrityError):
        return Judgement("rejected", "statement_mismatch", "")
    before_text, body = split
    names = statement_names(formal_statement)
    before = _Plain(before_text, "before", names, "").run()
    if isinstance(before, Refusal):
        return _rejected("sorry" if before.reason in HOLES else "integrity", before.detail)
    if before[3] and not _closed("".join(before[0])):
        return _rejected("integrity", "before the statement: a comment, string or interpolation left open")
    tokens = code_tokens(formal_statement)
    name = next((b.text for a, b in zip(tokens, tokens[1:], strict=False)
                 if a.text in ("theorem", "lemma") and b.kind == "ident"), "")  # fmt: skip
    term = isinstance(body, TermBody)
    text = body.text if term else body
    after = _Plain(text, "body", names, name, term=term).run()
    if isinstance(after, Refusal):
        return _rejected("sorry" if after.reason in HOLES else "integrity", after.detail)
    commands, _, _, _, end, tokens = after
    if not tokens:
        return _rejected("lean_error", "empty proof: the attempt holds no Lean code")
    kept, options, scoped, helpers = before[:4]
    helper_text = "" if not helpers else ("section\n" + "".join(kept) + "end\n" if scoped else "".join(kept))
    text = text[:end] + ("\n" if end < len(text) else "") + "".join(commands)
    return assemble(formal_statement, text, term, helper_text, tuple(options))
