"""`python -m evals.scan_corpus --release NAME=PATH ... [--dataset minif2f.jsonl] [--out FILE]`

The Lean front end (`verifier_pool.lean_check.prepare`: the proof's place in the text, helper declarations,
the token scan) run over proofs that published provers wrote and their authors checked in Lean: every one
is a valid proof, so every refusal is either a stated policy (`policy`: `native_decide`, a statement
mismatch, a file with a `sorry`, a statement about the file's own definitions, a release's own tactic
library, code or syntax the file defines) or a valid proof the verifier would score 0. Nothing runs in Lean
here: this measures what the front end lets through to Lean, not what Lean then says.

Each proof is passed whole, once with its own statement (the target theorem as the file states it) and once
with the dataset's statement of the same name (`--dataset`, default data/minif2f.jsonl): where the
two differ the second is refused, rightly, as a statement mismatch. The competition releases (IMO, Putnam)
are not in the dataset: their own statements are the measure.

PATH is a folder (every `*.lean` under it, `lakefile.lean` excepted) or a `.zip` of one, as the releases ship
them. This machine cannot reach GitHub; get them where it can (KNOWN_RELEASES names repository, commit and
path). A file's target theorems (`targets`): the one its file name names, else every theorem or lemma that
no other declaration of the file uses (a file may prove several: `imo2025_p1_left` and `_right`).

Writes one JSON object (default docs/results/scan-real-proofs.json): per mode, total, accepted, refused by
reason, by rule and by policy, figures per release, and each refused proof with its file, theorem, reason,
detail and `policy` (null for a valid proof refused); and the accepted proofs whose checked command declares
fewer theorems, lemmas and definitions than their file does up to the target (helpers dropped: Lean then fails
the proof, so these are valid proofs refused too, only later; what follows the proof is dropped by design, as
nothing there is in scope for it). Prints a summary on stderr.

The published figure (docs/results/scan-real-proofs.json), every release of KNOWN_RELEASES, from clones of
the six repositories at the commits named there (R: where they are):

    mkdir -p corpora/delta corpora/seed-imo2025 corpora/harmonic corpora/fydy corpora/alphaproof
    git -C $R/DeepSeek-Prover-V2 show e598a57e:minif2f-solutions.zip > corpora/deepseek.zip
    git -C $R/Kimina-Prover-Preview show 7abd61a5:minif2f_test_solved.zip > corpora/kimina.zip
    git -C $R/Kimina-Prover-Preview show 7abd61a5:minif2f_test_solved_filtered_0710.zip > corpora/kimina72b.zip
    git -C $R/Seed-Prover show 7d3875a2:SeedProver/MiniF2F.zip > corpora/seed.zip
    git -C $R/Seed-Prover show 7d3875a2:SeedProver/imo.zip > corpora/seed-imo.zip
    for p in p1 p3 p4 p5; do
        git -C $R/Seed-Prover show 7d3875a2:SeedProver/imo2025/$p.lean > corpora/seed-imo2025/$p.lean; done
    git -C $R/Seed-Prover show 7d3875a2:DeltaProver/leansim_lean_runtime.zip > corpora/delta.zip
    (cd corpora/delta && unzip -q ../delta.zip 'leansim_lean_runtime/LeansimLeanRuntime/minif2f/*')
    for p in P1 P3 P4 P4_solve2 P5; do
        git -C $R/IMO2025 show 72b62405:HarmonicLean/IMO2025$p.lean > corpora/harmonic/IMO2025$p.lean; done
    for f in A1 A2 A3 A4 B1 B2 B3 B4; do
        git -C $R/putnam-2025 show cda7961d:solutions-lean/${f}_2025.lean > corpora/fydy/${f}_2025.lean; done
    for p in p1 p2 p6; do git -C $R/IMO_2024 show f6b98d17:IMO2024/$p.lean > corpora/alphaproof/$p.lean; done
    python -m evals.scan_corpus --release deepseek-prover-v2=corpora/deepseek.zip \\
        --release kimina-prover-preview=corpora/kimina.zip --release kimina-prover-72b=corpora/kimina72b.zip \\
        --release seed-prover=corpora/seed.zip --release seed-prover-imo=corpora/seed-imo.zip \\
        --release seed-prover-imo2025=corpora/seed-imo2025 \\
        --release delta-prover=corpora/delta/leansim_lean_runtime/LeansimLeanRuntime/minif2f \\
        --release harmonic-imo2025=corpora/harmonic --release fydy-putnam2025=corpora/fydy \\
        --release alphaproof-imo2024=corpora/alphaproof
"""

