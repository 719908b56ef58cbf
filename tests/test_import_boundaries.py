"""The rooms' import rules, read from the source with `ast` (nothing is imported, and an import inside a function
counts as much as one at the top): canvas/ speaks no HTTP and knows no server, canvas/ outside canvas/engine/ knows
no torch, and only the CLI (and the server itself) imports `canvasread.server`."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "src" / "canvasread"
HTTP = {"httpx", "fastapi", "starlette", "uvicorn", "h11", "httptools", "requests", "aiohttp", "urllib3", "websockets"}
# transformers itself may be imported (canvas/tokenizer.py loads its tokenizer, which runs without torch).
TORCH = {"torch", "triton", "safetensors.torch"}
SERVER = {"canvasread.server"}


def imports(source: str, place: Path) -> Iterator[tuple[int, str]]:
    """Every module `source` (a file at `place` in the package) imports, as (line, dotted name); a relative import
    is resolved against its package, and `from m import n` yields both `m` and `m.n` (`n` may be a module)."""
    package = ["canvasread", *place.relative_to(PACKAGE).parent.parts]
    for node in ast.walk(ast.parse(source, str(place))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, module
            yield from ((node.lineno, f"{module}.{alias.name}") for alias in node.names)


def breaches(paths: list[Path], forbidden: set[str]) -> list[str]:
    """`file:line imports name` for each import of a forbidden package (top-level, or a dotted prefix)."""
    found = []
    for path in paths:
        for line, name in imports(path.read_text(), path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(PACKAGE)}:{line} imports {name}")
    return found


def modules(*under: str) -> list[Path]:
    return sorted(PACKAGE.joinpath(*under).rglob("*.py"))


def test_every_form_of_import_is_seen() -> None:
    source = "import torch.nn\nfrom httpx import Client\nfrom ..server import app\n\ndef f():\n    import uvicorn\n"
    place = PACKAGE / "canvas" / "probe.py"
    assert {name for _, name in imports(source, place)} == {
        "torch.nn", "httpx", "httpx.Client", "canvasread.server", "canvasread.server.app", "uvicorn"
    }  # fmt: skip
    assert [line for line, _ in imports(source, place)] == [1, 2, 2, 3, 3, 6]


def test_canvas_speaks_no_http_and_knows_no_server() -> None:
    assert len(modules("canvas")) > 20
    assert breaches(modules("canvas"), HTTP | SERVER) == []


def test_canvas_outside_the_engine_knows_no_torch() -> None:
    outside = [path for path in modules("canvas") if "engine" not in path.relative_to(PACKAGE).parts]
    assert breaches(outside, TORCH) == []
    assert breaches(modules("canvas", "engine"), TORCH), "the engine is where torch is: the check would see it"


def test_only_the_cli_and_the_server_import_the_server() -> None:
    core = [path for path in modules() if path.relative_to(PACKAGE).parts[0] not in ("server", "cli")]
    assert breaches(core, SERVER) == []
    assert breaches(modules("cli"), SERVER), "the CLI serves: the check would see it"
