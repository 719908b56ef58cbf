"""The vLLM proxy tests' shared pieces: the request they ask, a proxy over the stand-in, vLLM's completion fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import canvas_backend
from vllm_standin import Standin

from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.job import CanvasJob
from canvasread.canvas.layouts import layout_named
from canvasread.canvas.vllm.settings import VllmSettings
from canvasread.catalog import open_decider
from canvasread.decide import Decider
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


def proxy_for(base: str, tiny_wide_checkpoint: Path, *, load: bool = True, layout: str = "default") -> Decider:
    """The library equivalent of `serve --upstream BASE --tokenizer TINY --upstream-canvas-length 256 --layout L`."""
    upstream = VllmSettings(urls=(base,), tokenizer=str(tiny_wide_checkpoint), canvas_length=256, probe_interval_s=0.2)
    return open_decider((), wings=[upstream], load=load, reading=ReadSettings(layout=layout_named(layout)))


def close(decider: Decider) -> None:
    backend = canvas_backend(decider)
    backend.close()


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
