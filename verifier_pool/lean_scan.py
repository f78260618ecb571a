"""The token rules of the Lean scan: what no proof text may contain, and where a `(name := value)` is a
tactic's configuration (evaluated: its value must be a literal) or a named argument (an ordinary term).

`Scan` judges the tokens of one command (a proof body, a helper declaration) in source order and keeps the
first reason to refuse; `verifier_pool.lean_commands` splits a text into commands and runs one `Scan` each.
The rules, and what they leave to the second line (verifier_pool.lean_audit), are in lean_check's docstring
and docs/VERIFIER.md.

Configuration by position. Lean evaluates a tactic's configuration: the `(name := value)` items of
`optConfig` (and the older `(config := value)`) that follow the tactic's name are elaborated into its Config
structure and run by `evalExpr' (safety := .unsafe)` (Lean/Elab/Tactic/Config.lean, `mkConfigElaborator`).
The same shape inside a term is a named argument (`mul_pos (a := x)`), elaborated, never run. Without Lean's
grammar, `Context` follows where the text is a tactic and where a term, erring towards "tactic": a term starts
only after a tactic known to take one (TERM_TACTICS), `:=`, `:`, `←`, `⟨` or a `[` list; every way back to a
tactic resets it (`by`, `;`, `<;>`, `<|>`, `|`, `=>`, `·`, `then`, `else`, `says`, a new line of a tactic
block, but after a line ending in `:=`, `:` or `←`, where Lean must read a term). A term taken for a tactic
makes a named argument face the literal rule (a refusal, never an acceptance); the reverse needs a tactic
whose name follows a term with none of those resets between.
"""

from __future__ import annotations

import re

from tasks.lean_text import Token, name_parts

# Whole words (an identifier token, `«»` removed). None has a use in a proof of a competition statement.
FORBIDDEN_WORDS = frozenset(
    {
        # holes: Lean flags them too, but the scan names them and costs no sandbox time
        "sorry",
        "admit",
        "stop",
        # Library search (`exact?`, `apply?`, `rw?`) is allowed: Seed-Prover's checked proofs use it. Its cost is the
        # proof's time limit, and a goal `apply?` admits for want of a complete proof is Lean's `sorry` (the
        # "declaration uses sorry" warning, sorryAx in `#print axioms` and in the audit). `decide?` is no tactic
        # we know of.
        "decide?",
        # run code at elaboration time, or define syntax that can change what the statement's symbols mean
        "elab",
        "elab_rules",
        "macro",
        "macro_rules",
        "syntax",
        "declare_syntax_cat",
        "notation",
        "notation3",
        "infix",
        "infixl",
        "infixr",
        "prefix",
        "postfix",
        "binder_predicate",
        "run_cmd",
        "run_tac",
        "run_elab",
        "run_meta",
        "by_elab",
        "initialize",
        "builtin_initialize",
        "simproc",
        "dsimproc",
        "simproc_decl",
        "dsimproc_decl",
        "builtin_simproc",
        "builtin_dsimproc",
        "command_elab",
        "term_elab",
        "builtin_command_elab",
        "builtin_term_elab",
        "builtin_tactic",
        "builtin_macro",
        # a core command without `#` that compiles and runs its argument (lean4: `syntax (name := testExternCmd)`)
        "test_extern",
        # tactics that compile and run a term: plausible (Plausible/Tactic.lean) evaluates the goal's Testable
        # instance with `unsafe evalExpr`, so any proposition the proof states (`have : p := by plausible`) runs;
        # slim_check is its former name. bv_decide? runs bv_decide; bv_check reads an LRAT file and trusts the
        # compiler (Std.Tactic.BVDecide)
        "plausible",
        "slim_check",
        "bv_decide?",
        "bv_check",
        # change the trusted base
        "import",
        "prelude",
        "axiom",
        "opaque",
        "unsafe",
        "partial",
    }
)
# Components of any identifier: constants and attributes that reach the compiler or the trusted base, however
# they are spelled (`Lean.ofReduceBool`, `«sorryAx»`, `_root_.sorryAx`, `@[implemented_by f]`, `+native`).
FORBIDDEN_COMPONENTS = frozenset(
    {
        "sorryAx",
        "native_decide",
        "nativeDecide",
        "native",
        "bv_decide",
        "ofReduceBool",
        "ofReduceNat",
        "reduceBool",
        "reduceNat",
        "trustCompiler",
        "implemented_by",
        "extern",
        "csimp",
        # what an evaluated term needs to reach the outside: IO actions (`IO.RealWorld` is `Unit`, so a pure term
        # can run one: `(IO.println "x").run ()`) and the unsafe escapes; no proof names them, and `open IO in`
        # is caught too
        "IO",
        "EIO",
        "BaseIO",
        "unsafeBaseIO",
        "unsafeIO",
        "unsafeEIO",
        "unsafeCast",
    }
)
# Commands that declare or change scopes. No tactic uses these words, and Lean ends a tactic block at the
# first token that is not a tactic, whatever its column: so any occurrence starts a new command, which
# lean_commands judges as one (a `theorem`/`lemma` may be a helper; the others are refused).
COMMAND_WORDS = frozenset(
    {
        "theorem",
        "lemma",
        "def",
        "abbrev",
        "instance",
        "structure",
        "class",
        "inductive",
        "coinductive",
        "example",
        "namespace",
        "section",
        "end",
        "universe",
        "variable",
        "attribute",
        "local",
        "mutual",
        "deriving",
        "export",
        "omit",
        "include",
        "alias",
        "irreducible_def",
        "add_decl_doc",
        "noncomputable",
        "private",
        "protected",
    }
)
# Also tactic syntax (`open Real in nlinarith [...]`, `open scoped BigOperators in`), so a command only where a
# command can start: column 0, or a line left of the proof's column (lean_commands).
LINE_START_WORDS = frozenset({"open", "scoped"})
_REASON_OF_COMPONENT = {"native": "decide +native"}
# Option prefixes `set_option` may not touch: `debug.skipKernelTC` skips the kernel, `warn.sorry false` silences
# the sorry warning (Lean.AddDecl: `register_builtin_option warn.sorry`).
FORBIDDEN_OPTION_PREFIXES = ("debug.", "warn.")
# `(disch := tac)` and `(discharger := tac)` take a tactic sequence, which the scan reads as code like any
# other (Init/Tactics.lean: `valConfigItem` is `notFollowedBy(&"discharger" <|> &"disch")`).
TACTIC_ITEMS = frozenset({"disch", "discharger"})
# In a configuration value, symbols other than `{`, `}` and `:=` (a structure instance's) may be only these.
_LITERAL_SYMBOLS = re.compile(r"[\[\],. \t\r\n]*+")  # with Lean's whitespace, inside a merged run
# Boolean literals of a configuration value (Harmonic's Aristotle writes `{ decide := Bool.true }`).
_BOOLS = frozenset({"true", "false", "Bool.true", "Bool.false"})
HOLES = frozenset({"forbidden: sorry", "forbidden: admit", "forbidden: stop", "forbidden: sorryAx"})

