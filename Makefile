# `make test` is the README's test command: it installs what the suite needs, then runs all of it.
PYTHON ?= python3
# The CPU wheel of torch that these machines carry; an unpinned torch pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: install install-test install-browser lint test ci fuzz soak

install:
	$(PYTHON) -m pip install .

install-test:
	$(PYTHON) -m pip install --quiet "$(TORCH)" -e ".[diffusion,test]"

# Debian's chromium for the playground's browser tests (Playwright drives it); a no-op once installed.
install-browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

lint:
	$(PYTHON) -m ruff check src tests bench
	$(PYTHON) -m ruff format --check src tests bench
	$(PYTHON) -m mypy

# Three worker processes on two cores: much of the suite waits on servers and subprocesses it starts, and beside
# other busy processes three workers get a larger part of the cores (2 cores with two busy loops beside: 16 min 22 s
# in two workers, 13 min 46 s in three; unloaded, 14 min 40 s in one process and 10 min 7 s in two).
test: install-test install-browser
	$(PYTHON) -m pytest -n 3

ci: install-test lint test

# Thousands of schemathesis cases against the live server (CI runs a few hundred inside `make test`).
fuzz: install-test
	CANVASREAD_FUZZ_EXAMPLES=2000 $(PYTHON) -m pytest tests/test_fuzz.py --timeout 3600

# Ten minutes past saturation on the embedded model: only 200/529, nothing lost, memory flat (CI runs 30 s).
soak: install-test
	$(PYTHON) bench/soak.py --duration 600 --output bench/results/soak.json
