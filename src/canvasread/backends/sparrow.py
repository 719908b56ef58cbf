"""The embedded default: `sparrow-decider`, a 2 MB numpy decision model that ships inside its wheel.

It is what a fresh machine can serve with no GPU and no download. It is weak
(its authors report 122/231 on JevBench, against 189–200 for large models),
so its model card says so; serve a DiffusionGemma checkpoint for real work.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from canvasread.types import (
    Capabilities,
    DecisionRequest,
    DecisionResult,
    Distribution,
    JSONValue,
    ModelCard,
    Question,
    Usage,
)

DEFAULT_SPARROW_MODEL = "sparrow-nano-general-v1.1"
SPARROW_RELEASE_DATE = "2026-06-01"


def is_sparrow_model(name: str) -> bool:
    return name.startswith("sparrow-") or name.endswith(".sparrow")


def _text(value: JSONValue) -> str:
    """The model reads plain text; JSON values are rendered the way sparrow renders them itself."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _sparrow_question(question: Question) -> dict[str, Any]:
    """The question in sparrow's own dict form (its noul options are ordered false, true)."""
    if question.kind == "noul":
        described = {o.name: o.description for o in question.options if o.description is not None}
        return {"type": "noul", "instructions": question.instructions, "criteria": described}
    if question.kind == "choice":
        criteria = {o.name: o.description for o in question.options}
        return {"type": "choice", "instructions": question.instructions, "criteria": criteria}
    levels = [o.description for o in question.options]
    return {"type": "score", "instructions": question.instructions, "criteria": levels}


class SparrowBackend:
    """Answers each question independently on the CPU; a batch is just a loop (each read is ~0.1 ms)."""

    def __init__(self, model: str = DEFAULT_SPARROW_MODEL) -> None:
        self._model_name = model
        self._decider: Any = None
        self._card = ModelCard(
            name=model.removesuffix(".sparrow").rsplit("/", 1)[-1],
            description=(
                f"{model}: the small CPU decision model embedded in the sparrow-decider wheel (numpy, ~2 MB). "
                "Fast and offline but weak (its authors report 122/231 on JevBench); "
                "serve a DiffusionGemma checkpoint with --model for real work."
            ),
            release_date=SPARROW_RELEASE_DATE,
            capabilities=Capabilities(images=False, max_options=255, max_levels=10),
        )

    @property
    def card(self) -> ModelCard:
        return self._card

    def load(self) -> None:
        from sparrow_decider import Decider

        self._decider = Decider.load(self._model_name)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the .sparrow file (weights, tokenizer and config all live inside it); known before loading."""
        from sparrow_decider import _resolve  # the wheel's own name → file lookup (pinned version)

        return "sha256:" + hashlib.sha256(Path(_resolve(self._model_name)).read_bytes()).hexdigest()

    def prepare(self, request: DecisionRequest) -> DecisionRequest:
        return request

    def decide(self, jobs: Sequence[DecisionRequest]) -> list[DecisionResult]:
        return [self._decide_one(request) for request in jobs]

    def _decide_one(self, request: DecisionRequest) -> DecisionResult:
        distributions = []
        input_tokens = self._count_tokens(_text(request.state))
        for question in request.questions:
            distributions.append(Distribution(self._probabilities(request.state, question)))
            input_tokens += self._count_tokens(_text(question.instructions))
            input_tokens += sum(self._count_tokens(f"{o.name} {_text(o.description)}") for o in question.options)
        return DecisionResult(tuple(distributions), Usage(input_tokens, len(request.questions)))

    def _probabilities(self, state: JSONValue, question: Question) -> tuple[float, ...]:
        if len(question.options) == 1:
            return (1.0,)
        _, names, _, probabilities = self._decider.probs(state, _sparrow_question(question))
        by_name = {name: float(p) for name, p in zip(names, probabilities, strict=True)}
        total = sum(by_name.values())
        return tuple(by_name[name] / total for name in question.option_names)

    def _count_tokens(self, text: str) -> int:
        if not text:
            return 0
        static = self._decider.static
        if static is not None:
            return len(static.tok.encode(text, 1 << 30))
        return len(self._decider.tok.encode(text))
