"""One access-log line per request, as logfmt text or JSON, and the logging setup of `canvasread serve`.

The line carries the request id (the one in `x-typesafe-request-id`, so a
caller's report can be matched to the log), the model, the question count,
the status and timings. States and answers may be personal data: they are
logged only with `--log-payloads`.

Fields travel on the log record as `record.fields`, so the JSON formatter
emits them as keys and tests can read them from `caplog`.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

from canvasread.server.observe import RequestRecord
from canvasread.settings import LogFormat
from canvasread.types import JSONValue

ACCESS_LOGGER = "canvasread.access"

_BARE_VALUE = re.compile(r"[\w.:/@+-]+")
# What could end or forge a log line: C0 and C1 controls, DEL, and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    """`text` on one line: every control character as a visible escape (`\\n`, `\\x1b`, `\\u2028`)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def access_fields(record: RequestRecord, *, payloads: bool) -> dict[str, JSONValue]:
    """The fields of one access-log line; state and answers only when `payloads` is set."""
    seen = record.exchange
    fields: dict[str, JSONValue] = {
        "request_id": record.request_id,
        "method": record.method,
        "path": record.path,
        "status": record.status,
        "duration_ms": round(record.duration_s * 1000, 3),
    }
    if seen.decision is not None:
        fields["model"] = seen.decision.model
    elif seen.model is not None:
        fields["model"] = seen.model
    if seen.request is not None:
        fields["questions"] = len(seen.request.questions)
    if seen.decision is not None:
        fields["decide_ms"] = round(seen.decision.elapsed_s * 1000, 3)
        fields["input_tokens"] = seen.decision.usage["input_tokens"]
        fields["output_tokens"] = seen.decision.usage["output_tokens"]
    if payloads and seen.request is not None:
        fields["state"] = seen.request.state
    if payloads and seen.decision is not None:
        fields["answers"] = dict(seen.decision.answers)
    return fields


class AccessLog:
    """The `ObserveMiddleware` sink that writes the access log."""

    def __init__(self, *, payloads: bool = False) -> None:
        self.payloads = payloads
        self.logger = logging.getLogger(ACCESS_LOGGER)

    def __call__(self, record: RequestRecord) -> None:
        fields = access_fields(record, payloads=self.payloads)
        self.logger.info("%s %s %d", record.method, record.path, record.status, extra={"fields": fields})


def logfmt(fields: dict[str, Any]) -> str:
    """`key=value` pairs; values with spaces, quotes or structure are JSON-quoted so lines stay parseable."""
    parts = []
    for key, value in fields.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if not _BARE_VALUE.fullmatch(text):
            text = escape_controls(json.dumps(text, ensure_ascii=False))
        parts.append(f"{escape_controls(key)}={text}")
    return " ".join(parts)


class TextFormatter(logging.Formatter):
    """`time level logger message key=value...`: for people reading a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The message on one line whatever a client put in it (a path with a newline cannot forge a record)."""
        record.message = escape_controls(record.message)
        line = super().formatMessage(record)
        fields = getattr(record, "fields", None)
        return f"{line} {logfmt(fields)}" if fields else line

    def formatException(self, ei: Any) -> str:
        """Tracebacks stay multi-line but indented, so no line of one can pass for a record of its own."""
        text = super().formatException(ei)
        return "\n".join("  " + escape_controls(line) for line in text.split("\n"))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: for log shippers. Access-log fields become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def logging_config(log_format: LogFormat, level: str) -> dict[str, Any]:
    """A `dictConfig` for uvicorn's `log_config`: every logger (uvicorn's too) to stderr in one format.

    uvicorn's own access log is turned off by `serve` (`access_log=False`): ours carries more.
    """
    formatter = JsonFormatter if log_format == "json" else TextFormatter
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": {"()": f"{formatter.__module__}.{formatter.__qualname__}"}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
    }
