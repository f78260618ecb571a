"""A second reading of Lean text, for tests only: a per-character lexer and a plain command judge, against
which the linear-time production code (tasks.lean_text, verifier_pool.lean_commands, verifier_pool.lean_scan)
is compared on generated text (tests/verifier_pool/test_lean_check.py).

It is written otherwise than production, so that the comparison checks something. The lexer takes one Python
step per character where production takes runs by regular expressions; it returns (kind, start, end) spans
from pure functions where production emits into a shared list and deletes on failure; it reads a string
literal twice, plainly and as an interpolated string, with two functions whose ends are compared; it looks up
lines and columns per character. `forbidden` matches regular expressions against the dotted name where
production looks its components up in sets. The command judge keeps each command as a dict, rebuilds runs of
symbols from the one-character tokens and reads them a character at a time, and keeps open brackets in a list
of no depth cap. All of it costs seconds a megabyte: use it on short texts only.

Shared with production, imported rather than copied (data, not logic): the identifier character classes
(`is_id_first`, `is_id_rest`: Lean's `isLetterLike` and subscript tables), the symbols of several characters
(`_SYMBOLS`), MAX_NESTING, and the word and option tables of the scan (FORBIDDEN_WORDS, FORBIDDEN_COMPONENTS,
COMMAND_WORDS, TERM_TACTICS, HARMLESS_OPTIONS, ...). They are facts about Lean and about the verifier's
policy, not ways of reading text: a copy would only write each fact twice, and a wrong entry is caught by the
cases written by hand (tests/tasks/test_lean_text.py checks the classes at every code point against their
regular-expression form and on named characters; test_lean_check.py's EXPLOITS and CLEAN name the words),
never by a copy of the same entry. What is compared is everything done with them.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tasks.lean_text import _SYMBOLS, MAX_NESTING, is_id_first, is_id_rest
from verifier_pool.lean_commands import HARMLESS_OPTION_PREFIXES, HARMLESS_OPTIONS, HELPER_WORDS, SUFFIX_WORDS
from verifier_pool.lean_preamble import BINDER_OPTIONS, DEFINITION_WORDS, TAG_ATTRIBUTES
from verifier_pool.lean_scan import (
    _REASON_OF_COMPONENT,
    COMMAND_WORDS,
    FORBIDDEN_COMPONENTS,
    FORBIDDEN_OPTION_PREFIXES,
    FORBIDDEN_WORDS,
    LINE_START_WORDS,
    TACTIC_ITEMS,
    TACTIC_WORDS,
    TERM_TACTICS,
)


class Token(NamedTuple):
    kind: str  # ident | number | string | char | symbol | hash | comment | ambiguous (and `run`: _items)
    text: str
    start: int  # offset in code points
    line: int  # 1-based
    col: int  # 0-based, in code points


Span = tuple[str, int, int]  # (kind, start, end)

_DECIMAL = "0123456789"
_HEX = "0123456789abcdefABCDEF"
_BASES = {"x": _HEX, "X": _HEX, "b": "01", "B": "01", "o": "01234567", "O": "01234567"}


# --- the lexer ------------------------------------------------------------------------------------------------


def lex(text: str) -> list[Token]:
    """All tokens of `text`, comments included, in source order."""
    spans, _ = _code(text, 0, depth=0)
    lines, cols = _positions(text)
    return [Token(kind, text[start:end], start, lines[start], cols[start]) for kind, start, end in spans]


def mask_comments(text: str) -> str:
    """`text` with each character of a comment, but newlines, replaced by a space."""
    chars = list(text)
    for token in lex(text):
        if token.kind == "comment":
            for k in range(token.start, token.start + len(token.text)):
                chars[k] = chars[k] if chars[k] == "\n" else " "
    return "".join(chars)


def name_parts(ident: str) -> list[str]:
    """The parts of a dotted name, `«»` taken off: a part that starts with `«` runs to the next `»` (the one
    character after it is taken for the dot), any other to the next dot."""
    parts, rest = [], ident
    while rest:
        if rest[0] == "«":
            part, _, rest = rest[1:].partition("»")
            rest = rest[1:]
        else:
            part, _, rest = rest.partition(".")
        parts.append(part)
    return parts


def block_comment_end(text: str, i: int) -> int:
    """Where a block comment ends whose body starts at `i`: Lean's `finishCommentBlock` reads two characters
    at a time where they are `/-` (one level deeper) or `-/` (one level out), else one; at level 0 the comment
    is over. Strings mean nothing inside. No end: the text's."""
    level = 1
    while i < len(text) and level > 0:
        step = text[i : i + 2]
        level += (step == "/-") - (step == "-/")
        i += 2 if step in ("/-", "-/") else 1
    return i


