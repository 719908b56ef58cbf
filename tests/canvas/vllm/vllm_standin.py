"""A loopback stand-in for the part of vLLM's OpenAI-compatible server that canvasread uses.

vLLM needs a GPU and a model hub, so the proxy path is tested against this:
`GET /health`, `GET /v1/models` and `POST /v1/completions` with a token-id
prompt, `logprob_token_ids` and the diffusion read-only `vllm_xargs`, as vLLM
0.33 behaves (read in its `completion/protocol.py`, `sampling_params.py`,
`utils/diffusion.py` and the DiffusionGemma sampler):

- validation: field types; `logprobs` must be set beside `logprob_token_ids`
  but its value is ignored (completions drops it when ids are given, so no
  "equal to their count" rule); at most 128 in-vocabulary ids; a seed canvas
  of exactly `diffusion_canvas_length` ids, no wider than the served canvas;
  `diffusion_pinned` positions inside the canvas (a seed canvas is always
  sent here, which vLLM's pins need); `diffusion_max_steps` a positive integer;
  the context length; temperature other than 1, min_p above 0 or a seed are
  refused for diffusion requests;
- the checkpoint's `generation_config.json` fills every sampling field a
  request leaves out, and top_k/top_p filter the logits before the read-only
  logprobs are reported, so a filtered label comes back at −9999 (the floor
  vLLM puts on −inf);
- admission control: past `max_num_queued_reqs` requests in flight it answers
  503 "busy", as `--max-num-queued-reqs` makes vLLM do;
- a completion without `vllm_xargs` is an ordinary diffusion generation (a
  thought): the same sampling checks, `stop_token_ids`, `max_tokens` within
  the context, `return_token_ids`; transformers' own generation loop writes
  it, and no seed is accepted, so it is not reproducible (as in vLLM);
- with `api_keys`, every `/v1` route needs `Authorization: Bearer KEY` (401
  `{"error": "Unauthorized"}` otherwise); `/health` stays open.

It is stricter than vLLM where that catches our mistakes: an unknown field,
top-level or in `vllm_xargs`, is a 400 here while vLLM would ignore it.
Errors use vLLM's `{"error": {"message", "type", "param", "code"}}`.

Logprobs come from transformers forwards of the checkpoint (encoder over the
prompt once, decoder over the seeded canvas, temperature 1): one for a
read-only single step; with `diffusion_max_steps` above 1 and
`diffusion_pinned`, one per step of vLLM's own denoising loop
(`vllm_denoising.py`: its temperature schedule, sampler, pins, zeroed
self-conditioning at pins, early convergence). One change is vLLM's: on sliding
layers each canvas token attends within a symmetric window around its own
position (flash attention's `(window - 1, window - 1)` for non-causal
queries), where transformers gives every canvas token the same last
`window - 1` prompt tokens. Answers through the proxy therefore equal the
in-process engine's only while prompt + canvas fit in the window (about 1,000
tokens on the real model); past it they differ, as they do against real vLLM.

Run it as vLLM is run (`python tests/canvas/vllm/vllm_standin.py serve MODEL --port 8000
--served-model-name dgemma --diffusion-config '{"canvas_length": 64}'`); flags
it does not know are accepted and ignored, as a shim for `vllm` in recipes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from vllm_denoising import Denoiser
from vllm_protocol import (
    BUSY_MESSAGE,
    DIFFUSION_SAMPLING_MESSAGE,
    MAX_LOGPROB_TOKEN_IDS,
    SAMPLING_DEFAULTS,
    SAMPLING_EPS,
    BadRequest,
    CompletionRequest,
    GenerationRequest,
    clamp_logprob,
    filter_top_k_top_p,
    generation_defaults,
    logprob_key,
)


@dataclass
class Standin:
    """The served model and what the stand-in has seen (tests read `requests`)."""

    model: Any
    served_name: str
    root: str
    canvas_length: int
    max_model_len: int
    tokenizer: Any = None
    honour_logprob_token_ids: bool = True
    stall_s: float = 0.0
    generation_defaults: dict[str, float] = field(default_factory=dict)
    max_num_queued_reqs: int | None = None
    api_keys: tuple[str, ...] = ()
    # "vllm": each canvas token's own symmetric window on sliding layers; "transformers": the last window−1 tokens.
    sliding_semantics: str = "vllm"
    requests: list[dict[str, Any]] = field(default_factory=list)
    steps_taken: list[int] = field(default_factory=list)  # the denoising steps each read ran (vLLM may stop early)
    headers: list[dict[str, str]] = field(default_factory=list)
    in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def eos_id(self) -> int:
        """The id that ends every generation (vLLM stops at the tokenizer's eos whatever the request says)."""
        return int(self.tokenizer.eos_token_id)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.text_config.vocab_size)

    def check(self, request: CompletionRequest) -> int:
        """vLLM's checks of a read-only diffusion completion; returns the canvas width."""
        if request.model != self.served_name:
            raise BadRequest(f"The model `{request.model}` does not exist.", "model", 404)
        xargs = request.vllm_xargs
        width = xargs.diffusion_canvas_length or self.canvas_length
        if width > self.canvas_length:
            raise BadRequest(
                f"diffusion_canvas_length must be no larger than the served canvas_length {self.canvas_length}",
                "vllm_xargs",
            )
        if len(xargs.diffusion_seed_canvas) != width:
            raise BadRequest(
                f"diffusion_seed_canvas must hold exactly {width} ids, got {len(xargs.diffusion_seed_canvas)}",
                "vllm_xargs",
            )
        for name, ids in (
            ("diffusion_seed_canvas", xargs.diffusion_seed_canvas),
            ("prompt", request.prompt),
            ("logprob_token_ids", request.logprob_token_ids or []),
        ):
            if any(not 0 <= token < self.vocab_size for token in ids):
                raise BadRequest(f"{name}: ids must be in [0, {self.vocab_size})", name)
        if any(not 0 <= position < width for position in xargs.diffusion_pinned or ()):
            raise BadRequest("diffusion_pinned positions must lie inside the canvas.", "extra_args")
        if not xargs.diffusion_read_only:
            raise BadRequest("the stand-in implements read-only reads only", "vllm_xargs")
        if request.logprob_token_ids is not None:
            count = len(request.logprob_token_ids)
            if request.logprobs is None:
                raise BadRequest("when using `logprob_token_ids`, `logprobs` must be set.", "logprob_token_ids")
            if count > MAX_LOGPROB_TOKEN_IDS:
                raise BadRequest(f"Requested logprob_token_ids of length {count}", "logprob_token_ids")
        self.sampling(request)
        if len(request.prompt) + width > self.max_model_len:
            raise BadRequest(f"This model's maximum context length is {self.max_model_len} tokens", "prompt")
        return width

    def sampling(self, request: CompletionRequest | GenerationRequest) -> dict[str, float]:
        """Request → generation config → vLLM default, per field; then the checks diffusion requests get."""
        defaults = {**SAMPLING_DEFAULTS, **self.generation_defaults}
        chosen = {name: value if (value := getattr(request, name)) is not None else defaults[name] for name in defaults}
        if not 0.0 < chosen["top_p"] <= 1.0:
            raise BadRequest(f"top_p must be in (0, 1], got {chosen['top_p']}.", "top_p")
        if chosen["top_k"] < -1:
            raise BadRequest(f"top_k must be 0 (disable), or at least 1, got {chosen['top_k']}.")
        if chosen["temperature"] != 1.0 or chosen["min_p"] > SAMPLING_EPS or request.seed is not None:
            raise BadRequest(DIFFUSION_SAMPLING_MESSAGE)
        return chosen

    def generate(self, request: GenerationRequest) -> dict[str, Any]:
        """An ordinary diffusion generation: transformers' own loop on the checkpoint's generation config.

        vLLM's checks first (model, ids, sampling, context). Stricter than vLLM: top_k/top_p must end up off,
        because transformers' loop (which the stand-in runs) applies neither. As in vLLM, `token_ids` keep
        the stop id that ended the generation and `text` leaves it out.
        """
        if request.model != self.served_name:
            raise BadRequest(f"The model `{request.model}` does not exist.", "model", 404)
        if any(not 0 <= token < self.vocab_size for token in request.prompt):
            raise BadRequest(f"prompt: ids must be in [0, {self.vocab_size})", "prompt")
        sampling = self.sampling(request)
        if sampling["top_k"] not in (0, -1) or sampling["top_p"] < 1.0:
            raise BadRequest("the stand-in generates with top_k and top_p off only", "top_k")
        if len(request.prompt) + request.max_tokens > self.max_model_len:
            raise BadRequest(f"This model's maximum context length is {self.max_model_len} tokens", "max_tokens")
        stops = [*(request.stop_token_ids or []), self.eos_id]
        device = next(self.model.parameters()).device
        prompt = torch.tensor([request.prompt], device=device)
        with self.lock, torch.no_grad():
            output = self.model.generate(
                prompt, max_new_tokens=request.max_tokens, eos_token_id=stops, pad_token_id=0, disable_compile=True
            )
        written = output.sequences[0, prompt.shape[1] :].tolist()[: request.max_tokens]
        stop = next((i for i, token in enumerate(written) if token in stops), None)
        ids = written if stop is None else written[: stop + 1]
        choice = {
            "index": 0,
            "text": self.tokenizer.decode(ids if stop is None else ids[:-1]),
            "logprobs": None,
            "finish_reason": "length" if stop is None else "stop",
            "stop_reason": None if stop is None or ids[-1] == self.eos_id else ids[-1],
            "token_ids": ids if request.return_token_ids else None,
        }
        usage = {"prompt_tokens": len(request.prompt), "completion_tokens": len(ids)}
        return {"id": f"cmpl-standin-{len(self.requests)}", "object": "text_completion", "created": int(time.time()),
                "model": self.served_name, "choices": [choice], "usage": usage}  # fmt: skip

    def decoder_masks(self, prompt: int, width: int, device: torch.device) -> dict[str, torch.Tensor]:
        """The canvas's decoder masks over [cached prompt keys, canvas keys] per layer kind.

        A sliding layer's cache holds the last window−1 prompt tokens; under vLLM's semantics canvas token i
        (position prompt + i) sees a key only within window−1 positions either side of it.
        """
        window = int(self.model.config.text_config.sliding_window)
        cached = min(prompt, window - 1)
        keys = torch.cat([torch.arange(prompt - cached, prompt), prompt + torch.arange(width)])
        queries = prompt + torch.arange(width)
        sliding = (queries[:, None] - keys[None, :]).abs() <= window - 1
        if self.sliding_semantics == "transformers":
            sliding = torch.ones_like(sliding)
        full = torch.ones(width, prompt + width, dtype=torch.bool)
        return {"sliding_attention": sliding[None, None].to(device), "full_attention": full[None, None].to(device)}

    def decoder(self, request: CompletionRequest, width: int, device: torch.device) -> Any:
        """`forward(canvas, soft)`: the decoder over the request's prompt (encoded once) with vLLM's masks, soft
        embeddings as self-conditioning (None: zeros), logits filtered by top_k/top_p as vLLM filters them."""
        from transformers import DynamicCache

        sampling = self.sampling(request)
        prompt = torch.tensor([request.prompt], device=device)
        cache = DynamicCache(config=self.model.config.text_config)
        masks = self.decoder_masks(len(request.prompt), width, device)
        conditioning = self.model.model.decoder.self_conditioning
        encoded = False

        def forward(canvas: torch.Tensor, soft: torch.Tensor | None) -> torch.Tensor:
            nonlocal encoded
            hook = None
            if soft is not None:  # vLLM hands the decoder soft embeddings, not logits: put them in directly
                hook = conditioning.register_forward_pre_hook(lambda _, args: (args[0], soft[None].to(args[0].dtype)))
            try:
                output = self.model(
                    input_ids=None if encoded else prompt,
                    cache=cache,
                    decoder_input_ids=canvas[None],
                    decoder_attention_mask=masks,
                )
            finally:
                if hook is not None:
                    hook.remove()
            encoded = True
            return filter_top_k_top_p(output.logits[0].float(), int(sampling["top_k"]), sampling["top_p"])

        return forward

    def complete(self, request: CompletionRequest) -> dict[str, Any]:
        width = self.check(request)
        rows = min(request.max_tokens, width)  # a read-only request ends after one canvas
        device = next(self.model.parameters()).device
        xargs = request.vllm_xargs
        with self.lock, torch.no_grad():
            forward = self.decoder(request, width, device)
            embed = self.model.model.decoder.embed_tokens
            logits, steps = Denoiser.of(self.model).read(
                forward, embed, xargs.diffusion_seed_canvas, xargs.diffusion_pinned or [], xargs.diffusion_max_steps
            )
            self.steps_taken.append(steps)
            logprobs = torch.log_softmax(logits, dim=-1)[:rows]
        chosen = logprobs.argmax(dim=-1).tolist()
        wanted = request.logprob_token_ids if self.honour_logprob_token_ids else None
        top: list[dict[str, float]] = []
        for position, token in enumerate(chosen):
            ids = wanted if wanted is not None else logprobs[position].topk(min(request.logprobs or 0, 5)).indices
            row = {logprob_key(token): clamp_logprob(logprobs[position, token].item())}
            row.update({logprob_key(int(i)): clamp_logprob(logprobs[position, int(i)].item()) for i in ids})
            top.append(row)
        return {
            "id": f"cmpl-standin-{len(self.requests)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.served_name,
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "logprobs": {
                        "text_offset": [0] * rows,
                        "token_logprobs": [clamp_logprob(logprobs[p, t].item()) for p, t in enumerate(chosen)],
                        "tokens": [logprob_key(t) for t in chosen],
                        "top_logprobs": top,
                    },
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            ],
            "usage": {"prompt_tokens": len(request.prompt), "completion_tokens": rows, "total_tokens": 0},
        }


