"""Per-request limits the server enforces on top of the wire schema, each failing with a 4xx that names the limit.

The body size is checked while reading (`body.read_limited`), its JSON shape
before parsing (`strictjson`) and the images while decoding
(`wire.parse_request`); this module checks what the parsed request asks for
(questions, options and levels, which a server may set below the API's own caps). The
model's context length is the backend's to check in `prepare`, where the
tokenizer is.
"""

from __future__ import annotations

from typing import Any

from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.settings import ServerSettings
from canvasread.types import DecisionRequest
from canvasread.wire import check_option_counts


def check_payload(payload: Any, config: ServerSettings) -> None:
    """Questions per request, counted in the body as sent: before validation, whose work and 422 grow with them
    (100,000 bad questions took 2.5 s to validate and answered 28 MB)."""
    questions = payload.get("questions") if isinstance(payload, dict) else None
    if isinstance(questions, dict) and len(questions) > config.max_questions:
        raise InvalidRequest(
            [
                FieldProblem(
                    ("body", "questions"),
                    f"at most {config.max_questions} questions per request on this server (--max-questions)",
                    "too_long",
                    ctx={"max_length": config.max_questions},
                )
            ]
        )


def check_request(request: DecisionRequest, config: ServerSettings) -> None:
    """Options per choice and levels per score, against this server's limits."""
    check_option_counts(request, config.max_options, config.max_levels, " on this server (--max-{what})")
