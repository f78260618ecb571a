"""The text and response checks of `verifier_pool.lean_check` (with the proof's place in the text that it
takes from tasks.lean_proof), each against a real exploit text or a REPL transcript from docs/brief/LEAN_REPL.md
(no Lean runs here: these are the documented wire formats)."""

from __future__ import annotations

import gc
import json
import random
import time
from pathlib import Path

import pytest
import structlog

from tasks.lean_proof import IntegrityError, TermBody, assemble, extract_proof_body, theorem_name
from tasks.lean_text import (
    block_comment_end,
    comments,
    lex,
    mask_comments,
    name_parts,
    plain_string_end,
)
from tests.verifier_pool import reference_lean
from verifier_pool import lean_check
from verifier_pool.lean_check import (
    MAX_PROOF_CHARS,
    Judgement,
    axioms_command,
    judge_axioms,
    judge_command,
    prepare,
    scan_forbidden,
)
from verifier_pool.lean_commands import Kept, Refusal, scan_before, scan_body, statement_names
from verifier_pool.lean_preamble import Declared

MINIF2F = Path(__file__).resolve().parents[2] / "data" / "minif2f.jsonl"
GCD = "theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 12 := by\n"
CUBE = (
    "theorem amc12a_2008_p8 (x y : ℝ) (h₀ : 0 < x ∧ 0 < y) (h₁ : y ^ 3 = 1)\n"
    "  (h₂ : 6 * x ^ 2 = 2 * (6 * y ^ 2)) : x ^ 3 = 2 * Real.sqrt 2 := by\n"
)
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"


def _minif2f_sample() -> list[dict]:
    if not MINIF2F.exists():
        return []
    rows = [json.loads(line) for line in MINIF2F.read_text().splitlines() if line.strip()]
    quoted = [r for r in rows if "'" in r["formal_statement"]]  # ⁻¹' and '' : quotes that are not char literals
    return (rows[::11] + quoted)[:50]


SAMPLE = _minif2f_sample()


def kinds(text: str) -> list[tuple[str, str]]:
    return [(t.kind, t.text) for t in lex(text)]


# --- the lexer --------------------------------------------------------------------------------------------


def test_char_literal_right_after_a_symbol_is_ambiguous():
    # If `+'` were a token of some imported notation, Lean would read it and then open a string at `"`: only
    # Lean's token table could say, so the text is rejected whichever way it reads.
    assert ("ambiguous", "'\"'") in kinds('x +\'"\' y " sorry "')
    assert scan_forbidden("  exact (1 +'\"' 2)\n") == "forbidden: ambiguous literal '\\'\"\\'' at line 1"


# --- scan_forbidden: real exploit texts -----------------------------------------------------------------

EXPLOITS = [
    ("  sorry\n", "sorry"),
    ("  exact sorryAx _ false\n", "sorryAx"),
    ("  exact «sorryAx» _ false\n", "sorryAx"),
    ("  exact _root_.sorryAx _ false\n", "sorryAx"),
    ("  admit\n", "admit"),
    ("  stop\n  norm_num\n", "stop"),
    ("  native_decide\n", "native_decide"),
    ("  decide +native\n", "decide +native"),
    ("  decide (config := {native := true})\n", "decide +native"),
    ("  exact Lean.ofReduceBool _ _ rfl\n", "ofReduceBool"),
    ("  set_option debug.skipKernelTC true in\n  exact h\n", "set_option debug.skipKernelTC"),
    ("  set_option «debug».skipKernelTC true in\n  exact h\n", "set_option debug.skipKernelTC"),
    ('  norm_num\nrun_cmd Lean.logInfo "x"\n', "run_cmd"),
    ("  run_tac Lean.Elab.Tactic.evalTactic (← `(tactic| norm_num))\n", "run_tac"),
    ("  exact by_elab Lean.Elab.Term.elabTerm (← `(trivial)) none\n", "by_elab"),
    ("  norm_num\nrun_elab pure ()\n", "run_elab"),
    ('macro "norm_num" : tactic => `(tactic| sorry)\n', "macro"),
    ("  norm_num\nmacro_rules | `(tactic| norm_num) => `(tactic| sorry)\n", "macro_rules"),
    ('  norm_num\nelab "cheat" : tactic => pure ()\n', "elab"),
    ('  norm_num\nsyntax "cheat" : tactic\n', "syntax"),
    ('  norm_num\nnotation a " + " b => a * b\n', "notation"),
    ('  norm_num\ninfixl:65 " + " => HMul.hMul\n', "infixl"),
    ('  norm_num\ninfix:50 " = " => fun _ _ => True\n', "infix"),
    ("  norm_num\naxiom cheat : False\n", "axiom"),
    ("  exact (cheat : False).elim\naxiom cheat : False\n", "axiom"),
    ("  norm_num\nopaque secret : Nat\n", "opaque"),
    ("  norm_num\nunsafe def f : Nat := 1\n", "unsafe"),
    ("  exact unsafe (unsafeCast ())\n", "unsafe"),
    ("  norm_num\npartial def loop : Nat → Nat := loop\n", "partial"),
    ("  decide?\n", "decide?"),
    ("  norm_num\ninitialize pure ()\n", "initialize"),
    ("  norm_num\nbuiltin_initialize pure ()\n", "builtin_initialize"),
    ("  norm_num\nsimproc cheat (_) := fun _ => pure .continue\n", "simproc"),
    ('  have : String := s!"{(sorry : String)}"\n  norm_num\n', "sorry"),
    ('  exact (fun _ => trivial) r"\\" ; exact sorry ; "x"\n', "ambiguous literal"),
    ("  exact sor/- -/ry\n  exact sorry\n", "sorry"),  # the split one is not a sorry, the second is
    # Configuration values are evaluated (lean4 Lean/Elab/Tactic/Config.lean: `elabConfig`, then
    # `evalExpr' (safety := .unsafe)`), in the `(name := value)` and `(config := value)` items of `optConfig`
    # and `config` (Init/Tactics.lean).
    ("  simp (config := { maxSteps := dbgTraceVal 400000 })\n", "config term (config := ...)"),
    ('  simp (maxSteps := (unsafeBaseIO (IO.Process.run { cmd := "sh" })).toNat)\n', "config term (maxSteps"),
    ("  simp +arith (maxSteps := 10) (maxDischargeDepth := Nat.succ 2)\n", "config term (maxDischargeDepth"),
    ("  omega (config := { splitDisjunctions := (fun _ => true) () })\n", "config term (config"),
    ("  norm_num (config := Lean.Meta.Simp.neutralConfig)\n", "config term (config"),
    ("  simp (config := { Simp.neutralConfig with zeta := true })\n", "config term (config"),
    ("  simp («config» := myConfig)\n", "config term («config»"),
    ("  simp (maxSteps := by exact 5)\n", "config term (maxSteps"),  # Config.lean turns `by` into syntax
    ('  simp (maxSteps := "5".toNat!)\n', "config term (maxSteps"),
    # DecideConfig's second field is `native`: set by position, no `native` word is written
    ("  decide (config := ⟨false, true⟩)\n", "config term (config"),
    ("  decide (config := Lean.Parser.Tactic.DecideConfig.mk false true false false)\n", "config term (config"),
    # what an evaluated term reaches the outside with; `IO.RealWorld` is `Unit`, so no `unsafe` is needed
    ('  have := (IO.println "pwned").run ()\n  norm_num\n', "IO"),
    ("  open IO in\n  norm_num\n", "IO"),
    ("  exact unsafeBaseIO (pure ()) |>.elim\n", "unsafeBaseIO"),
    # lean4 `syntax (name := testExternCmd) "test_extern " term : command`: compiles and runs its term
    ("  norm_num\ntest_extern Nat.add 12 37\n", "test_extern"),
    ("  norm_num\n  test_extern Nat.add 12 37\n", "test_extern"),  # ends the tactic block at any column
    # Mathlib `eval% term` (`elabEvalExpr`: `Lean.Meta.evalExpr ... (safety := .unsafe)`)
    ("  have h : 2 ^ 10 = eval% 2 ^ 10 := rfl\n  norm_num\n", "eval%"),
    # attributes on `where` and `let rec` declarations are applied when they are added
    (
        "  exact trivial\nwhere\n  @[command_parser] cheat : Lean.Parser.Parser := Lean.Parser.skip\n",
        "attribute @[command_parser",
    ),
    (
        "  exact trivial\nwhere\n  @[term_elab Lean.Parser.Term.app] f : Lean.Elab.Term.TermElab := default\n",
        "term_elab",
    ),
    (
        "  exact trivial\nwhere\n  @[tactic Lean.Parser.Tactic.omega] f : Lean.Elab.Tactic.Tactic := default\n",
        "attribute @[tactic",
    ),
    ("  exact trivial\nwhere\n  @[macro Lean.Parser.Tactic.omega] f : Lean.Macro := default\n", "macro"),
    (
        "  exact trivial\nwhere\n  @[delab app.HAdd.hAdd] f : Lean.PrettyPrinter.Delaborator.Delab := default\n",
        "attribute @[delab",
    ),
    (
        "  exact trivial\nwhere\n  @[app_unexpander Nat.add] f : Lean.PrettyPrinter.Unexpander := default\n",
        "attribute @[app_unexpander",
    ),
    ("  exact trivial\nwhere\n  @[init] f : IO Unit := pure ()\n", "attribute @[init"),
    ("  exact trivial\nwhere\n  @[env_extension] f : Nat := 0\n", "attribute @[env_extension"),
    ("  exact trivial\nwhere\n  @[builtin_command_parser] f : Nat := 0\n", "attribute @[builtin_command_parser"),
    ("  exact trivial\nwhere\n  @[simp] f : 1 = 1 := rfl\n", "attribute @[simp"),  # any attribute at all
    ("  exact (let rec @[implemented_by g] f : Nat := 0; trivial)\n", "implemented_by"),
    ("  exact trivial\nwhere\n  @[", "attribute @["),  # at the very end
    # Plausible/Tactic.lean: `unsafe evalExpr` of `Testable.check` on the goal, whatever the goal says
    ('  have : (dbgTraceVal "x").length = 1 := by plausible\n  norm_num\n', "plausible"),
    ("  have : 1 + 1 = 2 := by slim_check\n  norm_num\n", "slim_check"),
    # Lean.AddDecl `register_builtin_option warn.sorry`: with it off, no "declaration uses sorry" warning
    ("  set_option warn.sorry false in\n  exact (by assumption)\n", "set_option warn.sorry"),
    ("  bv_decide?\n", "bv_decide?"),
    ('  bv_check "proof.lrat"\n', "bv_check"),
]