from __future__ import annotations

import argparse
import collections
import itertools
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tasks.lean_proof import IntegrityError, split_attempt
from tasks.lean_text import Token, code_tokens, name_parts
from verifier_pool.checkers import JUDGING_SOURCES
from verifier_pool.judgement import Judgement
from verifier_pool.lean_check import prepare
from verifier_pool.lean_commands import HELPER_WORDS

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "data" / "minif2f.jsonl"
OUT = ROOT / "docs" / "results" / "scan-real-proofs.json"

# The releases measured so far: where each is published (repository, commit, path), the Lean its authors checked
# it with, its licence. The first four are miniF2F; the rest, released in 2025, prove competition problems
# with many lemmas and definitions, each file against its own statement (none is in the miniF2F dataset).
# `runtime`: names of tactics and lemmas a release's proofs take from its own Lean library (no header of ours
# has them: a proof that uses one is refused by `policy` "release_runtime" if refused at all).
KNOWN_RELEASES: dict[str, dict[str, Any]] = {
    "deepseek-prover-v2": {
        "repository": "deepseek-ai/DeepSeek-Prover-V2",
        "commit": "e598a57ea3284997d4a2a168a069fdd5064afbc8",
        "path": "minif2f-solutions.zip (test/, valid/)",
        "lean": "Lean 4.9.0-rc2 (the paper, section 4)",
        "license": "none stated for the solutions; the repository carries only LICENSE-MODEL (the model's)",
    },
    "kimina-prover-preview": {
        "repository": "MoonshotAI/Kimina-Prover-Preview",
        "commit": "7abd61a5d9861bf5c15b195c216c1bb233ac32e4",
        "path": "minif2f_test_solved.zip (src/)",
        "lean": "Lean v4.15.0, Mathlib v4.15.0 (its lean-toolchain, lakefile.lean)",
        "license": "Apache-2.0 (minif2f_test_solved/LICENSE)",
    },
    "kimina-prover-72b": {
        "repository": "MoonshotAI/Kimina-Prover-Preview",
        "commit": "7abd61a5d9861bf5c15b195c216c1bb233ac32e4",
        "path": "minif2f_test_solved_filtered_0710.zip (src/)",
        "lean": "Lean v4.15.0 (its lean-toolchain)",
        "license": "Apache-2.0 (minif2f_test_solved_filtered/LICENSE)",
    },
    "seed-prover": {
        "repository": "ByteDance-Seed/Seed-Prover",
        "commit": "7d3875a2bd68538d1f98ea62f5c9a56035d33b5f",
        "path": "SeedProver/MiniF2F.zip",
        "lean": "Lean v4.14.0 (the paper: 'unless otherwise specified')",
        "license": "Apache-2.0 (LICENSE at the repository root)",
    },
    "seed-prover-imo": {
        "repository": "ByteDance-Seed/Seed-Prover",
        "commit": "7d3875a2bd68538d1f98ea62f5c9a56035d33b5f",
        "path": "SeedProver/imo.zip (imo/: past IMO and IMO shortlist 2024 problems, July 2025)",
        "lean": "Lean v4.14.0 (the paper: 'unless otherwise specified')",
        "license": "Apache-2.0 (LICENSE at the repository root)",
    },
    "seed-prover-imo2025": {
        "repository": "ByteDance-Seed/Seed-Prover",
        "commit": "7d3875a2bd68538d1f98ea62f5c9a56035d33b5f",
        "path": "SeedProver/imo2025/p1.lean, p3.lean, p4.lean, p5.lean (IMO 2025, July 2025)",
        "lean": "Lean v4.14.0 (SeedProver/README.md: 'P1,3,4,5 are compiled under Lean v4.14.0')",
        "license": "Apache-2.0 (LICENSE at the repository root)",
    },
    "delta-prover": {
        "repository": "ByteDance-Seed/Seed-Prover",
        "commit": "7d3875a2bd68538d1f98ea62f5c9a56035d33b5f",
        "path": "DeltaProver/leansim_lean_runtime.zip (leansim_lean_runtime/LeansimLeanRuntime/minif2f/, July 2025)",
        "lean": "Lean v4.9.0 (its lean-toolchain), with its own library LeansimLeanRuntime (Prelude, SimpleTactics)",
        "license": "Apache-2.0 (each file's header; LICENSE at the repository root)",
        "runtime": [
            *("unpack", "unpack?", "rename_the", "clear?", "retro", "retro'", "mkOpaque", "have_opaque"),
            *("clear_value_ordered", "elim_exists_inner", "elim_exists", "syntax_override", "inh_card"),
            *("inh_length", "powerset_finset", "Or.elim_left", "Or.elim_right", "Subtype.val_eq_of_eq"),
            *("Function.Injective.mk", "if_elim_pos", "if_elim_neg", "em_elim", "Multiset.card'"),
            "Multiset.card'_def",
        ],
    },
    "harmonic-imo2025": {
        "repository": "harmonic-ai/IMO2025 (Aristotle)",
        "commit": "72b62405a176a7eaeadb335a7fa6ee80b6667161",
        "path": "HarmonicLean/IMO2025P1.lean, P3, P4, P4_solve2, P5 (July 2025; its Imports.lean adds one simp lemma)",
        "lean": "Lean v4.20.0-rc5, Mathlib v4.20.0-rc5 (its lean-toolchain, lakefile.toml)",
        "license": "none stated (no LICENSE in the repository): measured here, no file kept in the repository",
    },
    "alphaproof-imo2024": {
        "repository": "Lean-zh/IMO_2024 (AlphaProof's IMO 2024 proofs, July 2024, from DeepMind's solutions page)",
        "commit": "f6b98d178ac5ea8c665dc2d6f9ba4b0754fe697e",
        "path": "IMO2024/p1.lean, p2.lean, p6.lean (no helpers: one theorem each; 2024, not 2025)",
        "lean": "Lean v4.10.0-rc2 (the copy's lean-toolchain)",
        "license": "none stated (neither the copy nor DeepMind's page): measured here, no file kept in the repository",
    },
    "fydy-putnam2025": {
        "repository": "fuzzy-dynamics/putnam-2025 (FYDY's Theater)",
        "commit": "cda7961db470d682a9eb145b30019e5f3500362a",
        "path": "solutions-lean/*.lean (Putnam 2025, 8 problems, December 2025; `lake build SolutionsLean`)",
        "lean": "Lean v4.26.0-rc2 (its lean-toolchain), Mathlib master (its lakefile.toml)",
        "license": "none stated (no LICENSE in the repository): measured here, no file kept in the repository",
    },
}
_BRACKETS = {"(": 1, "[": 1, "{": 1, "⟨": 1, ")": -1, "]": -1, "}": -1, "⟩": -1}


