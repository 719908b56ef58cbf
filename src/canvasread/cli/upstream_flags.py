"""The upstream flags of `canvasread serve`: the vLLM wing (`--upstream`) and the systemone wing
(`--upstream-systemone`), which share the model name, timeout, concurrency and key flags (one pool each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from canvasread.canvas.vllm.settings import VllmSettings
from canvasread.catalog import Wing
from canvasread.systemone.peers import PEERS
from canvasread.systemone.settings import SystemOneSettings

UPSTREAM = "Upstreams (--upstream: vLLM canvases; --upstream-systemone: another /v1/systemone)"

Upstreams = Annotated[
    list[str] | None,
    typer.Option(
        "--upstream",
        metavar="URL",
        rich_help_panel=UPSTREAM,
        help="Read canvases through the vLLM server at this URL (repeatable: each request goes to the "
        "least-loaded healthy one). Serves --upstream-model as the default model; needs --tokenizer.",
    ),
]
SystemOneUpstreams = Annotated[
    list[str] | None,
    typer.Option(
        "--upstream-systemone",
        metavar="URL",
        rich_help_panel=UPSTREAM,
        help="Ask the /v1/systemone server at this URL (repeatable: replicas, least-loaded healthy one first); "
        "its answers become distributions that canvasread calibrates, rotates and streams. Serves "
        "--upstream-model as the default model.",
    ),
]
Peer = Annotated[
    str,
    typer.Option(
        metavar="PEER",
        rich_help_panel=UPSTREAM,
        help=f"What --upstream-systemone speaks: {', '.join(PEERS)} (vLLM 0.32+ native, SGLang 0.5.23 native, "
        "the hosted API or any Jev server).",
    ),
]
UpstreamName = Annotated[
    str | None,
    typer.Option(
        metavar="NAME",
        rich_help_panel=UPSTREAM,
        help="The name --upstream-systemone's model is served under here (default: --upstream-model).",
    ),
]
UpstreamMaxOptions = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        rich_help_panel=UPSTREAM,
        help="Options per choice --upstream-systemone is asked at once (default: the peer's cap); more go "
        "through a tournament of groups. Use 26 for an SGLang whose tokenizer has no two-letter labels.",
    ),
]
UpstreamModel = Annotated[
    str, typer.Option(metavar="NAME", rich_help_panel=UPSTREAM, help="The name the upstream serves it under.")
]
Tokenizer = Annotated[
    str | None, typer.Option(metavar="PATH", rich_help_panel=UPSTREAM, help="The model's tokenizer (folder or hub id).")
]
CanvasLength = Annotated[
    int, typer.Option(metavar="N", rich_help_panel=UPSTREAM, help="vLLM's --diffusion-config canvas_length.")
]
MaxModelLen = Annotated[
    int | None,
    typer.Option(metavar="N", rich_help_panel=UPSTREAM, help="Most prompt plus canvas tokens (default: vLLM's)."),
]
UpstreamTimeout = Annotated[
    float, typer.Option(metavar="SECONDS", rich_help_panel=UPSTREAM, help="Per upstream call, before failing over.")
]
UpstreamConcurrency = Annotated[
    int, typer.Option(metavar="N", rich_help_panel=UPSTREAM, help="Upstream calls in flight.")
]
UpstreamApiKey = Annotated[
    str | None,
    typer.Option(
        metavar="KEY",
        envvar="CANVASREAD_UPSTREAM_API_KEY",
        show_default=False,
        rich_help_panel=UPSTREAM,
        help="The upstream's API key (vLLM's --api-key, a Jev key), sent as a Bearer token on every upstream "
        "call (never logged).",
    ),
]


@dataclass(frozen=True)
class UpstreamFlags:
    """Where the upstream servers run and how to talk to them."""

    upstream: Upstreams = None
    upstream_systemone: SystemOneUpstreams = None
    upstream_peer: Peer = SystemOneSettings.peer
    upstream_name: UpstreamName = None
    upstream_max_options: UpstreamMaxOptions = None
    upstream_model: UpstreamModel = VllmSettings.model
    tokenizer: Tokenizer = None
    upstream_canvas_length: CanvasLength = VllmSettings.canvas_length
    upstream_max_model_len: MaxModelLen = VllmSettings.max_model_len
    upstream_timeout: UpstreamTimeout = VllmSettings.timeout_s
    upstream_concurrency: UpstreamConcurrency = VllmSettings.concurrency
    upstream_api_key: UpstreamApiKey = None

    def wings(self) -> list[Wing]:
        """The vLLM wing or the systemone wing (they share --upstream-model, so not both), or none."""
        if self.upstream and self.upstream_systemone:
            raise ValueError("give --upstream (vLLM canvases) or --upstream-systemone, not both")
        if self.upstream_systemone:
            return [
                SystemOneSettings(
                    urls=tuple(self.upstream_systemone),
                    model=self.upstream_model,
                    peer=self.upstream_peer,
                    name=self.upstream_name,
                    max_options=self.upstream_max_options,
                    timeout_s=self.upstream_timeout,
                    concurrency=self.upstream_concurrency,
                    api_key=self.upstream_api_key,
                )
            ]
        if not self.upstream:
            return []
        vllm = VllmSettings(
            urls=tuple(self.upstream),
            tokenizer=self.tokenizer or "",
            model=self.upstream_model,
            canvas_length=self.upstream_canvas_length,
            max_model_len=self.upstream_max_model_len,
            timeout_s=self.upstream_timeout,
            concurrency=self.upstream_concurrency,
            api_key=self.upstream_api_key,
        )
        return [vllm]
