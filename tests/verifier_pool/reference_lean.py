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


# --- verifier_pool/lean_check.py at 3bfc89f: the text steps of prepare -----------------------------------

import textwrap  # noqa: E402

from tasks.lean_proof import IntegrityError, TermBody, assemble  # noqa: E402
from verifier_pool.judgement import Judgement  # noqa: E402
from verifier_pool.lean_check import (  # noqa: E402
    _REASON_OF_COMPONENT,
    COMMAND_WORDS,
    FORBIDDEN_COMPONENTS,
    FORBIDDEN_OPTION_PREFIXES,
    FORBIDDEN_WORDS,
    HOLES,
    LINE_START_WORDS,
    TACTIC_ITEMS,
    _rejected,
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
        if text[end : end + 3] == " by" and not (is_id_rest(after_by) or after_by in ".«"):
            return _body_from(code, origin[end + 2] + 1)
        return TermBody(_body_from(code, origin[end - 1] + 1))
    if any(t.kind == "ident" and t.text in ("theorem", "lemma", "example") for t in code_tokens(code)):
        return IntegrityError("the canonical statement is missing or altered")
    return _bare_body(code)


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


def scan_forbidden(body: str) -> str | None:
    """A short reason (`"forbidden: native_decide"`) if the body contains a forbidden construct, else None.

    The first token, in source order, that breaks a rule names the reason. Issue 13's rules (attributes,
    `eval%`, configuration values) are written here by looking ahead in the token list, not as the state
    machine `lean_check._Scan` uses on merged tokens: two readings of one rule, compared on random text.
    """
    tokens = code_tokens(body)
    context = _context_reasons(body, tokens)
    for k, token in enumerate(tokens):
        reason = _forbidden(token) or context.get(k)
        if reason is not None:
            return f"forbidden: {reason}"
    if tokens and tokens[-1].text == "@[":
        return "forbidden: attribute @["
    return None


def _context_reasons(body: str, tokens: list[Token]) -> dict[int, str]:
    """Token index -> reason, for the rules that depend on a token's neighbours."""
    reasons: dict[int, str] = {}
    for k, token in enumerate(tokens):
        if token.text == "@[" and k + 1 < len(tokens):
            after = tokens[k + 1]
            reasons[k + 1] = f"attribute @[{after.text[:40]}" if after.kind == "ident" else "attribute @["
        if token.kind == "ident" and token.text == "eval" and body[token.start + 4 : token.start + 5] == "%":
            reasons.setdefault(k, "eval%")
    k = 0
    while k + 2 < len(tokens):
        opens, name, assign = tokens[k : k + 3]
        is_item = opens.text == "(" and name.kind == "ident" and name.text not in TACTIC_ITEMS
        if not (is_item and assign.text == ":="):
            k += 1
            continue
        k += 3  # the value: literals up to the first `)`
        bad = f"config term ({name.text[:40]} := ...)"
        while k < len(tokens) and tokens[k].text != ")":
            token = tokens[k]
            literal = token.kind == "number" or token.text in ("true", "false", "{", "}", "[", "]", ",", ".")
            if token.kind == "ident" and not literal and body[token.start - 1 : token.start] != ".":
                if k + 1 < len(tokens) and tokens[k + 1].text == ":=":  # a field name in `{ name := ... }`
                    k += 2
                    continue
                reasons.setdefault(k + 1, bad)  # whatever follows it, or nothing at the end of the text
                break
            if not literal and token.kind != "ident":
                reasons.setdefault(k, bad)
                break
            k += 1
    return reasons


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
    if word in COMMAND_WORDS:
        return f"{word} (a new command)"
    if word in LINE_START_WORDS and token.col == 0:
        return f"{word} at the start of a line (a new command)"
    return None


def prepare(model_text: str, formal_statement: str) -> str | Judgement:
    """Steps 1-3: the command to send, or the rejection that makes sending it unnecessary."""
    body = extract_proof_body(model_text, formal_statement)
    if isinstance(body, IntegrityError):
        return Judgement("rejected", "integrity", body.detail)
    text = body.text if isinstance(body, TermBody) else body
    if not code_tokens(text):  # nothing but whitespace and comments: no Lean run can prove anything with it
        return _rejected("lean_error", "empty proof: the attempt holds no Lean code")
    reason = scan_forbidden(text)
    if reason is not None:
        return _rejected("sorry" if reason in HOLES else "integrity", reason)
    return assemble(formal_statement, text, term=isinstance(body, TermBody))
