"""Ask every decision of a dataset, concurrently, of a running server (HTTP) or a model in process.

Both paths send the very JSON a client sends to `POST /v1/systemone` and read
the very JSON it gets back, so an in-process run measures what the server
would answer. Each decision is its own request (a question's neighbours can
sway a canvas read), and its latency is timed around that request alone.

`order_check` re-asks each choice question twice more, options reversed and
shuffled (seeded by the item id), and maps the answers back to the caller's
labels for the flip and shift measurements.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from canvasread.decide import Decider
from canvasread.errors import CanvasreadError
from canvasread.eval.dataset import EvalItem
from canvasread.kinds import kind_of
from canvasread.types import OrderMode
from canvasread.wire import parse_request

REORDERINGS = ("reversed", "shuffled")


class Asker(Protocol):
    """Answers one `/v1/systemone` body with the response JSON; raises `AskFailed` (or a `CanvasreadError`)."""

    async def ask(self, body: dict[str, Any]) -> dict[str, Any]: ...


class AskFailed(Exception):
    """A request the server refused or failed; the decision is counted as an error, not scored."""


class HttpAsker:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def ask(self, body: dict[str, Any]) -> dict[str, Any]:
        reply = await self._client.post("/v1/systemone", json=body)
        if reply.status_code != 200:
            raise AskFailed(f"HTTP {reply.status_code}: {reply.text[:300]}")
        response: dict[str, Any] = reply.json()
        return response


class LocalAsker:
    def __init__(self, decider: Decider) -> None:
        self._decider = decider

    async def ask(self, body: dict[str, Any]) -> dict[str, Any]:
        name, request = parse_request(body)
        return dict((await self._decider.decide(name, request)).to_json())


@asynccontextmanager
async def http_asker(url: str, api_key: str, timeout_s: float = 120.0) -> AsyncIterator[HttpAsker]:
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s) as client:
        yield HttpAsker(client)


@asynccontextmanager
async def local_asker(decider: Decider) -> AsyncIterator[LocalAsker]:
    """A loaded `Decider` with its batch loops running, so concurrent asks are batched as the server batches them."""
    decider.start()
    try:
        yield LocalAsker(decider)
    finally:
        await decider.stop()


@dataclass(frozen=True)
class Outcome:
    """One answered decision; every distribution is in the item's option order."""

    item: EvalItem
    probabilities: tuple[float, ...]
    latency_s: float
    abstain: bool
    reordered: tuple[tuple[float, ...], ...] = ()


@dataclass(frozen=True)
class Failure:
    item: EvalItem
    error: str


@dataclass(frozen=True)
class RunResult:
    outcomes: list[Outcome]
    failures: list[Failure]
    model: str | None
    wall_s: float


def answer_distribution(answer: dict[str, Any], options: Sequence[str]) -> tuple[float, ...]:
    """The answer's probabilities in `options` order, as its kind reads them back (a noul carries only P(true))."""
    return kind_of(answer["type"]).probabilities_of(answer, options)


def reordered_questions(item: EvalItem, seed: int) -> list[dict[str, Any]]:
    """The item's choice question with its options reversed, then shuffled (seeded by `seed` and the id)."""
    criteria: dict[str, Any] = item.question["criteria"]
    names = list(criteria)
    shuffled = random.Random(f"{seed}:{item.id}").sample(names, len(names))
    return [
        {**item.question, "criteria": {name: criteria[name] for name in order}} for order in (names[::-1], shuffled)
    ]


class _Session:
    """What every ask of one run shares: where to ask, how, and what came back."""

    def __init__(self, asker: Asker, model: str, order: OrderMode | None, extra: dict[str, Any]) -> None:
        self.asker = asker
        self.model = model
        self.order = order
        self.extra = extra
        self.served_model: str | None = None

    async def ask(self, item: EvalItem, question: dict[str, Any]) -> tuple[dict[str, Any], float]:
        body: dict[str, Any] = {
            **self.extra,
            "model": self.model,
            "state": item.state,
            "questions": {"decision": question},
        }
        if self.order is not None:
            body["order"] = self.order
        started = time.perf_counter()
        response = await self.asker.ask(body)
        elapsed = time.perf_counter() - started
        self.served_model = str(response["model"])
        answer: dict[str, Any] = response["answers"]["decision"]
        return answer, elapsed

    async def outcome(self, item: EvalItem, order_check: bool, seed: int) -> Outcome:
        answer, latency = await self.ask(item, item.question)
        reordered = []
        if order_check and kind_of(item.kind).rotates:
            for question in reordered_questions(item, seed):
                again, _ = await self.ask(item, question)
                reordered.append(answer_distribution(again, item.options))
        return Outcome(
            item, answer_distribution(answer, item.options), latency, bool(answer.get("abstain")), tuple(reordered)
        )


async def run_items(
    items: Sequence[EvalItem],
    asker: Asker,
    *,
    model: str = "default",
    order: OrderMode | None = None,
    order_check: bool = False,
    concurrency: int = 8,
    seed: int = 0,
    console: Console | None = None,
    extra: dict[str, Any] | None = None,
) -> RunResult:
    """Ask every item, at most `concurrency` at a time, with a progress bar; failures are kept, not raised.

    `extra` are extension keys sent with every request (`escalate: {"below": 0}` keeps a server's escalation off).
    """
    session = _Session(asker, model, order, extra or {})
    slots = asyncio.Semaphore(concurrency)
    outcomes: list[Outcome] = []
    failures: list[Failure] = []
    started = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("asking", total=len(items))

        async def one(item: EvalItem) -> None:
            async with slots:
                try:
                    outcomes.append(await session.outcome(item, order_check, seed))
                except (AskFailed, CanvasreadError, httpx.HTTPError, KeyError, ValueError) as error:
                    failures.append(Failure(item, f"{type(error).__name__}: {error}"))
                progress.advance(task)

        await asyncio.gather(*(one(item) for item in items))
    rank = {item.id: index for index, item in enumerate(items)}
    outcomes.sort(key=lambda outcome: rank[outcome.item.id])
    return RunResult(outcomes, failures, session.served_model, time.perf_counter() - started)
