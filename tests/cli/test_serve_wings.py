"""`serve`'s upstream and escalation flags: a mistake is one line naming the flag, before anything binds."""

from __future__ import annotations

import pytest
from helpers import assert_one_line_error, canvasread


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--escalate-below", "0.5"], "--escalate-below needs --escalate"),
        (["--escalate", "nowhere"], "--escalate nowhere: Unknown model"),
        (["--escalate", "default", "--escalate-below", "2"], "between 0 and 1"),
        (["--upstream-systemone", "http://peer:8000", "--upstream-peer", "tgi"], "--upstream-peer must be one of"),
        (["--upstream-systemone", "http://a:1", "--upstream", "http://b:1"], "not both"),
        (
            ["--upstream-systemone", "http://a:1", "--upstream-peer", "vllm", "--upstream-max-options", "30"],
            "16 and 26",
        ),
    ],
)
def test_a_wrong_flag_is_one_line(flags: list[str], expected: str) -> None:
    assert_one_line_error(canvasread("serve", "--port", "1", *flags), expected)
