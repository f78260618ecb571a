"""The Lean image against its pinned sources (ops/deploy/images/lean/PINNED.md), checked here without a network
or a Lean toolchain: the table names every Lean name audit/Main.lean uses, each line it cites holds the name,
the Dockerfile's pins are the table's, and check_pins.sh runs before anything else reaches GitHub and prints
one line naming a missing artifact (shown against local repositories standing in for GitHub)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEAN = ROOT / "ops" / "deploy" / "images" / "lean"
PINNED = (LEAN / "PINNED.md").read_text()
MAIN = (LEAN / "audit" / "Main.lean").read_text()
DOCKERFILE = (LEAN / "Dockerfile").read_text()
LAKEFILE = (LEAN / "audit" / "lakefile.toml").read_text()
VERIFIER_DOC = (ROOT / "docs" / "VERIFIER.md").read_text()
STATUSES = ("ok", "fixed", "only known by compiling")
REPOS = ("leanprover/lean4", "leanprover-community/mathlib4", "leanprover-community/repl", "leanprover/lean4checker")
IDENT = r"[A-Za-z_][A-Za-z0-9_']*[?!]?"
# Lean functions Main.lean calls by their bare names (no namespace, no dot): a list, since a bare lowercase word
# cannot be told from a local by reading; the test below checks each is still called.
BARE_CALLS = (
    "processHeader",
    "readModuleData",
    "collectAxioms",
    "initSearchPath",
    "findSysroot",
    "enableInitializersExecution",
    "unsafeCast",
)


def lean_code(text: str) -> str:
    """Main.lean without comments, string literals (the code of their `{...}` interpolations kept) and name
    literals."""
    text = re.sub(r"/-.*?-/", " ", text, flags=re.S)
    text = re.sub(r"--[^\n]*", "", text)

    def interpolations(m: re.Match) -> str:
        return " ".join(re.findall(r"\{([^{}]*)\}", m.group(0))) if m.group(0).startswith("s!") else '""'

    text = re.sub(r's!"(?:\\.|[^"\\])*"|"(?:\\.|[^"\\])*"', interpolations, text)
    return re.sub(r"`[A-Za-z_][\w.]*", "", text)


def own_names(code: str) -> set[str]:
    """What Main.lean itself declares: its definitions and the request's fields."""
    names = set(re.findall(r"^(?:unsafe |partial )*(?:def|abbrev|structure|namespace) +(\w+)", code, re.M))
    fields = re.search(r"structure AuditRequest where\n((?:  .*\n)+)", code)
    assert fields, "AuditRequest moved: this test reads its fields"
    return names | set(re.findall(r"^  (\w+) :", fields.group(1), re.M))


def used_names(code: str) -> set[str]:
    """The Lean names Main.lean's code uses: dotted names under a capitalised namespace, capitalised names,
    `.field`/`.method` after an expression or leading a constructor, and the bare calls above."""
    own = own_names(code)
    dotted = {n for n in re.findall(rf"(?<![\w.])([A-Z]\w*(?:\.{IDENT})+)", code) if n.split(".")[0] not in own}
    capitals = {n for n in re.findall(r"(?<![\w.])([A-Z][A-Za-z0-9_]*)\b(?!\.)", code) if n not in own}
    methods = {f".{n}" for n in re.findall(rf"(?<=[\w)\]!?\"·])\.({IDENT})", code) if n not in own}
    leading = {f".{n}" for n in re.findall(rf"(?<![\w)\]!?\"·.])\.({IDENT})", code)}
    namespace_parts = {f".{p}" for n in dotted for p in n.split(".")[1:]}
    return dotted | capitals | ((methods | leading) - namespace_parts) | {n for n in BARE_CALLS if n in code}


def table_rows() -> list[list[str]]:
    """The rows of the name tables (each: name, ours, pinned source, status), from `## audit/Main.lean` on."""
    rows = []
    for line in PINNED[PINNED.index("## audit/Main.lean") : PINNED.index("## Counts")].splitlines():
        if line.startswith("| ") and not line.startswith(("| name ", "|---")):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            assert len(cells) == 4, line
            rows.append(cells)
    return rows