def plain_string_end(text: str, i: int) -> int:
    """Where the string literal that opens at `text[i] == '"'` ends, read plainly: a backslash takes the
    character after it, whatever it is; the first other quote closes it. No end: the text's."""
    escaped = False
    for j in range(i + 1, len(text)):
        if escaped:
            escaped = False
        elif text[j] == "\\":
            escaped = True
        elif text[j] == '"':
            return j + 1
    return len(text)


def _positions(text: str) -> tuple[list[int], list[int]]:
    """The line (from 1) and column (from 0) of every offset of `text`, and of its end."""
    lines, cols, line, col = [], [], 1, 0
    for ch in text + "\n":
        lines.append(line)
        cols.append(col)
        line, col = (line + 1, 0) if ch == "\n" else (line, col + 1)
    return lines, cols


def _code(text: str, i: int, depth: int) -> tuple[list[Span], int] | None:
    """The tokens of code from `i`. At `depth` 0: to the text's end. Inside an interpolation (depth > 0): to
    the `}` that closes it (its offset is returned), or the text's end; None when a string literal inside reads
    differently plainly and interpolated (the outermost string is then reported, not this one)."""
    spans: list[Span] = []
    plain_only = False  # an ambiguous string was reported (depth 0): the text is refused, later ones are plain
    braces = 0  # `{` minus `}` read as symbols at this depth
    while i < len(text):
        c, pair = text[i], text[i : i + 2]
        if c in " \t\r\n":  # Lean's whitespace; other spaces are symbols (Lean: a token error)
            i += 1
            continue
        if depth > 0 and c == "}" and braces == 0:
            return spans, i
        if pair == "--":
            newline = text.find("\n", i)
            span = ("comment", i, len(text) if newline < 0 else newline)
        elif pair == "/-":
            span = ("comment", i, block_comment_end(text, i + (3 if text[i + 2 : i + 3] in ("-", "!") else 2)))
        elif c == '"':
            plain = plain_string_end(text, i)
            read = None if plain_only or depth >= MAX_NESTING else _interpolated(text, i, depth + 1)
            if plain_only:
                spans.append(("string", i, plain))
            elif read is not None and read[1] == plain:
                spans += read[0]
            elif depth > 0:
                return None
            else:
                plain_only = True
                spans.append(("ambiguous", i, plain))
            i = plain
            continue
        elif c == "'" and text[i + 1 : i + 2] != "'" and (end := _char_end(text, i)) is not None:
            after_symbol = bool(spans) and spans[-1][0] == "symbol" and spans[-1][2] == i
            span = ("ambiguous" if after_symbol else "char", i, end)
        elif c in _DECIMAL:
            span = ("number", i, _number_end(text, i))
        elif c == "r" and (raw := _raw_string(text, i)) is not None:
            span = raw
        elif c == "«" or is_id_first(c):
            span = ("ident", i, _ident_end(text, i))
        elif c == "#" and i + 1 < len(text) and is_id_first(text[i + 1]):
            end = i + 1
            while end < len(text) and is_id_rest(text[end]):
                end += 1
            span = ("hash", i, end)
        else:
            symbol = next((s for s in _SYMBOLS if text.startswith(s, i)), c)
            braces += symbol == "{"
            braces -= symbol == "}"
            span = ("symbol", i, i + len(symbol))
        spans.append(span)
        i = span[2]
    return spans, i


def _interpolated(text: str, i: int, depth: int) -> tuple[list[Span], int] | None:
    """The string that opens at `text[i]` read as Lean's `interpolatedStrFn`: its literal pieces as `string`
    spans (a piece ends with the `{` that opens code, the next starts at the `}` that closes it), the code in
    between as tokens; and where it ends. None: a string inside the code reads two ways."""
    spans: list[Span] = []
    piece, j = i, i + 1
    while j < len(text) and text[j] != '"':
        if text[j] == "\\":
            j += 2
            continue
        if text[j] != "{":
            j += 1
            continue
        spans.append(("string", piece, j + 1))
        inner = _code(text, j + 1, depth)
        if inner is None:
            return None
        spans += inner[0]
        if inner[1] >= len(text):  # the code ran to the end: the string never closes
            return spans, len(text)
        piece, j = inner[1], inner[1] + 1
    end = min(j + 1, len(text))  # past the closing quote, or the text's end
    spans.append(("string", piece, end))
    return spans, end


