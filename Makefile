# Two commands for a new user (see README): `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-all mutate clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $@

# The offline quickstart: one branched row (SGD, FGE, SWA at 1 / 1.25 / 1.5 budgets, EMA) on scikit-learn's
# bundled 8x8 digits (no download), W&B offline; it ends with the row's table.
demo: install
	$(PY) -m swalab.results.row --dataset digits --model preresnet20 --seeds 0 --ema

# The default test suite (slow and GPU tests deselected; run them with `make test-all`), in TEST_JOBS processes
# (pytest-xdist; 2: the 2 cores it is timed on, 12 minutes instead of 26). The tests marked `cluster` run after it, one
# at a time (they share one SLURM node), when a SLURM cluster answers (tests/cluster/slurm-up starts a local one, as
# .ci/run does), else they are skipped with the reason.
TEST_JOBS ?= 2
test: install
	$(PY) -m pytest -n $(TEST_JOBS) -m "not slow and not gpu and not cluster"
	$(PY) -m pytest -m "cluster and not slow"

test-all: install
	$(PY) -m pytest -m "slow or not slow"

# Mutation testing of the core (docs/mutation.md; not part of CI): mutmut mutates the modules listed in pyproject.toml
# into mutants/ and runs the tests that cover each mutant; `.venv/bin/mutmut results` lists the survivors afterwards.
mutate: install
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	OMP_NUM_THREADS=1 WANDB_MODE=disabled $(VENV)/bin/mutmut run
	$(VENV)/bin/mutmut export-cicd-stats 2>/dev/null; $(VENV)/bin/mutmut results > mutants/survivors.txt; \
	  tail -n 3 mutants/survivors.txt

clean:
	rm -rf outputs multirun .pytest_cache
