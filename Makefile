# Mycelia developer commands. `make serve` and `make test` bootstrap .venv on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
RUNSTAMP := $(VENV)/.installed
DATA   ?= ./mycelia-data
HOST   ?= 127.0.0.1
PORT   ?= 9797

.PHONY: venv serve test check bench soak format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUNSTAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(RUNSTAMP)

## venv: create .venv with the package and its dev extras
venv: $(STAMP)

## serve: start a durable node on LMDB in ./mycelia-data (override DATA=, HOST=, PORT=)
serve: $(RUNSTAMP)
	$(BIN)/mycelia serve --data $(DATA) --host $(HOST) --port $(PORT)

## test: run the whole default suite (soaks are behind the `slow` marker: `make soak`)
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q

## soak: the long property runs and soaks (hypothesis `ci` profile)
soak: $(STAMP)
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -m slow -q

## check: formatting, lint, types, layer contracts
check: $(STAMP)
	$(BIN)/ruff format --check src tests benches
	$(BIN)/ruff check src tests benches
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format src tests benches
	$(BIN)/ruff check --fix src tests benches

## bench: every benchmark in benches/, printed as tables
bench: $(STAMP)
	$(BIN)/python -m benches

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info
