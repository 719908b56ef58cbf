"""What each kind of `/v1/systemone` peer speaks, read from its source: caps, request shape, answers.

- `vllm` (vLLM 0.33, `entrypoints/generate/structured_decisions/`): 64 questions per call, 26 options per
  choice (labels A–Z), values as text (it `str()`s JSON), label mass in `diagnostics[id].label_mass`.
- `sglang` (SGLang 0.5.23, `srt/entrypoints/systemone/`): no question cap, 255 options (two-letter labels past
  26), text, objects and arrays (levels non-blank), `x_label_mass` on each answer.
- `jev` (the hosted API; typesafe-sdk's schema): no question cap, 255 options, any JSON, numbers rounded to
  2 decimals.

Every peer takes `{"model", "state", "questions": {id: {"type", "instructions", "criteria"}}}` and nothing
else: vLLM 0.33 forbids unknown top-level keys (`extra="forbid"`), and canvasread's extensions (seed,
samples, order...) are answered here, not there. Values a peer cannot take as JSON are sent as compact JSON
text (what canvasread's own prompts read). Answers are read back with the kind's own reader
(`Kind.probabilities_of`: a noul's `noul`, the `probabilities` of the rest) and renormalised, since the hosted
API rounds. Every peer answers `/v1/models`; vLLM and SGLang list models OpenAI's way (`data[].id`) and say
"queue full" with 503, a Jev API lists `models[].name` and says it with 529 (429 when rate-limited).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from canvasread.canvas.vllm.settings import VLLM
from canvasread.errors import UpstreamFailure
from canvasread.kinds import kind_of
from canvasread.kinds.base import as_text
from canvasread.types import JSONValue, Option, Question, Usage
from canvasread.upstream.pool import Dialect, UpstreamModel

SYSTEMONE_PATH = "/v1/systemone"
# A probability may sit this far outside [0, 1] from float noise; further is a broken answer.
SLACK = 1e-6


@dataclass(frozen=True)
class Ask:
    """One question as a peer is asked it: its kind, instructions and options (all of them, or one group)."""

    kind: str
    instructions: JSONValue
    options: tuple[Option, ...]


@dataclass(frozen=True)
class Reply:
    """A peer's answer to one `Ask`: a distribution over its options, and the label mass where the peer says."""

    probabilities: tuple[float, ...]
    label_mass: float | None


def served_by_jev(listing: Any, model: str) -> UpstreamModel | None:
    """`model` in a Jev API's `/v1/models` (`{"models": [{"name": ...}]}`, aliases listed as models)."""
    for entry in listing.get("models", []) if isinstance(listing, dict) else []:
        if isinstance(entry, dict) and entry.get("name") == model:
            return UpstreamModel(model, None)
    return None


# The hosted API has no health route: its models listing is the cheapest call that proves it answers.
JEV = Dialect(served=served_by_jev, key_flag="--upstream-api-key", health_path="/v1/models", busy=frozenset({429, 529}))


@dataclass(frozen=True)
class Peer:
    """One dialect of `/v1/systemone` (see the module docstring)."""

    name: str
    pool: Dialect
    max_questions: int | None
    max_options: int
    # The JSON types it takes as a value (state, instructions, a description); others go as JSON text.
    takes: tuple[type, ...]
    # Whether a blank score level is refused (it is then sent as its index).
    blank_levels: bool
    label_mass: Callable[[Mapping[str, Any], Mapping[str, Any], str], Any]

    def value(self, value: JSONValue) -> JSONValue:
        return value if value is None or isinstance(value, self.takes) else as_text(value)

    def body(self, model: str, state: JSONValue, asks: Sequence[Ask]) -> dict[str, Any]:
        """The request for `asks` about `state`; question ids are positions (the caller's keys stay here)."""
        return {
            "model": model,
            "state": self.value(state) if state is not None else "",
            "questions": {str(i): self._question(ask) for i, ask in enumerate(asks)},
        }

    def _question(self, ask: Ask) -> dict[str, JSONValue]:
        criteria = kind_of(ask.kind).criteria(Question("", ask.kind, ask.instructions, ask.options))
        if isinstance(criteria, dict):
            criteria = {name: self.value(text) for name, text in criteria.items()}
        elif isinstance(criteria, list):
            criteria = [self._level(i, level) for i, level in enumerate(criteria)]
        return {"type": ask.kind, "instructions": self.value(ask.instructions), "criteria": criteria}

    def _level(self, index: int, level: JSONValue) -> JSONValue:
        if not self.blank_levels and (level is None or (isinstance(level, str) and not level.strip())):
            return str(index)
        return self.value(level)

    def replies(self, answer: Any, asks: Sequence[Ask]) -> tuple[list[Reply], Usage]:
        """The peer's answer to `body(…, asks)`, one `Reply` per ask; `UpstreamFailure` for anything malformed."""
        try:
            answers, usage = answer["answers"], answer["usage"]
            spent = Usage(int(usage["input_tokens"]), int(usage.get("output_tokens", 0)))
            return [self._reply(answer, answers[str(i)], str(i), ask) for i, ask in enumerate(asks)], spent
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise UpstreamFailure(
                f"the {self.name} peer's answer is malformed ({type(error).__name__}: {error})"
            ) from None

    def _reply(self, whole: Mapping[str, Any], one: Mapping[str, Any], key: str, ask: Ask) -> Reply:
        names = tuple(option.name for option in ask.options)
        raw = kind_of(ask.kind).probabilities_of(one, names)
        if any(not math.isfinite(p) or p < -SLACK or p > 1 + SLACK for p in raw) or sum(raw) <= 0:
            raise ValueError(f"question {key} has probabilities {list(raw)}")
        clipped = [min(1.0, max(0.0, p)) for p in raw]
        total = sum(clipped)
        mass = self.label_mass(whole, one, key)
        return Reply(tuple(p / total for p in clipped), float(mass) if isinstance(mass, int | float) else None)


def _vllm_mass(whole: Mapping[str, Any], one: Mapping[str, Any], key: str) -> Any:
    return whole.get("diagnostics", {}).get(key, {}).get("label_mass")


def _sglang_mass(whole: Mapping[str, Any], one: Mapping[str, Any], key: str) -> Any:
    return one.get("x_label_mass")


PEERS: dict[str, Peer] = {
    "vllm": Peer("vllm", VLLM, 64, 26, (str,), True, _vllm_mass),
    "sglang": Peer(
        "sglang", VLLM, None, 255, (str, dict, list), False, lambda whole, one, key: one.get("x_label_mass")
    ),
    "jev": Peer("jev", JEV, None, 255, (object,), True, lambda whole, one, key: None),
}
