# Two set-up commands that work on a fresh machine (see README):
#   make demo   -- the main job: 8 local gloo ranks train an MLP stack 3D-parallel on grid 2x2x2x1
#   make test   -- the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TORCH  ?= torch==2.13.0

$(BIN)/axgrid: setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[mpi,test,plot,hf]'
	touch $@

install: $(BIN)/axgrid

demo: install
	$(BIN)/axgrid launch -n 8 -- $(BIN)/python -m axgrid.demo --grid 2x2x2x1

test: install
	$(BIN)/python -m pytest -q tests

.PHONY: install demo test