TACTIC, TERM = "tactic", "term"
# Tactics whose argument is a term (Lean core and Mathlib): after one of them the text is a term, so
# `exact foo (h := h₀)` passes a named argument. A tactic missing here leaves the scan in tactic mode, the
# strict side. (`have`, `obtain`, `show ... from` and the like reach their term through `:=`, `:` or `from`.)
TERM_TACTICS = frozenset(
    {
        "exact",
        "exact_mod_cast",
        "apply",
        "apply_mod_cast",
        "refine",
        "refine'",
        "use",
        "use!",
        "exists",
        "existsi",
        "specialize",
        "convert",
        "convert_to",
        "using",
        "from",
        "show",
        "calc",
        "exacts",
        "rcases",
        "cases",
        "cases'",
        "induction",
        "induction'",
        "obtain",
        "generalize",
        "change",
        "trans",
        "absurd",
        "contrapose",
        "by_contra",
        "lift",
        "choose",
        "fun",
    }
)
# Words after which a tactic follows, whatever came before: a term's `by`, the branches of a tactic `if`,
# `t₁ says t₂` (Mathlib.Tactic.Says), a definition's `decreasing_by`.
TACTIC_WORDS = frozenset({"by", "then", "else", "says", "decreasing_by"})
# Symbols in a merged run (tasks.lean_text: `lex(merge=True)`) that the context follows. `.` followed by
# whitespace is the focusing dot's ASCII spelling; `||`, `|>` and `<|` are operators of terms, read as none.
_EVENTS = re.compile(r"\n[ \t\r]*+|<;>|<\|>|=>|\|\|++|\|>|<\||\(++|\)++|\[++|\]++|[;|]|\.(?=[ \t\r\n])")
_SILENT = frozenset({"|>", "<|"})
RUN_CHARS = frozenset("!$%&()*+,.;<=>?[\\]^`|~-/#")  # what a merged run starts with (lean_text's `_INERT`)
_RESETS = frozenset({"<;>", "<|>", "=>", ";", "|", ".", "·"})
MAX_FRAMES = 256  # brackets deeper than any proof; past it the context reads as "tactic" (the strict side)


