"""The suite runs from a fresh clone: nothing under src/ or tests/ may reach outside the repository for data."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A path to the folder beside the checkout, written out or built from parts (`... / "shared" / ...`).
OUTSIDE = re.compile(r"\.\./shared|/work/shared|[\"']shared[\"']")


def test_nothing_refers_to_the_shared_folder() -> None:
    offenders = []
    for folder in ("src", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            text = path.read_bytes().decode("utf-8", errors="ignore")
            if path != Path(__file__).resolve():
                offenders += [f"{path.relative_to(ROOT)}: {match}" for match in OUTSIDE.findall(text)]
    assert offenders == []
