"""A model's text cut into commands as Lean's parser cuts it (verifier_pool.lean_commands), helper
declarations, trailing `#print axioms`, configuration told from named arguments by position
(verifier_pool.lean_scan). Every expectation is worked out by hand from the text; the real proofs are the
attributed sample in tests/fixtures/prover_proofs (README there). No Lean runs here: what Lean does with the
assembled command is tests/verifier_pool/test_lean_audit.py's fixtures' and, for real, the first Lean box's."""

from __future__ import annotations

from pathlib import Path

import pytest

from verifier_pool.lean_check import MAX_PROOF_CHARS, Judgement, judge_axioms, judge_command, prepare, scan_forbidden

GCD = "theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 12 := by\n"
NAME = "mathd_numbertheory_188"
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"
SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "prover_proofs"


def refused(detail: str, reason: str = "integrity") -> Judgement:
    return Judgement("rejected", reason, detail)


# --- item 1: helper declarations before the statement --------------------------------------------------------


def test_helpers_go_to_lean_before_the_statement_with_the_models_opens_in_a_section_of_their_own():
    model = (
        "Here is the proof.\n```lean4\nimport Mathlib\nopen Real\n\n/-- doubling -/\n"
        "lemma two (x : ℕ) : x + x = 2 * x := by\n  ring\n\ntheorem two' : True := trivial\n\n"
        f"{GCD}  norm_num [two]\n```"
    )
    # imports dropped (the trusted header replaces them), comments between commands dropped, `open` kept for
    # the helpers only: `end` closes it before the canonical statement
    assert prepare(model, GCD) == (
        "section\nopen Real\nlemma two (x : ℕ) : x + x = 2 * x := by\n  ring\ntheorem two' : True := trivial\n"
        f"end\n{GCD}  norm_num [two]\n"
    )


def test_helpers_without_opens_or_options_need_no_section():
    model = f"lemma two (x : ℕ) : x + x = 2 * x := by ring\n{GCD}  norm_num [two]\n"
    assert prepare(model, GCD) == f"lemma two (x : ℕ) : x + x = 2 * x := by ring\n{GCD}  norm_num [two]\n"


def test_opens_and_options_without_a_helper_go_nowhere_but_the_options_to_the_theorem():
    model = f"open Real\nset_option maxRecDepth 10000\n{GCD}  norm_num\n"
    assert prepare(model, GCD) == f"set_option maxRecDepth 10000 in\n{GCD}  norm_num\n"


def test_harmless_options_apply_to_the_helpers_and_the_theorem_unless_the_header_sets_them_already():
    model = (
        f"{HEADER}set_option tactic.hygienic false\nset_option maxRecDepth 1000\n"
        f"lemma h (n : ℕ) : n = n := by\n  rfl\n{GCD}  norm_num\n"
    )
    section = (
        "section\nset_option maxHeartbeats 0\nopen BigOperators Real Nat Topology Rat\n"
        "set_option tactic.hygienic false\nset_option maxRecDepth 1000\nlemma h (n : ℕ) : n = n := by\n  rfl\nend\n"
    )
    on_theorem = "set_option tactic.hygienic false in\nset_option maxRecDepth 1000 in\n"
    assert prepare(model, GCD, header=HEADER) == f"{section}{on_theorem}{GCD}  norm_num\n"
    assert prepare(model, GCD) == f"{section}set_option maxHeartbeats 0 in\n{on_theorem}{GCD}  norm_num\n"


def test_a_prefix_of_the_statement_sets_its_option_and_opens_nothing():
    assert prepare(f"set_option maxHeartbeats 400000 in\n{GCD}  norm_num\n", GCD) == (
        f"set_option maxHeartbeats 400000 in\n{GCD}  norm_num\n"
    )
    assert prepare(f"open Nat in\n{GCD}  norm_num\n", GCD) == f"{GCD}  norm_num\n"  # the trusted statement's reading
    # binder options never reach the statement: it reads as the header has it
    assert prepare(f"set_option autoImplicit true in\n{GCD}  norm_num\n", GCD) == f"{GCD}  norm_num\n"
    assert prepare(f"set_option allowUnsafeReducibility true in\n{GCD}  norm_num\n", GCD) == refused(
        "before the statement: forbidden: set_option allowUnsafeReducibility (options allowed outside a proof: "
        "autoImplicit, exponentiation.threshold, maxHeartbeats, maxRecDepth, relaxedAutoImplicit, "
        "synthInstance.maxHeartbeats, synthInstance.maxSize, tactic.hygienic, linter.*, pp.*)"
    )


def test_prefixed_helpers_keep_their_prefixes():
    model = f"open Finset in\ntheorem h (n : ℕ) : n ∈ range (n + 1) := by simp\n{GCD}  norm_num\n"
    assert prepare(model, GCD) == f"open Finset in\ntheorem h (n : ℕ) : n ∈ range (n + 1) := by simp\n{GCD}  norm_num\n"


