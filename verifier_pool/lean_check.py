"""What "proved" means: the text checks and the REPL-response checks of ../shared/LEAN_REPL.md, as pure functions.

The order a verifier runs them in (`prepare` does steps 1-3):
1. `extract_proof_body(model_text, statement)` (tasks.lean_proof, the Lean task's text rules): the proof body,
   the text after the statement's `:= by` (or, for a term-mode proof, a `TermBody` after its `:=`). The
   model's restatement must equal the canonical statement up to whitespace (`lemma` for `theorem` included);
   everything before it (imports, opens, notations, instances, axioms, helper lemmas) is discarded.
2. `scan_forbidden(body)`: a token-level scan (`tasks.lean_text`) for holes, code that runs at elaboration time
   (commands, attributes, tactic configuration terms, run-a-term tactics), syntax definitions, new axioms,
   compiler trust, debug and warning options and new commands.
3. `assemble(statement, body)` (tasks.lean_proof): the command, built from trusted parts only; the header is
   elaborated once per REPL and the command runs with that `env`, so it never contains `import`.
4. `judge_command(response)`: no error, no sorry (either quoting of the warning), no `#exit`; its `proved`
   means "no objection yet".
5. `axioms_command(theorem_name(statement))` (`theorem_name`: tasks.lean_proof) as a separate command in the
   env the proof returned, then `judge_axioms(response, name)`: only propext, Classical.choice and Quot.sound.

What these checks do NOT catch:
- Environment forgery, and forged REPL answers. Code that runs during elaboration can add unchecked
  declarations, overwrite constants or write the REPL's replies itself; we forbid every way we know to run
  code from a proof (`#eval`, `run_tac`, `by_elab`, `eval%`, `elab`, `macro`, simprocs, `initialize`,
  `test_extern`, attributes, configuration terms other than literals, `plausible`, ...), but only a kernel
  replay in a process the proof never ran in (`lean_audit`, the second line) proves it was not forged.
- Syntax we do not know: a Mathlib command, tactic or term elaborator, missing from our lists, that runs
  code or hides a hole. Configuration terms are caught by their shape `(name := value)` whatever the tactic;
  a library tactic that evaluates a term given in another shape is not. Lean's own sorry warning and the
  axioms check back up the scan for holes, not for code.
- Wrong answers from Lean itself (kernel or elaborator bugs), and resource attacks (the sandbox's job).
- A proof text that reads differently under a Lean version whose token rules differ from `lean_text`'s.

What they refuse that Lean would accept (false positives we accept for a scan that needs no grammar): a
named argument whose value is not a literal (`foo (h := h₀)` reads like a configuration item), attributes
on `where` declarations, Mathlib's `#s` card notation, options `warn.*` and `debug.*`.
"""

from __future__ import annotations

import re
from typing import Any

import structlog

from tasks.lean_proof import IntegrityError, TermBody, assemble, extract_proof_body
from tasks.lean_text import Token, lex, name_parts
from verifier_pool.judgement import Judgement  # the pool's one verdict type; `proved` here means "no objection"

