"""The Batching, Server and Limits panels of `canvasread serve` (the Models panel is `model_flags.py`), one frozen
dataclass per help panel, each default read from the settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from canvasread.backends.sparrow import SparrowLimits
from canvasread.batching import BatchSettings
from canvasread.decide import DeciderSettings
from canvasread.settings import ImageLimits, LogFormat, ServerSettings

# uvicorn's own default; `debug` and `trace` show every connection.
DEFAULT_LOG_LEVEL = "info"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
BATCHING, SERVER, LIMITS = "Batching", "Server", "Limits"

MaxBatch = Annotated[int, typer.Option(metavar="N", rich_help_panel=BATCHING, help="Most requests read in one batch.")]
MaxWait = Annotated[
    float, typer.Option(metavar="MS", rich_help_panel=BATCHING, help="How long a batch waits for more.")
]
Linger = Annotated[
    float,
    typer.Option(
        metavar="MS",
        rich_help_panel=BATCHING,
        help="How long a batch waits for accepted requests still being prepared.",
    ),
]
MaxPending = Annotated[
    int,
    typer.Option(
        metavar="N",
        rich_help_panel=BATCHING,
        help="Requests in flight per model before answering 529 (and as many that think, on a model that can).",
    ),
]
MaxQueueDelay = Annotated[
    float,
    typer.Option(
        metavar="SECONDS",
        rich_help_panel=BATCHING,
        help="The latency budget: answer 529 at once when a request would wait longer than this behind the work "
        "in flight, at the rate the model has served it (0: off).",
    ),
]
Timeout = Annotated[
    float | None, typer.Option(metavar="SECONDS", rich_help_panel=BATCHING, help="Per-request deadline (504 past it).")
]
Round = Annotated[
    int | None,
    typer.Option(
        "--round",
        metavar="DIGITS",
        rich_help_panel=BATCHING,
        help="Round numbers to this many decimals (2: the hosted API).",
    ),
]
Host = Annotated[str, typer.Option(metavar="HOST", rich_help_panel=SERVER, help="Interface to bind.")]
Port = Annotated[int, typer.Option(metavar="PORT", rich_help_panel=SERVER, help="Port to bind.")]
ApiKeys = Annotated[
    list[str] | None,
    typer.Option(
        "--api-key",
        metavar="KEY",
        rich_help_panel=SERVER,
        help="Require this key as `Authorization: Bearer KEY` (repeatable; also CANVASREAD_API_KEYS).",
    ),
]
ApiKeysFile = Annotated[
    Path | None,
    typer.Option(
        exists=True, dir_okay=False, metavar="PATH", rich_help_panel=SERVER, help="File of API keys, one a line."
    ),
]
CorsOrigins = Annotated[
    list[str] | None,
    typer.Option(
        "--cors-origin",
        metavar="ORIGIN",
        rich_help_panel=SERVER,
        help="Let pages from this origin call the API (repeatable).",
    ),
]
ShutdownTimeout = Annotated[
    int, typer.Option(metavar="SECONDS", rich_help_panel=SERVER, help="Time in-flight requests get after SIGTERM.")
]
LogLevel = Annotated[str, typer.Option(metavar="LEVEL", rich_help_panel=SERVER, help="uvicorn log level.")]
HeaderTimeout = Annotated[
    float, typer.Option(metavar="SECONDS", rich_help_panel=SERVER, help="Time a client has to send its headers.")
]
BodyTimeout = Annotated[
    float, typer.Option(metavar="SECONDS", rich_help_panel=SERVER, help="Time a client has to send its body (408).")
]
SendTimeout = Annotated[
    float,
    typer.Option(
        metavar="SECONDS", rich_help_panel=SERVER, help="Connections whose output goes unread this long are dropped."
    ),
]
KeepAlive = Annotated[
    int, typer.Option(metavar="SECONDS", rich_help_panel=SERVER, help="Idle keep-alive connections close after this.")
]
MaxConnections = Annotated[
    int,
    typer.Option(metavar="N", rich_help_panel=SERVER, help="Open connections; past it idle ones are closed, else 503."),
]
MaxConnectionsPerClient = Annotated[
    int,
    typer.Option(
        metavar="N", rich_help_panel=SERVER, help="Open connections from one address (behind a proxy: the proxy's)."
    ),
]
ParseWorkers = Annotated[
    int, typer.Option(metavar="N", rich_help_panel=SERVER, help="Bodies parsed at once, each in a thread.")
]
AllowedHosts = Annotated[
    list[str] | None,
    typer.Option(
        "--allowed-host",
        metavar="NAME",
        rich_help_panel=SERVER,
        help="Also answer this Host name when bound to loopback (a proxy's; repeatable).",
    ),
]
LogFormatFlag = Annotated[
    LogFormat, typer.Option(rich_help_panel=SERVER, help="text for people, json (one object a line) for log shippers.")
]
LogPayloads = Annotated[
    bool,
    typer.Option(rich_help_panel=SERVER, help="Also log each request's state and answers (may hold personal data)."),
]


def _limit(metavar: str, help: str) -> typer.models.OptionInfo:
    option: typer.models.OptionInfo = typer.Option(metavar=metavar, rich_help_panel=LIMITS, help=help)
    return option


MaxBody = Annotated[int, _limit("BYTES", "Largest body, before and after decompression (413).")]
MaxQuestions = Annotated[int, _limit("N", "Most questions in one request.")]
MaxOptions = Annotated[int, _limit("N", "Most options in one choice question.")]
MaxLevels = Annotated[int, _limit("N", "Most levels in one score question.")]
MaxDepth = Annotated[int, _limit("N", "Deepest nesting of arrays and objects in a body.")]
MaxItems = Annotated[int, _limit("N", "Most JSON items (arrays, objects and their entries) in a body.")]
MaxImages = Annotated[int, _limit("N", "Most images in one request.")]
MaxImageBytes = Annotated[int, _limit("BYTES", "Largest image file.")]
MaxImagePixels = Annotated[int, _limit("N", "Most pixels (width x height) in one image.")]
Strict = Annotated[
    bool, typer.Option(rich_help_panel=LIMITS, help="Refuse (422) unknown keys and empty states, not just warn.")
]
MaxStateTokens = Annotated[
    int | None, _limit("N", "Refuse a state of more tokens (413); embedded models, which read its first 512.")
]


@dataclass(frozen=True)
class BatchFlags:
    """How requests are grouped into reads, and how long each may take."""

    max_batch: MaxBatch = BatchSettings.max_batch
    max_wait_ms: MaxWait = BatchSettings.max_wait_s * 1000.0
    linger_ms: Linger = BatchSettings.linger_s * 1000.0
    max_pending: MaxPending = BatchSettings.max_pending
    max_queue_delay: MaxQueueDelay = BatchSettings.max_queue_delay_s or 0.0
    timeout: Timeout = DeciderSettings.timeout_s
    round_to: Round = DeciderSettings.decimals

    def settings(self, aliases: tuple[tuple[str, str], ...], max_body_bytes: int) -> DeciderSettings:
        """`depends_on` may write into a request as much as a body may hold (`--max-body-bytes`)."""
        batch = BatchSettings(
            self.max_batch,
            self.max_wait_ms / 1000.0,
            self.max_pending,
            self.linger_ms / 1000.0,
            max_queue_delay_s=self.max_queue_delay or None,
        )
        return DeciderSettings(self.round_to, batch, self.timeout, aliases, max_context_bytes=max_body_bytes)


@dataclass(frozen=True)
class ServerFlags:
    """The listening socket, who may call it, and what it logs."""

    host: Host = ServerSettings.host
    port: Port = ServerSettings.port
    api_key: ApiKeys = None
    api_keys_file: ApiKeysFile = None
    cors_origin: CorsOrigins = None
    shutdown_timeout: ShutdownTimeout = ServerSettings.shutdown_timeout_s
    log_level: LogLevel = DEFAULT_LOG_LEVEL
    log_format: LogFormatFlag = ServerSettings.log_format
    log_payloads: LogPayloads = ServerSettings.log_payloads
    header_timeout: HeaderTimeout = ServerSettings.header_timeout_s
    body_timeout: BodyTimeout = ServerSettings.body_timeout_s
    send_timeout: SendTimeout = ServerSettings.send_timeout_s
    keep_alive: KeepAlive = ServerSettings.keep_alive_s
    max_connections: MaxConnections = ServerSettings.max_connections
    max_connections_per_client: MaxConnectionsPerClient = ServerSettings.max_connections_per_client
    parse_workers: ParseWorkers = ServerSettings.parse_workers
    allowed_host: AllowedHosts = None


@dataclass(frozen=True)
class LimitFlags:
    """What one request may hold."""

    max_body_bytes: MaxBody = ServerSettings.max_body_bytes
    max_questions: MaxQuestions = ServerSettings.max_questions
    max_options: MaxOptions = ServerSettings.max_options
    max_levels: MaxLevels = ServerSettings.max_levels
    max_json_depth: MaxDepth = ServerSettings.max_json_depth
    max_json_items: MaxItems = ServerSettings.max_json_items
    max_images: MaxImages = ImageLimits.max_images
    max_image_bytes: MaxImageBytes = ImageLimits.max_bytes
    max_image_pixels: MaxImagePixels = ImageLimits.max_pixels
    max_state_tokens: MaxStateTokens = SparrowLimits.max_state_tokens
    strict: Strict = ServerSettings.strict

    def sparrow(self) -> SparrowLimits:
        return SparrowLimits(max_state_tokens=self.max_state_tokens)