# The commands that declare a constant: what a file's helpers are (`_declarations`), where a declaration's
# text ends (at the next one), and which names a statement may borrow from its file (DEFINITION_WORDS).
DECLARATION_WORDS = frozenset(
    {"theorem", "lemma", "def", "abbrev", "instance", "structure", "class", "inductive", "opaque", "axiom", "example"}
)
THEOREM_WORDS = HELPER_WORDS  # the keywords of a theorem, as the front end reads them
DEFINITION_WORDS = DECLARATION_WORDS - THEOREM_WORDS - {"example"}


@dataclass(frozen=True)
class Proof:
    release: str
    file: str  # its path inside the release
    name: str  # the target theorem, as the file writes its name (`targets`)
    text: str


@dataclass(frozen=True)
class Declaration:
    word: str  # its keyword: theorem, def, ...
    name: str  # as written after the keyword; "" for `example` and an unnamed `instance`
    tokens: list[Token]  # its code tokens, from the keyword to the next declaration's


def read_release(release: str, path: Path) -> list[Proof]:
    """Every `*.lean` file of a folder or a zip (lakefile.lean and macOS metadata excepted), by path, once per
    target theorem (`targets`); a file of no theorem is one proof of no name (counted as without a statement)."""
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if _is_proof(n)]
            texts = {n: z.read(n).decode("utf-8") for n in names}
    else:
        texts = {str(p.relative_to(path)): p.read_text("utf-8") for p in path.rglob("*.lean") if _is_proof(str(p))}
    return [
        Proof(release, file, target, text)
        for file, text in sorted(texts.items())
        for target in targets(text, Path(file).stem) or [""]
    ]


