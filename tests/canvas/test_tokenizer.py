"""A folder's tokenizer is read once a process while its files stay as they are (`canvas.tokenizer.pretrained`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from canvasread.canvas.tokenizer import TOKENIZER_FILES, HFTokenizer, pretrained


def test_a_folders_tokenizer_is_read_once_until_one_of_its_files_changes(tiny_checkpoint: Path, tmp_path: Path) -> None:
    for name in TOKENIZER_FILES:
        if (tiny_checkpoint / name).is_file():
            shutil.copy(tiny_checkpoint / name, tmp_path / name)
    first = pretrained(str(tmp_path))
    assert pretrained(str(tmp_path)) is first
    assert HFTokenizer.load(str(tmp_path)).encode("refund") == HFTokenizer(first).encode("refund")
    config = tmp_path / "tokenizer_config.json"
    seen = config.stat()
    os.utime(config, ns=(seen.st_atime_ns, seen.st_mtime_ns + 1_000_000_000))
    again = pretrained(str(tmp_path))
    assert again is not first
    assert HFTokenizer(again).encode("refund") == HFTokenizer(first).encode("refund")
