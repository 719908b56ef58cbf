"""API keys and CORS against the real `canvasread serve` process, plus the key parsing rules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import CliServer, assert_one_line_error, canvasread, cli_process, free_port, serve_app
from typesafe_sdk import Noul, TypeSafeAuthenticationError, TypeSafeClient

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.server.auth import bearer_token, collect_api_keys
from canvasread.settings import ServerSettings

KEYS = ("flag-key-1", "flag-key-2", "env-key-3", "file-key-4")
ORIGIN = "http://playground.example"
BODY = {
    "model": "jev-latest",
    "state": "I was charged twice.",
    "questions": {"q": {"type": "noul", "instructions": "?"}},
}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliServer]:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys_file.write_text(f"# rotated 2026-05\n\n  {KEYS[3]}  \n")
    with cli_process(
        *("--api-key", KEYS[0], "--api-key", KEYS[1], "--api-keys-file", str(keys_file)),
        *("--cors-origin", ORIGIN, "--log-level", "info"),
        env={"CANVASREAD_API_KEYS": f"{KEYS[2]}, ,"},
    ) as server:
        yield server


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    detail = response.json()["detail"]
    assert detail["error_type"] == "authentication_error"
    assert detail["request_id"] == response.headers["x-typesafe-request-id"]


@pytest.mark.parametrize("key", KEYS)
def test_every_configured_key_is_let_in(keyed: CliServer, key: str) -> None:
    response = httpx.post(keyed.base + "/v1/systemone", json=BODY, headers=bearer(key), timeout=30)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("wrong"),
        bearer(KEYS[0] + "x"),
        bearer(KEYS[0][:-1]),
        {"Authorization": KEYS[0]},
        {"Authorization": f"Basic {KEYS[0]}"},
        {"Authorization": "Bearer"},
        {"X-Api-Key": KEYS[0]},
    ],
)
def test_missing_or_wrong_keys_are_401(keyed: CliServer, headers: dict[str, str]) -> None:
    assert_401(httpx.post(keyed.base + "/v1/systemone", json=BODY, headers=headers, timeout=30))


def test_the_scheme_is_case_insensitive(keyed: CliServer) -> None:
    response = httpx.post(
        keyed.base + "/v1/systemone", json=BODY, headers={"Authorization": f"bearer {KEYS[0]}"}, timeout=30
    )
    assert response.status_code == 200


@pytest.mark.parametrize("path", ["/v1/models", "/openapi.json", "/metrics", "/no/such/route"])
def test_every_other_route_needs_a_key(keyed: CliServer, path: str) -> None:
    assert_401(httpx.get(keyed.base + path))
    assert httpx.get(keyed.base + path, headers=bearer(KEYS[1])).status_code != 401


@pytest.mark.parametrize("path", ["/health", "/ready", "/", "/docs", "/static/docs.js"])
def test_probes_and_the_playground_and_docs_pages_are_public(keyed: CliServer, path: str) -> None:
    assert httpx.get(keyed.base + path).status_code == 200


def test_ready_names_the_models_only_to_a_caller_with_a_key(keyed: CliServer) -> None:
    for headers in ({}, bearer("wrong")):
        anonymous = httpx.get(keyed.base + "/ready", headers=headers)
        assert anonymous.status_code == 200 and anonymous.json() == {"status": "ready"}
    known = httpx.get(keyed.base + "/ready", headers=bearer(KEYS[2]))
    assert known.json() == {"status": "ready", "models": ["sparrow-nano-general-v1.1"]}


def test_why_models_are_not_ready_is_told_only_to_a_caller_with_a_key() -> None:
    class NeverLoads(FunctionBackend):
        def load(self) -> None:
            raise RuntimeError("weights missing at /srv/secret-model")

    app = create_app(
        Decider([NeverLoads(lambda r: [], name="secret-model")]), ServerSettings(api_keys=frozenset({"k"}))
    )
    with serve_app(app, wait_ready=False) as url:
        anonymous = httpx.get(url + "/ready")
        known = httpx.get(url + "/ready", headers=bearer("k"))
    assert anonymous.status_code == known.status_code == 503
    assert "secret-model" not in anonymous.text and "API key" in anonymous.json()["detail"]["message"]
    assert "secret-model failed to load" in known.json()["detail"]["message"]


def test_the_official_sdk_with_and_without_the_key(keyed: CliServer) -> None:
    question = {"q": Noul(instructions="Is this about money?")}
    with TypeSafeClient(base_url=keyed.base, api_key=KEYS[3]) as client:
        assert 0.0 <= client.system_one("I was charged twice.", question).nouls["q"].noul <= 1.0
    with TypeSafeClient(base_url=keyed.base, api_key="stolen") as client, pytest.raises(TypeSafeAuthenticationError):
        client.system_one("I was charged twice.", question)


def test_openapi_declares_the_bearer_key(keyed: CliServer) -> None:
    schema = httpx.get(keyed.base + "/openapi.json", headers=bearer(KEYS[0])).json()
    assert schema["components"]["securitySchemes"]["apiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schema["components"]["securitySchemes"]["apiKey"]["description"],
    }
    assert schema["security"] == [{"apiKey": []}]
    assert schema["paths"]["/health"]["get"]["security"] == []


def test_keys_never_reach_the_log(keyed: CliServer) -> None:
    for key in (*KEYS, "guessed-key-0"):
        httpx.post(keyed.base + "/v1/systemone", json=BODY, headers=bearer(key), timeout=30)
    output = keyed.output()
    assert "4 configured" in output
    assert "/v1/systemone" in output  # the access log is on, so the keys had their chance to leak
    for key in (*KEYS, "guessed-key-0"):
        assert key not in output


def test_cors_preflight_without_credentials_is_answered(keyed: CliServer) -> None:
    preflight = httpx.options(
        keyed.base + "/v1/systemone",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()


def test_cors_answers_name_the_allowed_origin_only(keyed: CliServer) -> None:
    allowed = httpx.post(
        keyed.base + "/v1/systemone", json=BODY, headers={**bearer(KEYS[0]), "Origin": ORIGIN}, timeout=30
    )
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "x-typesafe-request-id" in allowed.headers["access-control-expose-headers"]
    other = httpx.post(
        keyed.base + "/v1/systemone", json=BODY, headers={**bearer(KEYS[0]), "Origin": "http://evil.example"}
    )
    assert "access-control-allow-origin" not in other.headers


def test_without_keys_any_key_or_none_is_accepted_and_cors_is_off(sparrow_server: str) -> None:
    for headers in ({}, bearer("anything"), {"Origin": ORIGIN}):
        response = httpx.post(sparrow_server + "/v1/systemone", json=BODY, headers=headers, timeout=30)
        assert response.status_code == 200
        assert "access-control-allow-origin" not in response.headers
    preflight = httpx.options(
        sparrow_server + "/v1/systemone", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    )
    assert "access-control-allow-origin" not in preflight.headers


def test_keys_come_from_flags_environment_and_file(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# a comment\nfile-a\n\n   \n  file-b  \n  # indented comment\n")
    keys = collect_api_keys(["flag", " ", ""], keys_file=keys_file, environ={"CANVASREAD_API_KEYS": "env-a,,env-b "})
    assert keys == {"flag", "file-a", "file-b", "env-a", "env-b"}
    assert collect_api_keys(environ={}) == frozenset()


@pytest.mark.parametrize(
    ("keys", "environ", "file_text", "named"),
    [
        ([""], {}, None, "--api-key holds"),
        (["", " "], {}, None, "--api-key holds"),
        ([], {"CANVASREAD_API_KEYS": " , "}, None, "CANVASREAD_API_KEYS holds"),
        ([], {}, "# rotated 2026-05\n\n   \n", "--api-keys-file "),
        ([""], {"CANVASREAD_API_KEYS": " "}, None, "--api-key and CANVASREAD_API_KEYS hold"),
    ],
    ids=["empty-flag", "blank-flags", "blank-env", "comments-only-file", "two-sources"],
)
def test_keys_asked_for_that_come_to_none_are_refused_not_read_as_no_keys(
    tmp_path: Path, keys: list[str], environ: dict[str, str], file_text: str | None, named: str
) -> None:
    """Serving without keys then would let in every caller the operator meant to keep out (fail open)."""
    keys_file = None
    if file_text is not None:
        keys_file = tmp_path / "keys.txt"
        keys_file.write_text(file_text)
    with pytest.raises(ValueError, match="no API key") as refused:
        collect_api_keys(keys, keys_file=keys_file, environ=environ)
    assert str(refused.value).startswith(named)


def test_a_keys_variable_set_empty_is_no_key_source() -> None:
    """`CANVASREAD_API_KEYS=` is how a compose file leaves a variable unset (`${KEYS:-}`)."""
    assert collect_api_keys(environ={"CANVASREAD_API_KEYS": ""}) == frozenset()


@pytest.mark.parametrize(
    ("flags", "env", "named"),
    [
        (("--api-key", ""), {}, "--api-key holds no API key"),
        ((), {"CANVASREAD_API_KEYS": " "}, "CANVASREAD_API_KEYS holds no API key"),
        (("--api-keys-file", "{keys_file}"), {}, "--api-keys-file {keys_file} holds no API key"),
    ],
    ids=["flag", "environment", "file"],
)
def test_serve_refuses_keys_asked_for_that_come_to_none_before_it_binds(
    tmp_path: Path, flags: tuple[str, ...], env: dict[str, str], named: str
) -> None:
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# no key yet\n\n")
    args = [flag.format(keys_file=keys_file) for flag in flags]
    result = canvasread("serve", *args, "--port", str(free_port()), env=env, timeout=60)
    assert_one_line_error(result, named.format(keys_file=keys_file), "leave it out to serve without keys")
    assert result.stdout == ""  # no banner: it never bound


@pytest.mark.parametrize(
    ("headers", "token"),
    [
        ([(b"authorization", b"Bearer abc")], b"abc"),
        ([(b"Authorization", b"BEARER  abc ")], b"abc"),
        ([(b"authorization", b"Bearer")], None),
        ([(b"authorization", b"Bearer ")], None),
        ([(b"authorization", b"Token abc")], None),
        ([(b"x-other", b"Bearer abc")], None),
    ],
)
def test_bearer_token_parsing(headers: list[tuple[bytes, bytes]], token: Any) -> None:
    assert bearer_token(headers) == token
