"""Labelled decisions for `canvasread eval` and `calibrate`: the JSONL format, and the Banking77 converter.

One JSON object per line:
`{"id": ..., "state": <string|object|array>, "question": {"type": ..., ...}, "expected": <label>}`
where `expected` is an option label (choice), `"true"`/`"false"` (noul) or a
level index (score). Questions are validated by the same wire code as the
API, so a file that loads here asks the server nothing it would refuse.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canvasread.errors import InvalidRequest
from canvasread.types import JSONValue
from canvasread.wire import parse_request

BANKING77_INSTRUCTIONS = "Which intent does this banking customer's message express?"
BANKING77_CITATION = (
    "Banking77 (Casanueva et al. 2020, 'Efficient Intent Detection with Dual Sentence Encoders'), PolyAI, CC BY 4.0"
)


@dataclass(frozen=True)
class EvalItem:
    """One labelled decision; `options` are the question's option names in the order it lists them."""

    id: str
    state: JSONValue
    question: dict[str, Any]
    expected: str
    kind: str
    options: tuple[str, ...]

    @property
    def expected_index(self) -> int:
        return self.options.index(self.expected)


def parse_item(line: dict[str, Any], where: str) -> EvalItem:
    """Validate one decoded line; errors name `where` (file:line) and the field."""
    missing = [key for key in ("id", "state", "question", "expected") if key not in line]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    try:
        _, request = parse_request({"model": "-", "state": line["state"], "questions": {"q": line["question"]}})
    except InvalidRequest as error:
        raise ValueError(f"{where}: {error.message}") from None
    [question] = request.questions
    expected = line["expected"]
    label = str(expected).lower() if isinstance(expected, bool) else str(expected)
    if label not in question.option_names:
        raise ValueError(f"{where}: expected {expected!r} is not one of {', '.join(question.option_names)}")
    return EvalItem(str(line["id"]), line["state"], line["question"], label, question.kind, question.option_names)


def _decoded(text: str, where: str) -> dict[str, Any]:
    """One line's JSON object; errors name `where` (file:line), as `parse_item`'s do."""
    try:
        line = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(line, dict):
        raise ValueError(f"{where}: not a JSON object")
    return line


def load_items(path: Path, limit: int | None = None) -> list[EvalItem]:
    """Read and validate a JSONL file (blank lines skipped); ids must be unique."""
    items: list[EvalItem] = []
    with path.open() as lines:
        for number, text in enumerate(lines, 1):
            if limit is not None and len(items) >= limit:
                break
            if text.strip():
                where = f"{path}:{number}"
                items.append(parse_item(_decoded(text, where), where))
    if not items:
        raise ValueError(f"{path} holds no decisions")
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: ids must be unique")
    return items


def write_jsonl(lines: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for line in lines:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")


def banking77(folder: Path, split: str, per_intent: int | None = None) -> list[dict[str, Any]]:
    """Banking77's `{split}.csv` as 77-way choice decisions, options in `categories.json` order.

    Option descriptions spell the intent with spaces (`card_arrival` → "card
    arrival") so a model reads words, not identifiers. `per_intent` keeps the
    first N rows of each intent in file order: a balanced subset that needs no
    random seed.
    """
    categories: list[str] = json.loads((folder / "categories.json").read_text())
    question = {
        "type": "choice",
        "instructions": BANKING77_INSTRUCTIONS,
        "criteria": {category: category.replace("_", " ") for category in categories},
    }
    taken = dict.fromkeys(categories, 0)
    lines = []
    for number, row in _rows(folder / f"{split}.csv"):
        category = row["category"]
        if category not in taken:
            raise ValueError(f"{folder / split}.csv row {number}: unknown intent {category!r}")
        if per_intent is not None and taken[category] >= per_intent:
            continue
        taken[category] += 1
        lines.append(
            {"id": f"banking77-{split}-{number}", "state": row["text"], "question": question, "expected": category}
        )
    return lines


def _rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """Data rows numbered from 1 (the header is row 0)."""
    with path.open(newline="") as handle:
        yield from enumerate(csv.DictReader(handle), 1)