@pytest.mark.parametrize(("body", "reason"), EXPLOITS, ids=[e[1] for e in EXPLOITS])
def test_scan_rejects_exploit(body, reason):
    found = scan_forbidden(body)
    assert found is not None and found.startswith(f"forbidden: {reason}"), found


# Exploits written as commands after the proof: Lean ends the proof at the command, and the command and the
# rest of the text are dropped unread (verifier_pool.lean_commands), so none reaches Lean. A forbidden word
# where the proof ends (`axiom`, `elab`, `run_cmd`, ... above) is refused as anywhere.
EXPLOITS_AFTER_THE_PROOF = [
    ("\n@[implemented_by f] def g : Nat := 1\n", "implemented_by"),
    ('@[extern "lean_nat_add"] opaque h : Nat\n', "extern"),
    ("@[csimp] theorem t : @f = @g := rfl\n", "csimp"),
    ("#exit\n", "#exit"),
    ('#eval IO.println "pwned"\n', "#eval"),
    ("#print axioms mathd_numbertheory_188\n", "#print"),
    ("#check_failure foo\n", "#check_failure"),
    ("local instance : Fact False := ⟨sorry⟩\n", "local"),
    ("instance : Decidable True := isTrue trivial\n", "instance"),
    ("import Mathlib.Tactic\n", "import"),
    ("@[command_elab Lean.Parser.Command.printAxioms] def f : CommandElab := fun _ => pure ()\n", "command_elab"),
    (" def cheat : Nat := 1\n", "def"),  # a line left of the proof's column
    ("    example : True := trivial\n", "example"),  # any column: a command all the same
    ("namespace Foo\n", "namespace"),
    ("export Nat (gcd)\n", "export"),
    ("open Nat\n", "open"),
    (" open Nat\n", "open, left"),
    ("attribute [simp] Nat.gcd_comm\n", "attribute"),
    ("end\n", "end"),
    ("set_option warn.sorry false\n", "set_option warn.sorry"),
]


@pytest.mark.parametrize(("after", "name"), EXPLOITS_AFTER_THE_PROOF, ids=[e[1] for e in EXPLOITS_AFTER_THE_PROOF])
def test_an_exploit_after_the_proof_never_reaches_lean(after, name):
    assert scan_forbidden(f"  norm_num\n{after}") is None
    assert prepare(f"{GCD}  norm_num\n{after}", GCD) == f"{GCD}  norm_num\n"


CLEAN = [
    "  norm_num [Nat.gcd]\n",
    "  -- sorry, this is a comment\n  norm_num\n",
    "  /- sorry in a /- nested -/ comment native_decide -/\n  norm_num\n",
    '  have h : "sorry" = "sorry" := rfl\n  norm_num\n',
    "  exact sor/- x -/ry\n",  # two identifiers, `sor` and `ry`: Lean fails it, the scan has no objection
    "  have sorry_lemma : 1 = 1 := rfl\n  exact sorry_lemma ▸ rfl\n",
    "  intro x h'\n  have h'' := h'\n  nlinarith [sq_nonneg (x - 1), h'']\n",
    "  open Real in\n  nlinarith [Real.sq_sqrt (show (0:ℝ) ≤ 2 by norm_num)]\n",
    "  decide\n",
    "  simp? says simp only [Nat.gcd]\n",
    "  have : (f ⁻¹' {7}).Nonempty := ⟨21, by simp [h₀]⟩\n  exact this\n",
    "  rcases h with ⟨x, hx⟩ <;> simp_all [Finset.sum_range_succ]\n",
    "  calc 2 * x = x + x := by ring\n    _ = 4 := by linarith\n",
    "  norm_num\n  set_option maxRecDepth 10000 in\n  decide\n",
    # configurations of literals only
    "  simp (config := { maxSteps := 400000 })\n",
    "  simp (config := {maxSteps := 400000, decide := true}) [Nat.gcd]\n",
    "  decide (config := { kernel := true })\n",
    "  decide +kernel\n",
    "  omega +splitDisjunctions -splitNatAbs\n",
    "  simp (maxSteps := 1000) (maxDischargeDepth := 3) +arith\n",
    "  rw (occs := .pos [1, 2]) [Nat.add_comm]\n",
    "  simp (config := { unfoldPartialApp := true,\n    zetaDelta := false }) [f]\n",
    "  simp (config := {})\n",
    "  simp (config := { ground := true, etaStruct := .none }) only [h]\n",
    "  linarith (config := { splitNe := true })\n",
    "  nlinarith (config := { /- a comment -/ maxSteps := 100 }) [sq_nonneg (x - y)]\n",
    # tactic-valued items and ordinary parentheses
    "  field_simp (discharger := positivity)\n",
    "  simp (disch := norm_num) [h]\n",
    "  exact (by norm_num : (0 : ℝ) < 2)\n",
    "  have := Nat.le_of_lt_succ (n := 5) (m := 3) (by norm_num)\n  exact this\n",
    "  rcases h with (h | h) <;> simp [(fun x => x) 1]\n",
    # `eval` without `%`, `%` without `eval`
    "  simp [Polynomial.eval, eval_add]\n  norm_num [Nat.mod_eq_of_lt (by norm_num : 3 % 5 = 3)]\n",
    "  set_option linter.unusedVariables false in\n  norm_num\n",
]


