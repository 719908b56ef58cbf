"""Model names: hosted names, provider prefixes and operator aliases all reach a served model; unknown names are
a 400 `api_usage_error` that says what is served."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from helpers import serve_cli

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider, DeciderSettings
from canvasread.errors import ModelNotFound


def decider(*aliases: tuple[str, str]) -> Decider:
    backends = [FunctionBackend(lambda r: [], name=name) for name in ("main", "other")]
    return Decider(backends, DeciderSettings(aliases=aliases))


@pytest.mark.parametrize(
    "name",
    [
        "main",
        "jev-latest",
        "default",
        "jev-1.13.0",
        "jev-1.13",
        "jev-1.14.0",
        "jev-1.14",
        "jev-preview",
        "openjev-latest",
        "typesafe/jev-1.14.0",
        "typesafe/jev-latest",
        "~typesafe/jev-latest",
        "typesafe/jev-1.13",
        "typesafe/main",
    ],
)
def test_hosted_names_and_prefixes_are_the_default_model(name: str) -> None:
    assert decider().resolve(name).card.name == "main"


def test_operator_aliases_point_anywhere_and_are_listed_as_models() -> None:
    served = decider(("fast", "other"), ("jev-preview", "other"), ("newest", "jev-preview"))
    assert served.resolve("fast").card.name == "other"
    assert served.resolve("~typesafe/jev-preview").card.name == "other"
    assert served.resolve("newest").card.name == "other"
    cards = {card.name: card for card in served.model_cards()}
    assert list(cards)[:2] == ["main", "other"]
    assert {"jev-latest", "default", "jev-1.13.0", "jev-1.13", "jev-preview", "fast", "newest"} <= set(cards)
    assert cards["fast"].description.startswith("Alias of other.")
    assert cards["jev-latest"].description.startswith("Alias of main.")


def test_unknown_model_is_a_400_api_usage_error_naming_what_is_served() -> None:
    with pytest.raises(ModelNotFound) as caught:
        decider(("fast", "other")).resolve("gpt-7")
    error = caught.value
    assert (error.status_code, error.error_type) == (400, "api_usage_error")
    assert error.message.startswith("Unknown model: gpt-7")
    assert "main" in error.message and "other" in error.message and "fast" in error.message


@pytest.mark.parametrize(
    ("aliases", "message"),
    [
        ((("main", "other"),), "is the name of a served model"),
        ((("fast", "nowhere"),), "neither served nor an alias"),
        ((("fast", "main"), ("fast", "other")), "given twice"),
        ((("", "main"),), "needs a name and a model"),
    ],
)
def test_bad_aliases_are_refused_at_startup(aliases: tuple[tuple[str, str], ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decider(*aliases)


def test_serve_model_default_is_the_embedded_model() -> None:
    with serve_cli("--model", "default") as base:
        ready = httpx.get(base + "/ready", timeout=10).json()
    assert ready["models"] == ["sparrow-nano-general-v1.1"]


def test_serve_alias_flag_names_a_model_that_v1_models_lists() -> None:
    with serve_cli("--alias", "support-triage=jev-latest", "--alias", "jev-preview=sparrow-nano-general-v1.1") as base:
        models = [entry["name"] for entry in httpx.get(base + "/v1/models", timeout=10).json()["models"]]
        body = {
            "model": "typesafe/support-triage",
            "state": "hi",
            "questions": {"q": {"type": "noul", "instructions": "Hi?"}},
        }
        answered = httpx.post(base + "/v1/systemone", json=body, timeout=30)
    assert "support-triage" in models and models.count("jev-preview") == 1
    assert answered.status_code == 200 and answered.json()["model"] == "sparrow-nano-general-v1.1"


@pytest.mark.parametrize(("flag", "message"), [("nothing", "NAME=MODEL"), ("x=gpt-7", "neither served nor an alias")])
def test_a_bad_alias_flag_is_one_clear_line(flag: str, message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "canvasread", "serve", "--port", "1", "--alias", flag],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert message in done.stdout + done.stderr and "Traceback" not in done.stdout + done.stderr
