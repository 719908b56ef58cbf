"""The flags of `canvasread serve`, one frozen dataclass per help panel, each default read from the settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from canvasread.backends.sparrow import DEFAULT_SPARROW_MODEL, SparrowLimits
from canvasread.batching import BatchSettings
from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.layouts import DEFAULT_LAYOUT, LAYOUTS, layout_named
from canvasread.catalog import Wing
from canvasread.decide import DeciderSettings
from canvasread.settings import ImageLimits, LogFormat, ServerSettings

# uvicorn's own default; `debug` and `trace` show every connection.
DEFAULT_LOG_LEVEL = "info"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MODELS, BATCHING, SERVER, LIMITS = "Models", "Batching", "Server", "Limits"

Models = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        metavar="MODEL",
        rich_help_panel=MODELS,
        show_default=DEFAULT_SPARROW_MODEL,
        help="An embedded sparrow model name, or a DiffusionGemma folder or hub id. "
        "Repeat to serve several; the first is the default (alias jev-latest).",
    ),
]
Aliases = Annotated[
    list[str] | None,
    typer.Option(
        "--alias",
        metavar="NAME=MODEL",
        rich_help_panel=MODELS,
        help="Another name for a served model (repeatable); may replace a built-in alias such as jev-preview. "
        "Listed by /v1/models.",
    ),
]
Device = Annotated[
    str | None,
    typer.Option(metavar="DEVICE", rich_help_panel=MODELS, help="torch device (default: cuda if present)."),
]
Dtype = Annotated[
    str | None,
    typer.Option(metavar="DTYPE", rich_help_panel=MODELS, help="torch dtype (default: bfloat16 on GPU, else float32)."),
]
Experts = Annotated[
    str | None,
    typer.Option(
        metavar="KERNEL", rich_help_panel=MODELS, help="transformers experts kernel: eager, batched_mm, grouped_mm."
    ),
]
RandomWeights = Annotated[
    float | None,
    typer.Option(
        metavar="STD",
        rich_help_panel=MODELS,
        help="Build the model from its config with N(0, STD) weights (speed tests).",
    ),
]
NaiveBaseline = Annotated[
    bool,
    typer.Option(
        rich_help_panel=MODELS, help="Also serve <model>-naive: plain transformers forwards on the same weights."
    ),
]
Gpus = Annotated[
    int,
    typer.Option(metavar="N", rich_help_panel=MODELS, help="Replicas, one per GPU (cuda:0..N-1); batches are split."),
]
Compile = Annotated[
    bool,
    typer.Option(
        rich_help_panel=MODELS, help="On CUDA: torch.compile the layer bodies (compiled and captured at start-up)."
    ),
]
Fp8Experts = Annotated[
    bool, typer.Option(rich_help_panel=MODELS, help="Routed experts in FP8 with rowwise scales (faster, not exact).")
]
KvCacheGib = Annotated[
    float | None,
    typer.Option(
        metavar="GIB",
        rich_help_panel=MODELS,
        help="In-process engine: GiB of its KV store (default: 40% of the GPU memory free after start-up; 2 on a CPU).",
    ),
]
PassTokens = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        rich_help_panel=MODELS,
        help="In-process engine: tokens one pass may take, encodings, reads and thoughts together "
        "(default: its largest bucket, 8192).",
    ),
]
BatchesInFlight = Annotated[
    int,
    typer.Option(
        metavar="N",
        rich_help_panel=MODELS,
        help="In-process engine: batches read at once, their reads, re-reads and thoughts sharing its passes.",
    ),
]
ThoughtShare = Annotated[
    float,
    typer.Option(
        metavar="FRACTION",
        min=0.0,
        max=1.0,
        rich_help_panel=MODELS,
        help="In-process engine: the fraction of its time thoughts may take while reads are waiting (0: only "
        "when none are); the readers' latency beside thoughts rises by about this much.",
    ),
]
EngineProcess = Annotated[
    bool | None,
    typer.Option(
        "--engine-process/--no-engine-process",
        rich_help_panel=MODELS,
        show_default="on a GPU",
        help="In-process engine: run its loop in a process of its own, so no server thread holds up its passes.",
    ),
]
Calibrations = Annotated[
    list[Path] | None,
    typer.Option(
        "--calibration",
        metavar="PATH",
        rich_help_panel=MODELS,
        help="Calibration file from `canvasread calibrate`, applied to its model's answers (repeatable).",
    ),
]
Layout = Annotated[
    str,
    typer.Option(
        metavar="NAME",
        rich_help_panel=MODELS,
        help=f"Read layout of DiffusionGemma canvases: {', '.join(LAYOUTS)} (settle with eval --compare).",
    ),
]
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
class ModelFlags:
    """What to serve and how to run it in process."""

    model: Models = None
    alias: Aliases = None
    device: Device = EngineSettings.device
    dtype: Dtype = EngineSettings.dtype
    experts: Experts = EngineSettings.experts
    random_weights: RandomWeights = EngineSettings.random_init_std
    naive_baseline: NaiveBaseline = EngineSettings.naive_baseline
    gpus: Gpus = EngineSettings.gpus
    compile: Compile = EngineSettings.compile
    fp8_experts: Fp8Experts = EngineSettings.fp8_experts
    kv_cache_gib: KvCacheGib = None
    pass_tokens: PassTokens = EngineSettings.pass_tokens
    batches_in_flight: BatchesInFlight = EngineSettings.batches_in_flight
    thought_share: ThoughtShare = EngineSettings.thought_share
    engine_process: EngineProcess = EngineSettings.process
    layout: Layout = DEFAULT_LAYOUT.name
    calibration: Calibrations = None

    def specs(self, wings: Sequence[Wing]) -> tuple[str, ...]:
        """The models to serve beside the wings' ones: the embedded default when nothing is named."""
        return tuple(self.model or (() if wings else (DEFAULT_SPARROW_MODEL,)))

    def aliases(self) -> tuple[tuple[str, str], ...]:
        """--alias NAME=MODEL pairs, checked for shape here and for meaning by `DeciderSettings` and the decider."""
        pairs = []
        for value in self.alias or ():
            name, equals, model = value.partition("=")
            if not equals:
                raise ValueError(f"--alias takes NAME=MODEL, not {value!r}")
            pairs.append((name.strip(), model.strip()))
        return tuple(pairs)

    def engine(self) -> EngineSettings:
        return EngineSettings(
            device=self.device,
            dtype=self.dtype,
            experts=self.experts,
            random_init_std=self.random_weights,
            naive_baseline=self.naive_baseline,
            gpus=self.gpus,
            compile=self.compile,
            fp8_experts=self.fp8_experts,
            cache_bytes=None if self.kv_cache_gib is None else int(self.kv_cache_gib * (1 << 30)),
            pass_tokens=self.pass_tokens,
            batches_in_flight=self.batches_in_flight,
            thought_share=self.thought_share,
            process=self.engine_process,
        )

    def reading(self) -> ReadSettings:
        return ReadSettings(layout=layout_named(self.layout))


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