def declarations(text: str) -> list[Declaration]:
    """The file's declarations in order, each with its tokens up to the next declaration or `#` command at the
    start of a line (comments and strings are not code; `#print axioms x` after a proof is no use of `x`)."""
    tokens = code_tokens(text)
    starts = [k for k, t in enumerate(tokens) if t.kind == "ident" and t.text in DECLARATION_WORDS]
    stops = sorted({*starts, *(k for k, t in enumerate(tokens) if t.kind == "hash" and t.col == 0), len(tokens)})
    found = []
    for start in starts:
        end = next(k for k in stops if k > start)
        word, after = tokens[start].text, tokens[start + 1 : start + 2]
        named = word != "example" and after and after[0].kind == "ident" and after[0].text not in DECLARATION_WORDS
        found.append(Declaration(word, after[0].text if named else "", tokens[start:end]))
    return found


def targets(text: str, stem: str) -> list[str]:
    """The theorems a file proves: the one its file name names (the miniF2F releases' shape), else its main
    theorems, the `theorem`s and `lemma`s no other declaration of the file uses (Seed-Prover's IMO 2025 files
    prove `imo2025_p1_left` and `imo2025_p1_right` in `p1.lean`; Aristotle's `IMO2025P5.lean`, `main_theorem`).
    A name counts as used where any declaration but its own holds an identifier with its last component as a
    component (`round1_h2`, `Foo.round1_h2`, `round1_h2.trans`); `#print axioms x` is no use. A helper no one
    uses, left over by a prover (three of Aristotle's P5), is a main theorem by this rule: a valid proof all the
    same, measured with the others standing beside it as helpers."""
    found = declarations(text)
    theorems = [d for d in found if d.word in THEOREM_WORDS and d.name]
    named = [d.name for d in theorems if name_parts(d.name)[-1] == stem]
    if named:
        return named[-1:]
    uses = [{part for t in d.tokens[2:] if t.kind == "ident" for part in name_parts(t.text)} for d in found]
    return [
        d.name
        for d in theorems
        if not any(name_parts(d.name)[-1] in used for other, used in zip(found, uses, strict=True) if other is not d)
    ]


def _is_proof(name: str) -> bool:
    return name.endswith(".lean") and "__MACOSX" not in name and Path(name).name != "lakefile.lean"


def own_statement(text: str, name: str) -> str | None:
    """The file's statement of `name`, from its `theorem`/`lemma` keyword to the `:=` that starts the proof
    (the first one outside brackets), with ` by` after it as the dataset writes statements; None if absent."""
    tokens = code_tokens(text)
    starts = [k for k, t in enumerate(tokens[:-1]) if t.text in ("theorem", "lemma") and tokens[k + 1].text == name]
    if not starts:
        return None
    depth = 0
    for token in tokens[starts[-1] :]:
        depth += sum(_BRACKETS.get(c, 0) for c in token.text) if token.kind == "symbol" else 0
        if token.text == ":=" and depth == 0:
            return text[tokens[starts[-1]].start : token.start + 2] + " by\n"
    return None


# Commands that define syntax or run code at elaboration time: refused wherever they stand (docs/VERIFIER.md),
# whatever the proof that uses them.
CODE_WORDS = frozenset(
    {"elab", "elab_rules", "macro", "macro_rules", "syntax", "notation", "infix", "infixl", "infixr", "prefix"}
)


