"""Every `__all__` in the package lists each name once, only names that exist, and only public ones (a dunder such
as `__version__` is public).

Modules that set `__all__` are found by reading the source (`ast`), then imported to check what they export.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[1] / "src"


def sets_all(path: Path) -> bool:
    """Whether the module assigns `__all__` at its top level."""
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
            return True
    return False


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SOURCE).with_suffix("").parts).removesuffix(".__init__")


EXPORTING = sorted(module_name(path) for path in (SOURCE / "canvasread").rglob("*.py") if sets_all(path))


def test_the_public_face_exports() -> None:
    assert "canvasread" in EXPORTING


@pytest.mark.parametrize("name", EXPORTING)
def test_all_lists_existing_public_names_once(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{name}.__all__ lists a name twice"
    private = [n for n in exported if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))]
    assert private == [], f"{name}.__all__ lists private names"
    assert [n for n in exported if not hasattr(module, n)] == [], f"{name}.__all__ lists names it lacks"
