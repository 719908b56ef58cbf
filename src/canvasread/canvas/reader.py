"""The `Reader` protocol: canvas reads in, slot log-probabilities out (the token-level seam).

Everything above it — labels, prompt, canvas, noise, readout — is shared by
the in-process engine and the vLLM proxy; only how a read is executed differs.

Contract for `read(reads)`:
- every `CanvasRead` is `steps` denoising steps of `canvas_ids` given the
  encoded `prompt_ids`. The first `steps - 1` are the model's own denoising
  steps with every canvas position except the slots pinned to `canvas_ids`:
  the model reads the canvas, self-conditioned on the previous step's
  (temperature-scaled) logits as transformers' DiffusionGemma generation loop
  carries them (none at the first step); the logits are scaled by that
  loop's linear temperature schedule over `steps` steps (t_min, t_max and the
  entropy bound from the checkpoint's generation config), a token is sampled at every
  position, the entropy-bound rule keeps some, the rest are renoised with
  uniform token ids, and the pinned positions are set back. The last step is
  read-only: it is what the result reports (temperature 1). `steps == 1` is
  that read-only step alone, with no self-conditioning. A multi-step read
  draws its samples and renoise from a generator seeded by `seed`, so the
  same read gives the same numbers; a reader whose upstream draws its own
  random numbers (vLLM) says so in its docstring, as it does for any place
  where its upstream's denoising loop differs from transformers';
- the result has, for each slot in order, the full-vocabulary log-probability
  of each of that slot's `label_ids` (so `exp` of them sums to the label mass,
  at most 1);
- reads with the same `prompt_ids` and image digests may share one encoding of the prompt; the
  first `prefix_length` tokens are the part shared across requests that ask the
  same questions, worth caching (it never holds an image);
- `images` place each image's soft tokens in the prompt (a reader that cannot
  see images must refuse such reads, never drop the images).
- all reads given in one call belong together (one request's canvases, or one
  batch of requests) and should be executed as one batch where possible;
- a reader that can stop work for a caller who has left (`StoppingReader`)
  takes `gone(i)`, true once the caller of read `i` has left (it stays true):
  it checks it between its passes and denoising steps and drops read `i`'s
  remaining work, and read `i`'s result is then an empty list, which the
  caller ignores. `read_for` calls any reader that way, or plainly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from canvasread.backends.base import Gone, never_gone


@dataclass(frozen=True)
class Slot:
    """A noisy position in the canvas and the token ids of the labels that may fill it."""

    position: int
    label_ids: tuple[int, ...]


@dataclass(frozen=True)
class PromptImage:
    """An image in the prompt: its soft tokens fill `prompt_ids[start : start + tokens]`."""

    start: int
    tokens: int
    data: bytes = field(repr=False)
    digest: str


@dataclass(frozen=True)
class CanvasRead:
    """One read of one canvas; `steps` and `seed` as the module docstring says (`steps == 1`: one read-only step)."""

    prompt_ids: tuple[int, ...]
    prefix_length: int
    canvas_ids: tuple[int, ...]
    slots: tuple[Slot, ...]
    images: tuple[PromptImage, ...] = ()
    steps: int = 1
    seed: int = 0


@dataclass(frozen=True)
class SlotLogProbs:
    """Full-vocabulary log-probabilities of one slot's labels, in label order."""

    label_logprobs: tuple[float, ...]


class Reader(Protocol):
    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]: ...


@runtime_checkable
class ReaderWithCounters(Protocol):
    """A reader that counts its own work (encoder runs, cache hits) for metrics and tests."""

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]: ...

    def counters(self) -> Mapping[str, float]: ...


@runtime_checkable
class StepLimitedReader(Protocol):
    """A reader whose multi-step reads may ask at most `max_step_label_ids` label ids (vLLM: one request's cap,
    since each request denoises on its own). Callers keep every multi-step read within it: the canvas backend
    refuses a request past it before it queues, and reads a span blank past it in one step; the reader raises
    `ValueError` for a read past it (a caller's bug, never a request's)."""

    max_step_label_ids: int

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]: ...


@runtime_checkable
class StoppingReader(Protocol):
    """A reader that stops the reads of a caller who has left between its passes (the module docstring's last
    point); `stops_departed_reads` marks it, since a protocol cannot tell a `read` that takes `gone`."""

    stops_departed_reads: bool

    def read(self, reads: Sequence[CanvasRead], gone: Gone = never_gone) -> list[list[SlotLogProbs]]: ...


def read_for(reader: Reader, reads: Sequence[CanvasRead], gone: Gone) -> list[list[SlotLogProbs]]:
    """`reader.read(reads)`, stopping the reads whose caller is `gone` where the reader can (`StoppingReader`;
    a stopped read's result is an empty list); any other reader reads everything."""
    if isinstance(reader, StoppingReader) and reader.stops_departed_reads:
        return reader.read(reads, gone)
    return reader.read(reads)


def step_label_limit(reader: Reader) -> int | None:
    """The reader's limit on one multi-step read's label ids (`StepLimitedReader`), None where it has none."""
    return reader.max_step_label_ids if isinstance(reader, StepLimitedReader) else None
