# Mycelia developer commands. `make serve` and `make test` bootstrap .venv on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
RUNSTAMP := $(VENV)/.installed
DATA   ?= ./mycelia-data
HOST   ?= 127.0.0.1
PORT   ?= 9797
# The hot path setup.py compiles with mypyc (pyproject.toml, [tool.mycelia] compiled): an
# edit to one of them rebuilds the venv's build, as a stale one would run pure Python.
COMPILED := $(shell $(PYTHON) -c 'import tomllib; print(*("src/" + m.replace(".", "/") + ".py" for m in tomllib.load(open("pyproject.toml", "rb"))["tool"]["mycelia"]["compiled"]))')
# Install in two steps: the dependencies and build tools first, as pure Python, then the
# package built against them (`--no-build-isolation`: mypyc type-checks the hot path
# against the installed dependencies), compiled where the machine has a C compiler.
BUILD  := $(BIN)/python -m pip install --quiet --no-build-isolation --no-deps -e .

.PHONY: venv serve test check bench soak format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUNSTAMP): pyproject.toml setup.py $(COMPILED) | $(BIN)/python
	MYCELIA_PURE_PYTHON=1 $(BIN)/python -m pip install --quiet -e . 'setuptools>=68' wheel 'mypy>=1.10'
	$(BUILD)
	touch $@

$(STAMP): pyproject.toml setup.py $(COMPILED) | $(BIN)/python
	MYCELIA_PURE_PYTHON=1 $(BIN)/python -m pip install --quiet -e '.[dev]' 'setuptools>=68' wheel
	$(BUILD)
	touch $@ $(RUNSTAMP)

## venv: create .venv with the package and its dev extras, the hot path compiled with mypyc where it can be
venv: $(STAMP)

## serve: start a durable node on LMDB in ./mycelia-data (override DATA=, HOST=, PORT=)
serve: $(RUNSTAMP)
	$(BIN)/mycelia serve --data $(DATA) --host $(HOST) --port $(PORT)

## test: run the whole default suite on the compiled hot path, then on pure Python
## (soaks are behind the `slow` marker: `make soak`)
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q
	MYCELIA_PURE_PYTHON=1 $(BIN)/python -m pytest -m "not slow" -q

## soak: the long property runs and soaks (hypothesis `ci` profile)
soak: $(STAMP)
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -m slow -q

## check: formatting, lint, types, layer contracts
check: $(STAMP)
	$(BIN)/ruff format --check src tests benches setup.py
	$(BIN)/ruff check src tests benches setup.py
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format src tests benches setup.py
	$(BIN)/ruff check --fix src tests benches setup.py

## bench: every benchmark in benches/, printed as tables
bench: $(STAMP)
	$(BIN)/python -m benches

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info
	find src -name '*.so' -delete; rm -f src/mycelia/compiled.json
