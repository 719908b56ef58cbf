"""`canvasread.canvas.seeds`: one derivation for every draw, keyed by what the draw is for; the request's seed as root;
and no other canvas module draws its own random numbers."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import FirstLabel, scripted_backend

from canvasread.canvas import seeds
from canvasread.canvas.plan import noisy_canvas
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.wire import parse_request

CANVAS = Path(__file__).parents[2] / "src" / "canvasread" / "canvas"
BOX = {"where": {"type": "box", "instructions": "Where is the cat?"}}


def test_a_derived_seed_is_a_pure_function_of_every_part() -> None:
    base = seeds.derive(7, 0, "digest", "round0")
    assert base == seeds.derive(7, 0, "digest", "round0") and 0 <= base < 2**64
    others = {seeds.derive(8, 0, "digest", "round0"), seeds.derive(7, 1, "digest", "round0")}
    others |= {seeds.derive(7, 0, "other", "round0"), seeds.derive(7, 0, "digest", "round1"), seeds.derive(7, 0)}
    assert base not in others and len(others) == 5
    assert seeds.derive(7, 0, (1, 2, 3)) != seeds.derive(7, 0, (1, 23)), "a sequence's ids stay apart"


def test_the_request_seed_is_the_callers_or_a_fresh_one() -> None:
    assert seeds.request_seed(5) == 5 and seeds.request_seed(0) == 0
    drawn = {seeds.request_seed(None) for _ in range(8)}
    assert len(drawn) == 8 and all(0 <= seed < 2**seeds.REQUEST_SEED_BITS for seed in drawn)


def test_slot_noise_is_drawn_from_the_question_digest_and_each_box_digit_apart(tokenizer: HFTokenizer) -> None:
    backend = scripted_backend(FirstLabel(), tokenizer)
    job = backend.prepare(parse_request({"model": "m", "state": "a cat", "questions": BOX, "seed": 3})[1])
    [canvas] = job.plan.canvases
    [planned] = job.plan.questions
    ids = noisy_canvas(canvas, job.plan.questions, vocab_size=tokenizer.vocab_size, seed=3, read=2)
    for index, slot in enumerate(planned.slots):
        rng = seeds.noise(3, 2, planned.digest, *([index] if index else []))
        assert ids[slot.position] == rng.randrange(tokenizer.vocab_size)


def test_no_other_canvas_module_draws_random_numbers_or_hashes_a_seed() -> None:
    """`random`, `secrets` and seed hashing live in seeds.py alone (the engine seeds torch from `CanvasRead.seed`)."""
    for path in [*CANVAS.glob("*.py"), *CANVAS.glob("vllm/*.py")]:
        if path.name == "seeds.py":
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                imported.add(node.module)
        assert not imported & {"random", "secrets"}, path
        assert "int.from_bytes" not in path.read_text(), path
