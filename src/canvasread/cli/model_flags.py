"""The Models panel of `canvasread serve` (and `canvasread mcp`): what to serve and how to run it in process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from canvasread.backends.sparrow import DEFAULT_SPARROW_MODEL
from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.layouts import DEFAULT_LAYOUT, LAYOUTS, layout_named
from canvasread.catalog import Wing
from canvasread.extras import installed_version

MODELS = "Models"

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
    int | None,
    typer.Option(
        metavar="N",
        rich_help_panel=MODELS,
        help="In-process engine: batches read at once, their reads, re-reads and thoughts sharing its passes "
        "(default: 64 on a GPU, 4 on a CPU).",
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
        """The in-process engine's settings, checked before the port binds (see `_check_device`)."""
        settings = EngineSettings(
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
        _check_device(settings)
        return settings

    def reading(self) -> ReadSettings:
        return ReadSettings(layout=layout_named(self.layout))


def _check_device(settings: EngineSettings) -> None:
    """A device the machine lacks (`--device cuda` without CUDA; `--gpus N` places replicas on cuda:0..N-1) could
    only fail the load behind the open port: refused now. Without torch no model runs in process to use one."""
    device = settings.device if settings.gpus == 1 else f"cuda:{settings.gpus - 1}"
    if device is None or installed_version("torch") is None:
        return
    from canvasread.canvas.engine.loader import present_device

    present_device(device)