@pytest.mark.parametrize("body", CLEAN)
def test_scan_passes_clean_body(body):
    assert scan_forbidden(body) is None


# --- extract_proof_body and assemble ----------------------------------------------------------------------


def test_restated_theorem_after_imports_and_helpers_gives_the_body():
    model = (
        "Here is the proof.\n```lean4\nimport Mathlib\nopen Nat\n\n"
        "lemma helper : 1 = 1 := rfl\n\n/-- The answer is 12. -/\n"
        f"{GCD}  norm_num [Nat.gcd]\n```\nDone."
    )
    body = extract_proof_body(model, GCD)
    assert body == "  norm_num [Nat.gcd]\n"
    assert assemble(GCD, body) == GCD + "  norm_num [Nat.gcd]\n"


def test_garbage_before_the_statement_is_discarded():
    model = (
        'notation:50 a " = " b => True\n'
        "axiom cheat : False\n"
        "local instance : Fact False := ⟨cheat⟩\n"
        'macro "norm_num" : tactic => `(tactic| exact cheat.elim)\n'
        f"{GCD}  norm_num\n"
    )
    body = extract_proof_body(model, GCD)
    assert body == "  norm_num\n"
    command = assemble(GCD, body)
    assert "notation" not in command and "axiom" not in command and "macro" not in command


STATEMENT_OF = "the statement of `mathd_numbertheory_188` differs from the dataset's at line"


@pytest.mark.parametrize(
    ("altered", "detail"),
    [
        (GCD.replace("= 12", "= 13"), f"{STATEMENT_OF} 3 of the attempt: `13` where the dataset has `12`"),
        (GCD.replace(" :", " (h : False) :", 1), f"{STATEMENT_OF} 3 of the attempt: `(` where the dataset has `:`"),
        (
            GCD.replace("mathd_numbertheory_188", "mathd_numbertheory_188'"),
            "no theorem `mathd_numbertheory_188`: the attempt declares `mathd_numbertheory_188'` (line 3) instead",
        ),
        (
            GCD.replace("theorem", "example").replace(" mathd_numbertheory_188", ""),
            "no theorem `mathd_numbertheory_188`: the attempt declares an `example` (line 3) instead",
        ),
        (  # the comment eats the rest of the line: the next word is the proof's
            GCD.replace("Nat.gcd 180 168", "Nat.gcd  180  168\n    --"),
            f"{STATEMENT_OF} 5 of the attempt: `norm_num` where the dataset has `=`",
        ),
        (GCD.replace("180 168", "180 168 + 0"), f"{STATEMENT_OF} 3 of the attempt: `+` where the dataset has `=`"),
    ],
)
def test_altered_statement_is_a_statement_mismatch_naming_the_first_word_that_differs(altered, detail):
    model = f"import Mathlib\n\n{altered}  norm_num\n"
    assert extract_proof_body(model, GCD) == IntegrityError(detail)
    assert prepare(model, GCD) == Judgement("rejected", "statement_mismatch", detail)


def test_statement_inside_a_comment_does_not_count():
    model = f"/- {GCD} -/\ntheorem other : True := by\n  norm_num\n"
    assert isinstance(extract_proof_body(model, GCD), IntegrityError)


def test_whitespace_comments_and_assign_spacing_do_not_matter():
    model = "theorem mathd_numbertheory_188 :\n    Nat.gcd 180 168 /- gcd -/ = 12:=by\n  norm_num\n  -- done\n"
    assert extract_proof_body(model, GCD) == "  norm_num\n  -- done\n"


def test_first_tactic_on_the_by_line_keeps_its_column():
    model = "theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 12 := by norm_num\n"
    body = extract_proof_body(model, GCD)
    assert body == " " * model.index("norm_num") + "norm_num\n"
    assert assemble(GCD, body).splitlines()[-1].strip() == "norm_num"


def test_last_restatement_wins():
    model = f"{GCD}  sorry\n\n{GCD}  norm_num\n"
    assert extract_proof_body(model, GCD) == "  norm_num\n"


def test_bare_body_is_accepted_and_indented():
    assert extract_proof_body("norm_num [Nat.gcd]\nrfl", GCD) == "  norm_num [Nat.gcd]\n  rfl"
    assert extract_proof_body("by\n  norm_num\n", GCD) == "  norm_num\n"
    assert extract_proof_body("```lean4\n  simp\n  decide\n```", GCD) == "  simp\n  decide\n"


def test_bare_body_with_imports_is_caught_by_the_scan():
    body = extract_proof_body("import Mathlib\nnorm_num\n", GCD)
    assert isinstance(body, str) and scan_forbidden(body) == "forbidden: import"


def test_multiline_statement_restated_verbatim_or_reflowed():
    for statement_text in (CUBE, " ".join(CUBE.split()) + "\n"):
        assert extract_proof_body(f"{statement_text}  nlinarith [sq_nonneg (x - y)]\n", CUBE) == (
            "  nlinarith [sq_nonneg (x - y)]\n"
        )


def test_spacing_that_lean_reads_differently_is_not_whitespace_noise():
    squeezed = CUBE.replace("(h₀ : 0 < x", "(h₀:0 < x")  # a whitespace run removed, not collapsed
    assert isinstance(extract_proof_body(f"{squeezed}  simp\n", CUBE), IntegrityError)


def test_assemble_refuses_a_statement_with_import():
    with pytest.raises(ValueError):
        assemble("import Mathlib\n" + GCD, "  norm_num\n")


# --- valid variants of a proof: `lemma`, term mode, reflowed statements, configurations of literals ---------

TERM = "theorem t (a b : ℕ) (h₀ : a = b) (h₁ : b = 2) : a = 2 := by\n"


def test_lemma_for_theorem_and_back_is_the_same_statement():
    assert prepare(GCD.replace("theorem", "lemma") + "  norm_num\n", GCD) == GCD + "  norm_num\n"
    as_lemma = GCD.replace("theorem", "lemma")
    assert prepare(GCD + "  norm_num\n", as_lemma) == as_lemma + "  norm_num\n"
    assert (
        prepare(
            "```lean4\nimport Mathlib\n\nlemma mathd_numbertheory_188 :\n  Nat.gcd 180 168 = 12 := by\n  decide\n```",
            GCD,
        )
        == GCD + "  decide\n"
    )
    assert prepare(GCD.replace("theorem mathd", "lemma xmathd") + "  norm_num\n", GCD).reason == "statement_mismatch"


