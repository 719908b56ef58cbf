"""`canvasread ask`: questions from flags or a file, answered in process or by a running server."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core
from rich.markup import escape
from rich.table import Table

from canvasread.catalog import open_decider
from canvasread.cli.errors import UserError, console, warn
from canvasread.cli.options import DEFAULT_API_KEY, DEFAULT_MODEL, ApiKey, ModelSpec, Order, RemoteUrl
from canvasread.kinds import UnknownKind, kind_of
from canvasread.types import OrderMode

# Seconds one request may take over HTTP: the server's own default deadline, plus a little for the network.
HTTP_TIMEOUT_S = 130.0
# Where in click's per-invocation scratch space the flags' order is kept.
FLAG_ORDER = "canvasread.flag_order"


class OrderedCommand(typer.core.TyperCommand):
    """Remembers the order flags came in, so each -o and -l can attach to the question before it."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer's own (vendored) click Context
        _, _, order = self.make_parser(ctx).parse_args(args=list(args))
        ctx.meta[FLAG_ORDER] = [param.name for param in order]
        return super().parse_args(ctx, args)


def _option(text: str) -> tuple[str, str | None]:
    name, _, description = text.partition("=")
    return name.strip(), (description.strip() or None)


# The flags that ask a question, each named after the kind it asks; -o and -l attach to the one before them.
QUESTION_FLAGS = ("noul", "choice", "score")
# What each attached flag adds, as the kind's schema shapes its criteria: a named option, or the next level.
ATTACHED_FLAGS = {"option": ("object", "-o/--option"), "level": ("array", "-l/--level")}


@functools.cache
def criteria_shape(kind: str) -> str | None:
    """The JSON type of the kind's criteria in its wire schema (`object`: named options, `array`: levels)."""
    criteria = kind_of(kind).question_model.model_json_schema()["properties"].get("criteria", {})
    shape = criteria.get("type")
    return shape if isinstance(shape, str) else None


