"""No module reads another module's private names (tests included): an attribute `_x` that canvasread defines is
read only inside the module that defines it (on `self`, `cls`, or another object of its own classes), and no
`_x` is imported from a canvasread module. Read from the source with `ast`; third-party private names
(transformers' `_denoising_step` that the reference loop drives) are not canvasread's, so not counted."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).parents[1]
SOURCES = sorted((ROOT / "src" / "canvasread").rglob("*.py"))
FILES = [*SOURCES, *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "bench").rglob("*.py"))]


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_here(node: ast.AST) -> list[str]:
    """The private names `node` defines on a class: a method or class attribute, or `self._x = ...`."""
    if isinstance(node, ast.ClassDef):
        members = [item.name for item in node.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)]
        assigned = [item.target for item in node.body if isinstance(item, ast.AnnAssign)]
        assigned += [target for item in node.body if isinstance(item, ast.Assign) for target in item.targets]
        return [n for n in members + [t.id for t in assigned if isinstance(t, ast.Name)] if private(n)]
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and private(node.attr):
        on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        return [node.attr] if on_self else []
    return []


def defined_private_attributes() -> dict[str, set[Path]]:
    """Each private attribute or method name canvasread (or a test) defines, and the modules that define it."""
    defined: dict[str, set[Path]] = defaultdict(set)
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            for name in defined_here(node):
                defined[name].add(path)
    return defined


def test_no_private_name_is_read_outside_its_module() -> None:
    defined = defined_private_attributes()
    assert "_runtime" in defined, "the scan sees the backend's own attributes"
    found = []
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in defined and path not in defined[node.attr]:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} reads .{node.attr}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("canvasread"):
                found += [
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name}" for a in node.names if private(a.name)
                ]
    assert found == []
