"""Schema fuzzing of the live server from its own /openapi.json (schemathesis): no 5xx, nothing off the schema.

The real `canvasread serve` process runs with an API key, so the fuzzer also
checks that every operation declared as secured refuses requests without it.
Valid and invalid bodies are generated (`--mode all`, coverage and fuzzing
phases) and every check runs except `positive_data_acceptance`: the schema
cannot say that `data_base64` must hold a PNG or JPEG, or that a noul needs
instructions or a described side, so schema-valid requests are rightly
refused with a 422. CI runs a few hundred cases; `make fuzz` thousands
(CANVASREAD_FUZZ_EXAMPLES). A failure prints schemathesis's report, with a
curl command and the seed to replay it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import cli_process

KEY = "fuzz-key"
EXAMPLES = os.environ.get("CANVASREAD_FUZZ_EXAMPLES", "100")
TESTS = Path(__file__).parent


def test_the_server_holds_to_its_own_schema(tmp_path: Path) -> None:
    with cli_process("--api-key", KEY) as server:
        fuzz = subprocess.run(
            [
                *(sys.executable, "-m", "schemathesis.cli", "run", server.base + "/openapi.json"),
                *("--header", f"Authorization: Bearer {KEY}", "--request-timeout", "60", "--workers", "1"),
                *("--checks", "all", "--exclude-checks", "positive_data_acceptance", "--max-examples", EXAMPLES),
                "--no-color",
            ],
            env={**os.environ, "SCHEMATHESIS_HOOKS": "fuzz_hooks", "PYTHONPATH": str(TESTS)},
            cwd=tmp_path,  # schemathesis keeps its example database in the working directory
            capture_output=True,
            text=True,
            timeout=3600,
        )
        log = server.output()
    assert fuzz.returncode == 0, fuzz.stdout[-20000:] + fuzz.stderr[-5000:]
    assert "Traceback" not in log, log[-20000:]
