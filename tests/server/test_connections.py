"""The HTTP layer under abuse (issue 16): timeouts, a connection cap, early 413s, bounded labels, clean logs.

Raw sockets against uvicorn run as `canvasread serve` runs it (`server.run.uvicorn_config`).
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers import serve_app
from prometheus_client.parser import text_string_to_metric_families

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.server.logs import TextFormatter
from canvasread.settings import ServerSettings

SETTINGS = ServerSettings(header_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=1, max_connections=8)
BODY = json.dumps(
    {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "Billing?"}}}
).encode()


def even_app(settings: ServerSettings = SETTINGS) -> Any:
    return create_app(Decider([FunctionBackend(lambda r: [[0.5, 0.5] for _ in r.questions])]), settings)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with serve_app(even_app(), settings=SETTINGS) as url:
        yield url


def connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket's 30 s timeout fails the test if it never does)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def read_health(sock: socket.socket) -> bytes:
    """One whole /health response on a kept-alive connection (headers and body may come in separate packets)."""
    received = b""
    while not received.endswith(b'{"status":"ok"}'):
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    return received


def parse_response(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    return int(status_line.split()[1]), headers, json.loads(body) if body else None


# ---- 9: timeouts, connection cap, early 413 ------------------------------------------------------


def test_a_client_that_never_finishes_its_headers_is_cut_off(base: str) -> None:
    with connect(base) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert read_all(sock) == b""  # closed by the server, not by the 30 s socket timeout


def test_a_silent_connection_is_cut_off(base: str) -> None:
    with connect(base) as sock:
        assert read_all(sock) == b""


def test_a_kept_alive_connection_gets_the_header_timeout_again(base: str) -> None:
    with connect(base) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_health(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
        assert read_all(sock) == b""


def test_a_stalled_body_is_408(base: str) -> None:
    with connect(base) as sock:
        head = "POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY[:10])
        status, headers, detail = parse_response(read_all(sock))
    assert status == 408 and detail["detail"]["error_type"] == "request_timeout"
    assert "(--body-timeout)" in detail["detail"]["message"]
    assert detail["detail"]["request_id"] == headers["x-typesafe-request-id"]


@pytest.mark.parametrize("declared", [str(10**12), str(32 * 1024 * 1024 + 1)])
def test_a_declared_length_over_the_limit_is_413_before_any_body(base: str, declared: str) -> None:
    with connect(base) as sock:
        sock.sendall(
            b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {declared}\r\n\r\n".encode()
        )
        status, _, detail = parse_response(read_all(sock))  # answered, then closed unread
    assert status == 413 and detail["detail"]["error_type"] == "payload_too_large"


# ---- 15: every error in the API's shape ----------------------------------------------------------


POST_HEAD = b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
# h11's buffer for an unfinished request head, which uvicorn (and so `canvasread serve`) keeps at its default.
HEAD_BUFFER = 16 * 1024


@pytest.fixture(scope="module")
def patient_base() -> Iterator[str]:
    """Served with the default 10 s header timeout: an unfinished head is answered long before it is cut off."""
    with serve_app(even_app(ServerSettings()), settings=ServerSettings()) as url:
        yield url


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", "illegal request line"),
        (POST_HEAD + b"Content-Length: -5\r\n\r\n", "bad Content-Length"),
        (POST_HEAD + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n", "conflicting Content-Length headers"),
    ],
)
def test_unparseable_http_is_a_json_400_saying_what_is_wrong(base: str, raw: bytes, says: str) -> None:
    with connect(base) as sock:
        sock.sendall(raw)
        status, headers, detail = parse_response(read_all(sock))
    assert status == 400 and detail["detail"]["error_type"] == "bad_request"
    assert detail["detail"]["request_id"] == headers["x-typesafe-request-id"]
    assert says in detail["detail"]["message"] and "not HTTP/1.1" not in detail["detail"]["message"]


@pytest.mark.parametrize(
    ("head", "status", "error_type"),
    [
        (b"GET /", 414, "uri_too_long"),
        (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ", 431, "request_header_fields_too_large"),
    ],
)
def test_a_head_unfinished_past_the_buffer_is_414_or_431(
    patient_base: str, head: bytes, status: int, error_type: str
) -> None:
    with connect(patient_base) as sock:
        sock.sendall(head.ljust(HEAD_BUFFER + 1, b"a"))  # one byte past: refused once every byte sent is read
        got, headers, detail = parse_response(read_all(sock))
    assert got == status and detail["detail"]["error_type"] == error_type
    assert detail["detail"]["request_id"] == headers["x-typesafe-request-id"]


@pytest.mark.parametrize(
    ("method", "path", "status", "error_type"),
    [("GET", "/nowhere", 404, "not_found"), ("DELETE", "/v1/systemone", 405, "method_not_allowed")],
)
def test_unknown_routes_and_methods_use_the_error_shape(
    base: str, method: str, path: str, status: int, error_type: str
) -> None:
    response = httpx.request(method, base + path)
    assert response.status_code == status
    assert response.json()["detail"]["error_type"] == error_type
    assert response.json()["detail"]["request_id"] == response.headers["x-typesafe-request-id"]


def test_ready_503_carries_the_request_id() -> None:
    class NeverLoads(FunctionBackend):
        def load(self) -> None:
            raise RuntimeError("no weights")

    app = create_app(Decider([NeverLoads(lambda r: [])]), SETTINGS)
    with serve_app(app, wait_ready=False) as url:
        response = httpx.get(url + "/ready")
    assert response.status_code == 503
    assert response.json()["detail"]["request_id"] == response.headers["x-typesafe-request-id"]


# ---- 11 and issue 15 item 12: bounded /metrics labels --------------------------------------------


def request_labels(base: str) -> set[tuple[str, str]]:
    families = text_string_to_metric_families(httpx.get(base + "/metrics").text)
    family = next(f for f in families if f.name == "canvasread_http_requests")
    return {(s.labels["route"], s.labels["method"]) for s in family.samples}


def test_random_methods_and_paths_share_one_label(base: str) -> None:
    with httpx.Client(base_url=base) as client:
        for i in range(40):
            client.request(f"M{i}X", "/health")
            client.get(f"/random-{i}")
    labels = request_labels(base)
    assert ("/health", "other") in labels and ("unmatched", "GET") in labels
    assert not any(method.startswith("M") for _, method in labels)
    assert not any(route.startswith("/random") for route, _ in labels)


def test_docs_and_schema_are_labelled_by_their_routes(base: str) -> None:
    assert httpx.get(base + "/openapi.json").status_code == 200
    assert httpx.get(base + "/docs").status_code == 200
    labels = request_labels(base)
    assert ("/openapi.json", "GET") in labels and ("/docs", "GET") in labels


# ---- issue 26: a client's own request id comes back -----------------------------------------------


def test_a_clients_x_request_id_is_echoed_beside_the_servers_own(base: str) -> None:
    sent = httpx.post(base + "/v1/systemone", json=json.loads(BODY), headers={"x-request-id": "trace-42/abc"})
    assert sent.status_code == 200 and sent.headers["x-request-id"] == "trace-42/abc"
    assert len(sent.headers["x-typesafe-request-id"]) == 32 and sent.headers["x-typesafe-request-id"] != "trace-42/abc"
    assert httpx.get(base + "/nowhere", headers={"x-request-id": "r1"}).headers["x-request-id"] == "r1"
    assert "x-request-id" not in httpx.get(base + "/health").headers
    for unfit in ("has space", "x" * 201, "é"):
        response = httpx.get(base + "/health", headers={"x-request-id": unfit.encode()})
        assert "x-request-id" not in response.headers


# ---- 16: one log line per record -----------------------------------------------------------------


def test_a_newline_in_the_path_cannot_forge_a_log_line(base: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="canvasread.access"):
        httpx.get(base + "/health%0A2026-01-01 INFO canvasread.access GET /forged 200")
    [record] = [r for r in caplog.records if r.name == "canvasread.access" and "forged" in r.getMessage()]
    line = TextFormatter().format(record)
    assert "\n" not in line and "\\n2026-01-01" in line


def test_controls_in_messages_and_tracebacks_are_escaped() -> None:
    try:
        raise ValueError("bad\ninput\x1b[2J")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "got %s", ("a\rb\u2028c",), sys.exc_info())
    lines = TextFormatter().format(record).split("\n")
    assert "a\\rb\\u2028c" in lines[0]
    assert all(line.startswith("  ") for line in lines[1:])
    assert "\x1b" not in "\n".join(lines)


# ---- 17: host names ------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost", "localhost:8011", "127.0.0.1:1", "[::1]:8011"])
def test_loopback_names_are_answered(base: str, host: str) -> None:
    assert httpx.get(base + "/health", headers={"host": host}).status_code == 200


@pytest.mark.parametrize(
    "host",
    [
        "attacker.example",
        "attacker.example:8011",
        "127.0.0.1.nip.io",
        "[::1]evil.example",
        "[::1]:80evil.example",
        "localhost:80@evil.example",
        "localhost@evil.example",
        "127.0.0.1:8011/evil.example",
        "localhost:evil.example",
        "",
    ],
)
def test_other_names_are_refused_on_loopback(base: str, host: str) -> None:
    response = httpx.get(base + "/health", headers={"host": host})
    assert response.status_code == 400
    assert response.json()["detail"]["error_type"] == "host_not_allowed"


def test_allowed_hosts_and_public_binds_answer_other_names() -> None:
    allowed = ServerSettings(allowed_hosts=("canvasread.internal",))
    with serve_app(even_app(allowed)) as url:
        assert httpx.get(url + "/health", headers={"host": "canvasread.internal:443"}).status_code == 200
        assert httpx.get(url + "/health", headers={"host": "other.internal"}).status_code == 400
    with serve_app(even_app(ServerSettings(host="0.0.0.0"))) as url:
        assert httpx.get(url + "/health", headers={"host": "anything.example"}).status_code == 200


# ---- issue 15 item 7: /docs works offline --------------------------------------------------------


def test_docs_load_swagger_ui_from_this_server(base: str) -> None:
    import re

    page = httpx.get(base + "/docs")
    assert page.status_code == 200
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?["']([^"']+)["']""", page.text)
    found = [a or b for a, b in urls]
    assert found and all(url.startswith("/") for url in found), found  # nothing from a CDN
    for url in found:
        assert httpx.get(base + url).status_code == 200, url
    assert "SwaggerUIBundle" in httpx.get(base + "/docs/assets/swagger-ui-bundle.js").text


# ---- the serve flags reach uvicorn and the app ---------------------------------------------------


def test_serve_flags_set_the_connection_limits() -> None:
    from helpers import cli_process

    flags = ("--header-timeout", "0.5", "--allowed-host", "proxy.internal", "--max-json-items", "1000")
    with cli_process(*flags) as server:
        with connect(server.base) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert read_all(sock) == b""
        assert httpx.get(server.base + "/health", headers={"host": "proxy.internal"}).status_code == 200
        assert httpx.get(server.base + "/health", headers={"host": "elsewhere.internal"}).status_code == 400
        many = {
            "model": "jev-latest",
            "state": list(range(2000)),
            "questions": {"q": {"type": "noul", "instructions": "x"}},
        }
        response = httpx.post(server.base + "/v1/systemone", json=many)
        assert response.status_code == 422 and response.json()["detail"][0]["type"] == "json_too_large"
