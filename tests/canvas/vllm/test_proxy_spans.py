"""Span answers through the vLLM proxy: a blank's ids asked 128 a request, or read in steps with the line pinned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import canvas_backend, loaded_runtime
from vllm_proxy import check_fields, noul
from vllm_standin import Standin

from canvasread.canvas.engine.settings import EngineSettings
from canvasread.catalog import open_decider
from canvasread.decide import Decider
from canvasread.wire import parse_request

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
    wide_proxy: Decider, tiny_wide_checkpoint: Path
) -> None:
    """This state's blank asks more than vLLM's 128 label ids a request, and each request denoises on its own, so
    through vLLM the blank reads one step; in process the `-naive` baseline (plain forwards) reads one step too."""
    body = {"seed": 23, "diagnostics": True, "samples": 1}
    remote = wide_proxy.ask(SPAN_STATE, SPAN_QUESTIONS, **body)["answers"]
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
    wide_proxy: Decider, wide_standin: tuple[str, Standin]
) -> None:
    """vLLM takes at most 128 logprob_token_ids a request: one blank read is split over identical requests."""
    backend = canvas_backend(wide_proxy)
    request = {"model": "dgemma", "state": SPAN_STATE, "questions": {"who": SPAN_QUESTIONS["who"]}, "seed": 2}
    job = backend.prepare(parse_request({**request, "samples": 1})[1])
    before = len(wide_standin[1].requests)
    backend.decide([job])
    sent = wide_standin[1].requests[before:]
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
    wide_proxy: Decider, wide_standin: tuple[str, Standin]
) -> None:
    """Under 128 ids a blank is one request a read, so it takes the blank's steps there too: pinned up to the blank."""
    state = "Refund Zoë Brontë for order 1182; Ingrid approved it."
    before = len(wide_standin[1].requests)
    answers = wide_proxy.ask(state, SPAN_QUESTIONS, seed=6, samples=1, diagnostics=True)["answers"]
    sent = [body for body in wide_standin[1].requests[before:] if body["vllm_xargs"].get("diffusion_max_steps", 1) > 1]
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