def _char_end(text: str, i: int) -> int | None:
    """The end of the character literal that opens at `text[i] == "'"` (Lean's `charLitFnAux`): one character
    but a backslash, or an escape (`\\x` and two hex digits, `\\u` and four, `\\u{...}`, or any one character,
    the first of these that a quote follows), then a quote. None: no literal opens there."""
    if text[i + 1 : i + 2] != "\\":
        return i + 3 if i + 1 < len(text) and text[i + 2 : i + 3] == "'" else None
    k = i + 2  # the escape's letter
    ends = []
    if text[k : k + 1] in ("x", "u"):
        digits = 2 if text[k] == "x" else 4
        if len(text[k + 1 : k + 1 + digits]) == digits and all(d in _HEX for d in text[k + 1 : k + 1 + digits]):
            ends.append(k + 1 + digits)
    if text[k : k + 2] == "u{":
        m = k + 2
        while m < len(text) and text[m] in _HEX:
            m += 1
        if m > k + 2 and text[m : m + 1] == "}":
            ends.append(m + 1)
    if k < len(text):
        ends.append(k + 1)
    return next((end + 1 for end in ends if text[end : end + 1] == "'"), None)


def _number_end(text: str, i: int) -> int:
    """The end of the numeral at `i`: `0x`/`0b`/`0o` and at least one digit of that base; else decimal digits,
    then a dot and digits (maybe none), then an exponent (`e`, a sign maybe, at least one digit) if whole."""

    def digits(at: int, allowed: str) -> int:
        while at < len(text) and text[at] in allowed:
            at += 1
        return at

    base = _BASES.get(text[i + 1 : i + 2]) if text[i] == "0" else None
    if base is not None and (end := digits(i + 2, base)) > i + 2:
        return end
    end = digits(i, _DECIMAL)
    if text[end : end + 1] == ".":
        end = digits(end + 1, _DECIMAL)
    if text[end : end + 1] in ("e", "E"):
        sign = end + 1 + (text[end + 1 : end + 2] in ("+", "-"))
        if (exponent := digits(sign, _DECIMAL)) > sign:
            end = exponent
    return end


def _raw_string(text: str, i: int) -> Span | None:
    """A raw string at `text[i] == "r"` (`r"..."`, `r#"..."#`: no escapes, closed by a quote and as many `#`),
    or None. `ambiguous` where a Lean without raw strings, reading `r`, the hashes and a plain string from the
    quote, ends that string elsewhere."""
    hashes = 0
    while text[i + 1 + hashes : i + 2 + hashes] == "#":
        hashes += 1
    quote = i + 1 + hashes
    if text[quote : quote + 1] != '"':
        return None
    closer = '"' + "#" * hashes
    found = text.find(closer, quote + 1)
    end = len(text) if found < 0 else found + len(closer)
    older = plain_string_end(text, quote) + hashes  # the plain string, then as many `#` as symbols
    return ("string" if older == end else "ambiguous", i, end)


def _ident_end(text: str, i: int) -> int:
    """The end of the name at `i` (Lean's `identFnAux`): parts joined by a dot where a part starts after it;
    a part is `«...»` or an identifier's first character and the rest. A `«` never closed runs to the end."""
    while True:
        if text[i] == "«":
            close = text.find("»", i + 1)
            if close < 0:
                return len(text)
            i = close + 1
        else:
            i += 1
            while i < len(text) and is_id_rest(text[i]):
                i += 1
        if not (text[i : i + 1] == "." and i + 1 < len(text) and (text[i + 1] == "«" or is_id_first(text[i + 1]))):
            return i
        i += 1


# --- the token rules and the commands ---------------------------------------------------------------------------


def _alternatives(words: frozenset[str] | tuple[str, ...]) -> str:
    return "|".join(re.escape(w) for w in sorted(words))


# The scan's token rules over the dotted name (its parts joined by dots, `«»` taken off): a forbidden word is
# the whole name, an option prefix starts it, a forbidden component stands between dots (or the name's ends).
_WHOLE_WORD = re.compile(f"(?:{_alternatives(FORBIDDEN_WORDS)})")
_OPTION_PREFIX = re.compile(f"(?:{_alternatives(FORBIDDEN_OPTION_PREFIXES)})")
_COMPONENT = re.compile(f"(?<![^.])({_alternatives(FORBIDDEN_COMPONENTS)})(?![^.])")


