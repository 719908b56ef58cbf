"""A decompression bomb of objects is refused with bounded memory (issue 16 item 8), measured as peak RSS."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import zstandard
from helpers import cli_process

# `[{}, {}, ...]`: 31 MB of JSON that Python would hold as about 1 GB of dicts; 2.7 KB compressed.
OBJECTS = 10_500_000
MIB = 1024 * 1024


def peak_rss(pid: int) -> int:
    """The process's high-water resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def bomb() -> bytes:
    state = b"[" + b"{}," * (OBJECTS - 1) + b"{}]"
    head = b'{"model": "jev-latest", "questions": {"q": {"type": "noul", "instructions": "x"}}, "state": '
    return zstandard.ZstdCompressor(level=19).compress(head + state + b"}")


def test_four_bombs_at_once_are_422_with_bounded_memory() -> None:
    packed = bomb()
    assert len(packed) < 64 * 1024
    with cli_process() as server, httpx.Client(base_url=server.base, timeout=120) as client:
        ordinary = {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "x"}}}
        assert client.post("/v1/systemone", json=ordinary).status_code == 200  # everything imported and warm
        before = peak_rss(server.process.pid)
        headers = {"content-type": "application/json", "content-encoding": "zstd"}
        with ThreadPoolExecutor(4) as pool:
            responses = list(
                pool.map(lambda _: client.post("/v1/systemone", content=packed, headers=headers), range(4))
            )
        growth = peak_rss(server.process.pid) - before
    for response in responses:
        assert response.status_code == 422, response.text[:300]
        assert response.json()["detail"][0]["type"] == "json_too_large"
    # Two parses at a time, each holding the 31 MB body and one copy of it: far from the 4 GB of parsing them.
    assert growth < 300 * MIB, f"peak RSS grew {growth / MIB:.0f} MiB"
    print(f"peak RSS growth for four bombs: {growth / MIB:.0f} MiB (pid {os.getpid()})")
