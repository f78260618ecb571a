"""A Lean 4 lexer good enough for security scanning: what is code, what is comment, what is a literal.

It follows Lean's own token functions (`Lean.Parser.Basic`/`Lean.Parser.Types` in lean4: `whitespace`,
`finishCommentBlock`, `tokenFnCore`, `identFnAux`, `isIdFirst`/`isIdRest` in `Init/Meta`), because a scanner
that splits text differently from Lean can be fooled: `sor/- x -/ry` is not a `sorry`, a `sorry` inside
`/- /- -/ -/` is a comment, and `"-/" sorry` is code. Lean decides some things with its token table, which
we do not have; where that changes what is code, the lexer says `ambiguous` and the scan rejects the text:
- a character literal right after a symbol (`+'"'`: if `+'` were a token, Lean would read a string next);
- a string literal whose `{...}` parts end it elsewhere when read as an interpolated string (`s!"..."`,
  `throwError "..."` and others parse `{term}` inside strings, and which syntaxes do is grammar, not lexing);
- a raw string (`r"\"`) that a Lean without raw strings would end elsewhere.
Every string is therefore also read as an interpolated one and the code inside its braces is scanned; a
plain string such as `"{sorry}"` is scanned as code (a false positive no proof needs to fear).

Kinds: ident (dotted names, `«»` parts, `!`/`?`/`'` inside: `exact?`, `h'`, `s!`), number, string (a whole
literal, or the literal pieces of an interpolated one), char, symbol (one character, or one of `_SYMBOLS`),
hash (`#eval`, `#exit`, ...), comment (`--`, `/- -/`, `/-- -/`, `/-! -/`, nested), ambiguous.

The text is untrusted and may be megabytes long, so every step is linear in it and runs of characters are
taken by one regular expression each (whitespace, identifier characters, string bodies, comment nesting),
never a Python step per character. `lex(text, merge=True)`, for scans of model text, also takes a run of
symbols that start nothing (`(((`, `+ - *`) as one `symbol` token and consecutive line comments as one
`comment` token: megabytes of parentheses are then one token, not millions.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_NESTING = 32  # interpolations inside interpolations: deeper than any real text, and bounds the recursion

_NUMBER_PATTERN = r"0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO][0-7]+|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?"
_NUMBER = re.compile(_NUMBER_PATTERN)
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


# The same sets as regex classes, for runs (tests check them against the functions at every code point).
_LETTER_LIKE_RANGES = (
    (0x3B1, 0x3BA),
    (0x3BC, 0x3C9),
    (0x391, 0x39F),
    (0x3A1, 0x3A2),
    (0x3A4, 0x3A9),
    (0x3CA, 0x3FB),
    (0x1F00, 0x1FFE),
    (0x2100, 0x214F),
    (0x1D49C, 0x1D59F),
    (0xC0, 0xD6),
    (0xD8, 0xF6),
    (0xF8, 0xFF),
    (0x100, 0x17F),
)
_SUBSCRIPT_RANGES = ((0x2080, 0x2089), (0x2090, 0x209C), (0x1D62, 0x1D6A), (0x2C7C, 0x2C7C))


def _ranges(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in ranges)


ID_FIRST_CLASS = f"[a-zA-Z_{_ranges(_LETTER_LIKE_RANGES)}]"
ID_REST_CLASS = f"[a-zA-Z_0-9'!?{_ranges(_LETTER_LIKE_RANGES)}{_ranges(_SUBSCRIPT_RANGES)}]"
_WHITESPACE = re.compile(r"[ \t\r\n]+")
_NOT_NEWLINE = re.compile(r"[^\n]")
_PART = f"(?:«[^»]*+»|{ID_FIRST_CLASS}{ID_REST_CLASS}*+)"
_IDENT = re.compile(rf"{_PART}(?:\.{_PART})*+")  # identFnAux: parts joined by dots; `«` unclosed: see ident_end
_HASH = re.compile(f"#{ID_REST_CLASS}*+")
# Symbol characters that begin no other token and no symbol of several characters (`:=`, `@[`, `]'`, `''`),
# joined by whitespace: `merge` takes such a run as one token, from its first symbol to its last.
_INERT = rf"(?:[!$%&()*+,.;<=>?\[\\^`|~]++|-(?!-)|/(?!-)|#(?!{ID_FIRST_CLASS}))"
_INERT_RUN = re.compile(rf"{_INERT}++(?:[ \t\r]++{_INERT}++)*+")  # within a line: a line's first token is its own
_LINE_COMMENTS = re.compile(r"--[^\n]*+(?:[ \t\r\n]++--[^\n]*+)*+")
# For `comments()`: at depth 0, a run of whole tokens that can hold no comment and start no literal, the way
# `_Lexer.code` would split it (identifiers without `«` parts and not a raw string's `r`, numbers, `#` words,
# symbols that start nothing, braces, whitespace), skipped in one match.
_PLAIN_IDENT = rf'(?!r#*"){ID_FIRST_CLASS}{ID_REST_CLASS}*+(?:\.{ID_FIRST_CLASS}{ID_REST_CLASS}*+)*+(?!\.«)'
# Any other symbol too, but for those that begin a longer symbol ending in a quote (`]'`, `⁻¹'`, `×'`, ...).
_QUIET_SYMBOL = rf"(?!{ID_FIRST_CLASS})[^\s\w'\"«»\-/{{}}#⁻\]×⊕∑∏∘]"
_NO_COMMENT_RUN = re.compile(
    rf"(?:[ \t\r\n]++|{_PLAIN_IDENT}|{_INERT}|{_QUIET_SYMBOL}|{_NUMBER_PATTERN}|#{ID_REST_CLASS}*+|[{{}}])++"
)
# A plain string's rest after its opening quote, escapes skipped (`\` takes the next character, any).
_PLAIN_STRING_REST = re.compile(r'[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_INTERPOLATED_PIECE = re.compile(r'[^"\\{]*+(?:\\.[^"\\{]*+)*+', re.DOTALL)
# Nesting events of a block comment, read as finishCommentBlock reads them (from the body's start, a `-/` or
# `/-` takes two characters, anything else one). In a run of alternating `/` and `-` that reading pairs the
# characters from the run's start, so a run is k events of one kind: `(?:/-)++` or `(?:-/)++` each.
_COMMENT_EVENTS = re.compile(r"(?:/-)++|(?:-/)++")


def name_parts(ident: str) -> list[str]:
    """The components of a dotted identifier with `«»` removed: `Lean.«ofReduceBool»` -> [Lean, ofReduceBool].

    Comparing components, not spellings, is what makes `«sorryAx»` and `_root_.sorryAx` the same constant.
    """
    if "«" not in ident:  # the common case, in one C call; a trailing dot ends the name, as below
        parts = ident.split(".")
        return parts[:-1] if parts[-1] == "" else parts
    parts, i = [], 0
    while i < len(ident):
        if ident[i] == "«":
            j = ident.find("»", i + 1)
            j = len(ident) if j < 0 else j
            parts.append(ident[i + 1 : j])
            i = j + 1
        else:
            j = ident.find(".", i)
            j = len(ident) if j < 0 else j
            parts.append(ident[i:j])
            i = j
        i += 1  # the dot
    return parts


def block_comment_end(text: str, i: int) -> int:
    """End of a block comment whose body starts at `i` (after `/-`, `/--` or `/-!`): Lean's
    `finishCommentBlock`, which nests on `/-` and knows nothing of strings. Unterminated: the rest of the text
    (Lean reports an error there)."""
    nesting = 1
    for run in _COMMENT_EVENTS.finditer(text, i):
        events = (run.end() - run.start()) // 2
        if text[run.start()] == "/":
            nesting += events
        elif events >= nesting:
            return run.start() + 2 * nesting
        else:
            nesting -= events
    return len(text)


def plain_string_end(text: str, i: int) -> int:
    """End of the string literal that opens at `text[i] == '"'`, read as a plain (not interpolated) one."""
    m = _PLAIN_STRING_REST.match(text, i + 1)
    return len(text) if m is None else m.end()


def lex(text: str, merge: bool = False, stop: Callable[[Token], bool] | None = None) -> list[Token]:
    """All tokens of `text`, comments included, in source order. With `merge`, a run of symbols that start
    nothing else (and the whitespace inside it) is one `symbol` token, and line comments separated only by
    whitespace are one `comment` token; identifiers, literals, `#` words and the other symbols are the same.
    With `stop`, lexing ends after the first token outside any string literal for which `stop` is true (the
    tokens inside a literal are final only once the literal is: an ambiguous one replaces them)."""
    lexer = _Lexer(text, merge, stop=stop)
    with contextlib.suppress(_Stopped):
        lexer.code(0, depth=0)
    return lexer.out


def comments(text: str) -> list[Token]:
    """The comment tokens of `lex(text, merge=True)`, fast: stretches that can hold no comment are skipped by
    one match each (megabytes of identifiers cost one regex run, not a token each)."""
    lexer = _Lexer(text, merge=True, comments_only=True)
    lexer.code(0, depth=0)
    return [t for t in lexer.out if t.kind == "comment"]


def code_tokens(text: str, merge: bool = False) -> list[Token]:
    """The code view: every token but comments. String and char literals stay as single tokens so that the
    caller sees where they are without reading their contents as code."""
    return [t for t in lex(text, merge) if t.kind != "comment"]


def closed(text: str) -> bool:
    """Whether `text` leaves no comment, string literal or interpolation open at its end, so that whatever is
    placed after it is read as code of its own: a sentinel lexed after it comes out as a token of its own
    (not inside a comment or literal), and every interpolation `{` opened in a string piece is closed."""
    tokens = lex(text + "\n#closed")
    depth = sum(t.text.endswith("{") - t.text.startswith("}") for t in tokens if t.kind == "string")
    last = tokens[-1]
    return depth == 0 and last.kind == "hash" and last.text == "#closed" and last.start == len(text) + 1


def mask_comments(text: str) -> str:
    """`text` with every comment replaced by spaces (newlines kept), so offsets stay valid."""
    pieces, at = [], 0
    for t in lex(text):
        if t.kind == "comment":
            pieces += [text[at : t.start], _NOT_NEWLINE.sub(" ", t.text)]
            at = t.start + len(t.text)
    pieces.append(text[at:])
    return "".join(pieces)


class _Ambiguous(Exception):
    """A string literal inside an interpolation reads differently as plain and as interpolated."""


class _Stopped(Exception):
    """`lex(stop=...)` found its token."""


class _Lexer:
    def __init__(
        self, text: str, merge: bool = False, comments_only: bool = False, stop: Callable[[Token], bool] | None = None
    ) -> None:
        self.text = text
        self.merge = merge
        self.comments_only = comments_only
        self.stop = stop
        self.checked = 0  # tokens of `out` that `stop` has seen
        self.out: list[Token] = []
        # After the first ambiguous string the text is rejected anyway: later strings are read plainly only.
        self.poisoned = False
        # Line and column of the last emitted start, advanced by counting newlines in between (tokens come in
        # source order, but for the one `ambiguous` token that replaces a string's pieces).
        self._at, self._line, self._line_start = 0, 1, 0

    def emit(self, kind: str, start: int, end: int) -> None:
        text = self.text
        if start < self._at:
            self._at, self._line, self._line_start = 0, 1, 0
        newlines = text.count("\n", self._at, start)
        if newlines:
            self._line += newlines
            self._line_start = text.rfind("\n", self._at, start) + 1
        self._at = start
        self.out.append(Token(kind, text[start:end], start, self._line, start - self._line_start))

    def code(self, i: int, depth: int) -> int:
        """Lex code from `i`. Inside an interpolation (depth > 0), stop at its closing `}` and return its index."""
        text, braces = self.text, 0
        while i < len(text):
            if depth == 0 and self.stop is not None and self.checked < len(self.out):
                self._check_stop()
            c = text[i]
            if depth == 0 and self.comments_only and (run := _NO_COMMENT_RUN.match(text, i)):
                i = run.end()
            elif c in " \t\r\n":  # Lean's whitespace; any other space character is a token error in Lean
                i = _WHITESPACE.match(text, i).end()
            elif text.startswith("--", i):
                if self.merge:
                    end = _LINE_COMMENTS.match(text, i).end()
                else:
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
                i = self.take("hash", i, _HASH.match(text, i).end())
            elif depth > 0 and c == "}" and braces == 0:
                return i
            elif self.merge and (run := _INERT_RUN.match(text, i)):
                i = self.take("symbol", i, run.end())
            else:
                braces += (c == "{") - (c == "}")
                symbol = next((s for s in _SYMBOLS if text.startswith(s, i)), c)
                i = self.take("symbol", i, i + len(symbol))
        if depth == 0 and self.stop is not None:
            self._check_stop()
        return i

    def _check_stop(self) -> None:
        for k in range(self.checked, len(self.out)):
            if self.stop(self.out[k]):
                del self.out[k + 1 :]
                raise _Stopped
        self.checked = len(self.out)

    def take(self, kind: str, start: int, end: int) -> int:
        self.emit(kind, start, end)
        return end

    def ident_end(self, i: int) -> int:
        """Lean's `identFnAux`: parts joined by `.` when a part-start follows the dot."""
        text = self.text
        m = _IDENT.match(text, i)
        if m is None or text.startswith(".«", m.end()):
            return len(text)  # an unterminated `«` escape (the first part, or after a dot): Lean reports an error
        return m.end()

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
        while (j := _INTERPOLATED_PIECE.match(text, j).end()) < len(text):
            c = text[j]  # what ended the literal piece: a quote, a `{`, or a backslash with nothing after it
            if c == "\\":
                break
            if c == '"':
                return self.take("string", piece, j + 1)
            self.emit("string", piece, j + 1)
            j = self.code(j + 1, depth)
            if j >= len(text):
                return len(text)
            piece, j = j, j + 1
        self.emit("string", piece, len(text))
        return len(text)
