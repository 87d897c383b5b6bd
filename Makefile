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
	@echo "make demo            the example shop's PS1-PS23 table, unprotected vs protected"
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
	$(BIN)/ruff check celery_agboss tests bench example_project
	$(BIN)/ruff format --check celery_agboss tests bench example_project

format: venv
	$(BIN)/ruff check --fix celery_agboss tests bench example_project
	$(BIN)/ruff format celery_agboss tests bench example_project

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

# Under tests/support/throwaway.py: a service that does not answer but whose server is
# installed gets a throwaway instance for this run; a missing one is named, with the
# variable to set and the docker compose command that starts it.
test: venv
	@$(BIN)/python -m tests.support.throwaway -- \
		$(MAKE) --no-print-directory check-services lint types pytest

# The example shop's scenario table (example_project/scenarios), on the embedded default:
# SQLite and kombu's filesystem transport in a temporary directory, real worker processes.
# `make demo BROKER_URL=redis://... DATABASE_URL=postgresql+psycopg://...` runs the same on
# services; DEMO_ARGS passes the runner's own arguments (`DEMO_ARGS="ps5 --protected"`).
demo: venv
	$(BIN)/python -m example_project.scenarios $(if $(BROKER_URL),--broker-url '$(BROKER_URL)') \
	  $(if $(DATABASE_URL),--database-url '$(DATABASE_URL)') $(DEMO_ARGS)

bench: venv
	$(BIN)/python bench/run.py

clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache artifacts .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