def forbidden(token: Token) -> str | None:
    """Why `token` alone is refused: an ambiguous literal, any `#` word, or a name that `_name_rule` refuses."""
    match token.kind:
        case "ambiguous":
            return f"ambiguous literal {token.text[:20]!r} at line {token.line}"
        case "hash":
            return token.text
        case "ident":
            return _name_rule(".".join(name_parts(token.text)))
    return None


def _name_rule(name: str) -> str | None:
    """Why a dotted name is refused: it is a forbidden word, sets a forbidden option, or has a forbidden
    component (the leftmost names the reason)."""
    if _WHOLE_WORD.fullmatch(name):
        return name
    if _OPTION_PREFIX.match(name):
        return f"set_option {name}"
    if found := _COMPONENT.search(name):
        return _REASON_OF_COMPONENT.get(found[1], found[1])
    return None


class Refused(NamedTuple):
    reason: str  # `forbidden: ...`
    where: str = ""  # "" (the proof body), "helper `NAME`", "before the statement", "after the proof"


# ("kept", commands, options, scoped, helpers, body_end, body_tokens, rules, closing, sections, namespaces,
#  definitions, helpers' names)
# | ("refused", reason, where)
Outcome = tuple


def scan_before(text: str, names: frozenset[str]) -> Outcome:
    """The text before the statement cut into commands: what each keeps, or the first refusal (the fields of
    verifier_pool.lean_commands `Kept` and `Refusal`, in their order; the declared definitions sorted).
    `names`: the statement's names."""
    return _Plain(text, "before", names).run()


def scan_body(
    text: str,
    names: frozenset[str] = frozenset(),
    term: bool = False,
    definitions: frozenset[str] = frozenset(),
) -> Outcome:
    """The proof body (a term with `term`), as `scan_before` says; what follows it is dropped at the command
    where Lean ends the proof. `definitions`: what the text before the statement declared."""
    return _Plain(text, "body", names, term=term, definitions=definitions).run()


def scan_forbidden(body: str) -> str | None:
    """A body: the first reason to refuse it, or None."""
    outcome = scan_body(body)
    return outcome[1] if outcome[0] == "refused" else None


_INERT_CHARS = frozenset("!$%&()*+,.;<=>?[\\^`|~-/#")
_NO_COMMAND = "left of the proof's column {col}: Lean ends the proof there and reads a command, which this is not"


