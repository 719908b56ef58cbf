"""`canvasread banking77`: turn the Banking77 CSVs into eval JSONL (one 77-way choice per message)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from canvasread.cli.errors import console

Out = Annotated[Path, typer.Argument(metavar="OUT", help="JSONL file to write.")]
Source = Annotated[
    Path,
    typer.Option(
        metavar="DIR",
        help="Folder with the Banking77 CSVs (train.csv, test.csv) and categories.json, as PolyAI publish them.",
    ),
]
Split = Annotated[str, typer.Option(metavar="SPLIT", help="train or test.")]
PerIntent = Annotated[int | None, typer.Option(metavar="N", help="Keep the first N rows of each intent.")]


def banking77(out: Out, source: Source, split: Split = "test", per_intent: PerIntent = None) -> None:
    """Convert Banking77 to eval JSONL: one 77-way choice per message."""
    from canvasread.eval.dataset import BANKING77_CITATION, write_jsonl
    from canvasread.eval.dataset import banking77 as convert

    lines = convert(source, split, per_intent)
    write_jsonl(lines, out)
    console.print(f"wrote {len(lines)} decisions to {out}. Data: {BANKING77_CITATION}.")
