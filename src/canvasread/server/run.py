"""Running the app under uvicorn with the connection limits a public server needs."""

from __future__ import annotations

import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from canvasread.server.logs import logging_config
from canvasread.server.protocol import guarded_protocol
from canvasread.settings import ServerSettings


def uvicorn_config(
    app: FastAPI, config: ServerSettings, *, log_level: str = "info", configure_logging: bool = True
) -> uvicorn.Config:
    """uvicorn's settings from ours: header, send, idle and shutdown timeouts, connection caps, our log format.

    uvicorn's own access log is off: ours (`logs.AccessLog`) carries more. Without `configure_logging`
    the process's logging is left as it is (tests that capture logs).
    """
    settings: dict[str, Any] = {
        "host": config.host,
        "port": config.port,
        "http": guarded_protocol(config),
        "timeout_keep_alive": config.keep_alive_s,
        "timeout_graceful_shutdown": config.shutdown_timeout_s,
        "log_level": log_level,
        "log_config": logging_config(config.log_format, log_level) if configure_logging else None,
        "access_log": False,
    }
    return uvicorn.Config(app, **settings)


def listening_socket(config: ServerSettings) -> socket.socket:
    """The server's address, bound now (as uvicorn would bind it), so a port already in use is one clear error
    before anything is printed or loaded; raises `OSError`."""
    # IPPROTO_TCP named, as getaddrinfo gives uvicorn: asyncio sets TCP_NODELAY only on such sockets' connections,
    # and without it every answer on a kept-alive connection waited ~40 ms for the client's delayed ACK.
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((config.host, config.port))
    except OSError:
        listener.close()
        raise
    listener.set_inheritable(True)
    return listener
