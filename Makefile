# celery_agboss developer commands. `make test` is what CI runs (.ci/run).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := test,dev,flower,metrics,stripe,checkout,adyen,paypal

.DEFAULT_GOAL := help
.PHONY: help venv check-services lint format types pytest test demo bench clean distclean

help:
	@echo "make venv            create or reuse .venv and install the package (editable)"
	@echo "make test            services check, lint, types and the whole test suite (what CI runs)"
	@echo "make demo            run the demo"
	@echo "make lint | types    ruff check and ruff format --check | mypy --strict"
	@echo "make format          ruff check --fix, then ruff format (what pre-commit runs)"
	@echo "make bench           run bench/run.py"
	@echo "make clean           remove build and tool caches (distclean: and .venv)"

venv: $(STAMP)

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "celery_agboss needs Python >= 3.10; set PYTHON=...")'
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the packaging files change.
$(STAMP): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	@touch $@

# Under CI=true an unreachable service is an error; otherwise the tests that
# need it are skipped, and this only says so.
check-services: venv
	$(BIN)/python -m tests.support.services

# The formatter is enforced, not advised: `make format` applies it.
lint: venv
	$(BIN)/ruff check celery_agboss tests bench
	$(BIN)/ruff format --check celery_agboss tests bench

format: venv
	$(BIN)/ruff check --fix celery_agboss tests bench
	$(BIN)/ruff format celery_agboss tests bench

types: venv
	$(BIN)/mypy --strict celery_agboss

# Two test processes (pytest-xdist), a file each at a time: most tests wait on real
# workers, leases and brokers rather than compute, and every test makes its own
# databases, Redis database numbers, queues and vhosts, so they do not collide.
# PYTEST_WORKERS=0 runs them in this process. pytest's exit code 5 ("no tests
# collected") is a failure here.
PYTEST_WORKERS ?= 2
pytest: venv
	@rc=0; $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$rc

test: venv check-services lint types
	@$(MAKE) --no-print-directory pytest

demo: venv
	$(BIN)/python -m celery_agboss.demo

bench: venv
	$(BIN)/python bench/run.py

clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache artifacts .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
