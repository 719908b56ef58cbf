"""What reading a long state in windows would do to the embedded model's answers (issue 26, truncation).

The embedded model mean-pools the first 512 tokens of a state. Reading a longer state whole means reading it
in windows and combining their readings; this measures candidate rules on a decisive sentence after filler:

- `first 512`: what the model reads today (and what canvasread serves, with a warning past 512 tokens);
- `all pooled`: every token in one mean (512-token windows combined by their token-weighted mean vector);
- `512 mean`: 512-token windows read one by one, their probabilities averaged by tokens;
- `512 surest`: the 512-token window whose answer is most confident;
- `32 surest`: the same over 32-token windows, a different model in effect (it never saw such short reads);
  its `filler alone` rows show what it finds in text that says nothing, and the last table what it does to
  the labelled sets of `bench/results/sparrow-README.md`, whose states are short.

    python bench/sparrow_windows.py > bench/results/sparrow-windows.md
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from sparrow_decider import Decider
from sparrow_decider.static import _content

from canvasread.answers import confidence
from canvasread.backends.sparrow_static import PooledState, StaticReader

FILLER = (
    "The quarterly newsletter covers the office move, the new coffee machine on the third floor, "
    "the summer picnic schedule, parking changes and a reminder to update your contact details. "
)
DECISIVE = "I was charged twice for order 1182. I want my money back!"
# The README's example questions, each with the answer the decisive sentence gives when read alone.
QUESTIONS = {
    "team = billing": (
        {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {
                "billing": "charges, refunds",
                "technical": "bugs, outages",
                "shipping": "deliveries, tracking",
            },
        },
        0,
    ),
    "tone = negative": (
        {
            "type": "score",
            "instructions": "How positive is the customer?",
            "criteria": ["negative", "neutral", "positive"],
        },
        0,
    ),
}
REPEATS = (0, 2, 10, 20, 40, 100)
LABELLED = ("routing-tickets", "routing-tickets-json", "review-sentiment", "anger-tickets", "banking77-yesno-test")
DATA = Path(__file__).parent / "data"

Read = Callable[[Sequence[int]], np.ndarray]


def rules(read: Read) -> dict[str, Callable[[list[int]], np.ndarray]]:
    def windows(ids: list[int], width: int) -> list[list[int]]:
        return [ids[i : i + width] for i in range(0, len(ids), width)] or [[]]

    def mean(ids: list[int], width: int) -> np.ndarray:
        parts = windows(ids, width)
        averaged: np.ndarray = np.average([read(part) for part in parts], axis=0, weights=[len(p) for p in parts])
        return averaged

    def surest(ids: list[int], width: int) -> np.ndarray:
        return max((read(part) for part in windows(ids, width)), key=lambda p: confidence(list(p)))

    return {
        "first 512": lambda ids: read(ids[:512]),
        "all pooled": lambda ids: read(ids),
        "512 mean": lambda ids: mean(ids, 512),
        "512 surest": lambda ids: surest(ids, 512),
        "32 surest": lambda ids: surest(ids, 32),
    }


def reader_for(reader: StaticReader, question: dict[str, object]) -> Read:
    """A read of `question` against any run of state tokens (no key-value pairs: the filler has no numbers)."""
    [pooled] = reader.pool_request("", [question], 10**9).questions

    def read(ids: Sequence[int]) -> np.ndarray:
        vector = reader.model.emb[list(ids) or [0]].mean(0)
        return reader.probabilities(PooledState(vector, None, None), pooled)

    return read


def decisive_tables(reader: StaticReader) -> None:
    tokenizer = reader.model.tok
    for title, (question, expected) in QUESTIONS.items():
        by_rule = rules(reader_for(reader, question))
        print(f"## {title}\n")
        print("| state | tokens | " + " | ".join(by_rule) + " |")
        print("|---|---:|" + "---:|" * len(by_rule))
        for repeats in REPEATS:
            for label, text in (("decisive", FILLER * repeats + DECISIVE), ("filler alone", FILLER * repeats)):
                if not text:
                    continue
                ids = tokenizer.encode(text.strip(), 10**9)
                cells = " | ".join(f"{rule(ids)[expected]:.2f}" for rule in by_rule.values())
                print(f"| {label}, N = {repeats} | {len(ids)} | {cells} |")
        print()


def labelled_table(reader: StaticReader) -> None:
    """Accuracy on the labelled sets (states without key-value pairs read as the model reads them)."""
    print("## The labelled sets, read today and by 32-token windows\n")
    print("| set | n | first 512 | 32 surest |")
    print("|---|---:|---:|---:|")
    for name in LABELLED:
        lines = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines() if line]
        right = {"first 512": 0, "32 surest": 0}
        for line in lines:
            question = line["question"]
            by_rule = rules(reader_for(reader, question))
            names = list(question.get("criteria") or {}) if question["type"] == "choice" else None
            ids = reader.model.tok.encode(_content(line["state"]), 10**9)
            for rule in right:
                probabilities = by_rule[rule](ids)
                if question["type"] == "noul":  # sparrow's noul options are (false, true)
                    answer = "true" if probabilities[1] > probabilities[0] else "false"
                elif names is not None:
                    answer = names[int(np.argmax(probabilities))]
                else:
                    answer = str(int(np.argmax(probabilities)))
                right[rule] += answer == str(line["expected"]).lower()
        print(f"| `{name}` | {len(lines)} | " + " | ".join(f"{right[r] / len(lines):.3f}" for r in right) + " |")


def main() -> None:
    reader = StaticReader(Decider.load().static)
    sentence = len(reader.model.tok.encode(FILLER, 10**6))
    print("# Windows on the embedded model: a decisive sentence after filler\n")
    print("`python bench/sparrow_windows.py` (sparrow-nano-general-v1.1). Each cell is the probability of the answer")
    print(f"the decisive sentence gives alone (`{DECISIVE}`), after N copies of a")
    print(f"{sentence}-token filler sentence; `filler alone` rows have no decisive sentence.\n")
    decisive_tables(reader)
    labelled_table(reader)


if __name__ == "__main__":
    main()
