"""Stand-ins for the peers the systemone wing reads: tiny FastAPI apps that answer `/v1/systemone` in each
peer's own dialect, as read in its source.

- `vllm`: vLLM 0.33 `vllm/entrypoints/generate/structured_decisions/` and `entrypoints/openai/decisions/`:
  the request model forbids unknown top-level keys; a question's extra fields, more than 64 questions, more
  than 26 options (labels A–Z) or 10 levels, fewer than 2 levels are `{"error": {...}}` 400s (validation errors
  too); an unknown model is a 404; values are read with `str()`; the answer envelope carries `id`, `object`,
  `created`, per-question `diagnostics` (label mass) and `joint`; a noul answer has `probabilities`
  (`yes`/`no`) and `confidence`.
- `sglang`: SGLang 0.5.23 `sglang/srt/entrypoints/systemone/`: unknown top-level keys ignored, questions
  `extra="forbid"`, 1–255 options with distinct non-blank names, 1–10 non-blank levels, values str/object/
  array only, a noul needs something to ask; validation errors are FastAPI's 422 list (no `input`), a
  tokenizer without two-letter labels refuses more than 26 options (400, SGLang's flat error); answers
  carry `x_label_mass`, a noul only `noul`.
- `jev`: the hosted API as typesafe-sdk reads it: numbers rounded to 2 decimals, 529 when full, errors
  `{"detail": ...}`, models `{"models": [{"name", ...}]}`, no `/health`.

Each answers from one scorer: an option's logit is a hash of (state, instructions, option) in [0, 1), plus 4
when the option's name (a whole word) (or a noul's instructions) appears in the state, so answers are deterministic and
tests can tell right from wrong. `full` answers the next calls with the peer's "queue full"; `requests`
keeps every body.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from helpers import eventually, free_port

VLLM_MAX_QUESTIONS, VLLM_LABELS, MAX_LEVELS, SGLANG_MAX_OPTIONS = 64, 26, 10, 255


@dataclass
class Peer:
    """One stand-in peer: its dialect, the model it serves, and what it has seen."""

    dialect: str
    model: str = "decider"
    api_key: str | None = None
    full: int = 0
    # SGLang labels options past 26 only when the tokenizer has two-letter labels (else a 400).
    pair_labels: bool = True
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_full(self) -> bool:
        with self.lock:
            if self.full > 0:
                self.full -= 1
                return True
            return False


def text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def distribution(state: Any, instructions: Any, names: list[str], descriptions: list[Any]) -> list[float]:
    """The stand-ins' model: a softmax over hashed logits, +4 for an option the state names."""
    seen = text(state).lower()
    logits = []
    for name, description in zip(names, descriptions, strict=True):
        digest = hashlib.sha256(f"{text(state)}|{text(instructions)}|{name}|{text(description)}".encode()).digest()
        named = re.search(rf"\b{re.escape(name.lower())}\b", seen) is not None
        logits.append(digest[0] / 256 + (4.0 if named else 0.0))
    top = max(logits)
    weights = [math.exp(logit - top) for logit in logits]
    return [w / sum(weights) for w in weights]


def noul_distribution(state: Any, instructions: Any, criteria: Any) -> list[float]:
    """P(yes), P(no): yes leans on the instructions' last word appearing in the state."""
    words = text(instructions).lower().strip("?. ").split()
    hit = bool(words) and words[-1] in text(state).lower()
    base = distribution(state, instructions, ["yes", "no"], [text(criteria), None])
    p_yes = 0.9 if hit else base[0] * 0.5
    return [p_yes, 1.0 - p_yes]


def confidence(probabilities: list[float]) -> float:
    k = len(probabilities)
    return 1.0 if k == 1 else min(1.0, max(0.0, (max(probabilities) - 1 / k) / (1 - 1 / k)))


# ---- vLLM 0.33 ----------------------------------------------------------------------------------------------
VLLM_TOP = {"model", "state", "questions", "instructions", "images", "audio", "videos", "chat_template_kwargs"}
VLLM_TOP |= {"joint", "cache_salt", "priority", "request_id"}


def vllm_error(message: str, status: int = 400) -> JSONResponse:
    kind = {404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, "BadRequestError")
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


