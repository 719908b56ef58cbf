"""Fitting a request into a peer's caps: questions across calls, options past the cap by a tournament.

Questions beyond a peer's cap per call (vLLM: 64) go in several calls, sent at once. A question with more
options than the peer labels (vLLM: 26 per choice) is asked in two rounds:

1. its options in g = ⌈n / cap⌉ groups of near-equal size, each group asked as the question itself (same
   instructions, that group's options with their descriptions);
2. a final among the groups' winners (each group's most probable option, with its description).

Option i of group G then gets

    P(i) = P_final(winner of G) · P_G(i)

the final's belief that the answer lies in G (speaking through G's best option), shared out inside G as G's
own read has it. This is a proper distribution (Σ_G P_final(w_G) · Σ_{i∈G} P_G(i) = 1), its argmax lies in
the final's favourite group, and with n ≤ cap it is the peer's own answer. A peer that labels c options
takes up to c² this way (26² = 676, past canvasread's 255). Only kinds whose option order carries no meaning
(`Kind.rotates`: a choice) are split; a score's levels never exceed a peer's 10.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from canvasread.kinds import kind_of
from canvasread.kinds.base import top_index
from canvasread.systemone.peers import Ask, Reply
from canvasread.types import Distribution, JSONValue, Question

# The answer of a group with one option (or a question with one): nothing to ask.
CERTAIN = Reply((1.0,), None)


def option_groups(count: int, cap: int) -> tuple[range, ...]:
    """`count` options in ⌈count / cap⌉ consecutive groups whose sizes differ by at most one."""
    groups = max(1, -(-count // cap))
    size, extra = divmod(count, groups)
    bounds = [0]
    for g in range(groups):
        bounds.append(bounds[-1] + size + (1 if g < extra else 0))
    return tuple(range(start, end) for start, end in itertools.pairwise(bounds))


def max_options(cap: int) -> int:
    """The most options a tournament over a peer that labels `cap` takes (the final must fit the cap too)."""
    return cap * cap


def in_calls(asks: Sequence[Ask], cap: int | None) -> list[list[Ask]]:
    """Consecutive calls of at most `cap` questions (one call when the peer has no cap)."""
    step = cap or max(1, len(asks))
    return [list(asks[start : start + step]) for start in range(0, len(asks), step)]


@dataclass(frozen=True)
class QuestionPlan:
    """How one question is asked of a peer: its option groups (one group: asked as it is)."""

    question: Question
    groups: tuple[range, ...]

    @classmethod
    def of(cls, question: Question, cap: int) -> QuestionPlan:
        split = kind_of(question.kind).rotates and len(question.options) > cap
        return cls(question, option_groups(len(question.options), cap if split else len(question.options) or 1))

    def _ask(self, indices: Sequence[int]) -> Ask:
        options = tuple(self.question.options[i] for i in indices)
        return Ask(self.question.kind, self.question.instructions, options)

    def first(self) -> list[tuple[int, Ask]]:
        """The first round: (group, ask) for every group that has something to choose between."""
        return [(g, self._ask(group)) for g, group in enumerate(self.groups) if len(group) > 1]

    def final(self, groups: Sequence[Reply]) -> Ask | None:
        """The final among the groups' winners, given each group's reply (None: one group, no final)."""
        return self._ask(self._winners(groups)) if len(self.groups) > 1 else None

    def _winners(self, groups: Sequence[Reply]) -> list[int]:
        return [group[top_index(reply.probabilities)] for group, reply in zip(self.groups, groups, strict=True)]

    def combine(self, groups: Sequence[Reply], final: Reply | None, engine: str) -> Distribution:
        """The question's distribution (see the module docstring), with where it came from in its details."""
        masses = [reply.label_mass for reply in (*groups, final) if reply is not None and reply.label_mass is not None]
        details: dict[str, JSONValue] = {"engine": engine}
        if masses:
            details["label_mass"] = min(masses)
        if final is None:
            return Distribution(groups[0].probabilities, details)
        probabilities = [0.0] * len(self.question.options)
        for group, reply, share in zip(self.groups, groups, final.probabilities, strict=True):
            for index, p in zip(group, reply.probabilities, strict=True):
                probabilities[index] = share * p
        finalists = [self.question.options[i].name for i in self._winners(groups)]
        details["tournament"] = {"groups": len(self.groups), "finalists": list(finalists)}
        return Distribution(tuple(probabilities), details)
