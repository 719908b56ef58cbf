"""Where a lone request's time goes: its HTTP round trip split into the server's stages, one request at a time.

Usage: python3 bench/request_timeline.py MODEL OUT.json [--workload standard] [--requests 60]
           [--engine-process | --no-engine-process] [--random-weights STD]

Serves MODEL (a checkpoint folder) in this process, as `canvasread serve`
builds it, on a loopback port, and sends the workload's requests one after
another with httpx (the first tenth are a warm-up, not counted). For each
request it times, by wrapping the methods:

- `http`: the client's round trip;
- `prepare`: planning and tokenising (`CanvasBackend.prepare`);
- `decide`: the backend's call for the batch (`CanvasBackend.decide`);
- `read`: the reader's calls inside it (`InProcessReader.read`, or
  `EngineClient.read` over the engine process's pipe);
- `pass`: the engine's passes, from its counters on `/metrics`.

Their differences are the rest: `http - prepare - decide` the front end
(HTTP, validation, the queue, the response), `decide - read` the readout,
`read - pass` the engine loop and the pipe. Reports the median of each and
the medians of the differences. On a GPU, this says how much of a lone
request's latency is not the pass.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from http_sweep import engine_work

from canvasread.canvas.backend import CanvasBackend
from canvasread.canvas.engine.client import EngineClient
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.catalog import open_decider
from canvasread.server.app import create_app
from canvasread.tools.workloads import WORKLOADS

PORT = 8097
SPENT: defaultdict[str, float] = defaultdict(float)


def timed(owner: type, name: str, stage: str) -> None:
    """Replace `owner.name` with a wrapper that adds its wall time to SPENT[stage]."""
    method: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            SPENT[stage] += (time.perf_counter() - began) * 1000.0

    setattr(owner, name, wrapper)


def serve(model: str, engine: EngineSettings) -> uvicorn.Server:
    server = uvicorn.Server(
        uvicorn.Config(create_app(open_decider((model,), engine=engine)), port=PORT, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 600
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not start within 600 s")
        time.sleep(0.05)
    return server


def one_request(client: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, float]:
    """One request's stages (ms)."""
    SPENT.clear()
    before = engine_work(url)
    began = time.perf_counter()
    response = client.post("/v1/systemone", json=body)
    http = (time.perf_counter() - began) * 1000.0
    response.raise_for_status()
    after = engine_work(url)
    stages = {"http": http, **{stage: SPENT[stage] for stage in ("prepare", "decide", "read")}}
    stages["pass"] = 1000.0 * (after["pass_seconds"] - before["pass_seconds"])
    stages["passes"] = after["passes"] - before["passes"]
    stages["front_end"] = http - stages["prepare"] - stages["decide"]
    stages["readout"] = stages["decide"] - stages["read"]
    stages["loop"] = stages["read"] - stages["pass"]
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--workload", default="standard", choices=sorted(WORKLOADS))
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--random-weights", type=float, default=None)
    args = parser.parse_args()
    for owner, name, stage in (
        (CanvasBackend, "prepare", "prepare"),
        (CanvasBackend, "decide", "decide"),
        (InProcessReader, "read", "read"),
        (EngineClient, "read", "read"),
    ):
        timed(owner, name, stage)
    engine = EngineSettings(process=args.engine_process, random_init_std=args.random_weights)
    server = serve(args.model, engine)
    url = f"http://127.0.0.1:{PORT}"
    rows = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for sequence in range(args.requests):
            row = one_request(client, url, WORKLOADS[args.workload](sequence, "jev-latest"))
            if sequence >= args.requests // 10:
                rows.append(row)
    server.should_exit = True
    medians = {stage: round(statistics.median(row[stage] for row in rows), 2) for stage in rows[0]}
    result = {"model": args.model, "workload": args.workload, "engine_process": args.engine_process}
    result.update(requests=len(rows), median_ms=medians)
    print(json.dumps(result), flush=True)
    args.out.write_text(json.dumps({**result, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
