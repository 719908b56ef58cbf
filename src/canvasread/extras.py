"""The optional dependencies a model path needs, checked before anything is loaded, against pyproject's floors.

`transformers` 5.24 is the release the engine is built and tested against:
its DiffusionGemma takes the KV cache as `cache=`, which older releases do
not, so an older one would fail inside a load or a read; it is refused at
start-up instead, with the install line. `pyproject.toml`'s extras declare the same floor (a test holds them equal).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

from canvasread.errors import MissingExtra

# The first transformers release with DiffusionGemma's `cache=` API; pyproject's `diffusion` and `upstream` extras.
TRANSFORMERS_FLOOR = (5, 24)


def installed_version(package: str) -> str | None:
    """The installed distribution's version (None: not installed)."""
    if importlib.util.find_spec(package) is None:
        return None
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def require(packages: tuple[str, ...], what: str, extra: str) -> None:
    """Refuse `what` unless every package is installed and transformers is at least its floor (`MissingExtra`)."""
    install = f"pip install 'canvasread[{extra}]'"
    missing = [name for name in packages if installed_version(name) is None]
    if missing:
        raise MissingExtra(f"{what} needs {' and '.join(missing)}: {install}")
    version = installed_version("transformers") if "transformers" in packages else None
    if version is not None and _release(version) < TRANSFORMERS_FLOOR:
        floor = ".".join(map(str, TRANSFORMERS_FLOOR))
        raise MissingExtra(f"{what} needs transformers >= {floor} (its cache= API), not {version}: {install}")


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: `5.24.0.dev0` is (5, 24, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])
