# vitlarge: two commands on a fresh machine. `make help` prints this block.
#   make demo          creates .venv, installs requirements.txt, builds the digits data, trains on 2 CPU processes
#   make test          the test suite (CI runs make demo, then this: 23 min on 2 cores)
#   make test-fast     the in-process tests only (tests/unit: under 2 minutes on 2 cores)
#   make typecheck     pyright on vitlarge/ and hooks/ (pyproject.toml [tool.pyright])
#   make install       the venv alone; install-trackers adds MLflow and W&B
#   make test-gpu      the GPU tier (skipped test by test without CUDA); make bench: the quick benchmarks
#   make clean-demo    removes the demo's run (WORKDIR), so that the next make demo starts over
# Variables, as make demo NPROC=4 PORT=29600 WORKDIR=runs/demo2 ARGS="train.epochs=30":
#   NPROC=2            the demo's processes
#   PORT=<a free one>  the demo's rendezvous port (two demos on one machine each take their own)
#   WORKDIR=runs/demo_digits   the demo's run folder: a rerun resumes it (another folder: another run)
#   ARGS=              more train.py arguments for the demo (dotted overrides, --data DIR)
#   STACK=cuda12       or cuda13 (below); INSTALLER=uv or pip; VENV=.venv; TEST_WORKERS=2 (make test's xdist workers)
VENV ?= .venv
PY := $(VENV)/bin/python
NPROC ?= 2
# STACK=cuda12 (default: torch 2.10, CUDA 12.8 wheel, driver >= 570) or cuda13 (newest torch, driver >= 580).
# A venv keeps the stack it was installed with: later targets default to it, and another is refused
# (two stacks in one venv would overwrite each other's torch and DALI files).
INSTALLED := $(patsubst $(VENV)/.installed-%,%,$(wildcard $(VENV)/.installed-*))
STACK ?= $(or $(INSTALLED),cuda12)
ifneq ($(INSTALLED),)
ifneq ($(INSTALLED),$(STACK))
$(error $(VENV) holds the $(INSTALLED) stack, not STACK=$(STACK); to change it: rm -rf $(VENV) && make install STACK=$(STACK))
endif
endif
STACK_FILE := $(if $(filter cuda13,$(STACK)),requirements/cuda13.txt,$(if $(filter cuda12,$(STACK)),requirements.txt,$(error STACK=$(STACK): use cuda12 or cuda13)))

# The installer: uv (pinned) in the venv, which downloads in parallel and links from its cache (a fresh install:
# about 1 minute instead of pip's 5). Where uv cannot be installed or cannot install a file (uv reads no pip
# settings: a mirror-only machine's find-links or index), pip installs it, after one line saying so;
# INSTALLER=pip uses pip only. Both read the same requirements files and resolve the same pins, and both compile
# bytecode at install (uv only when asked): an import that compiled a module would turn its source's warnings
# (Colossal-AI's invalid escape sequences) into errors under the tests' -W error::DeprecationWarning, and a
# read-only shared venv would compile on every start.
UV_VERSION := 0.13.9
INSTALLER ?= uv
UV := $(VENV)/bin/uv
PIP = $(PY) -m pip install --progress-bar on
define pip_install
$(if $(filter uv,$(INSTALLER)),$(UV) pip install --compile-bytecode --python $(PY) $(1) || { echo "make install: uv could not install $(1); pip installs it (INSTALLER=pip skips uv)"; $(PIP) $(1); },$(PIP) $(1))
endef

.PHONY: help demo test test-fast test-gpu typecheck install install-trackers bench clean-demo

# Colossal-AI's runner exports the whole environment inside an unquoted bash -c, where make's MAKEOVERRIDES
# (${-*-command-variables-*-}, set by any VAR=value on make's command line) is a "bad substitution".
unexport MAKEOVERRIDES

help:
	@sed -n '/^[^#]/q; s/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST))

install: $(VENV)/.installed-$(STACK)

# Two steps: the stack, then Colossal-AI without its declared torch<=2.5.1 cap (requirements/colossalai.txt).
$(VENV)/.installed-$(STACK): $(STACK_FILE) requirements/common.txt requirements/colossalai.txt
	test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing $(STACK_FILE) into $(VENV) with $(INSTALLER) (about 1 minute with uv, 5 with pip; 8.5 GB: torch's CUDA wheel, DALI)"
	$(if $(filter uv,$(INSTALLER)),$(UV) --version 2>/dev/null | grep -q "^uv $(UV_VERSION)" || $(PY) -m pip install -q uv==$(UV_VERSION) || true)
	$(call pip_install,-r $(STACK_FILE))
	$(call pip_install,--no-deps -r requirements/colossalai.txt)
	touch $@

# MLflow and W&B (log.mlflow, log.wandb): optional for a run, installed for the tests.
install-trackers: $(VENV)/.trackers-installed

$(VENV)/.trackers-installed: requirements/trackers.txt | $(VENV)/.installed-$(STACK)
	$(call pip_install,-r requirements/trackers.txt)
	touch $@

data/digits/dataset.json: | $(VENV)/.installed-$(STACK)
	$(PY) -m data_tools.make_demo_dataset data/digits

# colossalai run starts torchrun by name, so the venv's bin goes first on PATH. One OpenMP thread
# per process (NPROC processes share the cores), said explicitly: torchrun's banner about it goes.
# The rendezvous port: PORT, else one the system reports free (a fixed 29500 collides with a second demo).
WORKDIR ?= runs/demo_digits
PORT ?= $(shell $(PY) -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
demo: install data/digits/dataset.json
	PATH="$(abspath $(VENV))/bin:$$PATH" OMP_NUM_THREADS=1 colossalai run --nproc_per_node $(NPROC) --master_port $(PORT) \
		train.py --config recipes/demo_digits.py --workdir $(WORKDIR) $(ARGS)
	$(PY) -m scripts.summarize $(WORKDIR)

# pytest-xdist: TEST_WORKERS processes take whole test files (tests/conftest.py), while the Slurm files, which share
# the one test cluster and change its shape between them, run in a pytest process of their own, in this order
# (scripts/test_suite.sh); TEST_WORKERS=0 runs everything in one.
TEST_WORKERS ?= 2
SERIAL_TESTS := tests/e2e/test_slurm.py tests/e2e/test_slurm_multinode.py tests/e2e/test_slurm_scripts.py
test: install install-trackers
	bash scripts/test_suite.sh $(PY) $(TEST_WORKERS) tests $(SERIAL_TESTS)

test-fast: install install-trackers
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile tests/unit

# pyright on vitlarge/ and hooks/ at pyproject.toml's level (what tests/e2e/test_types.py asserts: no error),
# imports resolved in the venv (the trackers too: hooks/ imports MLflow and W&B); about 20 s on 2 cores. No query to
# PyPI for a newer pyright.
typecheck: install install-trackers
	PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $(VENV)/bin/pyright --pythonpath $(PY)

# the GPU tier (tests/gpu): skipped test by test, with the reason, where CUDA is absent; on a bare CUDA machine
# without this venv: scripts/gpu_tier.sh (docs/GPU.md)
test-gpu: install
	$(PY) -m pytest tests/gpu -rA

bench: install
	$(PY) -m benchmarks.run --quick

clean-demo:
	rm -rf $(WORKDIR)
