"""Model loads are shared while something holds the model, and freed once nothing does."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from canvasread.canvas.engine.loader import load_checkpoint


def test_loads_are_shared_while_held_and_freed_after(tiny_checkpoint: Path) -> None:
    first = load_checkpoint(str(tiny_checkpoint), random_init_std=0.02)
    second = load_checkpoint(str(tiny_checkpoint), random_init_std=0.02)
    assert second.model is first.model
    assert second.fingerprint == first.fingerprint
    other = load_checkpoint(str(tiny_checkpoint), random_init_std=0.03)
    assert other.model is not first.model

    gone = weakref.ref(first.model)
    del first, second
    gc.collect()
    assert gone() is None, "a model nobody holds is freed"
    again = load_checkpoint(str(tiny_checkpoint), random_init_std=0.02)
    assert again.model is not None and again.fingerprint.endswith("-random0.02")
