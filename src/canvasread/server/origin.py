"""Which web pages may post a form to the API: pages of this server, and origins `--cors-origin` allows.

A page on another site cannot post JSON here without a CORS preflight, which
the server refuses unless `--cors-origin` allows the page's origin; but an
HTML form sends `multipart/form-data` with no preflight, so without this
check any page a user opens could make a keyless local server do its work.
Browsers say where a request comes from: `Sec-Fetch-Site`, which the browser
sets and no page can change, and `Origin` on every form post. Clients that
are not browsers (the official SDK, curl) send neither and are let through.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from urllib.parse import urlsplit

from canvasread.errors import CrossOriginRefused

# `Sec-Fetch-Site` values of requests that a page on this server made, or that the user typed.
OWN_SITE = frozenset({"same-origin", "none"})


def check_form_origin(headers: Mapping[str, str], allowed_origins: Collection[str]) -> None:
    """Refuse (403) a form post that a browser sent from a page on another origin, unless that origin is allowed.

    With `Sec-Fetch-Site` the browser's word decides; browsers without it still
    send `Origin`, which must then name the host the request was sent to.
    """
    origin = headers.get("origin")
    if origin is not None and origin in allowed_origins:
        return
    site = headers.get("sec-fetch-site")
    if site is not None:
        own = site.strip().lower() in OWN_SITE
    else:
        own = origin is None or _origin_host(origin) == headers.get("host", "").lower()
    if not own:
        shown = (origin or site or "")[:100]
        raise CrossOriginRefused(
            f"a form posted from another site ({shown}) is refused; allow its origin with --cors-origin"
        )


def _origin_host(origin: str) -> str | None:
    """`host[:port]` of an `Origin` header, lower-cased; None for `null` (sandboxed pages, files) or nonsense."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return None
    return parts.netloc.lower() if parts.scheme in ("http", "https") and parts.netloc else None
