"""Schemathesis hooks for tests/test_fuzz.py, loaded by the fuzzer through SCHEMATHESIS_HOOKS.

Generated model names are random strings, so nearly every request would stop
at a 400 before any question reached the model. Pointing string model names at
the served alias sends the generated questions, criteria and assets through
validation, the batch queue and the model; non-string names stay as generated
so the type checks are still fuzzed. The unknown-model path has its own tests.
"""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def before_call(context: schemathesis.HookContext, case: schemathesis.Case, kwargs: dict[str, Any]) -> None:
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = "jev-latest"