def _error(message: str, param: str | None, code: int) -> JSONResponse:
    kind = {404: "NotFoundError", 503: "Service Unavailable"}.get(code, "BadRequestError")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=code)


def create_app(standin: Standin) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Response:
        """vLLM's `AuthenticationMiddleware`: `/v1` routes need a listed Bearer key; `/health` does not."""
        with standin.lock:
            standin.headers.append(dict(request.headers))
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        guarded = standin.api_keys and request.url.path.startswith("/v1")
        if guarded and (scheme.lower() != "bearer" or key not in standin.api_keys):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        response: Response = await call_next(request)
        return response

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        entry = {
            "id": standin.served_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": standin.root,
            "parent": None,
            "max_model_len": standin.max_model_len,
            "permission": [],
        }
        return {"object": "list", "data": [entry]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        standin.requests.append(body)
        limit = standin.max_num_queued_reqs
        if limit is not None and standin.in_flight + 1 > limit:  # vLLM's `check_admission`
            return _error(BUSY_MESSAGE, None, 503)
        standin.in_flight += 1
        try:
            await asyncio.sleep(standin.stall_s)  # a stuck upstream: answers /health, sits on reads
            if "vllm_xargs" not in body:  # no diffusion keys: an ordinary generation (a thought)
                generation = GenerationRequest.model_validate_json(raw)
                return JSONResponse(await asyncio.to_thread(standin.generate, generation))
            parsed = CompletionRequest.model_validate_json(raw)
            return JSONResponse(await asyncio.to_thread(standin.complete, parsed))
        except ValidationError as error:
            return _error(str(error), None, 400)
        except BadRequest as error:
            return _error(error.message, error.param, error.code)
        finally:
            standin.in_flight -= 1

    return app


@contextlib.contextmanager
def running(standin: Standin, port: int = 0) -> Iterator[str]:
    """Serve `standin` on loopback (a free port unless given) in a thread; yields its base URL once bound."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(create_app(standin), log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def load_standin(model_path: str, **options: Any) -> Standin:
    """The tiny checkpoint in fp32 on the CPU, served as vLLM would serve it."""
    from canvasread.canvas.engine.loader import load_checkpoint

    loaded = load_checkpoint(model_path)  # the same arguments as the in-process backend: one shared load
    model = loaded.model
    options.setdefault("canvas_length", int(model.config.canvas_length))
    options.setdefault("max_model_len", int(model.config.text_config.max_position_embeddings))
    options.setdefault("served_name", Path(model_path).name)
    options.setdefault("generation_defaults", generation_defaults(Path(model_path)))
    return Standin(model=model, tokenizer=loaded.tokenizer, root=model_path, **options)


def main(argv: list[str]) -> None:
    """`vllm serve MODEL [flags]` as far as the stand-in needs it; other flags are ignored."""
    parser = argparse.ArgumentParser(prog="vllm_standin")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name")
    parser.add_argument("--diffusion-config", type=json.loads, default={})
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-queued-reqs", type=int)
    parser.add_argument("--api-key", action="append", default=[])
    parser.add_argument("--generation-config", default="auto")
    args, _ignored = parser.parse_known_args(argv)
    options: dict[str, Any] = {}
    if args.served_model_name:
        options["served_name"] = args.served_model_name
    if "canvas_length" in args.diffusion_config:
        options["canvas_length"] = int(args.diffusion_config["canvas_length"])
    if args.max_model_len:
        options["max_model_len"] = args.max_model_len
    if args.max_num_queued_reqs is not None:
        options["max_num_queued_reqs"] = args.max_num_queued_reqs
    keys = args.api_key or [os.environ.get("VLLM_API_KEY", "")]
    options["api_keys"] = tuple(key for key in keys if key)
    if args.generation_config == "vllm":
        options["generation_defaults"] = {}
    standin = load_standin(args.model, **options)
    uvicorn.run(create_app(standin), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
