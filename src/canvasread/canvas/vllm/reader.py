"""The vLLM reader: every canvas read is one `POST /v1/completions` carrying the diffusion read-only fields.

Why completions with the prompt as token ids, and not chat completions: the
planner has already tokenised the prompt with the model's tokenizer and placed
every label slot against those ids. Sent as ids, the prompt is encoded by vLLM
exactly as the in-process engine encodes it, and vLLM's prefix cache matches on
the same ids. Chat completions would render the chat template a second time,
on the server, where a different template, BOS handling or thought block would
silently shift what the model reads.

The request body (vLLM 0.33's `CompletionRequest`, read in
`vllm/entrypoints/openai/completion/protocol.py`; the diffusion keys are
checked by `validate_diffusion_sampling_params` in `vllm/utils/diffusion.py`):

| field | type | value |
|---|---|---|
| `model` | str | the served name (`--served-model-name`) |
| `prompt` | list[int] | the encoder input, verbatim |
| `max_tokens` | int | the canvas width: a read-only step emits one canvas, one row per position |
| `logprobs` | int | must be set beside `logprob_token_ids` (else a 400), then ignored: we send the ids' count |
| `logprob_token_ids` | list[int], 1–128 | the slots' label ids: their exact logprobs at every position |
| `return_tokens_as_token_ids` | bool | true: rows are keyed `"token_id:N"`, so nothing is detokenised |
| `temperature` | float | 1.0: the only value diffusion requests accept |
| `top_p` | float | 1.0: no nucleus |
| `top_k` | int | 0: vLLM's "off" (−1 is accepted too; 0 is the documented value) |
| `min_p` | float | 0.0: off (anything above is a 400 for diffusion requests) |
| `vllm_xargs.diffusion_seed_canvas` | list[int] | the noisy canvas, exactly `diffusion_canvas_length` ids |
| `vllm_xargs.diffusion_canvas_length` | int | the canvas width, at most the served `canvas_length` |
| `vllm_xargs.diffusion_max_steps` | int | the read's `steps` (1: one denoising step) |
| `vllm_xargs.diffusion_read_only` | bool | true: stop after the last step, return its temperature-1 logprobs |
| `vllm_xargs.diffusion_pinned` | list[int] | with `steps` above 1 only: every canvas position but the slots |

Sampling is sent explicitly because vLLM applies the checkpoint's
`generation_config.json` to every field a request leaves out, and its
diffusion sampler filters the logits by top_k/top_p *before* it reports the
read-only logprobs: under a default top_k of 64 every label outside the top 64
would come back as −9999 (vLLM's floor for −inf), and a default temperature
other than 1 would turn every read into a 400. No seed is sent: vLLM refuses
one for diffusion requests (the noise is in the canvas we send). The answer
holds `choices[0].logprobs.top_logprobs[position]["token_id:N"] = log p(N at position)`.

Multi-step reads (`steps` above 1): vLLM's pins need the seed canvas (sent) and
combine with `diffusion_read_only`, which then reports the logprobs of the step
the request converges on. vLLM's denoising loop differs from transformers'
(which the in-process engine follows) in four ways: its temperature schedule
runs over the served `max_denoising_steps` (48 by default), not over `steps`,
so its steps are hotter; it zeroes the self-conditioning at pinned positions,
where transformers carries the model's own predictions; it converges early
once the argmax canvas is stable and the mean entropy under the checkpoint's
`confidence_threshold`, reporting that step; and it draws its samples and
renoise unseeded, so a multi-step read's numbers vary from call to call
whatever the request's seed. Each request denoises on its own, so a
multi-step read must fit one request: at most 128 label ids (`max_step_label_ids`;
the canvas backend refuses a request past it in `prepare`, a 422 at `steps`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from canvasread.canvas.reader import CanvasRead, Slot, SlotLogProbs
from canvasread.errors import UpstreamFailure
from canvasread.upstream.calls import wait_all
from canvasread.upstream.pool import UpstreamPool

COMPLETIONS_PATH = "/v1/completions"
# vLLM's `MAX_LOGPROB_TOKEN_IDS`: a read whose slots need more label ids is split over several requests.
MAX_LOGPROB_TOKEN_IDS = 128
# Logprobs are at most 0; this much above it is float noise, more is a broken answer.
LOGPROB_SLACK = 1e-4
# What every read sends so that no generation-config default changes it (see the module docstring).
NEUTRAL_SAMPLING: dict[str, float | int] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}


def label_id_groups(slots: Sequence[Slot], cap: int = MAX_LOGPROB_TOKEN_IDS) -> list[tuple[int, ...]]:
    """The read's distinct label ids in groups of at most `cap`, one request each.

    Every request returns every position, so an id shared by several slots is
    asked once. A slot's new ids start a new group rather than straddle two,
    so its labels come from one forward pass unless it alone has over `cap`.
    """
    groups: list[list[int]] = [[]]
    seen: set[int] = set()
    for slot in slots:
        new = sorted(set(slot.label_ids) - seen)
        if groups[-1] and len(groups[-1]) + len(new) > cap:
            groups.append([])
        for token_id in new:
            if len(groups[-1]) == cap:
                groups.append([])
            groups[-1].append(token_id)
        seen.update(new)
    return [tuple(sorted(group)) for group in groups if group]


def completion_body(model: str, read: CanvasRead, label_ids: Sequence[int]) -> dict[str, Any]:
    """The JSON for one read (see the module docstring for every field)."""
    width = len(read.canvas_ids)
    return {
        "model": model,
        "prompt": list(read.prompt_ids),
        "max_tokens": width,
        "logprobs": len(label_ids),
        "logprob_token_ids": list(label_ids),
        "return_tokens_as_token_ids": True,
        **NEUTRAL_SAMPLING,
        "vllm_xargs": {
            "diffusion_seed_canvas": list(read.canvas_ids),
            "diffusion_canvas_length": width,
            "diffusion_max_steps": read.steps,
            "diffusion_read_only": True,
            **({"diffusion_pinned": pinned_positions(read)} if read.steps > 1 else {}),
        },
    }


def pinned_positions(read: CanvasRead) -> list[int]:
    """Every canvas position but the slots: what a multi-step read holds to its canvas."""
    slots = {slot.position for slot in read.slots}
    return [position for position in range(len(read.canvas_ids)) if position not in slots]


def logprob_rows(answer: Any) -> list[Any]:
    """`choices[0].logprobs.top_logprobs` of a completions answer: one mapping per canvas position."""
    try:
        rows = answer["choices"][0]["logprobs"]["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise UpstreamFailure("vLLM answered without choices[0].logprobs.top_logprobs") from None
    if not isinstance(rows, list):
        raise UpstreamFailure("vLLM's top_logprobs is not a list")
    return rows


def logprob_at(rows: Sequence[Any], position: int, token_id: int) -> float:
    """The logprob of `token_id` at `position`, refusing anything that is not one."""
    row = rows[position] if position < len(rows) else None
    value = row.get(f"token_id:{token_id}") if isinstance(row, dict) else None
    if value is None:
        raise UpstreamFailure(
            f"vLLM returned no logprob for token {token_id} at canvas position {position} ({len(rows)} rows): "
            "it needs logprob_token_ids (vLLM PR 57417) and diffusion_read_only (PR 57250)"
        )
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value > LOGPROB_SLACK:
        raise UpstreamFailure(f"vLLM returned {value!r} as the logprob of token {token_id} at position {position}")
    return min(float(value), 0.0)


class VllmReader:
    """A `Reader` that sends each read (and each group of its label ids) to vLLM, concurrently.

    Requests of one `read()` call run on a thread pool of `concurrency`
    workers, so a batch's canvases are in vLLM's scheduler together and it
    batches them as it would any concurrent requests.
    """

    # A multi-step read must fit one request (each request denoises on its own): see the module docstring.
    max_step_label_ids = MAX_LOGPROB_TOKEN_IDS

    def __init__(self, pool: UpstreamPool, model: str, *, concurrency: int = 64) -> None:
        self.pool = pool
        self.model = model
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="canvasread-vllm")
        self._reads = 0

    def counters(self) -> Mapping[str, float]:
        return {"reads": float(self._reads), **self.pool.counters()}

    def close(self) -> None:
        """Stop the request threads (the pool is the runtime's, closed after them)."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        requests = [(r, ids) for r, read in enumerate(reads) for ids in label_id_groups(read.slots)]
        for r, read in enumerate(reads):
            if read.steps > 1 and sum(1 for owner, _ in requests if owner == r) > 1:
                raise ValueError(
                    f"a multi-step read asks more than {MAX_LOGPROB_TOKEN_IDS} label ids (prepare refuses it)"
                )
        futures = [
            self._executor.submit(self.pool.post_json, COMPLETIONS_PATH, completion_body(self.model, reads[r], ids))
            for r, ids in requests
        ]
        wait_all(futures)
        found: list[dict[tuple[int, int], float]] = [{} for _ in reads]
        for (r, ids), future in zip(requests, futures, strict=True):
            rows = logprob_rows(future.result())
            for slot in reads[r].slots:
                for token_id in set(ids).intersection(slot.label_ids):
                    found[r][slot.position, token_id] = logprob_at(rows, slot.position, token_id)
        self._reads += len(reads)
        return [
            [SlotLogProbs(tuple(values[slot.position, t] for t in slot.label_ids)) for slot in read.slots]
            for read, values in zip(reads, found, strict=True)
        ]
