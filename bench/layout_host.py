"""Host time to lay a pass out, grouped against flat, at the full DiffusionGemma-26B-A4B attention shape (CPU).

Usage: python3 bench/layout_host.py OUT.json

At one client a GPU pass waits on the host: `lay_out` runs before every pass,
then a grouped pass launches each layer's eager attention. This times
`lay_out` alone (median of 200, on the CPU: it builds its index tensors
there) for a lone `standard` read's pass (a ~150-token prompt row after a
cached ~300-token prefix and its ~30-token canvas row) and for 2 and 4 of
them, laid out in attention groups and, where the pass may attend flat (not
4: 720 tokens), flat.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from canvasread.canvas.engine.layout import Attention, lay_out
from canvasread.canvas.engine.rows import Row
from canvasread.canvas.engine.settings import Buckets

# DiffusionGemma-26B-A4B: 16 query heads over 8 key heads on sliding layers (window 1024), over 2 on full ones.
ATTENTION = Attention(
    {"sliding_attention": (16, 8), "full_attention": (16, 2)}, 1024, True, torch.bfloat16, torch.device("cpu")
)
PREFIX, STATE, CANVAS = 300, 150, 30


def standard_rows(requests: int) -> list[Row]:
    """Each request's prompt row (its state after the shared prefix) and canvas row (over prefix and state)."""
    rows = []
    for n in range(requests):
        written = torch.arange(PREFIX + n * STATE, PREFIX + (n + 1) * STATE)
        rows.append(Row(torch.arange(PREFIX), list(range(3, 3 + STATE)), write=written))
        past = torch.cat([torch.arange(PREFIX), written])
        rows.append(Row(past, list(range(3, 3 + CANVAS)), slot_positions=(3,), label_ids=((5, 6),)))
    return rows


def median_ms(rows: list[Row], flat: tuple[int, int] | None, bucket: int) -> float:
    times = []
    for _ in range(220):
        started = time.perf_counter()
        lay_out(rows, bucket=bucket, attention=ATTENTION, flat=flat)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[20:])


def main() -> None:
    torch.set_num_threads(1)
    buckets = Buckets()
    report: dict[str, object] = {"host": {"python": platform.python_version(), "torch": torch.__version__}}
    for requests in (1, 2, 4):
        rows = standard_rows(requests)
        tokens, past = sum(len(r.ids) for r in rows), sum(len(r.past) for r in rows)
        shape = buckets.flat_shape(tokens, past)
        bucket = buckets.pad(tokens)
        entry: dict[str, object] = {"tokens": tokens, "past_keys": past, "grouped_ms": median_ms(rows, None, bucket)}
        if shape is not None:
            entry["flat_shape"] = list(shape)
            entry["flat_ms"] = median_ms(rows, (shape[1], 0), shape[0])
        report[f"standard_{requests}"] = entry
        print(requests, json.dumps(entry), flush=True)
    Path(sys.argv[1]).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