def test_term_mode_proof_is_assembled_after_the_statements_assign():
    model = "theorem t (a b : ℕ) (h₀ : a = b) (h₁ : b = 2) : a = 2 := h₀ ▸ h₁\n"
    column = model.index("h₀ ▸")
    body = extract_proof_body(model, TERM)
    assert body == TermBody(" " * column + "h₀ ▸ h₁\n")
    command = "theorem t (a b : ℕ) (h₀ : a = b) (h₁ : b = 2) : a = 2 :=\n" + " " * column + "h₀ ▸ h₁\n"
    assert assemble(TERM, body.text, term=True) == command
    assert prepare(model, TERM) == command
    # on the next lines, after a comment, with `lemma`
    model = "lemma t (a b : ℕ) (h₀ : a = b) (h₁ : b = 2) : a = 2 :=\n  -- by substitution\n  h₀ ▸\n    h₁\n"
    assert prepare(model, TERM) == TERM.removesuffix(" by\n") + "\n  -- by substitution\n  h₀ ▸\n    h₁\n"
    # `by` that is the start of a longer word is a term too, as Lean reads it
    assert prepare(TERM.removesuffix("\n") + "Contra h\n", TERM) == TERM.removesuffix(" by\n") + (
        "\n" + " " * len(TERM.removesuffix("by\n")) + "byContra h\n"
    )


def test_term_mode_body_is_scanned_like_a_tactic_body():
    statement = TERM.removesuffix("by\n")
    assert prepare(statement + "sorry\n", TERM) == Judgement("rejected", "sorry", "forbidden: sorry")
    assert prepare(statement + "by_elab pure (Lean.mkConst ``trivial)\n", TERM).detail == "forbidden: by_elab"
    assert prepare(statement + "trivial\nwhere\n  @[command_parser] p : Nat := 0\n", TERM).detail == (
        "forbidden: attribute @[command_parser"
    )
    assert prepare(statement + " -- nothing\n", TERM).detail == "empty proof: the attempt holds no Lean code"


def test_statement_reflowed_across_lines_is_the_same_statement():
    reflowed = (
        "theorem amc12a_2008_p8\n"
        "    (x y : ℝ)\n"
        "    (h₀ : 0 < x ∧ 0 < y) (h₁ : y ^ 3 = 1) (h₂ : 6 * x ^ 2 =\n"
        "      2 * (6 * y ^ 2)) :\n"
        "    x ^ 3 =\n"
        "      2 * Real.sqrt 2 :=\n"
        "  by\n"
        "  nlinarith [sq_nonneg (x - y)]\n"
    )
    assert prepare(reflowed, CUBE) == CUBE + "  nlinarith [sq_nonneg (x - y)]\n"
    tabs = CUBE.replace(" ", "\t", 3).replace("\n  ", "\n\t\t")
    assert prepare(tabs + "  simp\n", CUBE) == CUBE + "  simp\n"


@pytest.mark.parametrize(
    "tactic",
    [
        "simp (config := { maxSteps := 400000 })",
        "decide (config := { kernel := true })",
        "omega +splitDisjunctions",
        "simp (maxSteps := 400000) +arith [Nat.gcd]",
        "norm_num (config := { decide := true, zeta := false })",
        "rw (occs := .pos [1]) [Nat.gcd_comm]",
    ],
)
def test_tactic_configs_of_literals_are_accepted(tactic):
    assert prepare(f"{GCD}  {tactic}\n", GCD) == f"{GCD}  {tactic}\n"


def test_prepare_end_to_end():
    # the header's option goes on the theorem (`in`); its imports and opens reach nothing: the trusted header does
    assert prepare(f"```lean4\n{HEADER}{GCD}  norm_num\n```", GCD) == (
        f"set_option maxHeartbeats 0 in\n{GCD}  norm_num\n"
    )
    assert prepare(f"{GCD}  native_decide\n", GCD) == Judgement("rejected", "integrity", "forbidden: native_decide")
    assert prepare(f"{GCD}  exact sorryAx _ false\n", GCD) == Judgement("rejected", "sorry", "forbidden: sorryAx")
    assert prepare(GCD.replace("12", "13") + "  norm_num\n", GCD).reason == "statement_mismatch"


@pytest.mark.parametrize("text", ["", "\n  \n", "```lean4\n```", "-- no idea\n", f"{GCD}  /- later -/\n"])
def test_an_attempt_without_lean_code_is_rejected_without_a_lean_run(text):
    judged = prepare(text, GCD)
    assert isinstance(judged, Judgement) and judged.reason == "lean_error" and "empty proof" in judged.detail


@pytest.mark.skipif(not SAMPLE, reason=f"{MINIF2F} not present")
@pytest.mark.parametrize("row", SAMPLE, ids=[r["name"] for r in SAMPLE])
def test_minif2f_round_trip(row):
    statement = row["formal_statement"]
    assert theorem_name(statement) == row["name"]
    assert scan_forbidden(statement.removeprefix("theorem")) is None  # a statement is clean text
    model = f"```lean4\n{row['header']}/-- informal -/\n{statement}  nlinarith [sq_nonneg (x - 1)]\n```"
    body = extract_proof_body(model, statement)
    assert body == "  nlinarith [sq_nonneg (x - 1)]\n"
    assert assemble(statement, body) == statement + body
    flat = " ".join(statement.split()) + " linarith"  # the whole statement on one line, the tactic after it
    assert extract_proof_body(flat, statement) == " " * (len(flat) - len("linarith")) + "linarith"


# --- theorem names and #print axioms ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mathd_numbertheory_188", "foo.bar'", "h₀_lemma₁", "«my thm»"])
def test_axioms_command_names_the_theorem(name):  # theorem_name itself: tests/tasks/test_lean_proof.py
    assert axioms_command(name) == f"#print axioms {name}"


def info(data: str, line: int = 1) -> dict:
    return {"severity": "info", "pos": {"line": line, "column": 0}, "endPos": {"line": 1, "column": 6}, "data": data}


NAME = "mathd_numbertheory_188"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (f"'{NAME}' depends on axioms: [propext, Classical.choice, Quot.sound]", Judgement("proved")),
        (f"'{NAME}' depends on axioms: [propext]", Judgement("proved")),
        (f"'{NAME}' does not depend on any axioms", Judgement("proved")),
        (f"'{NAME}' depends on axioms: [propext,\n Classical.choice,\n Quot.sound]\n", Judgement("proved")),
        (f"'{NAME}' depends on axioms: [propext, sorryAx]", Judgement("rejected", "sorry", "depends on sorryAx")),
        (
            f"'{NAME}' depends on axioms: [propext, Classical.choice, Lean.ofReduceBool, Lean.trustCompiler]",
            Judgement("rejected", "integrity", "trusts the compiler: Lean.ofReduceBool, Lean.trustCompiler"),
        ),
        (f"'{NAME}' depends on axioms: [cheat, propext]", Judgement("rejected", "integrity", "uses axioms: cheat")),
    ],
)
def test_judge_axioms(data, expected):
    assert judge_axioms({"env": 2, "messages": [info(data)]}, NAME) == expected


