"""Preparing a canvas job: plan the request and refuse it here, on its own thread, before it can reach a batch.

Every check that can fail a request runs in `prepare` (issue 27): a kind this
tokenizer cannot read, a question that cannot be labelled, a state too long
for the model, a `think` the model or the layout cannot honour, a
multi-step canvas past a reader's label-id limit, and prompts the reader's
KV store cannot hold (413). A batch then only reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from canvasread.canvas.job import CanvasJob
from canvasread.canvas.plan import Planner
from canvasread.canvas.seeds import request_seed
from canvasread.canvas.spans import StateTokens
from canvasread.canvas.thinking import Thinking
from canvasread.errors import FieldProblem, InvalidRequest, PayloadTooLarge
from canvasread.kinds import kind_of
from canvasread.kinds.base import as_text
from canvasread.types import DecisionRequest, JobCost, Option, Question


@dataclass(frozen=True)
class Unreadable:
    """The kinds read at a blank that the model's tokenizer cannot mark, and why (`spans.blank_markers`)."""

    model: str
    why: Mapping[str, str] = field(default_factory=dict)

    def check(self, request: DecisionRequest) -> None:
        """One 422 naming every question of such a kind; every other kind is read."""
        problems = [
            FieldProblem(("questions", q.key, q.kind), f"model {self.model} cannot answer {q.kind} questions: {why}")
            for q in request.questions
            if (why := self.why.get(q.kind)) is not None
        ]
        if problems:
            raise InvalidRequest(problems)


@dataclass(frozen=True)
class StoreCapacity:
    """A reader's prompt store: `pages` pages of `page` tokens each, sized by the setting `limit` names.

    The in-process engine holds every prompt of one read call in its paged KV
    store at once (`canvas/engine/kvstore.py`), so a request whose prompts
    cannot fit even with nothing else cached can never be read: it is refused
    with a 413 before it queues instead of failing its batch.
    """

    pages: int
    page: int
    limit: str

    def pages_for(self, prompt_tokens: Sequence[int]) -> int:
        """Pages the prompts take at most: each rounded up to pages, plus one where a cached prefix ends mid-page."""
        return sum(-(-tokens // self.page) + 1 for tokens in prompt_tokens)

    def check(self, job: CanvasJob) -> None:
        """A 413 naming the limit when the job's prompts (each with room for its thought) cannot fit."""
        think = job.request.options.think or 0
        lengths = [len(prompt.ids) + think for prompt in job.plan.prompts]
        needed = self.pages_for(lengths)
        if needed > self.pages:
            raise PayloadTooLarge(
                f"this request's prompts need {needed} pages of {self.page} tokens ({sum(lengths)} tokens) in the "
                f"model's KV store, which holds {self.pages} ({self.pages * self.page} tokens; {self.limit}): "
                "send a shorter state or fewer questions"
            )

    def check_smallest(self, prompt_tokens: Sequence[int]) -> None:
        """A ValueError naming the limit when even the smallest request's prompts cannot fit: the store would
        refuse every request, so the model does not load."""
        needed = self.pages_for(prompt_tokens)
        if needed > self.pages:
            raise ValueError(
                f"the model's KV store holds {self.pages} page{'s' * (self.pages != 1)} of {self.page} tokens "
                f"({self.limit}), and the smallest request's prompt needs {needed} ({sum(prompt_tokens)} tokens): "
                "give the store more memory"
            )


# The smallest request a client can send: a one-character state and one yes/no question of one character.
SMALLEST = DecisionRequest(".", (Question("q", "noul", "?", (Option("true"), Option("false"))),))


class JobPlanner:
    """Turns requests into `CanvasJob`s for one loaded runtime, and prices them for the batch budget.

    `step_label_ids` is the reader's limit on the label ids of one multi-step read (None: no limit; see
    `canvasread.canvas.reader.StepLimitedReader`); `capacity` is its prompt store's (None: unbounded).
    """

    def __init__(
        self,
        planner: Planner,
        thinking: Thinking,
        step_label_ids: int | None = None,
        unreadable: Unreadable = Unreadable("this model"),
        capacity: StoreCapacity | None = None,
    ) -> None:
        self._planner = planner
        self._thinking = thinking
        self._step_label_ids = step_label_ids
        self._unreadable = unreadable
        self._capacity = capacity

    def check_capacity(self) -> None:
        """Refuse, at load, a prompt store too small for any request (`StoreCapacity.check_smallest`)."""
        if self._capacity is not None:
            self._capacity.check_smallest([len(prompt.ids) for prompt in self._planner.plan(SMALLEST).prompts])

    def prepare(self, request: DecisionRequest) -> CanvasJob:
        self._unreadable.check(request)
        plan = self._planner.plan(request)
        state = None
        if any(kind_of(question.kind).blank is not None for question in request.questions):
            state = StateTokens.of(self._planner.tokenizer, as_text(request.state))
        job = CanvasJob(request, plan, request_seed(request.options.seed), state)
        refusal = self._thinking.refusal(request, plan, self._planner.read_layout, self._planner.max_positions)
        if refusal is not None:
            raise InvalidRequest.at(("think",), refusal)
        self._check_step_limit(job)
        if self._capacity is not None:
            self._capacity.check(job)
        return job

    def _check_step_limit(self, job: CanvasJob) -> None:
        """A multi-step read past the reader's label-id limit is refused before it queues (a blank past it is read
        in one step instead: `canvasread.canvas.span_search.SpanSearcher`)."""
        limit = self._step_label_ids
        if job.request.options.steps == 1 or limit is None:
            return
        for canvas in job.plan.canvases:
            slots = [slot for q in canvas.questions for slot in job.plan.questions[q].slots]
            asked = len({token for slot in slots for token in slot.read_ids})
            if asked > limit:
                raise InvalidRequest.at(
                    ("steps",),
                    f"this model reads a multi-step canvas in one upstream request, which asks at most {limit} label "
                    f"ids (each request denoises on its own); this canvas asks {asked}: ask with steps 1",
                )

    @staticmethod
    def cost(job: CanvasJob) -> JobCost:
        """The prompts plus every canvas of the first reads (all in one pass), and the images' pixels.

        A thought of N tokens adds its own pass (the prompt and N tokens written) and N tokens to the prompt read.
        """
        canvas_tokens = sum(len(canvas.ids) for canvas in job.plan.canvases) * job.first_reads
        pixels = sum(asset.width * asset.height for asset in job.request.assets.values())
        think = job.request.options.think or 0
        thought_tokens = job.plan.prompt_tokens + 2 * think if think else 0
        return JobCost(job.plan.prompt_tokens + canvas_tokens + thought_tokens, pixels)
