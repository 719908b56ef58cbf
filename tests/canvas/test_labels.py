"""Label slots against the real Gemma vocabulary: single tokens in context, relabelled when they merge."""

from __future__ import annotations

from pathlib import Path

import pytest

from canvasread.canvas.labels import LabelError, SlotSpec, choice_label_pool, verify_canvas
from canvasread.canvas.plan import Planner
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.errors import InvalidRequest
from canvasread.wire import parse_request


def test_pool_starts_with_letters_and_covers_255_options(tokenizer: HFTokenizer) -> None:
    pool = choice_label_pool(tokenizer)
    assert pool[:26] == tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert len(pool) >= 255


def test_every_label_is_one_token_where_it_stands(tokenizer: HFTokenizer) -> None:
    text = "<|channel>thought\n<channel|>team: \nurgency: <turn|>"
    slots = [
        SlotSpec(text.index("team: ") + 6, ("A", "B", "C"), True),
        SlotSpec(text.index("urgency: ") + 9, ("0", "1", "2"), False),
    ]
    base, verified = verify_canvas(tokenizer, text, slots, choice_label_pool(tokenizer))
    for slot, spec in zip(verified, slots, strict=True):
        for label, token in zip(slot.labels, slot.label_ids, strict=True):
            filled = text[: spec.start] + label + text[spec.start :]
            other = slots[1] if spec is slots[0] else slots[0]
            other_label = "0" if spec is slots[0] else "A"
            at = other.start + (len(label) if other.start > spec.start else 0)
            ids = tokenizer.encode(filled[:at] + other_label + filled[at:])
            assert len(ids) == len(base)
            assert ids[slot.position] == token
            assert [i for i, (a, b) in enumerate(zip(ids, base, strict=True)) if a != b] in ([], [slot.position])


def test_labels_that_merge_with_their_neighbours_are_relabelled(tokenizer: HFTokenizer) -> None:
    # "ing" right after the slot glues onto many labels ("S" + "ing" is one token); those must be replaced.
    text = "pick: ing"
    labels = ("S", "K", "R", "B", "T", "D")
    _, [slot] = verify_canvas(tokenizer, text, [SlotSpec(6, labels, True)], choice_label_pool(tokenizer))
    assert slot.labels != labels
    for label, token in zip(slot.labels, slot.label_ids, strict=True):
        ids = tokenizer.encode(f"pick: {label}ing")
        assert token in ids and len(ids) == len(tokenizer.encode(f"pick: {slot.labels[0]}ing"))


def test_fixed_label_sets_that_merge_are_refused(tokenizer: HFTokenizer) -> None:
    with pytest.raises(LabelError):
        verify_canvas(tokenizer, "pick: ing", [SlotSpec(6, ("S", "K", "R"), False)], choice_label_pool(tokenizer))


def test_255_options_and_64_questions_fit_in_one_request(tokenizer: HFTokenizer) -> None:
    questions = {f"q{i}": {"type": "noul", "instructions": f"Is statement {i} true?"} for i in range(64)}
    questions["big"] = {"type": "choice", "criteria": {f"option {i}": None for i in range(255)}}
    _, request = parse_request({"model": "m", "state": "s", "questions": questions})
    plan = Planner(tokenizer, canvas_length=256, max_positions=None).plan(request)
    big = plan.questions[-1]
    assert len(set(big.label_ids)) == 255
    assert len(plan.canvases) >= 2
    assert all(len(c.ids) <= 256 and len(c.ids) % 16 == 0 for c in plan.canvases)


def test_a_state_past_the_context_is_a_422_at_the_state(tokenizer: HFTokenizer) -> None:
    _, request = parse_request(
        {"model": "m", "state": "word " * 400, "questions": {"q": {"type": "noul", "instructions": "x?"}}}
    )
    with pytest.raises(InvalidRequest) as caught:
        Planner(tokenizer, canvas_length=64, max_positions=256).plan(request)
    assert caught.value.problems[0].loc == ("state",)


def test_noise_stays_inside_the_model_vocabulary(tokenizer: HFTokenizer, tiny_checkpoint: Path) -> None:
    """The tokenizer knows one added token past the model's 262,144 ids; noise must never draw it."""
    import json

    model_vocab = json.loads((tiny_checkpoint / "config.json").read_text())["text_config"]["vocab_size"]
    assert tokenizer.vocab_size == model_vocab
    assert len(tokenizer.encode("<image_soft_token>")) == 1
