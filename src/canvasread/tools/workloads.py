"""The request bodies `canvasread bench` and the GPU benchmarks send, by workload name.

The standard workload is the one the targets are stated for: a state of about
150 tokens that differs per request, and three questions whose instructions
are the same across requests (a noul, a 5-way choice, a 4-level score), read
once. The cold workload changes the instructions every request (no prefix
reuse); the think workload asks for a short thought before the reads, the
span workload adds a span question, and the steps4 workload reads each canvas
after three pinned denoising steps, so their extra cost is measured. The mixed
workload (`mixed.py`) is traffic the engine never saw: states of random
length, 16 question sets, default options.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from canvasread.canvas.plan import Planner, noisy_canvas
from canvasread.canvas.reader import CanvasRead, Slot
from canvasread.tools.mixed import mixed_body, mixed_once_body
from canvasread.wire import parse_request

QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for their money back?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {
            "billing": "charges, refunds, invoices",
            "technical": "bugs, outages, errors",
            "sales": "new orders, upgrades, quotes",
            "account": "logins, passwords, profile changes",
            "other": None,
        },
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is this ticket?",
        "criteria": ["can wait", "this week", "today", "right now"],
    },
}

TICKET = (
    "Ticket #{n}. Hello, I am writing again about order {order}. I was charged twice on my card ending in {card}: "
    "once on Monday and again on Wednesday, for the same amount of {amount} euros. I never received a second "
    "package, so the second charge must be a mistake. I tried calling support twice but nobody answered and the "
    "chat bot kept sending me to the FAQ page. This is really frustrating because the money was meant for rent "
    "this month. Please refund the duplicate charge as soon as possible and confirm by email. If this is not "
    "resolved by Friday I will have to dispute the charge with my bank and cancel my subscription. Thanks, {name}."
)
NAMES = ("Ana", "Bram", "Chloé", "Dev", "Eitan", "Fatima", "Gus", "Hana")


def standard_body(sequence: int, model: str = "jev-latest") -> dict[str, Any]:
    """The standard workload: a fresh ~150-token state per request, fixed questions."""
    state = TICKET.format(
        n=sequence,
        order=10_000 + sequence * 7 % 90_000,
        card=1000 + sequence % 9000,
        amount=20 + sequence % 180,
        name=NAMES[sequence % len(NAMES)],
    )
    return {"model": model, "state": state, "questions": QUESTIONS, "samples": 1}


def cold_body(sequence: int, model: str = "jev-latest") -> dict[str, Any]:
    """The cold-prompt workload: the standard one with different instructions every request (no prefix reuse)."""
    body = standard_body(sequence, model)
    body["questions"] = {
        key: {**question, "instructions": f"Queue {sequence}: {question['instructions']}"}
        for key, question in QUESTIONS.items()
    }
    return body


# Thought tokens of the think workload: a sentence of reasoning, what a caller asking for a short thought gets.
THINK_TOKENS = 32


def think_body(sequence: int, model: str = "jev-latest") -> dict[str, Any]:
    """The think workload: the standard one with a thought of up to `THINK_TOKENS` tokens before the reads."""
    return {**standard_body(sequence, model), "think": THINK_TOKENS}


# The span workload's extra question: the ticket's signature is a piece of every state.
SPAN_QUESTION = {"type": "span", "instructions": "Who signed the ticket?"}


def span_body(sequence: int, model: str = "jev-latest") -> dict[str, Any]:
    """The span workload: the standard one plus a span question, read on a blank canvas of its own."""
    body = standard_body(sequence, model)
    return {**body, "questions": {**QUESTIONS, "signed": SPAN_QUESTION}}


# Denoising steps of the steps4 workload: inside the 2–6 that published multi-step canvas reads use.
STEPS = 4


def steps_body(sequence: int, model: str = "jev-latest") -> dict[str, Any]:
    """The steps4 workload: the standard one, every canvas read after `STEPS - 1` pinned denoising steps."""
    return {**standard_body(sequence, model), "steps": STEPS}


# The workloads `run_sweep` can drive, by the name results files record.
WORKLOADS: dict[str, Callable[[int, str], dict[str, Any]]] = {
    "standard": standard_body,
    "cold": cold_body,
    "think": think_body,
    "span": span_body,
    f"steps{STEPS}": steps_body,
    "mixed": mixed_body,
    "mixed-samples1": mixed_once_body,
}


def planned_reads(planner: Planner, bodies: Sequence[dict[str, Any]], vocab_size: int) -> list[CanvasRead]:
    """The canvas reads a server makes for these request bodies (first read of each canvas, with the request's
    `steps`, seeded by the body's place in `bodies`): reader benchmarks."""
    reads = []
    for sequence, raw in enumerate(bodies):
        _, request = parse_request(raw)
        plan = planner.plan(request)
        for canvas in plan.canvases:
            ids = noisy_canvas(canvas, plan.questions, vocab_size=vocab_size, seed=sequence, read=0)
            slots = tuple(Slot(plan.questions[q].position, plan.questions[q].label_ids) for q in canvas.questions)
            prompt = plan.prompt(canvas)
            steps = request.options.steps
            reads.append(CanvasRead(prompt.ids, prompt.prefix_length, tuple(ids), slots, steps=steps, seed=sequence))
    return reads


def answers_every_question(body: dict[str, Any], answer: dict[str, Any]) -> bool:
    answers = answer.get("answers")
    return isinstance(answers, dict) and list(answers) == list(body["questions"])
