"""The vLLM proxy path against a loopback stand-in computing with the tiny checkpoint.

Answers through the proxy must equal the in-process engine's on the same
checkpoint and seed, and every request sent upstream must use vLLM's
documented fields with their documented types.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import canvas_backend, loaded_runtime, serve_app
from typer.testing import CliRunner
from vllm_standin import Standin, load_standin, running

from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.job import CanvasJob
from canvasread.canvas.layouts import layout_named
from canvasread.canvas.plan import noisy_canvas
from canvasread.canvas.prompt import THOUGHT_BLOCK
from canvasread.canvas.vllm.settings import VllmSettings
from canvasread.catalog import open_decider
from canvasread.cli import app as cli_app
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.settings import ServerSettings
from canvasread.wire import parse_request

STATE = {"ticket": "I was charged twice for order 1182 — please refund me.", "channel": "email"}

# vLLM 0.33's `CompletionRequest` (vllm/entrypoints/openai/completion/protocol.py): `model: str | None`,
# `prompt: list[int] | …`, `max_tokens: int | None`, `logprobs: int | None`, `logprob_token_ids: list[int] | None`
# (at most MAX_LOGPROB_TOKEN_IDS = 128; `logprobs` must be set, and is then ignored), `return_tokens_as_token_ids:
# bool | None`, `temperature`/`top_p`/`min_p: float | None`, `top_k: int | None` (0 disables),
# `vllm_xargs: dict[str, str | int | float | list[str | int | float]]`.
COMPLETION_FIELDS: dict[str, type] = {
    "model": str,
    "prompt": list,
    "max_tokens": int,
    "logprobs": int,
    "logprob_token_ids": list,
    "return_tokens_as_token_ids": bool,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "vllm_xargs": dict,
}
# The diffusion keys `validate_diffusion_sampling_params` checks (PR 57250): a list of token ids, positive
# integers (bools refused), a boolean (strings refused).
DIFFUSION_XARGS: dict[str, type] = {
    "diffusion_seed_canvas": list,
    "diffusion_canvas_length": int,
    "diffusion_max_steps": int,
    "diffusion_read_only": bool,
}
VOCAB = 262_144


def noul(text: str) -> dict[str, Any]:
    return {"type": "noul", "instructions": text}


def mixed(count: int) -> dict[str, Any]:
    """`count` questions cycling through the three types."""
    questions: dict[str, Any] = {}
    for i in range(count):
        if i % 3 == 0:
            questions[f"q{i}"] = noul(f"Is statement {i} true?")
        elif i % 3 == 1:
            criteria = {"billing": "charges", "technical": None, "sales": "orders"}
            questions[f"q{i}"] = {"type": "choice", "instructions": "Which team?", "criteria": criteria}
        else:
            questions[f"q{i}"] = {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]}
    return questions


def wide_choice(options: int) -> dict[str, Any]:
    criteria = {f"intent_{i}": None for i in range(options)}
    return {"intent": {"type": "choice", "instructions": "Which intent?", "criteria": criteria}, "spam": noul("Spam?")}


@pytest.fixture(scope="module")
def standin(tiny_wide_checkpoint: Path) -> Iterator[tuple[str, Standin]]:
    served = load_standin(str(tiny_wide_checkpoint), served_name="dgemma")
    with running(served) as base:
        yield base, served


def proxy_for(base: str, tiny_wide_checkpoint: Path, *, load: bool = True, layout: str = "default") -> Decider:
    """The library equivalent of `serve --upstream BASE --tokenizer TINY --upstream-canvas-length 256 --layout L`."""
    upstream = VllmSettings(urls=(base,), tokenizer=str(tiny_wide_checkpoint), canvas_length=256, probe_interval_s=0.2)
    return open_decider((), wings=[upstream], load=load, reading=ReadSettings(layout=layout_named(layout)))


def close(decider: Decider) -> None:
    backend = canvas_backend(decider)
    backend.close()


@pytest.fixture(scope="module")
def proxy(standin: tuple[str, Standin], tiny_wide_checkpoint: Path) -> Iterator[Decider]:
    decider = proxy_for(standin[0], tiny_wide_checkpoint)
    yield decider
    close(decider)


@pytest.mark.parametrize(
    ("questions", "extensions"),
    [
        pytest.param({"refund": noul("Is the customer asking for money back?")}, {"samples": 1}, id="one-noul"),
        pytest.param(mixed(3), {"samples": 1}, id="three-types"),
        pytest.param(mixed(60), {"samples": 1}, id="several-canvases"),
        pytest.param(mixed(9), {"samples": 3}, id="three-reads"),
        pytest.param(mixed(12), {"samples": "auto"}, id="auto-rereads"),
        pytest.param(wide_choice(200), {"samples": 1}, id="over-128-label-ids"),
    ],
)
def test_proxy_answers_equal_the_in_process_engine(
    proxy: Decider, tiny_wide_decider: Decider, questions: dict[str, Any], extensions: dict[str, Any]
) -> None:
    body = {"seed": 17, "diagnostics": True, **extensions}
    remote = proxy.ask(STATE, questions, **body)
    local = tiny_wide_decider.ask(STATE, questions, **body)
    assert remote["usage"] == local["usage"]
    assert remote["answers"].keys() == local["answers"].keys()  # type: ignore[union-attr]
    for key, answer in remote["answers"].items():  # type: ignore[union-attr]
        expected = local["answers"][key]  # type: ignore[index]
        assert answer["diagnostics"]["reads"] == expected["diagnostics"]["reads"], key
        kind = answer["type"]
        if kind == "noul":
            assert answer["noul"] == pytest.approx(expected["noul"], abs=1e-5), key
            continue
        got, want = answer["probabilities"], expected["probabilities"]
        assert list(got) == list(want)
        assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-5), key
        if kind == "choice":
            assert answer["choice"] == expected["choice"], key
        else:
            assert answer["score"] == pytest.approx(expected["score"], abs=1e-5), key
    reads = [a["diagnostics"]["reads"] for a in remote["answers"].values()]  # type: ignore[union-attr]
    if extensions["samples"] == "auto":
        assert 1 in reads and max(reads) > 1, "some questions should be re-read, others not"


@pytest.mark.parametrize(("layout", "count"), [("prompt-per-canvas", 60), ("bare-single", 1)])
def test_layouts_with_their_own_prompts_read_through_vllm_as_in_process(
    standin: tuple[str, Standin], tiny_wide_checkpoint: Path, layout: str, count: int
) -> None:
    questions = mixed(count)
    remote_decider = proxy_for(standin[0], tiny_wide_checkpoint, layout=layout)
    local_decider = open_decider((str(tiny_wide_checkpoint),), reading=ReadSettings(layout=layout_named(layout)))
    try:
        job, sent = read_requests(remote_decider, standin[1], questions, seed=9, samples=1)
        assert {tuple(body["prompt"]) for body in sent} == {prompt.ids for prompt in job.plan.prompts}
        assert len(job.plan.prompts) == (2 if count > 1 else 1)
        remote = remote_decider.ask(STATE, questions, seed=9, samples=1)
        local = local_decider.ask(STATE, questions, seed=9, samples=1)
    finally:
        close(remote_decider)
    assert remote["usage"] == local["usage"]
    for key, answer in remote["answers"].items():  # type: ignore[union-attr]
        probabilities = answer["probabilities"] if "probabilities" in answer else {"true": answer["noul"]}
        expected = local["answers"][key]  # type: ignore[index]
        wanted = expected["probabilities"] if "probabilities" in expected else {"true": expected["noul"]}
        assert list(probabilities.values()) == pytest.approx(list(wanted.values()), abs=1e-5), key


def read_requests(
    proxy: Decider, served: Standin, questions: dict[str, Any], **extensions: Any
) -> tuple[CanvasJob, list[dict[str, Any]]]:
    """Decide one request through the backend; the job and every request it sent upstream."""
    backend = canvas_backend(proxy)
    job = backend.prepare(parse_request({"model": "dgemma", "state": STATE, "questions": questions, **extensions})[1])
    before = len(served.requests)
    backend.decide([job])
    return job, served.requests[before:]


def check_fields(body: dict[str, Any]) -> None:
    assert body.keys() == COMPLETION_FIELDS.keys()
    for name, kind in COMPLETION_FIELDS.items():
        assert type(body[name]) is kind, name
    xargs = body["vllm_xargs"]
    assert xargs.keys() == DIFFUSION_XARGS.keys()
    for name, kind in DIFFUSION_XARGS.items():
        assert type(xargs[name]) is kind, name
    for ids in (body["prompt"], body["logprob_token_ids"], xargs["diffusion_seed_canvas"]):
        assert all(type(i) is int and 0 <= i < VOCAB for i in ids)
    assert body["model"] == "dgemma"
    assert body["return_tokens_as_token_ids"] is True
    assert xargs["diffusion_max_steps"] == 1 and xargs["diffusion_read_only"] is True
    assert xargs["diffusion_canvas_length"] == len(xargs["diffusion_seed_canvas"]) == body["max_tokens"] <= 256
    assert body["logprob_token_ids"] == sorted(set(body["logprob_token_ids"]))
    assert 1 <= len(body["logprob_token_ids"]) <= 128 and body["logprobs"] == len(body["logprob_token_ids"])
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (1.0, 1.0, 0, 0.0)


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
    proxy: Decider, standin: tuple[str, Standin], questions: dict[str, Any], samples: int, canvases: int
) -> None:
    job, sent = read_requests(proxy, standin[1], questions, seed=5, samples=samples)
    assert len(job.plan.canvases) >= canvases
    runtime = loaded_runtime(canvas_backend(proxy))
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
    proxy: Decider, standin: tuple[str, Standin]
) -> None:
    job, sent = read_requests(proxy, standin[1], wide_choice(200), seed=3, samples=1)
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
    standin: tuple[str, Standin], change: dict[str, Any], message: str
) -> None:
    body: dict[str, Any] = {
        "model": "dgemma",
        "prompt": [2, 105, 2364],
        "max_tokens": 16,
        "logprobs": 2,
        "logprob_token_ids": [4443, 1294],
        "return_tokens_as_token_ids": True,
        "vllm_xargs": {
            "diffusion_seed_canvas": [0] * 16,
            "diffusion_canvas_length": 16,
            "diffusion_max_steps": 1,
            "diffusion_read_only": True,
        },
    }
    assert httpx.post(standin[0] + "/v1/completions", json=body, timeout=30).status_code == 200
    broken = {**body, **change, "vllm_xargs": {**body["vllm_xargs"], **change.get("vllm_xargs", {})}}
    refused = httpx.post(standin[0] + "/v1/completions", json=broken, timeout=30)
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


def test_past_the_sliding_window_vllm_and_transformers_read_differently(
    tiny_checkpoint: Path, tiny_decider: Decider
) -> None:
    """vLLM gives each canvas token a symmetric window on sliding layers; transformers (and the in-process
    engine) give every canvas token the last window−1 prompt tokens. On the tiny checkpoint (window 24) every
    prompt is past the window, so the proxy's answers differ; the stand-in told to use transformers' semantics
    agrees again, so the difference is the window and nothing else."""
    questions = mixed(3)
    local = tiny_decider.ask(STATE, questions, seed=2, samples=1)["answers"]
    answers = {}
    for semantics in ("vllm", "transformers"):
        served = load_standin(str(tiny_checkpoint), served_name="dgemma", sliding_semantics=semantics)
        with running(served) as base:
            decider = proxy_for(base, tiny_checkpoint)
            try:
                answers[semantics] = decider.ask(STATE, questions, seed=2, samples=1)["answers"]
            finally:
                close(decider)
    for key, want in local.items():  # type: ignore[union-attr]
        same = want["probabilities"] if want["type"] != "noul" else {"p": want["noul"]}
        for semantics, expected_equal in (("vllm", False), ("transformers", True)):
            got = answers[semantics][key]  # type: ignore[index]
            got = got["probabilities"] if got["type"] != "noul" else {"p": got["noul"]}
            close_enough = list(got.values()) == pytest.approx(list(same.values()), abs=1e-5)
            assert close_enough is expected_equal, (key, semantics)


DEPOTS = [
    "north",
    "south",
    "east",
    "west",
    "harbour",
    "airport",
    "river",
    "canal",
    "bridge",
    "tower",
    "castle",
    "meadow",
    "orchard",
    "quarry",
    "station",
    "garden",
    "market",
    "temple",
    "valley",
    "summit",
    "forest",
    "island",
    "lagoon",
    "desert",
    "glacier",
    "canyon",
    "prairie",
    "village",
    "factory",
    "mill",
    "bakery",
    "library",
    "museum",
    "theatre",
    "stadium",
    "hospital",
    "school",
    "college",
    "chapel",
    "lighthouse",
    "pier",
    "dock",
    "wharf",
    "arsenal",
    "barracks",
    "cottage",
    "manor",
    "palace",
    "fortress",
    "citadel",
    "bazaar",
    "plaza",
    "avenue",
    "boulevard",
    "alley",
    "tunnel",
    "viaduct",
    "aqueduct",
    "reservoir",
    "vineyard",
    "ranch",
    "dairy",
    "granary",
    "foundry",
    "forge",
    "tannery",
    "brewery",
    "distillery",
    "pottery",
]
SPAN_STATE = (
    "Zoë Brontë wrote on 3 March about order 1182: the parcel for 李雷 went to 12 Rue de Rivoli instead of "
    + ", ".join(f"depot {word} ({word.upper()})" for word in DEPOTS)
    + ". Please refund the courier fee 🦜 and call back before 9:30; ask for Ingrid, Mateus or Oluwaseun."
)
SPAN_QUESTIONS: dict[str, Any] = {
    "who": {"type": "span", "instructions": "Who wrote?"},
    "names": {"type": "spans", "instructions": "Every person named"},
    "refund": noul("Is a refund asked for?"),
}


def test_span_answers_through_vllm_equal_a_single_step_read_in_process(
    proxy: Decider, tiny_wide_checkpoint: Path
) -> None:
    """This state's blank asks more than vLLM's 128 label ids a request, and each request denoises on its own, so
    through vLLM the blank reads one step; in process the `-naive` baseline (plain forwards) reads one step too."""
    body = {"seed": 23, "diagnostics": True, "samples": 1}
    remote = proxy.ask(SPAN_STATE, SPAN_QUESTIONS, **body)["answers"]
    single = open_decider((str(tiny_wide_checkpoint),), engine=EngineSettings(naive_baseline=True))
    local = single.ask(SPAN_STATE, SPAN_QUESTIONS, model=f"{tiny_wide_checkpoint.name}-naive", **body)["answers"]
    assert remote["who"]["diagnostics"]["steps"] == local["who"]["diagnostics"]["steps"] == 1  # type: ignore[index]
    for key in ("who", "names"):
        got, want = remote[key], local[key]  # type: ignore[index]
        pieces = got["spans"] if key == "names" else [got]
        assert [(p["start"], p["end"], p["text"]) for p in pieces] == [
            (p["start"], p["end"], p["text"]) for p in (want["spans"] if key == "names" else [want])
        ]
        assert all(SPAN_STATE[p["start"] : p["end"]] == p["text"] for p in pieces)
        assert got["confidence"] == pytest.approx(want["confidence"], abs=1e-5), key
        rounds = zip(got["diagnostics"]["rounds"], want["diagnostics"]["rounds"], strict=True)
        for there, here in rounds:
            assert there["mass"] == pytest.approx(here["mass"], rel=1e-3) and there["candidates"] == here["candidates"]


def test_a_blank_read_asks_the_states_ids_in_groups_of_at_most_128(
    proxy: Decider, standin: tuple[str, Standin]
) -> None:
    """vLLM takes at most 128 logprob_token_ids a request: one blank read is split over identical requests."""
    backend = canvas_backend(proxy)
    request = {"model": "dgemma", "state": SPAN_STATE, "questions": {"who": SPAN_QUESTIONS["who"]}, "seed": 2}
    job = backend.prepare(parse_request({**request, "samples": 1})[1])
    before = len(standin[1].requests)
    backend.decide([job])
    sent = standin[1].requests[before:]
    assert job.state is not None
    wanted = {
        *job.state.distinct_ids,
        *loaded_runtime(backend).tokenizer.encode("<turn|>"),
    }  # the state's and the end's
    assert len(wanted) > 128 and len(sent) == -(-len(wanted) // 128)
    for body in sent:
        check_fields(body)
    asked = [set(body["logprob_token_ids"]) for body in sent]
    assert set().union(*asked) == wanted and sum(map(len, asked)) == len(wanted)
    assert len({tuple(body["vllm_xargs"]["diffusion_seed_canvas"]) for body in sent}) == 1


def test_a_small_states_blank_reads_three_steps_through_vllm_with_the_line_pinned(
    proxy: Decider, standin: tuple[str, Standin]
) -> None:
    """Under 128 ids a blank is one request a read, so it takes the blank's steps there too: pinned up to the blank."""
    state = "Refund Zoë Brontë for order 1182; Ingrid approved it."
    before = len(standin[1].requests)
    answers = proxy.ask(state, SPAN_QUESTIONS, seed=6, samples=1, diagnostics=True)["answers"]
    sent = [body for body in standin[1].requests[before:] if body["vllm_xargs"].get("diffusion_max_steps", 1) > 1]
    assert sent, "the blanks were read with several steps"
    for key in ("who", "names"):
        answer = answers[key]  # type: ignore[index]
        assert answer["diagnostics"]["steps"] == 3
        pieces = answer["spans"] if key == "names" else [answer] if answer["found"] else []
        assert all(state[p["start"] : p["end"]] == p["text"] for p in pieces)
    for body in sent:
        xargs = body["vllm_xargs"]
        pinned = xargs["diffusion_pinned"]
        assert xargs["diffusion_max_steps"] == 3 and pinned == list(range(len(pinned)))  # the line before the blank
        assert len(body["logprob_token_ids"]) <= 128
