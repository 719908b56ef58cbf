from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Shared test modules import by their own names: helpers.py here, and the vLLM stand-in beside the vLLM wing's
# tests (it stands in for that wing's upstream, and runs as a script there: `python tests/canvas/vllm/vllm_standin.py`).
sys.path.insert(0, str(Path(__file__).parent / "canvas" / "vllm"))
sys.path.insert(0, str(Path(__file__).parent))

from helpers import serve_cli

from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.decide import Decider


@pytest.fixture(scope="session")
def sparrow_server() -> Iterator[str]:
    """The embedded default served exactly as the README starts it."""
    with serve_cli() as base:
        yield base


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random DiffusionGemma with the real Gemma tokenizer, written with `save_pretrained`.

    Weights are drawn with a large spread (std 0.3) so slot distributions are
    far from uniform and exactness checks have something to compare.
    """
    from canvasread.tools.checkpoints import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-diffusiongemma"), std=0.3)


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    """The real Gemma tokenizer, as every tiny checkpoint ships it (planning and labels are checked against it),
    written on its own so a test that only tokenizes builds no model."""
    from canvasread.tools.checkpoints import fetch_gemma_tokenizer

    return HFTokenizer.load(str(fetch_gemma_tokenizer(tmp_path_factory.mktemp("gemma-tokenizer"))))


@pytest.fixture(scope="session")
def tiny_server(tiny_checkpoint: Path) -> Iterator[str]:
    """`canvasread serve --model <tiny checkpoint>`, shared by the tests that talk to it over HTTP."""
    with serve_cli("--model", str(tiny_checkpoint)) as base:
        yield base


@pytest.fixture(scope="session")
def tiny_decider(tiny_checkpoint: Path) -> Decider:
    """The checkpoint loaded through the public library path (`open_decider`)."""
    from canvasread.catalog import open_decider

    return open_decider((str(tiny_checkpoint),))


@pytest.fixture(scope="session")
def tiny_wide_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with a sliding window wider than any test's prompt plus canvas.

    There vLLM's per-token symmetric window and transformers' last window−1
    prompt tokens see the same keys, so proxy answers must equal in-process ones.
    """
    from canvasread.tools.checkpoints import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-wide-diffusiongemma"), std=0.3, sliding_window=8192)


@pytest.fixture(scope="session")
def tiny_wide_decider(tiny_wide_checkpoint: Path) -> Decider:
    from canvasread.catalog import open_decider

    return open_decider((str(tiny_wide_checkpoint),))


@pytest.fixture(scope="session")
def tiny_thinking_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint for tests that generate: a 32-token canvas and 2 denoising steps in its generation config.

    A generation runs one denoising loop per canvas over the 262k vocabulary, so these keep a thought to a few
    cheap decoder passes. Its sliding window is wide, so proxy and in-process reads agree.
    """
    from canvasread.tools.checkpoints import write_tiny_checkpoint

    folder = tmp_path_factory.mktemp("tiny-thinking-diffusiongemma")
    return write_tiny_checkpoint(folder, std=0.3, sliding_window=8192, canvas_length=32, denoising_steps=2)


@pytest.fixture(scope="session")
def tiny_thinking_decider(tiny_thinking_checkpoint: Path) -> Decider:
    """The thinking checkpoint loaded through `open_decider`: its 32-token canvas keeps a blank's denoising steps
    over the 262k vocabulary an eighth of the 256-token one's cost."""
    from canvasread.catalog import open_decider

    return open_decider((str(tiny_thinking_checkpoint),))


@pytest.fixture(scope="session")
def tiny_thinking_server(tiny_thinking_checkpoint: Path) -> Iterator[str]:
    """`canvasread serve --model <tiny thinking checkpoint>`, shared by the tests that think or read spans over HTTP."""
    with serve_cli("--model", str(tiny_thinking_checkpoint)) as base:
        yield base
