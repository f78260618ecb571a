"""A model's Lean text as Lean's parser cuts it into commands, and which of them go to Lean with the proof.

Two texts are read (tasks.lean_proof splits the attempt at the canonical statement):
- the text before the statement (`scan_before`): `import` lines are dropped (the trusted header replaces
  them); `open`, options from a short harmless list, helper declarations (`lemma`/`theorem`/`def`/`abbrev`,
  each scanned by the rules of a proof body, with tag attributes), scopes and `add_aesop_rules` are kept, in
  order (verifier_pool.lean_preamble: the rules for definitions, tags, scopes and aesop rules); anything else
  is refused, naming it.
- the proof body (`scan_body`): the proof ends where Lean ends it, and Lean reads a command there; that
  command and everything after it are dropped unread. Lean elaborates the target theorem before anything that
  follows it, and the verifier asks `#print axioms` and runs the audit as commands of its own, so nothing
  after the proof can change the verdict; a text that goes on with no command there (a line left of the
  proof's column that Lean cannot read as one) is refused: Lean would report it as an error.

Where a command ends, as Lean's parser sees it: a tactic block (`:= by`) holds the lines at or right of its
first tactic's column (Lean's `sepByIndent`: `checkColGe`); a line that starts left of it, outside any open
bracket (brackets parse `withoutPosition`), ends the declaration, and what it starts is a command: judged as
one, or refused when it is none. A command keyword (COMMAND_WORDS, a `#` command) starts a command at any
column; `open`/`set_option` do so at column 0, or wherever no declaration's proof is open (inside a proof
they are the tactics `open ... in`, `set_option ... in`). `where`, `termination_by` and `decreasing_by`
continue the declaration before them. One pass over the tokens, stopping at the first refusal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tasks.lean_text import Token, lex, name_parts
from verifier_pool.lean_preamble import (
    AESOP_CLAUSE,
    AESOP_COMMAND,
    AESOP_PHASE,
    BINDER_OPTIONS,
    DEFINITION_WORDS,
    Declared,
    Scopes,
    attributes_problem,
    constant,
)
from verifier_pool.lean_scan import COMMAND_WORDS, LINE_START_WORDS, RUN_CHARS, TACTIC, TERM, Scan, forbidden

HELPER_WORDS = frozenset({"theorem", "lemma"})
# Options a text may set before its statement (each also set, with `in`, on the target theorem): budgets
# (the verifier's wall-clock limit still bounds them), hygiene of tactic-introduced names (Seed-Prover's files
# turn it off), linters and printing. None changes what a statement means or what the kernel checks.
HARMLESS_OPTIONS = frozenset(
    {
        "maxHeartbeats",
        "maxRecDepth",
        "synthInstance.maxHeartbeats",
        "synthInstance.maxSize",
        "tactic.hygienic",
        "exponentiation.threshold",
    }
)
HARMLESS_OPTION_PREFIXES = ("linter.", "pp.")
# What continues a declaration after its proof (Lean's `declBody` suffixes), at any column.
SUFFIX_WORDS = frozenset({"where", "termination_by", "decreasing_by"})
# Words that start a command wherever the text is not inside a declaration's proof.
_COMMAND_STARTS = COMMAND_WORDS | {"open", "set_option", "import", "scoped", AESOP_COMMAND}
# The commands accepted before the statement, by their first word (`#print` and `@[` aside).
_KINDS = (
    {
        "import": "import",
        "noncomputable": "noncomputable",
        AESOP_COMMAND: "aesop",
        "namespace": "scope",
        "section": "scope",
        "end": "scope",
        "open": "open",
        "set_option": "option",
    }
    | dict.fromkeys(HELPER_WORDS, "helper")
    | dict.fromkeys(DEFINITION_WORDS, "definition")
)
_OPTION_VALUE = re.compile(r"[0-9]+|true|false")


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str  # `forbidden: ...` (scan_forbidden's wording)
    where: str = ""  # "" (the proof body), "helper `NAME`", "before the statement", "after the proof"

    @property
    def detail(self) -> str:
        return f"{self.where}: {self.reason}" if self.where else self.reason


@dataclass
class Kept:
    """What a text keeps: its commands' texts in order (each at its own column, ending in a newline), the
    options to set on the target theorem, whether an `open` or option is among them (they need a section),
    how many helper declarations and aesop rule commands; before the statement, the `end`s that close the
    scopes it leaves open (and their names, for the `end`s after the proof; the namespaces among them), and the
    names it declares."""

    commands: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    scoped: bool = False
    helpers: int = 0
    body_end: int = -1  # scan_body: where the proof body ends (its last token's end); -1: the whole text
    body_tokens: int = 0  # scan_body: the body's code tokens (none: an empty proof)
    rules: int = 0
    closing: str = ""
    namespaces: tuple[str, ...] = ()  # before the statement: the namespaces open at it, outermost first
    declared: Declared = field(default_factory=Declared)


@dataclass
class _Command:
    kind: str  # body | import | open | option | helper | print | attributes | noncomputable | scope | aesop
    start: int  # offset of its first token (the first prefix's)
    col: int
    scan: Scan
    end: int = 0  # the end of its last code token
    tokens: int = 0  # code tokens after its keyword
    name: str = ""  # a helper's or option's name
    value: str = ""  # an option's value
    words: list[str] = field(default_factory=list)  # a `#print` command's first words
    pending: bool = False  # ends in `in`: a prefix still waiting for its command
    in_proof: bool = False  # past a declaration's `:=` (or `|`): `open`/`set_option` are tactics there
    assign: bool = False  # the last token was its `:=` at depth 0
    await_block: bool = False  # `:= by` read: the next token gives the block's column
    block_col: int | None = None
    definition: bool = False  # a helper `def`/`abbrev`
    noncomputable: bool = False  # a scope or definition after `noncomputable`
    declaration_only: bool = False  # a prefix or attribute came first: only a declaration may follow
    rule_depth: int | None = None  # inside an aesop rule clause `(add ...)` opened at this bracket depth
    opened: bool = False  # the last token opened a bracket `(`
    last: str = ""  # the last token's text
    previous: str = ""  # the last identifier
    aux_next: bool = False  # the next identifier names an auxiliary declaration (`let rec`, `where`)
    in_where: bool = False  # past a `where`: each line's first identifier may name an auxiliary declaration


class _Commands:
    """`lex`'s `stop` callback over one text: splits it into commands, scans each, keeps the first refusal."""

    def __init__(
        self,
        text: str,
        phase: str,
        names: frozenset[str],
        term: bool = False,
        declared: Declared | None = None,
    ) -> None:
        self.text, self.phase, self.names = text, phase, names  # phase: before | body
        self.kept = Kept(declared=declared if declared is not None else Declared())
        self.declared = self.kept.declared
        self.scopes = Scopes()
        self.refusal: Refusal | None = None
        self.ended = False  # the body phase: the proof has ended, what follows is dropped unread
        self.line = 0  # the line the last code token ended on
        self.cmd: _Command | None = None
        if phase == "body":
            self.cmd = _Command("body", 0, 0, Scan(text, TERM if term else TACTIC), in_proof=True, await_block=not term)

    def __call__(self, token: Token) -> bool:
        kind = token.kind
        if kind != "comment":
            first = token.line != self.line
            self.line = token.line if kind == "ident" or kind == "number" else token.line + token.text.count("\n")
            self.refusal = self._step(token, first)
        return self.refusal is not None or self.ended

    def finish(self) -> None:
        """After the last token: the last command's own checks. A body that is the last command keeps the
        whole text (its trailing comments too: nothing follows them)."""
        cmd = self.cmd
        if cmd is not None and cmd.kind == "body":
            self.kept.body_end = len(self.text) if cmd.tokens else 0
            reason = cmd.scan.end()
            self.refusal = None if reason is None else Refusal(f"forbidden: {reason}")
        elif cmd is not None:
            self.refusal = self._close(cmd, last=True)
        if self.refusal is None and self.phase == "before":
            self._at_statement()

    def _at_statement(self) -> None:
        """The scopes the text leaves open: closed before the statement, the namespaces among them recorded (the
        theorem is sent under `open` of each where the audit runs, and refused elsewhere: lean_check `prepare`)."""
        self.kept.closing = self.scopes.closing()
        self.kept.namespaces = self.scopes.namespaces()

    def _step(self, token: Token, first: bool) -> Refusal | None:
        cmd = self.cmd
        if cmd is None:  # before the first command: prose around a code block, never sent to Lean
            return self._begin(token) if self._opens(token) else None
        if first and self._dedent(cmd, token):
            if token.kind == "ident" and token.text in SUFFIX_WORDS:
                cmd.block_col = None  # the declaration goes on: its `where` declarations have proofs of their own
            else:
                return self._begin(token, dedent=cmd.block_col)
        elif first:
            cmd.scan.context.newline()
        if (token.kind == "ident" or token.kind == "hash" or token.text == "@[") and self._starts_command(cmd, token):
            return self._core(cmd, token) if cmd.pending else self._begin(token)
        if cmd.kind == "scope" and token.kind != "ident":
            return self._begin(token)  # a scope command ends at its name: Lean reads one identifier at most
        return self._inside(cmd, token, first)

    def _dedent(self, cmd: _Command, token: Token) -> bool:
        return cmd.block_col is not None and token.col < cmd.block_col and cmd.scan.context.depth == 0

    @staticmethod
    def _opens(token: Token) -> bool:
        """Whether the text before the statement has its first command at `token` (what precedes is dropped)."""
        if token.kind == "hash" or token.text == "@[":
            return True
        return token.kind == "ident" and (token.text in _COMMAND_STARTS or forbidden(token) is not None)

    def _starts_command(self, cmd: _Command, token: Token) -> bool:
        if cmd.kind == "attributes" and not cmd.pending:
            return False  # inside `@[...]`: `local` is the attribute's kind
        if token.kind == "hash":
            return True
        if token.text == "@[":  # a declaration's attributes at a line's start
            return token.col == 0
        if token.kind != "ident":
            return False
        if token.text in COMMAND_WORDS or token.text == AESOP_COMMAND:
            return True
        if token.text in LINE_START_WORDS and token.col == 0:
            return True
        return token.text in ("open", "set_option", "import") and (not cmd.in_proof or cmd.pending)

    def _begin(self, token: Token, dedent: int | None = None) -> Refusal | None:
        """Close the current command and start one at `token` (a line left of the proof's column `dedent`)."""
        if self.cmd is not None and (refusal := self._close(self.cmd)) is not None:
            return refusal
        if self.phase == "body":  # the proof has ended at `token`
            return self._after_proof(token, dedent)
        where = "before the statement"
        kind = self._kind(token)
        if kind is None and (reason := forbidden(token)) is not None:
            return Refusal(f"forbidden: {reason}", where)
        if kind is None and token.kind == "ident" and token.text in _COMMAND_STARTS:
            return Refusal(f"forbidden: {token.text} (a new command)", where)
        if kind is None:
            return _not_a_command(token.text, token.kind, token.line, dedent, where)
        self.cmd = _Command(kind, token.start, token.col, Scan(self.text, TERM))
        self.cmd.end = token.start + len(token.text)
        self.cmd.last = token.text
        if kind in ("print", "scope"):
            self.cmd.words.append(token.text)
        elif kind == "definition":
            self.cmd.kind, self.cmd.definition = "helper", True
        elif kind == "noncomputable":
            self.cmd.pending = True
        return None

    def _after_proof(self, token: Token, dedent: int | None) -> Refusal | None:
        """Where the proof ends: a command, dropped with everything after it; a forbidden word (a hole, `axiom`,
        `elab`, ...) is refused there as anywhere; anything else is no command, as Lean would report."""
        if token.kind == "hash" or token.text == "@[" or (token.kind == "ident" and token.text in _COMMAND_STARTS):
            self.ended, self.cmd = True, None
            return None
        if (reason := forbidden(token)) is not None:
            return Refusal(f"forbidden: {reason}", "after the proof")
        return _not_a_command(token.text, token.kind, token.line, dedent, "after the proof")

    @staticmethod
    def _kind(token: Token) -> str | None:
        """The kind of command `token` starts before the statement, or None for one never accepted there."""
        if token.kind == "hash":
            return "print" if token.text == "#print" else None
        if token.text == "@[":
            return "attributes"
        return _KINDS.get(token.text)

    def _core(self, cmd: _Command, token: Token) -> Refusal | None:
        """`token` is the command a prefix applies to: `open ... in`, `set_option ... in`, `@[tags]`,
        `noncomputable` (a definition, or a section when nothing came before it)."""
        kind = self._kind(token)
        if kind not in self._after(cmd, token):
            return Refusal(f"forbidden: {forbidden(token) or f'{token.text} (a new command)'}", self._where(cmd))
        cmd.declaration_only |= kind != "scope"
        cmd.kind, cmd.pending, cmd.tokens, cmd.name, cmd.value = kind, kind == "noncomputable", 0, "", ""
        cmd.end = token.start + len(token.text)
        if kind == "definition":
            cmd.kind, cmd.definition = "helper", True
        elif kind == "scope":
            cmd.noncomputable = True
            cmd.words.append(token.text)
        return None

    @staticmethod
    def _after(cmd: _Command, token: Token) -> tuple[str, ...]:
        """The kinds of command that may follow the prefix `cmd`."""
        if cmd.kind == "noncomputable":
            return ("definition",) if cmd.declaration_only or token.text != "section" else ("definition", "scope")
        if cmd.kind == "attributes":
            return ("helper", "definition", "noncomputable")
        return ("helper", "open", "option", "definition", "attributes", "noncomputable")

    def _where(self, cmd: _Command) -> str:
        if cmd.kind == "body":
            return ""
        if cmd.kind == "helper" and cmd.name:
            return f"helper `{cmd.name}`"
        return "before the statement"

    def _inside(self, cmd: _Command, token: Token, first: bool) -> Refusal | None:
        """A token of the current command: its kind's bookkeeping, then the token rules."""
        if cmd.kind == "attributes" and not cmd.pending:  # before its `]`: only tags
            cmd.end = token.start + len(token.text)
            return self._attribute(cmd, token)
        if token.kind == "symbol" and (at := cmd.scan.context.symbol(token.text, cmd.block_col)) >= 0:
            line = token.line + token.text.count("\n", 0, at)
            where = "before the statement" if self.phase == "before" else "after the proof"
            return _not_a_command(token.text[at:], "symbol", line, cmd.block_col, where)
        if cmd.await_block:
            cmd.block_col, cmd.await_block = token.col, False
        cmd.tokens += 1
        cmd.end = token.start + len(token.text)
        if cmd.kind == "body":
            self.kept.body_tokens += 1
        elif (refusal := self._bookkeeping(cmd, token, first)) is not None:
            return refusal
        if cmd.kind in ("import", "print", "scope"):
            return None  # dropped or judged whole when it ends: its words are no code
        if token.kind == "ident" and (refusal := self._names(cmd, token, first)) is not None:
            return refusal
        cmd.opened = token.kind == "symbol" and token.text.endswith("(")
        previous, cmd.last = cmd.last, token.text
        if (
            token.text == AESOP_PHASE
            and not first
            and previous in (AESOP_CLAUSE, AESOP_COMMAND)
            and self._at_phase(cmd)
        ):
            # aesop's rule phase, first in its rule (`add_aesop_rules unsafe`, `(add unsafe`): no term can stand
            # there (Lean's `unsafe t` is a leading term of `leadPrec`, no argument), and no `unsafe def` starts a
            # line there
            return None
        reason = cmd.scan(token) or (cmd.scan.ctor and self.declared.ctor_problem(cmd.scan.ctor))
        return None if not reason else Refusal(f"forbidden: {reason}", self._where(cmd))

    def _attribute(self, cmd: _Command, token: Token) -> Refusal | None:
        """A token of `@[...]` before the statement: tag attributes only, then a declaration."""
        where = self._where(cmd)
        if (reason := forbidden(token)) is not None:
            return Refusal(f"forbidden: {reason}", where)
        if token.kind == "ident" or token.text == ",":
            cmd.words.append(token.text)
            return None
        if token.text != "]":
            return Refusal(f"forbidden: attribute @[{' '.join([*cmd.words, token.text])[:40]}", where)
        if (reason := attributes_problem(cmd.words)) is not None:
            return Refusal(f"forbidden: {reason}", where)
        cmd.pending = True
        return None

    def _at_phase(self, cmd: _Command) -> bool:
        """Whether the command is where aesop reads a rule phase: at its rule's own bracket depth."""
        return self._in_rule(cmd) and cmd.scan.context.depth == (cmd.rule_depth or 0)

    def _in_rule(self, cmd: _Command) -> bool:
        """Whether the command is at an aesop rule: an `add_aesop_rules` command, or in an `(add ...)` clause."""
        if cmd.rule_depth is not None and cmd.scan.context.depth < cmd.rule_depth:
            cmd.rule_depth = None
        return cmd.kind == "aesop" or cmd.rule_depth is not None

    def _names(self, cmd: _Command, token: Token, first: bool) -> Refusal | None:
        """The names an identifier declares (`let rec`, `where`) or names in an aesop rule."""
        if cmd.aux_next or (cmd.in_where and first):
            self.declared.add(token.text)
            cmd.aux_next = False
        elif token.text == "rec" and cmd.previous == "let" or token.text == "where":
            cmd.aux_next, cmd.in_where = True, cmd.in_where or token.text == "where"
        if token.text == AESOP_CLAUSE and cmd.opened:
            cmd.rule_depth = cmd.scan.context.depth
        elif self._in_rule(cmd) and (reason := self.declared.rule_problem(token.text)) is not None:
            return Refusal(f"forbidden: {reason}", self._where(cmd))
        cmd.previous = token.text
        return None

    def _bookkeeping(self, cmd: _Command, token: Token, first: bool) -> Refusal | None:
        """What a token of a helper, `open`, option or `#print` command says about the command itself."""
        assign, cmd.assign = cmd.assign, False
        depth = cmd.scan.context.depth
        if cmd.kind == "print":
            cmd.words.append(token.text)
        elif cmd.kind == "scope" and (reason := forbidden(token)) is not None:
            return Refusal(f"forbidden: {reason}", self._where(cmd))
        elif cmd.kind == "scope":
            cmd.words.append(token.text)
        elif cmd.kind == "helper" and cmd.tokens == 1:
            cmd.name = token.text if token.kind == "ident" else ""
            return self._name_problem(cmd)
        elif cmd.kind == "helper" and not cmd.in_proof and depth == 0 and token.text in (":=", "|"):
            # its proof starts: `:=`, or (at a line's start) the first alternative of a definition by patterns
            cmd.in_proof, cmd.assign = token.text == ":=" or first, token.text == ":="
        elif cmd.kind == "helper" and assign:
            cmd.await_block = token.text == "by"
        elif cmd.kind in ("open", "option") and token.text == "in" and depth == 0:
            cmd.pending = True
            return self._option_problem(cmd) if cmd.kind == "option" else None
        elif cmd.kind == "option" and cmd.tokens <= 2:
            cmd.name, cmd.value = (token.text, "") if cmd.tokens == 1 else (cmd.name, token.text)
        return None

    def _name_problem(self, cmd: _Command) -> Refusal | None:
        """A helper must be named, and by no name the statement uses: a shadowing helper could change which
        constant a name of the statement means (the audit would catch it; this says so before any Lean run)."""
        if not cmd.name:
            return Refusal("forbidden: a declaration without a name", self._where(cmd))
        parts = constant(cmd.name)
        parts = parts if name_parts(cmd.name)[:1] == ["_root_"] else self.scopes.prefix() + parts
        self.declared.helpers.add(tuple(parts))
        if cmd.definition:
            self.declared.add(cmd.name)
        for k in range(len(parts)):
            if (suffix := ".".join(parts[k:])) in self.names:
                return Refusal(f"forbidden: redeclares `{suffix}`, a name the statement uses", self._where(cmd))
        return None

    def _option_problem(self, cmd: _Command) -> Refusal | None:
        binder = cmd.name in BINDER_OPTIONS
        if not cmd.name.startswith(HARMLESS_OPTION_PREFIXES) and cmd.name not in HARMLESS_OPTIONS and not binder:
            return Refusal(
                f"forbidden: set_option {cmd.name} (options allowed outside a proof: "
                f"{', '.join(sorted(HARMLESS_OPTIONS | BINDER_OPTIONS))}, linter.*, pp.*)",
                self._where(cmd),
            )
        if binder and cmd.value not in ("true", "false"):
            return Refusal(f"forbidden: set_option {cmd.name} {cmd.value[:40]} (true or false)", self._where(cmd))
        if not _OPTION_VALUE.fullmatch(cmd.value):
            return Refusal(
                f"forbidden: set_option {cmd.name} {cmd.value[:40]} (a number, true or false)", self._where(cmd)
            )
        return None

    def _close(self, cmd: _Command, last: bool = False) -> Refusal | None:
        """The checks owed when a command ends, and what it keeps."""
        if (reason := cmd.scan.end()) is not None:
            return Refusal(f"forbidden: {reason}", self._where(cmd))
        if cmd.kind == "body":
            self.kept.body_end = cmd.end if cmd.tokens else 0
            return None
        if cmd.pending:
            return self._close_prefix(cmd, last)
        if cmd.kind == "attributes":
            return Refusal("forbidden: attribute @[ left open", self._where(cmd))
        if cmd.kind == "scope":
            reason = self.scopes.command(cmd.words[0], cmd.words[1:], cmd.noncomputable)
            if reason is not None:
                return Refusal(f"forbidden: {reason}", self._where(cmd))
        if cmd.kind == "option" and (refusal := self._option_problem(cmd)) is not None:
            return refusal
        if cmd.kind == "helper" and not cmd.name:
            return Refusal("forbidden: a declaration without a name", self._where(cmd))
        if cmd.kind == "helper" and not cmd.in_proof:
            return Refusal("forbidden: a declaration without a proof", self._where(cmd))
        if cmd.kind == "print":
            return self._close_print(cmd)
        if cmd.kind == "option" and cmd.name not in BINDER_OPTIONS:
            self.kept.options.append(f"set_option {cmd.name} {cmd.value}")
        if cmd.kind != "import":
            self.kept.commands.append(" " * cmd.col + self.text[cmd.start : cmd.end] + "\n")
            self.kept.scoped |= cmd.kind in ("open", "option")
            self.kept.helpers += cmd.kind == "helper"
            self.kept.rules += cmd.kind == "aesop"
        return None

    def _close_prefix(self, cmd: _Command, last: bool) -> Refusal | None:
        """A prefix with no command after it. Before the statement it applies to the target theorem: an option is
        set on it (with `in`), an `open` is dropped (the statement is the trusted one, read as the header has
        it). Anywhere else it prefixes nothing Lean accepts. An attribute or `noncomputable` before the statement
        would apply to the canonical theorem."""
        if cmd.kind in ("attributes", "noncomputable"):
            what = "attribute @[" + " ".join(cmd.words) + "]" if cmd.kind == "attributes" else "noncomputable"
            return Refusal(f"forbidden: {what} before no helper", self._where(cmd))
        if not last:
            return Refusal("forbidden: `in` followed by no declaration", self._where(cmd))
        if cmd.kind == "option" and cmd.name not in BINDER_OPTIONS:
            self.kept.options.append(f"set_option {cmd.name} {cmd.value}")
        return None

    def _close_print(self, cmd: _Command) -> Refusal | None:
        """`#print axioms <a helper declared before it>` is dropped (Seed-Prover prints each lemma's): it only
        prints, and the verifier asks its own for the theorem, as a command whose answer the proof cannot
        write. Any other `#` command is refused."""
        if len(cmd.words) == 3 and cmd.words[1] == "axioms" and self.declared.declares(cmd.words[2]):
            return None
        return Refusal("forbidden: #print", self._where(cmd))