@pytest.mark.parametrize("quote", ["'", "`"])
@pytest.mark.parametrize(
    ("wording", "expected"),
    [
        ("{q}{name}{q} depends on axioms: [propext, Classical.choice, Quot.sound]", Judgement("proved")),
        ("{q}{name}{q} does not depend on any axioms", Judgement("proved")),
        ("{q}{name}{q} depends on axioms: [propext, sorryAx]", Judgement("rejected", "sorry", "depends on sorryAx")),
        (
            "{q}{name}{q} depends on axioms: [Classical.choice, Lean.ofReduceBool]",
            Judgement("rejected", "integrity", "trusts the compiler: Lean.ofReduceBool"),
        ),
    ],
)
def test_axioms_report_in_either_quoting(quote, wording, expected):
    """Lean's `printAxiomsOf` quotes the name with `'` (src/Lean/Elab/Print.lean at 8b96499 and 02637a0); the
    backquoted form of Lean's newer messages is read the same way."""
    data = wording.format(q=quote, name=NAME)
    assert judge_axioms({"env": 2, "messages": [info(data)]}, NAME) == expected
    assert judge_axioms({"env": 2, "messages": [info(data.replace(NAME, "other"))]}, NAME).reason == "integrity"


def test_unknown_axioms_wording_is_an_error_logged_once_with_its_text(monkeypatch):
    monkeypatch.setattr(lean_check, "_unknown_wording_logged", False)  # a fresh process
    first = f"{NAME} depends on axioms: [propext]"  # unquoted: no Lean version we read prints this
    second = f"axioms of '{NAME}': none"
    with structlog.testing.capture_logs() as logs:
        for data in (first, second, first):
            judged = judge_axioms({"env": 2, "messages": [info(data)]}, NAME)
            assert (judged.verdict, judged.reason) == ("error", "")
    assert logs == [{"event": "axioms_report_unknown_wording", "log_level": "error", "texts": [first]}]


def test_axioms_report_about_another_name_is_integrity():
    response = {"env": 2, "messages": [info("'Foo.mathd_numbertheory_188' depends on axioms: [propext]")]}
    assert judge_axioms(response, NAME).reason == "integrity"


def test_axioms_report_names_compare_by_components():
    assert judge_axioms({"env": 2, "messages": [info("'«my thm»' does not depend on any axioms")]}, "«my thm»") == (
        Judgement("proved")
    )
    assert judge_axioms({"env": 2, "messages": [info("'foo'' does not depend on any axioms")]}, "_root_.foo'") == (
        Judgement("proved")
    )


def test_two_axioms_reports_or_a_report_off_line_one_are_integrity():
    good = f"'{NAME}' does not depend on any axioms"
    assert judge_axioms({"env": 2, "messages": [info(good), info(good)]}, NAME).reason == "integrity"
    assert judge_axioms({"env": 2, "messages": [info(good, line=3)]}, NAME).reason == "integrity"


def test_unknown_constant_is_integrity():
    error = {
        "severity": "error",
        "pos": {"line": 1, "column": 14},
        "endPos": {"line": 1, "column": 36},
        "data": f"unknown constant '{NAME}'",
    }
    judgement = judge_axioms({"env": 2, "messages": [error]}, NAME)
    assert (judgement.verdict, judgement.reason) == ("rejected", "integrity") and "unknown constant" in judgement.detail


def test_axioms_without_a_readable_report_or_env_is_infrastructure():
    assert judge_axioms({"env": 2}, NAME).verdict == "error"
    assert judge_axioms({"message": "Unknown environment."}, NAME).verdict == "error"


# --- judge_command: the transcripts of LEAN_REPL.md, verbatim ---------------------------------------------

PROVED = '{"env": 1}'
ERROR = """{"messages":
 [{"severity": "error",
   "pos": {"line": 1, "column": 15},
   "endPos": {"line": 1, "column": 32},
   "data": "unsolved goals\\n⊢ Nat"}],
 "env": 0}"""
SORRY = """{"sorries":
 [{"proofState": 0,
   "pos": {"line": 1, "column": 18},
   "goal": "⊢ Nat",
   "endPos": {"line": 1, "column": 23}}],
 "messages":
 [{"severity": "warning",
   "pos": {"line": 1, "column": 4},
   "endPos": {"line": 1, "column": 5},
   "data": "declaration uses `sorry`"}],
 "env": 0}"""


def msg(severity: str, data: str) -> dict:
    return {"severity": severity, "pos": {"line": 1, "column": 0}, "endPos": None, "data": data}


def test_transcripts():
    assert judge_command(json.loads(PROVED)) == Judgement("proved")
    assert judge_command(json.loads(ERROR)) == Judgement("rejected", "lean_error", "unsolved goals\n⊢ Nat")
    assert judge_command(json.loads(SORRY)) == Judgement("rejected", "sorry", "declaration uses `sorry`")


@pytest.mark.parametrize("quoting", ["declaration uses 'sorry'", "declaration uses `sorry`"])
def test_sorry_warning_without_sorries_field(quoting):
    assert judge_command({"env": 1, "messages": [msg("warning", quoting)]}).reason == "sorry"


def test_info_and_ordinary_warnings_never_fail():
    messages = [
        msg("info", "Goals accomplished!"),
        msg("warning", "unused variable `h` [linter.unusedVariables]"),
        msg("trace", "[Meta.debug] x"),
    ]
    assert judge_command({"env": 1, "messages": messages}) == Judgement("proved")


def test_exit_warning_is_integrity():
    judgement = judge_command({"env": 1, "messages": [msg("warning", "using 'exit' to interrupt Lean")]})
    assert (judgement.verdict, judgement.reason) == ("rejected", "integrity")


def test_heartbeat_timeout_is_a_lean_error():
    data = "(deterministic) timeout at `whnf`, maximum number of heartbeats (200000) has been reached\n" + "x" * 500
    judgement = judge_command({"env": 1, "messages": [msg("error", data)]})
    assert (judgement.verdict, judgement.reason) == ("rejected", "lean_error") and len(judgement.detail) == 300


def test_first_error_is_the_detail_and_sorry_outranks_errors():
    messages = [msg("error", "first"), msg("error", "second")]
    assert judge_command({"env": 1, "messages": messages}).detail == "first"
    messages.append(msg("warning", "declaration uses 'sorry'"))
    assert judge_command({"env": 1, "messages": messages}).reason == "sorry"


@pytest.mark.parametrize(
    "response",
    [{"message": "Unknown environment."}, {"foo": 1}, "garbage", {"env": 1, "messages": [msg("fatal", "?")]}],
)
def test_non_answers_are_infrastructure_errors(response):
    judgement = judge_command(response)
    assert (judgement.verdict, judgement.reason) == ("error", "")


# --- the per-character reading (tests/verifier_pool/reference_lean.py) against production, on random text ----

