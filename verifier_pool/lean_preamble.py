"""What a prover's preamble may hold besides lemmas, and the names it declares: the rules lean_commands applies
to definitions, tag attributes, scopes and aesop rules before the statement (docs/VERIFIER.md, "What a Lean
attempt may contain", says why each is harmless).

A definition adds what a lemma cannot: compiled code. It runs only when something evaluates it. The scan
refuses every evaluator it knows by word (`#eval`, `native_decide`, `implemented_by`, configuration terms
other than literals, ...); two evaluators name a constant instead, and those are checked here against the
names the attempt declares (`Declared`):
- aesop's tactic rules: the `tactic` builder, or the default builder given a constant of type `TacticM Unit`
  (Aesop/Builder/Default.lean tries `tactic` before `apply`), make aesop run the constant's code
  (Aesop/Builder/Tactic.lean, `RuleTacDescr.tacticM`). In an `add_aesop_rules` command or a tactic's
  `(add ...)` clause, the word `tactic` and any name the attempt declared as a definition are refused.
- a configuration value `.name` (a literal to the scan) resolves to `T.name` for the configuration's type
  `T`, which may be a definition the attempt put in namespace `T`, and Lean evaluates configuration
  (Lean/Elab/Tactic/Config.lean, `evalExpr'`). A `.name` that is the last component of a declared
  definition is refused.
Names are compared by component, so a namespace, an `open` or `_root_` cannot hide one; auxiliary
declarations (`where`, `let rec`: in a lemma too) count as definitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.lean_text import name_parts

# Definitions a text may declare before its statement (`noncomputable` before either too): the kernel checks
# their values when the audit replays them with the theorem.
DEFINITION_WORDS = frozenset({"def", "abbrev"})
# Attributes a helper may carry before the statement: tags a tactic reads (`simp`'s lemma set, the
# elaborator's unfolding) and no handler that registers code. Lean's `simp` attribute adds a simproc only for
# a declaration `simproc_decl` registered (Lean/Meta/Tactic/Simp/Simproc.lean, `isSimproc`), which is refused.
TAG_ATTRIBUTES = frozenset({("simp",), ("reducible",), ("local", "simp")})
# Options that change how unbound names in a helper's signature become binders: kept for the helpers, never
# set on the target theorem (the canonical statement reads as the header has it).
BINDER_OPTIONS = frozenset({"autoImplicit", "relaxedAutoImplicit"})
AESOP_COMMAND = "add_aesop_rules"
AESOP_CLAUSE = "add"  # `aesop (add safe foo)`, `aesop? (add ...)`: rules local to one call
AESOP_PHASE = "unsafe"  # a rule phase where aesop reads one (Aesop/Frontend/RuleExpr.lean, `Aesop.phase`)
AESOP_EVALUATING_BUILDER = "tactic"
SCOPE_WORDS = frozenset({"namespace", "section", "end"})


@dataclass
class Declared:
    """The last components of the names an attempt declares as definitions (its `def`/`abbrev` helpers and the
    auxiliary declarations of any declaration: `where`, `let rec`), and its helpers' full names."""

    definitions: set[str] = field(default_factory=set)
    helpers: set[tuple[str, ...]] = field(default_factory=set)

    def add(self, name: str) -> None:
        self.definitions.update(constant(name)[-1:])

    def declares(self, name: str) -> bool:
        """Whether `name` (as written, perhaps short for a namespaced helper) is one of the helpers."""
        parts = tuple(constant(name))
        return any(full[len(full) - len(parts) :] == parts for full in self.helpers if parts)

    def rule_problem(self, ident: str) -> str | None:
        """Why an aesop rule may not name `ident`, or None."""
        if ident == AESOP_EVALUATING_BUILDER:
            return "aesop rule builder `tactic` (aesop runs the rule's compiled code)"
        if any(p in self.definitions for p in constant(ident)):
            return f"aesop rule `{ident[:40]}` names a definition of the attempt (aesop may run it as a tactic)"
        return None

    def ctor_problem(self, written: str) -> str | None:
        """Why a configuration value's literal name (`.name`, `true`, `Bool.true`, as written) may not stand."""
        if (constant(written.removeprefix(".")) or [""])[-1] in self.definitions:
            return f"config value `{written[:40]}` may name a definition of the attempt (configuration is evaluated)"
        return None


