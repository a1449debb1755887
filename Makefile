# Two commands do everything on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LINTED := olmx plugins tests benchmarks examples scripts

.PHONY: train test lint venv bench clean

train: $(STAMP)  ## train the embedded default (tiny model, stdlib corpus, 2 CPU processes)
	$(BIN)/olmx train $(ARGS)

# One pytest worker per core (pytest-xdist); the tests that share the local Slurm cluster run
# on one worker, one after another (tests/conftest.py).
test: $(STAMP)  ## run the test suite (what CI runs)
	OLMO_DISABLE_PER_RANK_TRITON_CACHE=1 $(BIN)/python -m pytest -q -n auto --dist loadgroup $(PYTEST_ARGS)

# The dependency rules (tests/test_architecture.py) and the docs' layout (tests/test_docs.py)
# read only the source: they run here too, in seconds, as well as in make test.
lint: $(STAMP)  ## ruff (lint + format), mypy and the architecture and docs tests, as .ci/run runs them
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:xdist tests/test_architecture.py tests/test_docs.py

venv: $(STAMP)

# torch is pinned to the CPU wheel first so that nothing pulls a CUDA build.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,lint]'
	touch $(STAMP)

bench: $(STAMP)  ## run the benchmarks and print their tables
	$(BIN)/python benchmarks/cli_startup.py
	$(BIN)/python benchmarks/step_time.py

clean:
	rm -rf $(VENV) runs
