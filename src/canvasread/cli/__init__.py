"""The `canvasread` command: flags become configs, configs go to the library. No logic of its own."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from canvasread import __version__
from canvasread.backends.sparrow import DEFAULT_SPARROW_MODEL
from canvasread.batching import BatchSettings
from canvasread.calibration import Calibration
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.vllm.settings import (
    DEFAULT_CANVAS_LENGTH,
    DEFAULT_UPSTREAM_CONCURRENCY,
    DEFAULT_UPSTREAM_TIMEOUT_S,
    UpstreamSettings,
)
from canvasread.catalog import open_decider
from canvasread.decide import DeciderSettings
from canvasread.errors import CanvasreadError
from canvasread.settings import (
    DEFAULT_HOST,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_QUESTIONS,
    DEFAULT_PORT,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    MAX_LEVELS,
    MAX_OPTIONS,
    ImageLimits,
    LogFormat,
    ServerSettings,
)
from canvasread.types import OrderMode

app = typer.Typer(
    help="canvasread: a self-hosted System One decision server.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()


def _alias_pair(value: str) -> tuple[str, str]:
    name, equals, model = value.partition("=")
    if not equals:
        raise ValueError(f"--alias takes NAME=MODEL, not {value!r}")
    return name.strip(), model.strip()


@app.command()
def serve(
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="Model to serve: an embedded sparrow model name, or a DiffusionGemma folder or hub id. "
            "Repeat to serve several; the first is the default (alias jev-latest)."
        ),
    ] = None,
    alias: Annotated[
        list[str] | None,
        typer.Option(
            help="Another name for a served model, NAME=MODEL (repeatable); may replace a built-in alias "
            "such as jev-preview. Listed by /v1/models."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option(help="Port to bind.")] = DEFAULT_PORT,
    round_to: Annotated[
        int | None,
        typer.Option("--round", help="Round numbers to this many decimals (2 reproduces the hosted API)."),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="torch device for DiffusionGemma (default: cuda if present).")
    ] = None,
    dtype: Annotated[str | None, typer.Option(help="torch dtype (default: bfloat16 on GPU, float32 on CPU).")] = None,
    experts: Annotated[
        str | None, typer.Option(help="transformers experts kernel for DiffusionGemma: eager, batched_mm, grouped_mm.")
    ] = None,
    random_weights: Annotated[
        float | None,
        typer.Option(help="Build DiffusionGemma from the folder's config with N(0, STD) weights (speed tests)."),
    ] = None,
    naive_baseline: Annotated[
        bool, typer.Option(help="Also serve <model>-naive: plain transformers forwards on the same weights.")
    ] = False,
    gpus: Annotated[
        int, typer.Option(help="DiffusionGemma replicas, one per GPU (cuda:0..N-1); batches are split across them.")
    ] = 1,
    compile: Annotated[
        bool, typer.Option(help="On CUDA: torch.compile the layer bodies (compiled and captured at start-up).")
    ] = EngineSettings.compile,
    fp8_experts: Annotated[
        bool, typer.Option(help="Routed experts in FP8 with rowwise scales (faster, not exact).")
    ] = EngineSettings.fp8_experts,
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            help="Read canvases through the vLLM server at this URL (repeatable: each request goes to the "
            "least-loaded healthy one). Serves --upstream-model as the default model; needs --tokenizer."
        ),
    ] = None,
    upstream_model: Annotated[str, typer.Option(help="With --upstream: the name vLLM serves the model under.")] = (
        "dgemma"
    ),
    tokenizer: Annotated[
        str | None, typer.Option(help="With --upstream: the model's tokenizer (folder or hub id), loaded here.")
    ] = None,
    upstream_canvas_length: Annotated[
        int, typer.Option(help="With --upstream: the canvas vLLM serves (its --diffusion-config canvas_length).")
    ] = DEFAULT_CANVAS_LENGTH,
    upstream_max_model_len: Annotated[
        int | None, typer.Option(help="With --upstream: most prompt plus canvas tokens (default: vLLM's).")
    ] = None,
    upstream_timeout: Annotated[
        float, typer.Option(help="With --upstream: seconds per upstream call before failing over.")
    ] = DEFAULT_UPSTREAM_TIMEOUT_S,
    upstream_concurrency: Annotated[
        int, typer.Option(help="With --upstream: upstream calls in flight at once.")
    ] = DEFAULT_UPSTREAM_CONCURRENCY,
    max_batch: Annotated[int, typer.Option(help="Most requests read together in one batch.")] = 32,
    max_wait_ms: Annotated[float, typer.Option(help="How long a batch waits for more requests.")] = 0.0,
    linger_ms: Annotated[
        float, typer.Option(help="How long a batch waits for requests already accepted and still being prepared.")
    ] = BatchSettings.linger_s * 1000.0,
    max_pending: Annotated[int, typer.Option(help="Requests in flight per model before answering 529.")] = 1024,
    timeout: Annotated[float, typer.Option(help="Per-request deadline in seconds (504 past it).")] = 120.0,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    log_format: Annotated[
        LogFormat, typer.Option(help="text for people, json (one object a line) for log shippers.")
    ] = "text",
    log_payloads: Annotated[
        bool, typer.Option(help="Also log each request's state and answers (may hold personal data).")
    ] = False,
    calibration: Annotated[
        list[Path] | None,
        typer.Option(help="Calibration file from `canvasread calibrate`, applied to its model's answers (repeatable)."),
    ] = None,
    api_key: Annotated[
        list[str] | None,
        typer.Option(help="Require this key as `Authorization: Bearer KEY` (repeatable; also CANVASREAD_API_KEYS)."),
    ] = None,
    api_keys_file: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="File of API keys, one a line.")
    ] = None,
    cors_origin: Annotated[
        list[str] | None, typer.Option(help="Let browser pages from this origin call the API (repeatable).")
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest body, before and after decompression (413).")] = (
        DEFAULT_MAX_BODY_BYTES
    ),
    max_questions: Annotated[int, typer.Option(help="Most questions in one request.")] = DEFAULT_MAX_QUESTIONS,
    max_options: Annotated[int, typer.Option(help="Most options in one choice question.")] = MAX_OPTIONS,
    max_levels: Annotated[int, typer.Option(help="Most levels in one score question.")] = MAX_LEVELS,
    max_json_depth: Annotated[int, typer.Option(help="Deepest nesting of arrays and objects in a body.")] = (
        DEFAULT_MAX_JSON_DEPTH
    ),
    max_images: Annotated[int, typer.Option(help="Most images in one request.")] = ImageLimits.max_images,
    max_image_bytes: Annotated[int, typer.Option(help="Largest image file.")] = ImageLimits.max_bytes,
    max_image_pixels: Annotated[int, typer.Option(help="Most pixels (width x height) in one image.")] = (
        ImageLimits.max_pixels
    ),
    shutdown_timeout: Annotated[
        int, typer.Option(help="Seconds in-flight requests get to finish after SIGTERM.")
    ] = DEFAULT_SHUTDOWN_TIMEOUT_S,
) -> None:
    """Start the HTTP server (binds at once; /ready turns 200 when the models have loaded)."""
    import uvicorn

    from canvasread.server.app import create_app
    from canvasread.server.auth import collect_api_keys
    from canvasread.server.logs import logging_config

    try:
        decider_config = DeciderSettings(
            decimals=round_to,
            timeout_s=timeout,
            batch=BatchSettings(max_batch, max_wait_ms / 1000.0, max_pending, linger_ms / 1000.0),
            aliases=tuple(_alias_pair(value) for value in alias or ()),
        )
        upstream_settings = (
            UpstreamSettings(
                urls=tuple(upstream),
                tokenizer=tokenizer or "",
                model=upstream_model,
                canvas_length=upstream_canvas_length,
                max_model_len=upstream_max_model_len,
                timeout_s=upstream_timeout,
                concurrency=upstream_concurrency,
            )
            if upstream
            else None
        )
    except ValueError as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    try:
        decider = open_decider(
            tuple(model or (() if upstream else (DEFAULT_SPARROW_MODEL,))),
            decider_config,
            EngineSettings(
                device=device,
                dtype=dtype,
                experts=experts,
                random_init_std=random_weights,
                naive_baseline=naive_baseline,
                gpus=gpus,
                compile=compile,
                fp8_experts=fp8_experts,
            ),
            load=False,
            upstream=upstream_settings,
        )
        for path in calibration or []:
            decider.use_calibration(Calibration.load(path))
    except (CanvasreadError, ValueError) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    try:
        server_config = ServerSettings(
            host=host,
            port=port,
            log_format=log_format,
            log_payloads=log_payloads,
            api_keys=collect_api_keys(api_key or (), keys_file=api_keys_file),
            cors_origins=tuple(cors_origin or ()),
            max_body_bytes=max_body_bytes,
            max_questions=max_questions,
            max_options=max_options,
            max_levels=max_levels,
            max_json_depth=max_json_depth,
            images=ImageLimits(max_images, max_image_bytes, max_image_pixels),
            shutdown_timeout_s=shutdown_timeout,
        )
    except ValueError as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    console.print(
        f"canvasread {__version__} on http://{host}:{port} serving {', '.join(s.card.name for s in decider.served)}"
    )
    if server_config.api_keys:
        console.print(f"API keys required ({len(server_config.api_keys)} configured)")
    elif host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/yellow] no API keys: anyone who can reach {host}:{port} can use it")
    uvicorn.run(
        create_app(decider, server_config),
        host=host,
        port=port,
        log_level=log_level,
        log_config=logging_config(server_config.log_format, log_level),
        access_log=False,
        timeout_graceful_shutdown=server_config.shutdown_timeout_s,
    )


def _parse_option(text: str) -> tuple[str, str | None]:
    name, _, description = text.partition("=")
    return name.strip(), (description.strip() or None)


def _questions_from_flags(
    noul: list[str], choice: str | None, options: list[str], score: str | None, levels: list[str]
) -> dict[str, Any]:
    questions: dict[str, Any] = {}
    for index, text in enumerate(noul):
        questions[f"noul_{index + 1}" if len(noul) > 1 else "noul"] = {"type": "noul", "instructions": text}
    if choice is not None:
        questions["choice"] = {
            "type": "choice",
            "instructions": choice,
            "criteria": dict(map(_parse_option, options)),
        }
    if score is not None:
        questions["score"] = {"type": "score", "instructions": score, "criteria": levels}
    return questions


def _bar(p: float, width: int = 20) -> str:
    filled = round(p * width)
    return "█" * filled + "·" * (width - filled)


def _print_answers(response: dict[str, Any]) -> None:
    table = Table(title=f"model {response['model']}", show_lines=True)
    table.add_column("question")
    table.add_column("answer")
    table.add_column("probabilities")
    for key, answer in response["answers"].items():
        if answer["type"] == "noul":
            summary = f"noul {answer['noul']:.3f}"
            rows = {"true": answer["noul"], "false": 1.0 - answer["noul"]}
        else:
            headline = answer["choice"] if answer["type"] == "choice" else f"{answer['score']:.2f}"
            summary = f"{answer['type']} {headline}\nconfidence {answer['confidence']:.2f}"
            rows = answer["probabilities"]
        if answer.get("abstain"):
            summary += "\nabstain"
        bars = "\n".join(f"{name[:24]:>24} {_bar(p)} {p:.3f}" for name, p in rows.items())
        table.add_row(key, summary, bars)
    console.print(table)
    usage = response["usage"]
    console.print(f"usage: {usage['input_tokens']} input tokens, {usage['output_tokens']} output tokens")


@app.command()
def ask(
    state: Annotated[str | None, typer.Argument(help="The state (text); '-' reads standard input.")] = None,
    noul: Annotated[list[str] | None, typer.Option(help="A yes/no question (repeatable).")] = None,
    choice: Annotated[str | None, typer.Option(help="A pick-one question; give options with -o.")] = None,
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="A choice option: name or name=description.")
    ] = None,
    score: Annotated[str | None, typer.Option(help="A score question; give levels with -l, lowest first.")] = None,
    level: Annotated[list[str] | None, typer.Option("--level", "-l", help="A score level, lowest first.")] = None,
    file: Annotated[Path | None, typer.Option(help="JSON file: a full request body or a questions map.")] = None,
    state_json: Annotated[bool, typer.Option(help="Parse the state as JSON.")] = False,
    url: Annotated[str | None, typer.Option(help="Ask a running server instead of a model in process.")] = None,
    model: Annotated[str, typer.Option(help="Model name; in process, a model spec as for serve.")] = "default",
    api_key: Annotated[str, typer.Option(envvar="TYPESAFE_API_KEY", help="API key for --url.")] = "local",
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw response.")] = False,
) -> None:
    """Ask questions about a state and print the answers with probability bars."""
    body: dict[str, Any] = {}
    if file is not None:
        loaded = json.loads(file.read_text())
        body = loaded if "questions" in loaded else {"questions": loaded}
    questions = {
        **body.get("questions", {}),
        **_questions_from_flags(noul or [], choice, option or [], score, level or []),
    }
    if not questions:
        raise typer.BadParameter("no questions: use --noul, --choice/-o, --score/-l or --file")
    text = sys.stdin.read() if state == "-" else state
    state_value: Any = body.get("state", body.get("document")) if text is None else text
    if state_json and isinstance(state_value, str):
        state_value = json.loads(state_value)
    if state_value is None:
        raise typer.BadParameter("no state: pass it as an argument, '-' for stdin, or in --file")
    extensions = {k: v for k, v in body.items() if k not in ("questions", "state", "document", "model")}
    try:
        if url is not None:
            response = _ask_server(
                url, api_key, {"model": model, "state": state_value, "questions": questions, **extensions}
            )
        else:
            spec = DEFAULT_SPARROW_MODEL if model in ("default", "jev-latest") else model
            decider = open_decider((spec,))
            response = decider.ask(state_value, questions, **extensions)
    except CanvasreadError as error:
        console.print(f"[red]error:[/red] {error.message}")
        raise typer.Exit(1) from None
    if as_json:
        sys.stdout.write(json.dumps(response, ensure_ascii=False, indent=2) + "\n")
    else:
        _print_answers(response)


def _ask_server(url: str, api_key: str, body: dict[str, Any]) -> dict[str, Any]:
    import httpx

    reply = httpx.post(
        url.rstrip("/") + "/v1/systemone",
        json=body,
        timeout=120,
        headers={"Authorization": f"Bearer {api_key}"},
    )
    if reply.status_code != 200:
        console.print(f"[red]HTTP {reply.status_code}:[/red] {reply.text}")
        raise typer.Exit(1)
    result: dict[str, Any] = reply.json()
    return result


@app.command()
def models(
    url: Annotated[str, typer.Option(help="Server to ask.")] = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}",
    api_key: Annotated[str, typer.Option(envvar="TYPESAFE_API_KEY")] = "local",
) -> None:
    """List the models a running server serves."""
    import httpx

    reply = httpx.get(url.rstrip("/") + "/v1/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
    reply.raise_for_status()
    table = Table("name", "release", "description")
    for entry in reply.json()["models"]:
        table.add_row(entry["name"], entry["release_date"], entry["description"])
    console.print(table)


def _command_line() -> str:
    return shlex.join(["canvasread", *sys.argv[1:]])


def _print_report(report: dict[str, Any], out: Path) -> None:
    table = Table("metric", "value", title=f"{report['run']['model']}: {report['n']} decisions")
    keys = ("accuracy", "ece", "brier", "log_loss", "latency_p50_ms", "latency_p95_ms", "abstentions", "errors")
    for key in (*keys, "flip_rate", "mean_probability_shift"):
        if report.get(key) is not None:
            table.add_row(key, f"{report[key]:.4g}" if isinstance(report[key], float) else str(report[key]))
    console.print(table)
    console.print(f"wrote {out / 'report.json'}, {out / 'report.md'} and {out / 'reliability.png'}")


@app.command("eval")
def eval_command(
    data: Annotated[Path, typer.Argument(help="JSONL of labelled decisions (`canvasread banking77` writes one).")],
    out: Annotated[Path, typer.Option(help="Folder for report.json, report.md and reliability.png.")] = Path("eval"),
    url: Annotated[str | None, typer.Option(help="Evaluate a running server instead of a model in process.")] = None,
    model: Annotated[str, typer.Option(help="Model name; in process, a model spec as for serve.")] = "default",
    api_key: Annotated[str, typer.Option(envvar="TYPESAFE_API_KEY", help="API key for --url.")] = "local",
    calibration: Annotated[Path | None, typer.Option(help="In process: apply this calibration file.")] = None,
    order: Annotated[OrderMode | None, typer.Option(help="Send this order mode with every request.")] = None,
    order_check: Annotated[
        bool, typer.Option(help="Re-ask choice questions with options reversed and shuffled; report flips.")
    ] = False,
    min_confidence: Annotated[
        float | None, typer.Option(help="Set min_confidence on questions that lack it; count abstentions.")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Decisions asked at once.")] = 8,
    limit: Annotated[int | None, typer.Option(help="Only the first N decisions.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the order check's shuffles.")] = 0,
) -> None:
    """Score a model on labelled decisions: accuracy, ECE, Brier, log loss, latency, order stability."""
    from canvasread.eval.pipeline import RunOptions, evaluate

    options = RunOptions(data, model, url, api_key, order, concurrency, limit, seed, _command_line())
    try:
        report = evaluate(options, out, order_check=order_check, min_confidence=min_confidence, calibration=calibration)
    except (CanvasreadError, ValueError, OSError) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    _print_report(report, out)


@app.command()
def calibrate(
    data: Annotated[Path, typer.Argument(help="JSONL of labelled decisions to fit and test on.")],
    out: Annotated[Path, typer.Option(help="Where to write the calibration file.")] = Path("calibration.json"),
    model: Annotated[str, typer.Option(help="Model spec as for serve (run in process).")] = "default",
    holdout: Annotated[float, typer.Option(help="Share of decisions held out to measure ECE before/after.")] = 0.3,
    order: Annotated[OrderMode | None, typer.Option(help="Fit on answers read in this order mode.")] = None,
    concurrency: Annotated[int, typer.Option(help="Decisions asked at once.")] = 8,
    limit: Annotated[int | None, typer.Option(help="Only the first N decisions.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the fit/held-out split.")] = 0,
) -> None:
    """Fit temperature scaling per (question type, option-count bucket); report held-out ECE before and after."""
    from canvasread.eval.pipeline import RunOptions
    from canvasread.eval.pipeline import calibrate as fit

    options = RunOptions(data, model, None, "local", order, concurrency, limit, seed, _command_line())
    try:
        result = fit(options, out, holdout=holdout)
    except (CanvasreadError, ValueError, OSError) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    table = Table("bucket", "fit", "held out", "temperature", "ECE before", "ECE after", title=result.model)
    for name, entry in result.fit["buckets"].items():
        held = entry["held_out"]
        temperature = "—" if entry["temperature"] is None else f"{entry['temperature']:.3f}"
        before, after = (f"{held[k]:.4f}" if k in held else "—" for k in ("ece_before", "ece_after"))
        table.add_row(name, str(entry["n_fit"]), str(entry["n_held_out"]), temperature, before, after)
    console.print(table)
    console.print(f"wrote {out} (fingerprint {result.fingerprint})")


@app.command()
def banking77(
    out: Annotated[Path, typer.Argument(help="JSONL file to write.")],
    source: Annotated[Path, typer.Option(help="Folder with the Banking77 CSVs and categories.json.")] = Path(
        "../shared/data/banking77"
    ),
    split: Annotated[str, typer.Option(help="train or test.")] = "test",
    per_intent: Annotated[int | None, typer.Option(help="Keep the first N rows of each intent.")] = None,
) -> None:
    """Convert Banking77 to eval JSONL: one 77-way choice per message."""
    from canvasread.eval.dataset import BANKING77_CITATION, write_jsonl
    from canvasread.eval.dataset import banking77 as convert

    lines = convert(source, split, per_intent)
    write_jsonl(lines, out)
    console.print(f"wrote {len(lines)} decisions to {out}. Data: {BANKING77_CITATION}.")


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


@app.command()
def bench(
    url: Annotated[
        str, typer.Option(help="Server to drive (loopback only).")
    ] = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}",
    model: Annotated[str, typer.Option(help="Model name to ask.")] = "jev-latest",
    concurrency: Annotated[str, typer.Option(help="Comma-separated concurrency levels.")] = "1,2,4,8,16,32,64,128,256",
    duration: Annotated[float, typer.Option(help="Seconds per level (after a short warm-up).")] = 10.0,
    baseline_model: Annotated[
        str | None, typer.Option(help="Also sweep this model (e.g. <model>-naive) as the baseline.")
    ] = None,
    baseline_concurrency: Annotated[str, typer.Option(help="Levels for the baseline sweep.")] = "1,4,16",
    gpu: Annotated[str, typer.Option(help="What the server runs on, for the report.")] = "unknown",
    api_key: Annotated[str, typer.Option(envvar="TYPESAFE_API_KEY")] = "local",
    out: Annotated[Path, typer.Option(help="Folder for bench.json and bench.png.")] = Path("bench-out"),
) -> None:
    """Sweep concurrency levels against a running server; print and save decisions/s and latency percentiles."""
    from rich.progress import Progress

    from canvasread.tools.bench import Level, run_sweep, summarise, write_outputs

    def levels_of(text: str) -> list[int]:
        return [int(part) for part in text.split(",") if part.strip()]

    table = Table("model", "clients", "decisions/s", "p50 ms", "p95 ms", "p99 ms", "errors")
    sweeps: dict[str, list[Level]] = {}
    plan = [(model, levels_of(concurrency))] + (
        [(baseline_model, levels_of(baseline_concurrency))] if baseline_model else []
    )
    with Progress(console=console) as progress:
        task = progress.add_task("sweeping", total=sum(len(levels) for _, levels in plan))

        def show(name: str) -> Callable[[Level], None]:
            def record(level: Level) -> None:
                progress.advance(task)
                table.add_row(
                    name,
                    str(level.concurrency),
                    f"{level.decisions_per_s:.1f}",
                    *(f"{v:.1f}" if v is not None else "-" for v in (level.p50_ms, level.p95_ms, level.p99_ms)),
                    str(level.errors),
                )

            return record

        for name, levels in plan:
            sweeps[name] = run_sweep(url, name, levels, duration_s=duration, api_key=api_key, on_level=show(name))
    console.print(table)
    command = "canvasread " + " ".join(shlex.quote(arg) for arg in sys.argv[1:])
    result = summarise(sweeps[model], sweeps.get(baseline_model or "", []), command=command, gpu=gpu)
    for path in write_outputs(result, out):
        console.print(f"wrote {path}")


def main() -> None:
    app()
