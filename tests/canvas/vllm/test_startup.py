"""An upstream that does not answer at start-up: the wing keeps trying, one log line per attempt, no traceback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers import free_port

from canvasread.canvas.vllm import factory
from canvasread.canvas.vllm.settings import VllmSettings
from canvasread.upstream.pool import UpstreamUnavailable


def test_each_attempt_is_one_log_line_until_the_startup_timeout(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(factory, "WAIT_LOG_S", 0.3)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = VllmSettings(
        urls=(url,), tokenizer=str(tiny_checkpoint), canvas_length=256, probe_interval_s=0.1, startup_timeout_s=1.5
    )
    backend = factory.vllm_backend(settings)
    with caplog.at_level(logging.WARNING, logger=factory.__name__), pytest.raises(UpstreamUnavailable):
        backend.load()
    attempts = [record for record in caplog.records if "still trying" in record.getMessage()]
    assert attempts, caplog.text
    for record in attempts:
        message = record.getMessage()
        assert "\n" not in message and record.exc_info is None
        assert message.startswith("no upstream serves dgemma yet") and url in message