def tokens(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def covered(name: str, table_tokens: set[str]) -> bool:
    if name.startswith("."):
        return any(t == name or t.endswith(name) for t in table_tokens)
    return any(t == name or t.startswith(f"{name}.") or t.startswith(f"{name} ") for t in table_tokens)


def test_the_table_names_every_lean_name_the_audit_program_uses():
    table_tokens = {t for row in table_rows() for t in tokens(row[0])}
    used = used_names(lean_code(MAIN))
    assert {"Parser.parseHeader", "IO.processCommands", ".replay'", "collectAxioms", ".find?", "MonadEnv"} <= used
    assert sorted(n for n in used if not covered(n, table_tokens)) == []


def test_the_name_reader_sees_a_name_added_to_the_program():
    """The check above is not vacuous: a new Lean call, method or type in Main.lean is missing from the table."""
    extra = '\ndef extra : IO Unit := do\n  let e ← Lean.Elab.newThing\n  e.someField (x : NewType) "s"\n'
    code = lean_code(MAIN + extra)
    table_tokens = {t for row in table_rows() for t in tokens(row[0])}
    missing = sorted(n for n in used_names(code) if not covered(n, table_tokens))
    assert missing == [".someField", "Lean.Elab.newThing", "NewType"]


def test_every_status_is_one_of_three_and_the_counts_are_the_tables():
    statuses = [row[3] for row in table_rows()]
    kinds = [next((s for s in STATUSES if status.startswith(s)), None) for status in statuses]
    assert None not in kinds, [s for s, k in zip(statuses, kinds, strict=True) if k is None]
    counts = {s: kinds.count(s) for s in STATUSES}
    summary = re.search(
        r"(\d+) rows in the three name tables \(a row may name several\): (\d+) ok, (\d+) fixed, "
        r"(\d+) only known by compiling",
        " ".join(PINNED.split()),
    )
    assert summary, "PINNED.md's Counts sentence"
    expected = [len(kinds), counts["ok"], counts["fixed"], counts["only known by compiling"]]
    assert [int(g) for g in summary.groups()] == expected


def test_each_cited_line_of_ours_holds_the_rows_name():
    files = {
        "audit/Main.lean": MAIN,
        "audit/lakefile.toml": LAKEFILE,
        "Dockerfile": DOCKERFILE,
        "check_pins.sh": (LEAN / "check_pins.sh").read_text(),
    }
    checked = 0
    for name, ours, _, _ in table_rows():
        candidates = set()
        for token in tokens(name):
            candidates |= {token, token.split(".")[-1].strip("()"), " ".join(token.split()[:2]), *token.split()}
        candidates = {c for c in candidates if len(c) > 1}
        for file, groups in re.findall(r"([\w/.]+):((?:\d+(?:-\d+)?)(?:, \d+(?:-\d+)?)*)", ours):
            if file not in files:  # verifier_pool/: the REPL commands' rows, read by their own tests
                continue
            lines = files[file].splitlines()
            for group in groups.split(", "):
                first, _, last = group.partition("-")
                cited = lines[int(first) - 1 : int(last or first)]
                assert any(c in line for c in candidates for line in cited), (name, file, group, cited)
                checked += 1
    assert checked > 50


def test_what_only_compiling_tells_is_said_in_the_verifier_doc():
    section = VERIFIER_DOC[VERIFIER_DOC.index("### The Lean image against its pinned sources") :]
    section = section[: section.index("\n### ", 4)] if "\n### " in section[4:] else section
    assert "only known by compiling" in section
    for name, _, _, status in table_rows():
        if status.startswith("only known by compiling"):
            assert any(t in section for t in tokens(name)), name
    for part in re.findall(r"`([^`]+)`: only known by compiling", PINNED):
        assert part in section, part


def test_the_dockerfiles_pins_are_the_tables():
    pins = dict(re.findall(r"^\| `?([\w-]+)`? \| `([^`]+)` \|", PINNED, re.M))
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE, re.M))
    assert args["LEAN_VERSION"] == pins["LEAN_VERSION"]
    assert args["ELAN_VERSION"] == pins["ELAN_VERSION"]
    # mathlib4, the REPL and lean4checker are taken at the tag LEAN_VERSION: the table pins them to that value
    assert pins["mathlib4"] == pins["repl"] == pins["lean4checker"] == pins["LEAN_VERSION"]
    assert '--branch "${LEAN_VERSION}" https://github.com/leanprover-community/mathlib4.git' in DOCKERFILE
    assert '--branch "${LEAN_VERSION}" https://github.com/leanprover-community/repl.git' in DOCKERFILE
    assert 'rev = "LEAN_VERSION"' in LAKEFILE
    assert 's/^rev = \\"LEAN_VERSION\\"/rev = \\"${LEAN_VERSION}\\"/' in DOCKERFILE
    assert 'git = "https://github.com/leanprover/lean4checker"' in LAKEFILE
    assert 'elan toolchain install "leanprover/lean4:${LEAN_VERSION}"' in DOCKERFILE