S = "before the statement: forbidden: "
H = "helper `h`: forbidden: "
SHADOWS = "a name the statement uses"
# Each exploit class, tried from before the statement and from inside a helper lemma.
EXPLOITS_BEFORE = [
    ("axiom cheat : False\n", f"{S}axiom"),
    ("lemma h : False := by\n  exact cheat\naxiom cheat : False\n", f"{S}axiom"),  # its own command, for Lean too
    ("lemma h : False := by\n  exact cheat\n  axiom cheat : False\n", f"{H}axiom"),
    ("lemma h : 1 = 1 := by\n  sorry\n", f"{H}sorry"),
    ("lemma h : False := sorryAx _ false\n", f"{H}sorryAx"),
    ("lemma h : 1 = 1 := by\n  admit\n", f"{H}admit"),
    ("lemma h : 1 = 1 := by\n  native_decide\n", f"{H}native_decide"),
    # shadowing a name the statement uses: at its root, in a namespace the header opens, itself
    ("lemma Nat.gcd (a : ℕ) : a = a := rfl\n", f"helper `Nat.gcd`: forbidden: redeclares `Nat.gcd`, {SHADOWS}"),
    ("lemma _root_.gcd (a : ℕ) : a = a := rfl\n", f"helper `_root_.gcd`: forbidden: redeclares `gcd`, {SHADOWS}"),
    ("lemma Foo.gcd (a : ℕ) : a = a := rfl\n", f"helper `Foo.gcd`: forbidden: redeclares `gcd`, {SHADOWS}"),
    (f"theorem {NAME} : True := trivial\n", f"helper `{NAME}`: forbidden: redeclares `{NAME}`, {SHADOWS}"),
    # notation, syntax, instances
    ('notation "gcd" => Nat.lcm\n', f"{S}notation"),
    ('lemma h : 1 = 1 := rfl\nlocal notation "gcd" => Nat.lcm\n', f"{S}local (a new command)"),
    ('macro "norm_num" : tactic => `(tactic| sorry)\n', f"{S}macro"),
    ('syntax "cheat" : tactic\n', f"{S}syntax"),
    ("instance : Decidable True := isTrue trivial\n", f"{S}instance (a new command)"),
    ("open Nat in\ninstance : Decidable True := isTrue trivial\n", f"{S}instance (a new command)"),
    ("attribute [instance] Classical.propDecidable\n", f"{S}attribute (a new command)"),
    ("@[instance] lemma h : 1 = 1 := rfl\n", f"{S}attribute @[instance"),
    ("@[simp, instance] lemma h : 1 = 1 := rfl\n", f"{S}attribute @[instance"),
    ("@[simp ←] lemma h : 1 = 1 := rfl\n", f"{S}attribute @[simp ←"),
    ("lemma h : 1 = 1 := by\n  exact trivial\nwhere\n  @[simp] f : 1 = 1 := rfl\n", f"{H}attribute @[simp"),
    # options
    ("set_option debug.skipKernelTC true\n", f"{S}set_option debug.skipKernelTC"),
    ("lemma h : 1 = 1 := by\n  set_option debug.skipKernelTC true in\n  rfl\n", f"{H}set_option debug.skipKernelTC"),
    ("set_option warn.sorry false in\nlemma h : 1 = 1 := by\n  rfl\n", f"{S}set_option warn.sorry"),
    ("set_option maxHeartbeats x\n", f"{S}set_option maxHeartbeats x (a number, true or false)"),
    # code run at elaboration time
    ("lemma h : 1 = 1 := by\n  run_tac Lean.Elab.Tactic.evalTactic (← `(tactic| rfl))\n", f"{H}run_tac"),
    ("lemma h : True := by_elab pure (Lean.mkConst ``trivial)\n", f"{H}by_elab"),
    ("lemma h : 1 = 1 := by\n  simp (config := { maxSteps := dbgTraceVal 1 })\n", f"{H}config term (config := ...)"),
    ("lemma h : True := by\n  trivial\n#eval 1\n", f"{S}#eval"),
    (f"#print axioms {NAME}\n", f"{S}#print"),
    # declarations other than lemma/theorem/def/abbrev, scopes left open, modifiers
    (
        "namespace Nat\n",
        f"{S}namespace Nat open at the statement (close it with `end Nat` first: only the audit, off here, "
        "would catch how `open Nat` changes the statement's reading)",
    ),
    ("private lemma h : 1 = 1 := rfl\n", f"{S}private (a new command)"),
    ("structure P where\n  x : ℕ\n", f"{S}structure (a new command)"),
    ("lemma h : 1 = 1\n", f"{H}a declaration without a proof"),
    # a literal left open would read on into the canonical statement
    (
        'lemma h : "a" = "a" := by\n  exact s!"{rfl\n',
        "before the statement: a comment, string or interpolation left open",
    ),
]


@pytest.mark.parametrize(("before", "detail"), EXPLOITS_BEFORE, ids=[d for _, d in EXPLOITS_BEFORE])
def test_each_exploit_class_before_the_statement_or_in_a_helper_is_refused_naming_it(before, detail):
    holes = ("sorry", "sorryAx", "admit")
    reason = "sorry" if detail.removeprefix(H).removeprefix(S) in holes else "integrity"
    assert prepare(f"{before}{GCD}  norm_num\n", GCD) == refused(detail, reason)


def test_helpers_count_against_the_length_cap():
    helper = "lemma h (n : ℕ) : n = n := by\n  rfl" + "\n  -- why" * (MAX_PROOF_CHARS // 9) + "\n"
    model = f"{helper}{GCD}  norm_num\n"
    assert prepare(model, GCD) == Judgement(
        "rejected", "lean_error", f"attempt of {len(model)} characters exceeds {MAX_PROOF_CHARS}"
    )


# --- the published provers' own proofs (tests/fixtures/prover_proofs) ----------------------------------------


def sample(path: str) -> tuple[str, str]:
    """(the file, its own statement of its theorem: from `theorem NAME` to `:= by`, as the dataset writes it)."""
    text = (SAMPLES / path).read_text()
    start = text.index(f"theorem {Path(path).stem}")
    return text, text[start : text.index(":= by", start) + len(":= by")] + "\n"


def test_seed_provers_options_and_print_axioms():
    text, statement = sample("seed-prover/mathd_numbertheory_780.lean")
    body = text[text.index(":= by\n") + len(":= by\n") : text.index("\n\n#print")]
    assert prepare(text, statement) == (
        "set_option maxHeartbeats 0 in\nset_option maxRecDepth 100000 in\nset_option tactic.hygienic false in\n"
        f"{statement}{body}\n"
    )


@pytest.mark.parametrize(
    ("path", "helpers", "options"),
    [
        (
            "seed-prover/aime_1991_p6.lean",
            ["round3_sum_val_at_7_43", "round3_sum_val_at_7_44", "round4_r_lt_7_44", "round4_r_ge_7_43"],
            ["maxHeartbeats 0", "maxRecDepth 1000", "tactic.hygienic false"],
        ),
        (
            "seed-prover/mathd_algebra_282.lean",
            ["round1_h22", "round1_h23", "round1_h24"],
            [
                "pp.numericTypes true",
                "pp.funBinderTypes true",
                "maxHeartbeats 0",
                "maxRecDepth 1000",
                "tactic.hygienic false",
            ],
        ),
        (
            "seed-prover/amc12a_2020_p25.lean",
            [
                "round1_case_a_eq_zero_contradiction",
                "round3_a_ne_zero",
                "round1_ha_pos_badccc04",
                "round1_ha_lt_1_4_badccdb2",
                "round1_h_main_badcd226",
                "round3_N_exists",
                "round4_image_is_injective",
                "round4_sum_expression",
                "round4_N_ge_28",
                "round4_N_le_28",
                "round4_sum_S_is_sum_formula",
                "round1_h7_ce987acc",
                "round4_S_equiv_Icc",
                "round5_k_value",
                "round5_a_real_value",
                "round5_a_eq_of_a_real_eq",
                "round5_final_calculation",
            ],
            ["maxHeartbeats 0", "maxRecDepth 1000", "tactic.hygienic false"],
        ),
        ("kimina-prover-72b/numbertheory_fxeq4powxp6powxp9powx_f2powmdvdf2pown.lean", ["lemma_1"], ["maxHeartbeats 0"]),
    ],
)
def test_published_proofs_with_helpers_go_to_lean_whole(path, helpers, options):
    """Each helper the file declares (read off the file), in its order, in a section with the file's opens and
    options; the options set on the theorem too; the theorem's own body; no `#print axioms`."""
    text, statement = sample(path)
    command = prepare(text, statement)
    assert isinstance(command, str), command
    lines = command.splitlines()
    declared = [line.split()[1] for line in lines if line.startswith(("lemma ", "theorem "))]
    assert declared == [*helpers, Path(path).stem]
    assert lines[0] == "section" and lines.count("end") == 1
    assert [line for line in lines if line.startswith("set_option") and line.endswith(" in")] == [
        f"set_option {o} in" for o in options
    ]
    assert "#print" not in command
    body = text[text.index(statement) + len(statement) :]  # the whole rest, or up to a dropped `#print axioms`
    assert command.endswith(statement + (body.split("#print")[0].rstrip() + "\n" if "#print" in body else body))


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("kimina-prover-preview/mathd_numbertheory_12.lean", "forbidden: native_decide"),
        ("kimina-prover-72b/amc12_2001_p5.lean", "helper `lemma_1`: forbidden: native_decide"),
    ],
)
def test_published_proofs_that_use_native_decide_are_refused_by_policy(path, detail):
    text, statement = sample(path)
    assert prepare(text, statement) == refused(detail)


