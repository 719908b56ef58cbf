"""The in-process engine against a plain transformers forward of the same checkpoint (fp32, tight tolerance)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import canvas_backend, loaded_runtime, png
from reference import generation_path_logprobs

from canvasread.canvas.job import CanvasJob
from canvasread.canvas.plan import noisy_canvas
from canvasread.canvas.readout import slot_reading
from canvasread.decide import Decider
from canvasread.wire import parse_request

STATE = {"ticket": "I was charged twice for order 1182 — please refund me.", "channel": "email"}


def request(questions: dict[str, Any], **extensions: Any) -> Any:
    return parse_request({"model": "default", "state": STATE, "questions": questions, **extensions})[1]


def many_questions(count: int) -> dict[str, Any]:
    questions: dict[str, Any] = {}
    for i in range(count):
        kind = ("noul", "choice", "score")[i % 3]
        if kind == "noul":
            questions[f"q{i}"] = {"type": "noul", "instructions": f"Is statement {i} true?"}
        elif kind == "choice":
            questions[f"q{i}"] = {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {"billing": "charges", "technical": None, "sales": "orders"},
            }
        else:
            questions[f"q{i}"] = {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]}
    return questions


def numbers(response: dict[str, Any]) -> list[float]:
    """Every probability and value of a response's answers, in order."""
    found: list[float] = []
    for answer in response["answers"].values():
        for value in answer.values():
            if isinstance(value, float):
                found.append(value)
            elif isinstance(value, dict):
                found += [v for v in value.values() if isinstance(v, float)]
    return found


def reference_distributions(model: Any, job: CanvasJob, vocab_size: int) -> list[tuple[float, ...]]:
    """One full forward per canvas (encoder + decoder, logits over the whole canvas), read at the slots."""
    result: list[tuple[float, ...]] = [() for _ in job.plan.questions]
    for canvas in job.plan.canvases:
        ids = noisy_canvas(canvas, job.plan.questions, vocab_size=vocab_size, seed=job.seed, read=0)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([job.plan.prompts[0].ids]), decoder_input_ids=torch.tensor([ids]))
        logprobs = torch.log_softmax(out.logits[0].float(), dim=-1)
        for q in canvas.questions:
            planned = job.plan.questions[q]
            chosen = logprobs[planned.position, list(planned.label_ids)].tolist()
            result[q] = slot_reading(chosen).probabilities
    return result


def test_slot_distributions_equal_a_plain_full_forward(tiny_decider: Decider) -> None:
    backend = canvas_backend(tiny_decider)
    runtime = loaded_runtime(backend)
    model = runtime.reader.runner.model  # type: ignore[attr-defined]
    job = backend.prepare(request(many_questions(60), samples=1, seed=11))
    assert len(job.plan.canvases) >= 2, "the request should span several canvases"
    [result] = backend.decide([job])
    expected = reference_distributions(model, job, runtime.tokenizer.vocab_size)
    for got, want in zip(result.distributions, expected, strict=True):
        assert got.probabilities == pytest.approx(want, abs=1e-5)
    assert max(max(d.probabilities) for d in result.distributions) > 0.5, "distributions should not be uniform"


def test_batched_requests_equal_single_requests(tiny_decider: Decider) -> None:
    backend = canvas_backend(tiny_decider)
    jobs = [backend.prepare(request(many_questions(n), samples=1, seed=n)) for n in (3, 7, 20)]
    together = backend.decide(jobs)
    for job, batched in zip(jobs, together, strict=True):
        [alone] = backend.decide([job])
        for a, b in zip(alone.distributions, batched.distributions, strict=True):
            assert a.probabilities == pytest.approx(b.probabilities, abs=1e-5)


def test_seed_reproduces_and_changes_answers(tiny_decider: Decider) -> None:
    questions = many_questions(6)
    first = tiny_decider.ask(STATE, questions, seed=5, samples=1)
    again = tiny_decider.ask(STATE, questions, seed=5, samples=1)
    other = tiny_decider.ask(STATE, questions, seed=6, samples=1)
    # The first ask encodes the prompt in its reads' pass, the second reads it from the store: fp32 sums
    # follow the pass's shape, so the same seed gives the same answers to the last digits (test_passes.py).
    assert numbers(first) == pytest.approx(numbers(again), rel=1e-5)
    assert numbers(first) != pytest.approx(numbers(other), rel=1e-5)


def test_auto_rereads_only_uncertain_questions_without_rerunning_the_encoder(tiny_decider: Decider) -> None:
    backend = canvas_backend(tiny_decider)
    questions = many_questions(9)
    probe = tiny_decider.ask(STATE, questions, seed=21, samples=1, diagnostics=True)
    entropies = sorted(a["diagnostics"]["entropy"] for a in probe["answers"].values())  # type: ignore[index]
    threshold = (entropies[3] + entropies[4]) / 2
    original = backend.settings
    backend.settings = type(original)(reread_entropy=threshold, max_auto_reads=4)
    try:
        before = backend.counters()
        answers = tiny_decider.ask({**STATE, "note": "a new state"}, questions, seed=21, diagnostics=True)["answers"]
        after = backend.counters()
    finally:
        backend.settings = original
    reads = {key: a["diagnostics"]["reads"] for key, a in answers.items()}  # type: ignore[index]
    assert 1 in reads.values() and any(n > 1 for n in reads.values()), reads
    for key, answer in answers.items():
        details = answer["diagnostics"]  # type: ignore[index]
        if details["reads"] > 1:
            assert "stderr" in details and 0.0 <= details["agreement"] <= 1.0
        else:
            assert details["entropy"] <= threshold + 1e-9, key
    assert after["encoder_runs"] - before["encoder_runs"] == 1
    assert after["rereads"] > before["rereads"]


