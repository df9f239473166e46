# azure-functions-db — one entry point per task. `make help` lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# `make demo`'s editable install is one type checkers can follow: a tree of links on a path
# entry, not an import hook, so mypy and pyright find the package and its py.typed in a user's
# project (setuptools' "strict" mode: a file added to the package later needs `make clean demo`).
STRICT_EDITABLE := --config-settings editable_mode=strict
# `make demo` needs only the package and its command line (no PySpark, no test tools).
DEMO_STAMP := $(VENV)/.demo-installed
# Azurite (the Azure Storage emulator) is pinned to an exact version in tools/azurite/package.json
# and package-lock.json; the Blob/Table tests start it from there (devkit/azurite.py).
AZURITE_DIR   := tools/azurite
AZURITE_STAMP := $(AZURITE_DIR)/node_modules/.installed
# Debian packages the tests need (tools/debian-packages.sh says why each).
DEBIAN_PACKAGES := faketime gdb unixodbc odbc-postgresql odbc-mariadb libpostgresql-jdbc-java

# `make soak SECONDS=1800 SEED=7 DB=mariadb SHARDS=3`: how long the writers write (on each
# database), the fault schedule's seed, which database: pg, mariadb, or both (one after the
# other), and how many shards the first poller is split over (1: not sharded).
SECONDS ?= 90
SEED    ?= random
DB      ?= both
SHARDS  ?= 1

.PHONY: help demo test soak soak-long lint format bench azurite wheel debian-packages clean

help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(DEMO_STAMP) ## Run a sample poller on a local SQLite table with the local state store
	$(BIN)/afdb demo

$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(STRICT_EDITABLE) -e '.[cli]'
	touch $(DEMO_STAMP)

$(AZURITE_STAMP): $(AZURITE_DIR)/package.json $(AZURITE_DIR)/package-lock.json
	npm ci --prefix $(AZURITE_DIR) --no-audit --no-fund
	touch $(AZURITE_STAMP)

azurite: $(AZURITE_STAMP) ## Install the pinned Azurite (npm) that the Blob/Table tests start

debian-packages: ## Install the Debian packages the tests need (as root; else prints the command)
	@bash tools/debian-packages.sh $(DEBIAN_PACKAGES)

test: debian-packages $(STAMP) $(AZURITE_STAMP) ## Run the whole test suite (Blob/Table tests against Azurite)
	$(BIN)/python -m pytest

soak: debian-packages $(STAMP) $(AZURITE_STAMP) ## Chaos soak on PostgreSQL and MariaDB + Azurite (DB=both SECONDS=90 SEED=random SHARDS=1)
	$(BIN)/python -m soak --db $(DB) --seconds $(SECONDS) --seed $(SEED) --shards $(SHARDS)

soak-long: debian-packages $(STAMP) $(AZURITE_STAMP) ## The two-hour chaos soak on PostgreSQL, all three sinks (a fault every 6 s: about 1,200; SEED=random)
	$(BIN)/python -m soak --db pg --seconds 7200 --fault-every 6 --seed $(SEED)

lint: $(STAMP) ## ruff (lint + format check) and mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP) ## Apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP) ## Run the benchmarks (ratios against a baseline in the same run)
	$(BIN)/python -m benchmarks

wheel: ## Build the afdb wheel into dist/ (what requirements.txt installs on deploy)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	rm -f dist/afdb-*.whl
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .

clean: ## Remove the virtualenv, Azurite's node_modules, caches and demo files
	rm -rf $(VENV) $(AZURITE_DIR)/node_modules dist build .afdb .pytest_cache .mypy_cache .ruff_cache .hypothesis