# --- item 2: what follows the proof --------------------------------------------------------------------------
# Lean's parser ends the proof at a command; Lean elaborates the theorem before it, and the verifier asks
# `#print axioms` and runs the audit as commands of its own. So the command and everything after it are dropped
# unread: never sent to Lean, whatever they hold (issue 38: FYDY's Putnam lemmas go on with `structure`,
# `noncomputable def` and `section`). Each expected command below is the theorem and its proof, nothing more.

AFTER_THE_PROOF = [
    # the target's own `#print axioms`, as provers end their files
    f"\n#print axioms {NAME}\n",
    f"\n  #print axioms {NAME}",
    f"\n#print axioms _root_.{NAME}\n",
    f"\n#print axioms {NAME}\n#print axioms {NAME}\n",
    f"\n\n-- check\n#print axioms {NAME} -- the axioms\n",
    # any `#` command: once sent, `#exit` truncated the run and `#print` could fake an axioms line
    "\n#print axioms Nat.gcd_comm\n",
    f"\n#print axioms {NAME}\n  norm_num\n",
    f"\n#print {NAME}\n",
    "\n#eval 1\n",
    "\n#exit\n",
    f"\n#print axioms {NAME}\n#check {NAME}\n",
    # declarations, helper or not, and whatever their proofs hold
    "\ntheorem extra : True := trivial\n",
    "\n lemma extra (n : ℕ) : n = n := by\n   rfl\n",
    "\n  theorem extra : True := trivial\n",  # a command word ends the proof at any column
    "\ntheorem extra : True := by\n  sorry\n",
    f"\ntheorem {NAME}' : True := by\n  native_decide\n",
    f"\ntheorem Foo.{NAME} : True := trivial\nopen Foo\n",  # a shadow of the statement's name, never sent
    "\ndef cheat : ℕ := 1\n",
    "\ninstance : Decidable True := isTrue trivial\n",
    "\nstructure PutnamSeq where\n  m : ℕ → ℕ\n",
    "\nnoncomputable def oddPart (n : ℕ) : ℕ := n\nsection\nend\n",
    "\n@[csimp] theorem fake : @Nat.add = @Nat.mul := by\n  sorry\n",
    "\nend\nend\n",
    "\nadd_aesop_rules safe h\n",
    "\n open Nat\n",  # one column left of the proof's: `open` is a command there
    "\nset_option maxHeartbeats 0\n",
]


@pytest.mark.parametrize("after", AFTER_THE_PROOF)
def test_every_command_after_the_proof_is_dropped_unread(after):
    assert prepare(f"{GCD}  norm_num{after}", GCD) == f"{GCD}  norm_num\n"
    assert scan_forbidden(f"  norm_num{after}") is None


def test_options_inside_the_proof_keep_working():
    body = "  set_option maxHeartbeats 400000 in\n  norm_num\n  set_option maxRecDepth 10000 in\n  decide\n"
    assert prepare(GCD + body, GCD) == GCD + body


# --- item 3: configuration by position, named arguments --------------------------------------------------------

NAMED = [
    "  nlinarith [mul_pos (a := x) (b := y) hx hy]\n",
    "  rw [Nat.div_add_mod (m := n) (k := 2)]\n",
    "  exact imo_lemma (hp1 := h512)\n",
    "  refine Eq.trans (b := b) ?_ ?_\n",
    # Seed-Prover's (tests/fixtures/prover_proofs/seed-prover/amc12a_2020_p25.lean, and its imo_1990_p3.lean)
    "  apply Set.infinite_of_injective_forall_mem (f := fun n : ℕ => (n : ℝ))\n",
    "  exact padicValNat.pow_add_pow (hp1 := h512) (hxy := h513) (hx := h514) (hn := h515)\n",
    "  have h := foo (x := y + 1)\n  exact h\n",
    "  exact foo (by simp) (x := bar)\n",  # the `by` block ends with its parenthesis
    "  exact foo\n    |>.trans (bar (x := baz))\n",
    "  obtain ⟨x, hx⟩ := foo (n := m * 2)\n  exact hx\n",
    "  calc a = b := foo (x := c)\n    _ = d := by simp\n",
    "  simpa using foo (h := bar)\n",
    # a line that goes on after `:=`, `:` or `←`, where Lean must read a term (Delta Prover's amc12a_2009_p6 and
    # amc12a_2021_p19: `have h : T :=` and the term on the next line, opening with a named argument's bracket)
    "  have h : a = b :=\n    (foo h0 (n := 2) (z := m * n)).symm\n  exact h\n",
    "  have h : a = b :=\n    -- a comment between\n\n    (foo (x := c * 4) (y := y)).mp h1\n  exact h\n",
    "  obtain ⟨x, hx⟩ :\n    (∃ x, foo (n := m) x) := bar\n  exact hx\n",
    "  rw [←\n    foo (n := m + 1)]\n",
]


@pytest.mark.parametrize("body", NAMED)
def test_named_arguments_in_terms_are_ordinary_code(body):
    assert scan_forbidden(body) is None
    assert prepare(GCD + body, GCD) == GCD + body


