"""The mixed workload: traffic as an operator sees it, not one warmed shape.

Each request draws (from its sequence number, so a sweep is reproducible but
never repeats a request) a state of log-uniform length between about 20 and
2,000 tokens and one of `QUESTION_SETS` question sets, as if that many teams
shared the server. A set holds 1–12 questions of every type, choices of 2–40
options and scores of 2–10 levels, each set worded its own way. Requests use
the default options: no `samples`, so uncertain answers are re-read as a
default caller's are (`mixed-samples1`: the same requests read once).
"""

from __future__ import annotations

import math
import random
from typing import Any

QUESTION_SETS = 16
WORDS = tuple(
    [
        "order",
        "refund",
        "charge",
        "card",
        "account",
        "login",
        "password",
        "invoice",
        "delivery",
        "package",
        "tracking",
        "address",
        "email",
        "phone",
        "subscription",
        "plan",
        "upgrade",
        "discount",
        "coupon",
        "error",
        "crash",
        "screen",
        "app",
        "update",
        "payment",
        "bank",
        "transfer",
        "receipt",
        "warranty",
        "repair",
        "return",
        "exchange",
        "size",
        "colour",
        "store",
        "manager",
        "agent",
        "chat",
        "call",
        "week",
        "month",
        "yesterday",
        "today",
        "again",
        "still",
        "never",
        "always",
        "please",
        "thanks",
        "urgent",
        "slow",
        "broken",
        "missing",
        "wrong",
        "double",
        "late",
        "early",
        "cancel",
    ]
)
TEAMS = tuple(
    [
        "billing",
        "shipping",
        "technical",
        "sales",
        "account",
        "security",
        "returns",
        "warranty",
        "fraud",
        "loyalty",
        "onboarding",
        "legal",
        "privacy",
        "partners",
        "wholesale",
        "retail",
        "mobile",
        "web",
        "desktop",
        "hardware",
        "network",
        "storage",
        "payments",
        "identity",
        "catalogue",
        "pricing",
        "logistics",
        "customs",
        "claims",
        "escalations",
        "feedback",
        "press",
        "careers",
        "facilities",
        "procurement",
        "compliance",
        "audit",
        "research",
        "training",
    ]
)
LEVELS = ("none", "low", "some", "moderate", "notable", "high", "very high", "severe", "critical", "extreme")


def _noul(rng: random.Random, number: int, topic: str) -> dict[str, Any]:
    return {"type": "noul", "instructions": f"Q{number}: is this message about {topic}?"}


def _choice(rng: random.Random, number: int, topic: str) -> dict[str, Any]:
    options = rng.sample(TEAMS, rng.randint(2, 40))
    criteria = {name: (f"{name} and {rng.choice(WORDS)}" if rng.random() < 0.5 else None) for name in options}
    return {"type": "choice", "instructions": f"Q{number}: which queue owns the {topic} part?", "criteria": criteria}


def _score(rng: random.Random, number: int, topic: str) -> dict[str, Any]:
    levels = list(LEVELS[: rng.randint(2, 10)])
    return {"type": "score", "instructions": f"Q{number}: how much {topic} is there?", "criteria": levels}


def _question(rng: random.Random, number: int) -> dict[str, Any]:
    make = rng.choice((_noul, _choice, _score))
    return make(rng, number, " ".join(rng.sample(WORDS, 2)))


def question_set(index: int) -> dict[str, Any]:
    """Question set `index` (of `QUESTION_SETS`): 1–12 questions, the same for every request that uses it."""
    rng = random.Random(1_000 + index)
    return {f"s{index}q{n}": _question(rng, n) for n in range(rng.randint(1, 12))}


def mixed_once_body(sequence: int, model: str = "jev-latest") -> dict[str, Any]:
    """The mixed workload read once per question (`samples: 1`): its cost without the automatic re-reads."""
    return {**mixed_body(sequence, model), "samples": 1}


def mixed_body(sequence: int, model: str = "jev-latest") -> dict[str, Any]:
    """Request `sequence` of the mixed workload (default options)."""
    rng = random.Random(sequence)
    words = int(math.exp(rng.uniform(math.log(15), math.log(1_500))))
    state = " ".join(rng.choice(WORDS) for _ in range(words))
    return {
        "model": model,
        "state": f"Ticket {sequence}: {state}.",
        "questions": question_set(sequence % QUESTION_SETS),
    }
