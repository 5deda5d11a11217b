# `make test` sets up everything itself: a .venv, an editable install with the dev extra,
# then a lint + format check over every module, then the whole pytest suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint format install demo bench-gdn gpu-check-smoke clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check mtpspec experiments tests
	$(BIN)/ruff format --check mtpspec experiments tests

format: $(STAMP)
	$(BIN)/ruff check --fix mtpspec experiments tests
	$(BIN)/ruff format mtpspec experiments tests

test: lint
	$(BIN)/python -m pytest -n 2 -q tests

demo: $(STAMP)
	$(BIN)/python -m experiments.generate --demo

bench-gdn: $(STAMP)
	$(BIN)/python -m experiments.bench_gdn

# The prepared GPU check (issue 8) on CPU: interpret mode, tiny shapes, < 1 minute.
gpu-check-smoke: $(STAMP)
	PYTHON=$(BIN)/python experiments/gpu_check.sh --cpu_smoke

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