LEAN_PIECES = [
    "sorry",
    "theorem",
    "by",
    ":=",
    ":",
    "=",
    " ",
    "  ",
    "\n",
    "\t",
    "\r",
    "--",
    "-",
    "/",
    "/-",
    "-/",
    "/--",
    "/-!",
    '"',
    "\\",
    "{",
    "}",
    "'",
    "''",
    "a",
    "h'",
    "x.y",
    "x.",
    ".«",
    "«",
    "»",
    "r",
    'r"',
    'r#"',
    '"#',
    "#",
    "#eval",
    "1",
    "1e5",
    "0x1F",
    "(",
    ")",
    "[",
    "]'",
    "⁻¹'",
    "+",
    "open",
    "native_decide",
    "α",
    "ℝ",
    "s!",
    ".",
    "_root_",
    "Lean.ofReduceBool",
    "debug.x",
    "«sorryAx»",
    "exact?",
    "x₁",
    "@[",
    "λ",
    "\u00a0",
    "\u2003",
    "×'",
    "∑'",
    "℃",
    "≤",
    "@",
    "⟨",
    "·",
    # configuration items, attributes, eval%
    "(config := ",
    "(maxSteps := ",
    "(disch := ",
    "(x:=",
    " := ",
    "true",
    ".c",
    ",",
    "[",
    ")",
    "%",
    "eval",
    "eval%",
    "@[",
    "@[simp]",
    "warn.sorry",
    "{ k := 1, ",
    "⟨true, true⟩",
    "lemma",
]


def _soup(rng: random.Random, pieces: list[str], n: int) -> str:
    return "".join(rng.choice(pieces) for _ in range(rng.randrange(n)))


def _as_tuples(tokens) -> list[tuple]:
    return [(t.kind, t.text, t.start, t.line, t.col) for t in tokens]


def _visible_in(tokens, kind: str) -> set[int]:
    return {t.start + k for t in tokens if t.kind == kind for k, ch in enumerate(t.text) if not ch.isspace()}


def test_lexer_agrees_with_the_per_character_reference_on_random_text():
    rng = random.Random(12)
    for _ in range(6_000):
        text = _soup(rng, LEAN_PIECES, 24)
        exact = lex(text)
        assert _as_tuples(exact) == _as_tuples(reference_lean.lex(text)), text
        assert mask_comments(text) == reference_lean.mask_comments(text), text
        merged = lex(text, merge=True)  # symbol runs and line-comment runs joined, every other token the same
        assert _as_tuples(t for t in merged if t.kind not in ("symbol", "comment")) == _as_tuples(
            t for t in exact if t.kind not in ("symbol", "comment")
        ), text
        assert _visible_in(merged, "symbol") == _visible_in(exact, "symbol"), text
        assert _visible_in(merged, "comment") == _visible_in(exact, "comment"), text
        assert _visible_in(comments(text), "comment") == _visible_in(exact, "comment"), text
        assert scan_forbidden(text) == reference_lean.scan_forbidden(text), text
        assert name_parts(text) == reference_lean.name_parts(text), text
        at = rng.randrange(len(text) + 1)
        assert block_comment_end(text, at) == reference_lean.block_comment_end(text, at), (text, at)
        assert plain_string_end(text, at) == reference_lean.plain_string_end(text, at), (text, at)


# Commands: helpers, options, prefixes, trailing commands, columns, tactic/term positions.
COMMAND_PIECES = [
    "lemma h : 1 = 1 := by\n",
    "theorem k (n : ℕ) : n = n := by",
    "\n  rfl\n",
    "set_option maxRecDepth 100",
    "set_option pp.all true in\n",
    "open Real in\n",
    "open Nat\n",
    "import Mathlib\n",
    "\n#print axioms ",
    "mathd_numbertheory_188",
    "amc12a_2008_p8",
    "\n",
    "\n ",
    "\n   ",
    "\n    ",
    "where\n",
    "exact ",
    "foo ",
    "(x := ",
    "(config := ",
    "<;> ",
    "=> ",
    "|> ",
    " | ",
    "; ",
    "· ",
    "by ",
    "all_goals ",
    "[",
    "]",
    "(",
    ")",
    "⟨",
    "⟩",
    "{",
    "}",
    ":= ",
    "dbg",
    "1",
    's!"{',
    '"',
    "@[",
    "def ",
    "Nat.gcd ",
    "sorry",
    "-- c\n",
    "/-",
    "-/",
    # the preamble's forms: definitions, tags, scopes, binder options, aesop rules and what they may name
    "abbrev ",
    "noncomputable ",
    "namespace X\n",
    "section",
    "end",
    " X\n",
    "simp",
    "local ",
    ", ",
    "reducible]",
    "@[simp] ",
    "@[local simp, reducible] ",
    "set_option autoImplicit false\n",
    "add_aesop_rules ",
    "unsafe ",
    "tactic ",
    "(add ",
    "let rec ",
    "def evil := 1\n",
    "evil ",
    ".",
    "def true := 1\n",
    "(config := {decide := Bool.true})",
    "._root_",
]


NAMES = frozenset({"theorem", "mathd_numbertheory_188", "Nat.gcd", "gcd", "by"})  # statement_names(GCD), by hand


def test_statement_names_are_its_identifiers_with_their_dotted_suffixes():
    assert statement_names(GCD) == NAMES
    binders = {"x", "y", "ℝ", "h₀", "h₁", "h₂"}
    assert statement_names(CUBE) == {"theorem", "amc12a_2008_p8", *binders, "Real.sqrt", "sqrt", "by"}


def _outcome(result: Kept | Refusal) -> tuple:
    """A scan's result as reference_lean gives it."""
    if isinstance(result, Refusal):
        return ("refused", result.reason, result.where)
    kept = (result.commands, result.options, result.scoped, result.helpers, result.body_end, result.body_tokens)
    declared = sorted(result.declared.definitions), sorted(result.declared.helpers)
    return ("kept", *kept, result.rules, result.closing, result.namespaces, *declared)


def test_commands_agree_with_the_per_character_reading_on_random_commands():
    """The text before a statement and a proof body with what follows it, cut into commands: what each keeps
    (texts, options, where the body ends: the rest is dropped) and the first refusal with its wording, as the
    plain reading says."""
    rng = random.Random(29)
    for _ in range(3_000):
        before = _soup(rng, COMMAND_PIECES, 10)
        body = _soup(rng, COMMAND_PIECES + ["  simp", "\n  ", "norm_num"], 18)
        assert _outcome(scan_before(before, NAMES)) == reference_lean.scan_before(before, NAMES), before
        for term in (False, True):
            expected = reference_lean.scan_body(body, NAMES, term=term)
            assert _outcome(scan_body(body, NAMES, term=term)) == expected, (body, term)
        # after a preamble that declared the definition `evil`
        preamble = Kept(declared=Declared({"evil"}))
        expected = reference_lean.scan_body(body, NAMES, definitions=frozenset({"evil"}))
        assert _outcome(scan_body(body, NAMES, before=preamble)) == expected, body
        assert scan_forbidden(before + body) == reference_lean.scan_forbidden(before + body), before + body


# Restatements of GCD that the statement rule calls equal (whitespace runs, comments, the spacing of `:=`,
# `lemma` for `theorem`), each ending in its `by`; and text before them that leaves nothing open.
RESTATED = [
    GCD.removesuffix("\n"),
    GCD.removesuffix("\n").replace(" ", "  /- c -/ "),
    GCD.removesuffix("\n").replace(" := by", ":=by"),
    GCD.removesuffix("\n").replace(" : ", "\n    : ").replace(" := by", " :=\n  by"),
    GCD.removesuffix("\n").replace(" ", "\t"),
    GCD.removesuffix("\n").replace("theorem", "lemma"),
    "theorem mathd_numbertheory_188 : -- the gcd\n  Nat.gcd 180 168 = 12 := by",
]
CLOSED_BEFORE = [
    "import Mathlib\n",
    "open Real\n",
    "set_option maxRecDepth 100\n",
    "-- sorry\n",
    "/- a /- nested -/ comment -/\n",
    "lemma h : 1 = 1 := rfl\n",
    "Here is the proof.\n",
    "\n",
]


