# The two commands a newcomer needs: `make run` and `make test`. Both bootstrap .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint unit trials soak load floors bench clean

# pip shows what it installs. setuptools' "Editable installation" banner (a reminder that a
# folder named like a package in the working directory may shadow it) is silenced: here the
# folders ARE the packages.
$(STAMP): pyproject.toml
	@echo "Setting up $(VENV): the gateway and its dependencies, then the test tools (the first time takes a few minutes; pip lists each package)."
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	@echo "Starting the gateway: the web chat is ready when it logs 'gateway listening on http://...' (Ctrl-C stops it)."
	$(PY) -m gateway run

# The lint (mostly mypy: ~40 s from a cold cache on a slow 2-core machine) runs beside the
# suite rather than before it: the suite's heavy trials leave CPU idle, and the two in a row
# took over six minutes there. A lint failure still fails `make test`, once both are done.
test: $(STAMP)
	$(MAKE) --no-print-directory -j2 lint unit

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# The suite runs in parallel (pytest-xdist): every test has its own ports (bound to port 0),
# data directory (tmp_path, per worker), PostgreSQL schema and Redis key prefix. Most tests
# wait on I/O, so more workers than the 2 cores pay off; TEST_WORKERS=0 runs in one process.
# The heavy trials take turns on one worker (loadgroup; see tests/conftest.py).
TEST_WORKERS ?= 4
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

unit: $(STAMP)
	$(PYTEST)

# The long trials at full size (tests/trials.py): many more fault schedules and property
# examples, the multi-worker kill with every message, 60 random-instant crash-kill trials and
# every step of a reply on every input.
trials: $(STAMP)
	GATEWAY_TRIALS=full $(PYTEST) tests/reliability tests/coordination tests/e2e

# The 10-minute soak (`make test` runs a 60 s one).
soak: $(STAMP)
	GATEWAY_SOAK_SECONDS=600 $(PY) -m pytest -q -s \
	  tests/reliability/test_load.py::test_soak_memory_stays_flat

# Load the machine the way a busy CI host is loaded (eight CPU-bound processes and one
# fsync-heavy disk writer) for LOAD_SECONDS; run `make test` beside it to check the suite
# does not depend on the machine being quiet.
LOAD_SECONDS ?= 900
load:
	$(PYTHON) bench/load_machine.py --seconds $(LOAD_SECONDS)

# The lowest versions pyproject.toml allows, installed in .venv-floors (once per pyproject),
# then imports, the provider tests and the channel tests with them. CI runs it after `make test`.
floors: $(STAMP)
	$(PY) .ci/floors.py

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .venv-floors .pytest_cache .mypy_cache .ruff_cache
