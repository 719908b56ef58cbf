"""Box questions: eight verified digit slots on the canvas, read exactly, answered in the SDK's shape; refused by
models that cannot see images."""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import canvas_backend, loaded_runtime, png
from reference import generation_path_logprobs
from typesafe_sdk import Box, Image, Noul, TypeSafeClient, TypeSafeUnprocessableEntityError

from canvasread.canvas.plan import noisy_canvas
from canvasread.canvas.readout import slot_reading
from canvasread.decide import Decider
from canvasread.kinds import box
from canvasread.wire import parse_request


def red_square() -> bytes:
    """The picture every box test asks about: a 64x48 red PNG."""
    return png(64, 48, (200, 30, 30))


def box_request(state: str = "Photo: <image:1>", images: int = 1, **extensions: Any) -> dict[str, Any]:
    assets = {
        f"<image:{i + 1}>": {"type": "image", "format": "png", "data_base64": base64.b64encode(red_square()).decode()}
        for i in range(images)
    }
    return {
        "model": "jev-latest",
        "state": state,
        "questions": {
            "dog": {"type": "box", "instructions": "The red square"},
            "red": {"type": "noul", "instructions": "Red?"},
        },
        **({"assets": assets} if assets else {}),
        **extensions,
    }


def test_a_box_is_eight_digit_slots_verified_in_context(tiny_decider: Decider) -> None:
    backend = canvas_backend(tiny_decider)
    runtime = loaded_runtime(backend)
    job = backend.prepare(parse_request(box_request())[1])
    planned, _ = job.plan.questions
    assert len(planned.slots) == box.SLOTS
    digit_ids = tuple(runtime.tokenizer.encode(digit)[-1] for digit in box.DIGITS)
    for tens, units in zip(planned.slots[0::2], planned.slots[1::2], strict=True):
        assert tens.labels == units.labels == box.DIGITS
        assert tens.label_ids == units.label_ids == digit_ids
        assert units.position == tens.position + 1
    [canvas] = job.plan.canvases
    text = runtime.tokenizer.decode(list(canvas.ids))
    assert "dog: top 00, bottom 00, left 00, right 00\nred: yes" in text
    system = runtime.tokenizer.decode(list(job.plan.prompts[0].ids))
    assert "The red square" in system and "00 to 99" in system


def test_a_box_read_equals_a_plain_forward_composed_into_edges(tiny_decider: Decider) -> None:
    """Every digit slot is read at the right place with the image in the prompt (as transformers' generation path
    reads it); the edges are their product."""
    backend = canvas_backend(tiny_decider)
    runtime = loaded_runtime(backend)
    runner = runtime.reader.runner  # type: ignore[attr-defined]
    job = backend.prepare(parse_request(box_request(samples=1, seed=5))[1])
    [result] = backend.decide([job])
    [canvas] = job.plan.canvases
    ids = noisy_canvas(canvas, job.plan.questions, vocab_size=runtime.tokenizer.vocab_size, seed=job.seed, read=0)

    image_token = runtime.images.token_id  # type: ignore[union-attr]
    features = runner.image_features([red_square()])[0]
    logprobs = generation_path_logprobs(runner.model, job.plan.prompts[0].ids, ids, image_token, features)
    slots = job.plan.questions[0].slots
    digits = [slot_reading(logprobs[s.position, list(s.label_ids)].tolist()).probabilities for s in slots]
    for got, want in zip(result.distributions[0].edges, box.edge_distributions(digits), strict=True):
        assert got == pytest.approx(want, abs=1e-5)
    assert math.fsum(result.distributions[0].edges[0]) == pytest.approx(1.0)


def test_the_sdk_box_builder_gets_a_box_it_parses(tiny_server: str) -> None:
    photo = Image(red_square())
    with TypeSafeClient(base_url=tiny_server, api_key="local", timeout=120) as client:
        result = client.system_one(
            photo, {"square": Box(instructions="The red square"), "red": Noul(instructions="Red?")}
        )
    answer = result.boxes["square"]
    edges = answer.box
    assert 0.0 <= edges.top <= edges.bottom <= 1.0 and 0.0 <= edges.left <= edges.right <= 1.0
    assert answer.confidence is not None and 0.0 <= answer.confidence <= 1.0
    assert 0.0 <= result.nouls["red"].noul <= 1.0


def test_a_box_needs_exactly_one_image(tiny_server: str) -> None:
    for images, state in ((0, "no picture"), (2, "<image:1> and <image:2>")):
        response = httpx.post(tiny_server + "/v1/systemone", json=box_request(state, images), timeout=120)
        assert response.status_code == 422, response.text
        [problem] = response.json()["detail"]
        assert problem["loc"] == ["body", "questions", "dog", "box"]
        assert "exactly one image" in problem["msg"] and f"has {images}" in problem["msg"]


def test_models_that_cannot_see_refuse_a_box_at_the_question(sparrow_server: str) -> None:
    with (
        TypeSafeClient(base_url=sparrow_server, api_key="local") as client,
        pytest.raises(TypeSafeUnprocessableEntityError) as caught,
    ):
        client.system_one("a photo we could not send", {"dog": Box(instructions="The dog")})
    [problem] = caught.value.body["detail"]
    assert problem["loc"] == ["body", "questions", "dog", "box"]
    assert "cannot see images, so it cannot answer box questions" in problem["msg"]


def test_the_vllm_proxy_refuses_a_box_at_the_question(tiny_checkpoint: Path) -> None:
    """The proxy reads text only; the refusal comes before anything is sent upstream (nothing listens here)."""
    from canvasread.canvas.vllm.settings import VllmSettings
    from canvasread.catalog import open_decider
    from canvasread.errors import InvalidRequest

    upstream = VllmSettings(urls=("http://127.0.0.1:9",), tokenizer=str(tiny_checkpoint), canvas_length=256)
    proxy = open_decider((), wings=[upstream], load=False)
    proxy.served[0].loaded.set()  # the capability check comes before any read, so no upstream is needed
    with pytest.raises(InvalidRequest) as caught:
        proxy.decide_now(*parse_request(box_request()))
    problems = {problem.loc: problem.msg for problem in caught.value.problems}
    assert "cannot see images, so it cannot answer box questions" in problems["questions", "dog", "box"]
    assert "cannot see images" in problems[("assets",)]
