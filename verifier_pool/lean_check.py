"""What "proved" means: the text checks and the REPL-response checks of docs/brief/LEAN_REPL.md, as pure functions.

The order a verifier runs them in (`prepare` does steps 1-3):
1. `split_attempt(model_text, statement)` (tasks.lean_proof, the Lean task's text rules): the model's code cut
   at its restatement of the canonical statement (equal up to whitespace, `lemma` for `theorem` included): the
   text before it and the proof body after its `:= by` (or, for a term-mode proof, after its `:=`). A code
   that states the theorem otherwise is `statement_mismatch`, naming the first word that differs.
2. The scan (verifier_pool.lean_commands, with the token rules of verifier_pool.lean_scan): the text is cut into
   commands where Lean's parser cuts it (a line left of the proof's column ends the proof). Before the statement,
   `import` lines are dropped; `open` (`open scoped`), harmless options, the binder options
   `autoImplicit`/`relaxedAutoImplicit` (for the helpers only), helper `lemma`/`theorem`/`def`/`abbrev`
   declarations (`noncomputable` too, tagged `@[simp]`/`@[reducible]`/`@[local simp]` or not), `namespace X ...
   end X` and sections (a scope left open is closed before the statement; a namespace left open there is opened
   on the theorem, `open X in`, only with `open_namespaces`, i.e. where the audit runs, and refused elsewhere),
   `add_aesop_rules` and `#print axioms <a helper>` are kept or dropped (verifier_pool.lean_preamble says why
   each is harmless); any other command there is refused. The proof ends where Lean's parser ends it, at a
   command: that command and all after it are dropped unread (Lean elaborates the theorem before them, and steps
   5 and the audit are commands of the verifier's own); a line left of the proof's column that is no command is
   refused (Lean reports it). Every kept text is scanned for holes, code that runs at elaboration time (commands,
   attributes other than those tags, tactic configuration terms, run-a-term tactics, an aesop `tactic` rule or a
   rule or `.name` configuration value naming a definition of the attempt), syntax definitions, new axioms,
   compiler trust, debug and warning options.
3. `assemble(statement, body, before=helpers)` (tasks.lean_proof): the command, built from trusted parts and
   the kept ones: the helpers (with the model's `open`s and options in a section of their own, so they never
   reach the statement), the `open`s of the namespaces left open at it and the harmless options set on the
   theorem with `in`, the canonical statement, the body. The header is elaborated once per REPL and the
   command runs with that `env`, so it never contains `import`.
4. `judge_command(response)`: no error, no sorry (either quoting of the warning), no `#exit`; its `proved`
   means "no objection yet".
5. `axioms_command(theorem_name(statement))` (`theorem_name`: tasks.lean_proof) as a separate command in the
   env the proof returned, then `judge_axioms(response, name)`: only propext, Classical.choice and Quot.sound.
   Lean collects a theorem's axioms through every constant its proof uses, helpers included.

What these checks do NOT catch:
- Environment forgery, and forged REPL answers. Code that runs during elaboration can add unchecked
  declarations, overwrite constants or write the REPL's replies itself; we forbid every way we know to run
  code from a proof (`#eval`, `run_tac`, `by_elab`, `eval%`, `elab`, `macro`, simprocs, `initialize`,
  `test_extern`, attributes, configuration terms other than literals, `plausible`, ...), but only a kernel
  replay in a process the proof never ran in (`lean_audit`, the second line) proves it was not forged, and
  that what was proved is the canonical statement as the header alone reads it (a helper that shadows a name
  the statement uses is refused here, and could change nothing the audit compares).
- Syntax we do not know: a Mathlib command, tactic or term elaborator, missing from our lists, that runs
  code or hides a hole. Configuration terms are recognised by position (verifier_pool.lean_scan `Context`);
  a library tactic that evaluates a term given in another shape is not.
- Wrong answers from Lean itself (kernel or elaborator bugs), and resource attacks (the sandbox's job).
- A proof text that reads differently under a Lean version whose token rules differ from `lean_text`'s.

What they refuse that Lean would accept (false positives we accept for a scan that needs no grammar): a named
argument where the scan cannot tell a term from a tactic (after a tactic it does not know to take a term, on a
line after a term Lean reads on across the line break) whose value is not a literal; a term that goes on at a
line left of the proof's column outside any bracket (Lean reads it on after an operator); instances,
structures and attributes other than the tags, `where` attributes; a namespace open at the statement without
the audit (`open X` could change how the statement reads); aesop rules that name a definition of the attempt,
and `.name` configuration values sharing a definition's last component; `unsafe` as aesop's phase anywhere but
first in its rule; Mathlib's `#s` card notation; options `warn.*` and `debug.*`.
"""

from __future__ import annotations

import re
from typing import Any

import structlog

from tasks.lean_proof import IntegrityError, assemble, split_attempt
from tasks.lean_text import closed, name_parts
from verifier_pool.judgement import Judgement  # the pool's one verdict type; `proved` here means "no objection"
from verifier_pool.lean_commands import Kept, Refusal, scan_before, scan_body, statement_names
from verifier_pool.lean_preamble import open_at_statement, opens
from verifier_pool.lean_scan import HOLES

log = structlog.get_logger("verifier_pool.lean_check")