@pytest.mark.parametrize(
    "body",
    [
        "  simp (config := { maxSteps := dbgTraceVal 1 })\n",
        "  all_goals simp (config := { maxSteps := dbgTraceVal 1 })\n",
        "  try simp (maxSteps := dbgTraceVal 1)\n",
        "  exact foo <;> simp (maxSteps := dbgTraceVal 1)\n",
        "  exact foo\n  simp (maxSteps := dbgTraceVal 1)\n",
        # a line after a term that is complete starts a tactic: only `:=`, `:` and `←` carry the term over
        "  have h : P := 5\n  simp (maxSteps := dbgTraceVal 1)\n",
        '  have h : P := "s"\n  simp (maxSteps := dbgTraceVal 1)\n',
        "  have h : P := foo\n  simp (maxSteps := dbgTraceVal 1)\n",
        "  have h : P := (foo)\n  simp (maxSteps := dbgTraceVal 1)\n",
        "  have h : P :=\n    foo\n  simp (maxSteps := dbgTraceVal 1)\n",
        "  have h : P :=\n    by simp (maxSteps := dbgTraceVal 1)\n",
        "  exact foo; simp (maxSteps := dbgTraceVal 1)\n",
        "  first | exact foo | simp (maxSteps := dbgTraceVal 1)\n",
        "  exact (by simp (maxSteps := dbgTraceVal 1))\n",
        "  exact foo (x := by simp (maxSteps := dbgTraceVal 1))\n",
        "  have h : P := by simp (maxSteps := dbgTraceVal 1)\n",
        "  exact foo (by\n    exact bar\n    simp (maxSteps := dbgTraceVal 1))\n",
        "  rw [show a = b by simp (maxSteps := dbgTraceVal 1)]\n",
        "  exact if h : p then foo else by simp (maxSteps := dbgTraceVal 1)\n",
        "  exact foo says simp (maxSteps := dbgTraceVal 1)\n",
        "  induction n with\n  | zero => simp (maxSteps := dbgTraceVal 1)\n  | succ n ih => simp\n",
        "  cases h with\n  | inl h => exact h\n  | inr h => simp (maxSteps := dbgTraceVal 1)\n",
        "  exact foo\n  · simp (maxSteps := dbgTraceVal 1)\n",
        "  exact foo <;> [simp (maxSteps := dbgTraceVal 1); rfl]\n",
        "  field_simp (discharger := simp (maxSteps := dbgTraceVal 1))\n",
        "  exact foo (disch := simp (maxSteps := dbgTraceVal 1))\n",
        # brackets deeper than Context.MAX_FRAMES read as a tactic, the strict side
        "  exact " + "(" * 300 + "foo (x := bar)" + ")" * 300 + "\n",
    ],
)
def test_configuration_in_any_tactic_position_still_needs_literals(body):
    found = scan_forbidden(body)
    assert found is not None and found.startswith("forbidden: config term ("), found


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("  exact foo (h := sorry)\n", "sorry"),
        ("  exact foo (h := by native_decide)\n", "native_decide"),
        ('  exact foo (h := (IO.println "x").run ())\n', "IO"),
        ("  exact foo (h := eval% 2 ^ 10)\n", "eval%"),
    ],
)
def test_a_named_arguments_value_is_scanned_like_any_code(body, reason):
    assert scan_forbidden(body) == f"forbidden: {reason}"


# --- item 4: where the proof ends, as Lean sees it --------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # a tactic left of the block's column ends the proof; Lean reads it as a command, and it is none
        (
            "    simp\n  linarith\n",
            "after the proof: forbidden: `linarith` at line 2, left of the proof's column 4: "
            "Lean ends the proof there and reads a command, which this is not",
        ),
        (
            " norm_num\nlinarith\n",
            "after the proof: forbidden: `linarith` at line 2, left of the proof's column 1: "
            "Lean ends the proof there and reads a command, which this is not",
        ),
        # the same inside a run of symbols (lean_text merges `<;>\n (` into one token)
        (
            "  simp <;>\n (norm_num)\n",
            "after the proof: forbidden: `(` at line 2, left of the proof's column 2: Lean "
            "ends the proof there and reads a command, which this is not",
        ),
        # a first tactic on the `by` line sets the column (extract_proof_body keeps it)
        (
            " " * 62 + "norm_num\n  linarith\n",
            "after the proof: forbidden: `linarith` at line 2, left of the proof's "
            "column 62: Lean ends the proof there and reads a command, which this is not",
        ),
    ],
)
def test_a_line_left_of_the_proofs_column_ends_it(body, expected):
    assert prepare(GCD + body, GCD) == refused(expected)


@pytest.mark.parametrize(
    ("after", "detail", "reason"),
    [
        ("sorry\n", "after the proof: forbidden: sorry", "sorry"),
        ("axiom cheat : False\n", "after the proof: forbidden: axiom", "integrity"),
        ('elab "cheat" : tactic => pure ()\n', "after the proof: forbidden: elab", "integrity"),
        ("run_cmd pure ()\n", "after the proof: forbidden: run_cmd", "integrity"),
    ],
)
def test_a_forbidden_word_where_the_proof_ends_is_refused_as_anywhere(after, detail, reason):
    assert prepare(f"{GCD}  norm_num\n{after}", GCD) == refused(detail, reason)


@pytest.mark.parametrize(
    "body",
    [
        "  exact foo (bar\n)\n",  # inside brackets columns do not count (Lean parses them `withoutPosition`)
        "  nlinarith [sq_nonneg (a - b),\nsq_nonneg (a + b)]\n",
        "  exact trivial\nwhere\n  foo : True := by\n    trivial\n",  # `where` goes on with the declaration
        "  exact h\ntermination_by n\n",
        "  norm_num\n  -- done\n",  # comments have no column
    ],
)
def test_what_lean_reads_as_the_same_proof_stays_in_it(body):
    assert prepare(GCD + body, GCD) == GCD + body


# --- library search (Seed-Prover's checked proofs use it) --------------------------------------------------------


@pytest.mark.parametrize("tactic", ["exact?", "apply?", "rw?"])
def test_library_search_goes_to_lean_and_a_goal_it_admits_is_a_sorry(tactic):
    assert prepare(f"{GCD}  {tactic}\n", GCD) == f"{GCD}  {tactic}\n"
    # What Lean answers when `apply?` admits the goal for want of a complete proof: its `sorry`, as any other
    # (the REPL transcript of docs/brief/LEAN_REPL.md; `#print axioms` then lists sorryAx, as does the audit).
    warning = {
        "severity": "warning",
        "pos": {"line": 2, "column": 2},
        "endPos": None,
        "data": "declaration uses 'sorry'",
    }
    assert judge_command({"env": 1, "messages": [warning]}).reason == "sorry"
    assert (
        judge_axioms(
            {
                "env": 2,
                "messages": [
                    {
                        "severity": "info",
                        "pos": {"line": 1, "column": 0},
                        "endPos": None,
                        "data": f"'{NAME}' depends on axioms: [sorryAx]",
                    }
                ],
            },
            NAME,
        ).reason
        == "sorry"
    )


# --- the prover's preamble: definitions, tags, scopes, binder options, aesop rules (issue 38) ------------------


