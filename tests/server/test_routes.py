"""The probes as load balancers ask them (a live server on loopback): HEAD answers as GET does, without a body."""

from __future__ import annotations

import httpx
import pytest
from helpers import serve_app

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.server.app import create_app


class NeverLoads(FunctionBackend):
    def load(self) -> None:
        raise RuntimeError("no weights")


@pytest.mark.parametrize("path", ["/health", "/ready"])
def test_head_answers_a_probe_as_get_does_without_the_body(path: str) -> None:
    app = create_app(Decider([FunctionBackend(lambda r: [[0.5, 0.5] for _ in r.questions])]))
    with serve_app(app) as url:
        got, head = httpx.get(url + path), httpx.head(url + path)
    assert head.status_code == got.status_code == 200
    assert head.content == b"" and got.content
    assert head.headers["content-type"] == got.headers["content-type"] == "application/json"
    assert head.headers["x-typesafe-request-id"]


def test_head_on_ready_is_503_while_a_model_cannot_answer() -> None:
    with serve_app(create_app(Decider([NeverLoads(lambda r: [])])), wait_ready=False) as url:
        head = httpx.head(url + "/ready")
    assert head.status_code == 503 and head.content == b""
