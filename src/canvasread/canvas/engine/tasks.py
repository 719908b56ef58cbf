"""The tasks a pass runs rows for: a canvas read (one step or several) and a thought, each over a placed prompt.

A task gives the scheduler the units of its next step (`units()`: rows,
each with what to do with its output) and is `finished` once it has its
result. Every unit's row reads the task's prompt in the store; a thought's
rows also read the blocks it has written so far, in slots it reserved when
it was admitted, so it never needs a page mid-thought.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from canvasread.canvas.engine.generation import Generation
from canvasread.canvas.engine.kvstore import StoredKV
from canvasread.canvas.engine.prompts import PlacedPrompt, PromptTable
from canvasread.canvas.engine.rows import Row, RowOutput
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.sampling import Scaled, Schedule
from canvasread.canvas.engine.scheduler import Sized
from canvasread.canvas.engine.steps import Denoising
from canvasread.canvas.reader import CanvasRead, SlotLogProbs
from canvasread.canvas.thinker import Thought


class Stepping(Protocol):
    """A canvas being denoised (a multi-step read's, a thought's): the temperature its next step takes, and the
    step itself over the canvas's scaled logits."""

    @property
    def temperature(self) -> float: ...

    def advance(self, scaled: Scaled, embed: Any) -> None: ...


@dataclass(frozen=True)
class Kit:
    """What tasks need of the model between passes: a denoising step's arithmetic over a canvas's normed hidden
    states at a temperature (`FusedRunner.scaled`), the embedding (self-conditioning), the checkpoint's schedule,
    and a generated block's width and vocabulary (its noise)."""

    scaled: Callable[[torch.Tensor, float], Scaled]
    embed: Any
    schedule: Schedule
    canvas_length: int
    vocab: int
    device: torch.device

    @classmethod
    def of(cls, runner: FusedRunner) -> Kit:
        model = runner.model
        config = model.config
        return cls(
            runner.scaled,
            runner.stack.embed,
            Schedule.of(model),
            int(config.canvas_length),
            int(config.text_config.vocab_size),
            runner.stack.device,
        )

    def step(self, canvas: Stepping, hidden: torch.Tensor) -> None:
        """Take `canvas`'s denoising step after a pass that left it `hidden` (normed final hidden states)."""
        canvas.advance(self.scaled(hidden, canvas.temperature), self.embed)


@dataclass(frozen=True)
class Unit:
    """A row of the next pass and what to do with its output."""

    row: Row
    then: Callable[[RowOutput], None]


def sized(row: Row, then: Callable[[RowOutput], None]) -> Sized[Unit]:
    return Sized(Unit(row, then), len(row.ids))


class ReadTask:
    """One `CanvasRead`: a read-only pass at its slots, after `steps - 1` pinned denoising passes."""

    def __init__(self, index: int, read: CanvasRead, prompt: PlacedPrompt, kit: Kit) -> None:
        self.index = index
        self.read = read
        self.prompt = prompt
        self.kit = kit
        self.state = Denoising(read, kit.schedule, kit.device) if read.steps > 1 else None
        self.result: list[SlotLogProbs] | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None

    def units(self) -> list[Sized[Unit]]:
        """The row that reads the canvas: read-only at the slots, or (an earlier step of a multi-step read) the
        whole canvas's hidden states for the denoising step, self-conditioned on the step before."""
        read, state, past = self.read, self.state, self.prompt.entry.slots
        positions = tuple(slot.position for slot in read.slots)
        labels = tuple(slot.label_ids for slot in read.slots)
        if state is None:
            return [sized(Row(past, read.canvas_ids, None, positions, labels), self._take)]
        if not state.last:
            positions, labels = (), ()
        row = Row(past, state.canvas_ids(), None, positions, labels, (), state.signal, not state.last)
        return [sized(row, self._take)]

    def _take(self, output: RowOutput) -> None:
        if output.canvas_hidden is None:
            self.result = [SlotLogProbs(tuple(t.tolist())) for t in output.label_logprobs]
            return
        assert self.state is not None
        self.kit.step(self.state, output.canvas_hidden)

    def release(self, table: PromptTable) -> None:
        table.let_go(self.prompt)


class ThoughtTask:
    """One thought (`generation.Generation`) after its prompt: per pass, the last block's encoding if it has
    one to write, and the canvas it denoises."""

    def __init__(self, index: int, prompt: PlacedPrompt, blocks: StoredKV, generation: Generation, kit: Kit) -> None:
        self.index = index
        self.prompt = prompt
        self.blocks = blocks
        self.generation = generation
        self.kit = kit

    @property
    def finished(self) -> bool:
        return self.generation.thought is not None

    @property
    def result(self) -> Thought | None:
        return self.generation.thought

    def units(self) -> list[Sized[Unit]]:
        generation, width = self.generation, self.generation.width
        written = generation.encoded * width
        units = []
        pending = generation.pending_block
        if pending is not None:
            past = self._past(written)
            row = Row(past, pending, self.blocks.slots[written : written + width])
            units.append(sized(row, self._encoded))
            written += width
        canvas = Row(self._past(written), generation.canvas_ids(), None, (), (), (), generation.signal, True)
        units.append(sized(canvas, self._denoised))
        return units

    def _past(self, written: int) -> torch.Tensor:
        """The prompt's slots, then the first `written` slots of the blocks."""
        return torch.cat([self.prompt.entry.slots, self.blocks.slots[:written]])

    def _encoded(self, output: RowOutput) -> None:
        self.generation.encoded += 1

    def _denoised(self, output: RowOutput) -> None:
        assert output.canvas_hidden is not None
        self.kit.step(self.generation, output.canvas_hidden)

    def release(self, table: PromptTable) -> None:
        table.let_go(self.prompt)
        table.store.release(self.blocks)
