"""Banking77 as yes/no decisions: "Is this message about <intent>?", half of them true.

Measures a model's `noul` on a public, labelled set (Banking77, Casanueva et
al. 2020, PolyAI, CC BY 4.0). Within each intent, rows alternate in file order
between a true question (the row's own intent) and a false one (another
intent drawn by a seeded generator), so the set is balanced overall and per
intent, and the same command always writes the same file.

    python bench/banking77_yesno.py BANKING77_FOLDER bench/data/banking77-yesno-test.jsonl
    canvasread eval bench/data/banking77-yesno-test.jsonl --out bench/results/sparrow-noul
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from pathlib import Path
from typing import Any

INSTRUCTIONS = "Is this banking customer's message about {intent}?"


def yes_no_lines(folder: Path, split: str, per_intent: int, seed: int) -> list[dict[str, Any]]:
    """One decision per kept row: the first `per_intent` rows of each intent, alternating true and false."""
    categories: list[str] = json.loads((folder / "categories.json").read_text())
    rng = random.Random(seed)
    taken = dict.fromkeys(categories, 0)
    lines = []
    with (folder / f"{split}.csv").open(newline="") as handle:
        for number, row in enumerate(csv.DictReader(handle), 1):
            intent = row["category"]
            if taken[intent] >= per_intent:
                continue
            truth = taken[intent] % 2 == 0
            taken[intent] += 1
            asked = intent if truth else rng.choice([c for c in categories if c != intent])
            lines.append(
                {
                    "id": f"banking77-{split}-{number}-yesno",
                    "state": row["text"],
                    "question": {"type": "noul", "instructions": INSTRUCTIONS.format(intent=asked.replace("_", " "))},
                    "expected": "true" if truth else "false",
                }
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="folder with Banking77's categories.json and {split}.csv")
    parser.add_argument("out", type=Path, help="JSONL file to write")
    parser.add_argument("--split", default="test")
    parser.add_argument("--per-intent", type=int, default=8, help="rows kept per intent (even keeps it balanced)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the false questions' intents")
    args = parser.parse_args()
    lines = yes_no_lines(args.source, args.split, args.per_intent, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as out:
        for line in lines:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
    true = sum(line["expected"] == "true" for line in lines)
    print(f"wrote {len(lines)} decisions ({true} true, {len(lines) - true} false) to {args.out}")


if __name__ == "__main__":
    main()
