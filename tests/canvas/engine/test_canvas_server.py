"""`canvasread serve --model <tiny checkpoint>` answers the official SDK: all types, 64+ questions, 255 options."""

from __future__ import annotations

import httpx
import pytest
from typesafe_sdk import Choice, Image, Noul, Score, TypeSafeClient

ONE_PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="


def test_sdk_gets_all_three_types(tiny_server: str) -> None:
    with TypeSafeClient(base_url=tiny_server, api_key="local") as client:
        assert client.models.list().models[0].name == "tiny-diffusiongemma0"
        result = client.system_one(
            {"ticket": "Charged twice for order 1182", "customer": "Zoë"},
            {
                "refund": Noul(instructions="Is the customer asking for money back?"),
                "team": Choice(instructions="Which team?", criteria={"billing": "charges", "technical": None}),
                "anger": Score(instructions="How angry?", criteria=["calm", "annoyed", "furious"]),
            },
        )
    assert result.model == "tiny-diffusiongemma0"
    assert 0.0 <= result.nouls["refund"].noul <= 1.0
    assert sum(result.choices["team"].probabilities.values()) == pytest.approx(1.0)
    assert result.scores["anger"].legend == {0: "calm", 1: "annoyed", 2: "furious"}
    assert result.usage.input_tokens > 20 and result.usage.output_tokens > 5


def test_64_questions_and_a_255_option_choice_in_one_request(tiny_server: str) -> None:
    questions: dict[str, object] = {f"q{i}": Noul(instructions=f"Is statement {i} true?") for i in range(64)}
    questions["intent"] = Choice(instructions="Which intent?", criteria={f"intent_{i}": None for i in range(255)})
    # A 4,000-token prompt on a CPU: give it more than the SDK's default 10 s.
    with TypeSafeClient(base_url=tiny_server, api_key="local", timeout=120) as client:
        result = client.system_one("A long support conversation.", questions)  # type: ignore[arg-type]
    assert len(result.answers) == 65
    assert len(result.choices["intent"].probabilities) == 255
    assert sum(result.choices["intent"].probabilities.values()) == pytest.approx(1.0)


def test_diagnostics_and_seed_extensions(tiny_server: str) -> None:
    body = {
        "model": "jev-latest",
        "state": "hello",
        "seed": 7,
        "samples": 2,
        "diagnostics": True,
        "questions": {"greeting": {"type": "noul", "instructions": "Is this a greeting?"}},
    }
    first = httpx.post(tiny_server + "/v1/systemone", json=body, timeout=60).json()
    second = httpx.post(tiny_server + "/v1/systemone", json=body, timeout=60).json()
    details = first["answers"]["greeting"]["diagnostics"]
    # The same noise; fp32 sums follow the pass's shape (the first ask encodes the state in its reads' pass).
    assert first["answers"]["greeting"]["noul"] == pytest.approx(second["answers"]["greeting"]["noul"], rel=1e-5)
    assert details["stderr"] == pytest.approx(second["answers"]["greeting"]["diagnostics"]["stderr"], rel=1e-4)
    assert details["reads"] == 2 and details["labels"] == {"true": "yes", "false": "no"}
    assert details["steps"] == 1
    assert 0.0 < details["label_mass"] <= 1.0
    plain = httpx.post(tiny_server + "/v1/systemone", json={**body, "diagnostics": False}, timeout=60).json()
    assert "diagnostics" not in plain["answers"]["greeting"]


def test_images_through_the_sdk_reach_the_vision_tower(tiny_server: str) -> None:
    import base64

    photo = Image(base64.b64decode(ONE_PIXEL_PNG))
    with TypeSafeClient(base_url=tiny_server, api_key="local") as client, client.attach_assets(photo):
        result = client.system_one(f"Parcel photo: {photo}", {"damaged": Noul(instructions="Is it damaged?")})
        assert result.raw_http_response.request.headers["content-type"].startswith("multipart/form-data")
    assert 0.0 <= result.nouls["damaged"].noul <= 1.0
    assert result.usage.input_tokens > 70  # the image's soft tokens count as input


def test_an_asset_that_nothing_references_is_refused(tiny_server: str) -> None:
    body = {
        "model": "jev-latest",
        "state": "no placeholder here",
        "questions": {"q": {"type": "noul", "instructions": "x"}},
        "assets": {"<image:1>": {"type": "image", "format": "png", "data_base64": ONE_PIXEL_PNG}},
    }
    response = httpx.post(tiny_server + "/v1/systemone", json=body, timeout=60)
    assert response.status_code == 422 and "not referenced" in response.text
