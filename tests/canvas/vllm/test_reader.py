"""The vLLM reader's pure parts: grouping label ids, building the completions body, parsing the logprob rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest

from canvasread.canvas.reader import CanvasRead, Slot
from canvasread.canvas.vllm.reader import (
    NEUTRAL_SAMPLING,
    VllmReader,
    completion_body,
    label_id_groups,
    logprob_at,
    logprob_rows,
)
from canvasread.errors import UpstreamFailure
from canvasread.upstream.pool import UpstreamPool


def test_shared_label_ids_are_asked_once_and_groups_respect_the_cap() -> None:
    slots = [Slot(0, (5, 3)), Slot(1, (3, 5)), Slot(2, (7, 8, 9))]
    assert label_id_groups(slots) == [(3, 5, 7, 8, 9)]
    # a slot's new ids start a new group rather than straddle two
    assert label_id_groups(slots, cap=3) == [(3, 5), (7, 8, 9)]
    # only a slot with more labels than the cap is split
    assert label_id_groups([Slot(0, tuple(range(7)))], cap=3) == [(0, 1, 2), (3, 4, 5), (6,)]


def test_the_body_sends_ids_verbatim_and_pins_every_sampling_field() -> None:
    read = CanvasRead(prompt_ids=(2, 10, 11), prefix_length=2, canvas_ids=(40, 41, 42, 43), slots=(Slot(1, (7, 8)),))
    body = completion_body("dgemma", read, (7, 8))
    assert body["model"] == "dgemma" and body["prompt"] == [2, 10, 11]
    assert body["max_tokens"] == 4
    assert body["logprob_token_ids"] == [7, 8] and body["logprobs"] == 2
    assert body["return_tokens_as_token_ids"] is True
    assert {key: body[key] for key in NEUTRAL_SAMPLING} == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
    assert body["vllm_xargs"] == {
        "diffusion_seed_canvas": [40, 41, 42, 43],
        "diffusion_canvas_length": 4,
        "diffusion_max_steps": 1,
        "diffusion_read_only": True,
    }
    assert "seed" not in body  # vLLM refuses a seed on diffusion requests


def answer(*rows: Mapping[str, Any]) -> dict[str, Any]:
    return {"choices": [{"logprobs": {"top_logprobs": list(rows)}}]}


def test_rows_are_read_from_choices_and_anything_else_is_an_upstream_failure() -> None:
    assert logprob_rows(answer({"token_id:1": -0.5})) == [{"token_id:1": -0.5}]
    for broken in ({}, {"choices": []}, {"choices": [{"logprobs": None}]}, [1, 2]):
        with pytest.raises(UpstreamFailure, match="top_logprobs"):
            logprob_rows(broken)
    with pytest.raises(UpstreamFailure, match="not a list"):
        logprob_rows({"choices": [{"logprobs": {"top_logprobs": {"0": {}}}}]})


def test_a_logprob_must_be_present_finite_enough_and_at_most_zero() -> None:
    rows = [{"token_id:7": -1.25, "token_id:8": 0.00001, "token_id:9": 0.5, "token_id:10": True}]
    assert logprob_at(rows, 0, 7) == -1.25
    assert logprob_at(rows, 0, 8) == 0.0  # float noise above zero is clipped
    with pytest.raises(UpstreamFailure, match=r"0\.5"):
        logprob_at(rows, 0, 9)
    with pytest.raises(UpstreamFailure, match="True"):
        logprob_at(rows, 0, 10)
    with pytest.raises(UpstreamFailure, match="no logprob for token 11"):
        logprob_at(rows, 0, 11)
    with pytest.raises(UpstreamFailure, match="position 3"):
        logprob_at(rows, 3, 7)
    with pytest.raises(UpstreamFailure):
        logprob_at([{"token_id:7": float("nan")}], 0, 7)


class FakePool:
    """Answers each completions body from a table of log p(token at position), recording the bodies."""

    def __init__(self, table: Mapping[tuple[int, int], float]) -> None:
        self.table = table
        self.bodies: list[dict[str, Any]] = []

    def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/v1/completions"
        self.bodies.append(body)
        rows = [
            {f"token_id:{t}": self.table.get((position, t), -30.0) for t in body["logprob_token_ids"]}
            for position in range(body["max_tokens"])
        ]
        return answer(*rows)

    def counters(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        return None


def test_read_files_each_slots_label_logprobs_in_label_order_across_groups() -> None:
    pool = FakePool({(0, 1): -0.1, (0, 2): -2.0, (2, 3): -0.7, (2, 1): -4.0})
    reader = VllmReader(cast(UpstreamPool, pool), "dgemma", concurrency=2)
    try:
        read = CanvasRead((1, 2), 1, (9, 9, 9), (Slot(0, (2, 1)), Slot(2, (1, 3))))
        [slots] = reader.read([read])
    finally:
        reader.close()
    assert [s.label_logprobs for s in slots] == [(-2.0, -0.1), (-4.0, -0.7)]
    assert len(pool.bodies) == 1 and reader.counters()["reads"] == 1.0
