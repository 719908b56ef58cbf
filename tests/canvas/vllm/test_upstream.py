"""What vLLM 0.33 does that the proxy must meet: generation-config defaults, `logprobs` beside ids, API keys, and
admission control's 503 "queue full" (overload, not a fault)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import canvas_backend, serve_app, upstream_pool
from typer.main import get_command
from vllm_protocol import LOGPROB_FLOOR, raw_read
from vllm_standin import load_standin, running

from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.layouts import layout_named
from canvasread.canvas.vllm.settings import VllmSettings
from canvasread.catalog import open_decider
from canvasread.cli import app as cli_app
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.settings import ServerSettings
from canvasread.upstream.pool import UpstreamUnavailable

STATE = "I was charged twice for order 1182. I want my money back!"
QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "charges", "technical": None}},
}
KEY = "vllm-key-6f1c"


def proxy_for(urls: tuple[str, ...], tiny_wide_checkpoint: Path, **settings: Any) -> Decider:
    upstream = VllmSettings(
        urls=urls, tokenizer=str(tiny_wide_checkpoint), canvas_length=256, probe_interval_s=0.2, **settings
    )
    return open_decider((), wings=[upstream], load=False)


def ask(base: str, **extensions: Any) -> httpx.Response:
    body = {"model": "dgemma", "state": STATE, "questions": QUESTIONS, "seed": 4, "samples": 1, **extensions}
    return httpx.post(base + "/v1/systemone", json=body, timeout=120)


def test_logprobs_beside_ids_is_required_but_its_value_ignored(tiny_wide_checkpoint: Path) -> None:
    """Completions drops `logprobs` when ids are given, so any count is accepted; every id gets a row entry."""
    with running(load_standin(str(tiny_wide_checkpoint), served_name="dgemma")) as base:
        answer = httpx.post(base + "/v1/completions", json=raw_read(logprobs=1), timeout=60)
    assert answer.status_code == 200
    rows = answer.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert all({f"token_id:{t}" for t in (4443, 1294, 236743)} <= row.keys() for row in rows)


def test_generation_defaults_do_not_reach_the_proxys_reads(
    tiny_wide_checkpoint: Path, tiny_wide_decider: Decider
) -> None:
    """Under a checkpoint default of top_k=1 a client leaving sampling out gets −9999 for every other label;
    canvasread sends neutral sampling, so its answers still equal the in-process engine's."""
    served = load_standin(
        str(tiny_wide_checkpoint), served_name="dgemma", generation_defaults={"top_k": 1, "top_p": 0.5}
    )
    with running(served) as base:
        rows = httpx.post(base + "/v1/completions", json=raw_read(), timeout=60).json()["choices"][0]["logprobs"]
        floored = [v for row in rows["top_logprobs"] for v in row.values() if v == LOGPROB_FLOOR]
        assert len(floored) >= 2 * 16, "all but the top token are filtered before the logprobs"
        decider = proxy_for((base,), tiny_wide_checkpoint)
        try:
            with serve_app(create_app(decider, ServerSettings())) as server:
                remote = ask(server)
        finally:
            canvas_backend(decider).close()
    assert remote.status_code == 200, remote.text
    local = tiny_wide_decider.ask(STATE, QUESTIONS, seed=4, samples=1)
    assert remote.json()["answers"]["refund"]["noul"] == pytest.approx(local["answers"]["refund"]["noul"], abs=1e-5)  # type: ignore[index]


def test_a_default_temperature_other_than_one_refuses_reads_that_leave_it_out(tiny_wide_checkpoint: Path) -> None:
    served = load_standin(str(tiny_wide_checkpoint), served_name="dgemma", generation_defaults={"temperature": 0.7})
    with running(served) as base:
        refused = httpx.post(base + "/v1/completions", json=raw_read(), timeout=60)
        neutral = httpx.post(base + "/v1/completions", json=raw_read(temperature=1.0), timeout=60)
    assert refused.status_code == 400 and "diffusion models" in refused.json()["error"]["message"]
    assert neutral.status_code == 200


