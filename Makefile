# The two commands a newcomer needs: `make run` and `make test`. Both bootstrap .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint unit floors bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m gateway run

test: lint unit

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

unit: $(STAMP)
	$(PY) -m pytest -q

# The lowest versions pyproject.toml allows, installed in .venv-floors (once per pyproject),
# then imports and the provider tests with them. CI runs it after `make test`.
floors: $(STAMP)
	$(PY) .ci/floors.py

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .venv-floors .pytest_cache .mypy_cache .ruff_cache