log = structlog.get_logger("verifier_pool.lean_check")

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
    # a core command without `#` that compiles and runs its argument (lean4: `syntax (name := testExternCmd)`)
    "test_extern",
    # tactics that compile and run a term: plausible (Plausible/Tactic.lean) evaluates the goal's Testable
    # instance with `unsafe evalExpr`, so any proposition the proof states (`have : p := by plausible`) runs;
    # slim_check is its former name. bv_decide? runs bv_decide; bv_check reads an LRAT file and trusts the
    # compiler (Std.Tactic.BVDecide)
    "plausible", "slim_check", "bv_decide?", "bv_check",
    # change the trusted base
    "import", "prelude", "axiom", "opaque", "unsafe", "partial",
})  # fmt: skip
# Components of any identifier: constants and attributes that reach the compiler or the trusted base, however
# they are spelled (`Lean.ofReduceBool`, `«sorryAx»`, `_root_.sorryAx`, `@[implemented_by f]`, `+native`).
FORBIDDEN_COMPONENTS = frozenset({
    "sorryAx", "native_decide", "nativeDecide", "native", "bv_decide", "ofReduceBool", "ofReduceNat",
    "reduceBool", "reduceNat", "trustCompiler", "implemented_by", "extern", "csimp",
    # what an evaluated term needs to reach the outside: IO actions (`IO.RealWorld` is `Unit`, so a pure term
    # can run one: `(IO.println "x").run ()`) and the unsafe escapes; no proof names them, and `open IO in`
    # is caught too
    "IO", "EIO", "BaseIO", "unsafeBaseIO", "unsafeIO", "unsafeEIO", "unsafeCast",
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
# Option prefixes `set_option` may not touch: `debug.skipKernelTC` skips the kernel, `warn.sorry false` silences
# the sorry warning (Lean.AddDecl: `register_builtin_option warn.sorry`).
FORBIDDEN_OPTION_PREFIXES = ("debug.", "warn.")
# `(disch := tac)` and `(discharger := tac)` take a tactic sequence, which the scan reads as code like any
# other (Init/Tactics.lean: `valConfigItem` is `notFollowedBy(&"discharger" <|> &"disch")`).
TACTIC_ITEMS = frozenset({"disch", "discharger"})
# In a configuration value, symbols other than `{`, `}` and `:=` (a structure instance's) may be only these.
_LITERAL_SYMBOLS = re.compile(r"[\[\],. \t\r\n]*+")  # with Lean's whitespace, inside a merged run
HOLES = frozenset({"forbidden: sorry", "forbidden: admit", "forbidden: stop", "forbidden: sorryAx"})

# `#print axioms` (lean4 src/Lean/Elab/Print.lean, `printAxiomsOf`): `m!"'{constName}' depends on axioms: {..}"`
# and `m!"'{constName}' does not depend on any axioms"`, read at commits 8b96499 (2021, list unsorted) and
# 02637a0 (2025, module era, list sorted); both quote the name with `'`. Lean's messages have been moving to
# backquoted names (`.ofConstName`: "Unknown identifier `x`", ``declaration uses `sorry` ``), so the backquoted
# form is read too. Any other wording is an infrastructure error, logged once per process.
_DEPENDS = re.compile(r"(['`])(.+)\1 depends on axioms: \[(.*)\]", re.DOTALL)
_NO_AXIOMS = re.compile(r"(['`])(.+)\1 does not depend on any axioms", re.DOTALL)
_SEVERITIES = frozenset({"trace", "info", "warning", "error"})


def _rejected(reason: str, detail: str) -> Judgement:
    return Judgement("rejected", reason, detail[:DETAIL_CHARS])


def _infrastructure(detail: str) -> Judgement:
    return Judgement("error", "", detail[:DETAIL_CHARS])


# --- text: from model output to the checked command (the proof's place in it: tasks.lean_proof) ----------


def scan_forbidden(body: str) -> str | None:
    """A short reason (`"forbidden: native_decide"`) if the body contains a forbidden construct, else None.

    Token-based (`lean_text`), so comments and strings do not count (`-- sorry`, `"sorry"`), a nested comment
    hides what Lean hides (`/- /- -/ sorry -/`), `sor/- -/ry` is two identifiers, and `sorry_lemma` or `h'`
    are identifiers of their own. The first token, in source order, that breaks a rule names the reason:
    text whose reading depends on Lean's token table (`ambiguous`); any `#` command (none belongs in a proof:
    `#print` could fake an axioms line, `#eval` runs code, `#exit` truncates; Mathlib's card notation `#s` is
    a false positive we accept); any attribute `@[`; FORBIDDEN_WORDS; options under FORBIDDEN_OPTION_PREFIXES
    (`set_option debug.skipKernelTC true in`); FORBIDDEN_COMPONENTS anywhere in a dotted name; COMMAND_WORDS
    anywhere; LINE_START_WORDS at column 0; `eval%`; a configuration value that is not a literal.
    """
    return _first_forbidden(body)[1]


def _first_forbidden(body: str) -> tuple[list[Token], str | None]:
    """The tokens of `body` up to its first forbidden one (all if none), and the reason for that one."""
    scan = _Scan(body)
    tokens = lex(body, merge=True, stop=scan)  # ends at the first forbidden token
    reason = scan.reason or scan.end()
    return tokens, None if reason is None else f"forbidden: {reason}"


def _forbidden(token: Token) -> str | None:
    """The rules that need only the token itself."""
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


class _Scan:
    """`lex`'s `stop` callback: sees the tokens of one body in source order and keeps the first reason.

    Besides the per-token rules it reads configuration items. Lean evaluates a tactic's configuration: the
    `(name := value)` items of `optConfig` and the older `(config := value)` are elaborated into the tactic's
    Config structure and run by `evalExpr' (safety := .unsafe)` (Lean/Elab/Tactic/Config.lean,
    `mkConfigElaborator`), so an IO action in a value runs in the REPL process. Tactics with a configuration
    are an open set (Mathlib declares its own), so every `(IDENT := value)` is read as one, a named argument
    too, except the tactic-valued TACTIC_ITEMS. A value may hold only literals: numerals, `true`/`false`,
    `.ctor` names, lists `[...]` and structure instances `{ field := literal, ... }` of them; an identifier
    not in those places, `⟨...⟩` (fields by position), `(`, strings, operators and the rest are
    `config term`. `+opt`/`-opt` flags set a Bool to a literal and need nothing.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.reason: str | None = None
        self.state = "code"  # code | open (after `(`) | name (after `(IDENT`) | value (after `(IDENT :=`)
        self.item = ""  # IDENT of the configuration item being read
        self.field = False  # in a value, an identifier was read that only `:=` may follow (a field name)
        self.attribute = False  # the last token was `@[`

    def __call__(self, token: Token) -> bool:
        if token.kind == "comment":
            return False
        self.reason = _forbidden(token) or self._context(token)
        return self.reason is not None

    def end(self) -> str | None:
        """The reason owed at the end of the text: an attribute whose name never came."""
        return "attribute @[" if self.attribute else None

    def _context(self, token: Token) -> str | None:
        if self.attribute:
            # An attribute runs its handler when the declaration it decorates is added; registration
            # attributes (command_parser, term_elab, tactic, macro, delab, env_extension, init, norm_num, ...)
            # make that declaration's code run later, and any library can declare one. In a proof body the
            # only place for one is a `where`/`let rec` declaration, which no competition proof decorates.
            return f"attribute @[{token.text[:40]}" if token.kind == "ident" else "attribute @["
        if token.kind == "ident" and token.text == "eval" and self.text.startswith("%", token.start + 4):
            return "eval%"  # Mathlib/Tactic/Eval.lean: `eval% term` runs the term (`evalExpr ... .unsafe`)
        if self.state == "value":
            return self._value(token)
        if token.kind == "symbol" and token.text == "@[":
            self.attribute = True  # named by the next token: its own rules (`implemented_by`) come first
        elif self.state == "open" and token.kind == "ident" and token.text not in TACTIC_ITEMS:
            self.state, self.item = "name", token.text
        elif self.state == "name" and token.text == ":=":
            self.state, self.field = "value", False
        else:
            self.state = "open" if token.kind == "symbol" and token.text.endswith("(") else "code"
        return None

    def _value(self, token: Token) -> str | None:
        bad = f"config term ({self.item[:40]} := ...)"
        if self.field:  # `{ name := ...`: the identifier was a field name only if `:=` follows
            self.field = False
            return None if token.text == ":=" else bad
        if token.kind == "number" or (token.kind == "ident" and token.text in ("true", "false")):
            return None
        if token.kind == "ident":
            self.field = self.text[token.start - 1] != "."  # `.ctor` is a literal, else a field name
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


def prepare(model_text: str, formal_statement: str, max_chars: int | None = MAX_PROOF_CHARS) -> str | Judgement:
    """Steps 1-3: the command to send, or the rejection that makes sending it unnecessary. `max_chars`:
    MAX_PROOF_CHARS (None only in tests that time the scan itself)."""
    if max_chars is not None and len(model_text) > max_chars:
        return _rejected("lean_error", f"attempt of {len(model_text)} characters exceeds {max_chars}")
    body = extract_proof_body(model_text, formal_statement)
    if isinstance(body, IntegrityError):
        return Judgement("rejected", "integrity", body.detail)
    term, text = (True, body.text) if isinstance(body, TermBody) else (False, body)
    tokens, reason = _first_forbidden(text)  # one reading of the body for both checks
    if all(t.kind == "comment" for t in tokens):  # no Lean run can prove anything with whitespace and comments
        return _rejected("lean_error", "empty proof: the attempt holds no Lean code")
    if reason is not None:
        return _rejected("sorry" if reason in HOLES else "integrity", reason)
    return assemble(formal_statement, text, term)


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
    """(name, axioms) from `'NAME' depends on axioms: [a, b]` or `'NAME' does not depend on any axioms`, the
    name quoted with `'` or with backquotes."""
    data = data.strip()
    if m := _DEPENDS.fullmatch(data):
        return m.group(2), [a.strip() for a in m.group(3).split(",") if a.strip()]
    if m := _NO_AXIOMS.fullmatch(data):
        return m.group(2), []
    return None


_unknown_wording_logged = False  # module state on purpose: a new Lean wording is worth one log line a process


def _log_unknown_wording(texts: list[str]) -> None:
    """Every proof is `error` while Lean's wording is unknown (a Lean upgrade would stop all rewards): say so,
    with the text, once rather than once per proof."""
    global _unknown_wording_logged
    if not _unknown_wording_logged:
        _unknown_wording_logged = True
        log.error("axioms_report_unknown_wording", texts=[t[:DETAIL_CHARS] for t in texts[:3]])


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
        infos = [str(m.get("data")) for m in messages if m.get("severity") == "info"]
        if infos:
            _log_unknown_wording(infos)
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