def _items(text: str) -> list[Token]:
    """The code tokens, with each run of one-character symbols joined by spaces and tabs only (never a line
    break: a line's first token is its own) as one `run` token."""
    items: list[Token] = []
    last = None  # the previous token, comments included
    for t in lex(text):
        inert = t.kind == "symbol" and t.text in _INERT_CHARS
        joins = (
            inert
            and last is not None
            and last.kind == "symbol"
            and last.text in _INERT_CHARS
            and text[last.start + 1 : t.start].strip(" \t\r") == ""
        )
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
    """One text's commands, judged one token at a time: where Lean ends each command, what it keeps, and the
    first reason to refuse one (what verifier_pool.lean_commands `_Commands` answers)."""

    def __init__(
        self,
        text: str,
        phase: str,
        names: frozenset[str],
        term: bool = False,
        definitions: frozenset[str] = frozenset(),
    ) -> None:
        self.text, self.phase, self.names = text, phase, names
        self.done = False  # the body's end: the rest of the text is not read
        self.where_new = "before the statement" if phase == "before" else "after the proof"
        self.commands: list[str] = []
        self.options: list[str] = []
        self.scoped = False
        self.helpers = 0
        self.rules = 0
        self.closing = ""
        self.sections: tuple[str, ...] = ()
        self.definitions = set(definitions)
        self.helper_names: list[list[str]] = []  # each helper's full name, as parts
        self.scopes: list[tuple[str, str]] = []  # (namespace | section, name), innermost last
        self.body_end = -1
        self.body_tokens = 0
        self.cmd = None
        if phase == "body":
            self.cmd = self._new("body", 0, 0, "term" if term else "tactic")
            self.cmd["in_proof"], self.cmd["await"] = True, not term

    @staticmethod
    def _new(kind: str, start: int, col: int, mode: str = "term") -> dict:
        return {
            "kind": kind,
            "start": start,
            "col": col,
            "end": start,
            "tokens": 0,
            "name": "",
            "value": "",
            "words": [],
            "pending": False,
            "in_proof": False,
            "assign": False,
            "await": False,
            "block": None,
            "stack": [[mode, mode == "tactic", mode]],
            "after_then": False,
            "state": "code",
            "item": "",
            "field": False,
            "attribute": False,
            "definition": False,
            "noncomputable": False,
            "declaration_only": False,
            "rule_depth": None,
            "opened": False,
            "last": "",
            "previous": "",
            "aux_next": False,
            "in_where": False,
            "ctor": "",
        }

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

    def _newline(self, cmd: dict, term_next: bool = False) -> None:
        """A line starts. `term_next`: the line before ended in `:=`, `:` or `←`, so the line goes on with a term."""
        if cmd["stack"][-1][1] and not term_next:
            cmd["stack"][-1][0] = "tactic"
        cmd["after_then"] = False

    def _symbol(self, cmd: dict, t: Token) -> str | None:
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
        reason = forbidden(t)
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
        if t.kind == "number":
            return None
        if t.kind == "ident" and t.text in ("true", "false", "Bool.true", "Bool.false"):
            cmd["ctor"] = t.text
            return None
        if t.kind == "ident":
            cmd["field"] = self.text[t.start - 1] != "."
            if not cmd["field"]:
                cmd["ctor"] = "." + t.text
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
    def run(self) -> Outcome:
        result = self._run()
        return ("refused", *result) if isinstance(result, Refused) else result

    def _run(self) -> tuple | Refused:
        last_line = 0
        for t in _items(self.text):
            first = t.line != last_line
            last_line = t.line + t.text.count("\n")
            refusal = self._token(t, first)
            if refusal is not None:
                return refusal
            if self.done:
                break
        cmd = self.cmd
        if cmd is not None and cmd["kind"] == "body":
            self.body_end = len(self.text) if cmd["tokens"] else 0
            if cmd["attribute"]:
                return Refused("forbidden: attribute @[")
        elif cmd is not None and (refusal := self._close(cmd, last=True)) is not None:
            return refusal
        spaces: tuple[str, ...] = ()
        if self.phase == "before":  # every scope closed before the statement; its namespaces said (prepare's rule)
            self.closing = "".join(("end " + name).strip() + "\n" for _, name in self.scopes[::-1])
            spaces = tuple(name for kind, name in self.scopes if kind == "namespace")
        kept = (self.commands, self.options, self.scoped, self.helpers, self.body_end, self.body_tokens)
        declared = sorted(self.definitions), sorted(set(map(tuple, self.helper_names)))
        return ("kept", *kept, self.rules, self.closing, spaces, *declared)

    def _where(self, cmd: dict) -> str:
        if cmd["kind"] == "body":
            return ""
        if cmd["kind"] == "helper" and cmd["name"]:
            return f"helper `{cmd['name']}`"
        return self.where_new

    def _token(self, t: Token, first: bool) -> Refused | None:
        cmd = self.cmd
        word = t.text if t.kind == "ident" else None
        starts = t.kind == "hash" or word in COMMAND_WORDS or (word in LINE_START_WORDS and t.col == 0)
        starts = starts or word == "add_aesop_rules" or (t.text == "@[" and t.col == 0)
        if cmd is not None and cmd["kind"] == "attributes" and not cmd["pending"]:
            return self._inside(cmd, t, first)  # up to its `]`, an attribute's words start nothing
        if cmd is None:
            opener = (
                t.kind == "hash"
                or t.text == "@["
                or (
                    word is not None
                    and (
                        word in COMMAND_WORDS
                        or word in ("open", "set_option", "import", "scoped", "add_aesop_rules")
                        or forbidden(t) is not None
                    )
                )
            )
            return self._begin(t) if opener else None
        if first and cmd["block"] is not None and t.col < cmd["block"] and len(cmd["stack"]) == 1:
            if word in SUFFIX_WORDS:
                cmd["block"] = None
            else:
                return self._begin(t, dedent=cmd["block"])
        elif first:
            self._newline(cmd, term_next=cmd["last"] in (":=", ":", "←"))
        starts = starts or (word in ("open", "set_option", "import") and (not cmd["in_proof"] or cmd["pending"]))
        if starts and cmd["pending"]:
            return self._core(cmd, t)
        if starts or (cmd["kind"] == "scope" and t.kind != "ident"):
            return self._begin(t)
        return self._inside(cmd, t, first)

    def _kind(self, t: Token) -> str | None:
        if t.kind == "hash":
            return "print" if t.text == "#print" else None
        if t.text == "@[":
            return "attributes" if self.phase == "before" else "attributed"
        if t.kind == "ident" and t.text in HELPER_WORDS:
            return "helper"
        if t.kind == "ident" and t.text == "end" and (self.phase == "before" or self.scopes):
            return "scope"
        if t.kind == "ident" and self.phase == "before":
            if t.text in DEFINITION_WORDS:
                return "definition"
            if t.text in ("namespace", "section"):
                return "scope"
            if t.text in ("noncomputable", "add_aesop_rules"):
                return "noncomputable" if t.text == "noncomputable" else "aesop"
        if t.kind == "ident" and t.text == "import":
            return "import" if self.phase == "before" else None
        return {"open": "open", "set_option": "option"}.get(t.text) if t.kind == "ident" else None

    def _begin(self, t: Token, dedent: int | None = None) -> Refused | None:
        if self.cmd is not None and (refusal := self._close(self.cmd)) is not None:
            return refusal
        if self.phase == "body":  # the proof ended at `t`
            command = t.kind == "hash" or t.text == "@[" or t.text in COMMAND_WORDS
            if command or t.text in ("open", "set_option", "import", "scoped", "add_aesop_rules"):
                self.cmd, self.done = None, True
                return None
            reason = forbidden(t)
            if reason is not None:
                return Refused(f"forbidden: {reason}", self.where_new)
            what = t.text[0] if t.kind == "run" else t.text.split("\n", 1)[0][:40]
            return Refused(f"forbidden: `{what}` at line {t.line}, " + _NO_COMMAND.format(col=dedent), self.where_new)
        kind = self._kind(t)
        if kind is None:
            reason = forbidden(t)
            if (
                reason is None
                and t.kind == "ident"
                and (t.text in COMMAND_WORDS or t.text in ("open", "set_option", "import", "scoped", "add_aesop_rules"))
            ):
                reason = f"{t.text} (a new command)"
            if reason is None:
                what = t.text[0] if t.kind == "run" else t.text.split("\n", 1)[0][:40]
                return Refused(
                    f"forbidden: `{what}` at line {t.line}, " + _NO_COMMAND.format(col=dedent), self.where_new
                )
            return Refused(f"forbidden: {reason}", self.where_new)
        self.cmd = self._new("helper" if kind == "definition" else kind, t.start, t.col)
        self.cmd["end"] = t.start + len(t.text)
        self.cmd["last"] = t.text
        self.cmd["definition"] = kind == "definition"
        self.cmd["pending"] = kind == "noncomputable"
        if kind in ("print", "scope"):
            self.cmd["words"].append(t.text)
        if kind == "attributed":
            self.cmd["attribute"] = True
        return None

    def _core(self, cmd: dict, t: Token) -> Refused | None:
        kind = self._kind(t)
        if cmd["kind"] == "attributes":
            allowed = ["helper", "definition", "noncomputable"]
        elif cmd["kind"] == "noncomputable":
            allowed = ["definition"] + (["scope"] if t.text == "section" and not cmd["declaration_only"] else [])
        else:
            allowed = ["helper", "open", "option", "definition", "attributes", "noncomputable"]
        if kind not in allowed:
            return Refused(f"forbidden: {forbidden(t) or f'{t.text} (a new command)'}", self._where(cmd))
        if kind != "scope":
            cmd["declaration_only"] = True
        else:
            cmd["noncomputable"] = True
            cmd["words"].append(t.text)
        cmd.update(kind=kind, pending=kind == "noncomputable", tokens=0, name="", value="", end=t.start + len(t.text))
        if kind == "definition":
            cmd.update(kind="helper", definition=True)
        return None

    def _inside(self, cmd: dict, t: Token, first: bool) -> Refused | None:
        if cmd["kind"] == "attributes" and not cmd["pending"]:
            cmd["end"] = t.start + len(t.text)
            return self._attribute(cmd, t)
        if t.kind in ("run", "symbol"):
            reason = self._symbol(cmd, t)
            if reason is not None:
                return Refused(reason, self.where_new)
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
        if cmd["kind"] in ("import", "print", "scope"):
            return None
        if t.kind == "ident":
            refusal = self._declares(cmd, t, first)
            if refusal is not None:
                return refusal
        cmd["opened"] = t.kind in ("run", "symbol") and t.text[-1] == "("
        after = cmd["last"] in ("add", "add_aesop_rules")
        cmd["last"] = t.text
        phase = t.kind == "ident" and t.text == "unsafe" and not first and after and self._at_rule(cmd)
        if phase and len(cmd["stack"]) - 1 == (cmd["rule_depth"] or 0):
            return None  # aesop's rule phase
        if t.kind == "ident":
            if t.text in TERM_TACTICS:
                self._set(cmd, "term")
            elif t.text in TACTIC_WORDS:
                self._set(cmd, "tactic", sequence=True)
            cmd["after_then"] = False
        cmd["ctor"] = ""
        reason = self._rules(cmd, t)
        if reason is None and cmd["ctor"] and _last(cmd["ctor"]) in self.definitions:
            reason = (
                f"config value `{cmd['ctor'][:40]}` may name a definition of the attempt (configuration is evaluated)"
            )
        return None if reason is None else Refused(f"forbidden: {reason}", self._where(cmd))

    def _attribute(self, cmd: dict, t: Token) -> Refused | None:
        reason = forbidden(t)
        if reason is not None:
            return Refused(f"forbidden: {reason}", self._where(cmd))
        if t.kind == "ident" or t.text == ",":
            cmd["words"].append(t.text)
            return None
        if t.text != "]":
            return Refused(f"forbidden: attribute @[{' '.join(cmd['words'] + [t.text])[:40]}", self._where(cmd))
        groups: list[list[str]] = [[]]
        for w in cmd["words"]:
            if w == ",":
                groups.append([])
            else:
                groups[-1].append(w)
        for group in groups:
            if tuple(group) not in TAG_ATTRIBUTES:
                return Refused(f"forbidden: attribute @[{' '.join(group)[:40]}", self._where(cmd))
        cmd["pending"] = True
        return None

    def _at_rule(self, cmd: dict) -> bool:
        if cmd["rule_depth"] is not None and len(cmd["stack"]) - 1 < cmd["rule_depth"]:
            cmd["rule_depth"] = None
        return cmd["kind"] == "aesop" or cmd["rule_depth"] is not None

    def _declares(self, cmd: dict, t: Token, first: bool) -> Refused | None:
        """`let rec` and `where` names, and the names in an aesop rule."""
        if cmd["aux_next"] or (cmd["in_where"] and first):
            self.definitions.update(_named(t.text)[-1:])
            cmd["aux_next"] = False
        elif (t.text == "rec" and cmd["previous"] == "let") or t.text == "where":
            cmd["aux_next"] = True
            cmd["in_where"] = cmd["in_where"] or t.text == "where"
        if t.text == "add" and cmd["opened"]:
            cmd["rule_depth"] = len(cmd["stack"]) - 1
        elif self._at_rule(cmd):
            if t.text == "tactic":
                return Refused(
                    "forbidden: aesop rule builder `tactic` (aesop runs the rule's compiled code)", self._where(cmd)
                )
            if set(_named(t.text)) & self.definitions:
                return Refused(
                    f"forbidden: aesop rule `{t.text[:40]}` names a definition of the attempt "
                    "(aesop may run it as a tactic)",
                    self._where(cmd),
                )
        cmd["previous"] = t.text
        return None

    def _bookkeeping(self, cmd: dict, t: Token, first: bool) -> Refused | None:
        assign, cmd["assign"] = cmd["assign"], False
        depth = len(cmd["stack"]) - 1
        kind, n = cmd["kind"], cmd["tokens"]
        if kind == "print":
            cmd["words"].append(t.text)
        elif kind == "scope":
            reason = forbidden(t)
            if reason is not None:
                return Refused(f"forbidden: {reason}", self._where(cmd))
            cmd["words"].append(t.text)
        elif kind == "helper" and n == 1:
            cmd["name"] = t.text if t.kind == "ident" else ""
            if not cmd["name"]:
                return Refused("forbidden: a declaration without a name", self._where(cmd))
            parts = _named(cmd["name"])
            if name_parts(cmd["name"])[:1] != ["_root_"]:
                parts = [p for kind, name in self.scopes if kind == "namespace" for p in _named(name)] + parts
            self.helper_names.append(parts)
            if cmd["definition"]:
                self.definitions.update(parts[-1:])
            for k in range(len(parts)):
                if ".".join(parts[k:]) in self.names:
                    return Refused(
                        f"forbidden: redeclares `{'.'.join(parts[k:])}`, a name the statement uses", self._where(cmd)
                    )
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

    def _option(self, cmd: dict) -> Refused | None:
        name = cmd["name"]
        allowed = HARMLESS_OPTIONS | BINDER_OPTIONS
        if not (name in allowed or any(name.startswith(p) for p in HARMLESS_OPTION_PREFIXES)):
            return Refused(
                f"forbidden: set_option {name} (options allowed outside a proof: "
                f"{', '.join(sorted(allowed))}, linter.*, pp.*)",
                self._where(cmd),
            )
        if name in BINDER_OPTIONS and cmd["value"] not in ("true", "false"):
            return Refused(f"forbidden: set_option {name} {cmd['value'][:40]} (true or false)", self._where(cmd))
        if not (cmd["value"].isdigit() and cmd["value"].isascii()) and cmd["value"] not in ("true", "false"):
            return Refused(
                f"forbidden: set_option {name} {cmd['value'][:40]} (a number, true or false)", self._where(cmd)
            )
        return None

    def _close(self, cmd: dict, last: bool = False) -> Refused | None:
        if cmd["attribute"]:
            return Refused("forbidden: attribute @[", self._where(cmd))
        kind = cmd["kind"]
        if kind == "body":
            self.body_end = cmd["end"] if cmd["tokens"] else 0
            return None
        if cmd["pending"]:
            if kind == "attributes":
                return Refused(f"forbidden: attribute @[{' '.join(cmd['words'])}] before no helper", self._where(cmd))
            if kind == "noncomputable":
                return Refused("forbidden: noncomputable before no helper", self._where(cmd))
            if not (last and self.phase == "before"):
                return Refused("forbidden: `in` followed by no declaration", self._where(cmd))
            if kind == "option" and cmd["name"] not in BINDER_OPTIONS:
                self.options.append(f"set_option {cmd['name']} {cmd['value']}")
            return None
        if kind == "attributes":
            return Refused("forbidden: attribute @[ left open", self._where(cmd))
        if kind == "scope":
            refusal = self._scope(cmd)
            if refusal is not None:
                return refusal
        if kind == "option" and (refusal := self._option(cmd)) is not None:
            return refusal
        if kind == "helper" and not cmd["name"]:
            return Refused("forbidden: a declaration without a name", self._where(cmd))
        if kind == "helper" and not cmd["in_proof"]:
            return Refused("forbidden: a declaration without a proof", self._where(cmd))
        if kind == "print":
            words = cmd["words"]
            named = _named(words[2]) if len(words) == 3 else []
            ours = any(named and full[-len(named) :] == named and len(full) >= len(named) for full in self.helper_names)
            drop = len(words) == 3 and words[1] == "axioms" and ours
            return None if drop else Refused("forbidden: #print", self._where(cmd))
        if kind == "option" and cmd["name"] not in BINDER_OPTIONS:
            self.options.append(f"set_option {cmd['name']} {cmd['value']}")
        if kind != "import":
            self.commands.append(" " * cmd["col"] + self.text[cmd["start"] : cmd["end"]] + "\n")
            self.scoped = self.scoped or kind in ("open", "option")
            self.helpers += kind == "helper"
            self.rules += kind == "aesop"
        return None

    def _scope(self, cmd: dict) -> Refused | None:
        word, names = cmd["words"][0], cmd["words"][1:]
        if len(names) > 1 or (word == "namespace" and not names):
            return Refused(f"forbidden: {word} {' '.join(names)[:40]} (one name)", self._where(cmd))
        name = "".join(names)
        if cmd["noncomputable"] and word != "section":
            return Refused(f"forbidden: noncomputable {word}", self._where(cmd))
        if word != "end":
            self.scopes.append((word, name))
            return None
        if not self.scopes or self.scopes[-1][1] != name:
            return Refused(f"forbidden: {('end ' + name).strip()} closes no scope open here", self._where(cmd))
        self.scopes.pop()
        return None


def _last(written: str) -> str:
    """The last component of a literal name as written (`.evil`, `Bool.true`), "" for none."""
    parts = _named(written[1:] if written.startswith(".") else written)
    return parts[-1] if parts else ""


def _named(name: str) -> list[str]:
    """The parts of a name as a constant: a leading `_root_` says only where to look it up."""
    parts = name_parts(name)
    return parts[parts[:1] == ["_root_"] :]