@pytest.mark.parametrize(
    ("before", "after", "command_before"),
    [
        # aesop's `unsafe` is a rule phase; a global rule reaches the theorem's `aesop`, so it goes to Lean alone
        (
            "add_aesop_rules unsafe 50% apply Nat.le_of_lt_succ\n",
            "",
            "add_aesop_rules unsafe 50% apply Nat.le_of_lt_succ\n",
        ),
        # binder options: for the helpers only, never set on the theorem
        (
            "set_option autoImplicit false\nset_option relaxedAutoImplicit false\nlemma h : 1 = 1 := rfl\n",
            "",
            "section\nset_option autoImplicit false\nset_option relaxedAutoImplicit false\n"
            "lemma h : 1 = 1 := rfl\nend\n",
        ),
        (
            "open scoped BigOperators in\nlemma h : ∑ i ∈ Finset.range 1, i = 0 := by simp\n",
            "",
            "open scoped BigOperators in\nlemma h : ∑ i ∈ Finset.range 1, i = 0 := by simp\n",
        ),
        # a section the text leaves open is closed before the statement; its `end` after the proof is dropped
        (
            "noncomputable section\nopen Real\n\nnoncomputable def f (x : ℝ) : ℝ := Real.sqrt x\n",
            "\nend\n",
            # in a section of its own too, for the `open`
            "section\nnoncomputable section\nopen Real\nnoncomputable def f (x : ℝ) : ℝ := Real.sqrt x\nend\nend\n",
        ),
        (
            "section S\ndef f (n : ℕ) : ℕ := n + 1\nend S\n",
            "",
            "section S\ndef f (n : ℕ) : ℕ := n + 1\nend S\n",
        ),
        # a helper in a namespace, reached by its namespaced name; the namespace closed before the statement
        (
            "namespace Helpers\nabbrev N : ℕ := 12\nlemma hN : N = 12 := rfl\nend Helpers\n",
            "",
            "namespace Helpers\nabbrev N : ℕ := 12\nlemma hN : N = 12 := rfl\nend Helpers\n",
        ),
        # definitions by patterns, tag attributes
        (
            "@[simp] def f : ℕ → ℕ\n  | 0 => 1\n  | n + 1 => 2 * f n\n"
            "@[reducible, local simp] noncomputable abbrev g := f\n",
            "",
            "@[simp] def f : ℕ → ℕ\n  | 0 => 1\n  | n + 1 => 2 * f n\n"
            "@[reducible, local simp] noncomputable abbrev g := f\n",
        ),
    ],
)
def test_a_preamble_goes_to_lean_with_the_helpers_and_never_reaches_the_statement(before, after, command_before):
    body = "  norm_num [Helpers.hN]\n" if "Helpers" in before else "  norm_num\n"
    assert prepare(f"{before}{GCD}{body}{after}", GCD) == f"{command_before}{GCD}{body}"


def test_a_preamble_without_helpers_or_rules_goes_nowhere():
    before = "noncomputable section\nset_option autoImplicit false\nopen scoped Real\nnamespace A\nend A\n"
    assert prepare(f"{before}{GCD}  norm_num\nend\n", GCD) == f"{GCD}  norm_num\n"


# Each newly accepted form, with each exploit class inside it: the exploit is refused, naming it. `{x}` is where
# the exploit stands; each form alone is accepted (test_each_form_alone_is_accepted), so the refusal is the
# exploit's.
FORMS = {
    "namespace": "namespace Foo\n{x}end Foo\n",
    "noncomputable section": "noncomputable section\n{x}",
    "section": "section\n{x}end\n",
    "open scoped": "open scoped BigOperators\n{x}",
    "binder options": "set_option autoImplicit false\nset_option relaxedAutoImplicit true\n{x}",
    "aesop rules": "add_aesop_rules unsafe 50% apply Nat.le_of_lt_succ\nadd_aesop_rules safe (rule_sets := [x]) h\n{x}",
    "def": "def f (n : ℕ) : ℕ := n + 1\n{x}",
    "noncomputable def": "noncomputable def g (x : ℝ) : ℝ := Real.sqrt x\n{x}",
    "abbrev": "abbrev N : ℕ := 3\n{x}",
    "tags": "@[simp] lemma s : 1 = 1 := rfl\n@[reducible] def r := 1\n@[local simp] theorem t : 2 = 2 := rfl\n{x}",
}
# (exploit, a fragment its refusal names), each written from the class it stands for
CLASSES = [
    ("axiom cheat : False\n", "axiom"),
    ("opaque o : ℕ\n", "opaque"),
    ("lemma h : 1 = 1 := by\n  sorry\n", "sorry"),
    ("def h : ℕ := by\n  exact sorry\n", "sorry"),
    ("def h : Bool := by\n  native_decide\n", "native_decide"),
    ("def h : 2 + 2 = 4 := by\n  decide +native\n", "decide +native"),
    ("def h : ℕ := Lean.ofReduceBool 1\n", "ofReduceBool"),
    ("def gcd : ℕ := 1\n", "redeclares `gcd`"),
    ("abbrev mathd_numbertheory_188 : ℕ := 1\n", "redeclares `mathd_numbertheory_188`"),
    ('notation "gcd" => Nat.lcm\n', "notation"),
    ('macro "norm_num" : tactic => `(tactic| sorry)\n', "macro"),
    ("instance : Decidable True := isTrue trivial\n", "instance"),
    ("noncomputable instance : Inhabited ℕ := ⟨1⟩\n", "instance"),
    ("@[csimp] theorem c : @Nat.add = @Nat.add := rfl\n", "csimp"),
    ("@[implemented_by Nat.add] def i (a b : ℕ) : ℕ := a\n", "implemented_by"),
    ('@[extern "c"] def e (a : ℕ) : ℕ := a\n', "extern"),
    ("@[tactic Lean.Parser.Tactic.omega] def t : Lean.Elab.Tactic.Tactic := fun _ => pure ()\n", "attribute @[tactic"),
    ("@[simp, init] def i : ℕ := 1\n", "attribute @[init"),
    ("@[command_elab Lean.Parser.Command.printAxioms] def p := 1\n", "command_elab"),
    ("@[env_linter] def l := 1\n", "attribute @[env_linter"),
    ("@[aesop safe] def a := 1\n", "attribute @[aesop"),
    ("attribute [simp] Nat.add_comm\n", "attribute (a new command)"),
    ("set_option debug.skipKernelTC true\n", "set_option debug.skipKernelTC"),
    ("def h : ℕ := by\n  run_tac pure ()\n  exact 1\n", "run_tac"),
    ("def h : 1 = 1 := by\n  simp (config := { maxSteps := dbgTraceVal 1 })\n", "config term"),
    ('def h : IO Unit := IO.println "x"\n', "IO"),
    ("#eval 1\n", "#eval"),
    ("unsafe def u : ℕ := 1\n", "unsafe"),
    ("partial def p (n : ℕ) : ℕ := p n\n", "partial"),
    ("private def p : ℕ := 1\n", "private"),
    ("def h : ℕ := 1\nderiving instance Repr for Nat\n", "deriving"),
    ("add_aesop_rules safe tactic Foo.bar\n", "aesop rule builder `tactic`"),
    ("def ev : Lean.Elab.Tactic.TacticM Unit := pure ()\nadd_aesop_rules safe ev\n", "aesop rule `ev`"),
    ("add_aesop_rules unsafe 50% (unsafe foo)\n", "unsafe"),
    ("add_aesop_rules safe h\nunsafe def u : ℕ := 1\n", "unsafe"),  # a line's `unsafe` is Lean's, not a phase
    ("def h : ℕ := by\n  exact (add <| unsafe 1)\n", "unsafe"),  # Lean's `unsafe t` term, after a word `add`
    ("def h : ℕ × ℕ := (add 1, unsafe 2)\n", "unsafe"),
]
PAIRS = [(form, exploit, named) for form in FORMS for exploit, named in CLASSES]


