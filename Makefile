# enginegate: `make serve` serves the embedded default; `make test` runs everything CI runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# llama-cpp-python builds from source: a portable CPU build, both cores, cached by pip afterwards.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: serve test lint typecheck unit clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.serve-deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --editable .
	touch $@

$(VENV)/.test-deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --editable ".[test,llama]"
	touch $@ $(VENV)/.serve-deps

serve: $(VENV)/.serve-deps
	$(BIN)/enginegate serve

lint: $(VENV)/.test-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.test-deps
	$(BIN)/mypy

unit: $(VENV)/.test-deps
	$(BIN)/pytest

test: lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