class Context:
    """Where a command's text is, as far as configuration goes: a stack of frames, one per open bracket, each
    `[mode, sequence, opened_in]`: whether the text there is a tactic or a term, whether it holds a tactic
    sequence (a new line there starts a new tactic), and the mode the bracket was opened in (a `(` opened in
    a term holds a named argument, in a tactic a configuration item)."""

    def __init__(self, mode: str) -> None:
        self.frames = [[mode, mode == TACTIC, mode]]
        self.deeper = 0  # brackets opened past MAX_FRAMES, not recorded
        self.after_then = False  # the last event was `<;>`: a `[` after it holds tactics (`t <;> [t₁; t₂]`)
        # The last token was `:=`, `:` or `←`: Lean's parser must read a term next, so a line break after it
        # continues that term (`have h : T :=` then the term on the next line) and starts no tactic.
        self.term_next = False

    @property
    def depth(self) -> int:
        """Brackets open since the command's start."""
        return len(self.frames) - 1 + self.deeper

    @property
    def mode(self) -> str:
        return TACTIC if self.deeper else self.frames[-1][0]

    @property
    def opened_in(self) -> str:
        """The mode the innermost bracket was opened in (for the command itself: its initial mode)."""
        return TACTIC if self.deeper else self.frames[-1][2]

    def set(self, mode: str, sequence: bool = False) -> None:
        if not self.deeper:
            self.frames[-1][0] = mode
            self.frames[-1][1] |= sequence

    def newline(self) -> None:
        """A line starts: inside a tactic sequence, a new tactic, unless the line before ended where a term
        must follow."""
        if not self.deeper and self.frames[-1][1] and not self.term_next:
            self.frames[-1][0] = TACTIC
        self.after_then = False

    def word(self, word: str) -> None:
        self.term_next = False
        if word in TERM_TACTICS:
            self.set(TERM)
        elif word in TACTIC_WORDS:
            self.set(TACTIC, sequence=True)
        self.after_then = False

    def symbol(self, text: str, block_col: int | None = None) -> int:
        """Follow a symbol token (a merged run of them, or one): brackets, separators, the new lines inside a
        run. Returns the offset in `text` of the first line inside it that starts left of `block_col` with no
        bracket open (where Lean ends the proof: lean_commands), else -1."""
        if text[0] not in RUN_CHARS:  # a symbol never merged into a run: `:=`, `:`, `{`, `⟨`, `←`, `·`, ...
            self._one(text)
            return -1
        self.term_next = False
        if text == "(" or text == "[":  # the most common runs, without the regular expression
            self._open(text, 1)
            self.after_then = False
            return -1
        for m in _EVENTS.finditer(text):
            event = m.group()
            if event[0] == "\n":
                if block_col is not None and self.depth == 0 and len(event) - 1 < block_col:
                    return m.end()
                self.newline()
            elif event[0] in "([":
                self._open(event[0], len(event))
            elif event[0] in ")]":
                self.close(len(event))
            elif event in _SILENT or event.startswith("||"):
                pass
            else:
                self.set(TACTIC)
                self.after_then = event == "<;>"
                continue
            self.after_then = False
        return -1

    def _one(self, symbol: str) -> None:
        if symbol in ("{", "⟨"):
            self._open(symbol, 1)
        elif symbol in ("}", "⟩"):
            self.close(1)
        elif symbol in (":=", ":", "←"):
            self.set(TERM)
        elif symbol in _RESETS:
            self.set(TACTIC)
        self.after_then = False
        self.term_next = symbol in (":=", ":", "←")

    def _open(self, bracket: str, n: int) -> None:
        """`(` and `{` keep the mode they open in (tactic parentheses and `{ tacs }`, or a term's); `⟨` holds a
        term; `[` a term (a lemma list) but after `<;>`."""
        if self.deeper or len(self.frames) + n > MAX_FRAMES:
            room = 0 if self.deeper else MAX_FRAMES - len(self.frames)
            self.deeper += n - room
            n = room
        opened = self.frames[-1][0]
        mode = TERM if bracket == "⟨" or (bracket == "[" and not self.after_then) else opened
        for _ in range(n):
            self.frames.append([mode, mode == TACTIC, opened])

    def close(self, n: int) -> None:
        k = min(n, self.deeper)
        self.deeper -= k
        k = min(n - k, len(self.frames) - 1)
        if k:
            del self.frames[-k:]


def forbidden(token: Token) -> str | None:
    """The rules that need only the token itself (COMMAND_WORDS are lean_commands' to split on)."""
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


