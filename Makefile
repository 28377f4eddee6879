# enginegate: `make serve` serves the embedded default; `make test` runs everything CI runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# llama-cpp-python builds from source: a portable CPU build, both cores, cached by pip afterwards.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

# Real engines for the adapter tests, kept between runs: vLLM in its own venv, llama-server in the cache.
VLLM_VENV ?= .venv-vllm
export ENGINEGATE_VLLM_PYTHON ?= $(abspath $(VLLM_VENV))/bin/python
export ENGINEGATE_LLAMA_SERVER ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/enginegate/llama-server-0.3.36/build/bin/llama-server

.PHONY: serve test lint typecheck docs unit engines services compiled clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.serve-deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --editable .
	touch $@

# xds-protos (the epp extra) ships an older copy of OpenTelemetry's generated protos under the same
# module names as opentelemetry-proto (the otel extra); whichever pip installs last wins, and the old
# copy breaks the OTLP exporter's import. OpenTelemetry's own is put back last (Envoy's protos work with it).
OTEL_PROTO_LAST = $(BIN)/pip install --quiet --force-reinstall --no-deps "$$($(BIN)/pip freeze | grep -i '^opentelemetry-proto==')"

# The fast loop's dependencies: no engine builds.
$(VENV)/.test-deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --editable ".[test,sim]"
	$(OTEL_PROTO_LAST)
	touch $@ $(VENV)/.serve-deps

# llama-cpp-python builds from source (about 10 minutes on two cores the first time, then pip's cache).
$(VENV)/.engine-deps: pyproject.toml $(VENV)/.test-deps
	$(BIN)/pip install --quiet --editable ".[test,llama,sim]"
	$(OTEL_PROTO_LAST)
	touch $@

serve: $(VENV)/.serve-deps
	$(BIN)/enginegate serve

lint: $(VENV)/.test-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.test-deps
	$(BIN)/mypy

# The documentation site, built strictly (mkdocs.yml: a broken link or anchor, or a page left out of the
# navigation, fails) into a temporary directory; the configuration reference is generated from the schema.
# Not --quiet: it hides the warnings from the strict count too, and a broken link would pass.
docs: $(VENV)/.test-deps
	site=$$(mktemp -d) && $(BIN)/mkdocs build --strict --site-dir $$site; rc=$$?; rm -rf $$site; exit $$rc

engines: $(VENV)/.engine-deps
	command -v promtool >/dev/null || (apt-get update -qq && apt-get install -y -qq prometheus >/dev/null)
	bash tools/install_vllm.sh $(VLLM_VENV)
	CMAKE=$(abspath $(BIN))/cmake bash tools/build_llama_server.sh >/dev/null

# redis-server and PostgreSQL for the tenancy tests (tests/tenancy starts its own on free ports in
# temporary directories, and stops them), haproxy for tests/deploy's check of the compose balancer, and
# Chromium with its driver for tests/console (headless, driven by selenium; never a downloaded browser);
# Debian's packages, through apt-get, when missing.
services:
	command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null)
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null)
	command -v haproxy >/dev/null || (apt-get update -qq && apt-get install -y -qq haproxy >/dev/null)
	(command -v chromium && command -v chromedriver) >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null)

# The fast loop: every test that needs no engine build (contract fakes, in-process CTranslate2,
# the gateway as a real process), in a few minutes.
unit: $(VENV)/.test-deps services
	$(BIN)/pytest -m "not engines"

# The request path compiled by mypyc as the image builds it (setup.py), in a copy of the tree: a compiled
# module beside its source would win the import over every later edit (tools/compiled_tree.py).
compiled: $(VENV)/.test-deps
	$(BIN)/python tools/compiled_tree.py build/compiled

# Everything CI runs: lint, types, the docs, then every test, real engines included; then the tests
# that need no engine build once more, against the compiled copy (what the image runs).
COMPILED_TESTS = tests/unit tests/contract tests/e2e
test: lint typecheck docs engines services compiled
	$(BIN)/pytest
	cd build/compiled && $(abspath $(BIN))/pytest -p no:cacheprovider -m "not engines" $(COMPILED_TESTS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .mypy_cache .ruff_cache .pytest_cache build/compiled