ALLOWED_AXIOMS = frozenset({"propext", "Classical.choice", "Quot.sound"})
COMPILER_AXIOMS = frozenset({"Lean.ofReduceBool", "Lean.ofReduceNat", "Lean.trustCompiler"})  # native_decide & co
DETAIL_CHARS = 300
# Longer attempts are refused before any scanning. The scan is linear but pays a few microseconds of Python
# per token, on the worker's event loop: 10 MB of short tokens took over a minute. Real proofs are a few KB
# (Kimina-Prover's and DeepSeek-Prover's longest miniF2F proofs are tens of KB); at this cap the densest text
# scans in about a second on a 2-core machine.
MAX_PROOF_CHARS = 200_000

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
    """A short reason (`"forbidden: native_decide"`) if a proof body, or a command after it, holds a forbidden
    construct, else None (verifier_pool.lean_commands `scan_body`, for a theorem of no name: every `#print` is
    refused).

    Token-based (`lean_text`), so comments and strings do not count (`-- sorry`, `"sorry"`), a nested comment
    hides what Lean hides (`/- /- -/ sorry -/`), `sor/- -/ry` is two identifiers, and `sorry_lemma` or `h'`
    are identifiers of their own. The first token, in source order, that breaks a rule names the reason:
    text whose reading depends on Lean's token table (`ambiguous`); any `#` command (none belongs in a proof:
    `#print` could fake an axioms line, `#eval` runs code, `#exit` truncates; Mathlib's card notation `#s` is
    a false positive we accept); any attribute `@[`; FORBIDDEN_WORDS; options under FORBIDDEN_OPTION_PREFIXES
    (`set_option debug.skipKernelTC true in`); FORBIDDEN_COMPONENTS anywhere in a dotted name; a command
    after the proof that is not a helper declaration; `eval%`; a configuration value that is not a literal.
    """
    scanned = scan_body(body)
    return scanned.reason if isinstance(scanned, Refusal) else None


def _refused(refusal: Refusal) -> Judgement:
    return _rejected("sorry" if refusal.reason in HOLES else "integrity", refusal.detail)


def prepare(
    model_text: str,
    formal_statement: str,
    max_chars: int | None = MAX_PROOF_CHARS,
    header: str = "",
    *,
    open_namespaces: bool = False,
) -> str | Judgement:
    """Steps 1-3: the command to send, or the rejection that makes sending it unnecessary. `max_chars`:
    MAX_PROOF_CHARS (None only in tests that time the scan itself); it counts helpers and all, as the
    verifier's time limit does (one command holds them). `header`: the trusted header the command runs on; an
    option the model sets as it does (a copy of the header) is not set again.

    `open_namespaces`: True only where the audit (verifier_pool.lean_audit) is the second line. Then a
    namespace the text leaves open at the statement is closed before it and opened on the theorem (`open X
    in`), so the proof's short names reach the helpers in it while the theorem keeps its root name; `open X`
    may change how the statement's own names read, which the audit, comparing the statement with the one the
    header alone reads, refuses. Without it (the REPL's word decides) such a text is refused."""
    if max_chars is not None and len(model_text) > max_chars:
        return _rejected("lean_error", f"attempt of {len(model_text)} characters exceeds {max_chars}")
    attempt = split_attempt(model_text, formal_statement)
    if isinstance(attempt, IntegrityError):
        return _rejected("statement_mismatch", attempt.detail)
    names = statement_names(formal_statement)
    before = scan_before(attempt.before, names)
    if isinstance(before, Refusal):
        return _refused(before)
    if before.namespaces and not open_namespaces:
        return _refused(Refusal(f"forbidden: {open_at_statement(before.namespaces)}", "before the statement"))
    if _sent(before) and not closed("".join(before.commands)):  # it would read on into the statement
        return _rejected("integrity", "before the statement: a comment, string or interpolation left open")
    body = scan_body(attempt.body, names, term=attempt.term, before=before)
    if isinstance(body, Refusal):
        return _refused(body)
    if not body.body_tokens:  # no Lean run can prove anything with whitespace and comments
        return _rejected("lean_error", "empty proof: the attempt holds no Lean code")
    text = attempt.body[: body.body_end] + ("\n" if body.body_end < len(attempt.body) else "")
    known = scan_before(header, frozenset())
    options = opens(before.namespaces) + [
        o for o in before.options if isinstance(known, Refusal) or o not in known.options
    ]
    return assemble(formal_statement, text, attempt.term, _before(before), tuple(options))


def _sent(kept: Kept) -> bool:
    """Whether the commands before the statement go to Lean: a helper or rule is among them, or a namespace the
    theorem is opened in (`open X` needs `X` declared: `namespace X` does it)."""
    return bool(kept.helpers or kept.rules or kept.namespaces)


def _before(kept: Kept) -> str:
    """The kept commands from before the statement, if `_sent`; in a section of their own when they `open`
    namespaces or set options, so that these reach the helpers and never the canonical statement (which Lean
    reads as the header has it; the options it needs, and the `open`s of namespaces left open at it, are set
    on it with `in`)."""
    if not _sent(kept):
        return ""
    text = "".join(kept.commands) + kept.closing
    return f"section\n{text}end\n" if kept.scoped else text


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