def vllm_answer(peer: Peer, body: dict[str, Any]) -> JSONResponse:
    if unknown := sorted(set(body) - VLLM_TOP):
        return vllm_error(f"extra inputs are not permitted: {unknown}")
    if body.get("model") not in (None, peer.model):
        return vllm_error(f"The model `{body.get('model')}` does not exist.", 404)
    questions = body.get("questions") or {}
    if len(questions) > VLLM_MAX_QUESTIONS:
        return vllm_error(f"questions: at most {VLLM_MAX_QUESTIONS} for this model")
    answers, diagnostics = {}, {}
    for qid, spec in questions.items():
        if extra := sorted(set(spec) - {"type", "instructions", "criteria"}):
            return vllm_error(f"question {qid!r}: unknown field(s) {extra}")
        kind, criteria, instructions = spec["type"], spec.get("criteria"), str(spec.get("instructions") or "")
        if kind == "noul":
            p = noul_distribution(body["state"], instructions, criteria)
            answers[qid] = {"type": "noul", "noul": p[0], "probabilities": {"yes": p[0], "no": p[1]}}
            answers[qid]["confidence"] = max(p) * 0.9
        else:
            names = [str(n) for n in criteria] if kind == "choice" else [str(level) for level in criteria]
            limit = VLLM_LABELS if kind == "choice" else MAX_LEVELS
            if len(names) > limit or (kind == "score" and len(names) < 2):
                return vllm_error(f"question {qid!r}: at most {limit} options for this model")
            described = [criteria[n] for n in criteria] if kind == "choice" else [None] * len(names)
            if any(d is not None and not isinstance(d, str) for d in described):
                return vllm_error(f"question {qid!r}: this stand-in reads str() values only")
            p = distribution(body["state"], instructions, names, described)
            top = max(range(len(p)), key=p.__getitem__)
            if kind == "choice":
                probabilities = dict(zip(names, p, strict=True))
                answers[qid] = {"type": "choice", "choice": names[top], "probabilities": probabilities}
            else:
                legend = {str(i): n for i, n in enumerate(names)}
                score = sum(i * x for i, x in enumerate(p))
                answers[qid] = {"type": "score", "score": score, "legend": legend}
                answers[qid]["probabilities"] = {str(i): x for i, x in enumerate(p)}
            answers[qid]["confidence"] = p[top] * 0.9
        diagnostics[qid] = {"label_mass": 0.9, "argmax_is_label": True}
    envelope = {"id": "decision-1", "object": "structured_decision", "created": int(time.time()), "model": peer.model}
    usage = {"input_tokens": 10 * len(questions), "output_tokens": len(questions)}
    return JSONResponse({**envelope, "answers": answers, "usage": usage, "diagnostics": diagnostics, "joint": None})


# ---- SGLang 0.5.23 ------------------------------------------------------------------------------------------
def sglang_problem(qid: str, spec: dict[str, Any]) -> str | None:
    """What SGLang's pydantic models refuse in one question (a 422), or None."""
    kind, criteria = spec.get("type"), spec.get("criteria")
    if extra := sorted(set(spec) - {"type", "instructions", "criteria"}):
        return f"extra inputs are not permitted: {extra}"
    values = [spec.get("instructions"), *(criteria.values() if isinstance(criteria, dict) else criteria or [])]
    if any(v is not None and not isinstance(v, str | dict | list) for v in values):
        return "values must be text, objects or arrays"
    if kind == "choice":
        keys = [n.strip().casefold() for n in criteria]
        if not 1 <= len(criteria) <= SGLANG_MAX_OPTIONS or len(set(keys)) != len(keys) or not all(keys):
            return "choice criteria: 1 to 255 distinct non-blank names"
    elif kind == "score":
        if not 1 <= len(criteria) <= MAX_LEVELS or any(not text(level).strip() for level in criteria):
            return "score criteria: 1 to 10 non-blank levels"
    elif kind == "noul":
        sides = list((criteria or {}).values())
        if not any(v not in (None, "") for v in [spec.get("instructions"), *sides]):
            return "a noul question needs instructions or a true or false description to decide on"
    else:
        return f"unknown type {kind!r}"
    return None


