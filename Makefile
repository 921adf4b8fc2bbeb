# Two commands for a new user: `make reproduce` (all notebooks and figures) and `make test`.
# Each creates or reuses the project virtual environment .venv on its own.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A GPU means nvidia-smi lists one: then pip takes the CUDA build of torch; otherwise the CPU
# wheel torch==2.13.0 (with its triton 3.7.1), never a multi-GB CUDA download.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
# The CPU build comes from PyTorch's CPU index: plain PyPI serves the CUDA build even for
# torch==2.13.0. Its triton (for the interpreter) comes from PyPI. Short timeout and few retries: where
# that index is unreachable, pip falls back to wheels it finds locally (--find-links) quickly.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# CONSTRAINTS=constraints/h200-2026-11.txt (GPU machine): exactly the torch and triton that produced
# the recorded results (pip -c), with TORCH_GPU_INDEX=https://download.pytorch.org/whl/cu130 for
# their CUDA 13.0 build. Empty: pip's choice.
CONSTRAINTS ?=
TORCH_GPU_INDEX ?=
PIP_CONSTRAINTS := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
ifeq ($(HAS_GPU),1)
INSTALL_TORCH = $(PY) -m pip install -q $(if $(TORCH_GPU_INDEX),--index-url $(TORCH_GPU_INDEX)) $(PIP_CONSTRAINTS) torch triton
else
INSTALL_TORCH = $(PY) -m pip install -q --timeout 15 --retries 2 --index-url $(TORCH_CPU_INDEX) torch==2.13.0 && $(PY) -m pip install -q triton==3.7.1
endif
# The GPU machine's Triton (the H200 machine has triton 3.6.0, docs/results.md), installed beside
# the venv's own by make test-gpu-triton, which compiles every kernel with it too (tests marked
# gpu_triton): a kernel that only the CPU wheel's Triton can build fails there, not on the GPU. Not
# part of make test: it doubles the sm_90 compiles (~500 CPU-s of a 2-core CI run).
GPU_TRITON_VERSION ?= 3.6.0
# The committed figures are byte for byte what this matplotlib release draws: with another one,
# `make reproduce` would rewrite every figure.
MATPLOTLIB_VERSION ?= 3.11.2
# The derived tables and figures also depend on numpy's and pandas' arithmetic and formatting.
NUMPY_VERSION ?= 2.4.6
PANDAS_VERSION ?= 3.1.1
# The library's extras the venv gets (the library itself needs only torch and triton), and the lab's
# (lab/pyproject.toml: swiglu-lab, the benchmark harness and the notebooks; not in the swiglu wheel).
EXTRAS ?= dev,hf
LAB_EXTRAS ?= notebooks
# The interpreter PYTHON names, as the venv's own Python reports itself (PYTHON=python3.12 after a
# 3.11 venv: the venv is recreated, not kept with its old interpreter).
PYTHON_VERSION_CODE := import platform as p; print(p.python_implementation(), p.python_version())
PYTHON_VERSION := $(shell $(PYTHON) -c '$(PYTHON_VERSION_CODE)' 2>/dev/null)
# Everything the install depends on besides pyproject.toml and the constraints file: a change of any
# of these re-installs (the settings file is rewritten only when its content changes).
INSTALL_SETTINGS := $(PYTHON_VERSION) | $(INSTALL_TORCH) | $(PIP_CONSTRAINTS) | $(EXTRAS) | $(LAB_EXTRAS) | matplotlib==$(MATPLOTLIB_VERSION) | numpy==$(NUMPY_VERSION) | pandas==$(PANDAS_VERSION)
SETTINGS_FILE := $(VENV)/.install-settings
GPU_TRITON_DIR := $(VENV)/triton-$(GPU_TRITON_VERSION)
NOTEBOOK_ARGS ?=
BENCH_ARGS ?=
# Jupyter refuses to start as root (containers, cloud shells) unless told --allow-root: added
# whatever LAB_ARGS holds.
LAB_ARGS ?=
LAB_ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)
# Saving from the Lab writes the committed form of a notebook (no outputs, no volatile metadata).
LAB_SAVE_HOOK := swiglu_lab.research.notebook_save.strip_for_git
TP ?= 2
# pytest workers of make test and test-fast (pytest-xdist, work stealing: an idle worker takes the
# tests still queued on the other): 2 for the 2-core CI machine, where the suite takes ~10 min with two
# on an AVX2-only CPU (1200 CPU-seconds).
PYTEST_WORKERS ?= 2

