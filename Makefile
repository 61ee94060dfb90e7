# Commands for a fresh clone: `make run` (local demo, no servers needed), `make test`
# (the suite against PostgreSQL and Redis) and `make test-all` (that and the chaos run: CI).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)

# Tests talk to real servers; override these to point elsewhere.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/reminders
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
TEST_CHAOS_REDIS_URL ?= redis://127.0.0.1:6379/10
# 32 characters or more: the length a production key must have.
TEST_SECRET_KEY ?= test-only-3f9a2c7e5b1d4086a9c2e7f1b3d5

MUTATE_VAR_DIR ?= $(CURDIR)/var/mutate

# Python keeps the bytecode it compiles (__pycache__/, ignored by git) even where the shell
# sets PYTHONDONTWRITEBYTECODE: without it every test process, worker and beat compiles
# Django, Celery and the project from source again, each time it starts.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: prereqs run test test-all test-suite test-chaos lint venv bench clean mutate messages

$(UV):
	python3 -m pip install --user --quiet uv

$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --locked --quiet --compile-bytecode
	@touch $@

venv: $(VENV)/.synced

run: venv
	@export DEBUG=$${DEBUG:-1} PATH="$(CURDIR)/$(VENV)/bin:$$PATH"; \
	$(PY) manage.py migrate --verbosity 0 && \
	$(PY) manage.py collectstatic --noinput --verbosity 0 && \
	$(PY) manage.py seed_demo && \
	$(PY) manage.py scan && \
	echo "Starting web (http://127.0.0.1:8000/admin/), worker and beat; Ctrl-C stops all three." && \
	exec $(VENV)/bin/honcho start

# Before anything else, `make test` names each missing server or tool and how to get it.
prereqs:
	@bin/check-test-prereqs $(TEST_DATABASE_URL) $(TEST_REDIS_URL) $(TEST_CHAOS_REDIS_URL)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) manage.py makemigrations --check --dry-run

# `make test` runs the suite but the chaos run and the tests marked long (the slowest: see
# pyproject.toml's markers) on $(TEST_WORKERS) pytest-xdist workers (4 on 2 cores: with 3,
# while tests wait on the processes they start, a core sits idle),
# each with its own test database (pytest-django's _gw<N> suffix), Redis database
# (TEST_REDIS_URL's number minus N) and var dir (tests/settings.py). `make test-all`
# (what CI runs) runs those long tests too, with the chaos run beside: its own servers, most of its time spent
# waiting out a killed worker's lease. Each run writes var/<dir>/junit.xml and prints its
# slowest tests. `make test PYTEST_ARGS="tests/admin -x"` runs one pytest with those
# arguments instead.
TEST_WORKERS ?= 4
define pytest_in  # $(1) Redis URL, $(2) var dir under var/, $(3) arguments
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(1) SECRET_KEY=$(TEST_SECRET_KEY) \
	REMINDERS_VAR_DIR=$(CURDIR)/var/$(2) \
	$(VENV)/bin/pytest --junitxml=$(CURDIR)/var/$(2)/junit.xml --durations=10 $(3)
endef

test: prereqs lint
ifneq ($(strip $(PYTEST_ARGS)),)
	$(call pytest_in,$(TEST_REDIS_URL),test,$(PYTEST_ARGS))
else
	$(call pytest_in,$(TEST_REDIS_URL),test,-n $(TEST_WORKERS) --dist worksteal -m "not chaos and not long")
endif

test-all: prereqs lint
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-suite test-chaos

test-suite: venv
	$(call pytest_in,$(TEST_REDIS_URL),test,-n $(TEST_WORKERS) --dist worksteal -m "not chaos")

test-chaos: venv
	$(call pytest_in,$(TEST_CHAOS_REDIS_URL),test-chaos,-m chaos)

bench: venv
	$(PY) -m bench.delivery

# Mutation testing of the code that holds the promise, module by module (not in CI; the map:
# .venv/bin/python -m bench.mutate --list; see docs/benchmarks.md). MUTATE_ARGS="gate policy"
# runs a subset.
mutate: venv
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_REDIS_URL) SECRET_KEY=$(TEST_SECRET_KEY) \
	REMINDERS_VAR_DIR=$(MUTATE_VAR_DIR) \
	$(PY) -m bench.mutate $(MUTATE_ARGS)

# Re-read the texts marked for translation into locale/*/django.po, then compile
# the .mo files (needs GNU gettext; running the project does not: commit both).
messages: venv
	$(PY) manage.py makemessages -l de -l fr --no-location \
		--ignore='.venv/*' --ignore='tests/*' --ignore='bench/*' --ignore='var/*'
	$(PY) manage.py compilemessages --ignore='.venv/*'

clean:
	rm -rf var/broker var/reminders.sqlite3* var/outbox var/static