def policy(judgement: Judgement, proof: Proof, statement: str) -> str | None:
    """Why a refusal is right whatever the proof, or None (a valid proof refused): the stated native_decide
    policy (anywhere in the file: its helpers go with the proof, so a later rule may be the one that names
    it); a statement mismatch; a file that holds a `sorry` or `admit` (three of Delta Prover's: not proofs);
    a statement that names a constant its file defines (`def`, `structure`, ...:
    the canonical statement is read on the header alone, so a helper named by a name the statement uses is
    refused); a proof written for its release's own runtime (KNOWN_RELEASES `runtime`: tactics and lemmas no
    header of ours has); code or syntax the file defines (`elab`, `macro`, `notation`, ...)."""
    if any(word in judgement.detail for word in ("native_decide", "decide +native", "ofReduceBool")):
        return "native_decide"
    if judgement.reason == "statement_mismatch" or "canonical statement is missing or altered" in judgement.detail:
        return "statement_mismatch"
    tokens = [t.text for t in code_tokens(proof.text)]
    if "native_decide" in tokens or any(a == "+" and b == "native" for a, b in itertools.pairwise(tokens)):
        return "native_decide"
    if "sorry" in tokens or "admit" in tokens:
        return "sorry_in_file"
    defined = [name_parts(d.name) for d in declarations(proof.text) if d.word in DEFINITION_WORDS and d.name]
    used = [name_parts(t.text) for t in code_tokens(statement) if t.kind == "ident"]
    if any(_same_constant(name, ident) for name in defined for ident in used):
        return "statement_uses_file_definitions"
    runtime = KNOWN_RELEASES.get(proof.release, {}).get("runtime", ())
    if any(t in runtime for t in tokens):
        return "release_runtime"
    if re.search(rf"forbidden: ({'|'.join(sorted(CODE_WORDS))})\b", judgement.detail):
        return "code_or_syntax_definition"
    return None


def _same_constant(declared: list[str], used: list[str]) -> bool:
    """Whether a name used may be the one declared, namespaces aside: one ends with the other (`play` declared
    in `namespace IMO2025P5` and used as `IMO2025P5.play`, or the reverse), not `Finset.card` for `Foo.card`."""
    shorter = min(len(declared), len(used))
    return declared[-shorter:] == used[-shorter:]


def scan(proofs: list[Proof], statements: dict[tuple[str, str], str | None]) -> dict[str, Any]:
    """`prepare` on each proof with `statements[file, target]`; a proof without a statement is counted apart."""
    reasons, rules, refused, accepted, missing, dropped = collections.Counter(), collections.Counter(), [], 0, [], []
    for proof in proofs:
        statement = statements.get((proof.file, proof.name))
        if statement is None:
            missing.append({"release": proof.release, "file": proof.file, "theorem": proof.name})
            continue
        # as the Lean verifier's default (the audit as second line) prepares it: a theorem inside a namespace
        # goes to Lean under `open X in`, which only the audit makes safe (docs/VERIFIER.md)
        result = prepare(proof.text, statement, open_namespaces=True)
        where = {"release": proof.release, "file": proof.file, "theorem": proof.name}
        if isinstance(result, str):
            accepted += 1
            if _declarations(result) < (usable := usable_declarations(proof.text, statement)):
                dropped.append({**where, "declarations": _declarations(result), "in_file": usable})
            continue
        reasons[result.reason] += 1
        rules[_rule(result)] += 1
        refused.append(
            {**where, "reason": result.reason, "detail": result.detail, "policy": policy(result, proof, statement)}
        )
    return {
        "by_release": _by_release(proofs, missing, refused, dropped),
        "total": len(proofs) - len(missing),
        "accepted": accepted,
        "refused": sum(reasons.values()),
        "refused_by_reason": dict(reasons.most_common()),
        "refused_by_rule": dict(rules.most_common()),
        "refused_valid": sum(r["policy"] is None for r in refused),
        "refused_by_policy": dict(collections.Counter(r["policy"] or "none: a valid proof" for r in refused)),
        "without_statement": missing,
        "accepted_without_their_declarations": dropped,
        "refused_proofs": refused,
    }