class Scan:
    """The tokens of one command, in source order; `__call__` returns the first reason to refuse it.

    Besides the per-token rules it reads configuration items. Tactics with a configuration are an open set
    (Mathlib declares its own), so where `Context` says tactic every `(IDENT := value)` is read as one, except
    the tactic-valued TACTIC_ITEMS; where it says term, it is a named argument and its value is scanned as
    code. A configuration value may hold only literals: numerals, `true`/`false`, `.ctor` names, lists `[...]`
    and structure instances `{ field := literal, ... }` of them; an identifier not in those places, `⟨...⟩`
    (fields by position), `(`, strings, operators and the rest are `config term`. `+opt`/`-opt` flags set a
    Bool to a literal and need nothing.
    """

    def __init__(self, text: str, mode: str = TACTIC) -> None:
        self.text = text
        self.context = Context(mode)
        self.state = "code"  # code | open (after `(`) | name (after `(IDENT`) | value (after `(IDENT :=`)
        self.item = ""  # IDENT of the configuration item being read
        self.field = False  # in a value, an identifier was read that only `:=` may follow (a field name)
        self.attribute = False  # the last token was `@[`
        self.ctor = (
            ""  # the name a configuration value's last token was (`.ctor`, `true`: literals that name constants)
        )

    def __call__(self, token: Token) -> str | None:
        """The reason to refuse `token` here, or None. Comments are the caller's to skip; a symbol token has been
        given to `self.context.symbol` by the caller (which needs its answer), words are followed here."""
        self.ctor = ""
        if token.kind == "ident":
            self.context.word(token.text)
        elif token.kind != "symbol":  # a number, string or character: a term read, the line goes on from it
            self.context.term_next = False
        return forbidden(token) or self._context(token)

    def end(self) -> str | None:
        """The reason owed at the end of the command: an attribute whose name never came."""
        return "attribute @[" if self.attribute else None

    def _context(self, token: Token) -> str | None:
        if self.attribute:
            # An attribute runs its handler when the declaration it decorates is added; registration
            # attributes (command_parser, term_elab, tactic, macro, delab, env_extension, init, norm_num, ...)
            # make that declaration's code run later, and any library can declare one. No helper lemma or
            # `where`/`let rec` declaration of a competition proof needs one.
            return f"attribute @[{token.text[:40]}" if token.kind == "ident" else "attribute @["
        if token.kind == "ident" and token.text == "eval" and self.text.startswith("%", token.start + 4):
            return "eval%"  # Mathlib/Tactic/Eval.lean: `eval% term` runs the term (`evalExpr ... .unsafe`)
        if self.state == "value":
            return self._value(token)
        if token.kind == "symbol" and token.text == "@[":
            self.attribute = True  # named by the next token: its own rules (`implemented_by`) come first
        elif self.state == "open" and token.kind == "ident":
            self.state, self.item = ("tactic item" if token.text in TACTIC_ITEMS else "name"), token.text
        elif self.state == "tactic item" and token.text == ":=":
            self.context.set(TACTIC, sequence=True)  # `(disch := tacs)`: a tactic sequence, scanned as code
            self.state = "code"
        elif self.state == "name" and token.text == ":=":
            # Inside a term: a named argument, its value a term like any other. Inside a tactic: configuration.
            self.state, self.field = ("code" if self.context.opened_in == TERM else "value"), False
        else:
            self.state = "open" if token.kind == "symbol" and token.text.endswith("(") else "code"
        return None

    def _value(self, token: Token) -> str | None:
        bad = f"config term ({self.item[:40]} := ...)"
        if self.field:  # `{ name := ...`: the identifier was a field name only if `:=` follows
            self.field = False
            return None if token.text == ":=" else bad
        if token.kind == "number":
            return None
        if token.kind == "ident" and token.text in _BOOLS:
            self.ctor = token.text  # a name too: in a namespace `X`, `true` is `X.true` where one is declared
            return None
        if token.kind == "ident":
            self.field = self.text[token.start - 1] != "."  # `.ctor` is a literal, else a field name
            self.ctor = "" if self.field else "." + token.text
            return None
        if token.kind != "symbol":
            return bad
        if token.text in ("{", "}"):
            return None
        symbols = token.text  # one symbol, or a merged run of them with Lean's whitespace: `]),`, `) (`
        close = symbols.find(")")
        if not _LITERAL_SYMBOLS.fullmatch(symbols, 0, len(symbols) if close < 0 else close):
            return bad
        if close >= 0:  # the item ends; the rest of the run may open the next one
            self.state = "open" if symbols.endswith("(") and close < len(symbols) - 1 else "code"
        return None