def test_the_pin_check_is_the_builds_first_step_that_reaches_github():
    builder = DOCKERFILE[: DOCKERFILE.index("\n# -- runtime")]
    code = [line for line in builder.splitlines() if not line.lstrip().startswith("#")]
    first_github = next(i for i, line in enumerate(code) if "github.com" in line or "lake " in line)
    check = next(i for i, line in enumerate(code) if "check_pins.sh" in line and line.startswith("RUN "))
    assert check < first_github
    assert 'RUN sh /usr/local/bin/check_pins.sh "${LEAN_VERSION}" "${ELAN_VERSION}"' in code
    script = (LEAN / "check_pins.sh").read_text()
    # it checks the repositories the build clones and requires, and the asset it downloads
    for repo in REPOS:
        assert f"\ntag {repo}\n" in script
    asset = re.search(r"releases/download/\$\{ELAN_VERSION\}/([\w.-]+)", DOCKERFILE).group(1)
    assert f"ELAN_ASSET={asset}\n" in script


# --- check_pins.sh against local stand-ins for GitHub --------------------------------------------------------

needs_tools = pytest.mark.skipif(not (shutil.which("git") and shutil.which("curl")), reason="needs git and curl")


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def github(tmp_path) -> Path:
    """Bare repositories with the tag v4.28.0 (lean4checker: only v4.27.0) and elan's asset for v4.2.3."""
    root = tmp_path
    work = root / "work"
    work.mkdir()
    _git("init", "-q", cwd=work)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x", cwd=work)
    for repo in REPOS:
        (root / "git" / repo).parent.mkdir(parents=True, exist_ok=True)
        _git("init", "-q", "--bare", str(root / "git" / f"{repo}.git"), cwd=root)
        tag = "v4.27.0" if repo.endswith("lean4checker") else "v4.28.0"
        _git("push", "-q", str(root / "git" / f"{repo}.git"), f"HEAD:refs/tags/{tag}", cwd=work)
    (root / "releases" / "v4.2.3").mkdir(parents=True)
    (root / "releases" / "v4.2.3" / "elan-x86_64-unknown-linux-gnu.tar.gz").write_bytes(b"\x1f\x8b")
    return root


def check_pins(github: Path, lean: str, elan: str, git_base: str | None = None) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(github),
        "GIT_BASE": git_base or f"file://{github}/git",
        "ELAN_RELEASES": f"file://{github}/releases",
    }
    return subprocess.run(["sh", str(LEAN / "check_pins.sh"), lean, elan], env=env, capture_output=True, text=True)


@needs_tools
def test_a_missing_tag_ends_the_check_with_one_line_naming_it(github):
    result = check_pins(github, "v4.28.0", "v4.2.3")
    assert (result.returncode, result.stdout, result.stderr) == (
        1,
        "",
        "pinned artifact missing: leanprover/lean4checker tag v4.28.0\n",
    )
    result = check_pins(github, "v4.27.0", "v4.2.3")  # the first repository checked lacks it
    assert result.stderr == "pinned artifact missing: leanprover/lean4 tag v4.27.0\n"


@needs_tools
def test_a_missing_elan_asset_is_named_and_all_present_passes(github):
    lean4checker = str(github / "git" / "leanprover/lean4checker.git")
    _git("push", "-q", lean4checker, "HEAD:refs/tags/v4.28.0", cwd=github / "work")
    result = check_pins(github, "v4.28.0", "v4.2.4")
    assert (result.returncode, result.stderr) == (
        1,
        "pinned artifact missing: leanprover/elan release v4.2.4 asset elan-x86_64-unknown-linux-gnu.tar.gz\n",
    )
    result = check_pins(github, "v4.28.0", "v4.2.3")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("pinned artifacts present:")


@needs_tools
def test_a_host_it_cannot_ask_is_not_called_a_missing_pin(github):
    result = check_pins(github, "v4.28.0", "v4.2.3", git_base=f"file://{github}/nowhere")
    assert result.returncode == 2
    assert result.stderr.startswith("cannot check pinned artifact leanprover/lean4 tag v4.28.0: git ls-remote")
    assert "missing" not in result.stderr
