# `make test` is the README's test command: it installs what the suite needs, then runs all of it.
PYTHON ?= python3
# The CPU wheel of torch that these machines carry; an unpinned torch pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: install install-test install-browser lint test ci

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

test: install-test install-browser
	$(PYTHON) -m pytest

ci: install-test lint test
