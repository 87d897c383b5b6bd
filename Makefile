# celery_agboss developer commands. `make test` is what CI runs (.ci/run).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := test,dev,flower,metrics,stripe,checkout,adyen,paypal,django,otel,crypto

.DEFAULT_GOAL := help
.PHONY: help venv check-services lint format types pytest pytest-ci coverage coverage-total test demo bench clean distclean

help:
	@echo "make venv            create or reuse .venv and install the package (editable)"
	@echo "make test            services check, lint, types and the whole test suite (what CI runs)"
	@echo "make coverage        the whole suite under coverage (in-process lines), with its report"
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

# Three test processes (pytest-xdist), a file each at a time, on a 2-core machine: most
# tests wait on real workers, leases and brokers rather than compute (measured on one
# slow day: the second phase 27:48 with two processes, 21:54 with three), and every test
# makes its own databases, Redis database numbers, queues and vhosts, so they do not
# collide.
# PYTEST_WORKERS=0 runs them in this process. pytest's exit code 5 ("no tests
# collected") is a failure here.
# A test process that dies is not replaced (--max-worker-restart=0): the run ends
# naming the test it died in, where a replacement can leave pytest-xdist's loadfile
# scheduler waiting forever. PYTEST_DEADLINE bounds a run that hangs anyway: pytest is
# interrupted (SIGINT, so fixtures still stop what tests started) and the run fails.
# --foreground keeps pytest in the terminal's process group, so Ctrl-C still reaches it.
PYTEST_WORKERS ?= 3
PYTEST_DEADLINE ?= 60m
pytest: venv
	@rc=0; timeout --foreground --signal=INT --kill-after=2m $(PYTEST_DEADLINE) \
	  $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --max-worker-restart=0 $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	if [ $$rc -eq 124 ]; then echo "pytest did not finish within $(PYTEST_DEADLINE): failing" >&2; fi; \
	exit $$rc

# Coverage is a number, not a gate: pytest-cov measures the lines run in the test
# processes (its xdist workers included), not in the Celery workers, beat or chaos
# processes tests start. Measuring the whole suite costs more than CI's time allows, so
# CI measures the fast in-process part (COVERAGE_TESTS, run once, under coverage) and
# runs the rest without it (the figure is printed between the two runs, so the suite's
# own summary stays the last line); `make coverage` measures everything.
COVERAGE_TESTS ?= tests/unit
COV_ARGS := --cov=celery_agboss --cov-report=
pytest-ci: venv
	@rc=0; \
	$(MAKE) --no-print-directory pytest PYTEST_ARGS="$(COV_ARGS) $(COVERAGE_TESTS)" || rc=$$?; \
	$(MAKE) --no-print-directory coverage-total COVERED_BY="$(COVERAGE_TESTS)"; \
	$(MAKE) --no-print-directory pytest PYTEST_ARGS="--ignore=$(COVERAGE_TESTS)" || rc=$$?; \
	exit $$rc

coverage: venv
	@rc=0; $(MAKE) --no-print-directory pytest PYTEST_DEADLINE=150m PYTEST_ARGS="$(COV_ARGS) $(PYTEST_ARGS)" || rc=$$?; \
	$(BIN)/python -m coverage report --skip-covered --sort=cover; \
	$(MAKE) --no-print-directory coverage-total COVERED_BY="the whole suite"; \
	exit $$rc

COVERED_BY ?= the tests
coverage-total: venv
	@echo "coverage of celery_agboss by $(COVERED_BY) (in-process lines): $$($(BIN)/python -m coverage report --format=total)%"

# Under tests/support/throwaway.py: a service that does not answer but whose server is
# installed gets a throwaway instance for this run; a missing one is named, with the
# variable to set and the docker compose command that starts it.
test: venv
	@$(BIN)/python -m tests.support.throwaway -- \
		$(MAKE) --no-print-directory check-services lint types pytest-ci

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
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache artifacts .hypothesis .coverage .coverage.*
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
