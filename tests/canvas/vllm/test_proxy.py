"""Answers through the vLLM proxy equal the in-process engine's on the same checkpoint and seed, and where they part."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_proxy import STATE, close, mixed, noul, proxy_for, read_requests, wide_choice
from vllm_standin import Standin, load_standin, running

from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.layouts import layout_named
from canvasread.catalog import open_decider
from canvasread.decide import Decider


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
    wide_proxy: Decider, tiny_wide_decider: Decider, questions: dict[str, Any], extensions: dict[str, Any]
) -> None:
    body = {"seed": 17, "diagnostics": True, **extensions}
    remote = wide_proxy.ask(STATE, questions, **body)
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
    wide_standin: tuple[str, Standin], tiny_wide_checkpoint: Path, layout: str, count: int
) -> None:
    questions = mixed(count)
    remote_decider = proxy_for(wide_standin[0], tiny_wide_checkpoint, layout=layout)
    local_decider = open_decider((str(tiny_wide_checkpoint),), reading=ReadSettings(layout=layout_named(layout)))
    try:
        job, sent = read_requests(remote_decider, wide_standin[1], questions, seed=9, samples=1)
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
