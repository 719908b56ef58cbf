"""The package's public face: `canvasread.__all__`, importable without torch or transformers."""

from __future__ import annotations

import subprocess
import sys

import canvasread

# Run in a fresh interpreter where torch and transformers cannot be imported, as on a base install.
WITHOUT_HEAVY_WINGS = """
import sys
sys.modules["torch"] = None
sys.modules["transformers"] = None
import canvasread
missing = [name for name in canvasread.__all__ if not hasattr(canvasread, name)]
assert not missing, missing
decider = canvasread.open_decider()
answer = decider.ask("I was charged twice", {"refund": {"type": "noul", "instructions": "Refund?"}})
assert answer["answers"]["refund"]["type"] == "noul", answer
print("ok")
"""


def test_every_public_name_resolves() -> None:
    assert sorted(canvasread.__all__) == sorted(set(canvasread.__all__))
    for name in canvasread.__all__:
        assert getattr(canvasread, name) is not None, name


def test_the_base_install_imports_and_answers_without_torch_or_transformers() -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_HEAVY_WINGS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
