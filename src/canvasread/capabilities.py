"""What a served model can answer, checked before a request queues.

Each model's card says what it can do (images, box and span questions, steps,
a thought, how many options); a request asking more is one 422 that lists
every field the model cannot serve, naming the model, so the caller can send
it elsewhere. Nothing reaches a batch that its backend would refuse.
"""

from __future__ import annotations

from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.kinds import UnknownKind, kind_of
from canvasread.types import DecisionRequest, ModelCard, Question
from canvasread.wire import check_option_counts


def check_capabilities(card: ModelCard, request: DecisionRequest) -> None:
    """Raise `InvalidRequest` for everything in `request` that the model behind `card` cannot answer."""
    capabilities = card.capabilities
    problems = [problem for q in request.questions if (problem := _kind_problem(card, request, q)) is not None]
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


def _kind_problem(card: ModelCard, request: DecisionRequest, question: Question) -> FieldProblem | None:
    """An unknown kind is refused here, at the edge of every path (the wire's schema refuses it first); a known
    one says what it needs of the model (a box: images and one image; a span: a model that reads the state), at
    the question's kind after its id, as every 422 about a question is located."""
    loc = ("questions", question.key)
    try:
        kind = kind_of(question.kind)
    except UnknownKind as error:
        return FieldProblem(loc, str(error), input=question.kind)
    refusal = kind.refusal(card.name, card.capabilities, request)
    return None if refusal is None else FieldProblem((*loc, question.kind), refusal)