def _by_release(proofs: list[Proof], missing: list[dict], refused: list[dict], dropped: list[dict]) -> dict:
    """Each release's figures: proofs with a statement, accepted, refused (valid ones apart), helpers dropped."""
    figures: dict[str, dict[str, int]] = {}
    for release in sorted({p.release for p in proofs}):
        mine = [p for p in proofs if p.release == release]
        lost = sum(m["release"] == release for m in missing)
        out = [r for r in refused if r["release"] == release]
        figures[release] = {
            "total": len(mine) - lost,
            "accepted": len(mine) - lost - len(out),
            "refused": len(out),
            "refused_valid": sum(r["policy"] is None for r in out),
            "accepted_without_their_declarations": sum(d["release"] == release for d in dropped),
        }
    return figures


def _declarations(text: str) -> int:
    """How many declarations a text makes (DECLARATION_WORDS as code: not in comments or strings; `def` and
    `abbrev` helpers count as lemmas do). An accepted proof whose checked command makes fewer than its file lost
    helpers it uses: Lean then fails it."""
    return sum(t.kind == "ident" and t.text in DECLARATION_WORDS for t in code_tokens(text))


def usable_declarations(text: str, statement: str) -> int:
    """The declarations of a file its target can use: those before the target's statement, and the target.
    Lean reads a file in order, so nothing after the proof is in scope for it (and the verifier drops it)."""
    attempt = split_attempt(text, statement)
    return _declarations(text) if isinstance(attempt, IntegrityError) else _declarations(attempt.before) + 1


def _rule(judgement: Judgement) -> str:
    """The rule a refusal names: its detail up to the first place it names text of the proof."""
    detail = re.sub(r"helper `[^`]*`", "helper", judgement.detail)
    for stop in (" at line", ": `", " `", "'", '"'):
        detail = detail.split(stop, 1)[0]
    return f"{judgement.reason}: {detail[:60]}"


def dataset_statements(path: Path) -> dict[str, str]:
    rows = [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["name"]: r["formal_statement"] for r in rows}


def code_commit() -> str:
    """The last commit of the front end measured (the judging sources), and whether they have changed since."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("log", "-1", "--format=%h", "--", *JUDGING_SOURCES)
    return commit + (" (with uncommitted changes)" if git("status", "--porcelain", "--", *JUDGING_SOURCES) else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evals.scan_corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--release",
        action="append",
        default=[],
        metavar="NAME=PATH",
        required=True,
        help=f"a release's folder or zip; NAME one of {', '.join(KNOWN_RELEASES)} or your own",
    )
    parser.add_argument("--dataset", type=Path, default=DATASET, help="minif2f.jsonl: name -> formal_statement")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    proofs = []
    for spec in args.release:
        name, _, path = spec.partition("=")
        if not path or not Path(path).exists():
            print(f"--release {spec}: expected NAME=PATH to an existing folder or zip", file=sys.stderr)
            return 2
        proofs += read_release(name, Path(path))
    dataset = dataset_statements(args.dataset)
    releases = {spec.partition("=")[0] for spec in args.release}
    report = {
        "code": code_commit(),
        "dataset": str(args.dataset),
        "releases": {
            r: {
                **KNOWN_RELEASES.get(r, {}),
                "files": len({p.file for p in proofs if p.release == r}),
                "proofs": sum(p.release == r for p in proofs),
            }
            for r in sorted(releases)
        },
        "own_statement": scan(proofs, {(p.file, p.name): own_statement(p.text, p.name) for p in proofs}),
        "dataset_statement": scan(proofs, {(p.file, p.name): dataset.get(p.name) for p in proofs}),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    for mode in ("own_statement", "dataset_statement"):
        r = report[mode]
        print(
            f"{mode}: {r['accepted']}/{r['total']} accepted, refused {r['refused_by_reason']}, "
            f"valid refused {r['refused_valid']}, accepted without their helpers "
            f"{len(r['accepted_without_their_declarations'])}, without a statement {len(r['without_statement'])}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
