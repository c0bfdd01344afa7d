# Everything installs into .venv; nothing outside the project is touched except, for the
# browser test, Debian's chromium package (installed only when missing).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint format bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: the pinned release is the CPU wheel on these machines.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,train,tokenizers]'
	# interop extras (verifiers, NeMo Gym) go here
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/callgrove rows examples/login_bug.jsonl

lint: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

format: setup
	$(BIN)/ruff check --fix src tests benchmarks examples
	$(BIN)/ruff format src tests benchmarks examples

# The browser test of the HTML pictures drives Debian's chromium, installed when missing.
test: lint
	test -x /usr/bin/chromium || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)
	$(BIN)/pytest -n 2 tests

bench: setup
	for b in benchmarks/*_bench.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
