"""The eval JSONL format and the Banking77 converter (on the subset that ships in tests/data/banking77)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from canvasread.eval.dataset import banking77, load_items, parse_item, write_jsonl

# The first 3 rows of each intent of the test split, with the dataset's license (see its SOURCE.txt).
BANKING77 = Path(__file__).resolve().parent / "data" / "banking77"


def test_items_validate_like_the_api_and_normalise_expected_labels() -> None:
    noul = parse_item(
        {"id": 1, "state": "s", "question": {"type": "noul", "instructions": "?"}, "expected": True}, "f:1"
    )
    assert (noul.id, noul.expected, noul.options, noul.expected_index) == ("1", "true", ("true", "false"), 0)
    score = parse_item(
        {"id": "s", "state": {"x": 1}, "question": {"type": "score", "criteria": ["a", "b", "c"]}, "expected": 2}, "f:2"
    )
    assert (score.kind, score.expected, score.expected_index) == ("score", "2", 2)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"id": "a", "state": "s", "question": {"type": "choice", "criteria": {"x": None}}}, "f:3: missing expected"),
        (
            {"id": "a", "state": "s", "question": {"type": "choice", "criteria": {"x": None}}, "expected": "y"},
            "'y' is not one of x",
        ),
        (
            {"id": "a", "state": "s", "question": {"type": "choice"}, "expected": "y"},
            "f:3: questions.q.choice.criteria",
        ),
    ],
)
def test_bad_lines_name_the_file_line_and_field(line: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        parse_item(line, "f:3")


def test_load_items_refuses_duplicate_ids_and_honours_limit(tmp_path: Path) -> None:
    line = {"id": "same", "state": "s", "question": {"type": "noul", "instructions": "?"}, "expected": "false"}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(line) + "\n\n" + json.dumps(line) + "\n")
    assert len(load_items(path, limit=1)) == 1
    with pytest.raises(ValueError, match="ids must be unique"):
        load_items(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [("notjson", "d.jsonl:2: not JSON (Expecting value at column 1)"), ("5", "d.jsonl:2: not a JSON object")],
    ids=["not-json", "not-an-object"],
)
def test_a_line_that_is_no_json_object_names_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    line = {"id": "a", "state": "s", "question": {"type": "noul", "instructions": "?"}, "expected": "false"}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(line) + "\n" + text + "\n")
    with pytest.raises(ValueError) as refused:
        load_items(path)
    assert str(refused.value) == f"{tmp_path}/{message}"


def test_banking77_converts_to_77_way_choices(tmp_path: Path) -> None:
    categories = json.loads((BANKING77 / "categories.json").read_text())
    assert len(categories) == 77
    lines = banking77(BANKING77, "test", per_intent=2)
    assert len(lines) == 2 * 77
    assert sorted({line["expected"] for line in lines}) == sorted(categories)
    first = lines[0]
    assert first["id"] == "banking77-test-1"
    assert first["state"] == "How do I locate my card?" and first["expected"] == "card_arrival"
    assert list(first["question"]["criteria"]) == categories
    assert first["question"]["criteria"]["card_arrival"] == "card arrival"
    path = tmp_path / "b.jsonl"
    write_jsonl(lines, path)
    items = load_items(path)
    assert [item.expected for item in items] == [line["expected"] for line in lines]
    assert all(len(item.options) == 77 for item in items)
    assert len(banking77(BANKING77, "test")) == 3 * 77