@pytest.mark.parametrize(("form", "exploit", "named"), PAIRS, ids=[f"{f}|{n}" for f, _, n in PAIRS])
def test_each_exploit_class_inside_each_accepted_form_is_refused_naming_it(form, exploit, named):
    judgement = prepare(FORMS[form].format(x=exploit) + f"{GCD}  aesop\n", GCD)
    assert isinstance(judgement, Judgement) and judgement.verdict == "rejected", judgement
    assert judgement.reason == ("sorry" if named == "sorry" else "integrity")
    assert named in judgement.detail, judgement.detail


@pytest.mark.parametrize("form", FORMS)
def test_each_form_alone_is_accepted(form):
    assert isinstance(prepare(FORMS[form].format(x="") + f"{GCD}  aesop\n", GCD), str)


# --- a theorem inside a namespace: closed out of it, opened in it, where the audit runs --------------------------


def audited(model: str) -> str | Judgement:
    """`prepare` as LeanChecker calls it with the audit as its second line."""
    return prepare(model, GCD, open_namespaces=True)


@pytest.mark.parametrize(
    ("model", "command"),
    [
        # FYDY's Putnam 2025 shape: helpers in the namespace, the theorem too, its proof naming them short;
        # the theorem's own `#print axioms` and the namespace's `end` after the proof dropped
        (
            f"namespace Putnam\nlemma key (n : ℕ) : n + 0 = n := rfl\n{GCD}  norm_num [key]\n"
            f"#print axioms {NAME}\nend Putnam\n",
            "namespace Putnam\nlemma key (n : ℕ) : n + 0 = n := rfl\nend Putnam\n"
            f"open Putnam in\n{GCD}  norm_num [key]\n",
        ),
        # an `open` and an option inside: the section for the helpers, the option on the theorem after the `open`
        (
            f"namespace P\nopen Real\nset_option maxHeartbeats 400000\ndef f (n : ℕ) : ℕ := n\n{GCD}  simp [f]\n",
            "section\nnamespace P\nopen Real\nset_option maxHeartbeats 400000\ndef f (n : ℕ) : ℕ := n\nend P\nend\n"
            f"open P in\nset_option maxHeartbeats 400000 in\n{GCD}  simp [f]\n",
        ),
        # nested: each namespace Lean had open there, outermost first (`namespace B.C` in `A` is `A.B`, `A.B.C`)
        (
            f"namespace A\nsection S\nnamespace B.C\nlemma k : 1 = 1 := rfl\n{GCD}  simp [k]\nend B.C\nend S\nend A\n",
            "namespace A\nsection S\nnamespace B.C\nlemma k : 1 = 1 := rfl\nend B.C\nend S\nend A\n"
            f"open A in\nopen A.B in\nopen A.B.C in\n{GCD}  simp [k]\n",
        ),
        (
            f"namespace «x.y».z\nlemma k : 1 = 1 := rfl\n{GCD}  simp [k]\n",
            "namespace «x.y».z\nlemma k : 1 = 1 := rfl\nend «x.y».z\n"
            f"open «x.y» in\nopen «x.y».z in\n{GCD}  simp [k]\n",
        ),
        # no helper: the namespace still goes to Lean, which `open` needs declared
        (f"namespace Real\n{GCD}  norm_num\nend Real\n", f"namespace Real\nend Real\nopen Real in\n{GCD}  norm_num\n"),
    ],
)
def test_a_theorem_inside_a_namespace_is_sent_out_of_it_and_opened_in_it_where_the_audit_runs(model, command):
    assert audited(model) == command


OPEN_AT_STATEMENT = (
    "before the statement: forbidden: namespace {x} open at the statement (close it with `end {x}` first: only "
    "the audit, off here, would catch how `open {x}` changes the statement's reading)"
)


@pytest.mark.parametrize("flag", [{}, {"open_namespaces": False}])
def test_a_theorem_inside_a_namespace_is_refused_where_no_audit_runs(flag):
    model = f"namespace Putnam\nlemma key (n : ℕ) : n + 0 = n := rfl\n{GCD}  norm_num [key]\nend Putnam\n"
    assert prepare(model, GCD, **flag) == refused(OPEN_AT_STATEMENT.format(x="Putnam"))
    nested = f"namespace A\nnamespace B\n{GCD}  norm_num\nend B\nend A\n"
    assert prepare(nested, GCD, **flag) == refused(OPEN_AT_STATEMENT.format(x="B"))
    closed = f"namespace Putnam\nlemma key (n : ℕ) : n + 0 = n := rfl\nend Putnam\n{GCD}  norm_num [Putnam.key]\n"
    assert prepare(closed, GCD, **flag) == closed  # closed before the statement: sent as written


@pytest.mark.parametrize(("exploit", "named"), CLASSES, ids=[n for _, n in CLASSES])
def test_each_exploit_class_inside_a_namespace_open_at_the_statement_is_refused_naming_it(exploit, named):
    judgement = audited(f"namespace Foo\n{exploit}{GCD}  aesop\nend Foo\n")
    assert isinstance(judgement, Judgement) and judgement.verdict == "rejected", judgement
    assert judgement.reason == ("sorry" if named == "sorry" else "integrity")
    assert named in judgement.detail, judgement.detail
    assert isinstance(audited(f"namespace Foo\n{GCD}  aesop\nend Foo\n"), str)  # the form alone is accepted


IN_NAMESPACE = [(before, detail) for before, detail in EXPLOITS_BEFORE if not before.startswith("namespace")]


@pytest.mark.parametrize(("before", "detail"), IN_NAMESPACE, ids=[d for _, d in IN_NAMESPACE])
def test_each_exploit_class_before_the_statement_is_refused_alike_in_a_namespace_open_at_it(before, detail):
    holes = ("sorry", "sorryAx", "admit")
    reason = "sorry" if detail.removeprefix(H).removeprefix(S) in holes else "integrity"
    assert audited(f"namespace Foo\n{before}{GCD}  norm_num\n") == refused(detail, reason)