.PHONY: help venv test test-fast test-gpu test-gpu-triton reproduce lab bench bench-tp clean FORCE

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(SETTINGS_FILE): FORCE
	@mkdir -p $(VENV) && if [ "$$(cat $@ 2>/dev/null)" != '$(INSTALL_SETTINGS)' ]; then echo '$(INSTALL_SETTINGS)' > $@; fi

# A venv missing or of another interpreter is made afresh (--clear: over an existing venv, venv
# keeps its python), and the settings file it held is written again.
$(STAMP): pyproject.toml lab/pyproject.toml $(CONSTRAINTS) $(SETTINGS_FILE)
	@if [ "$$($(PY) -c '$(PYTHON_VERSION_CODE)' 2>/dev/null)" != '$(PYTHON_VERSION)' ]; then \
	  echo "$(PYTHON) -m venv --clear $(VENV)  # a new venv of $(PYTHON_VERSION)"; \
	  $(PYTHON) -m venv --clear $(VENV) && echo '$(INSTALL_SETTINGS)' > $(SETTINGS_FILE); \
	else echo "$(PYTHON) -m venv $(VENV)"; $(PYTHON) -m venv $(VENV); fi
	$(INSTALL_TORCH)
	$(PY) -m pip install -q $(PIP_CONSTRAINTS) -e '.[$(EXTRAS)]' -e './lab[$(LAB_EXTRAS)]' matplotlib==$(MATPLOTLIB_VERSION) numpy==$(NUMPY_VERSION) pandas==$(PANDAS_VERSION)
	touch $(STAMP)

venv: $(STAMP)  ## create or update the virtual environment .venv

$(GPU_TRITON_DIR)/.installed: | $(STAMP)
	$(PY) -m pip install -q --no-deps --target $(GPU_TRITON_DIR) triton==$(GPU_TRITON_VERSION)
	touch $@

test: $(STAMP)  ## lint (ruff) and run the test suite (CPU; GPU tests skip without a GPU)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

test-gpu-triton: $(STAMP) $(GPU_TRITON_DIR)/.installed  ## before a GPU session: compile every kernel for sm_90 with the GPU machine's Triton too (CPU)
	SWIGLU_EXTRA_TRITON_DIR=$(GPU_TRITON_DIR) $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m gpu_triton

test-fast: $(STAMP)  ## the developer's lane: lint and the tests not marked slow (about 5 minutes on 2 cores)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not slow"

test-gpu: $(STAMP)  ## run only the full-size GPU tests (fails without a CUDA GPU)
	@$(PY) -c 'import torch; raise SystemExit(0 if torch.cuda.is_available() else 1)' || \
	  { echo "make test-gpu: no CUDA GPU found (torch.cuda.is_available() is False); the gpu tests need one" >&2; exit 1; }
	SWIGLU_FAILURES_AT_ONCE=1 $(PY) -m pytest -q -m gpu

reproduce: $(STAMP)  ## execute every notebook with papermill and regenerate figures/ and data/
	$(PY) -m swiglu_lab.research.reproduce $(NOTEBOOK_ARGS)

bench: $(STAMP)  ## benchmark every implementation on the GPU (BENCH_ARGS="--quick ...")
	$(PY) -m swiglu_lab.bench $(BENCH_ARGS)

bench-tp: $(STAMP)  ## tensor-parallel checks and timings on TP GPUs (torchrun; TP=2, BENCH_ARGS="--parts ...")
	@$(PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.device_count() >= $(TP) else 1)' || \
	  { echo "make bench-tp: TP=$(TP) needs $(TP) CUDA GPUs, torch sees $$($(PY) -c 'import torch; print(torch.cuda.device_count())')" >&2; exit 1; }
	$(PY) -m torch.distributed.run --nproc-per-node $(TP) -m swiglu_lab.bench --tp $(TP) $(BENCH_ARGS)

# The Lab serves the whole clone (README, docs, figures and data beside the notebooks) and opens in notebooks/.
lab: $(STAMP)  ## open the notebooks in JupyterLab, saving them without outputs (LAB_ARGS="..."; --allow-root when run as root)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/notebooks --ContentsManager.pre_save_hook=$(LAB_SAVE_HOOK) $(LAB_ROOT_ARGS) $(LAB_ARGS)

clean:  ## remove the virtual environment, build outputs, caches and Jupyter checkpoints
	rm -rf $(VENV) build .pytest_cache .ruff_cache src/*.egg-info lab/*.egg-info
	find . \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +
