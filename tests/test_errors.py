"""The `error_type` vocabulary: every error a response can carry is listed in the README, hosted names first."""

from __future__ import annotations

import re
from pathlib import Path

import canvasread.upstream.pool  # noqa: F401  (defines the upstream errors)
from canvasread.errors import (
    CalibrationMismatch,
    CanvasreadError,
    InvalidRequest,
    MissingExtra,
    ModelNotFound,
    Unauthorized,
)
from canvasread.tools.checkpoints import TokenizerUnavailable

README = Path(__file__).parents[1] / "README.md"
# Not in an error body: a 422 is FastAPI's list; the next two stop `serve` before it binds, and the last one
# stops `canvasread tiny-checkpoint` (imported here so the set does not depend on what other tests imported).
NEVER_IN_A_BODY = {InvalidRequest, MissingExtra, CalibrationMismatch, TokenizerUnavailable}


def subclasses(cls: type[CanvasreadError]) -> set[type[CanvasreadError]]:
    found = set(cls.__subclasses__())
    return found.union(*(subclasses(sub) for sub in found))


def test_the_hosted_names_for_unknown_models_and_keys() -> None:
    assert (ModelNotFound.status_code, ModelNotFound.error_type) == (400, "api_usage_error")
    assert (Unauthorized.status_code, Unauthorized.error_type) == (401, "authentication_error")


def test_the_readme_lists_every_error_type_a_response_can_carry() -> None:
    section = README.read_text().split("**Errors.**", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| \d{3} \| (.+?) \|", section, re.M))
    documented = {name for cell in listed for name in re.findall(r"`([a-z_]+)`", cell)}
    served = {cls.error_type for cls in subclasses(CanvasreadError) | {CanvasreadError} if cls not in NEVER_IN_A_BODY}
    assert documented == served


def test_no_module_outside_the_http_layer_writes_body_into_a_location() -> None:
    """Field paths start inside the request; `server/` alone puts "body" before them."""
    package = Path(__file__).parents[1] / "src" / "canvasread"
    writers = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "server" not in path.relative_to(package).parts and re.search(r"\(\s*\"body\",", path.read_text())
    ]
    assert writers == []
