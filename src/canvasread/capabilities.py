"""What a served model can answer, checked before a request queues.

Each model's card says what it can do (images, box and span questions, steps,
a thought, how many options); a request asking more is one 422 that lists
every field the model cannot serve, naming the model, so the caller can send
it elsewhere. Nothing reaches a batch that its backend would refuse.
"""

from __future__ import annotations

from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.types import SPAN_KINDS, DecisionRequest, ModelCard
from canvasread.wire import check_option_counts


def check_capabilities(card: ModelCard, request: DecisionRequest) -> None:
    """Raise `InvalidRequest` for everything in `request` that the model behind `card` cannot answer."""
    capabilities = card.capabilities
    problems = [p for q in request.questions if q.kind == "box" for p in _box_problems(card, request, q.key)]
    problems += [
        FieldProblem(("questions", q.key), f"model {card.name} cannot answer {q.kind} questions")
        for q in request.questions
        if q.kind in SPAN_KINDS and not capabilities.spans
    ]
    if request.assets and not capabilities.images:
        problems.append(
            FieldProblem(
                ("assets",),
                f"model {card.name} cannot see images; send the request to a model that can, or remove the assets",
            )
        )
    if request.options.steps > capabilities.max_steps:
        problems.append(
            FieldProblem(
                ("steps",),
                f"model {card.name} reads in at most {capabilities.max_steps} step"
                f"{'s' if capabilities.max_steps > 1 else ''} (it has no denoiser to run more); "
                f"send steps to a DiffusionGemma model, or leave it out",
            )
        )
    if request.options.think is not None and not capabilities.think:
        problems.append(
            FieldProblem(
                ("think",),
                f"model {card.name} cannot think before it reads; leave out think or ask a DiffusionGemma model",
            )
        )
    if problems:
        raise InvalidRequest(problems)
    check_option_counts(request, capabilities.max_options, capabilities.max_levels, f" for model {card.name}")


def _box_problems(card: ModelCard, request: DecisionRequest, key: str) -> list[FieldProblem]:
    """A box locates something in the request's one image, so it needs a model that sees and exactly one image."""
    loc = ("questions", key)
    if not card.capabilities.images:
        return [FieldProblem(loc, f"model {card.name} cannot see images, so it cannot answer box questions")]
    count = len(request.assets)
    if count != 1:
        return [FieldProblem(loc, f"a box question needs exactly one image in the request; this one has {count}")]
    return []
