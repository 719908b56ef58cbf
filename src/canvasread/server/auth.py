"""API keys: who may call the server.

With no keys configured every caller is let in, whatever key it sends (the
official SDK refuses an empty key, so clients always send one). With keys,
every route but the probes and the playground and API docs pages needs
`Authorization: Bearer <key>`; anything else is a 401 in the API's error
shape. Keys are compared as SHA-256 digests with `hmac.compare_digest`, so
neither a key's content nor its length leaks through timing, and they are
never logged or echoed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from canvasread.errors import Unauthorized
from canvasread.server.responses import error_response

KEYS_ENV = "CANVASREAD_API_KEYS"
# Probes must work for orchestrators that hold no key; the playground and API docs pages and their assets hold no
# data (the pages send the key the user gives the playground with what they fetch).
PUBLIC_PATHS = frozenset({"/health", "/ready", "/", "/docs"})
PUBLIC_PREFIXES = ("/static/", "/docs/assets/")
# Where the middleware notes, in the request's state, whether the caller sent a known key.
AUTHORIZED = "authorized"


def collect_api_keys(
    keys: Iterable[str] = (), *, keys_file: Path | None = None, environ: Mapping[str, str] = os.environ
) -> frozenset[str]:
    """Every key from flags, `CANVASREAD_API_KEYS` (comma separated) and a file (one a line, `#` comments).

    Blank entries are dropped: an empty key would otherwise let in any caller that sends `Bearer `. Sources
    given that hold no key at all (`--api-key "$KEY"` with KEY unset) are refused (ValueError): serving without
    keys then would let in everyone the operator meant to keep out.
    """
    given = _key_sources(list(keys), keys_file, environ)
    found = frozenset(key.strip() for entries in given.values() for key in entries if key.strip())
    if given and not found:
        one = len(given) == 1
        raise ValueError(
            f"{' and '.join(given)} {'holds' if one else 'hold'} no API key (blank ones are ignored): "
            f"give a key, or leave {'it' if one else 'them'} out to serve without keys"
        )
    return found


def _key_sources(keys: list[str], keys_file: Path | None, environ: Mapping[str, str]) -> dict[str, list[str]]:
    """The entries of each key source the operator gave, by the name to show them under."""
    given = {"--api-key": keys} if keys else {}
    if environ.get(KEYS_ENV):  # set empty is unset, as a compose file's `${KEYS:-}` leaves it
        given[KEYS_ENV] = environ[KEYS_ENV].split(",")
    if keys_file is not None:
        lines = keys_file.read_text().splitlines()
        given[f"--api-keys-file {keys_file}"] = [line for line in lines if not line.lstrip().startswith("#")]
    return given


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header (the scheme is case-insensitive), else None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" and token.strip() else None
    return None


class ApiKeyMiddleware:
    """Refuses requests without a known key before they reach any route; sits inside `RequestIdMiddleware`."""

    def __init__(self, app: ASGIApp, keys: frozenset[str]) -> None:
        self.app = app
        self._digests = tuple(_digest(key) for key in keys)

    def _allows(self, token: bytes) -> bool:
        """Compares against every key, without stopping at a match, so timing says nothing of which matched."""
        digest = _digest(token)
        matched = False
        for known in self._digests:
            matched |= hmac.compare_digest(digest, known)
        return matched

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._digests:
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope["headers"])
        known = token is not None and self._allows(token)
        path: str = scope.get("path", "")
        if known or path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            scope.setdefault("state", {})[AUTHORIZED] = known
            await self.app(scope, receive, send)
            return
        message = "invalid API key" if token is not None else "missing API key: send Authorization: Bearer <key>"
        request_id = str(scope.get("state", {}).get("request_id", "-"))
        response = error_response(Unauthorized(message), request_id)
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)


def authorized(request: Request) -> bool:
    """Whether the caller may see what the server serves: keys are off, or it sent a known one (public routes
    let anyone in, and say less to callers without a key)."""
    return bool(getattr(request.state, AUTHORIZED, True))
