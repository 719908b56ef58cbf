"""Read layouts are chosen per server, reported in diagnostics, and part of the calibration fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import canvas_backend, loaded_runtime
from typer.testing import CliRunner

from canvasread.calibration import Calibration
from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.layouts import LAYOUTS, layout_named
from canvasread.catalog import open_decider
from canvasread.cli import app
from canvasread.decide import Decider
from canvasread.errors import CalibrationMismatch

QUESTIONS = {"refund": {"type": "noul", "instructions": "Is the customer asking for money back?"}}


def fingerprint(decider: Decider) -> str:
    backend = canvas_backend(decider)
    assert backend.fingerprint is not None
    return backend.fingerprint


def test_a_layout_is_reported_and_fingerprinted(tiny_checkpoint: Path, tiny_decider: Decider) -> None:
    other = open_decider((str(tiny_checkpoint),), reading=ReadSettings(layout=layout_named("thought-on-canvas")))
    moved = other.ask("charged twice", QUESTIONS, seed=1, samples=1, diagnostics=True)["answers"]["refund"]  # type: ignore[index]
    usual = tiny_decider.ask("charged twice", QUESTIONS, seed=1, samples=1, diagnostics=True)["answers"]["refund"]  # type: ignore[index]
    assert moved["diagnostics"]["layout"] == "thought-on-canvas" and usual["diagnostics"]["layout"] == "default"
    assert moved["noul"] != usual["noul"]
    assert fingerprint(other) != fingerprint(tiny_decider)
    name = other.served[0].card.name
    with pytest.raises(CalibrationMismatch):
        other.use_calibration(Calibration(name, fingerprint(tiny_decider), {}))
    other.use_calibration(Calibration(name, fingerprint(other), {}))


def test_every_layout_has_a_distinct_description() -> None:
    described = [tuple(sorted(layout.describe().items())) for layout in LAYOUTS.values()]
    assert len(set(described)) == len(LAYOUTS)
    assert all(layout.describe()["name"] == name for name, layout in LAYOUTS.items())


def test_serve_refuses_an_unknown_layout_in_one_line() -> None:
    result = CliRunner().invoke(app, ["serve", "--layout", "sideways"])
    assert result.exit_code == 1
    assert "unknown read layout 'sideways'" in result.output and "default" in result.output


def test_both_label_forms_score_each_label_by_its_better_form(tiny_checkpoint: Path) -> None:
    """vLLM 0.33's whitespace rule: a label scores max(lp(" X"), lp("X")) and both forms count in the mass."""
    import math

    import torch

    from canvasread.canvas.plan import noisy_canvas
    from canvasread.wire import parse_request

    decider = open_decider((str(tiny_checkpoint),), reading=ReadSettings(layout=layout_named("both-label-forms")))
    backend = canvas_backend(decider)
    runtime = loaded_runtime(backend)
    questions = {
        **QUESTIONS,
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {"a": None, "b": None}},
    }
    job = backend.prepare(
        parse_request({"model": "m", "state": "charged twice", "questions": questions, "seed": 3, "samples": 1})[1]
    )
    [result] = backend.decide([job])
    [canvas] = job.plan.canvases
    ids = noisy_canvas(canvas, job.plan.questions, vocab_size=runtime.tokenizer.vocab_size, seed=3, read=0)
    model = runtime.reader.runner.model  # type: ignore[attr-defined]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([job.plan.prompts[0].ids]), decoder_input_ids=torch.tensor([ids])).logits
    logprobs = torch.log_softmax(logits[0].float(), dim=-1)
    for planned, distribution in zip(job.plan.questions, result.distributions, strict=True):
        [slot] = planned.slots
        assert any(i >= 0 for i in slot.other_ids), "the labels have a second form to read"
        for label, token, other in zip(slot.labels, slot.label_ids, slot.other_ids, strict=True):
            if other >= 0:
                forms = {runtime.tokenizer.decode([token]), runtime.tokenizer.decode([other])}
                assert forms == {label, f" {label}"}
        row = logprobs[slot.position]
        scores = [
            max(row[t].item(), row[o].item() if o >= 0 else -math.inf)
            for t, o in zip(slot.label_ids, slot.other_ids, strict=True)
        ]
        total = sum(math.exp(s) for s in scores)
        assert distribution.probabilities == pytest.approx([math.exp(s) / total for s in scores], abs=1e-5)
        mass = sum(math.exp(row[i].item()) for i in slot.read_ids)
        assert distribution.details["label_mass"] == pytest.approx(mass, rel=1e-4)


@pytest.mark.parametrize(("layout", "count"), [("prompt-per-canvas", 60), ("bare-single", 1)])
def test_each_canvas_is_read_against_its_own_prompt(tiny_checkpoint: Path, layout: str, count: int) -> None:
    """In process, every canvas of these layouts reads exactly what one model forward of its own prompt gives."""
    import torch

    from canvasread.canvas.plan import noisy_canvas
    from canvasread.wire import parse_request

    decider = open_decider((str(tiny_checkpoint),), reading=ReadSettings(layout=layout_named(layout)))
    backend = canvas_backend(decider)
    runtime = loaded_runtime(backend)
    questions = {f"q{i}": {"type": "noul", "instructions": f"Is statement {i} true?"} for i in range(count)}
    body = {"model": "m", "state": "charged twice", "questions": questions, "seed": 4, "samples": 1}
    job = backend.prepare(parse_request(body)[1])
    [result] = backend.decide([job])
    assert len(job.plan.prompts) == len(job.plan.canvases) == (2 if count > 1 else 1)
    model = runtime.reader.runner.model  # type: ignore[attr-defined]
    forwards: dict[int, torch.Tensor] = {}  # one forward per canvas, shared by the questions on it
    for planned, distribution in zip(job.plan.questions, result.distributions, strict=True):
        if planned.canvas not in forwards:
            canvas = job.plan.canvases[planned.canvas]
            ids = noisy_canvas(canvas, job.plan.questions, vocab_size=runtime.tokenizer.vocab_size, seed=4, read=0)
            prompt = torch.tensor([job.plan.prompt(canvas).ids])
            with torch.no_grad():
                forwards[planned.canvas] = model(input_ids=prompt, decoder_input_ids=torch.tensor([ids])).logits[0]
        row = torch.log_softmax(forwards[planned.canvas][planned.position].float(), dim=-1)[list(planned.label_ids)]
        assert distribution.probabilities == pytest.approx(torch.softmax(row, dim=-1).tolist(), abs=1e-5)
        assert distribution.details["layout"] == layout
    assert result.usage.input_tokens == job.plan.prompt_tokens
