"""The span and spans kinds: no criteria, a text state, a blank to read, pieces as the answer."""

from __future__ import annotations

import pytest

from canvasread.errors import InvalidRequest
from canvasread.kinds import span, spans
from canvasread.types import Capabilities, DecisionRequest, Distribution, Found, Piece, Question
from canvasread.wire import parse_request

FOUND = Found((Piece("Zoë", 7, 10, 0.9), Piece("Ann", 20, 23, 0.6)), 0.6, complete=False)


def question(kind: str) -> Question:
    body = {
        "model": "m",
        "state": "Hello, Zoë here, and Ann",
        "questions": {"q": {"type": kind, "instructions": "Who?"}},
    }
    [parsed] = parse_request(body)[1].questions
    return parsed


def test_they_need_a_text_state_and_a_model_that_reads_it_back() -> None:
    assert span.KIND.state_refusal("text") is None
    assert "this state is an object" in (span.KIND.state_refusal({"a": 1}) or "")
    assert "a spans question" in (spans.KIND.state_refusal([1]) or "") and "an array" in (
        spans.KIND.state_refusal([1]) or ""
    )
    asked = DecisionRequest("s", (question("span"),))
    assert span.KIND.refusal("m", Capabilities(spans=False), asked) == "model m cannot answer span questions"
    assert span.KIND.refusal("m", Capabilities(spans=True), asked) is None
    with pytest.raises(InvalidRequest, match="take no criteria"):
        parse_request(
            {"model": "m", "state": "s", "questions": {"q": {"type": "span", "instructions": "x", "criteria": {}}}}
        )


@pytest.mark.parametrize("kind", ["span", "spans"])
@pytest.mark.parametrize("instructions", ["", "  \n"])
def test_blank_instructions_ask_for_nothing_so_are_a_422(kind: str, instructions: str) -> None:
    body = {"model": "m", "state": "s", "questions": {"q": {"type": kind, "instructions": instructions}}}
    with pytest.raises(InvalidRequest, match="need instructions") as refused:
        parse_request(body)
    assert [problem.loc for problem in refused.value.problems] == [("questions", "q", kind, "instructions")]


def test_a_span_is_read_at_one_blank_and_spans_list_pieces_with_a_separator() -> None:
    assert span.KIND.blank is not None and span.KIND.blank.separator is None
    assert spans.KIND.blank is not None and spans.KIND.blank.separator == spans.SEPARATOR
    assert spans.SEPARATOR in (spans.KIND.guide or "")
    assert question("span").options == () and span.KIND.bucket(0) is None and spans.KIND.bucket(0) is None


def test_the_answers_carry_the_pieces_by_offsets() -> None:
    one = span.KIND.answer(question("span"), Distribution((), found=FOUND), decimals=1)
    assert one == {"type": "span", "found": True, "text": "Zoë", "start": 7, "end": 10, "confidence": 0.6}
    none = span.KIND.answer(question("span"), Distribution((), found=Found((), 0.8)), decimals=None)
    assert none == {"type": "span", "found": False, "text": "", "start": 0, "end": 0, "confidence": 0.8}
    every = spans.KIND.answer(question("spans"), Distribution((), found=FOUND), decimals=None)
    assert [p["text"] for p in every["spans"]] == ["Zoë", "Ann"] and every["complete"] is False  # type: ignore[index,union-attr]
    assert spans.KIND.confidence(question("spans"), Distribution((), found=FOUND)) == 0.6
    assert spans.KIND.summary(every) == ("'Zoë' at 7:10\n'Ann' at 20:23\nconfidence 0.60", {"Zoë": 0.9, "Ann": 0.6})
    assert span.KIND.summary(none) == ("not found\nconfidence 0.80", {})


def test_ask_if_cannot_test_pieces_and_the_context_quotes_them() -> None:
    asked = question("spans")
    assert (
        spans.KIND.ask_if_problem(asked, True)
        == "'q' is a spans: its answer is pieces of the state, which ask_if cannot test"
    )
    context = spans.KIND.context(asked, Distribution((), found=FOUND))
    assert context == '"Zoë" (characters 7-10 of the state); "Ann" (characters 20-23 of the state), confidence 0.60'
    with pytest.raises(ValueError, match="carries what was found"):
        spans.KIND.confidence(asked, Distribution(()))
