# Two commands for a fresh clone: `make run` (local demo, no servers needed)
# and `make test` (everything CI runs, against PostgreSQL and Redis).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)

# Tests talk to real servers; override these to point elsewhere.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/reminders
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
TEST_PROCESS_REDIS_URL ?= redis://127.0.0.1:6379/14
MUTATE_VAR_DIR ?= $(CURDIR)/var/mutate

.PHONY: prereqs run test test-units test-processes test-chaos lint venv bench clean mutate messages

$(UV):
	python3 -m pip install --user --quiet uv

$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --locked --quiet
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
	@bin/check-test-prereqs $(TEST_DATABASE_URL) $(TEST_REDIS_URL) $(TEST_PROCESS_REDIS_URL)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	SECRET_KEY=lint $(PY) manage.py makemigrations --check --dry-run

# `make test` runs the suite as three pytest processes at once, each with its own
# database, Redis database and var dir: the chaos run (marker chaos: its own
# servers, and most of its four minutes spent waiting out a killed worker's
# lease), the tests that start real workers, beats and browsers (marker slow),
# and the rest. Their output is printed group by group as each finishes.
# `make test PYTEST_ARGS="tests/admin -x"` runs one pytest with those arguments.
define pytest_in  # $(1) database URL, $(2) Redis URL, $(3) var dir under var/, $(4) arguments
	DATABASE_URL=$(1) CELERY_BROKER_URL=$(2) SECRET_KEY=test-only \
	REMINDERS_VAR_DIR=$(CURDIR)/var/$(3) \
	$(VENV)/bin/pytest $(4)
endef

test: prereqs lint
ifneq ($(strip $(PYTEST_ARGS)),)
	$(call pytest_in,$(TEST_DATABASE_URL),$(TEST_REDIS_URL),test,$(PYTEST_ARGS))
else
	@$(MAKE) --no-print-directory -j3 --output-sync=target test-chaos test-processes test-units
endif

test-units: venv
	$(call pytest_in,$(TEST_DATABASE_URL),$(TEST_REDIS_URL),test,-m "not slow")

test-processes: venv
	$(call pytest_in,$(TEST_DATABASE_URL)_processes,$(TEST_PROCESS_REDIS_URL),test-processes,-m "slow and not chaos")

test-chaos: venv
	$(call pytest_in,$(TEST_DATABASE_URL),$(TEST_REDIS_URL),test-chaos,-m chaos)

bench: venv
	$(PY) -m bench.delivery

# Mutation testing of the claim, record, reap, expire/dispatch, fate, deadline policy,
# engine deadline/drain, limiters and gate (not in CI; see docs/benchmarks.md).
# MUTATE_ARGS="gate policy" runs a subset.
mutate: venv
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_REDIS_URL) SECRET_KEY=test-only \
	REMINDERS_VAR_DIR=$(MUTATE_VAR_DIR) \
	$(PY) -m bench.mutate $(MUTATE_ARGS)

# Re-read the texts marked for translation into locale/*/django.po, then compile
# the .mo files (needs GNU gettext; running the project does not: commit both).
messages: venv
	SECRET_KEY=messages-only $(PY) manage.py makemessages -l de -l fr --no-location \
		--ignore='.venv/*' --ignore='tests/*' --ignore='bench/*' --ignore='var/*'
	SECRET_KEY=messages-only $(PY) manage.py compilemessages --ignore='.venv/*'

clean:
	rm -rf var/broker var/reminders.sqlite3* var/outbox var/static
