"""What the server's start-up loads (a live server on loopback): a decider loaded beforehand is not loaded again."""

from __future__ import annotations

import httpx
from helpers import serve_app

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.server.app import create_app

CHOICE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None}}


class CountsLoads(FunctionBackend):
    """A function backend that counts its loads (an engine's load builds a model and captures its graphs)."""

    def __init__(self) -> None:
        super().__init__(lambda request: [[0.3, 0.7] for _ in request.questions])
        self.loads = 0

    def load(self) -> None:
        self.loads += 1


def test_a_decider_loaded_by_its_caller_is_served_without_a_second_load() -> None:
    backend = CountsLoads()
    decider = Decider([backend])
    decider.load()
    with serve_app(create_app(decider)) as url:
        answer = httpx.post(
            url + "/v1/systemone",
            json={"model": "jev-latest", "state": "I was charged twice.", "questions": {"q": CHOICE}},
        )
    assert answer.status_code == 200 and answer.json()["answers"]["q"]["choice"] == "tech"
    assert backend.loads == 1


def test_the_start_up_loads_a_decider_that_was_not_loaded() -> None:
    backend = CountsLoads()
    with serve_app(create_app(Decider([backend]))) as url:
        assert httpx.get(url + "/ready").status_code == 200
    assert backend.loads == 1
