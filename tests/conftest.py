from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from serving import serve_cli


@pytest.fixture(scope="session")
def sparrow_server() -> Iterator[str]:
    """The embedded default served exactly as the README starts it."""
    with serve_cli() as base:
        yield base
