"""The vLLM stand-in over the wide tiny checkpoint, and a proxy over it, for the proxy's test modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_proxy import close, proxy_for
from vllm_standin import Standin, load_standin, running

from canvasread.decide import Decider


@pytest.fixture(scope="module")
def wide_standin(tiny_wide_checkpoint: Path) -> Iterator[tuple[str, Standin]]:
    served = load_standin(str(tiny_wide_checkpoint), served_name="dgemma")
    with running(served) as base:
        yield base, served


@pytest.fixture(scope="module")
def wide_proxy(wide_standin: tuple[str, Standin], tiny_wide_checkpoint: Path) -> Iterator[Decider]:
    decider = proxy_for(wide_standin[0], tiny_wide_checkpoint)
    yield decider
    close(decider)
