"""`python -m evals.scan_corpus --release NAME=PATH ... [--dataset minif2f.jsonl] [--out FILE]`

The Lean front end (`verifier_pool.lean_check.prepare`: the proof's place in the text, helper declarations,
the token scan) run over proofs that published provers wrote and their authors checked in Lean: every one
is a valid proof, so every refusal is either a stated policy (`native_decide`), a true statement mismatch,
or a valid proof the verifier would score 0. Nothing runs in Lean here: this measures what the front end
lets through to Lean, not what Lean then says.

Each proof is passed whole, once with its own statement (the target theorem as the file states it) and once
with the dataset's statement of the same name (`--dataset`, default ../shared/data/minif2f.jsonl): where the
two differ the second is refused, rightly, as a statement mismatch.

PATH is a folder (every `*.lean` under it, `lakefile.lean` excepted) or a `.zip` of one, as the releases ship
them. This machine cannot reach GitHub; get them where it can (KNOWN_RELEASES says which file of which
repository). The target theorem of a file is the one its file name names.

Writes one JSON object (default docs/results/scan-real-proofs.json): per mode, total, accepted, refused by
reason and by rule, and each refused proof with its reason, detail and `policy` (`native_decide`,
`statement_mismatch`, or null for a valid proof refused); and the accepted proofs whose checked command
declares fewer theorems and lemmas than their file (helpers dropped: Lean then fails the proof, so these are
valid proofs refused too, only later). Prints a summary on stderr.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tasks.lean_text import code_tokens
from verifier_pool.checkers import JUDGING_SOURCES
from verifier_pool.judgement import Judgement
from verifier_pool.lean_check import prepare

ROOT = Path(__file__).resolve().parents[1]
DATASET = Path("/work/shared/data/minif2f.jsonl")
OUT = ROOT / "docs" / "results" / "scan-real-proofs.json"

# The releases measured so far: where each is published, the Lean its authors checked it with, its licence.
KNOWN_RELEASES = {
    "deepseek-prover-v2": {
        "repository": "deepseek-ai/DeepSeek-Prover-V2",
        "path": "minif2f-solutions.zip (test/, valid/)",
        "lean": "Lean 4.9.0-rc2 (the paper, section 4)",
        "license": "none stated for the solutions; the repository carries only LICENSE-MODEL (the model's)",
    },
    "kimina-prover-preview": {
        "repository": "MoonshotAI/Kimina-Prover-Preview",
        "path": "minif2f_test_solved.zip (src/)",
        "lean": "Lean v4.15.0, Mathlib v4.15.0 (its lean-toolchain, lakefile.lean)",
        "license": "Apache-2.0 (minif2f_test_solved/LICENSE)",
    },
    "kimina-prover-72b": {
        "repository": "MoonshotAI/Kimina-Prover-Preview",
        "path": "minif2f_test_solved_filtered_0710.zip (src/)",
        "lean": "Lean v4.15.0 (its lean-toolchain)",
        "license": "Apache-2.0 (minif2f_test_solved_filtered/LICENSE)",
    },
    "seed-prover": {
        "repository": "ByteDance-Seed/Seed-Prover",
        "path": "SeedProver/MiniF2F.zip",
        "lean": "Lean v4.14.0 (the paper: 'unless otherwise specified')",
        "license": "Apache-2.0 (LICENSE at the repository root)",
    },
}
_BRACKETS = {"(": 1, "[": 1, "{": 1, "⟨": 1, ")": -1, "]": -1, "}": -1, "⟩": -1}


@dataclass(frozen=True)
class Proof:
    release: str
    file: str  # its path inside the release
    name: str  # the target theorem: the file's name
    text: str


def read_release(release: str, path: Path) -> list[Proof]:
    """Every `*.lean` file of a folder or a zip (lakefile.lean and macOS metadata excepted), by path."""
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if _is_proof(n)]
            texts = {n: z.read(n).decode("utf-8") for n in names}
    else:
        texts = {str(p.relative_to(path)): p.read_text("utf-8") for p in path.rglob("*.lean") if _is_proof(str(p))}
    return [Proof(release, name, Path(name).stem, text) for name, text in sorted(texts.items())]


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


def policy(judgement: Judgement) -> str | None:
    """Why a refusal is right whatever the proof: the stated native_decide policy, or a statement mismatch."""
    if any(word in judgement.detail for word in ("native_decide", "decide +native", "ofReduceBool")):
        return "native_decide"
    if judgement.reason == "statement_mismatch" or "canonical statement is missing or altered" in judgement.detail:
        return "statement_mismatch"
    return None


def scan(proofs: list[Proof], statements: dict[str, str | None]) -> dict[str, Any]:
    """`prepare` on each proof with `statements[file]`; a proof without a statement is counted apart."""
    reasons, rules, refused, accepted, missing, dropped = collections.Counter(), collections.Counter(), [], 0, [], []
    for proof in proofs:
        statement = statements.get(proof.file)
        if statement is None:
            missing.append(proof.file)
            continue
        result = prepare(proof.text, statement)
        if isinstance(result, str):
            accepted += 1
            if _declarations(result) < _declarations(proof.text):
                dropped.append({"release": proof.release, "file": proof.file})
            continue
        reasons[result.reason] += 1
        rules[_rule(result)] += 1
        refused.append(
            {
                "release": proof.release,
                "file": proof.file,
                "reason": result.reason,
                "detail": result.detail,
                "policy": policy(result),
            }
        )
    return {
        "total": len(proofs) - len(missing),
        "accepted": accepted,
        "refused": sum(reasons.values()),
        "refused_by_reason": dict(reasons.most_common()),
        "refused_by_rule": dict(rules.most_common()),
        "refused_valid": sum(r["policy"] is None for r in refused),
        "without_statement": missing,
        "accepted_without_their_declarations": dropped,
        "refused_proofs": refused,
    }


def _declarations(text: str) -> int:
    """How many `theorem`/`lemma` declarations a text makes (as code: not in comments or strings). An accepted
    proof whose checked command makes fewer than its file lost helpers it uses: Lean then fails it."""
    return sum(t.kind == "ident" and t.text in ("theorem", "lemma") for t in code_tokens(text))


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
            r: {**KNOWN_RELEASES.get(r, {}), "proofs": sum(p.release == r for p in proofs)} for r in sorted(releases)
        },
        "own_statement": scan(proofs, {p.file: own_statement(p.text, p.name) for p in proofs}),
        "dataset_statement": scan(proofs, {p.file: dataset.get(p.name) for p in proofs}),
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
