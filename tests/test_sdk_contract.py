"""The official typesafe-sdk against live servers: the wire contract as real clients see it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import pytest
from helpers import png, serve_app
from typesafe_sdk import (
    AsyncTypeSafeClient,
    Choice,
    Image,
    Noul,
    Score,
    TypeSafeBadRequestError,
    TypeSafeClient,
    TypeSafeUnprocessableEntityError,
)

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.types import Capabilities, DecisionRequest

STATE = "I was charged twice for order 1182 and nobody answers my emails. I want my money back now!"
QUESTIONS = {
    "refund": Noul(instructions="Is the customer asking for money back?"),
    "team": Choice(
        instructions="Which team should handle this?",
        criteria={"billing": "charges, refunds, invoices", "technical": None, "sales": "new orders"},
    ),
    "anger": Score(instructions="How angry is the customer?", criteria=["calm", "annoyed", "furious"]),
}


def check_answers(result: object) -> None:
    answers = result.answers  # type: ignore[attr-defined]
    assert list(answers) == ["refund", "team", "anger"]
    assert 0.0 <= answers["refund"].noul <= 1.0
    team = answers["team"]
    assert list(team.probabilities) == ["billing", "technical", "sales"]
    assert sum(team.probabilities.values()) == pytest.approx(1.0)
    assert team.choice == max(team.probabilities, key=team.probabilities.get)
    anger = answers["anger"]
    assert anger.legend == {0: "calm", 1: "annoyed", 2: "furious"}
    assert anger.score == pytest.approx(sum(level * p for level, p in anger.probabilities.items()))
    assert result.usage.input_tokens > 0  # type: ignore[attr-defined]


def test_sync_client_with_builders(sparrow_server: str) -> None:
    with TypeSafeClient(base_url=sparrow_server, api_key="local") as client:
        result = client.system_one(STATE, QUESTIONS)
    check_answers(result)
    assert result.model == "sparrow-nano-general-v1.1"
    assert result.request_id


def test_sync_client_with_plain_dicts_and_json_state(sparrow_server: str) -> None:
    questions = {
        "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "charges, refunds, invoices", "technical": None, "sales": "new orders"},
        },
        "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]},
    }
    with TypeSafeClient(base_url=sparrow_server, api_key="local", model="default") as client:
        result = client.system_one({"subject": "Duplicate charge", "body": STATE, "tags": ["ünïcode"]}, questions)
    check_answers(result)


def test_async_client(sparrow_server: str) -> None:
    async def run() -> None:
        async with AsyncTypeSafeClient(base_url=sparrow_server, api_key="any-key-works") as client:
            results = await asyncio.gather(*(client.system_one(STATE, QUESTIONS) for _ in range(8)))
        for result in results:
            check_answers(result)

    asyncio.run(run())


def test_zstd_compressed_bodies(sparrow_server: str) -> None:
    long_state = STATE * 40  # well past the SDK's 1 KiB compression threshold
    with TypeSafeClient(base_url=sparrow_server, api_key="local", compression="zstd") as client:
        result = client.system_one(long_state, QUESTIONS)
        assert result.raw_http_response.request.headers["content-encoding"] == "zstd"
    check_answers(result)


def test_models_list(sparrow_server: str) -> None:
    with TypeSafeClient(base_url=sparrow_server, api_key="local") as client:
        names = [m.name for m in client.models.list().models]
    assert names[0] == "sparrow-nano-general-v1.1"
    assert {"jev-latest", "default", "jev-1.13.0", "jev-1.13", "jev-preview"} <= set(names)


def test_unknown_model_is_a_bad_request_naming_served_models(sparrow_server: str) -> None:
    with (
        TypeSafeClient(base_url=sparrow_server, api_key="local") as client,
        pytest.raises(TypeSafeBadRequestError) as caught,
    ):
        client.system_one(STATE, QUESTIONS, model="gpt-7")
    assert caught.value.status == 400
    assert caught.value.body["detail"]["error_type"] == "api_usage_error"
    assert caught.value.body["detail"]["message"].startswith("Unknown model: gpt-7")
    assert "sparrow-nano-general-v1.1" in str(caught.value)


@pytest.mark.parametrize(
    "name", ["jev-latest", "jev-1.13.0", "jev-1.13", "jev-preview", "typesafe/jev-latest", "~typesafe/jev-latest"]
)
def test_hosted_names_and_provider_prefixes_reach_the_default_model(sparrow_server: str, name: str) -> None:
    with TypeSafeClient(base_url=sparrow_server, api_key="local", model=name) as client:
        result = client.system_one(STATE, QUESTIONS)
    check_answers(result)
    assert result.model == "sparrow-nano-general-v1.1"


def test_images_to_a_text_only_model_are_refused_not_dropped(sparrow_server: str) -> None:
    photo = Image(png(32, 24, (200, 30, 30)))
    with (
        TypeSafeClient(base_url=sparrow_server, api_key="local") as client,
        client.attach_assets(photo),
        pytest.raises(TypeSafeUnprocessableEntityError) as caught,
    ):
        client.system_one(f"Product photo: {photo}", {"damaged": Noul(instructions="Is it damaged?")})
    assert "cannot see images" in str(caught.value)


@pytest.fixture
def vision_server() -> Iterator[tuple[str, list[DecisionRequest]]]:
    seen: list[DecisionRequest] = []

    def answer(request: DecisionRequest) -> Sequence[Sequence[float]]:
        seen.append(request)
        return [[0.25, 0.75] for _ in request.questions]

    backend = FunctionBackend(answer, name="vision-fake", capabilities=Capabilities(images=True))
    with serve_app(create_app(Decider([backend]))) as base:
        yield base, seen


def test_multipart_images_reach_a_vision_backend(vision_server: tuple[str, list[DecisionRequest]]) -> None:
    base, seen = vision_server
    photo, other = Image(png(32, 24, (200, 30, 30))), Image(png(8, 8, (200, 30, 30)))
    with TypeSafeClient(base_url=base, api_key="local") as client, client.attach_assets([photo, other]):
        result = client.system_one(f"Photos: {photo} and {other}", {"damaged": Noul(instructions="Is it damaged?")})
        assert result.raw_http_response.request.headers["content-type"].startswith("multipart/form-data")
    assert result.answers["damaged"].noul == pytest.approx(0.25)
    [request] = seen
    sizes = sorted((a.width, a.height, a.format) for a in request.assets.values())
    assert sizes == [(8, 8, "png"), (32, 24, "png")]
    assert set(request.assets) == {str(photo), str(other)}