def _not_a_command(text: str, kind: str, line: int, column: int | None, where: str) -> Refusal:
    """A line left of the proof's column that starts with no command (`text` from its first character)."""
    what = text[0] if kind == "symbol" and text[0] in RUN_CHARS else text.split("\n", 1)[0][:40]
    return Refusal(
        f"forbidden: `{what}` at line {line}, left of the proof's column {column}: Lean ends the proof "
        "there and reads a command, which this is not",
        where,
    )


def _run(text: str, commands: _Commands) -> Kept | Refusal:
    lex(text, merge=True, stop=commands)
    if commands.refusal is None:
        commands.finish()
    return commands.kept if commands.refusal is None else commands.refusal


def scan_before(text: str, names: frozenset[str]) -> Kept | Refusal:
    """The text before the statement: what of it goes to Lean, or why the attempt is refused. `names`: every
    name the canonical statement uses (`statement_names`)."""
    return _run(text, _Commands(text, "before", names))


def scan_body(
    text: str,
    names: frozenset[str] = frozenset(),
    term: bool = False,
    before: Kept | None = None,
) -> Kept | Refusal:
    """The proof body (a tactic block, or a term with `term`): where it ends (`Kept.body_end`; what follows is
    dropped), or why the attempt is refused. `before`: what the text before the statement kept (the names it
    declared, which a configuration value or an aesop rule in the proof may not name)."""
    declared = Declared() if before is None else before.declared
    return _run(text, _Commands(text, "body", names, term=term, declared=declared))


def statement_names(statement: str) -> frozenset[str]:
    """Every identifier of the canonical statement, with each of its dotted suffixes (`Real.sqrt`, `sqrt`)."""
    names = set()
    for token in lex(statement):
        if token.kind == "ident":
            parts = name_parts(token.text)
            names.update(".".join(parts[k:]) for k in range(len(parts)))
    return frozenset(names)
