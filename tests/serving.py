"""Helpers that run real servers on loopback for the tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn
from fastapi import FastAPI


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(url: str, *, status: int = 200, timeout: float = 60.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, timeout=2)
            if response.status_code == status:
                return response
        except httpx.HTTPError as error:
            last = error
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer {status} within {timeout}s ({last})")


@contextlib.contextmanager
def serve_app(app: FastAPI, *, wait_ready: bool = True) -> Iterator[str]:
    """Run an ASGI app under uvicorn in a thread on a free loopback port; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(base + "/health")
        if wait_ready:
            wait_until(base + "/ready")
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.contextmanager
def serve_cli(*args: str, ready_timeout: float = 120.0, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run `canvasread serve` as a real process; yields the base URL once /ready is 200."""
    port = free_port()
    command = [sys.executable, "-m", "canvasread", "serve", "--port", str(port), "--log-level", "warning", *args]
    process = subprocess.Popen(
        command, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until(base + "/ready", timeout=ready_timeout)
        except TimeoutError:
            process.kill()
            output = process.communicate()[0]
            raise AssertionError(f"server did not become ready:\n{output}") from None
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