def questions_from_flags(order: list[str], values: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """The questions map the flags describe, in the order given; each -o/-l attaches to the question before it.

    `order` names each flag occurrence (click's parse order); `values` holds each flag's values in that order.
    A kind asked once keeps its plain key (`choice`); asked several times, its keys are numbered (`choice_2`).
    """
    remaining = {name: list(items) for name, items in values.items()}
    seen = dict.fromkeys(QUESTION_FLAGS, 0)
    questions: dict[str, dict[str, Any]] = {}
    last: dict[str, Any] | None = None
    for name in order:
        if name in QUESTION_FLAGS:
            seen[name] += 1
            key = name if len(values[name]) == 1 else f"{name}_{seen[name]}"
            last = {"type": name, "instructions": remaining[name].pop(0)}
            shape = criteria_shape(name)
            if shape is not None:
                last["criteria"] = {} if shape == "object" else []
            questions[key] = last
        elif name in ATTACHED_FLAGS:
            shape, flag = ATTACHED_FLAGS[name]
            text = remaining[name].pop(0)
            if last is None or criteria_shape(last["type"]) != shape:
                asking = " or ".join(f"--{kind}" for kind in QUESTION_FLAGS if criteria_shape(kind) == shape)
                raise UserError(f"{flag} {text!r} needs a {asking} question before it")
            if shape == "object":
                last["criteria"].update([_option(text)])
            else:
                last["criteria"].append(text)
    for question in questions.values():
        if "criteria" in question and not question["criteria"]:
            flag = next(flag for shape, flag in ATTACHED_FLAGS.values() if shape == criteria_shape(question["type"]))
            raise UserError(f"--{question['type']} {question['instructions']!r} has no options: add {flag} after it")
    return questions


def _read_body(file: Path | None) -> dict[str, Any]:
    """A --file: a full request body, or just its questions map."""
    if file is None:
        return {}
    try:
        loaded = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise UserError(f"{file} is not valid JSON: {error}") from None
    if not isinstance(loaded, dict):
        raise UserError(
            f"{file} holds a JSON {type(loaded).__name__}; give a request body or a questions map (an object)"
        )
    return loaded if "questions" in loaded else {"questions": loaded}


def _state(argument: str | None, body: dict[str, Any], as_json: bool) -> Any:
    """The state from the argument ('-' is stdin), else from the file's body (saying so when both give one)."""
    text = sys.stdin.read() if argument == "-" else argument
    if text is not None and ("state" in body or "document" in body):
        where = "standard input" if argument == "-" else "the STATE argument"
        warn(f"the state from {where} replaces the state in --file")
    value = body.get("state", body.get("document")) if text is None else text
    if value is None:
        raise UserError("no state: pass it as an argument, '-' for stdin, or in --file")
    if as_json and isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise UserError(f"--state-json: the state is not valid JSON: {error}") from None
    return value


def _answer(url: str | None, api_key: str, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """The response body, from the server at `url` or from the model run here."""
    if url is not None:
        from canvasread.cli.client import call

        return call("POST", url, "/v1/systemone", api_key, body={"model": model, **body}, timeout_s=HTTP_TIMEOUT_S)
    decider = open_decider((model,))
    state, questions = body.pop("state"), body.pop("questions")
    response: dict[str, Any] = decider.ask(state, questions, **body)
    return response


def _bar(p: float, width: int = 20) -> str:
    filled = round(p * width)
    return "█" * filled + "·" * (width - filled)


def _summary(answer: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """The answer in words, and the probabilities to draw, as its kind tells them (a kind this version does not
    know, from a newer server, is shown as its JSON)."""
    try:
        kind = kind_of(answer["type"])
    except UnknownKind:
        return json.dumps({k: v for k, v in answer.items() if k != "type"}, ensure_ascii=False), {}
    return kind.summary(answer)


def print_answers(response: dict[str, Any], questions: dict[str, dict[str, Any]]) -> None:
    table = Table(title=f"model {response['model']}", show_lines=True)
    table.add_column("question", ratio=1)
    table.add_column("answer")
    table.add_column("probabilities", no_wrap=True)
    for key, answer in response["answers"].items():
        summary, rows = _summary(answer)
        if answer.get("abstain"):
            summary += "\nabstain"
        width = min(24, max((len(str(name)) for name in rows), default=1))
        bars = "\n".join(f"{str(name)[:width]:>{width}} {_bar(p)} {p:.3f}" for name, p in rows.items())
        table.add_row(escape(str(questions.get(key, {}).get("instructions") or key)), escape(summary), escape(bars))
    console.print(table)
    for key, answer in response["answers"].items():
        if "diagnostics" in answer:
            console.print(f"diagnostics of {escape(key)}: {escape(json.dumps(answer['diagnostics']))}", soft_wrap=True)
    usage = response["usage"]
    console.print(f"usage: {_count(usage['input_tokens'], 'input')}, {_count(usage['output_tokens'], 'output')}")
    for warning in response.get("warnings") or ():  # what the answers do not honour as sent, on stderr
        warn(f"{'.'.join(map(str, warning['loc']))}: {warning['msg']}")


def _count(tokens: int, kind: str) -> str:
    return f"{tokens} {kind} token{'' if tokens == 1 else 's'}"


State = Annotated[str | None, typer.Argument(metavar="STATE", help="The state (text); '-' reads standard input.")]
Noul = Annotated[list[str] | None, typer.Option(metavar="TEXT", help="A yes/no question (repeatable).")]
Choice = Annotated[
    list[str] | None, typer.Option(metavar="TEXT", help="A pick-one question (repeatable); its options follow as -o.")
]
Options = Annotated[
    list[str] | None,
    typer.Option("--option", "-o", metavar="NAME[=DESCRIPTION]", help="An option of the --choice before it."),
]
Score = Annotated[
    list[str] | None, typer.Option(metavar="TEXT", help="A score question (repeatable); its levels follow as -l.")
]
Levels = Annotated[
    list[str] | None,
    typer.Option("--level", "-l", metavar="TEXT", help="A level of the --score before it, lowest first."),
]
File = Annotated[Path | None, typer.Option(metavar="PATH", help="JSON file: a full request body or a questions map.")]
StateJson = Annotated[bool, typer.Option(help="Parse the state as JSON.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the raw response.")]
Seed = Annotated[int | None, typer.Option(metavar="N", help="Seed of the canvas noise (same seed, same answers).")]
Samples = Annotated[
    str | None, typer.Option(metavar="N|auto", help="Reads per question, 1-16, or auto (re-read the uncertain).")
]
Diagnostics = Annotated[bool, typer.Option(help="Ask for each question's read details (printed below the table).")]
MinConfidence = Annotated[
    float | None, typer.Option(metavar="P", help="Abstain below this confidence (questions that set none).")
]


def _samples(text: str | None) -> int | str | None:
    if text is None or text == "auto":
        return text
    if not text.isdigit():
        raise UserError(f"--samples takes a number of reads or auto, not {text!r}")
    return int(text)


def request_options(
    seed: int | None, samples: str | None, diagnostics: bool, order: OrderMode | None
) -> dict[str, Any]:
    """The extension keys the flags set; each replaces the same key of a --file body."""
    chosen = {"seed": seed, "samples": _samples(samples), "diagnostics": diagnostics or None, "order": order}
    return {key: value for key, value in chosen.items() if value is not None}


def ask(
    ctx: typer.Context,
    state: State = None,
    noul: Noul = None,
    choice: Choice = None,
    option: Options = None,
    score: Score = None,
    level: Levels = None,
    file: File = None,
    state_json: StateJson = False,
    url: RemoteUrl = None,
    model: ModelSpec = DEFAULT_MODEL,
    api_key: ApiKey = DEFAULT_API_KEY,
    as_json: AsJson = False,
    seed: Seed = None,
    samples: Samples = None,
    diagnostics: Diagnostics = False,
    order: Order = None,
    min_confidence: MinConfidence = None,
) -> None:
    """Ask questions about a state and print the answers with probability bars."""
    body = _read_body(file)
    flags = {name: ctx.params[name] or [] for name in (*QUESTION_FLAGS, *ATTACHED_FLAGS)}
    asked = questions_from_flags(ctx.meta.get(FLAG_ORDER, []), flags)
    questions = {**body.get("questions", {}), **asked}
    if not questions:
        raise UserError("no questions: use --noul, --choice with -o, --score with -l, or --file")
    if min_confidence is not None:
        questions = {key: {"min_confidence": min_confidence, **question} for key, question in questions.items()}
    extensions = {k: v for k, v in body.items() if k not in ("questions", "state", "document", "model")}
    extensions.update(request_options(seed, samples, diagnostics, order))
    request = {"state": _state(state, body, state_json), "questions": questions, **extensions}
    response = _answer(url, api_key, model, request)
    if as_json:
        sys.stdout.write(json.dumps(response, ensure_ascii=False, indent=2) + "\n")
    else:
        print_answers(response, questions)
