SHELL := /bin/bash
# Two set-up commands that work on a fresh machine (see README):
#   make demo   -- the main job: 8 local gloo ranks train an MLP stack 3D-parallel on grid 2x2x2x1
#   make test   -- the test suite
#   make test-fast -- the quick loop while editing: the tests not marked slow (199 s for 633 tests here; the goal is 2 minutes)
#   make lock   -- recompile requirements.lock (every package .venv holds, exact versions and hashes) from setup.py's
#                  ranges and requirements.in, with uv; make install / CI install exactly the lock
#   make test-latest -- a separate venv (.venv-latest) from the newest versions setup.py's ranges allow, the fast tests
#   make calibrate / make validate -- measure this host on $(RANKS) gloo ranks for the performance model (runs/)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
LOCK    = requirements.lock
# the extras .venv holds (setup.py), and the uv flags that compile them with requirements.in into the lock
EXTRAS  = mpi test plot hf metrics bench data realmodel peft lightning
COMPILE = --python-version 3.11 --generate-hashes --custom-compile-command "make lock" \
          --override requirements-overrides.txt $(addprefix --extra ,$(EXTRAS)) setup.py requirements.in
# where uv finds torch's CPU wheel (its +cpu build is not on PyPI): the wheel folder pip is configured with, when the
# machine has one (PIP_FIND_LINKS or pip's global.find-links), else PyTorch's CPU index
WHEELS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
TORCH_SOURCE ?= $(if $(WHEELS),--find-links $(WHEELS),--extra-index-url https://download.pytorch.org/whl/cpu)
# uv bootstraps each venv: pip installs the lock's uv, its hashes checked (its lines of the lock, up to "# via")
UV_LOCKED = <(sed -n '/^uv==/,/^ *\# via/p' $(LOCK))
LATEST ?= .venv-latest
RANKS  ?= 4
# the problem `make validate` times and predicts (perfmodel's problem arguments; --gpus is $(RANKS))
PROBLEM ?= --model gpt-tiny --machine local-4 --batch 8 --dtype fp32

# a venv: $(call new_venv,VENV) makes it and installs the lock's uv into it (pip, hashes checked);
# $(call sync_venv,VENV,LOCKFILE) makes it hold exactly LOCKFILE (uv, hashes required) plus axgrid, editable
new_venv = $(PYTHON) -m venv $(1) && \
	$(1)/bin/pip install -q --disable-pip-version-check --no-deps --require-hashes -r $(UV_LOCKED)
sync_venv = $(1)/bin/uv pip sync -q --compile-bytecode --python $(1)/bin/python --require-hashes $(TORCH_SOURCE) $(2) && \
	$(1)/bin/uv pip install -q --compile-bytecode --python $(1)/bin/python --no-deps --no-build-isolation -e .

$(BIN)/uv:
	$(call new_venv,$(VENV))

$(BIN)/axgrid: setup.py $(LOCK) | $(BIN)/uv
	$(call sync_venv,$(VENV),$(LOCK))
	touch $@

install: $(BIN)/axgrid

demo: install
	$(BIN)/axgrid launch -n 8 -- $(BIN)/python -m axgrid.demo --grid 2x2x2x1

test: install
	$(BIN)/python -m pytest -q tests

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" tests

lock: $(BIN)/uv
	$(BIN)/uv pip compile -q --upgrade $(TORCH_SOURCE) $(COMPILE) -o $(LOCK)

# the newest versions setup.py's ranges allow (and the newest of everything they pull in), compiled beside the lock:
# prints what moved, then runs the fast tests on them (torch stays requirements.in's CPU wheel: a newer torch on PyPI
# is a CUDA build of several GB)
test-latest: install
	$(call new_venv,$(LATEST))
	$(BIN)/uv pip compile -q --upgrade $(TORCH_SOURCE) $(COMPILE) -o $(LATEST)/requirements.latest
	@echo "versions that moved from $(LOCK) (< lock, > newest allowed):"
	@diff <(grep -oE '^[a-z0-9][^ ]*' $(LOCK)) <(grep -oE '^[a-z0-9][^ ]*' $(LATEST)/requirements.latest) | grep '^[<>]' \
		|| echo "  none: the lock is the newest"
	$(call sync_venv,$(LATEST),$(LATEST)/requirements.latest)
	$(LATEST)/bin/python -m pytest -q -m "not slow" tests

calibrate: install
	$(BIN)/axgrid launch -n $(RANKS) -- $(BIN)/python -m axgrid.measure collectives --out runs/calibration.json
	$(BIN)/python -m axgrid.perfmodel calibrate --samples runs/calibration.json --out runs/local.toml

validate: install
	$(BIN)/axgrid launch -n $(RANKS) -- $(BIN)/python -m axgrid.measure steps $(PROBLEM) --gpus $(RANKS) \
		--top 4 --sample 4 --out runs/steps.json
	$(BIN)/python -m axgrid.perfmodel validate $(PROBLEM) --gpus $(RANKS) --measured runs/steps.json --out-dir runs/validate

.PHONY: install demo test test-fast lock test-latest calibrate validate
