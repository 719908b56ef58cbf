"""The vLLM `Thinker`: each thought is one plain diffusion generation, `POST /v1/completions` with token ids.

The body (vLLM 0.33's `CompletionRequest`; diffusion requests are checked by
`SamplingParams._validate_diffusion`):

| field | type | value |
|---|---|---|
| `model` | str | the served name |
| `prompt` | list[int] | the read prompt with its thought block left open (`…<|channel>thought\\n`) |
| `max_tokens` | int | the request's `think` |
| `stop_token_ids` | list[int] | `<channel|>` (the thought is closed) and `<turn|>` (the turn ended) |
| `return_token_ids` | bool | true: the answer carries `choices[0].token_ids`, the ids the read prompt takes verbatim |
| `temperature`, `top_p`, `top_k`, `min_p` | float, float, int, float | 1.0, 1.0, 0, 0.0, as for reads (below) |

Sampling is sent explicitly because vLLM fills every field a request leaves
out from the checkpoint's `generation_config.json`: a diffusion request
refuses any temperature but 1 and any min_p, and vLLM's diffusion sampler
applies top_k/top_p at every denoising step, which transformers' generation
loop (the in-process thinker) does not: with them off, a thought is sampled by
the checkpoint's own schedule and nothing else, in both wings.

No `vllm_xargs`: the canvas, its noise and the denoising schedule are vLLM's
own (the served `canvas_length`, the checkpoint's steps, temperature schedule
and sampler), exactly an ordinary generation. No seed: vLLM refuses one for
diffusion requests, so through vLLM `seed` reproduces the reads' noise but not
the thought. Upstream choice, failover, the API key and 503 overload handling
are the pool's, as for reads.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.thinker import Thought, ThoughtRequest, thought_prefix
from canvasread.canvas.vllm.reader import COMPLETIONS_PATH, NEUTRAL_SAMPLING
from canvasread.errors import UpstreamFailure
from canvasread.upstream.pool import UpstreamPool


def generation_body(model: str, request: ThoughtRequest) -> dict[str, Any]:
    """The JSON for one thought (see the module docstring for every field)."""
    return {
        "model": model,
        "prompt": list(request.prompt_ids),
        "max_tokens": request.max_tokens,
        "stop_token_ids": list(request.stop_ids),
        "return_token_ids": True,
        **NEUTRAL_SAMPLING,
    }


def written_ids(answer: Any) -> tuple[list[int], bool]:
    """`choices[0].token_ids` of a completions answer (what the model wrote) and whether a stop id ended it."""
    try:
        choice = answer["choices"][0]
        ids = choice["token_ids"]
    except (KeyError, IndexError, TypeError):
        raise UpstreamFailure("vLLM answered the thought without choices[0].token_ids") from None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise UpstreamFailure("vLLM's token_ids for the thought are not a list of token ids")
    return ids, choice.get("finish_reason") == "stop"


class VllmThinker:
    """Sends each thought to the least-loaded healthy upstream; the thoughts of one call run concurrently."""

    def __init__(self, pool: UpstreamPool, model: str, *, concurrency: int = 64) -> None:
        self.pool = pool
        self.model = model
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="canvasread-vllm-think")
        self.thoughts = 0

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def think(self, requests: Sequence[ThoughtRequest], gone: Gone = never_gone) -> list[Thought | None]:
        thoughts = list(
            self._executor.map(self._think, requests, [functools.partial(gone, i) for i in range(len(requests))])
        )
        self.thoughts += sum(thought is not None for thought in thoughts)
        return thoughts

    def _think(self, request: ThoughtRequest, left: Callable[[], bool]) -> Thought | None:
        if left():  # its caller has gone while it waited for a worker
            return None
        started = time.monotonic()
        ids, stopped = written_ids(self.pool.post_json(COMPLETIONS_PATH, generation_body(self.model, request)))
        thought = thought_prefix(request, ids, (time.monotonic() - started) * 1000.0)
        # vLLM may leave the stop id out of token_ids; its finish_reason still says a stop ended the thought.
        return replace(thought, closed=thought.closed or stopped)