def test_samples_n_reads_every_question_n_times(tiny_decider: Decider) -> None:
    answers = tiny_decider.ask(STATE, many_questions(4), seed=1, samples=3, diagnostics=True)["answers"]
    assert {a["diagnostics"]["reads"] for a in answers.values()} == {3}  # type: ignore[index]


def test_canvas_outside_slots_is_the_tokenized_answer_text(tiny_decider: Decider) -> None:
    backend = canvas_backend(tiny_decider)
    runtime = loaded_runtime(backend)
    job = backend.prepare(request(many_questions(5), seed=3))
    canvas = job.plan.canvases[0]
    noisy = noisy_canvas(canvas, job.plan.questions, vocab_size=runtime.tokenizer.vocab_size, seed=3, read=0)
    slots = {job.plan.questions[q].position for q in canvas.questions}
    assert [i for i, (a, b) in enumerate(zip(canvas.ids, noisy, strict=True)) if a != b] == sorted(slots) or set(
        i for i, (a, b) in enumerate(zip(canvas.ids, noisy, strict=True)) if a != b
    ) <= slots
    assert len(canvas.ids) % 16 == 0
    text = (
        "\n".join(f"{job.plan.questions[q].name}: {job.plan.questions[q].labels[0]}" for q in canvas.questions)
        + "<turn|>"
    )
    assert list(canvas.ids[: canvas.text_tokens]) == runtime.tokenizer.encode(text)
    assert set(canvas.ids[canvas.text_tokens :]) <= {runtime.tokenizer.pad_id}


def test_prefix_cache_serves_requests_with_the_same_questions(tiny_decider: Decider) -> None:
    backend = canvas_backend(tiny_decider)
    questions = {"vip": {"type": "noul", "instructions": "Is the customer a VIP?"}}
    tiny_decider.ask("first customer", questions, samples=1)
    before = backend.counters()
    tiny_decider.ask("second customer, different state", questions, samples=1)
    after = backend.counters()
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] == 1


@pytest.mark.parametrize("shift", [1, 2, 4])
def test_rotate_is_invariant_to_cyclic_shifts_on_the_canvas_engine(tiny_decider: Decider, shift: int) -> None:
    options = {"billing": "charges", "technical": None, "sales": "orders", "account": "logins", "other": None}
    names = list(options)
    shifted = {name: options[name] for name in names[shift:] + names[:shift]}

    def ask(criteria: dict[str, Any], order: str) -> dict[str, float]:
        question = {"team": {"type": "choice", "instructions": "Which team?", "criteria": criteria, "order": order}}
        answer = tiny_decider.ask(STATE, question, seed=9, samples=1)["answers"]["team"]
        return answer["probabilities"]  # type: ignore[index,return-value]

    # Label by label to float rounding: the fp32 sums follow the pass's shape (the first ask also encodes).
    assert ask(options, "rotate") == pytest.approx(ask(shifted, "rotate"), rel=1e-5)
    assert ask(options, "as-given") != pytest.approx(ask(shifted, "as-given"), rel=1e-5)  # the plain read moves


def test_images_reach_the_vision_tower_exactly(tiny_decider: Decider) -> None:
    """An image in the state becomes the vision tower's soft tokens; the read equals transformers' generation path
    given the same image features (`mm_encoder_outputs`, and the bidirectional-within-image encoder masks that
    `generate` builds and a plain forward drops)."""
    import base64

    backend = canvas_backend(tiny_decider)
    runtime = loaded_runtime(backend)
    assert runtime.images is not None
    runner = runtime.reader.runner  # type: ignore[attr-defined]
    model = runner.model

    def request_with(picture: bytes) -> Any:
        asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(picture).decode()}
        return parse_request(
            {
                "model": "m",
                "state": "Photo of the parcel: <image:1> — is it damaged?",
                "assets": {"<image:1>": asset},
                "samples": 1,
                "seed": 2,
                "questions": many_questions(3),
            }
        )[1]

    red, blue = png(96, 64, (220, 20, 20)), png(40, 90, (20, 20, 220))
    job = backend.prepare(request_with(red))
    [image] = job.plan.prompts[0].images
    assert job.plan.prompts[0].ids[image.start - 1] == runtime.images.begin_id
    assert job.plan.prompts[0].ids[image.start + image.tokens] == runtime.images.end_id
    assert job.plan.prompts[0].prefix_length < image.start
    [result] = backend.decide([job])

    features = runner.image_features([red])[0]
    [canvas] = job.plan.canvases
    ids = noisy_canvas(canvas, job.plan.questions, vocab_size=runtime.tokenizer.vocab_size, seed=job.seed, read=0)

    image_token = runtime.images.token_id  # type: ignore[union-attr]
    logprobs = generation_path_logprobs(model, job.plan.prompts[0].ids, ids, image_token, features)
    for planned, got in zip(job.plan.questions, result.distributions, strict=True):
        want = slot_reading(logprobs[planned.position, list(planned.label_ids)].tolist()).probabilities
        assert got.probabilities == pytest.approx(want, abs=1e-5)

    [other] = backend.decide([backend.prepare(request_with(blue))])
    assert other.distributions[0].probabilities != result.distributions[0].probabilities