def test_restatements_give_the_same_body_and_the_same_command_on_random_attempts():
    """Whatever follows the statement's line is the body, unchanged, however the statement is restated and
    whether or not the code is fenced; and the verdict or command does not depend on the restatement (its
    statement is the canonical one)."""
    rng = random.Random(16)
    for _ in range(1_000):
        before = _soup(rng, CLOSED_BEFORE, 4)
        body = _soup(rng, LEAN_PIECES + ["  simp", "\n  ", "norm_num"], 16)
        canonical = prepare(before + GCD + body, GCD)
        assert isinstance(canonical, Judgement) or GCD in canonical, body
        for statement in RESTATED:
            text = before + statement + "\n" + body
            assert extract_proof_body(text, GCD) == body, text
            assert prepare(text, GCD) == canonical, text
            assert extract_proof_body(f"```lean4\n{text}\n```", GCD) == body + "\n", text  # the fence's newline


def test_a_theorem_inside_a_namespace_gives_one_command_however_restated_on_random_attempts():
    """A theorem written inside a namespace: where the audit runs, the command does not depend on the
    restatement and opens the namespace on the theorem; where it does not, every attempt that would have gone
    to Lean is refused for the namespace."""
    rng = random.Random(38)
    open_at = (
        "before the statement: forbidden: namespace N open at the statement (close it with `end N` first: only "
        "the audit, off here, would catch how `open N` changes the statement's reading)"
    )
    for _ in range(300):
        before = "namespace N\n" + _soup(rng, CLOSED_BEFORE, 3)
        body = _soup(rng, LEAN_PIECES + ["  simp", "\n  ", "norm_num"], 16)
        canonical = prepare(before + GCD + body, GCD, open_namespaces=True)
        assert isinstance(canonical, Judgement) or "open N in\n" in canonical.split(GCD)[0], canonical
        for statement in RESTATED:
            text = before + statement + "\n" + body
            assert prepare(text, GCD, open_namespaces=True) == canonical, text
            if isinstance(canonical, str):
                assert prepare(text, GCD) == refused(open_at), text


NO_THEOREM = "no theorem `mathd_numbertheory_188`: the attempt declares "


def refused(detail: str) -> Judgement:
    return Judgement("rejected", "integrity", detail)


S = GCD.removesuffix("\n")  # the statement's line, to its `by`
TERM_S = S.removesuffix(" by")  # to its `:=`
LEFT_OF = "left of the proof's column {}: Lean ends the proof there and reads a command, which this is not"

# (model text, extract_proof_body's answer, prepare's answer), worked out by hand.
ATTEMPTS = {
    "a fenced block": (f"```lean4\n{GCD}  simp\n```", "  simp\n", f"{GCD}  simp\n"),
    "a fence never closed: the rest": (f"Proof:\n```lean4\n{GCD}  simp", "  simp", f"{GCD}  simp"),
    "the Lean block after a Python one": (
        f"```python\nprint(1)\n```\n```lean4\n{GCD}  simp\n```",
        "  simp\n",
        f"{GCD}  simp\n",
    ),
    "an untagged block": (f"```\n{GCD}  simp\n```", "  simp\n", f"{GCD}  simp\n"),
    "a Python block only: the whole text, fence and all": (
        f"```python\n{GCD}  simp\n```",
        "  simp\n```",
        refused("after the proof: forbidden: ``` at line 2, " + LEFT_OF.format(2)),
    ),
    "a first tactic on the `by` line keeps its column": (
        f"{S} simp\n",
        " " * len(S + " ") + "simp\n",
        GCD + " " * len(S + " ") + "simp\n",
    ),
    "a line left of that column ends the proof": (
        f"{S} simp\n  rfl\n",
        " " * len(S + " ") + "simp\n  rfl\n",
        refused(f"after the proof: forbidden: `rfl` at line 2, {LEFT_OF.format(len(S + ' '))}"),
    ),
    "`byx` is a word: a term-mode proof": (
        f"{S}x\n",
        TermBody(" " * len(TERM_S + " ") + "byx\n"),
        f"{TERM_S}\n" + " " * len(TERM_S + " ") + "byx\n",
    ),
    "`by.x` is a name: a term-mode proof": (
        f"{S}.x\n",
        TermBody(" " * len(TERM_S + " ") + "by.x\n"),
        f"{TERM_S}\n" + " " * len(TERM_S + " ") + "by.x\n",
    ),
    "a term on the next line": (f"{TERM_S}\n  rfl\n", TermBody("  rfl\n"), f"{TERM_S}\n  rfl\n"),
    "`by` on the next line": (f"{TERM_S}\n  by\n  simp\n", "  simp\n", f"{GCD}  simp\n"),
    "Windows line ends: the body keeps its own": (
        GCD.replace("\n", "\r\n") + "  simp\r\n",
        "  simp\r\n",
        f"{GCD}  simp\r\n",
    ),
    "a statement in a line comment: a bare body, comment and all": (
        f"-- {S}\n  simp\n",
        f"-- {S}\n  simp\n",
        f"{GCD}-- {S}\n  simp\n",
    ),
    "a statement in a comment never closed: no code at all": (
        f"/- {GCD}  simp\n",
        f"/- {GCD}  simp\n",
        Judgement("rejected", "lean_error", "empty proof: the attempt holds no Lean code"),
    ),
    "a statement glued to a word is none: a bare body, indented": (
        f"x{GCD}  simp\n",
        f"  x{GCD}    simp\n",
        f"{GCD}  x{GCD}    simp\n",
    ),
    "prose that says `theorem` before the statement declares a theorem": (
        f"The theorem holds.\n{GCD}  simp\n",
        "  simp\n",
        refused("helper `holds`: forbidden: a declaration without a proof"),
    ),
    "another theorem only": (
        "theorem other : True := by\n  trivial\n",
        IntegrityError(f"{NO_THEOREM}`other` (line 1) instead"),
        Judgement("rejected", "statement_mismatch", f"{NO_THEOREM}`other` (line 1) instead"),
    ),
    "the statement alone": (
        GCD,
        "",
        Judgement("rejected", "lean_error", "empty proof: the attempt holds no Lean code"),
    ),
    "a helper that leaves a string open before the statement": (
        f'lemma h : True := by\n  exact "\n{GCD}  simp\n',
        "  simp\n",
        refused("before the statement: a comment, string or interpolation left open"),
    ),
}


@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_attempts_by_hand(name):
    text, body, prepared = ATTEMPTS[name]
    assert extract_proof_body(text, GCD) == body
    assert prepare(text, GCD) == prepared


MB = 1_000_000