@pytest.mark.parametrize(
    ("before", "detail"),
    [
        # a helper that shadows a name the statement uses, by its full name in the namespace or its last part
        (
            "namespace Nat\nlemma gcd (a : ℕ) : a = a := rfl\n",
            f"helper `gcd`: forbidden: redeclares `Nat.gcd`, {SHADOWS}",
        ),
        ("namespace Foo\nlemma gcd (a : ℕ) : a = a := rfl\n", f"helper `gcd`: forbidden: redeclares `gcd`, {SHADOWS}"),
        (
            f"namespace X\ntheorem {NAME} : True := trivial\n",
            f"helper `{NAME}`: forbidden: redeclares `{NAME}`, {SHADOWS}",
        ),
        # the rules for scopes still hold
        ("namespace A\nend B\n", f"{S}end B closes no scope open here"),
        ("namespace A B\n", f"{S}namespace A B (one name)"),
    ],
)
def test_what_is_refused_in_a_namespace_is_refused_when_it_stays_open_at_the_statement(before, detail):
    assert audited(f"{before}{GCD}  norm_num\n") == refused(detail)


# A definition's compiled code runs only if something evaluates it. Two evaluators name a constant rather than
# code, so a name the attempt declared as a definition (or a `where`/`let rec` declaration) is refused there:
@pytest.mark.parametrize(
    ("before", "body", "detail"),
    [
        # an aesop rule in a tactic's `(add ...)` clause: the default builder would run a `TacticM Unit` constant
        (
            "def evil : Lean.Elab.Tactic.TacticM Unit := pure ()\n",
            "  aesop (add safe evil)\n",
            "forbidden: aesop rule `evil` names a definition of the attempt (aesop may run it as a tactic)",
        ),
        (
            "namespace X\ndef evil : Lean.Elab.Tactic.TacticM Unit := pure ()\nend X\n",
            "  aesop (add unsafe 10% X.evil)\n",
            "forbidden: aesop rule `X.evil` names a definition of the attempt (aesop may run it as a tactic)",
        ),
        (
            "",
            "  aesop (add safe tactic Foo.bar)\n",
            "forbidden: aesop rule builder `tactic` (aesop runs the rule's compiled code)",
        ),
        # a configuration value `.name` resolves in the configuration type's namespace, where a definition can be
        (
            "namespace Lean.Meta.Simp.Config\ndef evil : Lean.Meta.Simp.Config := {}\nend Lean.Meta.Simp.Config\n",
            "  simp (config := .evil)\n",
            "forbidden: config value `.evil` may name a definition of the attempt (configuration is evaluated)",
        ),
        (
            "lemma h : True := by\n  trivial\nwhere\n  evil : Lean.Meta.Simp.Config := {}\n",
            "  simp (config := { .evil with })\n",
            "forbidden: config value `.evil` may name a definition of the attempt (configuration is evaluated)",
        ),
        # `true` is a name too: in namespace `X`, `X.true` where the attempt declared one
        (
            "namespace X\ndef true : Bool := false\n"
            "lemma h : 1 = 1 := by\n  simp (config := { decide := true })\nend X\n",
            "  norm_num\n",
            "helper `h`: forbidden: config value `true` may name a definition of the attempt "
            "(configuration is evaluated)",
        ),
        (
            "",
            "  have : True := by\n    let rec evil : ℕ := 1\n    trivial\n  omega (config := .evil)\n",
            "forbidden: config value `.evil` may name a definition of the attempt (configuration is evaluated)",
        ),
    ],
)
def test_an_evaluator_that_names_a_definition_of_the_attempt_is_refused(before, body, detail):
    assert prepare(f"{before}{GCD}{body}", GCD) == refused(detail)


@pytest.mark.parametrize(
    "body",
    [
        "  aesop (add unsafe 50% apply Nat.le_of_lt_succ, safe f)\n",  # `f` is a lemma here: a rule aesop applies
        "  simp (config := .arith)\n",  # a library configuration, not one of the attempt's names
        "  simp (config := { decide := Bool.true })\n",  # Harmonic's Aristotle writes Booleans so
        "  unfold f at *\n  aesop (add norm simp Nat.add_zero)\n",
    ],
)
def test_aesop_rules_and_configuration_naming_no_definition_of_the_attempt_go_to_lean(body):
    before = "lemma f : 1 = 1 := rfl\n"
    assert prepare(f"{before}{GCD}{body}", GCD) == f"{before}{GCD}{body}"


@pytest.mark.parametrize(
    ("before", "after", "detail"),
    [
        ("@[simp]\n", "", "before the statement: forbidden: attribute @[simp] before no helper"),
        ("noncomputable\n", "", "before the statement: forbidden: noncomputable before no helper"),
        ("namespace A\nend B\n", "", "before the statement: forbidden: end B closes no scope open here"),
        ("end\n", "", "before the statement: forbidden: end closes no scope open here"),
        ("namespace A B\nend A\n", "", "before the statement: forbidden: namespace A B (one name)"),
        ("noncomputable namespace A\n", "", "before the statement: forbidden: namespace (a new command)"),
        ("@[simp] noncomputable section\n", "", "before the statement: forbidden: section (a new command)"),
        (
            "set_option autoImplicit 0\n",
            "",
            "before the statement: forbidden: set_option autoImplicit 0 (true or false)",
        ),
        ("@[simp\nlemma h : 1 = 1 := rfl\n", "", "before the statement: forbidden: attribute @[simp lemma h :"),
    ],
)
def test_scopes_prefixes_and_attributes_that_lean_would_misread_are_refused(before, after, detail):
    assert prepare(f"{before}{GCD}  norm_num{after}", GCD) == refused(detail)


def test_print_axioms_of_a_helper_the_text_declared_is_dropped_before_and_after_the_proof():
    """Seed-Prover's IMO files print each lemma's axioms, between the lemmas and after the theorem (where the
    lemma after the proof is dropped with them)."""
    before = (
        "lemma h₁ : 1 = 1 := rfl\n#print axioms h₁\nnamespace A\nlemma h₂ : 2 = 2 := rfl\nend A\n#print axioms A.h₂\n"
    )
    after = f"\nlemma h₃ : 3 = 3 := rfl\n#print axioms h₃\n#print axioms {NAME}\n#print axioms h₁\n"
    kept_before = "lemma h₁ : 1 = 1 := rfl\nnamespace A\nlemma h₂ : 2 = 2 := rfl\nend A\n"
    expected = f"{kept_before}{GCD}  norm_num\n"
    assert prepare(f"{before}{GCD}  norm_num{after}", GCD) == expected
    # a name the text did not declare, or declared later, is still refused
    assert prepare(f"#print axioms Nat.gcd_comm\n{GCD}  norm_num\n", GCD) == refused(f"{S}#print")
    assert prepare(f"#print axioms h\nlemma h : 1 = 1 := rfl\n{GCD}  norm_num\n", GCD) == refused(f"{S}#print")
    assert prepare(f"lemma h : 1 = 1 := rfl\n#print h\n{GCD}  norm_num\n", GCD) == refused(f"{S}#print")


