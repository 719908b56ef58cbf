# `make test` is the README's test command: it installs what the suite needs, then runs all of it.
PYTHON ?= python3
# The CPU wheel of torch that these machines carry; an unpinned torch pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: install install-test lint test ci

install:
	$(PYTHON) -m pip install .

install-test:
	$(PYTHON) -m pip install --quiet "$(TORCH)" -e ".[diffusion,test]"

lint:
	$(PYTHON) -m ruff check src tests bench
	$(PYTHON) -m ruff format --check src tests bench
	$(PYTHON) -m mypy

test: install-test
	$(PYTHON) -m pytest

ci: install-test lint test
