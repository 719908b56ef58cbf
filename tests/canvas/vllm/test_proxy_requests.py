"""What the vLLM proxy sends upstream (vLLM 0.33's documented fields, with their types), and its errors past them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import canvas_backend, loaded_runtime, serve_app
from typer.testing import CliRunner
from vllm_protocol import raw_read
from vllm_proxy import STATE, check_fields, close, mixed, noul, proxy_for, read_requests, wide_choice
from vllm_standin import Standin, load_standin, running

from canvasread.canvas.plan import noisy_canvas
from canvasread.canvas.prompt import THOUGHT_BLOCK
from canvasread.cli import app as cli_app
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.settings import ServerSettings


@pytest.mark.parametrize(
    ("questions", "samples", "canvases"),
    [
        pytest.param({"refund": noul("Refund?")}, 1, 1, id="single-question"),
        pytest.param(mixed(7), 1, 1, id="multi-question"),
        pytest.param(mixed(60), 1, 2, id="several-canvases"),
        pytest.param(mixed(5), 3, 1, id="re-reads"),
    ],
)
def test_requests_carry_vllms_fields_and_the_planned_canvases(
    wide_proxy: Decider, wide_standin: tuple[str, Standin], questions: dict[str, Any], samples: int, canvases: int
) -> None:
    job, sent = read_requests(wide_proxy, wide_standin[1], questions, seed=5, samples=samples)
    assert len(job.plan.canvases) >= canvases
    runtime = loaded_runtime(canvas_backend(wide_proxy))
    vocab = runtime.tokenizer.vocab_size
    expected = {
        tuple(noisy_canvas(canvas, job.plan.questions, vocab_size=vocab, seed=5, read=r)): (c, r)
        for c, canvas in enumerate(job.plan.canvases)
        for r in range(samples)
    }
    assert len(sent) == len(expected) == len(job.plan.canvases) * samples
    thought = runtime.tokenizer.encode(THOUGHT_BLOCK)
    seen = set()
    for body in sent:
        check_fields(body)
        c, r = expected[tuple(body["vllm_xargs"]["diffusion_seed_canvas"])]
        seen.add((c, r))
        assert body["prompt"] == list(job.plan.prompt(job.plan.canvases[c]).ids)
        assert body["prompt"][-len(thought) :] == thought, "the empty thought block ends the prompt, not the canvas"
        assert thought[0] not in body["vllm_xargs"]["diffusion_seed_canvas"]
        slots = [job.plan.questions[q] for q in job.plan.canvases[c].questions]
        assert set(body["logprob_token_ids"]) == {i for planned in slots for i in planned.label_ids}
    assert len(seen) == len(sent), "every read is sent once, each with its own noise"


def test_a_read_needing_more_than_128_label_ids_is_split_over_requests(
    wide_proxy: Decider, wide_standin: tuple[str, Standin]
) -> None:
    job, sent = read_requests(wide_proxy, wide_standin[1], wide_choice(200), seed=3, samples=1)
    assert len(job.plan.canvases) == 1 and len(sent) == 2
    for body in sent:
        check_fields(body)
    asked = [set(body["logprob_token_ids"]) for body in sent]
    assert not asked[0] & asked[1]
    assert asked[0] | asked[1] == {i for planned in job.plan.questions for i in planned.label_ids}
    assert len({tuple(body["vllm_xargs"]["diffusion_seed_canvas"]) for body in sent}) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vllm_xargs": {"diffusion_surprise": 1}}, "diffusion_surprise"),
        ({"vllm_xargs": {"diffusion_read_only": "yes"}}, "diffusion_read_only"),
        ({"vllm_xargs": {"diffusion_max_steps": True}}, "diffusion_max_steps"),
        ({"vllm_xargs": {"diffusion_seed_canvas": [0] * 15}}, "exactly 16 ids"),
        ({"vllm_xargs": {"diffusion_canvas_length": 512, "diffusion_seed_canvas": [0] * 512}}, "no larger"),
        ({"logprobs": None}, "`logprobs` must be set"),
        ({"logprob_token_ids": list(range(129)), "logprobs": 129}, "length 129"),
        ({"temperature": 0.0}, "not yet supported with diffusion models"),
        ({"min_p": 0.1}, "not yet supported with diffusion models"),
        ({"seed": 1}, "not yet supported with diffusion models"),
        ({"top_k": -2}, "top_k must be 0 (disable)"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ],
)
def test_the_standin_refuses_what_vllm_refuses(
    wide_standin: tuple[str, Standin], change: dict[str, Any], message: str
) -> None:
    body = raw_read(logprobs=2, logprob_token_ids=[4443, 1294])
    assert httpx.post(wide_standin[0] + "/v1/completions", json=body, timeout=30).status_code == 200
    broken = {**body, **change, "vllm_xargs": {**body["vllm_xargs"], **change.get("vllm_xargs", {})}}
    refused = httpx.post(wide_standin[0] + "/v1/completions", json=broken, timeout=30)
    assert refused.status_code == 400
    assert message in refused.json()["error"]["message"]


def ask_live(base: str, questions: dict[str, Any]) -> httpx.Response:
    body = {"model": "dgemma", "state": STATE, "questions": questions, "seed": 1}
    return httpx.post(base + "/v1/systemone", json=body, timeout=60)


def test_a_canvas_wider_than_vllm_serves_is_a_clear_502(tiny_wide_checkpoint: Path) -> None:
    narrow = load_standin(str(tiny_wide_checkpoint), served_name="dgemma", canvas_length=64)
    with running(narrow) as base:
        decider = proxy_for(base, tiny_wide_checkpoint, load=False)
        try:
            with serve_app(create_app(decider, ServerSettings())) as server:
                assert ask_live(server, {"refund": noul("Refund?")}).status_code == 200
                reply = ask_live(server, mixed(60))
        finally:
            close(decider)
    assert reply.status_code == 502
    detail = reply.json()["detail"]
    assert detail["error_type"] == "upstream_error"
    assert "no larger than the served canvas_length 64" in detail["message"]


def test_an_upstream_without_logprob_token_ids_is_a_clear_502(tiny_wide_checkpoint: Path) -> None:
    older = load_standin(str(tiny_wide_checkpoint), served_name="dgemma", honour_logprob_token_ids=False)
    with running(older) as base:
        decider = proxy_for(base, tiny_wide_checkpoint, load=False)
        try:
            with serve_app(create_app(decider, ServerSettings())) as server:
                reply = ask_live(server, mixed(3))
        finally:
            close(decider)
    assert reply.status_code == 502
    assert "logprob_token_ids" in reply.json()["detail"]["message"]


def test_serve_refuses_an_upstream_without_a_tokenizer() -> None:
    result = CliRunner().invoke(cli_app, ["serve", "--upstream", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "--tokenizer" in result.output
