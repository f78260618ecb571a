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


def module_level_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """The imports a module makes outside its functions: at the top, and inside top-level `if` (TYPE_CHECKING
    included: a circle of type-only imports is still two modules that need each other) and `try` blocks."""
    found, nodes = [], list(getattr(tree, "body", []))
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If | ast.Try):
            nodes += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            nodes += [n for h in getattr(node, "handlers", []) for n in h.body]
        else:
            found += imports(ast.Module(body=[node], type_ignores=[]), top_level_only=True)
    return found


def cycles(files: list[Path]) -> list[list[str]]:
    """Circles of module-level imports (module_level_imports)."""
    known = {module_name(p): p for p in files}
    graph = {
        m: {n for _, n in module_level_imports(ast.parse(p.read_text())) if n in known and n != m}
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


# ops/ is four rooms (ops/__init__.py says which holds what): a room imports no other room; ops/cli.py and the
# `python -m ops.X` entry modules are the doors into them.
OPS_ROOMS = ("views", "bench", "gpu", "deploy")


def room_violations(files: list[Path]) -> list[str]:
    bad = []
    for path in files:
        parts = path.relative_to(ROOT).parts
        if parts[0] != "ops" or len(parts) < 3 or parts[1] not in OPS_ROOMS:
            continue
        for line, name in imports(ast.parse(path.read_text()), top_level_only=False):
            package, *rest = name.split(".")
            if package == "ops" and rest and rest[0] in OPS_ROOMS and rest[0] != parts[1]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return sorted(set(bad))


def reaches_into_tests(files: list[Path]) -> list[str]:
    """Where the product imports the test tree, or names it as a module or folder to run or read."""
    bad = []
    for path in files:
        tree = ast.parse(path.read_text())
        for line, name in imports(tree, top_level_only=False):
            if name.split(".")[0] == "tests":
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
            if text == "tests" or text.startswith(("tests.", "tests/")) and " " not in text:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} names {node.value!r}")
    return sorted(set(bad))


def test_every_import_goes_down_the_layers_or_stays_in_its_role():
    assert violations(sources()) == []


def test_no_module_imports_itself_in_a_circle():
    assert cycles(sources()) == []


def test_the_rooms_of_ops_import_no_other_room():
    assert room_violations(sources()) == []


def test_nothing_outside_the_tests_imports_or_runs_them():
    assert reaches_into_tests(sources()) == []


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


def test_the_checks_see_a_type_only_circle_a_room_reaching_into_another_and_the_product_running_tests(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for folder in ("trainer", "ops/views", "ops/bench"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "trainer" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import trainer.b\n"
    )
    (tmp_path / "trainer" / "b.py").write_text("import trainer.a\n")
    (tmp_path / "ops" / "views" / "v.py").write_text("def f():\n    from ops.bench import common\n")
    (tmp_path / "ops" / "bench" / "b.py").write_text(
        "import subprocess\nsubprocess.run(['python', '-m', 'tests.trainer.job'])\nfrom ops.bench import c\n"
    )
    files = sorted(tmp_path.rglob("*.py"))
    assert cycles(files) == [["trainer.a", "trainer.b", "trainer.a"]]
    assert room_violations(files) == ["ops/views/v.py:2 imports ops.bench", "ops/views/v.py:2 imports ops.bench.common"]
    assert reaches_into_tests(files) == ["ops/bench/b.py:2 names 'tests.trainer.job'"]