# --- exploit classes reported against Lean verifiers in 2025-2026 ----------------------------------------------
# Each: refused by the scan wherever it stands (the preamble's new forms included), and by the second line
# where the scan could miss it. The third class (a proof that compiles C with the toolchain's compiler and
# patches the checker with ptrace) is shown harmless by the sandbox in
# tests/verifier_pool/test_sandbox_probes.py::test_no_process_outside_the_sandbox_can_be_traced.

CSIMP = "@[csimp] theorem fake : @Nat.add = @Nat.mul := by\n  sorry\n"


@pytest.mark.parametrize(
    ("before", "body", "detail"),
    [
        # a `@[csimp]` lemma swaps the compiled code `native_decide` evaluates: refused at the attribute, wherever
        (CSIMP, "  native_decide\n", f"{S}csimp"),
        (CSIMP.replace("@[csimp]", "@[simp, csimp]"), "  native_decide\n", f"{S}csimp"),
        (f"namespace X\n{CSIMP}end X\n", "  decide\n", f"{S}csimp"),
        (f"noncomputable section\n{CSIMP}", "  decide\n", f"{S}csimp"),
        ("attribute [csimp] Nat.add_comm\n", "  native_decide\n", f"{S}attribute (a new command)"),
        ("def f := 1\n", "  exact (by decide +native)\n", "forbidden: decide +native"),
        ("", "  exact Lean.ofReduceBool _ _ rfl\n", "forbidden: ofReduceBool"),
        # so does `@[implemented_by]`, the same swap without a proof of equality
        ("@[implemented_by Nat.mul] def add' (a b : ℕ) : ℕ := a + b\n", "  native_decide\n", f"{S}implemented_by"),
    ],
)
def test_a_csimp_lemma_smuggled_through_native_decide_is_refused(before, body, detail):
    assert prepare(f"{before}{GCD}{body}", GCD) == refused(detail)


def test_native_decide_that_reaches_lean_anyway_is_refused_by_its_axiom():
    """The second line: `native_decide` proofs depend on `Lean.ofReduceBool`, in `#print axioms` and the audit."""
    report = {"env": 2, "messages": [_info(f"'{NAME}' depends on axioms: [propext, Lean.ofReduceBool]")]}
    assert judge_axioms(report, NAME) == refused("trusts the compiler: Lean.ofReduceBool")


@pytest.mark.parametrize(
    ("before", "detail"),
    [
        ("axiom cheat : False\n", f"{S}axiom"),
        ("@[simp] axiom cheat : False\n", f"{S}axiom"),
        ("noncomputable axiom cheat : False\n", f"{S}axiom"),
        ("private axiom cheat : False\n", f"{S}private (a new command)"),
        ("namespace X\naxiom cheat : False\nend X\n", f"{S}axiom"),
        ("noncomputable section\naxiom cheat : False\n", f"{S}axiom"),
        ("section\ndef f := 1\naxiom cheat : False\nend\n", "helper `f`: forbidden: axiom"),  # read on into `f`
        ("def f : False := by\n  exact cheat\naxiom cheat : False\n", f"{S}axiom"),
        ("add_aesop_rules safe apply cheat\naxiom cheat : False\n", f"{S}axiom"),
        ("set_option autoImplicit true in\naxiom cheat : False\n", f"{S}axiom"),
        ("opaque cheat : False\n", f"{S}opaque"),
        ("lemma h : False := by\n  exact «sorryAx» _ false\n", "helper `h`: forbidden: sorryAx"),
    ],
)
def test_an_axiom_above_the_protected_statement_is_refused(before, detail):
    reason = "sorry" if detail.endswith("sorryAx") else "integrity"
    assert prepare(f"{before}{GCD}  exact cheat.elim\n", GCD) == refused(detail, reason)


def test_an_axiom_that_reaches_lean_anyway_is_refused_by_the_axioms_report():
    report = {"env": 2, "messages": [_info(f"'{NAME}' depends on axioms: [propext, cheat]")]}
    assert judge_axioms(report, NAME) == refused("uses axioms: cheat")


@pytest.mark.parametrize(
    ("before", "body", "detail"),
    [
        # the code that would compile and run the patch: every way to run it is refused, in every form
        ("", '  run_tac do\n    let _ ← IO.Process.output { cmd := "cc", args := #["p.c"] }\n', "forbidden: run_tac"),
        ('#eval IO.Process.output { cmd := "cc", args := #["p.c"] }\n', "  norm_num\n", f"{S}#eval"),
        (
            'def patch : IO Unit := do\n  let _ ← IO.Process.spawn { cmd := "cc" }\n',
            "  norm_num\n",
            "helper `patch`: forbidden: IO",
        ),
        ("initialize patch : Unit ← pure ()\n", "  norm_num\n", f"{S}initialize"),
        ("run_cmd Lean.Elab.Command.liftTermElabM (pure ())\n", "  norm_num\n", f"{S}run_cmd"),
        (
            "def patch : Lean.Elab.Tactic.TacticM Unit := pure ()\n",
            "  aesop (add safe patch)\n",
            "forbidden: aesop rule `patch` names a definition of the attempt (aesop may run it as a tactic)",
        ),
        (
            "namespace Lean.Meta.Simp.Config\ndef patch : Lean.Meta.Simp.Config := {}\nend Lean.Meta.Simp.Config\n",
            "  simp (config := .patch)\n",
            "forbidden: config value `.patch` may name a definition of the attempt (configuration is evaluated)",
        ),
        ("@[init patch] def p : ℕ := 1\n", "  norm_num\n", f"{S}attribute @[init patch"),
    ],
)
def test_code_that_would_compile_c_and_ptrace_the_checker_has_no_way_to_run(before, body, detail):
    assert prepare(f"{before}{GCD}{body}", GCD) == refused(detail)


def _info(data: str) -> dict:
    return {"severity": "info", "pos": {"line": 1, "column": 0}, "endPos": {"line": 1, "column": 10}, "data": data}


def test_an_alternative_after_an_empty_line_is_read_where_it_stands():
    """Seed-Prover's checked imo_1997_p5 has a `| inr h =>` alternative after an empty line whose line before
    ends in `)`. The scan once merged `)` and `|` across the empty line into one symbol token, so the
    alternative's line seemed to hold no token at the proof's column, and a valid proof was refused. A run of
    symbols is now one token within a line only."""
    statement = "theorem t (p q : Prop) (h : p ∨ q) : q ∨ (p ∨ q) := by"
    body = "\n  cases h with\n  | inl hp =>\n    exact Or.inr (Or.inl hp)\n\n  | inr hq =>\n    exact Or.inl hq\n"
    assert prepare(statement + body, statement) == statement + body
    dedented = body.replace("\n  | inr", "\n | inr")  # left of the proof's column: Lean ends the proof there
    assert isinstance(prepare(statement + dedented, statement), Judgement)