def constant(name: str) -> list[str]:
    """The parts of a name as a constant: a leading `_root_` says only where to look it up."""
    parts = name_parts(name)
    return parts[1:] if parts[:1] == ["_root_"] else parts


def attributes_problem(words: list[str]) -> str | None:
    """`@[w, ...]`'s words (commas included) as the scan read them up to `]`: why they are refused, or None."""
    instance: list[str] = []
    for word in [*words, ","]:
        if word != ",":
            instance.append(word)
            continue
        if tuple(instance) not in TAG_ATTRIBUTES:
            return f"attribute @[{' '.join(instance)[:40]}"
        instance = []
    return None


class Scopes:
    """The `namespace`/`section` scopes a text opens before its statement, innermost last, as (kind, name)."""

    def __init__(self, opened: tuple[str, ...] = ()) -> None:
        self.stack: list[tuple[str, str]] = [("section", name) for name in opened]

    def prefix(self) -> list[str]:
        """The namespace a declaration made now is in, as parts."""
        return [p for kind, name in self.stack if kind == "namespace" for p in name_parts(name)]

    def command(self, word: str, names: list[str], noncomputable: bool) -> str | None:
        """Apply `namespace X`, `[noncomputable] section [X]` or `end [X]`; why it is refused, or None."""
        if len(names) > 1 or (word == "namespace" and not names):
            return f"{word} {' '.join(names)[:40]} (one name)"
        name = names[0] if names else ""
        if noncomputable and word != "section":
            return f"noncomputable {word}"
        if word != "end":
            self.stack.append((word, name))
            return None
        if not self.stack or self.stack[-1][1] != name:
            return f"end {name} closes no scope open here".replace("  ", " ")
        self.stack.pop()
        return None

    def namespaces(self) -> tuple[str, ...]:
        """The namespaces still open, outermost first, as written."""
        return tuple(name for kind, name in self.stack if kind == "namespace")

    def closing(self) -> str:
        """The `end`s that close the sections still open, before the statement."""
        return "".join(f"end {name}".rstrip() + "\n" for _, name in reversed(self.stack))


def open_at_statement(namespaces: tuple[str, ...]) -> str:
    """Why namespaces open at the statement are refused where no audit runs (`lean_second_line = "trust_repl"`):
    the theorem is sent under `open X in`, which can change how its statement's names read (a library
    namespace's declarations, scoped notation and instances), and only the audit compares the statement."""
    x = namespaces[-1]
    return (
        f"namespace {x} open at the statement (close it with `end {x}` first: only the audit, off here, "
        f"would catch how `open {x}` changes the statement's reading)"
    )


def opens(namespaces: tuple[str, ...]) -> list[str]:
    """The `open`s that give the theorem, closed out of `namespaces` (outermost first), the short names it had
    inside them: each namespace Lean had open there, outermost first (`namespace A` then `namespace B.C` opens
    `A`, `A.B` and `A.B.C`)."""
    parts = [p for name in namespaces for p in _written_parts(name)]
    return [f"open {'.'.join(parts[: k + 1])}" for k in range(len(parts))]


def _written_parts(name: str) -> list[str]:
    """A dotted name's components as written (`«a.b»` stays whole)."""
    parts, part, quoted = [], "", False
    for char in name:
        if char == "." and not quoted:
            parts.append(part)
            part = ""
            continue
        quoted = (quoted or char == "«") and char != "»"
        part += char
    return [*parts, part]