def sglang_answer(peer: Peer, body: dict[str, Any]) -> JSONResponse:
    questions = body.get("questions")
    if not isinstance(questions, dict) or not questions or "model" not in body:
        return JSONResponse(
            {"detail": [{"loc": ["body", "questions"], "msg": "Field required", "type": "missing"}]}, 422
        )
    answers = {}
    for qid, spec in questions.items():
        if (problem := sglang_problem(qid, spec)) is not None:
            detail = [{"loc": ["body", "questions", qid], "msg": problem, "type": "value_error"}]
            return JSONResponse({"detail": detail}, 422)
        if spec["type"] == "choice" and len(spec["criteria"]) > VLLM_LABELS and not peer.pair_labels:
            message = f"question {qid!r}: more than 26 options needs added tokens the server can read"
            error = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse(error, 400)
        kind, criteria, instructions = spec["type"], spec.get("criteria"), spec.get("instructions")
        if kind == "noul":
            answers[qid] = {"type": "noul", "noul": noul_distribution(body["state"], instructions, criteria)[0]}
        else:
            names = list(criteria) if kind == "choice" else [str(i) for i in range(len(criteria))]
            described = list(criteria.values()) if kind == "choice" else list(criteria)
            p = distribution(body["state"], instructions, names, described)
            top = max(range(len(p)), key=p.__getitem__)
            answers[qid] = {"type": kind, **({"choice": names[top]} if kind == "choice" else {})}
            if kind == "score":
                answers[qid]["score"] = sum(i * x for i, x in enumerate(p))
                answers[qid]["legend"] = dict(zip(names, described, strict=True))
            answers[qid].update({"confidence": confidence(p), "probabilities": dict(zip(names, p, strict=True))})
        answers[qid]["x_label_mass"] = 0.8
    return JSONResponse({"model": peer.model, "answers": answers, "usage": {"input_tokens": 7 * len(answers)}})


# ---- plain Jev (the hosted API) -----------------------------------------------------------------------------
def jev_answer(peer: Peer, body: dict[str, Any]) -> JSONResponse:
    if body.get("model") != peer.model:
        detail = {"error_type": "api_usage_error", "message": f"Unknown model: {body.get('model')}"}
        return JSONResponse({"detail": detail}, 400)
    answers = {}
    for qid, spec in body["questions"].items():
        kind, criteria, instructions = spec["type"], spec.get("criteria"), spec.get("instructions")
        if kind == "noul":
            answers[qid] = {
                "type": "noul",
                "noul": round(noul_distribution(body["state"], instructions, criteria)[0], 2),
            }
            continue
        names = list(criteria) if kind == "choice" else [str(i) for i in range(len(criteria))]
        described = list(criteria.values()) if kind == "choice" else list(criteria)
        p = distribution(body["state"], instructions, names, described)
        top = max(range(len(p)), key=p.__getitem__)
        answer: dict[str, Any] = {"type": kind}
        answer.update({"choice": names[top]} if kind == "choice" else {"score": sum(i * x for i, x in enumerate(p))})
        answer["confidence"] = confidence(p)
        if kind == "score":
            answer["legend"] = dict(zip(names, described, strict=True))
        answer["probabilities"] = {n: round(x, 2) for n, x in zip(names, p, strict=True)}
        answers[qid] = {k: round(v, 2) if isinstance(v, float) else v for k, v in answer.items()}
    usage = {"input_tokens": 5 * len(answers), "output_tokens": len(answers)}
    return JSONResponse({"model": peer.model + "-1.0.0", "answers": answers, "usage": usage})


ANSWER = {"vllm": vllm_answer, "sglang": sglang_answer, "jev": jev_answer}
BUSY = {"vllm": 503, "sglang": 503, "jev": 529}


def create_app(peer: Peer) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if peer.api_key and request.url.path.startswith("/v1") and (scheme.lower() != "bearer" or key != peer.api_key):
            if peer.dialect == "jev":
                detail = {"error_type": "authentication_error", "message": "Invalid API key"}
                return JSONResponse({"detail": detail}, 401)
            return JSONResponse({"error": "Unauthorized"}, 401)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return vllm_error(str(error.errors()))

    if peer.dialect != "jev":

        @app.get("/health")
        def health() -> dict[str, str]:
            return {}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        if peer.dialect == "jev":
            return {"models": [{"name": peer.model, "description": "stand-in", "release_date": "2026-01-01"}]}
        entry = {"id": peer.model, "object": "model", "root": f"/models/{peer.model}", "owned_by": peer.dialect}
        return {"object": "list", "data": [{**entry, "max_model_len": 4096}]}

    @app.post("/v1/systemone")
    async def systemone(request: Request) -> JSONResponse:
        body = await request.json()
        peer.requests.append(body)
        if peer.take_full():
            message = "queue full" if peer.dialect != "jev" else "Overloaded"
            if peer.dialect == "jev":
                return JSONResponse({"detail": {"error_type": "overloaded", "message": message}}, 529)
            return vllm_error(message, BUSY[peer.dialect])
        return ANSWER[peer.dialect](peer, body)

    return app


@contextmanager
def running(peer: Peer, port: int | None = None) -> Iterator[str]:
    """Serve `peer` on loopback in a thread; yields its base URL once it answers."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(peer), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        eventually(lambda: server.started, timeout=30, what=f"the {peer.dialect} stand-in on port {port}")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
