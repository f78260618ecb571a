"""The layers of docs/ARCHITECTURE.md, checked on the source: every import of every module (top-level or inside a
function) goes down the layers or stays inside its own role, and no two modules import each other in a circle."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# package -> (layer, role). A package may import its own role and any lower layer, nothing else.
LAYERS = {
    "streams": (0, "streams"),
    "tasks": (1, "tasks"),
    "weights": (1, "weights"),
    "producers": (2, "generator"),
    "consumers": (2, "verifier"),
    "verifier_pool": (2, "verifier"),
    "workers": (2, "verifier"),
    "trainer": (2, "trainer"),
    "evals": (3, "evals"),
    "ops": (3, "ops"),
}


def sources() -> list[Path]:
    files = [ROOT / "workers.py"]
    for package in LAYERS:
        if (ROOT / package).is_dir():
            files += [p for p in (ROOT / package).rglob("*.py") if "images" not in p.parts]
    return files


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.AST, top_level_only: bool) -> list[tuple[int, str]]:
    nodes = getattr(tree, "body", []) if top_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def allowed(importer: str, imported: str) -> bool:
    (low, role), (high, other) = LAYERS[importer], LAYERS[imported]
    return high < low or role == other


def violations(files: list[Path]) -> list[str]:
    bad = []
    for path in files:
        importer = module_name(path).split(".")[0]
        for line, name in imports(ast.parse(path.read_text()), top_level_only=False):
            package = name.split(".")[0]
            if package in LAYERS and not allowed(importer, package):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return sorted(set(bad))


def cycles(files: list[Path]) -> list[list[str]]:
    """Circles of module-level imports (what runs at import time; TYPE_CHECKING blocks are not module level)."""
    known = {module_name(p): p for p in files}
    graph = {
        m: {n for _, n in imports(ast.parse(p.read_text()), top_level_only=True) if n in known and n != m}
        for m, p in known.items()
    }
    found, state, stack = [], {}, []

    def visit(m: str) -> None:
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                found.append(stack[stack.index(n) :] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def test_every_import_goes_down_the_layers_or_stays_in_its_role():
    assert violations(sources()) == []


def test_no_module_imports_itself_in_a_circle():
    assert cycles(sources()) == []


def test_the_check_sees_a_role_importing_another_and_a_circle(tmp_path, monkeypatch):
    """The checks above are not vacuous: a trainer module importing the generator, and two modules importing
    each other, are found."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "a.py").write_text("from producers.engine import Sampling\nfrom trainer import b\n")
    (tmp_path / "trainer" / "b.py").write_text("import trainer.a\n\n\ndef f():\n    from streams import keys\n")
    files = [tmp_path / "trainer" / "a.py", tmp_path / "trainer" / "b.py"]
    assert violations(files) == [
        "trainer/a.py:1 imports producers.engine",
        "trainer/a.py:1 imports producers.engine.Sampling",
    ]
    assert cycles(files) == [["trainer.a", "trainer.b", "trainer.a"]]
