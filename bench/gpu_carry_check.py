"""Check what a GPU call carries before the device time is spent: the wheels install and import there.

Usage: python3 bench/gpu_carry_check.py .whl .cache/gpu     (bench/gpu_carry.sh runs it last)

The device machine (CPython 3.12 on x86-64 Linux, no registry) installs the carried wheels with
`pip install --no-index --no-deps`, so nothing tells it a requirement is missing until an import fails. This
checks, for every carried wheel, each requirement that applies there (markers evaluated for that machine, the
extras a requirement names followed, as `pyjwt[crypto]`): another carried wheel meets it (name and version), or
the device image has that package (`DEVICE_PACKAGES`, the image's list; its version where it is known). It also
refuses two versions of one package (pip would stop the whole install) and a carry past `--limit-mib`.
Exit status 1 with the problems listed; otherwise one line of sizes.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

# The device image's Python packages ('cuda', as read on 2026-11-17), with the versions one session's
# `pip list` there showed; None where only the name is known.
KNOWN_VERSIONS = {
    "accelerate": "1.15.0",
    "huggingface-hub": "1.33.0",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "sentencepiece": "0.2.2",
    "tokenizers": "0.23.2",
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "triton": "3.6.0",
}
DEVICE_NAMES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
DEVICE_PACKAGES: dict[str, str | None] = {canonicalize_name(n): None for n in DEVICE_NAMES.split()} | {
    canonicalize_name(n): v for n, v in KNOWN_VERSIONS.items()
}
# The device machine, as packaging's markers see it.
ENVIRONMENT = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}


def metadata(wheel: Path) -> tuple[str, Version, list[Requirement]]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        fields = Parser().parsestr(archive.read(name).decode())
    requires = [Requirement(line) for line in fields.get_all("Requires-Dist") or []]
    return canonicalize_name(fields["Name"]), Version(fields["Version"]), requires


def applies(requirement: Requirement, extra: str) -> bool:
    return requirement.marker is None or requirement.marker.evaluate({**ENVIRONMENT, "extra": extra})


def problems(wheels: list[Path]) -> list[str]:
    found: list[str] = []
    carried: dict[str, tuple[Version, list[Requirement]]] = {}
    for wheel in wheels:
        name, version, requires = metadata(wheel)
        if name in carried:
            found.append(f"two versions of {name}: {carried[name][0]} and {version}")
        carried[name] = (version, requires)
    # (package, extra) pairs still to check; an extra named by a requirement brings that extra's requirements.
    todo = [(name, "") for name in carried]
    seen = set(todo)
    while todo:
        name, extra = todo.pop()
        for requirement in carried[name][1]:
            if not applies(requirement, extra):
                continue
            needed = canonicalize_name(requirement.name)
            where = f"{name}{f'[{extra}]' if extra else ''} needs {requirement}"
            if needed in carried:
                if not requirement.specifier.contains(carried[needed][0], prereleases=True):
                    found.append(f"{where}, carried {carried[needed][0]}")
                for wanted in requirement.extras:
                    if (needed, wanted) not in seen:
                        seen.add((needed, wanted))
                        todo.append((needed, wanted))
            elif needed in DEVICE_PACKAGES:
                there = DEVICE_PACKAGES[needed]
                if there is not None and not requirement.specifier.contains(there, prereleases=True):
                    found.append(f"{where}, the device has {there}: carry it")
                elif requirement.extras:
                    found.append(f"{where}: check its extras' requirements by hand")
            else:
                found.append(f"{where}: neither carried nor on the device")
    return found


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("wheels", type=Path)
    parser.add_argument("others", type=Path, nargs="*", help="other carried folders, counted in the size")
    parser.add_argument("--limit-mib", type=float, default=45.0)
    args = parser.parse_args()
    wheels = sorted(args.wheels.glob("*.whl"))
    found = problems(wheels) if wheels else [f"no wheels in {args.wheels}"]
    mib = {str(p): size(p) / 2**20 for p in [args.wheels, *args.others]}
    total = sum(mib.values())
    if total > args.limit_mib:
        found.append(f"carried {total:.1f} MiB, over the {args.limit_mib:g} MiB limit")
    for problem in found:
        print("problem:", problem, file=sys.stderr)
    sizes = ", ".join(f"{path} {value:.1f} MiB" for path, value in mib.items())
    print(f"{len(wheels)} wheels; {sizes}; {total:.1f} MiB in all; {len(found)} problems")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
