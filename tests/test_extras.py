"""The transformers floor the code checks is the one pyproject declares, and an older release is refused."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from canvasread import extras
from canvasread.catalog import backends_for
from canvasread.errors import MissingExtra

PYPROJECT = Path(__file__).parents[1] / "pyproject.toml"


def test_every_extra_declares_the_floor_the_code_checks() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    floors = {
        extra: match.group(1)
        for extra, requirements in declared.items()
        for requirement in requirements
        if (match := re.fullmatch(r"transformers>=([\d.]+)", requirement))
    }
    assert set(floors) == {"diffusion", "upstream"}
    assert set(floors.values()) == {".".join(map(str, extras.TRANSFORMERS_FLOOR))}


def test_the_installed_transformers_meets_the_floor() -> None:
    extras.require(("transformers",), "these tests", "diffusion")


@pytest.mark.parametrize("version", ["5.22.0", "5.23.1", "4.57.6"])
def test_an_older_transformers_is_refused_before_loading_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    real = extras.installed_version
    monkeypatch.setattr(extras, "installed_version", lambda name: version if name == "transformers" else real(name))
    with pytest.raises(MissingExtra) as refused:
        backends_for("org/diffusiongemma")
    assert f"transformers >= 5.24 (its cache= API), not {version}" in refused.value.message
    assert "pip install 'canvasread[diffusion]'" in refused.value.message


def test_a_release_candidate_of_the_floor_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    real = extras.installed_version
    monkeypatch.setattr(extras, "installed_version", lambda name: "5.24.0rc1" if name == "transformers" else real(name))
    extras.require(("torch", "transformers"), "serving", "diffusion")
