"""`think` in process: the engine writes the thought (as transformers' `generate` would: `test_thoughts.py`) on
the tiny thinking checkpoint, and every read of the request (each canvas, each re-read) holds it in its prompt's
thought block."""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from helpers import RecordingReader, png

from canvasread.canvas.backend import CanvasBackend, CanvasRuntime, ReadSettings
from canvasread.canvas.engine.factory import canvas_backend_for_checkpoint, load_runtime
from canvasread.canvas.engine.reader import EngineThinker, InProcessReader
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.layouts import LAYOUTS
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.decide import Decider
from canvasread.errors import InvalidRequest
from canvasread.wire import parse_request

STATE = {"ticket": "I was charged twice for order 1182, please refund me.", "channel": "email"}
# Seven answer lines fill two 32-token canvases.
QUESTIONS: dict[str, Any] = {key: {"type": "noul", "instructions": f"Is statement {key} true?"} for key in "abcdefg"}
ASKED = {"think": 8, "seed": 11, "samples": 2, "diagnostics": True}


@pytest.fixture(scope="module")
def runtime(tiny_thinking_checkpoint: Path) -> CanvasRuntime:
    """The checkpoint's engine and thinker, loaded as `serve --model` loads them."""
    return load_runtime(str(tiny_thinking_checkpoint), EngineSettings(), naive=False)


@pytest.fixture(scope="module")
def recorded(tiny_thinking_checkpoint: Path, runtime: CanvasRuntime) -> tuple[Decider, RecordingReader, CanvasBackend]:
    """That runtime behind a reader that records its reads."""
    spec = str(tiny_thinking_checkpoint)
    reader = RecordingReader(runtime.reader)
    backend = CanvasBackend(
        canvas_backend_for_checkpoint(spec).card, lambda: dataclasses.replace(runtime, reader=reader)
    )
    decider = Decider([backend])
    decider.load()
    return decider, reader, backend


@pytest.fixture(scope="module")
def thought_answer(recorded: tuple[Decider, RecordingReader, CanvasBackend]) -> tuple[dict[str, Any], list[Any]]:
    decider, reader, _ = recorded
    before = len(reader.reads)
    answer = decider.ask(STATE, QUESTIONS, **ASKED)
    return answer, reader.reads[before:]


def test_every_read_of_the_request_holds_the_one_thought(
    recorded: tuple[Decider, RecordingReader, CanvasBackend],
    thought_answer: tuple[dict[str, Any], list[Any]],
    tokenizer: HFTokenizer,
) -> None:
    _, _, backend = recorded
    answer, reads = thought_answer
    thoughts = [a["diagnostics"]["thought"] for a in answer["answers"].values()]
    thought = thoughts[0]
    assert all(t == thought for t in thoughts) and thought["tokens"] == 8 and thought["ms"] > 0
    assert len({read.canvas_ids for read in reads}) == 4  # two canvases, each read twice with fresh noise
    assert len({a["diagnostics"]["slot"]["canvas"] for a in answer["answers"].values()}) == 2
    # The read prompt without a thought ends with the empty block; with it, the thought sits inside the block.
    _, bare = parse_request({"model": "m", "state": STATE, "questions": QUESTIONS})
    empty = backend.prepare(bare).plan.prompts[0].ids
    for read in reads:
        written = read.prompt_ids[len(empty) - 1 : -1]
        assert read.prompt_ids == (*empty[:-1], *written, empty[-1])
        assert len(written) == thought["tokens"] and tokenizer.decode(written) == thought["text"]
        assert tokenizer.decode(read.prompt_ids).endswith("<|channel>thought\n" + thought["text"] + "<channel|>")
    assert answer["usage"]["input_tokens"] == len(reads[0].prompt_ids)


def test_the_seed_reproduces_the_thought_and_the_answers(
    recorded: tuple[Decider, RecordingReader, CanvasBackend], thought_answer: tuple[dict[str, Any], list[Any]]
) -> None:
    decider, _, _ = recorded
    first, _ = thought_answer
    again = decider.ask(STATE, QUESTIONS, **ASKED)
    other = decider.ask(STATE, QUESTIONS, **{**ASKED, "seed": 12})

    def thought(answer: dict[str, Any]) -> str:
        return str(answer["answers"]["a"]["diagnostics"]["thought"]["text"])

    assert thought(again) == thought(first) != thought(other)
    for key, expected in first["answers"].items():
        # The same thought and noise; fp32 sums follow the pass's shape (the first ask encodes its prompt too).
        assert again["answers"][key]["noul"] == pytest.approx(expected["noul"], rel=1e-5), key


@pytest.mark.parametrize("layout", ["thought-on-canvas", "prompt-per-canvas"])
def test_a_layout_without_one_prompt_thought_block_refuses_think(tiny_thinking_checkpoint: Path, layout: str) -> None:
    backend = canvas_backend_for_checkpoint(str(tiny_thinking_checkpoint), reading=ReadSettings(layout=LAYOUTS[layout]))
    decider = Decider([backend])
    decider.load()
    with pytest.raises(InvalidRequest) as refused:
        decider.ask(STATE, QUESTIONS, think=8)
    [problem] = refused.value.problems
    assert problem.loc == ("think",) and layout in problem.msg


def test_a_thought_sees_the_request_image(recorded: tuple[Decider, RecordingReader, CanvasBackend]) -> None:
    """The image's pixels reach the generation: with the same ids and seed, another image gives another thought."""
    decider, reader, _ = recorded
    question = {"dark": {"type": "noul", "instructions": "Is [photo] dark?"}}
    texts, prompts = [], []
    for colour in ((0, 0, 0), (250, 250, 250)):
        data = base64.b64encode(png(32, 32, colour)).decode()
        assets = {"[photo]": {"type": "image", "format": "png", "data_base64": data}}
        before = len(reader.reads)
        answer = decider.ask("Look at [photo].", question, think=8, seed=3, samples=1, diagnostics=True, assets=assets)
        [read] = reader.reads[before:]
        thought = answer["answers"]["dark"]["diagnostics"]["thought"]
        texts.append(thought["text"])
        prompts.append(read.prompt_ids[: -thought["tokens"] - 1])  # the prompt before its thought and `<channel|>`
        assert read.images and read.images[0].start + read.images[0].tokens < len(prompts[-1])
    assert prompts[0] == prompts[1] and texts[0] != texts[1]  # the same ids: only the pixels differ


def test_a_caller_gone_before_its_thought_gets_none_written(
    recorded: tuple[Decider, RecordingReader, CanvasBackend], runtime: CanvasRuntime
) -> None:
    _, _, backend = recorded
    _, request = parse_request({"model": "m", "state": STATE, "questions": QUESTIONS, **ASKED})
    reader = runtime.reader
    assert isinstance(runtime.thinker, EngineThinker) and isinstance(reader, InProcessReader)
    written = reader.counters()["thoughts"]
    assert backend.decide([backend.prepare(request)], gone=lambda _: True) == [None]
    assert reader.counters()["thoughts"] == written