def test_the_upstream_api_key_goes_on_every_call_and_never_into_logs(
    tiny_wide_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = load_standin(str(tiny_wide_checkpoint), served_name="dgemma", api_keys=(KEY,))
    caplog.set_level(logging.DEBUG)
    with running(served) as base:
        assert httpx.get(base + "/v1/models", timeout=10).status_code == 401
        assert httpx.get(base + "/health", timeout=10).status_code == 200
        keyless = canvas_backend(proxy_for((base,), tiny_wide_checkpoint, startup_timeout_s=3.0))
        try:
            with pytest.raises(UpstreamUnavailable) as refused:
                keyless.load()
        finally:
            keyless.close()
        settings_repr = repr(VllmSettings(urls=(base,), tokenizer="t", api_key=KEY))
        before = len(served.headers)
        keyed = proxy_for((base,), tiny_wide_checkpoint, api_key=KEY)
        try:
            with serve_app(create_app(keyed, ServerSettings())) as server:
                answered = ask(server)
        finally:
            canvas_backend(keyed).close()
    assert "--upstream-api-key" in refused.value.message
    assert answered.status_code == 200, answered.text
    calls = served.headers[before:]
    assert calls and all(h.get("authorization") == f"Bearer {KEY}" for h in calls)
    assert KEY not in settings_repr
    assert KEY not in caplog.text


def test_a_full_queue_is_retried_elsewhere_without_taking_the_upstream_out(tiny_wide_checkpoint: Path) -> None:
    full = load_standin(str(tiny_wide_checkpoint), served_name="dgemma", max_num_queued_reqs=0)
    free = load_standin(str(tiny_wide_checkpoint), served_name="dgemma")
    with running(full) as full_url, running(free) as free_url:
        decider = proxy_for((full_url, free_url), tiny_wide_checkpoint)
        backend = canvas_backend(decider)
        try:
            with serve_app(create_app(decider, ServerSettings())) as server:
                replies = [ask(server, seed=seed) for seed in range(3)]
                counters = backend.counters()
                healthy = [u.healthy for u in upstream_pool(backend).upstreams]
        finally:
            backend.close()
    assert [r.status_code for r in replies] == [200, 200, 200]
    assert full.requests, "the full upstream was asked"
    assert counters["upstream_busy"] >= 1 and counters["upstream_errors"] == 0
    assert healthy == [True, True]


def test_every_upstream_full_is_a_529_with_a_retry_hint(tiny_wide_checkpoint: Path) -> None:
    full = load_standin(str(tiny_wide_checkpoint), served_name="dgemma", max_num_queued_reqs=0)
    with running(full) as base:
        decider = proxy_for((base,), tiny_wide_checkpoint)
        backend = canvas_backend(decider)
        try:
            with serve_app(create_app(decider, ServerSettings())) as server:
                reply = ask(server)
                ready = httpx.get(server + "/ready", timeout=10)
        finally:
            backend.close()
    assert reply.status_code == 529, reply.text
    assert reply.json()["detail"]["error_type"] == "upstream_overloaded"
    assert int(reply.headers["retry-after-ms"]) >= 1 and "Retry-After" in reply.headers
    assert ready.status_code == 200, "a full upstream is still up"
    assert len(full.requests) == 4, "one try and three backoff rounds"


def test_the_upstream_key_comes_from_the_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    serve = get_command(cli_app).commands["serve"]  # type: ignore[attr-defined]
    flagged = serve.make_context("serve", ["--upstream", "http://vllm:8000", "--upstream-api-key", KEY]).params
    monkeypatch.setenv("CANVASREAD_UPSTREAM_API_KEY", KEY)
    from_env = serve.make_context("serve", ["--upstream", "http://vllm:8000"]).params
    assert flagged["upstream_api_key"] == from_env["upstream_api_key"] == KEY
    assert KEY not in serve.get_help(serve.make_context("serve", []))


@pytest.mark.parametrize("layout", ["thought-on-canvas", "both-label-forms"])
def test_every_layout_reads_the_same_through_vllm_and_in_process(tiny_wide_checkpoint: Path, layout: str) -> None:
    reading = ReadSettings(layout=layout_named(layout))
    local = open_decider((str(tiny_wide_checkpoint),), reading=reading)
    with running(load_standin(str(tiny_wide_checkpoint), served_name="dgemma")) as base:
        upstream = VllmSettings(urls=(base,), tokenizer=str(tiny_wide_checkpoint), canvas_length=256)
        remote = open_decider((), wings=[upstream], reading=reading)
        try:
            got = remote.ask(STATE, QUESTIONS, seed=5, samples=1, diagnostics=True)["answers"]
        finally:
            canvas_backend(remote).close()
    want = local.ask(STATE, QUESTIONS, seed=5, samples=1, diagnostics=True)["answers"]
    assert got["refund"]["diagnostics"]["layout"] == layout  # type: ignore[index]
    assert got["refund"]["noul"] == pytest.approx(want["refund"]["noul"], abs=1e-5)  # type: ignore[index]
    assert list(got["team"]["probabilities"].values()) == pytest.approx(  # type: ignore[index]
        list(want["team"]["probabilities"].values()),
        abs=1e-5,  # type: ignore[index]
    )