def _adversarial(size: int) -> dict[str, tuple[str, str | Judgement]]:
    """name -> (model text of about `size` characters, what `prepare(text, GCD)` returns), worked out by hand."""
    k = size // 2
    empty = Judgement("rejected", "lean_error", "empty proof: the attempt holds no Lean code")
    return {
        "parentheses": (GCD + "  " + "(" * size, GCD + "  " + "(" * size),
        "parentheses alone": ("(" * size, GCD + "  " + "(" * size),  # a bare body from column 0, indented
        "nested comments never closed": (GCD + "  simp /-" + "/-" * k, GCD + "  simp /-" + "/-" * k),
        "only a comment never closed": ("/-" * k, empty),
        "string never closed": (GCD + '  exact "' + "a" * size, GCD + '  exact "' + "a" * size),
        "interpolation never closed": (
            GCD + '  exact s!"{sorry' + " " * size,
            Judgement("rejected", "sorry", "forbidden: sorry"),
        ),
        "line comments": (GCD + "  simp\n" + "-- sorry\n" * (size // 9), GCD + "  simp\n" + "-- sorry\n" * (size // 9)),
        "long identifier": (GCD + "  exact " + "a" * size, GCD + "  exact " + "a" * size),
        "long identifier ending in sorryAx": (
            GCD + "  exact " + "a." * k + "sorryAx",
            Judgement("rejected", "sorry", "forbidden: sorryAx"),
        ),
        "whitespace then a tactic": (GCD + " \n" * k + "  simp", GCD + " \n" * k + "  simp"),
        "only whitespace": (" \n\t" * (size // 3), empty),
        "many theorem keywords": (
            "theorem " * (size // 8),
            Judgement("rejected", "statement_mismatch", f"{NO_THEOREM}`theorem` (line 1) instead"),
        ),
        "theorem keywords after a proof": (  # the proof ends at the first: the rest is dropped unread
            GCD + "  simp\n" + "theorem " * (size // 8),
            GCD + "  simp\n",
        ),
        "a proof then megabytes of lemmas": (  # dropped, never scanned past the first
            GCD + "  simp\n" + "lemma l : True := by\n  (x := sorry)\n" * (size // 36),
            GCD + "  simp\n",
        ),
        "fence opened and never closed, repeated": ("```lean4\nx" * (size // 10), GCD + "  x"),
        "statements restated": ((GCD + "  x\n") * (size // 64), REDECLARED),  # the last one counts: the others
    }  # are helpers of the theorem's own name


REDECLARED = Judgement(
    "rejected",
    "integrity",
    "helper `mathd_numbertheory_188`: forbidden: redeclares `mathd_numbertheory_188`, a name the statement uses",
)


@pytest.mark.parametrize("name", list(_adversarial(100)))
def test_adversarial_attempts_are_prepared_in_linear_time(name):
    """1 MB and 10 MB adversarial attempts get the result worked out by hand; the 10 MB one costs less than 20
    times the 1 MB one (linear is 10, quadratic 100) and under 5 s."""
    seconds = {}
    for size in (MB, 10 * MB):
        text, expected = _adversarial(size)[name]
        started = time.perf_counter()
        result = prepare(text, GCD, max_chars=None)  # the scan itself; the length cap is tested below
        seconds[size] = time.perf_counter() - started
        assert result == expected
    assert seconds[10 * MB] < 5.0, seconds
    assert seconds[10 * MB] < 20 * max(seconds[MB], 0.1), seconds  # a floor: tiny times are all noise


def _rule_adversarial(size: int) -> dict[str, tuple[str, str | Judgement]]:
    """name -> (model text of about `size` characters aimed at the configuration, attribute, `eval%` or
    term-mode rules, what `prepare(text, GCD)` returns), worked out by hand."""
    statement = GCD.removesuffix(" by\n")
    config = Judgement("rejected", "integrity", "forbidden: config term (config := ...)")
    literal = GCD + "  simp (config := {" + " a := 1," * (size // 8) + " })"
    many = GCD + "  simp" + " (maxSteps := 1)" * (size // 16)
    names = GCD + "  simp [" + "eval, " * (size // 6) + "h]"
    return {
        "config value of literals": (literal, literal),
        "config value ending in a term": (literal[:-3] + " b := f })", config),
        "config items": (many, many),
        "config value of open brackets": (
            GCD + "  simp (config := " + "[" * size,
            GCD + "  simp (config := " + "[" * size,
        ),
        "named arguments opened": (GCD + "  exact " + "(x " * (size // 3), GCD + "  exact " + "(x " * (size // 3)),
        "attribute after comments": (
            GCD + "  simp\n" + "-- @[simp]\n" * (size // 11) + "where\n  @[simp] f : 1 = 1 := rfl",
            Judgement("rejected", "integrity", "forbidden: attribute @[simp"),
        ),
        "eval without %": (names, names),
        "eval% at the end": (names + " <;> exact eval% 1", Judgement("rejected", "integrity", "forbidden: eval%")),
        "many lemma keywords": (
            "lemma " * (size // 6),
            Judgement("rejected", "statement_mismatch", f"{NO_THEOREM}`lemma` (line 1) instead"),
        ),
        "long term": (
            statement + " h" + " ▸ h" * (size // 4),
            statement + "\n" + " " * (len(statement) + 1) + "h" + " ▸ h" * (size // 4),
        ),
        "term statements restated": ((statement + " x\n") * (size // 64), REDECLARED),
    }


@pytest.mark.parametrize("name", list(_rule_adversarial(100)))
def test_the_configuration_attribute_and_term_rules_stay_linear(name):
    """An attempt at the length cap aimed at each of these rules gets the result worked out by hand, and 4 times the
    text costs less than 8 times the time (a linear scan: 4; a quadratic one: 16). Measured at the cap: 0.7 s
    at most on an AVX-512 EPYC, 2.3 s on a loaded AVX2 one, where an absolute 2 s bound failed CI. The suite's
    own heap is frozen out of the garbage collector meanwhile: with the models of earlier tests in it, each
    full collection the scan's allocations set off walked gigabytes, and 4 times the text took 9 times the
    time (a verifier worker's heap is small)."""

    def timed(size: int) -> float:
        text, expected = _rule_adversarial(size)[name]
        started = time.perf_counter()
        result = prepare(text, GCD, max_chars=None)  # some texts run a little past the cap: the scan is timed
        elapsed = time.perf_counter() - started
        assert result == expected
        return elapsed

    gc.collect()
    gc.freeze()
    try:
        quarter, whole = timed(MAX_PROOF_CHARS // 4), timed(MAX_PROOF_CHARS)
    finally:
        gc.unfreeze()
    assert whole < 8 * max(quarter, 0.05), (quarter, whole)


def test_attempts_past_the_cap_are_refused_before_any_scanning():
    """Dense short tokens cost the scan a few microseconds of Python each (10 MB of `"{}` took over a minute
    on the worker's event loop): attempts past MAX_PROOF_CHARS are refused first, and the densest text under
    the cap still scans within seconds."""
    dense = GCD + '  exact "' + "{}" * (10 * MB // 2)
    started = time.perf_counter()
    judged = prepare(dense, GCD)
    assert time.perf_counter() - started < 1.0
    refusal = f"attempt of {len(dense)} characters exceeds {MAX_PROOF_CHARS}"
    assert judged == Judgement("rejected", "lean_error", refusal)
    just_under = GCD + '  exact "' + "{}" * ((MAX_PROOF_CHARS - len(GCD) - 9) // 2)
    assert len(just_under) <= MAX_PROOF_CHARS
    started = time.perf_counter()
    assert isinstance(prepare(just_under, GCD), str)  # scanned and sent, as any attempt under the cap
    assert time.perf_counter() - started < 10.0  # ~1 s idle on 2 cores; generous for a loaded machine
