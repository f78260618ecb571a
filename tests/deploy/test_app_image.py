"""The app image converts the default model in a layer of its own, from a copy of weights/model.py and the
modules it imports, so that editing other source keeps that layer (ops/deploy/images/app/Dockerfile). The copy
must hold every module of ours that the conversion imports, or the image does not build."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "ops" / "deploy" / "images" / "app" / "Dockerfile"


def ours_imported(module: str, seen: set[str]) -> set[str]:
    """The files (relative paths) of our modules `module` imports at load time, transitively, itself included."""
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    rel = str(path.relative_to(ROOT))
    if rel in seen:
        return seen
    seen.add(rel)
    if path.name != "__init__.py":
        package_init = path.parent / "__init__.py"
        seen.add(str(package_init.relative_to(ROOT)))
    for node in ast.parse(path.read_text()).body:  # module level only: the conversion runs no function's imports
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            top = name.split(".")[0]
            if top in ("streams", "tasks", "weights"):
                candidate = ROOT / (name.replace(".", "/") + ".py")
                if candidate.exists() or (ROOT / name.replace(".", "/") / "__init__.py").exists():
                    ours_imported(name, seen)
    return seen


def test_the_model_layer_copies_every_module_the_conversion_imports():
    copied = set()
    for line in DOCKERFILE.read_text().splitlines():
        if m := re.match(r"COPY (src/\S+(?: src/\S+)*) /opt/proofstream/", line):
            copied |= {p.removeprefix("src/") for p in m.group(1).split()}
    needed = ours_imported("weights.model", set())
    assert "streams/files.py" in needed  # the walk follows `from streams import files`
    assert needed <= copied, f"ops/deploy/images/app/Dockerfile's model layer lacks {sorted(needed - copied)}"
